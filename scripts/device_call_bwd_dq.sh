#!/usr/bin/env bash
# One device call for two pending backward patches (issue 14; scripts/probes/pending/README.md):
#   backward-dq-store-order.patch: the dQ shared stores in a lane-dependent order (2 wavefronts
#     per store instead of 4);
#   backward-dq64-sum.patch (on top of it): d = 64, the two warpgroups' partial dQ tiles summed in
#     shared memory before one reduce-add (half the L2 reduction traffic).
# Makes three trimmed backward trees here, .ab/b0 (this tree), .ab/dq (+ the first patch) and
# .ab/ds (+ both), kernel_table.inc cut to the backward lines so that they build side by side,
# then runs scripts/device_call_bwd_ab.sh on them: the whole backward suite and compute-sanitizer
# racecheck / memcheck on the patched trees, then bench_backward alternated over the three trees
# (2 rounds) on issue 14's shapes. Predicted: dQ right (the suites pass unchanged; racecheck may
# report the new arrive / sync hand-off at d = 64 as it reported such hand-offs before); dq over b0
# +3-8 % TFLOP/s at d128 and d64; ds over dq +5-12 % at d64 (ncu named L2 our d64 bottleneck),
# d128 unchanged (its SASS is the same). Carry .deps/cutlass .deps/include .deps/googletest; ~5 min.
cd "$(dirname "$0")/.."
P=$PWD/scripts/probes/pending/backward-dq-store-order.patch
P2=$PWD/scripts/probes/pending/backward-dq64-sum.patch
apply() {  # (git apply inside .ab/ would find this tree's repository and skip the paths)
  if command -v patch > /dev/null; then patch -p1 < "$1"; else GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply "$1"; fi
}
for n in b0 dq ds; do
  rm -rf .ab/$n && mkdir -p .ab/$n
  tar --exclude=./.ab --exclude='./build*' --exclude=./.deps --exclude=./.git -cf - . | tar -xf - -C .ab/$n
  grep -v -E '^BLASST_(PREFILL|DECODE)_KERNEL' src/cuda/sm90/kernel_table.inc > .ab/$n/src/cuda/sm90/kernel_table.inc
done
(cd .ab/dq && apply "$P") && (cd .ab/ds && apply "$P" && apply "$P2") &&
  grep -q dq_gray .ab/dq/src/cuda/sm90/backward/backward_wgmma_traits.hpp &&
  grep -q kBarDqPartials .ab/ds/src/cuda/sm90/backward/backward_wgmma_kernel.hpp || { echo "the patches do not apply"; exit 1; }
TREES="b0 dq ds" TEST_TREES="dq ds" \
  SHAPES="--d 128 --causal 0 --l 8192|--d 128 --causal 1 --l 8192|--d 128 --causal 1 --l 16384|--d 64 --causal 1 --l 16384|--d 64 --causal 0 --l 8192" \
  scripts/device_call_bwd_ab.sh
