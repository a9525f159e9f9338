#!/usr/bin/env bash
# One device call (2026-12-03, third session): the GPU calibration validation of issue 17
# (scripts/device_calib.sh, targets 0.3-0.9, 256 decode steps), the backward speed of the merged
# dQ overlap (bench_backward --quick), then two variants of the skip_hist last-tile hand-off under
# racecheck (patches carried in .ab/patches: histA = bar.red on both sides, histB = two bar.sync
# with the histogram warp's read between them), each applied, rebuilt, checked and reverted.
# Everything in build-device (CLI on, Python off). Logs packed into $OUT/logs.tgz.
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/lc; rm -rf $L; mkdir -p $L
B=build-device
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=OFF -DBLASST_BUILD_CLI=ON > $L/build.log 2>&1 &&
  cmake --build $B -j "$(nproc)" >> $L/build.log 2>&1
echo "build rc=$? t=$(($(date +%s) - S))"
timeout 60 $B/bench/backward/bench_backward --quick --kernel wgmma > $L/bwd.txt 2>&1; tail -12 $L/bwd.txt
OUT=$L/calib BUILD_DIR=$B CAL_TIMEOUT_S=90 timeout 300 scripts/device_calib.sh > $L/calib.txt 2>&1
echo "calib rc=$? t=$(($(date +%s) - S))"; grep -E 'rc|total' $L/calib.txt | head -8
for v in histA histB; do
  [ $(( $(date +%s) - S )) -gt 500 ] && { echo "$v: no time left"; continue; }
  patch -p1 < .ab/patches/$v.patch > /dev/null &&
    cmake --build $B --target test_gpu_prefill -j "$(nproc)" > $L/build_$v.log 2>&1
  echo "$v build rc=$?"
  BLASST_REQUIRE_GPU=1 timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/gpu_prefill/test_gpu_prefill \
    --gtest_filter='GpuPrefillSanitizer.*' > $L/racecheck_$v.log 2>&1
  echo "$v racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' $L/racecheck_$v.log)"
  BLASST_REQUIRE_GPU=1 timeout 60 $B/tests/gpu_prefill/test_gpu_prefill --gtest_brief=1 > $L/tests_$v.log 2>&1
  echo "$v test_gpu_prefill rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $L/tests_$v.log | tr '\n' ' ')"
  patch -R -p1 < .ab/patches/$v.patch > /dev/null
done
echo "t=$(($(date +%s) - S))"
tar czf "${OUT:-/tmp}/logs.tgz" -C /tmp lc
