#!/usr/bin/env bash
# Installs what a fresh machine lacks (Debian packages, the pinned CUTLASS headers from PyPI) and
# prepares .deps/, which also carries the header-only dependencies to the offline GPU machine.
# Idempotent: a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
CUTLASS_VERSION=4.2.0.0

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in build-essential cmake ninja-build libgtest-dev googletest libcli11-dev nlohmann-json3-dev libpng-dev \
         python3 python3-pip python3-venv unzip; do
  have_pkg "$p" || need+=("$p")
done
if ((${#need[@]})); then
  echo "bootstrap: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p .deps/include
# CuTe/CUTLASS headers: PyPI nvidia-cutlass (pinned), unpacked from its wheel.
if [ ! -f .deps/cutlass/include/cute/tensor.hpp ]; then
  whl=$(ls .deps/nvidia_cutlass-${CUTLASS_VERSION}-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$whl" ]; then
    echo "bootstrap: downloading nvidia-cutlass==${CUTLASS_VERSION} from PyPI"
    python3 -m pip download -q --no-deps --only-binary=:all: -d .deps "nvidia-cutlass==${CUTLASS_VERSION}"
    whl=$(ls .deps/nvidia_cutlass-${CUTLASS_VERSION}-*.whl | head -n1)
  fi
  rm -rf .deps/cutlass .deps/_unz && mkdir -p .deps/_unz
  unzip -q "$whl" 'cutlass_library/source/include/*' -d .deps/_unz
  mkdir -p .deps/cutlass && mv .deps/_unz/cutlass_library/source/include .deps/cutlass/include
  rm -rf .deps/_unz
fi
# Header-only and source dependencies, copied for the GPU machine (which has no registry).
[ -d .deps/include/CLI ] || cp -r /usr/include/CLI .deps/include/
[ -d .deps/include/nlohmann ] || cp -r /usr/include/nlohmann .deps/include/
[ -d .deps/googletest ] || cp -r /usr/src/googletest .deps/googletest
