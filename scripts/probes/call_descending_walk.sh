#!/usr/bin/env bash
# One device call (issue 14, written 2026-12-07 late, not yet run): the wgmma backward walking each
# query head's vote groups from the last down (pending/backward-descending-walk.patch). Why: the
# split parts' extra time is the consumers' wait for each step's Q / dO (ncu 23:10), a third
# stage did not shorten it, and the heavy blocks of one query head (key block 0 and the heavy
# hitters' blocks, run side by side first) walk up from their own first group (causal: 2 n), so
# the same rows are read 14+ steps apart (~8 MB of loads a step over the SMs: beyond the L2).
# Walking down, they all start at the last group and read each row together. Predicted: heavy-set
# rows 5-15 % faster (50 / 70 %), iid and window rows and dense within 3 %; if not, L2 reuse of
# Q / dO is not what the parts wait on. Trees of .ab (scripts/probes/prep_descending_walk.sh):
# ws = main, rv = main + the patch (its test_gpu_backward, test_wgmma_layouts, memcheck).
# Carry .deps/cutlass .deps/include .deps/googletest .ab.
cd "$(dirname "$0")/../.."
S=$(date +%s); OUT=${OUT:-/tmp/descending_walk}; mkdir -p "$OUT"; W=/tmp/dsw; rm -rf $W; mkdir -p $W
TREES=${TREES:-"ws rv"}
TEST_TREES=${TEST_TREES:-"rv"}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for n in $TREES; do
  ( cmake -S .ab/$n -B build-ab-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
      -DBLASST_BUILD_TESTS=$(case " $TEST_TREES " in *" $n "*) echo ON;; *) echo OFF;; esac) -DBLASST_DEPS_DIR="$PWD/.deps" \
      -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
    cmake --build build-ab-$n -j 8 --target bench_backward \
      $(case " $TEST_TREES " in *" $n "*) echo test_gpu_backward test_wgmma_layouts;; esac) ) > $W/build_$n.log 2>&1 &
done
wait
echo "built t=$(($(date +%s) - S))"; for n in $TREES; do tail -1 $W/build_$n.log; done
for n in $TEST_TREES; do
  BLASST_REQUIRE_GPU=1 timeout 150 build-ab-$n/tests/gpu_backward/test_gpu_backward > $W/test_$n.log 2>&1
  echo "$n test_gpu_backward rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $W/test_$n.log | tr '\n' ' ')"; grep -E '^\[  FAILED|Failure' $W/test_$n.log | head -8
  timeout 60 build-ab-$n/tests/gpu_backward/test_wgmma_layouts > $W/layouts_$n.log 2>&1
  echo "$n test_wgmma_layouts rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $W/layouts_$n.log | tr '\n' ' ')"
  BLASST_REQUIRE_GPU=1 timeout 90 compute-sanitizer --tool memcheck build-ab-$n/tests/gpu_backward/test_gpu_backward \
    --gtest_filter='GpuBackwardSanitizer.*' > $W/memcheck_$n.log 2>&1
  echo "$n memcheck rc=$? $(grep 'ERROR SUMMARY' $W/memcheck_$n.log | tail -1)"
done
echo "tests t=$(($(date +%s) - S))"
# rows: L:causal:hk:set:sparsity
ROWS=${ROWS:-"8192:1:8:heavy:0.5 8192:1:8:heavy:0.7 8192:1:8:heavy:0.9 8192:1:8:iid:0.7 8192:1:8:iid:0.9 8192:1:8:window:0.7 8192:1:8:iid:0 8192:0:8:iid:0 16384:1:8:heavy:0.7 16384:1:8:iid:0 8192:0:32:iid:0.7 8192:1:32:iid:0"}
for round in 1 2; do
for row in $ROWS; do
  [ $(($(date +%s) - S)) -gt $((${LIMIT_S:-560} - 30)) ] && { echo "no time left for $row"; continue; }
  IFS=: read -r l causal hk set sp <<< "$row"
  for n in $TREES; do
    timeout 40 build-ab-$n/bench/backward/bench_backward --b 1 --h 32 --hk $hk --d 128 --causal $causal --l $l --kernel wgmma \
      --set $set --sparsity $sp --iters 10 2>&1 | grep -E '^wgmma' | awk -v p="r$round $n L$l c$causal hk$hk $set" '{print p, $7, $8, $9, $10}'
  done
done; done | tee $OUT/rows.txt
(cd /tmp && tar czf $OUT/logs.tgz dsw); echo "done t=$(($(date +%s) - S))"
