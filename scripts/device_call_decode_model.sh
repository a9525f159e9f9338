#!/usr/bin/env bash
# One device call (2026-12-04): the decode NaN fix (df1cdee) and the trained-model benchmark in one
# build. Builds everything (Python and CLI on) in build-device, runs the two seeded-split decode
# tests first and the whole decode suite, then bench/model/run_device.sh on that build (same recipe
# and budgets as the 9167d4d run). The checkpoint stays in .ckpt/device (ignored) on the machine for
# a follow-up call while it is warm, and comes back in $OUT. ~8-9 min.
# Carry .deps/cutlass, .deps/include, .deps/googletest. The machine's copy has no .git:
# pass BLASST_COMMIT=<hash>.
cd "$(dirname "$0")/.."
S=$(date +%s); B=build-device; L=/tmp/ld; rm -rf $L; mkdir -p $L
export BLASST_COMMIT=${BLASST_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=ON -DBLASST_BUILD_CLI=ON \
  -DPython_EXECUTABLE="$(command -v python3)" > $L/build.log 2>&1 &&
  cmake --build $B -j "$(nproc)" >> $L/build.log 2>&1
rc=$?; echo "build rc=$rc t=$(($(date +%s) - S))"
[ $rc -ne 0 ] && { grep -E "error|FAILED" $L/build.log | head -30; exit 1; }
export BLASST_REQUIRE_GPU=1
timeout 60 $B/tests/gpu_decode/test_gpu_decode --gtest_filter='GpuDecode.SeededSplit*' > $L/seeded.log 2>&1
echo "seeded-split tests rc=$?: $(grep -E '^\[ +(OK|FAILED) +\]' $L/seeded.log | tr -s ' ' | tr '\n' ' ')"
timeout 90 $B/tests/gpu_decode/test_gpu_decode --gtest_brief=1 > $L/decode.log 2>&1
echo "decode suite rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' $L/decode.log | tr '\n' ' ') t=$(($(date +%s) - S))"
R=$((575 - ($(date +%s) - S)))
mkdir -p "$OUT/model"
OUT=$OUT/model BUILD_DIR=$B TRAIN_S=230 EVAL_S=150 TOTAL_TIMEOUT_S=$((R - 15)) RECIPE_ARGS= \
  bench/model/run_device.sh > $L/model.txt 2>&1
echo "model rc=$? t=$(($(date +%s) - S))"
mkdir -p .ckpt/device && cp "$OUT"/model/ckpt_*.pt .ckpt/device/ 2>/dev/null
tar xzf "$OUT/model/misc.tar.gz" -C .ckpt/device tokenizer.json 2>/dev/null; cp "$OUT/model/results.json" .ckpt/device/ 2>/dev/null
grep -E "decode|NaN|nan" $L/model.txt | head -20; tail -30 $L/model.txt
tar czf "$OUT/logs.tgz" -C /tmp ld
