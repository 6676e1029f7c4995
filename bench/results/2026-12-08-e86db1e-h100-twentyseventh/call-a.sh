# Next session's first call, whichever GPU comes (packs in build-packs/; carry .debs and build-packs).
# H200: issue 11's record with main's kernels (pack n26 = 911d238; `scripts/sass-report match`): the forward in bf16
#   and in fp16 against cuDNN and FLASH, then the host cost (issue 12). call-b.sh follows at once. (n26's 72 GPU
#   tests and the sanitizers passed on an H100 in the twenty-seventh session.)
# H100: F53 (perf-log; pack tp = main + -DFA4_AB_TOP_PAD=1): its forward tests, then tp against n26 at 2k/4k/16k,
#   d = 64 and, as controls, d = 128 and 256 (no shift at these lengths; row 5's loop is 11 instructions shorter in
#   tp), both masks; then d = 256's F51 tie-break (m against n26 at 1k/2k/16k, three reps: level at >= 4k over two
#   sessions, -5% at 1k in both). The fp16 sweep waits for the next H100 call.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
scripts/packs-xz --unpack >/dev/null || exit 1
root=$OUT
if [[ "$gpu" == *H200* ]]; then
  OUT=$root/bf16 FA4_H200_PARTS="bench:190" scripts/device-h200-records build-prebuilt-n26
  OUT=$root/fp16 FA4_H200_PARTS="bench:190 hostcost:110" \
    FA4_GPU_BENCH_ARGS="--pass fwd --dtype fp16 --impls fa4,sdpa-cudnn,sdpa-flash --flex-seqlens= --rep-ms 80" \
    scripts/device-h200-records build-prebuilt-n26
else
  for n in m n26 tp; do export "FA4_AB_PREBUILT_$n=build-prebuilt-$n"; done
  OUT=$root/f53 FA4_AB_TEST_NAMES=tp \
    FA4_AB_TESTS='GpuAttentionSm90.*:GpuSinksSm90.ForwardEveryInstance:GpuSplitKvSm90.ForcedSplitsMatchTheReference:GpuKvCacheSm90.Small:GpuVarlenSm90.EveryInstanceEveryMask:GpuBackwardSm90.Small' \
    FA4_AB_BENCH_ARGS="--pass fwd --seqlens 2048,4096,16384 --head-dims 64,128,256 --impls fa4,sdpa-cudnn --flex-seqlens=" \
    FA4_AB_ARGS="n26=. tp=." scripts/device-parts ab:300
  OUT=$root/d256 FA4_AB_TEST_NAMES=none FA4_AB_REPS=3 \
    FA4_AB_BENCH_ARGS="--pass fwd --seqlens 1024,2048,16384 --head-dims 256 --impls fa4,sdpa-cudnn --flex-seqlens=" \
    FA4_AB_ARGS="m=. n26=." scripts/device-parts ab:180
fi
echo CALL_DONE
