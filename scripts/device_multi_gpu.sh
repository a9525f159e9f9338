#!/usr/bin/env bash
# On a machine with 2+ GPUs (issue 20; a device call of kind nvidia-h100-x2 / nvidia-h200-x2 or
# larger, carrying .deps/cutlass, .deps/include and .deps/wheels from scripts/bootstrap.sh and
# scripts/device_wheels.sh): build blasst._core with the
# sm_90a kernels (CMake, no pip, no network), install the carried diffusers wheels, run the
# multi-GPU test (BLASST_REQUIRE_GPUS=2: a skip is a failure), the one-GPU seeded-maxima GPU test
# of the prefill kernel, then bench/diffusers/bench_cp.py on every GPU. Logs and tables under $OUT
# (packed after each step, so a run cut short still returns what it did).
#   BLASST_COMMIT=<hash> bash scripts/device_multi_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build-multi-gpu/out}
BUILD=${BLASST_PY_BUILD_DIR:-build-python-device}
mkdir -p "$OUT" "$BUILD"
PY=${PYTHON:-python3}
SUMMARY=("commit ${BLASST_COMMIT:-unknown}" "$(nvidia-smi -L 2>&1 | tr '\n' ';')")
pack() { tar -czf "$OUT/multi_gpu_logs.tgz" -C "$OUT" --exclude multi_gpu_logs.tgz . 2>/dev/null || true; }

if [ -d .deps/wheels ]; then
  for w in .deps/wheels/*.whl; do  # each only when its module is missing (device_all.sh)
    mod=$(basename "$w" | cut -d- -f1 | tr 'A-Z' 'a-z'); [ "$mod" = pillow ] && mod=PIL
    "$PY" -c "import $mod" 2>/dev/null ||
      "$PY" -m pip install -q --no-deps --no-index "$w" >> "$OUT/wheels.log" 2>&1
  done
fi
t0=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_ENABLE_CUDA=ON \
  -DBLASST_BUILD_PYTHON=ON -DBLASST_BUILD_TESTS=ON -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_BENCH=OFF \
  -DPython_EXECUTABLE="$(command -v "$PY")" > "$OUT/build.log" 2>&1 &&
cmake --build "$BUILD" --target _core test_gpu_prefill_ref -j "${BUILD_JOBS:-$(nproc)}" >> "$OUT/build.log" 2>&1
rc_build=$?
SUMMARY+=("build rc $rc_build in $(( $(date +%s) - t0 )) s")
pack
export PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
if [ $rc_build -eq 0 ]; then
  gp=$(find "$BUILD" -name test_gpu_prefill_ref -type f | head -1)
  timeout 120 "$gp" --gtest_filter='*SeededMaxima*' > "$OUT/seeded_maxima.log" 2>&1
  SUMMARY+=("GpuPrefillVsReference.SeededMaxima rc $? ($(grep -E '^\[  (PASSED|FAILED)' "$OUT/seeded_maxima.log" | tr '\n' ' '))")
  pack
  BLASST_REQUIRE_GPUS=2 timeout 300 "$PY" -m pytest -p no:cacheprovider -q -rs -s \
    tests/python/test_diffusers_cp_gpu.py tests/python/test_diffusers_cp_cpu.py > "$OUT/pytest_cp.log" 2>&1
  SUMMARY+=("pytest context parallel rc $? ($(tail -1 "$OUT/pytest_cp.log"))")
  pack
  timeout "${BENCH_S:-360}" "$PY" bench/diffusers/bench_cp.py --out "$OUT" > "$OUT/bench_cp.log" 2>&1
  SUMMARY+=("bench_cp rc $?")
  tail -n 30 "$OUT/bench_cp.log"
fi
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
pack
