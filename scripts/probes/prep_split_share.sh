#!/usr/bin/env bash
# Local (not on the device): the trees of scripts/probes/call_split_share.sh in .ab, trimmed as in
# prep_split_cost.sh: ws = main, a1 = branch split-share (the share rule at 1, every instance: its
# tests), a05 / a2 = the rule at 1/2 and 2 (bench only: the bf16 d = 128 wgmma instance). The
# branch lives only in the session of 2026-12-07 23:06 (its commit is on main if it landed).
set -euo pipefail
cd "$(dirname "$0")/../.."
trim() { (cd ".ab/$1" && rm -rf bench/results docs &&
    grep -E '^(//|BLASST_BACKWARD_KERNEL)' src/cuda/sm90/kernel_table.inc > .kt && mv .kt src/cuda/sm90/kernel_table.inc) }
rm -rf .ab; mkdir -p .ab
for t in ws:main a1:split-share a05:split-share a2:split-share; do
  n=${t%%:*}; mkdir -p ".ab/$n"; git archive "${t#*:}" | tar -x -C ".ab/$n"; trim $n
done
sed -i 's/kSplitShareNum = 1, kSplitShareDen = 1;/kSplitShareNum = 1, kSplitShareDen = 2;/' .ab/a05/src/cuda/sm90/backward/backward_params.hpp
sed -i 's/kSplitShareNum = 1, kSplitShareDen = 1;/kSplitShareNum = 2, kSplitShareDen = 1;/' .ab/a2/src/cuda/sm90/backward/backward_params.hpp
grep -q "kSplitShareDen = 2" .ab/a05/src/cuda/sm90/backward/backward_params.hpp
grep -q "kSplitShareNum = 2" .ab/a2/src/cuda/sm90/backward/backward_params.hpp
for n in ws a05 a2; do sed -i '/^BLASST_BACKWARD_KERNEL(\(f16\|bf16, 64\|bf16, 128, mma_sync\)/d' .ab/$n/src/cuda/sm90/kernel_table.inc; done
du -sh .ab
