# Whichever GPU comes. H200: the records of main (pack m; issues 11 and 12). H100: main's whole GPU suite (m), then
# F51 + F50 (pq: the P·V wait after the exp2s, Q released before the tail) and F50 alone (qt) against m: their
# forward tests, then fwd bf16 d = 64 and 128 at 4k and 16k, both masks, two reps, cuDNN in the same process.
# CALL_AB / CALL_BENCH / CALL_PARTS override the variants, the benchmark and the parts (e.g. CALL_AB="m=. pw=. pq=."
# CALL_BENCH="--pass fwd --seqlens 4096,16384 --head-dims 192,256 --impls fa4,sdpa-cudnn --flex-seqlens="),
# CALL_TEST_NAMES the variants that run the forward tests (default "pq qt"); CALL_AB_ON_H200=1 runs the A/B on an
# H200 too instead of the records.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
scripts/packs-xz --unpack >/dev/null || exit 1
if [[ "$gpu" == *H200* && -z "${CALL_AB_ON_H200:-}" ]]; then
  FA4_H200_PARTS="ab:250 bench:200 hostcost:110" scripts/device-h200-records build-prebuilt-m
else
  for n in m qt pq pw cr5 cpq; do export "FA4_AB_PREBUILT_$n=build-prebuilt-$n"; done
  export FA4_PREBUILT=build-prebuilt-m \
    FA4_AB_TESTS='GpuAttentionSm90.ForwardSweepEveryInstance:GpuAttentionSm90.LongSequenceCausal:GpuAttentionSm90.PersistentWalkSmall:GpuSplitKvSm90.ForcedSplitsMatchTheReference' \
    FA4_AB_TEST_NAMES="${CALL_TEST_NAMES:-pq qt}" \
    FA4_AB_BENCH_ARGS="${CALL_BENCH:---pass fwd --seqlens 4096,16384 --head-dims 64,128 --impls fa4,sdpa-cudnn --flex-seqlens=}" \
    FA4_AB_ARGS="${CALL_AB:-m=. qt=. pq=.}"
  # shellcheck disable=SC2086  # the parts split into words (CALL_PARTS: fewer or shorter where less device time is left)
  scripts/device-parts ${CALL_PARTS:-tests:200 ab:360}
fi
echo CALL_DONE
