#!/usr/bin/env bash
# One device call (2026-12-04): what the session's first call left open, then profiles.
#   1. build everything in build-device (Python off, CLI on); the seeded-split decode tests (the
#      model-shape test's call sequence now takes lambda from the data's curve) and the whole ctest;
#   2. compute-sanitizer racecheck on scripts/probes/racecheck_hist_handoff.cu (the skip_hist
#      hand-off alone) and memcheck on the decode sanitizer suite (the O / l epilogue);
#   3. the GPU mutant decode-epilogue-reciprocal (must be caught by SeededSplitSubnormalRowSum);
#   4. bench_backward --quick (the merged bwd-stack change);
#   5. ncu (--clock-control none): the d128 backward (dense, 8k full), the FP8 screen beside dense
#      and skip (dit 32k, 70 %), decode (both families) beside cuDNN at B = 8, 32k.
# Each step runs only while time is left (575 s in all). Logs packed into $OUT/logs.tgz.
# Carry .deps/cutlass, .deps/include, .deps/googletest. Pass BLASST_COMMIT=<hash>.
cd "$(dirname "$0")/.."
S=$(date +%s); B=build-device; L=/tmp/lp; rm -rf $L; mkdir -p $L
export BLASST_COMMIT=${BLASST_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t() { echo "t=$(($(date +%s) - S))"; }
left() { echo $((575 - ($(date +%s) - S))); }
pack() { tar czf "$OUT/logs.tgz" -C /tmp lp; }
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=OFF -DBLASST_BUILD_CLI=ON > $L/build.log 2>&1 &&
  cmake --build $B -j "$(nproc)" >> $L/build.log 2>&1
rc=$?; echo "build rc=$rc $(t)"
[ $rc -ne 0 ] && { grep -E "error|FAILED" $L/build.log | head -30; pack; exit 1; }
export BLASST_REQUIRE_GPU=1
timeout 60 $B/tests/gpu_decode/test_gpu_decode --gtest_filter='GpuDecode.SeededSplit*' > $L/seeded.log 2>&1
echo "seeded-split tests rc=$?: $(grep -E '^\[ +(OK|FAILED) +\]' $L/seeded.log | tr -s ' ' | tr '\n' ' ')"
timeout 120 ctest --test-dir $B -j 4 --timeout 100 > $L/ctest.log 2>&1
echo "ctest rc=$?: $(grep -E 'tests passed' $L/ctest.log) $(grep -E '\(Failed\)|\(Timeout\)' $L/ctest.log | tr '\n' ' ') $(t)"
nvcc -gencode=arch=compute_90a,code=sm_90a -O2 -o $L/probe scripts/probes/racecheck_hist_handoff.cu > $L/probe_build.log 2>&1 &&
  timeout 60 compute-sanitizer --tool racecheck $L/probe > $L/probe_racecheck.log 2>&1
echo "probe racecheck rc=$?:"; grep -vE '^\s*$' $L/probe_racecheck.log | grep -E 'variant|sum|ok|FAIL|SUMMARY|hazard' | head -12
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/gpu_decode/test_gpu_decode \
  --gtest_filter='GpuDecodeSanitizer.*:GpuDecode.SeededSplitSubnormalRowSum' > $L/memcheck_decode.log 2>&1
echo "memcheck decode rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck_decode.log) $(t)"
OUT=$L/mutants BUILD_DIR=$B BASELINE=0 START_BY_S=200 timeout 150 scripts/device_mutants.sh decode-epilogue-reciprocal > $L/mutants.log 2>&1
echo "mutant rc=$?: $(grep -E 'decode-epilogue' $L/mutants.log | tail -1) $(t)"
timeout 70 $B/bench/backward/bench_backward --quick --kernel wgmma > $L/bwd.txt 2>&1; tail -14 $L/bwd.txt; t
NCU="ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats"
R=$(left); [ $R -gt 100 ] && R=100
[ $R -gt 30 ] && timeout $R $NCU --section SourceCounters --kernel-name regex:'backward|bwd' --launch-skip 2 --launch-count 2 \
  $B/bench/backward/bench_backward --l 8192 --d 128 --causal 0 --sparsity 0 --iters 1 --kernel wgmma > $L/ncu_backward.txt 2>&1
echo "ncu backward rc=$? $(grep -E '^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput' $L/ncu_backward.txt | tr -s ' ' | head -8 | tr '\n' ';') $(t)"
R=$(left); [ $R -gt 120 ] && R=120
[ $R -gt 30 ] && timeout $R $NCU --kernel-name regex:'prefill|screen|quant' --launch-skip 0 --launch-count 6 \
  python3 bench/prefill/profile_screen.py $B/bench/prefill/libblasst_prefill_bench.so 32760 1 > $L/ncu_screen.txt 2>&1
echo "ncu screen rc=$? $(grep -E 'Duration' $L/ncu_screen.txt | tr -s ' ' | tr '\n' ';') $(t)"
R=$(left)
[ $R -gt 40 ] && OUT=$L/decode BUILD_DIR=$B timeout $R scripts/device_decode.sh profile > $L/decode_profile.txt 2>&1
echo "decode profile rc=$?"; grep -E '^ncu' $L/decode_profile.txt | cut -c1-400; t
pack
