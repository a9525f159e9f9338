#!/usr/bin/env bash
# Last call of the session (not committed): HEAD whole ctest (GPU suites), backward sanitizers,
# the GPU gradient pytests, the FP8 screen benchmark, backward speed at the launch-order shapes.
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/c5; rm -rf $L; mkdir -p $L; B=build-c5
export BLASST_REQUIRE_GPU=1 PYTHONUNBUFFERED=1 BLASST_COMMIT=${BLASST_COMMIT:-unknown}
t() { echo "t=$(($(date +%s)-S))"; }
pk() { tar czf "$OUT/c5.tgz" -C /tmp c5; }
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=ON -DBLASST_BUILD_CLI=OFF \
  -DPython_EXECUTABLE="$(command -v python3)" > $L/build.log 2>&1 && cmake --build $B -j 16 >> $L/build.log 2>&1
echo "build rc=$? $(t)"; pk
timeout 100 ctest --test-dir $B -j 4 --timeout 90 > $L/ctest.log 2>&1
echo "ctest rc=$?: $(grep -E 'tests passed' $L/ctest.log) $(grep -E '\(Failed\)|\(Timeout\)' $L/ctest.log | tr '\n' ' ') $(t)"; pk
T=$B/tests/gpu_backward/test_gpu_backward
for tool in racecheck memcheck; do timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='GpuBackwardSanitizer.*' > $L/$tool.log 2>&1
  echo "  $tool rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $L/$tool.log | head -1)"; done; t; pk
PYTHONPATH=$PWD/$B/python timeout 90 python3 -m pytest -p no:cacheprovider -q -rs tests/python/test_backward_cpu.py -k cuda > $L/pytest.log 2>&1
echo "pytest backward cuda rc=$?: $(tail -1 $L/pytest.log) $(t)"; pk
for shape in "--hk 8 --d 128 --l 8192" "--hk 8 --d 128 --l 16384" "--hk 32 --d 128 --l 8192" "--hk 32 --d 128 --l 16384" "--hk 32 --d 64 --l 8192" "--hk 32 --d 64 --l 16384"; do
  timeout 30 $B/bench/backward/bench_backward --b 1 --h 32 $shape --causal 1 --sparsity 0 --iters 20 --kernel wgmma 2>&1 | grep -E '^wgmma' >> $L/bwd.txt; done
awk '{print $3,$4,$5,$9,$10}' $L/bwd.txt; t; pk
timeout 120 python3 bench/prefill/bench_prefill.py --screen --lib $B/bench/prefill/libblasst_prefill_bench.so --out $L/screen > $L/screen.log 2>&1
echo "screen bench rc=$? $(t)"; cat $L/screen/*.md 2>/dev/null | tail -4; pk
