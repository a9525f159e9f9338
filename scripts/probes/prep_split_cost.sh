#!/usr/bin/env bash
# Local (not on the device): the trees of scripts/probes/call_split_stalls.sh (and call_split_cost.sh) in .ab, each trimmed to
# the backward instances (kernel_table.inc keeps its comments and BLASST_BACKWARD_KERNEL lines;
# results and docs dropped to keep the carry small):
#   pt = 39e1d43 (the fixed order, key block 0 first), ws = main (the work list),
#   ns = main with split_cap 0 (heavy blocks whole, first),
#   (pd = + backward-dq-head-pad.patch and rt = + backward-part-rotation.patch ran on 2026-12-07 20:19
#   and were refuted; the patches are in git history at a7e8b83, scripts/probes/pending/),
#   s3 = main + pending/backward-three-stages.patch (Q / dO three stages deep at d = 128; kept words 128).
set -euo pipefail
cd "$(dirname "$0")/../.."
trim() {
  (cd ".ab/$1" && rm -rf bench/results docs &&
    grep -E '^(//|BLASST_BACKWARD_KERNEL)' src/cuda/sm90/kernel_table.inc > .kt && mv .kt src/cuda/sm90/kernel_table.inc)
}
for t in pt:39e1d43 ws:main ns:main s3:main; do
  n=${t%%:*}; rm -rf ".ab/$n"; mkdir -p ".ab/$n"; git archive "${t#*:}" | tar -x -C ".ab/$n"
done
sed -i 's|    pl.split_cap = sm90::backward::split_capacity(batch, hk, group, nb, static_cast<int>(r.d));|    pl.split_cap = 0;  // PROBE: heavy blocks whole|' .ab/ns/src/cuda/sm90/backward/backward_api.cu
grep -q "PROBE: heavy blocks whole" .ab/ns/src/cuda/sm90/backward/backward_api.cu
(cd .ab/s3 && patch -p1 -s < ../../scripts/probes/pending/backward-three-stages.patch)
for n in pt ws ns s3; do trim $n; done
# pt, ws and ns only bench (bench_backward --kernel wgmma, bf16, d = 128): that instance alone builds in a
# third of the time; s3 keeps every instance for its test_gpu_backward.
for n in pt ws ns; do sed -i '/^BLASST_BACKWARD_KERNEL(\(f16\|bf16, 64\|bf16, 128, mma_sync\)/d' .ab/$n/src/cuda/sm90/kernel_table.inc; done
du -sh .ab
