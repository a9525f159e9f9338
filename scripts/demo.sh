#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, and run the main job (`blasst demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
mkdir -p build
echo "demo: building blasst (the first build compiles the sm_90a kernels when nvcc is present:" \
     "several minutes on 2 cores; log: build/demo-build.log)" >&2
if ! BUILD_TARGET=blasst_cli ./scripts/build.sh > build/demo-build.log 2>&1; then
  tail -n 40 build/demo-build.log >&2
  echo "demo: build failed (full log: build/demo-build.log)" >&2
  exit 1
fi
exec ./build/blasst demo "$@"
