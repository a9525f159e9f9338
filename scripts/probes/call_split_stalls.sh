#!/usr/bin/env bash
# One device call (issue 14, 2026-12-07): where the work list's split parts stall. call_split_cost.sh
# (H200, 20:19) found the parts' extra SM time in long-scoreboard stalls (heavy 70 %: ws 2.59 per
# issue against pt 1.70 and ns 1.78; instructions within 2.4 %), and neither the parts' rotation nor
# the dQ head padding changed it. Here: trees ws (main) and ns (main, split_cap 0) of .ab
# (scripts/probes/prep_split_cost.sh) and s3 = main + pending/backward-three-stages.patch (Q / dO
# three stages deep at d = 128: if the parts wait on their loads, a deeper pipeline hides it;
# 3 stages gave dense nothing within noise, 2026-12-0x), built with -lineinfo; s3's
# test_gpu_backward first; bench rows of the llm shape at
# sparsity 0 / 0.5 / 0.7 / 0.9 (heavy, iid) for the skip-over-dense ratios on this card; then ncu
# SourceCounters + WarpStateStats of the main kernel (heavy 70 %) per tree, exported to
# $OUT/src_<tree>.ncu-rep (read locally: scripts/ncurep_dump.py --outdir D --sass).
# Carry .deps/cutlass .deps/include .deps/googletest .ab.
cd "$(dirname "$0")/../.."
S=$(date +%s); OUT=${OUT:-/tmp/split_stalls}; mkdir -p "$OUT"; W=/tmp/ss; rm -rf $W; mkdir -p $W
TREES=${TREES:-"ws ns s3"}
TEST_TREES=${TEST_TREES:-"s3"}
NCU_TREES=${NCU_TREES:-"ws ns"}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for n in $TREES; do
  ( cmake -S .ab/$n -B build-ab-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
      -DBLASST_BUILD_TESTS=$(case " $TEST_TREES " in *" $n "*) echo ON;; *) echo OFF;; esac) -DCMAKE_CUDA_FLAGS=-lineinfo -DBLASST_DEPS_DIR="$PWD/.deps" \
      -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
    cmake --build build-ab-$n -j 6 --target bench_backward $(case " $TEST_TREES " in *" $n "*) echo test_gpu_backward;; esac) ) > $W/build_$n.log 2>&1 &
done
wait
echo "built t=$(($(date +%s) - S))"; for n in $TREES; do tail -1 $W/build_$n.log; done
args() { echo "--b 1 --h 32 --hk 8 --d 128 --causal 1 --l 8192 --kernel wgmma --set $1 --sparsity $2"; }
for row in ${ROWS:-heavy:0.7 iid:0.9 iid:0 heavy:0.5 heavy:0.9 iid:0.5 iid:0.7}; do
  [ $(($(date +%s) - S)) -gt $((${LIMIT_S:-560} - 120)) ] && { echo "no time left for $row"; continue; }
  IFS=: read -r set sp <<< "$row"; for n in $TREES; do
  timeout 30 build-ab-$n/bench/backward/bench_backward $(args $set $sp) --iters 10 2>&1 | grep -E '^wgmma' | awk -v p="$n $set" '{print p, $7, $8, $9, $10}'
done; done | tee $OUT/rows.txt
echo "rows t=$(($(date +%s) - S))"
for n in $TEST_TREES; do
  BLASST_REQUIRE_GPU=1 timeout 120 build-ab-$n/tests/gpu_backward/test_gpu_backward > $W/test_$n.log 2>&1
  echo "$n test_gpu_backward rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $W/test_$n.log | tr '\n' ' ')"; grep -E '^\[  FAILED' $W/test_$n.log | head -5
done
for n in $NCU_TREES; do
  [ $(($(date +%s) - S)) -gt $((${LIMIT_S:-560} - 90)) ] && { echo "no time left for ncu $n"; continue; }
  timeout 150 ncu --clock-control none --kernel-name regex:backward_wgmma --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SchedulerStats --import-source no \
    --export $OUT/src_$n --force-overwrite build-ab-$n/bench/backward/bench_backward $(args heavy 0.7) --iters 1 > $W/ncu_$n.txt 2>&1
  echo "ncu $n rc=$? $(ls -la $OUT/src_$n.ncu-rep 2>/dev/null | awk '{print $5}') t=$(($(date +%s) - S))"
  # a fallback if the report is over what comes back: the SASS source page as csv (stall columns per PC)
  timeout 60 ncu --import $OUT/src_$n.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $OUT/src_${n}_sass.csv.gz
done
(cd /tmp && tar czf $OUT/logs.tgz ss); echo "done t=$(($(date +%s) - S))"
