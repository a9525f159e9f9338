#!/usr/bin/env bash
# Local (not on the device): the trees of scripts/probes/call_descending_walk.sh in .ab, trimmed as in
# prep_split_cost.sh: ws = main (bench only: the bf16 d = 128 wgmma instance), rv = main +
# scripts/probes/pending/backward-descending-walk.patch (every instance: its tests).
set -euo pipefail
cd "$(dirname "$0")/../.."
trim() { (cd ".ab/$1" && rm -rf bench/results docs &&
    grep -E '^(//|BLASST_BACKWARD_KERNEL)' src/cuda/sm90/kernel_table.inc > .kt && mv .kt src/cuda/sm90/kernel_table.inc) }
rm -rf .ab; mkdir -p .ab/ws .ab/rv
git archive main | tar -x -C .ab/ws
git archive main | tar -x -C .ab/rv
(cd .ab/rv && patch -p1 -s < ../../scripts/probes/pending/backward-descending-walk.patch)
grep -q "w.descending = true" .ab/rv/src/cuda/sm90/backward/backward_wgmma_kernel.hpp
trim ws; trim rv
sed -i '/^BLASST_BACKWARD_KERNEL(\(f16\|bf16, 64\|bf16, 128, mma_sync\)/d' .ab/ws/src/cuda/sm90/kernel_table.inc
du -sh .ab
