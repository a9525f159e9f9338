#!/usr/bin/env bash
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/c8; rm -rf $L; mkdir -p $L; export BLASST_REQUIRE_GPU=1
t() { echo "t=$(($(date +%s)-S))"; }
pk() { tar czf "$OUT/c8.tgz" -C /tmp c8; }
cmake -S .ab/v1 -B build-ab-v1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
  -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" > $L/build.log 2>&1 &&
  cmake --build build-ab-v1 -j 16 --target test_gpu_decode blasst_decode_profile >> $L/build.log 2>&1
echo "build rc=$? $(t)"; pk
P=build-ab-v1/bench/decode/blasst_decode_profile
for shape in "8 32768" "64 32768" "1 32768"; do timeout 20 $P $shape 32 8 0 40 2>&1 | tee -a $L/profile.txt; done
timeout 40 python3 .ab/cudnn_decode.py 2>&1 | tee $L/cudnn.txt; t; pk
timeout 60 build-ab-v1/tests/gpu_decode/test_gpu_decode --gtest_brief=1 > $L/tests.log 2>&1
echo "test_gpu_decode rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/tests.log | tr '\n' ' ') $(t)"; pk
