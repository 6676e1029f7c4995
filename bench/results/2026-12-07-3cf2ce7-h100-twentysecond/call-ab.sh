set -u
scripts/packs-xz --unpack || exit 1
O=$OUT
FA4_PREBUILT=build-prebuilt-u FA4_GPU_TEST_FILTER='-GpuBackwardSm90.*' scripts/device-parts tests:140
B="--pass fwd --seqlens 1024,4096,16384 --impls fa4,sdpa-cudnn --flex-seqlens="
OUT=$O/d128 FA4_AB_PREBUILT_u=build-prebuilt-u FA4_AB_PREBUILT_nt128=build-prebuilt-nt128u FA4_AB_PREBUILT_regs=build-prebuilt-regs \
  FA4_AB_BENCH_ARGS="$B --head-dims 128" timeout 160 scripts/device-ab u=. nt128=. regs=.
OUT=$O/d256 FA4_AB_PREBUILT_u=build-prebuilt-u FA4_AB_PREBUILT_nt256=build-prebuilt-nt256u FA4_AB_PREBUILT_n80=build-prebuilt-n80 \
  FA4_AB_PREBUILT_n80nt=build-prebuilt-n80nt FA4_AB_TESTS='GpuAttentionSm90.ForwardSweepEveryInstance:GpuAttentionSm90.LongSequenceCausal' \
  FA4_AB_TEST_NAMES="n80 n80nt" FA4_AB_BENCH_ARGS="$B --head-dims 256" timeout 230 scripts/device-ab u=. nt256=. n80=. n80nt=.
echo CALL_DONE
