#!/usr/bin/env bash
# Everything the decode kernel needs from the GPU machine, in one call:
#   configure + build (test_gpu_decode, blasst_decode_bench), GPU tests, compute-sanitizer
#   (memcheck, racecheck) on a small case, the benchmark; logs under $OUT, a short table last.
# Usage: [BLASST_COMMIT=abc123] scripts/device_decode.sh [all|test|bench|quick|profile|trace]
#   trace: per-CTA timeline of the seed prologue (bench/decode/trace_decode.py; builds with the CMake
#   option BLASST_DECODE_TRACE=ON into its own folder).
#   profile (~1-2 min after the build): ncu (--clock-control none) on one dense call at B = 8, 32k,
#   32/8 and one at B = 1 (speed of light, memory workload, warp states, scheduler, occupancy);
#   reports as text under $OUT.
#   all: tests (both load paths) + sanitizer + full benchmark; test: no benchmark;
#   bench: benchmark only; quick (~80 s after the build): GPU tests without sanitizer (tensor-map
#   loads, a subset with cp.async loads) and a 3-shape benchmark (both visit orders) beside cuDNN. Sharing BUILD_DIR with scripts/device_prefill.sh avoids building the library twice.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
MODE=${1:-all}
DEFAULT_BUDGET=340
[ "$MODE" = quick ] && DEFAULT_BUDGET=100
# all/test/bench: the whole script; quick: what follows the build. The benchmark gets what is left.
BUDGET=${DECODE_BUDGET_S:-$DEFAULT_BUDGET}
OUT=${OUT:-/tmp/blasst_decode_out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-device-decode}
JOBS=${BUILD_JOBS:-16}
# Never use NVLink multicast on shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1

# A GPU test that finds no GPU fails here instead of skipping (tests/gpu_common.hpp).
export BLASST_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
t0=$(date +%s)
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF &&
       cmake --build "$BUILD" --target test_gpu_decode blasst_decode_bench blasst_decode_profile -j "$JOBS"; } > "$OUT/build.log" 2>&1; then
  grep -E "error|Error" "$OUT/build.log" | head -30
  echo "BUILD FAILED (log: build.log)"
  exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
[ "$MODE" = quick ] && START=$(date +%s)

rc=0
if [ "$MODE" = trace ]; then
  # Per-CTA timeline of natural vs seeded splits (bench/decode/trace_decode.py): a trace build.
  TB="$BUILD-trace"
  cmake -S . -B "$TB" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
    -DBLASST_BUILD_TESTS=OFF -DBLASST_DECODE_TRACE=ON >> "$OUT/build.log" 2>&1 &&
    cmake --build "$TB" --target blasst_decode_bench -j "$JOBS" >> "$OUT/build.log" 2>&1 || { echo "trace build failed"; exit 1; }
  timeout 240 python3 bench/decode/trace_decode.py "$TB/bench/decode/libblasst_decode_bench.so" "$OUT" > "$OUT/trace.log" 2>&1
  echo "trace: rc=$?"; cat "$OUT/decode_trace.md" 2>/dev/null || tail -20 "$OUT/trace.log"
  exit 0
fi
if [ "$MODE" = profile ]; then
  P="$BUILD/bench/decode/blasst_decode_profile"
  for cfg in "8 32768 32 8" "1 32768 32 8"; do
    tag=$(echo "$cfg" | tr ' ' '_')
    "$P" $cfg 0 20 | tee -a "$OUT/profile_timing.txt"
    timeout 240 ncu --clock-control none --kernel-name regex:decode_kernel --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section SchedulerStats --section Occupancy --section LaunchStats \
      "$P" $cfg 0 1 > "$OUT/ncu_$tag.txt" 2>&1
    echo "ncu $cfg: rc=$? ($(grep -E 'DRAM Throughput|Memory Throughput|Duration' "$OUT/ncu_$tag.txt" | head -3 | tr -s ' ' | tr '\n' ';'))"
  done
  # The peer on the same shape (cuDNN SDPA through torch): what its kernels reach and how they launch.
  timeout 240 ncu --clock-control none --kernel-name regex:'sdpa|fmha|attn|Attn|flash|Flash|cudnn|Sdpa|Fmha' \
    --launch-skip 0 --launch-count 3 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats \
    python3 bench/decode/profile_peer.py 8 32768 32 8 2 > "$OUT/ncu_cudnn_8_32768_32_8.txt" 2>&1
  echo "ncu cuDNN 8 32768 32 8: rc=$? ($(grep -E 'DRAM Throughput|Duration|Grid Size|Block Size' "$OUT/ncu_cudnn_8_32768_32_8.txt" | tr -s ' ' | tr '\n' ';'))"
  exit 0
