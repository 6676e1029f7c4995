# Whichever GPU comes: F52 (perf-log), shorter key tiles where work tiles are short. The forward tests on s64
# (d = 64 short row 128×64) and d128n64 (d = 128 prefill row 128×64, three stages), then both against n26 (main at
# 911d238), with pw (F51 on every row: rows 0 and 3 at these lengths) beside them: fwd bf16 d = 64 and 128 at
# 512/1k/2k, both masks, two reps, cuDNN in the same process.
# CALL_AB / CALL_BENCH / CALL_PARTS / CALL_TEST_NAMES override.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
scripts/packs-xz --unpack >/dev/null || exit 1
for n in m n26 s64 d128n64 pw cr6; do export "FA4_AB_PREBUILT_$n=build-prebuilt-$n"; done
export FA4_PREBUILT=build-prebuilt-n26 \
  FA4_AB_TESTS='GpuAttentionSm90.ForwardSweepEveryInstance:GpuAttentionSm90.LongSequenceCausal:GpuAttentionSm90.PersistentWalkSmall:GpuSplitKvSm90.ForcedSplitsMatchTheReference' \
  FA4_AB_TEST_NAMES="${CALL_TEST_NAMES:-s64 d128n64}" \
  FA4_AB_BENCH_ARGS="${CALL_BENCH:---pass fwd --seqlens 512,1024,2048 --head-dims 64,128 --impls fa4,sdpa-cudnn --flex-seqlens=}" \
  FA4_AB_ARGS="${CALL_AB:-n26=. s64=. d128n64=. pw=.}"
# shellcheck disable=SC2086  # the parts split into words
scripts/device-parts ${CALL_PARTS:-ab:420}
echo CALL_DONE
