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
# EVAL_ONLY=1 CKPT_DIR=DIR: no training; evaluate DIR's checkpoint (ckpt_*.pt, tokenizer.json,
# results.json of a previous run): about 1 min, timeout 175 s; $OUT gets results.json,
# calibrated_config.json, misc.tar.gz.
# FINETUNE=1 CKPT_DIR=DIR: sparsity-aware fine-tuning vs a dense control from DIR's checkpoint
# (bench/model/finetune.py; README "Sparsity-aware fine-tuning"): FT_S (default 100) is the time
# budget of the first arm, which fixes the step count of all three; FT_ARGS extra flags; about
# 5.5 min, timeout TOTAL_TIMEOUT_S (default 500 s); $OUT gets results.json, misc.tar.gz
# (results.md, log.txt, gpu.txt). With TINY=1 and no CKPT_DIR: a tiny CPU checkpoint is trained
# first (finetune.py --tiny).
# Outputs in $OUT (<= 6 files): results.json, ckpt_*.pt (< 15 MiB each, bf16),
# misc.tar.gz (results.md, log.txt, tokenizer.json, build log).
set -uo pipefail
# CKPT_DIR relative to the caller's directory: made absolute before the cd below
if [ -n "${CKPT_DIR:-}" ] && [ -d "$CKPT_DIR" ]; then CKPT_DIR=$(cd "$CKPT_DIR" && pwd); fi
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

if [ "${FINETUNE:-0}" = 1 ]; then  # sparsity-aware fine-tuning (no training from scratch)
  FT_ARGS=${FT_ARGS:-}
  if [ "${TINY:-0}" = 1 ]; then
    FT_ARGS="--tiny $FT_ARGS"
  else
    CKPT_DIR=${CKPT_DIR:?FINETUNE=1 needs CKPT_DIR: a previous run folder with ckpt_*.pt, tokenizer.json, results.json}
  fi
  if [ -n "${CKPT_DIR:-}" ]; then
    ls "$CKPT_DIR"/ckpt_*.pt >/dev/null 2>&1 || { echo "[$(ts)] ERROR: no ckpt_*.pt in $CKPT_DIR"; exit 2; }
    [ -f "$CKPT_DIR/tokenizer.json" ] || { echo "[$(ts)] ERROR: no tokenizer.json in $CKPT_DIR"; exit 2; }
    FT_ARGS="--ckpt $CKPT_DIR $FT_ARGS"
  fi
  [ -n "${FT_S:-}" ] && FT_ARGS="--ft-seconds $FT_S $FT_ARGS"
  t0=$(date +%s)
  echo "[$(ts)] finetune.py $FT_ARGS (timeout ${TOTAL_TIMEOUT_S:-500} s)"
  timeout "${TOTAL_TIMEOUT_S:-500}" python3 bench/model/finetune.py --out "$WORK" $FT_ARGS
  rc=$?
  echo "[$(ts)] finetune rc=$rc ($(( $(date +%s) - t0 )) s)"
  cp "$WORK"/results.json "$OUT"/ 2>/dev/null
  (cd "$WORK" && tar czf "$OUT/misc.tar.gz" $(ls | grep -v -E '^results\.json$'))
  ls -la "$OUT"
  [ -f "$WORK/results.md" ] && cat "$WORK/results.md"
  rm -rf "$WORK"
  exit $rc
fi

EVAL_ONLY=${EVAL_ONLY:-0}
if [ "$EVAL_ONLY" = 1 ]; then  # evaluate a previous run's checkpoint (no training)
  CKPT_DIR=${CKPT_DIR:?EVAL_ONLY=1 needs CKPT_DIR: a previous run folder with ckpt_*.pt, tokenizer.json, results.json}
  ls "$CKPT_DIR"/ckpt_*.pt >/dev/null 2>&1 || { echo "[$(ts)] ERROR: no ckpt_*.pt in $CKPT_DIR"; exit 2; }
  [ -f "$CKPT_DIR/tokenizer.json" ] || echo "[$(ts)] WARNING: no tokenizer.json in $CKPT_DIR: the BPE is retrained"
  RECIPE_ARGS="--eval-only --ckpt $CKPT_DIR ${RECIPE_ARGS:-}"
  DEFAULT_TIMEOUT=175
else
  DEFAULT_TIMEOUT=570
fi
t0=$(date +%s)
echo "[$(ts)] recipe.py ${RECIPE_ARGS:-} (timeout ${TOTAL_TIMEOUT_S:-$DEFAULT_TIMEOUT} s)"
timeout ${TOTAL_TIMEOUT_S:-$DEFAULT_TIMEOUT} python3 bench/model/recipe.py --out "$WORK" \
  --train-seconds "${TRAIN_S:-290}" --eval-seconds "${EVAL_S:-150}" ${RECIPE_ARGS:-}
rc=$?
echo "[$(ts)] recipe rc=$rc ($(( $(date +%s) - t0 )) s)"

# Gather: results.json and the shards as files, everything else in one archive.
[ -f "$WORK/build.log" ] || true
cp "$WORK"/results.json "$OUT"/ 2>/dev/null
if [ "$EVAL_ONLY" = 1 ]; then  # the shards are the input: not copied back
  cp "$WORK"/calibrated_config.json "$OUT"/ 2>/dev/null
  (cd "$WORK" && tar czf "$OUT/misc.tar.gz" $(ls | grep -v -E '^(results\.json|ckpt_.*\.pt|calibrated_config\.json)$'))
else
  cp "$WORK"/ckpt_*.pt "$OUT"/ 2>/dev/null
  (cd "$WORK" && tar czf "$OUT/misc.tar.gz" $(ls | grep -v -E '^(results\.json|ckpt_.*\.pt)$'))
fi
ls -la "$OUT"
[ -f "$WORK/results.md" ] && cat "$WORK/results.md"
rm -rf "$WORK"
exit $rc
