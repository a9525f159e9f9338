#!/usr/bin/env bash
# A/B of experiment branches on the GPU machine, beside this tree's build (device_all.sh's
# build-device): each experiment tree sits in .ab/<name>/ (carried; made here with
#   git worktree add --detach /tmp/x main && (cd /tmp/x && git merge <branch>) && git -C /tmp/x archive HEAD | tar -x -C .ab/<name>
# ). Two phases, so that the builds can run beside the GPU tests of device_all.sh:
#   scripts/device_branch_ab.sh build   # configure + build the named targets of every tree (nice'd)
#   scripts/device_branch_ab.sh bench   # correctness first, then speed, alternating old / new
# Known trees: dq (backward: bench_backward, test_gpu_backward), screen (prefill: the screen test and
# the prefill bench library). Logs and tables under $OUT (default /tmp/branch_ab).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/branch_ab}; mkdir -p "$OUT"
MAIN=${BUILD_DIR:-build-device}
targets() { case $1 in
  dq) echo bench_backward test_gpu_backward ;;
  screen) echo blasst_prefill_bench test_gpu_prefill_screen ;;
  *) echo "" ;; esac; }
if [ "${1:-}" = build ]; then
  for t in .ab/*/; do
    n=$(basename "$t"); tg=$(targets "$n"); [ -z "$tg" ] && continue
    s=$(date +%s)
    ( cmake -S "$t" -B "build-ab-$n" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF \
        -DBLASST_BUILD_PYTHON=OFF -DBLASST_DEPS_DIR="$PWD/.deps" \
        -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
      nice -n 10 cmake --build "build-ab-$n" -j "$(nproc)" --target $tg ) > "$OUT/build_$n.log" 2>&1
    echo "build $n: rc=$? ($(( $(date +%s) - s )) s)"
  done
  exit 0
fi
export BLASST_REQUIRE_GPU=1
check() {  # name, test binary, racecheck filter: the whole test binary, then racecheck on the filter
  timeout 120 "$2" --gtest_brief=1 > "$OUT/$1_tests.log" 2>&1
  echo "$1 $(basename "$2"): rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$1_tests.log" | tr '\n' ' ')"
  timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 "$2" --gtest_filter="$3" > "$OUT/$1_racecheck.log" 2>&1
  echo "$1 racecheck: rc=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/$1_racecheck.log" | head -1)"
}
if [ -d build-ab-dq ]; then
  B=build-ab-dq
  check dq $B/tests/gpu_backward/test_gpu_backward 'GpuBackwardSanitizer.*'
  for r in 1 2; do
    for side in main dq; do
      bin=$MAIN/bench/backward/bench_backward; [ $side = dq ] && bin=$B/bench/backward/bench_backward
      timeout 60 $bin --quick --kernel wgmma > "$OUT/bwd_${side}_$r.txt" 2>&1
    done
  done
  echo "backward, main then dq, round 2:"; tail -12 "$OUT/bwd_main_2.txt"; tail -12 "$OUT/bwd_dq_2.txt"
fi
if [ -d build-ab-screen ]; then
  B=build-ab-screen
  check screen $B/tests/gpu_prefill/test_gpu_prefill_screen 'GpuPrefillScreen.Strict*'
  timeout ${SCREEN_BENCH_S:-150} python3 .ab/screen/bench/prefill/bench_prefill.py --screen \
    --lib "$(find $B -name libblasst_prefill_bench.so | head -1)" --out "$OUT/screen" > "$OUT/screen_bench.log" 2>&1
  echo "screen bench: rc=$?"; cat "$OUT"/screen/*.md 2>/dev/null | head -30
fi
