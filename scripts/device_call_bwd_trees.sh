#!/usr/bin/env bash
# One device call: backward trees side by side (bench_backward's i.i.d. synthetic skip sets and
# dense rows; for the trees in TEST_TREES also their test_gpu_backward and compute-sanitizer
# racecheck and memcheck on its sanitizer suite). First used for the d = 64 skip backward before and after the 128-row steps
# (ab66790: a step runs when either of its two vote groups is kept; i.i.d. sets are the worst case).
# Trees in .ab/<name> trimmed to the backward instances:
#   for t in b0:427bb78 h:HEAD; do n=${t%%:*}; mkdir -p .ab/$n; git archive ${t#*:} | tar -x -C .ab/$n; done
#   (then keep only the BLASST_BACKWARD_KERNEL lines of .ab/*/src/cuda/sm90/kernel_table.inc: the
#   backward tests run the forward on the reference engine)
# Carry .deps/cutlass .deps/include .deps/googletest .ab. TREES (default "b0 h"); TEST_TREES (trees
# whose tests run; default none); MUT_TREES (trees with a mutant applied, as name or
# name:gtest-filter: only that filter runs, GpuBackward.SkipSetMatchesReference by default, and it
# must fail); ROWS (d:causal:L:sparsity[:hk[:set]], hk = KV heads for GQA rows (empty: MHA), set =
# bench_backward's --set (iid, window: sink + locality, or heavy: that and 8 heavy-hitter tiles, the
# llm shape); default: d 64 full 8k
# and causal 16k at 0 / 50 / 70 / 90 %);
# ROUNDS (2). Prints round, tree, d, mask, L, target, achieved, ms, TFLOP/s, speedup over the same
# tree's dense.
cd "$(dirname "$0")/.."
S=$(date +%s); TREES=${TREES:-"b0 h"}; TEST_TREES=${TEST_TREES:-}; MUT_TREES=${MUT_TREES:-}
ROWS=${ROWS:-"64:0:8192:0 64:0:8192:0.5 64:0:8192:0.7 64:0:8192:0.9 64:1:16384:0 64:1:16384:0.5 64:1:16384:0.7 64:1:16384:0.9"}
OUT=${OUT:-/tmp/bwd_trees}; mkdir -p "$OUT"
for n in $(echo $TREES $TEST_TREES $MUT_TREES | tr ' ' '\n' | sed 's/:.*//' | sort -u); do
  case " $TEST_TREES $(echo $MUT_TREES | sed 's/:[^ ]*//g') " in *" $n "*) tests=ON; targets="bench_backward test_gpu_backward" ;; *) tests=OFF; targets=bench_backward ;; esac
  ( cmake -S .ab/$n -B build-ab-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
      -DBLASST_BUILD_TESTS=$tests -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
    cmake --build build-ab-$n -j 8 --target $targets ) > "$OUT/build_$n.log" 2>&1 &
done
wait
echo "built t=$(($(date +%s) - S))"
for n in $TEST_TREES; do
  t=$(find build-ab-$n -name test_gpu_backward -type f | head -1)
  BLASST_REQUIRE_GPU=1 timeout 120 "$t" > "$OUT/test_$n.log" 2>&1
  echo "test $n: rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_$n.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/test_$n.log" | head
  timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 "$t" --gtest_filter='GpuBackwardSanitizer.*' > "$OUT/racecheck_$n.log" 2>&1
  echo "racecheck $n: rc=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck_$n.log" | head -1)"
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$t" --gtest_filter='GpuBackwardSanitizer.*' > "$OUT/memcheck_$n.log" 2>&1
  echo "memcheck $n: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_$n.log" | head -1)"
done
for nf in $MUT_TREES; do
  n=${nf%%:*}; f=GpuBackward.SkipSetMatchesReference; [ "$nf" != "$n" ] && f=${nf#*:}
  t=$(find build-ab-$n -name test_gpu_backward -type f | head -1)
  BLASST_REQUIRE_GPU=1 timeout 120 "$t" --gtest_filter="$f" > "$OUT/test_$n.log" 2>&1
  echo "mutant tree $n, $f (must fail): rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_$n.log" | tr '\n' ' ')"
done
echo "tested t=$(($(date +%s) - S))"
for r in $(seq 1 ${ROUNDS:-2}); do
  for row in $ROWS; do
    IFS=: read -r d causal l sp hk set <<< "$row"
    for n in $TREES; do
      timeout 30 build-ab-$n/bench/backward/bench_backward --b 1 --h 32 ${hk:+--hk $hk} ${set:+--set $set} --d $d --causal $causal --l $l \
        --sparsity $sp --iters 10 --kernel wgmma 2>&1 | grep -E '^wgmma' | sed "s/^/r$r $n${set:+-$set} d$d /"
    done
  done
done | awk '{print $1, $2, $3, $9, $7, $10, $11, $12, $13, $14}' | tee "$OUT/bench.txt"
echo "t=$(($(date +%s) - S))"
