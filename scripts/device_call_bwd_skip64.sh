#!/usr/bin/env bash
# One device call: the d = 64 skip backward before and after the 128-row steps (ab66790), on
# bench_backward's i.i.d. synthetic skip sets (the worst case for 128-row steps: a step runs when
# either of its two vote groups is kept; bench/results/backward_step_pairs_2026-12-06_cpu.md
# estimates 1.25-1.6x slower there and about even on the llm / dit workloads' sets). Trees in
# .ab/<name> trimmed to the backward instances, as for device_call_bwd_ab.sh:
#   for t in b0:427bb78 h:HEAD; do n=${t%%:*}; mkdir -p .ab/$n; git archive ${t#*:} | tar -x -C .ab/$n; done
#   (then keep only the BLASST_BACKWARD_KERNEL lines of .ab/*/src/cuda/sm90/kernel_table.inc)
# Carry .deps/cutlass .deps/include .deps/googletest .ab. Prints round, tree, mask, L, target,
# achieved, ms, TFLOP/s, speedup over the same tree's dense; TREES (default "b0 h").
cd "$(dirname "$0")/.."
S=$(date +%s); TREES=${TREES:-"b0 h"}
for n in $TREES; do
  ( cmake -S .ab/$n -B build-ab-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
      -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
    cmake --build build-ab-$n -j 8 --target bench_backward ) > /tmp/build_skip64_$n.log 2>&1 &
done
wait
echo "built t=$(($(date +%s) - S))"
for r in 1 2; do
  for shape in "--causal 0 --l 8192" "--causal 1 --l 16384"; do
    for sp in 0 0.5 0.7 0.9; do
      for n in $TREES; do
        timeout 30 build-ab-$n/bench/backward/bench_backward --b 1 --h 32 --d 64 $shape --sparsity $sp --iters 10 \
          --kernel wgmma 2>&1 | grep -E '^wgmma' | sed "s/^/r$r $n /"
      done
    done
  done
done | awk '{print $1, $2, $8, $6, $9, $10, $11, $12, $13}'
echo "t=$(($(date +%s) - S))"
