#!/usr/bin/env bash
# On the GPU machine (offline; torch, transformers, nanobind, scikit-build-core, pytest present):
# build blasst._core with the sm_90a kernels by CMake directly (no pip, no network) and run the
# Python tests with BLASST_REQUIRE_GPU=1, so a missing GPU path fails instead of skipping.
# Needs .deps/ carried along (CUTLASS headers, nlohmann-json): run scripts/bootstrap.sh on a
# networked machine first and name .deps in the device call's carry list.
# Log: $OUT/python_device.log when OUT is set, else build-python-device/python_device.log.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BLASST_PY_BUILD_DIR:-build-python-device}
LOGDIR=${OUT:-$BUILD}
mkdir -p "$BUILD" "$LOGDIR"
LOG="$LOGDIR/python_device.log"
exec > >(tee "$LOG") 2>&1
PY=${PYTHON:-python3}
t0=$(date +%s)

echo "== device_python: $(date -u +%FT%TZ)"
nvidia-smi -L || echo "device_python: nvidia-smi failed"
"$PY" - <<'PYEOF'
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "transformers", "nanobind", "scikit_build_core", "pytest", "numpy"):
    try:
        m = importlib.import_module(name)
        print(f"  {name} {getattr(m, '__version__', '?')}")
    except Exception as e:  # noqa: BLE001
        print(f"  {name} MISSING ({e})")
import torch
print("  torch.cuda.is_available():", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PYEOF
[ -f .deps/cutlass/include/cute/tensor.hpp ] || echo "device_python: WARNING: .deps/cutlass missing (carry .deps)"

echo "== configure + build (CUDA on)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_ENABLE_CUDA=ON \
  -DBLASST_BUILD_PYTHON=ON -DBLASST_BUILD_TESTS=OFF -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_BENCH=OFF \
  -DPython_EXECUTABLE="$(command -v "$PY")" || { echo "device_python: FAILED: configure"; exit 1; }
cmake --build "$BUILD" --target _core -j "${BUILD_JOBS:-$(nproc)}" \
  || { echo "device_python: FAILED: build"; exit 1; }
t1=$(date +%s)

echo "== pytest (BLASST_REQUIRE_GPU=1)"
export PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
export BLASST_REQUIRE_GPU=1
"$PY" -c "import blasst; print('blasst', blasst.__file__, 'cuda_available', blasst.cuda_available(), blasst.cuda_device_name())"
"$PY" -m pytest -p no:cacheprovider -v -rs -s tests/python "$@"
rc=$?
[ $rc -eq 5 ] && { echo "device_python: FAILED: no tests collected"; rc=1; }

echo "== examples"
"$PY" python/examples/denoise_loop.py --cuda --steps 8 || { echo "device_python: FAILED: denoise_loop.py"; rc=1; }
"$PY" python/examples/llama_generate.py --prompt-len 2048 --new-tokens 8 --factor 200 \
  || { echo "device_python: FAILED: llama_generate.py"; rc=1; }
t2=$(date +%s)
echo "device_python: build $((t1 - t0)) s, tests + examples $((t2 - t1)) s; exit $rc"
exit $rc
