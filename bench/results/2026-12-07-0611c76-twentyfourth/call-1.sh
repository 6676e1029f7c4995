# Whichever GPU comes: on an H200 the records of main (issues 11 and 12: forward bf16 vs cuDNN and FLASH, decode
# table, paged/varlen prefill, host cost); on an H100 main's whole GPU suite, then B33 (backward waits hinted).
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
scripts/packs-xz --unpack >/dev/null || exit 1
if [[ "$gpu" == *H200* ]]; then
  FA4_H200_PARTS="ab:250 bench:200 hostcost:110" scripts/device-h200-records build-prebuilt-m
else
  export FA4_PREBUILT=build-prebuilt-m FA4_AB_PREBUILT_m=build-prebuilt-m FA4_AB_PREBUILT_b33=build-prebuilt-b33 \
    FA4_AB_TESTS='GpuBackwardSm90.Small:GpuBackwardSm90.SweepEveryInstance' FA4_AB_TEST_NAMES=b33 \
    FA4_AB_BENCH_ARGS="--pass bwd --seqlens 4096,16384 --head-dims 64,128 --impls fa4,sdpa-cudnn --flex-seqlens=" \
    FA4_AB_ARGS="m=. b33=."
  scripts/device-parts tests:300 ab:265
fi
echo CALL_DONE
