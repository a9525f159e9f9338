#!/usr/bin/env bash
# One device call for the SPEC §2b screen ahead (issue 19 part 2) on top of the whole-suite check
# (~9 min on the H200): scripts/device_all.sh (build, every suite, pytest, memcheck / racecheck on
# the sanitizer suites), then compute-sanitizer memcheck and racecheck on the screen suite's small
# crafted case (it runs the screen ahead too), then `bench_prefill.py --screen` (dense, skip, the
# screen in the loop and ahead, strict and tight, at the DiT shape), then bench_prefill.py --quick
# with the time left (570 s in all). Logs under /tmp/la, packed into $OUT/logs.tgz after each
# step; the short tables on stdout.
# The GPU machine's copy has no .git: pass BLASST_COMMIT=<hash>. Carry .deps/cutlass,
# .deps/include, .deps/googletest and .deps/wheels.
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/la; rm -rf $L; mkdir -p $L
export BLASST_COMMIT=${BLASST_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} PYTHONUNBUFFERED=1
B=build-device
left() { echo $((570 - ($(date +%s) - S))); }
pk() { tar czf "${OUT:-/tmp}/logs.tgz" -C /tmp la; }
OUT=$L SANITIZE=1 AB=0 EAGER=0 SAN_TIMEOUT_S=60 CTEST_PER_TEST_S=150 PYTEST_TIMEOUT=130 BUILD_DIR=$B \
  scripts/device_all.sh > $L/all.txt 2>&1
tail -22 $L/all.txt; grep -E '\(Failed\)|\(Timeout\)' $L/ctest.log | head; echo "t=$(($(date +%s) - S))"
grep -E "^\[ahead\]|^\[screen\]|FAILED|Failure" $L/ctest.log | head -30
pk
for tool in memcheck racecheck; do
  timeout 45 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/gpu_prefill/test_gpu_prefill_screen \
    --gtest_filter=GpuPrefillScreen.WrongScreensOfTightZeroAreCounted > $L/san_ahead_$tool.log 2>&1
  echo "$tool screen suite (crafted, with the screen ahead): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/san_ahead_$tool.log | head -1)"
done
pk
R=$(left); [ $R -gt 170 ] && R=170
[ $R -gt 30 ] && timeout $R python3 bench/prefill/bench_prefill.py --screen \
  --lib $B/bench/prefill/libblasst_prefill_bench.so --out $L/screen > $L/screen.log 2>&1
echo "screen rc=$? t=$(($(date +%s) - S))"; cat $L/screen/*.md 2>/dev/null | head -30; tail -5 $L/screen.log; pk
R=$(left); [ $R -gt 130 ] && R=130
[ $R -gt 30 ] && timeout $R python3 bench/prefill/bench_prefill.py --quick \
  --lib $B/bench/prefill/libblasst_prefill_bench.so --out $L/prefill > $L/prefill.log 2>&1
echo "prefill rc=$? t=$(($(date +%s) - S))"; cat $L/prefill/*.md 2>/dev/null | head -30
pk
