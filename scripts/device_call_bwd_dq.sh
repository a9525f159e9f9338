#!/usr/bin/env bash
# One device call for scripts/probes/pending/backward-dq-store-order.patch (issue 14): the wgmma
# backward's dQ shared stores in a lane-dependent order (2 wavefronts per store instead of 4).
# Makes two trimmed backward trees here, .ab/b0 (this tree) and .ab/dq (this tree + the patch),
# kernel_table.inc cut to the backward lines so both build side by side, then runs
# scripts/device_call_bwd_ab.sh on them: the whole backward suite and compute-sanitizer racecheck /
# memcheck on the patched tree, then bench_backward alternated over both trees (2 rounds) on issue
# 14's shapes. Predicted: dQ right (the suite passes unchanged), +3-8 % backward TFLOP/s at d128
# and d64 (ncu: 67 M / 140 M shared-store conflicts, mio_throttle 13-30x cuDNN's).
# Carry .deps/cutlass .deps/include .deps/googletest; ~3-4 min.
cd "$(dirname "$0")/.."
P=$PWD/scripts/probes/pending/backward-dq-store-order.patch
for n in b0 dq; do
  rm -rf .ab/$n && mkdir -p .ab/$n
  tar --exclude=./.ab --exclude='./build*' --exclude=./.deps --exclude=./.git -cf - . | tar -xf - -C .ab/$n
  grep -v -E '^BLASST_(PREFILL|DECODE)_KERNEL' src/cuda/sm90/kernel_table.inc > .ab/$n/src/cuda/sm90/kernel_table.inc
done
# (git apply inside .ab/dq would find this tree's repository and skip the paths: patch, or a
# git apply that stops its search at .ab)
(cd .ab/dq && if command -v patch > /dev/null; then patch -p1 < "$P"; else GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply "$P"; fi) &&
  grep -q dq_gray .ab/dq/src/cuda/sm90/backward/backward_wgmma_traits.hpp || { echo "the patch does not apply"; exit 1; }
TREES="b0 dq" TEST_TREES="dq" \
  SHAPES="--d 128 --causal 0 --l 8192|--d 128 --causal 1 --l 8192|--d 128 --causal 1 --l 16384|--d 64 --causal 1 --l 16384|--d 64 --causal 0 --l 8192" \
  scripts/device_call_bwd_ab.sh
