#!/usr/bin/env bash
# The model benchmark on the GPU machine in one call (bench/model/README.md): train a small LM
# from scratch on the installed packages' Python sources (wall-clock budget), save a sharded
# checkpoint, then evaluate held-out loss dense vs Skip-Softmax through blasst.attention.
#
# Needs blasst importable: PYTHONPATH at a build's python dir (scripts/device_all.sh builds one in
# build-device/python). Without it, this script looks for $BUILD_DIR/python (default
# build-device) and, with BLASST_BUILD=1, builds only the extension there first (a few minutes).
#
# Budgets (seconds): TRAIN_S (default 290), EVAL_S (150); whole run about 8 min.
# TINY=1: local smoke test of this script on the CPU (recipe.py --tiny).
# Outputs in $OUT (<= 6 files): results.json, ckpt_*.pt (< 15 MiB each, bf16),
# misc.tar.gz (results.md, log.txt, tokenizer.json, build log).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/model_out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
BUILD=${BUILD_DIR:-build-device}
ts() { date -u +%H:%M:%S; }
echo "[$(ts)] run_device: OUT=$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$WORK/gpu.txt" 2>&1 || true
cat "$WORK/gpu.txt"

if ! python3 -c "import blasst" >/dev/null 2>&1; then
  if [ -d "$BUILD/python/blasst" ]; then
    export PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
  elif [ "${BLASST_BUILD:-0}" = 1 ]; then
    echo "[$(ts)] building blasst._core in $BUILD (log in misc.tar.gz: build.log)"
    t0=$(date +%s)
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=ON \
      -DBLASST_BUILD_TESTS=OFF -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_BENCH=OFF \
      -DPython_EXECUTABLE="$(command -v python3)" > "$WORK/build.log" 2>&1 &&
      cmake --build "$BUILD" -j "$(nproc)" --target _core >> "$WORK/build.log" 2>&1
    echo "[$(ts)] build rc=$? ($(( $(date +%s) - t0 )) s)"
    export PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
if ! python3 -c "import blasst, sys; print('blasst', blasst.__version__, 'cuda', blasst.cuda_available(), blasst.cuda_device_name() if blasst.cuda_available() else '')"; then
  echo "[$(ts)] ERROR: blasst is not importable (set PYTHONPATH to a build's python dir, or BLASST_BUILD=1)"
  exit 2
fi
if [ "${TINY:-0}" = 1 ]; then  # local smoke test of this script: CPU, --tiny
  RECIPE_ARGS="--tiny ${RECIPE_ARGS:-}"
else
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print('torch', torch.__version__, torch.cuda.get_device_name(0))" || {
  echo "[$(ts)] ERROR: torch sees no CUDA device"; exit 2; }
fi

t0=$(date +%s)
timeout ${TOTAL_TIMEOUT_S:-570} python3 bench/model/recipe.py --out "$WORK" \
  --train-seconds "${TRAIN_S:-290}" --eval-seconds "${EVAL_S:-150}" ${RECIPE_ARGS:-}
rc=$?
echo "[$(ts)] recipe rc=$rc ($(( $(date +%s) - t0 )) s)"

# Gather: results.json and the shards as files, everything else in one archive.
[ -f "$WORK/build.log" ] || true
cp "$WORK"/results.json "$OUT"/ 2>/dev/null
cp "$WORK"/ckpt_*.pt "$OUT"/ 2>/dev/null
(cd "$WORK" && tar czf "$OUT/misc.tar.gz" $(ls | grep -v -E '^(results\.json|ckpt_.*\.pt)$'))
ls -la "$OUT"
[ -f "$WORK/results.md" ] && cat "$WORK/results.md"
rm -rf "$WORK"
exit $rc
