#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, and run the main job (`blasst demo`).
# On a machine without a usable GPU only the CPU parts the demo needs are built (into build-demo/,
# no CUDA kernels, no tests or benchmarks: about a minute on 2 cores); with a GPU the command is
# built with the sm_90a kernels into build/ (several minutes the first time). The test command
# (scripts/test.sh) and CI always build everything into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  build_dir=${BUILD_DIR:-build}
  cmake_args=()
  echo "demo: GPU found: building blasst with the sm_90a kernels into $build_dir (the first build" \
       "takes several minutes; log: $build_dir/demo-build.log)" >&2
else
  build_dir=${BUILD_DIR:-build-demo}
  cmake_args=(-DBLASST_ENABLE_CUDA=OFF -DBLASST_BUILD_TESTS=OFF -DBLASST_BUILD_BENCH=OFF)
  echo "demo: no GPU here: building the CPU-only blasst command into $build_dir" \
       "(log: $build_dir/demo-build.log)" >&2
fi
mkdir -p "$build_dir"
if [ ! -f "$build_dir/build.ninja" ]; then
  if ! cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" \
       > "$build_dir/demo-build.log" 2>&1; then
    tail -n 40 "$build_dir/demo-build.log" >&2
    echo "demo: configure failed (full log: $build_dir/demo-build.log)" >&2
    exit 1
  fi
fi
if ! cmake --build "$build_dir" -j "${BUILD_JOBS:-$(nproc)}" --target blasst_cli >> "$build_dir/demo-build.log" 2>&1; then
  tail -n 40 "$build_dir/demo-build.log" >&2
  echo "demo: build failed (full log: $build_dir/demo-build.log)" >&2
  exit 1
fi
exec "./$build_dir/blasst" demo "$@"
