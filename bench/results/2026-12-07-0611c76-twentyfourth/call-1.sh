# Whichever GPU comes: on an H200 the records of main (issues 11 and 12: forward bf16 vs cuDNN and FLASH, decode
# table, paged/varlen prefill, host cost); on an H100 main's whole GPU suite, then F49 (cr) against main (m):
# its forward tests, then d = 64 and 256 at 2k, 4k and 16k, both masks, two reps, cuDNN in the same process.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
scripts/packs-xz --unpack >/dev/null || exit 1
if [[ "$gpu" == *H200* ]]; then
  FA4_H200_PARTS="ab:250 bench:200 hostcost:110" scripts/device-h200-records build-prebuilt-m
else
  export FA4_PREBUILT=build-prebuilt-m FA4_AB_PREBUILT_m=build-prebuilt-m FA4_AB_PREBUILT_cr=build-prebuilt-cr \
    FA4_AB_TESTS='GpuAttentionSm90.ForwardSweepEveryInstance:GpuAttentionSm90.LongSequenceCausal:GpuAttentionSm90.PersistentWalkSmall:GpuAttentionSm90.PrologueOutsideTurnsMatchesOneTilePerCta:GpuSplitKvSm90.ForcedSplitsMatchTheReference' \
    FA4_AB_TEST_NAMES=cr \
    FA4_AB_BENCH_ARGS="${CALL_BENCH:---pass fwd --seqlens 2048,4096,16384 --head-dims 64,256 --impls fa4,sdpa-cudnn --flex-seqlens=}" \
    FA4_AB_ARGS="m=. cr=."
  # shellcheck disable=SC2086  # the parts split into words (CALL_PARTS: fewer or shorter where less device time is left)
  scripts/device-parts ${CALL_PARTS:-tests:240 ab:320}
fi
echo CALL_DONE
