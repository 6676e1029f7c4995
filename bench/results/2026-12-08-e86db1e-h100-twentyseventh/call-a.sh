# First call of the session, whichever GPU comes.
# H200: main's whole GPU suite on pack n26 (911d238 = main's kernels, `scripts/sass-report match`), then the forward
#   record (bf16, fa4 against cuDNN and FLASH) and the host cost (issue 12) with n26. call-b.sh follows at once.
# H100: the twenty-sixth session's call-1.sh (n26's GPU suite, then n26 against m).
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
if [[ "$gpu" != *H200* ]]; then exec bash bench/results/2026-12-07-77c1a5c-h100-twentysixth/call-1.sh; fi
scripts/packs-xz --unpack >/dev/null || exit 1
root=$OUT
OUT=$root/t FA4_PREBUILT=build-prebuilt-n26 scripts/device-parts "${CALL_TESTS:-tests:230}"
OUT=$root/r FA4_H200_PARTS="${CALL_PARTS:-bench:190 hostcost:110}" scripts/device-h200-records build-prebuilt-n26
echo CALL_DONE
