#!/usr/bin/env bash
# Experiment call (not committed): decode L2 promotion variants (d1), the FP8 screen after the
# scale-address fix (p1 = HEAD prefill), the backward launch-order rule (n1 = HEAD) against b1.
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/c4; rm -rf $L; mkdir -p $L
export BLASST_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
t() { echo "t=$(($(date +%s)-S))"; }
bld() { local n=$1; shift
  cmake -S .ab/$n -B build-ab-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
    -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" > $L/build_$n.log 2>&1 &&
    cmake --build build-ab-$n -j 5 --target "$@" >> $L/build_$n.log 2>&1
  echo "build $n rc=$? $(t)"; }
bld d1 blasst_decode_profile & bld p1 test_gpu_prefill_screen blasst_prefill_bench & bld n1 bench_backward test_gpu_backward & bld b1 bench_backward & wait
P=build-ab-d1/bench/decode/blasst_decode_profile
for r in 1 2 3; do for shape in "8 32768" "64 32768" "1 32768"; do for pr in 3 2 0; do
  BLASST_EXP_L2PROMO=$pr timeout 30 $P $shape 32 8 0 40 | sed "s/^/r$r promo$pr /" >> $L/decode.txt; done; done; done
awk '{print $1,$2,$3,$4,$8,$13}' $L/decode.txt; t
timeout 150 build-ab-p1/tests/gpu_prefill/test_gpu_prefill_screen --gtest_brief=1 > $L/screen_tests.log 2>&1
echo "screen tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/screen_tests.log | tr '\n' ' ') $(t)"
timeout 150 python3 bench/prefill/bench_prefill.py --screen --lib build-ab-p1/bench/prefill/libblasst_prefill_bench.so --out $L/screen > $L/screen.log 2>&1
echo "screen bench rc=$? $(t)"; cat $L/screen/*.md 2>/dev/null | tail -4
T=build-ab-n1/tests/gpu_backward/test_gpu_backward
timeout 90 $T --gtest_brief=1 > $L/bwd_tests.log 2>&1; echo "bwd tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/bwd_tests.log | tr '\n' ' ')"
for tool in racecheck memcheck; do timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='GpuBackwardSanitizer.*' > $L/$tool.log 2>&1
  echo "  $tool rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $L/$tool.log | head -1)"; done; t
for r in 1 2; do for shape in "--hk 8 --d 128 --l 8192" "--hk 8 --d 128 --l 16384" "--hk 32 --d 128 --l 8192" "--hk 32 --d 128 --l 16384" "--hk 32 --d 64 --l 8192" "--hk 32 --d 64 --l 16384" "--hk 8 --d 64 --l 8192"; do
  for n in b1 n1; do timeout 60 build-ab-$n/bench/backward/bench_backward --b 1 --h 32 $shape --causal 1 --sparsity 0 --iters 20 --kernel wgmma 2>&1 |
    grep -E '^wgmma' | sed "s/^/r$r $n /" >> $L/bwd_ab.txt; done; done; done
awk '{print $1,$2,$5,$6,$7,$11,$12}' $L/bwd_ab.txt; t
tar czf "$OUT/c4.tgz" -C /tmp c4
