#!/usr/bin/env bash
# One device call (2026-12-04 p.m.): the backward's pre / postprocess rewrite (dQ accumulator zeroed
# by the preprocess instead of a memset; loads unrolled per head dim; the postprocess 8 elements a
# thread with 16-byte stores) and the wgmma kernel's dK / dV epilogue in 4-byte pair stores (first
# run, 1a84a3c: with the LSE loaded into registers while S^T runs, since reverted: the main kernel
# +2.3 %), against the tree before them (.ab/base, carried: `git archive 9ff8910`).
#   1. build this tree (Python on, for the peers' run) and the baseline's bench_backward side by side;
#   2. test_gpu_backward (whole binary), compute-sanitizer memcheck and racecheck on
#      GpuBackwardSanitizer.* and MisalignedDqTakesTheElementStores;
#   3. A/B: bench_backward base / new alternated, 2 rounds, B 1, H 32;
#   4. ncu (--clock-control none): each kernel of one d128 causal 8k call, base and new;
#   5. bench_backward_peers.py --quick (torch SDPA cuDNN / flash beside ours), while time is left.
# Logs in $OUT/logs.tgz. Carry .deps/cutlass .deps/include .deps/googletest .ab/base.
cd "$(dirname "$0")/.."
S=$(date +%s); B=build-device; L=/tmp/lc; rm -rf $L; mkdir -p $L
export BLASST_COMMIT=${BLASST_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} PYTHONUNBUFFERED=1
t() { echo "t=$(($(date +%s) - S))"; }
left() { echo $((575 - ($(date +%s) - S))); }
pack() { tar czf "$OUT/logs.tgz" -C /tmp lc; }
CFG="-G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF"
( cmake -S . -B $B $CFG -DBLASST_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" &&
  cmake --build $B -j 10 --target test_gpu_backward bench_backward _core ) > $L/build.log 2>&1 &
NEW=$!
( cmake -S .ab/base -B build-ab-base $CFG -DBLASST_BUILD_PYTHON=OFF -DBLASST_DEPS_DIR="$PWD/.deps" \
    -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
  cmake --build build-ab-base -j 6 --target bench_backward ) > $L/build_base.log 2>&1 &
BASE=$!
wait $NEW; rc=$?; wait $BASE; rcb=$?
echo "build rc=$rc base rc=$rcb $(t)"
[ $rc -ne 0 ] && { grep -E "error|FAILED" $L/build.log | head -30; pack; exit 1; }
export BLASST_REQUIRE_GPU=1
T=$B/tests/gpu_backward/test_gpu_backward
timeout 120 $T --gtest_brief=1 > $L/bwd_tests.log 2>&1
echo "test_gpu_backward rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' $L/bwd_tests.log | tr '\n' ' ') $(grep -E '^\[  FAILED  \] Gpu' $L/bwd_tests.log | tr '\n' ' ') $(t)"
F='GpuBackwardSanitizer.*:GpuBackward.MisalignedOutputsTakeTheElementStores'
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter="$F" > $L/memcheck.log 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck.log | head -1)"
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 $T --gtest_filter="$F" > $L/racecheck.log 2>&1
echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' $L/racecheck.log | head -1) $(t)"
if [ $rcb -eq 0 ]; then
  for r in 1 2; do
    for entry in "--d 128 --causal 1 --l 8192|0 0.7" "--d 128 --causal 1 --l 16384|0" "--d 128 --causal 0 --l 8192|0 0.7" \
                 "--d 128 --causal 0 --l 16384|0" "--d 64 --causal 1 --l 8192|0" "--d 64 --causal 0 --l 8192|0"; do
      shape=${entry%%|*}
      for s in ${entry#*|}; do
        for tree in base new; do
          [ $tree = base ] && X=build-ab-base/bench/backward/bench_backward || X=$B/bench/backward/bench_backward
          timeout 60 $X --b 1 --h 32 $shape --sparsity $s --iters 20 --kernel wgmma 2>&1 | grep -E '^wgmma' |
            sed "s/^/r$r $tree /" >> $L/ab.txt
        done
      done
    done
  done
  echo "A/B (round tree L d mask target ms TFLOP/s):"; awk '{print $1, $2, $6, $7, $8, $9, $11, $12}' $L/ab.txt
else grep -E "error|FAILED" $L/build_base.log | head -10; fi
t
for tree in base new; do
  [ $tree = base ] && X=build-ab-base/bench/backward/bench_backward || X=$B/bench/backward/bench_backward
  timeout 60 ncu --clock-control none --section SpeedOfLight --section SourceCounters --launch-skip 0 --launch-count 3 \
    --kernel-name regex:'preprocess|postprocess|backward_wgmma' \
    $X --b 1 --h 32 --l 8192 --d 128 --causal 1 --sparsity 0 --iters 1 --kernel wgmma > $L/ncu_$tree.txt 2>&1
  echo "ncu $tree rc=$?: $(grep -E '^  [a-zA-Z_ ]*void|Duration|excessive sectors' $L/ncu_$tree.txt | sed -E 's/\(blasst.*//; s/<.*//' | tr -s ' ' | tr '\n' ' ')"
done
t
R=$(left)
if [ $R -gt 100 ]; then
  PYTHONPATH=$PWD/$B/python timeout $((R - 10)) python3 bench/backward/bench_backward_peers.py --quick --out $L/peers > $L/peers.log 2>&1
  echo "peers rc=$?"; cat $L/peers/*.md 2>/dev/null | head -40; tail -3 $L/peers.log
fi
pack; t
