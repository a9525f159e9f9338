#!/usr/bin/env bash
# One device call (issue 14, 2026-12-07): why the work list's split parts cost more than modelled.
# The heavy set's profile (call_plan_peers.sh, H100 17:31) refuted the L2 guess: the main kernel
# read as many DRAM bytes as 39e1d43's (1.33 vs 1.35 GB, L2 hit 55 %) but its SMs were active
# 1.87M cycles on average against 1.47M (27 % more SM time for the same kept work). Trees in .ab,
# trimmed to the backward instances: pt = 39e1d43 (fixed order, key block 0 first), ws = main (the
# list), ns = main with split_cap 0 (heavy blocks whole, first), pd = main with the dQ accumulator's
# heads one 64-row block more apart (pending/backward-dq-head-pad.patch: lockstep parts of many heads
# add into the same row block of each head, 4 MB apart at 8k), rt = main with the parts' walks rotated
# (pending/backward-part-rotation.patch: no lockstep at all); scripts/probes/prep_split_cost.sh
# makes them. TEST_TREES (default "pd rt"): their test_gpu_backward runs too. Prints bench rows, then per tree
# the main kernel's duration, SM active cycles, instructions, atomics and warp stall reasons on the
# heavy set at 70 % and the iid set at 90 %; the raw csv files in $OUT/ncu.tgz.
# Carry .deps/cutlass .deps/include .deps/googletest .ab. Ran on 2026-12-07 20:19 (H200, bench/RESULTS.md: pd and rt refuted);
# prep_split_cost.sh no longer makes pd / rt (TREES="pt ws ns" for a rerun).
cd "$(dirname "$0")/../.."
S=$(date +%s); OUT=${OUT:-/tmp/split_cost}; mkdir -p "$OUT"; W=/tmp/sc; rm -rf $W; mkdir -p $W
TREES=${TREES:-"pt ws ns pd rt"}
TEST_TREES=${TEST_TREES:-"pd rt"}
for n in $TREES; do
  case " $TEST_TREES " in *" $n "*) tests=ON; targets="bench_backward test_gpu_backward test_wgmma_layouts" ;; *) tests=OFF; targets=bench_backward ;; esac
  ( cmake -S .ab/$n -B build-ab-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
      -DBLASST_BUILD_TESTS=$tests -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
    cmake --build build-ab-$n -j 4 --target $targets ) > $W/build_$n.log 2>&1 &
done
wait
echo "built t=$(($(date +%s) - S))"; for n in $TREES; do tail -1 $W/build_$n.log; done
for n in $TEST_TREES; do
  T=$(find build-ab-$n -name test_gpu_backward -type f | head -1)
  BLASST_REQUIRE_GPU=1 timeout 120 $T > $W/test_$n.log 2>&1
  echo "$n test_gpu_backward rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $W/test_$n.log | tr '\n' ' ')"; grep -E '^\[  FAILED' $W/test_$n.log | head -5
  T=$(find build-ab-$n -name test_wgmma_layouts -type f | head -1)
  BLASST_REQUIRE_GPU=1 timeout 60 $T > $W/layouts_$n.log 2>&1
  echo "$n test_wgmma_layouts rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $W/layouts_$n.log | tr '\n' ' ')"
done
args() { echo "--b 1 --h 32 --hk 8 --d 128 --causal 1 --l 8192 --kernel wgmma --set $1 --sparsity $2"; }
for r in 1; do for row in heavy:0.7 iid:0.9; do IFS=: read -r set sp <<< "$row"; for n in $TREES; do
  timeout 30 build-ab-$n/bench/backward/bench_backward $(args $set $sp) --iters 10 2>&1 | grep -E '^wgmma' | awk -v p="r$r $n $set" '{print p, $7, $8, $9, $10}'
done; done; done | tee $OUT/rows.txt
echo "rows t=$(($(date +%s) - S))"
M=gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_active.max,smsp__inst_executed.sum,smsp__cycles_active.avg,lts__t_sectors_op_red.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,gpc__cycles_elapsed.avg.per_second,sm__warps_active.avg.pct_of_peak_sustained_active
for row in heavy:0.7 iid:0.9; do IFS=: read -r set sp <<< "$row"; for n in $TREES; do
  [ $(($(date +%s) - S)) -gt 520 ] && { echo "no time left for ncu $n $set"; continue; }
  timeout 60 ncu --clock-control none --kernel-name regex:backward_wgmma --launch-skip 2 --launch-count 1 --section WarpStateStats \
    --metrics $M --csv --page raw build-ab-$n/bench/backward/bench_backward $(args $set $sp) --iters 1 > $W/ncu_${n}_$set$sp.csv 2>&1
  echo "$n $set $sp rc=$?"
done; done
M=$M python3 - $W $TREES <<'PY'
import csv, glob, sys, os
w, trees = sys.argv[1], sys.argv[2:]
want = set(os.environ['M'].split(','))
def load(f):
    rows = [r for r in csv.reader(l for l in open(f) if l.startswith('"')) if len(r) > 5]
    return dict(zip(rows[0], rows[2])) if len(rows) > 2 else {}
for case in ("heavy0.7", "iid0.9"):
    data = {n: load(f"{w}/ncu_{n}_{case}.csv") for n in trees}
    keys = [k for k in next(iter(data.values())) if "__" in k]
    print(f"== {case}: " + " | ".join(trees))
    for k in keys:
        vals = [data[n].get(k, "?") for n in trees]
        try:
            nums = [float(v.replace(",", "")) for v in vals]
        except ValueError:
            continue
        if max(nums) == 0 or not (k in want or ("stalled" in k and k.endswith("per_issue_active.ratio"))):
            continue
        name = k.replace("smsp__average_warps_issue_stalled_", "stall ").replace("_per_issue_active.ratio", "")
        print(f"  {name[:48]:48s} " + " ".join(f"{x:12.4g}" for x in nums))
PY
(cd /tmp && tar czf $OUT/ncu.tgz sc); echo "done t=$(($(date +%s) - S))"
