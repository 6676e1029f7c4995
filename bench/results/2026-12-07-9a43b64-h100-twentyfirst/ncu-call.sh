#!/usr/bin/env bash
# Session 21, call 4 (any GPU): where the forward's consumer warps stall, per SASS instruction (ncu source counters),
# d = 128 and d = 64 at 16k non-causal; and the decode kernel against the forward kernel at b = 8 s_k = 16k.
OUT=${OUT:-$PWD/device-out}; mkdir -p "$OUT"
prefix=/tmp/fa4-deps; FA4_DEBS=$PWD/.debs FA4_DEPS_PREFIX=$prefix scripts/bootstrap >/dev/null 2>&1
pack=$PWD/build-prebuilt-m; deps=$prefix/usr/lib/x86_64-linux-gnu
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
prof() {  # name, kernel regex, env, fa4 run args...
  local name=$1 kernel=$2 envs=$3; shift 3
  env $envs LD_LIBRARY_PATH="$pack:$deps" timeout 120 ncu --set full --import-source no -k "regex:$kernel" \
    --launch-skip 1 --launch-count 1 -o "/tmp/$name" -f "$pack/bin/fa4" run "$@" >"$OUT/$name.log" 2>&1
  echo "$name rc=$?" | tee -a "$OUT/gpu.txt"
  timeout 60 ncu -i "/tmp/$name.ncu-rep" --page details >"$OUT/$name-details.txt" 2>&1
  timeout 60 ncu -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip >"$OUT/$name-sass.csv.gz"
}
prof fwd128 fwd_kernel "" -b 1 -s 16384 --heads 16 -d 128 --pass fwd --iters 1 --check-rows 0
prof fwd64 fwd_kernel "" -b 1 -s 16384 --heads 32 -d 64 --pass fwd --iters 1 --check-rows 0
prof dec2 decode_kernel FA4_FWD_DECODE_KERNEL=2 -b 8 --seqlen-q 1 --seqlen-k 16384 --heads 32 --heads-kv 8 -d 128 --pass fwd --iters 1 --check-rows 0
prof dec0 fwd_kernel FA4_FWD_DECODE_KERNEL=0 -b 8 --seqlen-q 1 --seqlen-k 16384 --heads 32 --heads-kv 8 -d 128 --pass fwd --iters 1 --check-rows 0
ls -la "$OUT"