fi
if [ "$MODE" != bench ]; then
  t0=$(date +%s)
  timeout ${TEST_TIMEOUT_S:-100} "$BUILD/tests/gpu_decode/test_gpu_decode" --gtest_brief=1 > "$OUT/tests.log" 2>&1
  trc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED|Failure|error" "$OUT/tests.log" | head -40
  echo "gpu tests: rc=$trc ($(( $(date +%s) - t0 )) s)"
  [ $trc -ne 0 ] && rc=1
  # The cp.async load path (fallback for layouts a tensor map cannot describe) must stay correct
  # too. quick: a subset (the full binary above runs the default tensor-map loads).
  if [ "$MODE" = quick ]; then
    VARIANTS="cpasync"
    FILTER="--gtest_filter=GpuDecode.DenseMixedBatchAndForcedSplits:GpuDecode.PagedEveryPageSize:GpuDecode.SeededSplitsMatchReference"
  else
    VARIANTS="cpasync"
    FILTER=""
  fi
  for loads in $VARIANTS; do
    t0=$(date +%s)
    BLASST_TEST_DECODE_LOADS=$loads timeout ${TEST_TIMEOUT_S:-100} \
      "$BUILD/tests/gpu_decode/test_gpu_decode" --gtest_brief=1 $FILTER >> "$OUT/tests.log" 2>&1
    trc=$?
    echo "gpu tests (BLASST_TEST_DECODE_LOADS=$loads): rc=$trc ($(( $(date +%s) - t0 )) s)"
    [ $trc -ne 0 ] && rc=1
  done
  # The 4-warp instances (two CTAs per SM) for every call they can serve (the library picks them
  # for large grids only, which the suite's small cases are not).
  t0=$(date +%s)
  BLASST_TEST_DECODE_WARPS=4 timeout ${TEST_TIMEOUT_S:-100} \
    "$BUILD/tests/gpu_decode/test_gpu_decode" --gtest_brief=1 $FILTER >> "$OUT/tests.log" 2>&1
  trc=$?
  echo "gpu tests (BLASST_TEST_DECODE_WARPS=4): rc=$trc ($(( $(date +%s) - t0 )) s)"
  [ $trc -ne 0 ] && rc=1
  grep -E "^\[  FAILED  \] [A-Za-z]" "$OUT/tests.log" | sort -u | head -20
  # SANITIZE=1 adds the sanitizer runs to quick mode.
  { [ "$MODE" != quick ] || [ "${SANITIZE:-0}" = 1 ]; } && for tool in memcheck racecheck; do
    t0=$(date +%s)
    timeout ${SAN_TIMEOUT_S:-45} compute-sanitizer --tool $tool --error-exitcode 9 \
      "$BUILD/tests/gpu_decode/test_gpu_decode" --gtest_filter='GpuDecodeSanitizer.*' > "$OUT/sanitizer_$tool.log" 2>&1
    src=$?
    echo "compute-sanitizer $tool: rc=$src ($(( $(date +%s) - t0 )) s); $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | head -2 | tr '\n' ' ')"
    [ $src -ne 0 ] && rc=1
  done
fi

if [ "$MODE" != test ]; then
  QUICK=""
  [ "$MODE" = quick ] && QUICK="--quick"
  left=$(( BUDGET - ($(date +%s) - START) ))
  MIN_BENCH=30
  [ "$MODE" = quick ] && MIN_BENCH=60  # the measurement is the point of a quick run
  [ $left -lt $MIN_BENCH ] && left=$MIN_BENCH
  echo "benchmark: ${left} s left"
  BLASST_COMMIT=${BLASST_COMMIT:-unknown} timeout $left python3 bench/decode/bench_decode.py \
    "$BUILD/bench/decode/libblasst_decode_bench.so" "$OUT" $QUICK > "$OUT/bench.log" 2>&1
  brc=$?
  [ $brc -ne 0 ] && { tail -20 "$OUT/bench.log"; rc=1; }
  [ -f "$OUT/decode_bench.md" ] && cat "$OUT/decode_bench.md"
fi
exit $rc
