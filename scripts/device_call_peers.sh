#!/usr/bin/env bash
# One device call: the figures that decide issues 14 and 18 against their peers, on one machine.
# 1. one build (Python on: the package, the decode bench library, bench_backward);
# 2. bench/decode/bench_decode.py --quick beside cuDNN (B 1 / 8 / 64 at 32k): the first library-build
#    run of the 128 B L2 promotion of the TMA boxes (63f9a1d; a probe measured 6-7 % at B >= 8);
# 3. bench/backward/bench_backward_peers.py --quick beside torch SDPA's cuDNN and flash backward
#    (issue 14's ratios with the d = 64 dQ sum and the dQ store order);
# 4. with the time left, WHAT=bwdfull scripts/device_call_ncu.sh on the same build (ours and cuDNN's
#    backward kernels, d128 full 8k and d64 causal 16k).
# DECODE=0 skips 2, BACKWARD=0 skips 3, NCU=0 skips 4; PYTEST_BWD=1 runs the backward's Python tests
# (BLASST_REQUIRE_GPU=1) after the build; EAGER=1 then runs bench/decode/bench_eager.py (host overhead per
# call; decode eager and as CUDA graphs at B 1 / 8 / 64, kv 8k / 32k / 128k beside SDPA cuDNN and flash;
# QUICK=1: its 3-shape table) and blasst_host_costs (issue 18: BACKWARD=0 NCU=0 EAGER=1 is its call). Short tables on stdout; logs and tables under $OUT. Carry .deps/cutlass, .deps/include, .deps/googletest.
cd "$(dirname "$0")/.."
S=$(date +%s); OUT=${OUT:-/tmp/peers}; mkdir -p "$OUT"; B=${BUILD_DIR:-build-peers}
LIMIT=${LIMIT_S:-585}
left() { echo $((LIMIT - ($(date +%s) - S))); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=ON -DBLASST_BUILD_CLI=OFF \
    -DPython_EXECUTABLE="$(command -v python3)" -DBLASST_DEPS_DIR="$PWD/.deps" \
    -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
  cmake --build $B -j "$(nproc)"; } > "$OUT/build.log" 2>&1
rc=$?; echo "build rc=$rc t=$(($(date +%s) - S))"
[ $rc -ne 0 ] && { grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; }
# The device's copy has no git: pass BLASST_COMMIT=<hash> in the run's command line (else "unknown").
COMMIT=${BLASST_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ "${DECODE:-1}" = 1 ]; then
  BLASST_COMMIT=$COMMIT timeout 150 python3 bench/decode/bench_decode.py "$B/bench/decode/libblasst_decode_bench.so" "$OUT" --quick \
    > "$OUT/decode.log" 2>&1
  echo "bench_decode --quick rc=$? t=$(($(date +%s) - S))"; cat "$OUT/decode_bench.md" 2>/dev/null | grep -E "^\|" | head -30
fi
if [ "${PYTEST_BWD:-0}" = 1 ]; then  # the backward's Python tests on the GPU (autograd, torch.compile)
  PYTHONPATH="$PWD/$B/python" BLASST_REQUIRE_GPU=1 timeout 200 python3 -m pytest -q tests/python/test_backward_cpu.py \
    tests/python/test_torch.py tests/python/test_torch_eager_cpu.py > "$OUT/pytest_bwd.log" 2>&1
  echo "pytest backward rc=$? t=$(($(date +%s) - S)): $(tail -1 "$OUT/pytest_bwd.log")"
fi
if [ "${EAGER:-0}" = 1 ]; then
  r=$(( $(left) - 40 )); [ $r -gt 300 ] && r=300
  if [ $r -gt 30 ]; then
    BLASST_COMMIT=$COMMIT PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/$B/python" timeout $r python3 bench/decode/bench_eager.py "$OUT" ${QUICK:+--quick} \
      > "$OUT/bench_eager.log" 2>&1
    echo "bench_eager rc=$? t=$(($(date +%s) - S))"; sed -n '/^# Eager/,$p' "$OUT/bench_eager.log" | head -60
  fi
  timeout 30 "$B/bench/decode/blasst_host_costs" 2>&1 | head -30
fi
if [ "${BACKWARD:-1}" = 1 ]; then
  r=$(left); [ $r -gt 200 ] && r=200
  if [ $r -gt 30 ]; then
    BLASST_COMMIT=$COMMIT PYTHONPATH="$PWD/$B/python" timeout $r python3 bench/backward/bench_backward_peers.py --quick --d64 --out "$OUT" > "$OUT/peers.log" 2>&1
    echo "bench_backward_peers --quick --d64 rc=$? t=$(($(date +%s) - S))"; grep -E "^\|" "$OUT/bench_backward_peers.md" 2>/dev/null | head -30
    grep -v "^|" "$OUT/peers.log" | tail -3  # (the table is above)
  fi
fi
r=$(left)
if [ "${NCU:-1}" = 1 ] && [ $r -gt 60 ]; then
  WHAT=bwdfull NO_BUILD=1 BUILD_DIR=$B LIMIT_S=$r bash scripts/device_call_ncu.sh 2>&1 | tail -8
fi
echo "t=$(($(date +%s) - S))"
