#!/usr/bin/env bash
# Before/after speed of a restructuring, on the GPU machine, in one call: builds the bench
# libraries of a baseline source tree (default .baseline/, e.g. `git archive <rev> | tar -x -C
# .baseline`, carried as an ignored folder) and of this tree, then times both in one process on
# the same tensors (bench/ab_compare.py). Carry .deps/cutlass, .deps/include, .deps/googletest and
# the baseline folder. Results under $OUT (ab_compare.md / .json).
#   usage: [AB_OLD=rev AB_NEW=rev NEW_SRC=dir (default .) NEW_BUILD=dir] scripts/device_ab.sh [BASELINE_DIR] [--rounds N]
set -uo pipefail
cd "$(dirname "$0")/.."
OLD_SRC=${1:-.baseline}
shift || true
OUT=${OUT:-/tmp/ab_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
build() {  # src dir, build dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_TESTS=OFF \
    -DBLASST_BUILD_PYTHON=OFF -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
    cmake --build "$2" -j "$(nproc)" --target blasst_prefill_bench blasst_decode_bench
}
t0=$(date +%s)
if ! build "$OLD_SRC" build-ab-old > "$OUT/ab_build_old.log" 2>&1; then
  grep -E "error|Error" "$OUT/ab_build_old.log" | head -20; echo "AB: baseline build failed"; exit 1
fi
# NEW_BUILD=<dir>: a build of this tree that already holds the bench libraries (device_all.sh's).
NEW_DIR=${NEW_BUILD:-build-ab-new}
if [ -z "${NEW_BUILD:-}" ] && ! build "${NEW_SRC:-.}" build-ab-new > "$OUT/ab_build_new.log" 2>&1; then
  grep -E "error|Error" "$OUT/ab_build_new.log" | head -20; echo "AB: build failed"; exit 1
fi
echo "ab builds: $(( $(date +%s) - t0 )) s"
lib() { find "$1" -name "$2" | head -n1; }
timeout ${AB_TIMEOUT_S:-300} python3 bench/ab_compare.py \
  "$(lib build-ab-old libblasst_prefill_bench.so)" "$(lib "$NEW_DIR" libblasst_prefill_bench.so)" \
  "$(lib build-ab-old libblasst_decode_bench.so)" "$(lib "$NEW_DIR" libblasst_decode_bench.so)" "$OUT" "$@" \
  > "$OUT/ab_compare.log" 2>&1
rc=$?
echo "ab_compare: rc=$rc"
[ $rc -ne 0 ] && tail -20 "$OUT/ab_compare.log"
exit $rc
