#!/usr/bin/env bash
# Python package test (called by scripts/test.sh): `pip install .` into a venv at build/pyenv
# (PyPI only), then pytest tests/python. The venv gets tests/python/requirements.txt: pytest,
# numpy and the pinned torch, transformers and diffusers, so the torch, transformers and diffusers
# tests run on CPU tensors (reference engine) here; tests/python/conftest.py turns a skip of those
# suites into a failure (BLASST_REQUIRE_TORCH=1, set below). On a machine without a GPU the extension is built
# without the CUDA kernels to keep CI fast; BLASST_PY_CUDA=ON|OFF overrides the choice.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
VENV=${BLASST_PYENV:-build/pyenv}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "test_python: creating the venv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
# Disk: the Linux torch wheel and its CUDA runtime wheels are several GB. A CI run failed once with
# "No space left on device" in this step, so pip keeps no cache (a clean machine never reuses it)
# and unpacks under build/ rather than in /tmp, which can be a small tmpfs; the free space of both
# is printed first, so that a failure here says where the space ran out.
PIP_TMP="$(pwd)/build/pip-tmp"
mkdir -p "$PIP_TMP"
echo "test_python: free disk before the install:"
df -h . /tmp "$PIP_TMP" 2>/dev/null | sed 's/^/  /' || true
echo "test_python: pip install -r tests/python/requirements.txt (pytest, numpy, torch, transformers, diffusers)"
TMPDIR="$PIP_TMP" "$PY" -m pip install -q --no-cache-dir --disable-pip-version-check \
  -r tests/python/requirements.txt
t_req=$(date +%s)

cuda=${BLASST_PY_CUDA:-}
if [ -z "$cuda" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then cuda=ON; else cuda=OFF; fi
fi
pip_args=(-C "build-dir=${BLASST_PY_BUILD_DIR:-build/pybuild}")
if [ "$cuda" = OFF ]; then
  echo "test_python: no GPU here: building blasst._core WITHOUT the CUDA kernels" \
       "(pip install . -C cmake.define.BLASST_ENABLE_CUDA=OFF); GPU tests will skip"
  pip_args+=(-C cmake.define.BLASST_ENABLE_CUDA=OFF)
else
  echo "test_python: building blasst._core with the CUDA kernels"
  pip_args+=(-C cmake.define.BLASST_ENABLE_CUDA=ON)
fi
export CMAKE_BUILD_PARALLEL_LEVEL=${BUILD_JOBS:-$(nproc)}
echo "test_python: pip install . (build from PyPI: scikit-build-core, nanobind)"
TMPDIR="$PIP_TMP" "$PY" -m pip install -q --no-cache-dir --disable-pip-version-check "${pip_args[@]}" .
rm -rf "$PIP_TMP"
t1=$(date +%s)

set +e
BLASST_REQUIRE_TORCH=1 "$PY" -m pytest -p no:cacheprovider -q -rs tests/python "$@"
rc=$?
set -e
t2=$(date +%s)
echo "test_python: requirements $((t_req - t0)) s, build + install $((t1 - t_req)) s," \
     "tests $((t2 - t1)) s, total $((t2 - t0)) s"
if [ $rc -eq 5 ]; then
  echo "test_python: FAILED: pytest collected no tests"
  exit 1
fi
exit $rc
