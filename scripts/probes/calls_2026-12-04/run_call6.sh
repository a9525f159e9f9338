#!/usr/bin/env bash
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/c6; rm -rf $L; mkdir -p $L; export BLASST_REQUIRE_GPU=1
t() { echo "t=$(($(date +%s)-S))"; }
pk() { tar czf "$OUT/c6.tgz" -C /tmp c6; }
cmake -S .ab/n2 -B build-ab-n2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
  -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" > $L/build.log 2>&1 &&
  cmake --build build-ab-n2 -j 16 --target bench_backward test_gpu_backward >> $L/build.log 2>&1
echo "build rc=$? $(t)"
for r in 1 2; do for shape in "--hk 8 --d 128 --l 8192" "--hk 8 --d 128 --l 16384" "--hk 32 --d 128 --l 8192" "--hk 32 --d 128 --l 16384" "--hk 32 --d 64 --l 8192" "--hk 32 --d 64 --l 16384"; do
  timeout 30 build-ab-n2/bench/backward/bench_backward --b 1 --h 32 $shape --causal 1 --sparsity 0 --iters 20 --kernel wgmma 2>&1 | grep -E '^wgmma' | sed "s/^/r$r /" >> $L/bwd.txt; done; done
awk '{print $1,$4,$5,$6,$10,$11}' $L/bwd.txt; t; pk
timeout 60 build-ab-n2/tests/gpu_backward/test_gpu_backward --gtest_brief=1 > $L/tests.log 2>&1
echo "test_gpu_backward rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/tests.log | tr '\n' ' ') $(t)"; pk
