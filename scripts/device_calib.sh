#!/usr/bin/env bash
# GPU validation of the calibration (issue 5), in one call on the H200:
#   build the `blasst` command (CUDA kernels on, Python off, -j16), then `blasst calibrate --device
#   cuda` at L = 4k, 8k, 16k, 32k, 64k, targets 0.5 / 0.7 / 0.9, with the fixed-lambda baseline:
#     1. llm prefill  (causal, Hq 8, Hk 2, d 128, 64-row x 128-key warpgroup votes, natural order)
#     2. llm decode   (GQA g = 4 vote, one split: --split-tiles 1024 keeps every length unsplit)
#     3. llm decode   (16-tile unseeded splits, the kernel's kind of layout: shown for contrast)
#     4. dit prefill  (full mask, Hq = Hk = 8, d 128)
#     5. llm decode   (the kernel's own split layout, seeded splits: --order max_first)
#   Logs and reports under $OUT (at most 8 files: a tarball of the reports), a short table last.
# Usage: [BLASST_COMMIT=abc123] scripts/device_calib.sh
# Expected: build ~2-3 min (library + kernels), the four calibrations ~10-40 s each (workload
# generation on the CPU dominates at 64k: ~1 s per length and phase on 16 cores; the kernels' dense
# probes are milliseconds), about 4-5 min in all.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
OUT=${OUT:-/tmp/blasst_calib_out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-device-calib}
JOBS=${BUILD_JOBS:-16}
COMMIT=${BLASST_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
t0=$(date +%s)
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=OFF -DBLASST_BUILD_CLI=ON &&
       cmake --build "$BUILD" --target blasst_cli -j "$JOBS"; } > "$OUT/build.log" 2>&1; then
  grep -E "error|Error" "$OUT/build.log" | head -30
  echo "BUILD FAILED (log: build.log)"
  exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
BIN="$BUILD/blasst"
LENS=4096,8192,16384,32768,65536
TG=${TARGETS:-0.3,0.4,0.5,0.6,0.7,0.8,0.9}  # the SPEC 6 goal covers 0.3-0.9
DQ=${DECODE_QUERIES:-256}  # decode steps sampled per length (64 is sampling-noise bound: docs/calibration.md 7)
R="$OUT/reports"
mkdir -p "$R"

run() {  # name, args...
  local name=$1; shift
  local t=$(date +%s)
  timeout ${CAL_TIMEOUT_S:-150} "$BIN" calibrate --device cuda --lengths "$LENS" --targets "$TG" \
    --report "$R/$name" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$name: rc $rc, $(( $(date +%s) - t )) s"
  grep -E "^  (prefill|decode)|goal" "$R/$name.log" | sed 's/^/    /'
}
run llm_prefill --workload llm --phase prefill --heads 8 --heads-k 2 --head-dim 128
run llm_decode --workload llm --phase decode --heads 8 --heads-k 2 --head-dim 128 --split-tiles 1024 --decode-queries $DQ
run llm_decode_split16 --workload llm --phase decode --heads 8 --heads-k 2 --head-dim 128 --split-tiles 16 --decode-queries $DQ
run dit_prefill --workload dit --phase prefill --heads 8 --heads-k 8 --head-dim 128
# 5. llm decode with seeded splits of 32 tiles (max-first order, SPEC §2a; one split size at every
#    length, as calibration requires: the kernel picks its split per length):
#    the sink seeds every split's running max, so short splits follow the law like one split.
run llm_decode_seeded --workload llm --phase decode --heads 8 --heads-k 2 --head-dim 128 --order max_first --decode-queries $DQ --split-tiles 32

# Table: achieved sparsity per length (fit / fixed lambda) and the inverse-law exponent p.
{
  echo "# blasst calibrate --device cuda, commit $COMMIT, $(date -u +%F), $(cat "$OUT/gpu.txt")"
  for n in llm_prefill llm_decode llm_decode_split16 dit_prefill llm_decode_seeded; do
    f="$R/$n/report.md"
    echo
    echo "## $n"
    [ -f "$f" ] || { echo "(no report; see $n.log)"; tail -5 "$R/$n.log"; continue; }
    grep -E "^\| (prefill|decode) \|" "$f" | head -2
    awk '/^### Inverse law/{p=1} /^### Validation/{p=2} /^### Per-head/{p=0} p>0 && /^\| (target|[0-9])/{print}' "$f"
  done
} > "$OUT/calib_table.md"
tar czf "$OUT/calib_reports.tgz" -C "$OUT" reports build.log 2>/dev/null && rm -rf "$R" "$OUT/build.log"
echo "total: $(( $(date +%s) - START )) s"
echo
cat "$OUT/calib_table.md"
