#!/usr/bin/env bash
# The backward kernels (SPEC §9, src/cuda/sm90/backward/) on the GPU machine: build the library,
# tests/gpu_backward, the reference backward suite and bench/backward; run both suites (GPU
# required), compute-sanitizer (memcheck, racecheck) on GpuBackwardSanitizer.*, and the benchmark
# (BENCH_ARGS, default --quick; BENCH_ARGS=" " for the full default table); PEERS=1 adds the Python
# benchmark beside torch SDPA's backward (bench/backward/bench_backward_peers.py). Logs under $OUT, a
# short summary last. Carry .deps/cutlass, .deps/include and .deps/googletest.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_backward}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-device}
SUMMARY=()
t0=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 &&
  cmake --build "$BUILD" -j "$(nproc)" --target test_gpu_backward test_reference_backward bench_backward \
    >> "$OUT/build.log" 2>&1
rc=$?
SUMMARY+=("build: rc=$rc ($(( $(date +%s) - t0 )) s)")
if [ $rc -ne 0 ]; then grep -E "error|FAILED" "$OUT/build.log" | head -40; printf '%s\n' "${SUMMARY[@]}"; exit 1; fi

export BLASST_REQUIRE_GPU=1
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-400} "$BUILD/tests/gpu_backward/test_gpu_backward" --gtest_filter=-GpuBackwardSanitizer.* \
  > "$OUT/tests.log" 2>&1
SUMMARY+=("gpu backward tests: rc=$? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests.log" | tr '\n' ' ')")
timeout 120 "$BUILD/tests/reference/test_reference_backward" > "$OUT/reference.log" 2>&1
SUMMARY+=("reference backward tests: rc=$?")

if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    timeout ${SAN_TIMEOUT_S:-150} compute-sanitizer --tool $tool --error-exitcode 9 \
      "$BUILD/tests/gpu_backward/test_gpu_backward" --gtest_filter='GpuBackwardSanitizer.*' \
      > "$OUT/sanitizer_$tool.log" 2>&1
    SUMMARY+=("compute-sanitizer $tool: rc=$? ($(( $(date +%s) - t0 )) s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | head -1)")
  done
fi

t0=$(date +%s)
timeout ${BENCH_TIMEOUT_S:-300} "$BUILD/bench/backward/bench_backward" ${BENCH_ARGS:---quick} > "$OUT/bench.log" 2>&1
SUMMARY+=("bench_backward ${BENCH_ARGS:---quick}: rc=$? ($(( $(date +%s) - t0 )) s), table in bench.log")

# PEERS=1: beside torch SDPA's cuDNN and flash backward on the same tensors, with skip rows at the
# forward's own lambdas (bench/backward/bench_backward_peers.py; needs the Python extension).
if [ "${PEERS:-0}" = 1 ]; then
  t0=$(date +%s)
  { cmake -S . -B "$BUILD" -DBLASST_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" &&
    cmake --build "$BUILD" -j "$(nproc)"; } >> "$OUT/build.log" 2>&1 &&
    PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" timeout ${PEERS_TIMEOUT_S:-240} \
      python3 bench/backward/bench_backward_peers.py ${PEERS_ARGS:---quick} --out "$OUT" > "$OUT/peers.log" 2>&1
  SUMMARY+=("bench_backward_peers ${PEERS_ARGS:---quick}: rc=$? ($(( $(date +%s) - t0 )) s), table in bench_backward_peers.md")
fi

echo "==== failures (if any)"
grep -E "FAILED|Failure|error" "$OUT/tests.log" | head -30
cat "$OUT/bench.log"
echo "==== summary"
printf '%s\n' "${SUMMARY[@]}"
