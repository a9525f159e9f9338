#!/usr/bin/env bash
# One device call, right after scripts/device_session.sh on the same warm machine (it reuses that
# call's build-device; without it this tree's bench libraries are built here too):
#   1. before / after of the prefill and decode kernels against a baseline tree in .baseline/
#      (`git archive <rev> | tar -x -C .baseline`, carried): scripts/device_ab.sh, --rounds 3;
#   2. with the time left, ncu of issue 14's two backward shapes beside cuDNN's backward kernels
#      (scripts/device_call_ncu.sh WHAT=bwdfull on build-device's bench_backward).
# Carry .deps/cutlass .deps/include .deps/googletest .baseline. Logs in $OUT (ab_compare.md,
# ab_compare.json, ncu.tgz); the short tables on stdout.
cd "$(dirname "$0")/.."
S=$(date +%s)
export OUT=${OUT:-/tmp/vote_ab}; mkdir -p "$OUT"
if [ -e build-device/bench/prefill/libblasst_prefill_bench.so ] && [ -e build-device/bench/decode/libblasst_decode_bench.so ]; then
  export NEW_BUILD=build-device
fi
AB_OLD=${AB_OLD:-baseline} AB_NEW=${BLASST_COMMIT:-unknown} AB_TIMEOUT_S=${AB_TIMEOUT_S:-260} \
  scripts/device_ab.sh .baseline --rounds 3
grep -E "^prefill|skip0|skip50|skip70|dense " "$OUT/ab_compare.md" 2>/dev/null | head -40
echo "ab t=$(($(date +%s) - S))"
R=$((560 - ($(date +%s) - S)))
if [ $R -gt 120 ] && [ -x build-device/bench/backward/bench_backward ]; then
  NO_BUILD=1 BUILD_DIR=build-device WHAT=bwdfull LIMIT_S=$R scripts/device_call_ncu.sh 2>&1 | tail -8
fi
echo "done t=$(($(date +%s) - S))"
