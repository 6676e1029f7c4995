#!/usr/bin/env bash
# Session 21, call 8 (little device time left): F42 against main (m2): the C++ host cost of a split decode call,
# decode graph replay at b = 1, then F42's GPU test. Each result is written to $OUT as it comes.
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
prefix=/tmp/fa4-deps; FA4_DEBS=$PWD/.debs FA4_DEPS_PREFIX=$prefix scripts/bootstrap >/dev/null 2>&1
deps=$prefix/usr/lib/x86_64-linux-gnu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/f42.txt"
run() { local name=$1; shift; local pack=$PWD/build-prebuilt-$name envs=""
  [ "$name" = f42 ] && envs="FA4_FWD_DECODE_CLUSTER_MERGE=1"
  env $envs LD_LIBRARY_PATH="$pack:$deps" "$@"; }
for n in m2 f42; do
  echo "== $n host cost" >>"$OUT/f42.txt"
  run $n timeout 20 build-prebuilt-$n/bin/fa4 run -b 1 --seqlen-q 1 --seqlen-k 4096 --heads 32 --heads-kv 8 -d 128 \
    --pass fwd --iters 10 --host-cost 200 --check-rows 8 2>&1 | grep -E "host|check|forward" >>"$OUT/f42.txt"
done
for n in m2 f42 m2 f42; do
  echo "== $n decode graph replay" >>"$OUT/f42.txt"
  run $n env PYTHONPATH=python FA4_LIBRARY=$PWD/build-prebuilt-$n/libfa4.so.0 timeout 40 python3 bench/decode_bench.py \
    --shapes 1x1024,1x4096,1x8192,2x4096 --impls fa4,sdpa-cudnn --reps 3 --out /tmp/dec-$n 2>&1 | grep -E "us|error|Error" >>"$OUT/f42.txt"
done
echo "== f42 GPU test" >>"$OUT/f42.txt"
run f42 timeout 90 build-prebuilt-f42/tests/fa4_gpu_tests --gtest_filter='GpuSplitKvSm90.DecodeClusterMerge*' >"$OUT/f42-test.log" 2>&1
echo "test rc=$?" >>"$OUT/f42.txt"; grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED)|kernel launch" "$OUT/f42-test.log" >>"$OUT/f42.txt"
cat "$OUT/f42.txt"
