#!/usr/bin/env bash
# One device call for issue 18 on the machine at hand (its targets are stated on the H200):
# 1. one build (Python on): the package, the decode bench library, blasst_host_costs;
# 2. bench/decode/bench_decode.py --quick (B 1 / 8 / 64 at 32k, dense and skip 50 / 70 % beside cuDNN);
# 3. bench/decode/bench_eager.py (host overhead per call; decode eager and as CUDA graphs at
#    B 1 / 8 / 64, kv 8k / 32k / 128k beside SDPA cuDNN and flash; QUICK=1: its 3-shape table);
# 4. blasst_host_costs (the C++ call's pieces).
# Pass BLASST_COMMIT=<hash> (the device's copy has no git). Carry .deps/cutlass .deps/include .deps/googletest.
cd "$(dirname "$0")/.."
S=$(date +%s); OUT=${OUT:-/tmp/decode_h200}; mkdir -p "$OUT"; B=${BUILD_DIR:-build-peers}
LIMIT=${LIMIT_S:-585}
left() { echo $((LIMIT - ($(date +%s) - S))); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=ON -DBLASST_BUILD_CLI=OFF \
    -DPython_EXECUTABLE="$(command -v python3)" -DBLASST_DEPS_DIR="$PWD/.deps" \
    -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
  cmake --build $B -j "$(nproc)"; } > "$OUT/build.log" 2>&1
rc=$?; echo "build rc=$rc t=$(($(date +%s) - S))"
[ $rc -ne 0 ] && { grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; }
export BLASST_COMMIT=${BLASST_COMMIT:-unknown} PYTHONUNBUFFERED=1
timeout 150 python3 bench/decode/bench_decode.py "$B/bench/decode/libblasst_decode_bench.so" "$OUT" --quick > "$OUT/decode.log" 2>&1
echo "bench_decode --quick rc=$? t=$(($(date +%s) - S))"
r=$(( $(left) - 40 )); [ $r -lt 30 ] && r=30
PYTHONPATH="$PWD/$B/python" timeout $r python3 bench/decode/bench_eager.py "$OUT" ${QUICK:+--quick} > "$OUT/bench_eager.log" 2>&1
echo "bench_eager rc=$? t=$(($(date +%s) - S))"
r=$(( $(left) - 5 )); [ $r -gt 30 ] && r=30; [ $r -lt 5 ] && r=5
timeout $r "$B/bench/decode/blasst_host_costs" > "$OUT/host_costs.txt" 2>&1; echo "blasst_host_costs rc=$?"
grep -E "^\|" "$OUT/decode_bench.md" 2>/dev/null | head -30
sed -n '/^# Eager/,$p' "$OUT/bench_eager.log" | head -60
head -30 "$OUT/host_costs.txt"
echo "t=$(($(date +%s) - S))"
