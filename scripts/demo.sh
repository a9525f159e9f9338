#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, and run the main job (`blasst demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
./scripts/build.sh >/dev/null
exec ./build/blasst demo "$@"
