#!/usr/bin/env bash
# One device call (issue 14): where the skip backward's time goes at 8k, and the d128 full 8k
# main kernel's source profile.
#   1. bench_backward (wgmma, B 1, H 32, full 8k, the i.i.d. synthetic sets) at ROWS: sparsity 0.99
#      leaves each vote group's tile 0 and little else, so its time is near the call's floor
#      (pre / postprocess, every CTA's prologue, K / V loads and dK / dV stores);
#   2. ncu durations (gpu__time_duration, --clock-control none) of each kernel of one call at
#      DUR_ROWS (preprocess, main, postprocess) and the main kernel's SM active cycles min / avg /
#      max (imbalance between SMs);
#   3. ncu full set with source-level sampling (build with -lineinfo: SASS unchanged) of the main
#      kernel at NCU_ROWS (default: d128 full 8k dense, d64 full 8k at 0.7); reports in
#      $OUT/floor.tgz, read locally with scripts/ncurep_dump.py --sass.
# ROWS=none: no bench rows (e.g. after device_call_bwd_trees.sh). Uses BUILD_DIR (default
# build-device, e.g. left by `LINEINFO=1 scripts/device_all.sh` on the same warm machine); builds
# bench_backward there (with -lineinfo) when it is missing.
# Carry .deps/cutlass .deps/include .deps/googletest.
set -uo pipefail
cd "$(dirname "$0")/.."
S=$(date +%s); OUT=${OUT:-/tmp/floor}; mkdir -p "$OUT"; L=/tmp/fl; rm -rf $L; mkdir -p $L
B=${BUILD_DIR:-build-device}; X=$B/bench/backward/bench_backward
t() { echo "t=$(($(date +%s) - S))"; }
left() { echo $((${LIMIT_S:-560} - ($(date +%s) - S))); }
pack() { tar czf "$OUT/floor.tgz" -C /tmp fl; }
# d, sparsity; FLOOR_L (8192), FLOOR_CAUSAL (0) and FLOOR_EXTRA (e.g. "--hk 8 --set window": the
# llm shape) change the rows of every part
bench_args() { echo "--b 1 --h 32 --d $1 --causal ${FLOOR_CAUSAL:-0} --l ${FLOOR_L:-8192} --sparsity $2 --kernel wgmma ${FLOOR_EXTRA:-}"; }
if [ ! -x "$X" ]; then
  ( cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=OFF -DBLASST_BUILD_CLI=OFF \
      -DCMAKE_CUDA_FLAGS=-lineinfo -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
    cmake --build $B -j "$(nproc)" --target bench_backward ) > $L/build.log 2>&1
  echo "build rc=$? $(t)"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/gpu.txt
ROWS=${ROWS:-"64:0 64:0.5 64:0.7 64:0.9 64:0.99 128:0 128:0.7 128:0.9 128:0.99"}
echo "== bench_backward full 8k (round d target achieved ms TFLOP/s x)"
[ "$ROWS" = none ] && ROWS=  # the ncu parts only
for r in 1 2; do
  for row in $ROWS; do
    IFS=: read -r d sp <<< "$row"
    timeout 30 $X $(bench_args $d $sp) --iters 10 2>&1 |
      grep -E '^wgmma' | sed "s/^/r$r d$d /"
  done
done | tee $L/bench.txt
t; pack
echo "== ncu durations (us) per kernel of one call"
DUR_ROWS=${DUR_ROWS:-"64:0 64:0.7 64:0.99 128:0 128:0.7 128:0.99"}
for row in $DUR_ROWS; do
  IFS=: read -r d sp <<< "$row"
  [ $(left) -lt 60 ] && { echo "no time left"; break; }
  timeout 60 ncu --clock-control none --kernel-name regex:'preprocess|postprocess|backward_wgmma' --launch-skip 9 --launch-count 3 \
    --metrics gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max --csv --page raw \
    $X $(bench_args $d $sp) --iters 1 > $L/dur_d${d}_s$sp.csv 2>&1
  echo "d$d s$sp rc=$?"
  python3 scripts/ncu_csv.py $L/dur_d${d}_s$sp.csv
done
t; pack
NCU_ROWS=${NCU_ROWS:-"128:0 64:0.7"}
for row in $NCU_ROWS; do
  IFS=: read -r d sp <<< "$row"
  lim=$(left); [ $lim -gt 150 ] && lim=150
  [ $lim -lt 40 ] && { echo "ncu d$d s$sp: no time left"; break; }
  timeout $lim ncu --clock-control none --set full --import-source yes --export $L/ncu_d${d}_s$sp --force-overwrite \
    --kernel-name regex:'backward_wgmma_kernel' --launch-skip 1 --launch-count 1 \
    --metrics sm__cycles_active.min,sm__cycles_active.max \
    $X $(bench_args $d $sp) --iters 1 > $L/ncu_d${d}_s$sp.txt 2>&1
  echo "ncu d$d s$sp rc=$? $(grep -E 'Duration|Compute \(SM\) Throughput|Issue Slots Busy' $L/ncu_d${d}_s$sp.txt | tr -s ' ' | tr '\n' ';' | cut -c1-300) $(t)"
  pack
done
t
