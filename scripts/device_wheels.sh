#!/usr/bin/env bash
# Fills .deps/wheels with the Python wheels the offline GPU machine lacks (python 3.12 there,
# torch and numpy present): diffusers at the tests' pin and the packages it imports that the
# machine does not have (importlib_metadata, zipp, pillow). From PyPI, on this (networked)
# machine, once per fresh checkout; the device scripts install each only where its module is
# missing (device_all.sh, device_multi_gpu.sh). Carry .deps/wheels in the device call.
set -euo pipefail
cd "$(dirname "$0")/.."
pin=$(grep -E '^diffusers==' tests/python/requirements.txt)
mkdir -p .deps/wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --implementation cp \
  -d .deps/wheels "$pin" importlib_metadata zipp pillow
ls -1 .deps/wheels
