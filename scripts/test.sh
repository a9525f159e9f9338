#!/usr/bin/env bash
# Quick start, command 2: install what is missing, build everything, run every test.
# GPU tests skip with a message when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "test: free disk at the start: $(df -h . | awk 'NR==2 {print $4 " of " $2}')"
./scripts/bootstrap.sh
./scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
if [ -x scripts/test_python.sh ]; then ./scripts/test_python.sh; fi
