# Whichever GPU comes: main's whole GPU suite on pack n26 (911d238: F50 on the d = 64 192-row, F51 at d = 256; its
# other kernels are pack m's SASS, `scripts/sass-report match`), then n26 against m (176621d): fwd bf16
# d = 64/128/256 at 1k/4k/16k, both masks, two reps, cuDNN in the same process.
# CALL_AB / CALL_BENCH / CALL_PARTS / CALL_TESTED (the pack the tests part runs) override.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
scripts/packs-xz --unpack >/dev/null || exit 1
for n in m n26 qt pw pq; do export "FA4_AB_PREBUILT_$n=build-prebuilt-$n"; done
export FA4_PREBUILT="build-prebuilt-${CALL_TESTED:-n26}" FA4_AB_TEST_NAMES=none \
  FA4_AB_BENCH_ARGS="${CALL_BENCH:---pass fwd --seqlens 1024,4096,16384 --head-dims 64,128,256 --impls fa4,sdpa-cudnn --flex-seqlens=}" \
  FA4_AB_ARGS="${CALL_AB:-m=. n26=.}"
# shellcheck disable=SC2086  # the parts split into words
scripts/device-parts ${CALL_PARTS:-tests:240 ab:220}
echo CALL_DONE
