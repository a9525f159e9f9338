#!/usr/bin/env bash
# Prefill kernel, one device call: configure + build the prefill targets, run the GPU tests,
# compute-sanitizer (memcheck + racecheck) on small configurations, the benchmark; logs and
# results under $OUT; a short summary and the benchmark table last.
#   usage: scripts/device_prefill.sh [all|test|bench|quick|profile]   (BENCH_ARGS: extra bench_prefill.py args)
#   profile: ncu on dense, the skip kernel at 0 % and the histogram kernel (random bf16, d128, 16k
#          causal; bench/prefill/profile_prefill.py): throughput, instructions, warp stalls.
#   quick: build, GPU tests (no sanitizers), the reduced benchmark (bench_prefill.py --quick:
#          d128 16k/32k + d64 16k causal, skip kernel at 0 % and at 50/70/90 %, interleaved
#          timing after a warm-up), ~120 s on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
OUT=${OUT:-/tmp/prefill_out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-dev-prefill}
# .git does not travel to the device machine: pass BLASST_COMMIT=<hash> in the command there.
export BLASST_COMMIT=${BLASST_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
# A GPU test that finds no GPU fails here instead of skipping (tests/gpu_common.hpp).
export BLASST_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
SUMMARY=()

t0=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF > "$OUT/build.log" 2>&1
if ! cmake --build "$BUILD" -j16 --target test_gpu_prefill test_gpu_prefill_ref test_gpu_prefill_instances blasst_prefill_bench >> "$OUT/build.log" 2>&1; then
  grep -E "error|FAILED" "$OUT/build.log" | head -40
  echo "BUILD FAILED"; exit 1
fi
SUMMARY+=("build: $(( $(date +%s) - t0 )) s")
cuobjdump --dump-sass "$BUILD/libblasst.a" 2>/dev/null | grep -c HGMMA > "$OUT/hgmma_count.txt" || true
cuobjdump --dump-resource-usage "$BUILD/libblasst.a" 2>/dev/null | grep -E "Function|REG" | grep -A1 prefill_kernel > "$OUT/prefill_resource_usage.txt" || true

# Smoke test first: a hang or crash here skips the long phases (the device call has a time limit).
timeout 40 "$BUILD/tests/gpu_prefill/test_gpu_prefill" --gtest_filter='GpuPrefillSanitizer.*' > "$OUT/smoke.log" 2>&1
smoke=$?
SUMMARY+=("smoke test: rc=$smoke")
if [ $smoke -ne 0 ]; then
  tail -30 "$OUT/smoke.log"
  MODE=none
fi

if [ "$MODE" = all ] || [ "$MODE" = test ] || [ "$MODE" = quick ]; then
  t0=$(date +%s)
  # quick: tighter limits (the tests take ~17 s on an H200); a hang must not eat the bench's time.
  T1=150; T2=60; [ "$MODE" = quick ] && { T1=60; T2=30; }
  timeout $T1 "$BUILD/tests/gpu_prefill/test_gpu_prefill" --gtest_filter=-GpuPrefillSanitizer.* > "$OUT/tests.log" 2>&1; rc1=$?
  timeout $T2 "$BUILD/tests/gpu_prefill/test_gpu_prefill_ref" > "$OUT/tests_ref.log" 2>&1; rc2=$?
  timeout $T2 "$BUILD/tests/gpu_prefill/test_gpu_prefill_instances" > "$OUT/tests_instances.log" 2>&1; rc3=$?
  SUMMARY+=("tests: rc=$rc1 ref rc=$rc2 instances rc=$rc3 ($(( $(date +%s) - t0 )) s)")
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error:|Expected|Which is|Value of|\[skip\]|\[ref\]|\[instances\]|OK \]" "$OUT/tests.log" "$OUT/tests_ref.log" "$OUT/tests_instances.log" | head -80
fi
# SANITIZE=1 adds the sanitizers to quick mode (after a change in synchronisation).
if [ "$MODE" = all ] || [ "$MODE" = test ] || { [ "$MODE" = quick ] && [ "${SANITIZE:-0}" = 1 ]; }; then
  t0=$(date +%s)
  for tool in memcheck racecheck; do
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 \
      "$BUILD/tests/gpu_prefill/test_gpu_prefill" --gtest_filter='GpuPrefillSanitizer.*' > "$OUT/sanitizer_$tool.log" 2>&1
    SUMMARY+=("compute-sanitizer $tool: rc=$? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1))")
  done
fi

if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout ${BENCH_TIMEOUT_S:-240} python3 bench/prefill/bench_prefill.py --lib "$BUILD/bench/prefill/libblasst_prefill_bench.so" \
    --out "$OUT" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  SUMMARY+=("bench: rc=$? ($(( $(date +%s) - t0 )) s)")
fi
if [ "$MODE" = quick ]; then
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout 150 python3 bench/prefill/bench_prefill.py --quick --lib "$BUILD/bench/prefill/libblasst_prefill_bench.so" \
    --out "$OUT" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  SUMMARY+=("quick bench: rc=$? ($(( $(date +%s) - t0 )) s)")
fi
if [ "$MODE" = profile ]; then
  t0=$(date +%s)
  # One launch of each kind (dense, skip at 0 %, histogram, max-first) after one warm launch each.
  for cfg in "16384 1" "32768 0"; do
    tag=$(echo "$cfg" | tr ' ' '_')
    timeout 200 ncu --clock-control none --kernel-name regex:prefill_kernel --launch-skip 0 --launch-count 8 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters \
      python3 bench/prefill/profile_prefill.py "$BUILD/bench/prefill/libblasst_prefill_bench.so" $cfg 128 2 \
      > "$OUT/ncu_prefill_$tag.txt" 2>&1
    SUMMARY+=("ncu L, causal = $cfg: rc=$? ($(( $(date +%s) - t0 )) s): $(grep -E '^    Duration' "$OUT/ncu_prefill_$tag.txt" | tr -s ' ' | cut -d' ' -f4 | tr '\n' ' ')ms")
  done
  # Warp stall reasons per issued instruction (d128 and d64, 16k causal), one launch per kind.
  for d in 128 64; do
    timeout 120 ncu --clock-control none --kernel-name regex:prefill_kernel --launch-skip 0 --launch-count 8 \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum,smsp__inst_executed.sum' \
      python3 bench/prefill/profile_prefill.py "$BUILD/bench/prefill/libblasst_prefill_bench.so" 16384 1 $d 2 \
      > "$OUT/ncu_stalls_d$d.txt" 2>&1
    SUMMARY+=("ncu stalls d$d: rc=$?")
  done
fi
echo "==== summary"
cat "$OUT/gpu.txt"
echo "HGMMA instructions in libblasst.a SASS: $(cat "$OUT/hgmma_count.txt" 2>/dev/null)"
printf '%s\n' "${SUMMARY[@]}"
[ -f "$OUT/bench_prefill.md" ] && cat "$OUT/bench_prefill.md" || tail -20 "$OUT/bench.log" 2>/dev/null
