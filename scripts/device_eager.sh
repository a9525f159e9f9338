#!/usr/bin/env bash
# Host overhead of eager calls on the GPU machine, in one call (issue 18): build the library, the
# Python extension and blasst_host_costs (BUILD_DIR, default build; an up-to-date build is reused),
# then blasst_host_costs (C++ calls and the runtime calls they are made of) and
# bench/decode/bench_eager.py (Python API: host overhead per call, decode eager vs CUDA graph
# beside torch SDPA cuDNN/flash). QUICK=1: the eager benchmark's 3-shape decode table.
# Logs and results under $OUT, the short tables last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/blasst_eager_out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build}
export PYTHONUNBUFFERED=1
t0=$(date +%s)
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=ON \
         -DPython_EXECUTABLE="$(command -v python3)" &&
       cmake --build "$BUILD" -j "$(nproc)"; } > "$OUT/eager_build.log" 2>&1; then
  grep -E "error|FAILED" "$OUT/eager_build.log" | head -30
  echo "BUILD FAILED (log: eager_build.log)"
  exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
export BLASST_COMMIT=${BLASST_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
timeout 120 "$BUILD/bench/decode/blasst_host_costs" > "$OUT/host_costs.txt" 2>&1
echo "blasst_host_costs rc=$?"
PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" timeout ${EAGER_TIMEOUT:-300} \
  python3 bench/decode/bench_eager.py "$OUT" ${QUICK:+--quick} > "$OUT/bench_eager.log" 2>&1
echo "bench_eager rc=$?"
cat "$OUT/host_costs.txt"
sed -n '/^# Eager/,$p' "$OUT/bench_eager.log"
