# F45 (wh), F46 (lm) and both (wl) against main (s): each variant's forward tests, then the benchmark (fwd bf16,
# d = 64 and 128, 4k and 16k, both masks, two reps, cuDNN in the same process).
set -u
scripts/packs-xz --unpack >/dev/null || exit 1
export FA4_AB_PREBUILT_s=build-prebuilt-s FA4_AB_PREBUILT_wh=build-prebuilt-wh FA4_AB_PREBUILT_lm=build-prebuilt-lm \
  FA4_AB_PREBUILT_wl=build-prebuilt-wl
OUT=$OUT/ab FA4_AB_TEST_NAMES="wh lm wl" \
  FA4_AB_TESTS='GpuAttentionSm90.*:GpuVarlenSm90.EveryInstanceEveryMask:GpuSinksSm90.ForwardEveryInstance:GpuKvCacheSm90.PagedPrefillEveryRowAndPageSize' \
  FA4_AB_BENCH_ARGS="--pass fwd --seqlens 4096,16384 --head-dims 64,128 --impls fa4,sdpa-cudnn --flex-seqlens=" \
  timeout 570 scripts/device-ab s=. wh=. lm=. wl=.
echo CALL_DONE
