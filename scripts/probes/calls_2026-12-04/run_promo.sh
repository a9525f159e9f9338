#!/usr/bin/env bash
# Experiment (scripts/probes/calls_2026-12-04/run_promo.sh): decode TMA L2 promotion variants.
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/c7; rm -rf $L; mkdir -p $L
t() { echo "t=$(($(date +%s)-S))"; }
pk() { tar czf "$OUT/c7.tgz" -C /tmp c7; }
cmake -S .ab/d1 -B build-ab-d1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF -DBLASST_BUILD_TESTS=OFF \
  -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" > $L/build.log 2>&1 &&
  cmake --build build-ab-d1 -j 16 --target blasst_decode_profile >> $L/build.log 2>&1
echo "build rc=$? $(t)"; pk
P=build-ab-d1/bench/decode/blasst_decode_profile
for r in 1 2; do for shape in "8 32768" "64 32768" "1 32768" "8 131072"; do for pr in 3 2 1 0; do
  BLASST_EXP_L2PROMO=$pr timeout 20 $P $shape 32 8 0 40 2>&1 | sed "s/^/r$r promo$pr /" >> $L/decode.txt; done; done
  awk '{print $1,$2,$3,$4,$8,$13}' $L/decode.txt | tail -16; t; pk; done
