#!/usr/bin/env bash
# One device call (2026-12-04 p.m.): the backward's causal launch order (longest key blocks first,
# BackwardScheduler) against the tree it changes, plus what the morning's calls left unrecorded.
#   1. build the backward test and benchmark of this tree (build-device) and the benchmark of the
#      baseline tree in .ab/base (git archive of the commit before the change; carried) side by side;
#   2. test_gpu_backward (the whole binary: causal, ragged, GQA, unequal lengths, skip sets);
#   3. A/B: bench_backward base / new alternated, 2 rounds, B 1, H 32: d128 causal 8k and 16k
#      (dense and 70 %), d128 full 8k (dense: the order is unchanged there, a noise check), d64
#      causal 8k;
#   4. racecheck on each variant of scripts/probes/racecheck_hist_handoff.cu;
#   5. the GPU mutant decode-epilogue-reciprocal (baseline run first, then the mutant);
#   6. ncu of the new d128 causal 8k backward: stall reasons per SASS instruction (source page, csv).
# Each step only while time is left (575 s). Logs in $OUT/logs.tgz, the SASS table in $OUT.
# Carry .deps/cutlass .deps/include .deps/googletest .ab/base. Pass BLASST_COMMIT=<hash>.
cd "$(dirname "$0")/.."
S=$(date +%s); B=build-device; L=/tmp/lb; rm -rf $L; mkdir -p $L
export BLASST_COMMIT=${BLASST_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
t() { echo "t=$(($(date +%s) - S))"; }
left() { echo $((575 - ($(date +%s) - S))); }
pack() { tar czf "$OUT/logs.tgz" -C /tmp lb; }
CFG="-G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=OFF -DBLASST_BUILD_CLI=OFF"
( cmake -S . -B $B $CFG && cmake --build $B -j 10 --target test_gpu_backward bench_backward test_gpu_decode ) > $L/build.log 2>&1 &
NEW=$!
( cmake -S .ab/base -B build-ab-base $CFG -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
  cmake --build build-ab-base -j 6 --target bench_backward ) > $L/build_base.log 2>&1 &
BASE=$!
nvcc -gencode=arch=compute_90a,code=sm_90a -O2 -o $L/probe scripts/probes/racecheck_hist_handoff.cu > $L/probe_build.log 2>&1
wait $NEW; rc=$?; wait $BASE; rcb=$?
echo "build rc=$rc base rc=$rcb $(t)"
[ $rc -ne 0 ] && { grep -E "error|FAILED" $L/build.log | head -30; pack; exit 1; }
export BLASST_REQUIRE_GPU=1
timeout 120 $B/tests/gpu_backward/test_gpu_backward --gtest_brief=1 > $L/bwd_tests.log 2>&1
echo "test_gpu_backward rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' $L/bwd_tests.log | tr '\n' ' ') $(grep -E '^\[  FAILED  \] Gpu' $L/bwd_tests.log | tr '\n' ' ') $(t)"
if [ $rcb -eq 0 ]; then
  for r in 1 2; do
    for entry in "--d 128 --causal 1 --l 8192|0 0.7" "--d 128 --causal 1 --l 16384|0 0.7" \
                 "--d 128 --causal 0 --l 8192|0" "--d 64 --causal 1 --l 8192|0"; do
      shape=${entry%%|*}
      for s in ${entry#*|}; do
        for tree in base new; do
          [ $tree = base ] && X=build-ab-base/bench/backward/bench_backward || X=$B/bench/backward/bench_backward
          timeout 60 $X --b 1 --h 32 $shape --sparsity $s --iters 20 --kernel wgmma 2>&1 | grep -E '^wgmma' |
            sed "s/^/r$r $tree /" >> $L/ab.txt
        done
      done
    done
  done
  echo "A/B (round tree L d mask target ms TFLOP/s):"; awk '{print $1, $2, $6, $7, $8, $9, $11, $12}' $L/ab.txt
else grep -E "error|FAILED" $L/build_base.log | head -10; fi
t
for v in 0 1 2 3 4; do
  timeout 40 compute-sanitizer --tool racecheck $L/probe $v > $L/probe_racecheck_$v.log 2>&1
  echo "probe variant $v rc=$?: $(grep -E 'variant|sums' $L/probe_racecheck_$v.log | tail -2 | tr '\n' ' ') $(grep -E 'RACECHECK SUMMARY' $L/probe_racecheck_$v.log)"
done
grep -m3 -A6 -E 'Race reported|Error: Race' $L/probe_racecheck_1.log
t
R=$(left); [ $R -gt 170 ] && R=170
[ $R -gt 60 ] && OUT=$L/mutants BUILD_DIR=$B START_BY_S=$((R - 60)) TEST_TIMEOUT=60 timeout $R \
  scripts/device_mutants.sh decode-epilogue-reciprocal > $L/mutants.log 2>&1
echo "mutant rc=$?:"; grep -E 'decode-epilogue|baseline' $L/mutants.log | tail -3; t
R=$(left); [ $R -gt 120 ] && R=120
if [ $R -gt 40 ]; then
  timeout $R ncu --clock-control none --section WarpStateStats --section SourceCounters --section SpeedOfLight \
    --kernel-name regex:'backward_wgmma|bwd' --launch-skip 3 --launch-count 1 -o $L/bwd_causal -f \
    $B/bench/backward/bench_backward --b 1 --h 32 --l 8192 --d 128 --causal 1 --sparsity 0 --iters 1 --kernel wgmma > $L/ncu_run.txt 2>&1
  echo "ncu rc=$? $(t)"
  ncu -i $L/bwd_causal.ncu-rep --page details > $L/ncu_bwd_details.txt 2>&1
  grep -E 'Duration|Compute \(SM\) Throughput|Warp Cycles Per Issued|Issued Warp' $L/ncu_bwd_details.txt | tr -s ' ' | head -6
  ncu -i $L/bwd_causal.ncu-rep --page source --csv --print-source sass > $OUT/bwd_causal_sass.csv 2> $L/ncu_source.err
  echo "sass table: $(wc -l < $OUT/bwd_causal_sass.csv) lines; $(head -c 300 $L/ncu_source.err)"
fi
pack; t
