# Second call (H200): issue 12's decode / paged / varlen records with n26 (device-h200-records' ab part), then the
# forward record in fp16 (issue 11 asks for fp16 rows). On an H100: the twenty-sixth session's call-2.sh (F52).
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
if [[ "$gpu" != *H200* ]]; then exec bash bench/results/2026-12-07-77c1a5c-h100-twentysixth/call-2.sh; fi
scripts/packs-xz --unpack >/dev/null || exit 1
root=$OUT
OUT=$root/r FA4_H200_PARTS="ab:250" scripts/device-h200-records build-prebuilt-n26
OUT=$root/f FA4_H200_PARTS="bench:190" \
  FA4_GPU_BENCH_ARGS="--pass fwd --dtype fp16 --impls fa4,sdpa-cudnn,sdpa-flash --flex-seqlens= --rep-ms 80" \
  scripts/device-h200-records build-prebuilt-n26
echo CALL_DONE
