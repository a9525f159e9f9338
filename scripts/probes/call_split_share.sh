#!/usr/bin/env bash
# One device call (issue 14, 2026-12-07 late): the work list's split rule. The split stalls call
# (23:10, H100) found split parts slower per kept group than whole blocks (the consumers' Q / dO
# stage wait) and three stages no help; the heavy set at 50 % ran 10 % faster with no splits at
# all (ns). New rule (branch split-share): a heavy block splits only above kSplitShareNum /
# kSplitShareDen of an SM's share of the call. Trees of .ab (made by scripts/probes/prep_split_share.sh, see
# bench/RESULTS.md): ws = main (every heavy block split), a1 = the rule at 1 (with its
# test_gpu_backward and memcheck of the work-list tests), a05 = at 1/2, a2 = at 2 (bench only).
# Carry .deps/cutlass .deps/include .deps/googletest .ab.
cd "$(dirname "$0")/../.."
S=$(date +%s); OUT=${OUT:-/tmp/split_share}; mkdir -p "$OUT"; W=/tmp/ssh; rm -rf $W; mkdir -p $W
TREES=${TREES:-"ws a1 a05 a2"}
TEST_TREES=${TEST_TREES:-"a1"}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for n in $TREES; do
  ( cmake -S .ab/$n -B build-ab-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
      -DBLASST_BUILD_TESTS=$(case " $TEST_TREES " in *" $n "*) echo ON;; *) echo OFF;; esac) -DBLASST_DEPS_DIR="$PWD/.deps" \
      -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
    cmake --build build-ab-$n -j 5 --target bench_backward $(case " $TEST_TREES " in *" $n "*) echo test_gpu_backward;; esac) ) > $W/build_$n.log 2>&1 &
done
wait
echo "built t=$(($(date +%s) - S))"; for n in $TREES; do tail -1 $W/build_$n.log; done
for n in $TEST_TREES; do
  BLASST_REQUIRE_GPU=1 timeout 150 build-ab-$n/tests/gpu_backward/test_gpu_backward > $W/test_$n.log 2>&1
  echo "$n test_gpu_backward rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $W/test_$n.log | tr '\n' ' ')"; grep -E '^\[  FAILED|Failure|error' $W/test_$n.log | head -8
  BLASST_REQUIRE_GPU=1 timeout 90 compute-sanitizer --tool memcheck build-ab-$n/tests/gpu_backward/test_gpu_backward \
    --gtest_filter='*WorkList*' > $W/memcheck_$n.log 2>&1
  echo "$n memcheck work list rc=$? $(grep 'ERROR SUMMARY' $W/memcheck_$n.log)"
done
echo "tests t=$(($(date +%s) - S))"
# rows: L:causal:set:sparsity
ROWS=${ROWS:-"8192:1:heavy:0.5 8192:1:heavy:0.7 8192:1:heavy:0.9 8192:1:iid:0.5 8192:1:iid:0.7 8192:1:iid:0.9 8192:1:window:0.7 8192:1:iid:0 16384:1:heavy:0.5 16384:1:heavy:0.7 16384:1:iid:0.7 8192:0:heavy:0.7 8192:0:iid:0.9"}
for round in 1 2; do
for row in $ROWS; do
  [ $(($(date +%s) - S)) -gt $((${LIMIT_S:-560} - 30)) ] && { echo "no time left for $row"; continue; }
  IFS=: read -r l causal set sp <<< "$row"
  for n in $TREES; do
    timeout 40 build-ab-$n/bench/backward/bench_backward --b 1 --h 32 --hk 8 --d 128 --causal $causal --l $l --kernel wgmma \
      --set $set --sparsity $sp --iters 10 2>&1 | grep -E '^wgmma' | awk -v p="r$round $n L$l c$causal $set" '{print p, $7, $8, $9, $10}'
  done
done; done | tee $OUT/rows.txt
(cd /tmp && tar czf $OUT/logs.tgz ssh); echo "done t=$(($(date +%s) - S))"
