# Second call: F45 (wh) and F46 (lm) against main (s) with their forward tests, then main's GPU tests (-Bsymbolic).
set -u
scripts/packs-xz --unpack >/dev/null || exit 1
O=$OUT
export FA4_AB_PREBUILT_s=build-prebuilt-s FA4_AB_PREBUILT_wh=build-prebuilt-wh FA4_AB_PREBUILT_lm=build-prebuilt-lm
OUT=$O/ab FA4_AB_TEST_NAMES="wh lm" \
  FA4_AB_TESTS='GpuAttentionSm90.*:GpuVarlenSm90.EveryInstanceEveryMask:GpuSinksSm90.ForwardEveryInstance:GpuKvCacheSm90.PagedPrefillEveryRowAndPageSize' \
  FA4_AB_BENCH_ARGS="--pass fwd --seqlens 4096,16384 --head-dims 64,128 --impls fa4,sdpa-cudnn --flex-seqlens=" \
  timeout 320 scripts/device-ab s=. wh=. lm=.
OUT=$O/t FA4_PREBUILT=build-prebuilt-s scripts/device-parts tests:250
echo CALL_DONE
