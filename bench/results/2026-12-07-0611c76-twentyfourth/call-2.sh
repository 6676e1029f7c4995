# Second call: on an H200 the records of main (as call-1); on an H100 F49's remaining tests (varlen, sinks,
# KV cache, splits) and its d = 192 row, then B33 (backward waits hinted) against main.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
[[ "$gpu" == *H200* ]] && exec bash "$(dirname "$0")/call-1.sh"  # the records
echo "gpu: $gpu"
scripts/packs-xz --unpack >/dev/null || exit 1
export FA4_AB_PREBUILT_m=build-prebuilt-m FA4_AB_PREBUILT_cr=build-prebuilt-cr FA4_AB_PREBUILT_b33=build-prebuilt-b33
OUT=$OUT/f49 FA4_AB_TEST_NAMES=cr \
  FA4_AB_TESTS='GpuVarlenSm90.EveryInstanceEveryMask:GpuSinksSm90.ForwardEveryInstance:GpuKvCacheSm90.PagedPrefillEveryRowAndPageSize:GpuKvCacheSm90.SplitsAppendsAndPrefillChunks:GpuAttentionSm90.Exp2EmulationAndRescaleThreshold:GpuAttentionSm90.TwoRunsAreBitwiseEqual' \
  FA4_AB_BENCH_ARGS="--pass fwd --seqlens 4096,16384 --head-dims 192 --impls fa4,sdpa-cudnn --flex-seqlens=" \
  timeout 300 scripts/device-ab m=. cr=.
OUT=$OUT/b33 FA4_AB_TESTS='GpuBackwardSm90.Small:GpuBackwardSm90.SweepEveryInstance' FA4_AB_TEST_NAMES=b33 \
  FA4_AB_BENCH_ARGS="--pass bwd --seqlens 4096,16384 --head-dims 64,128 --impls fa4,sdpa-cudnn --flex-seqlens=" \
  timeout 270 scripts/device-ab m=. b33=.
echo CALL_DONE
