# Third call: issue 11's fp16 forward rows of main (s) beside cuDNN and FLASH; F44's tests on its -Bsymbolic pack.
set -u
scripts/packs-xz --unpack >/dev/null || exit 1
O=$OUT
OUT=$O/fp16 FA4_PREBUILT=build-prebuilt-s FA4_SKIP_DECODE_BENCH=1 FA4_SKIP_VARLEN_BENCH=1 FA4_GPU_BENCH_TIMEOUT=235 \
  FA4_GPU_BENCH_ARGS="--pass fwd --dtype fp16 --impls fa4,sdpa-cudnn,sdpa-flash --flex-seqlens= --rep-ms 80" \
  scripts/device-parts bench:245
OUT=$O/f44 FA4_AB_PREBUILT_n80=build-prebuilt-n80 FA4_AB_REPS=0 \
  FA4_AB_TESTS='GpuAttentionSm90.ForwardSweepEveryInstance:GpuAttentionSm90.LongSequenceCausal' timeout 150 scripts/device-ab n80=.
echo CALL_DONE
