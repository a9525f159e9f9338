#!/usr/bin/env bash
# Configure and build into ${BUILD_DIR:-build} (Ninja, Release). Extra args go to cmake configure.
# BUILD_TARGET=<target> builds only that target (default: everything).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$BUILD_DIR" -j "${BUILD_JOBS:-$(nproc)}" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
