#!/usr/bin/env bash
# Mutation check of the CPU-side tests (issue 22): each patch in tests/mutants/cpu/ breaks one rule
# of the library (reference engine, calibration, `blasst` command, Python package; the patch's
# "MUTANT:" comment says which). For each mutant: apply it, rebuild the targets its tests need
# (ninja, incremental), run each test, expect a failure; then restore the patched files (git
# checkout), rebuild, run the same tests again, expect them to pass. One table line per test:
#   mutant | test | on the mutant | after restore
# Every row is expected to FAIL on its mutant; "PASS <-- not caught" is a weak test: report it, do
# not change the test here. Known escape (issue 22 closing note): b2 (causal own tile taken at the
# group's first row) is caught by the C++ oracle test, not by test_skip_cpu.py, whose causal shapes
# keep Lk - Lq a multiple of 64 (every 64-row group's first and last rows share a key tile).
# GPU counterpart: scripts/device_mutants.sh (tests/mutants/gpu/).
#
# Needs a CPU build with the Python extension staged in it (2 cores: -j2), e.g.
#   cmake -S . -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_ENABLE_CUDA=OFF \
#     -DBLASST_BUILD_PYTHON=ON -DPython_EXECUTABLE=$PWD/build/pyenv/bin/python
# and a venv with tests/python/requirements.txt and nanobind (scripts/test_python.sh makes
# build/pyenv; `pip install nanobind` on top). Python tests import PYTHONPATH=build-cpu/python.
# Usage: scripts/cpu_mutants.sh [NAME...]   (patch names without .patch; default: all rows below)
# Env: BUILD_DIR (build-cpu), PY (build/pyenv/bin/python), JOBS (2), OUT (/tmp/cpu_mutants).
# Works in a git checkout only (restores with git checkout) and refuses a tree with local changes
# to the files a patch touches.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build-cpu}
PY=${PY:-build/pyenv/bin/python}
JOBS=${JOBS:-2}
OUT=${OUT:-/tmp/cpu_mutants}
MUTDIR=tests/mutants/cpu
mkdir -p "$OUT"
export PYTHONPATH="$PWD/$BUILD/python" BLASST_REQUIRE_TORCH=1

T=$BUILD/tests
ORACLE="$T/reference/test_reference_oracle --gtest_filter"
PYT="$PY -m pytest -p no:cacheprovider -q -rf"
# mutant | ninja target(s) (space separated) | test command
ROWS=(
  "a1-vote-one-row|test_reference_oracle|$ORACLE=Oracle.PrefillSkipSetAndOutputMatchTheEngine:Oracle.RowThatWouldSkipIsKeptByItsGroup:Oracle.DecodeGroupedHeadsMatchTheEngine"
  "a1-vote-one-row|test_calibration_workloads|$T/calibration/test_calibration_workloads --gtest_filter=Workloads.LlmPrefillCausal"
  "b1-causal-own-tile-minus-one|test_reference_oracle|$ORACLE=Oracle.PrefillSkipSetAndOutputMatchTheEngine"
  "b1-causal-own-tile-minus-one|_core|$PYT tests/python/test_skip_cpu.py -k visit_order_decides_the_skip_set"
  "b2-causal-own-tile-first-row|test_reference_oracle|$ORACLE=Oracle.PrefillSkipSetAndOutputMatchTheEngine"
  "b2-causal-own-tile-first-row|_core|$PYT tests/python/test_skip_cpu.py -k skip_set_matches_the_oracle_on_structured_data"
  "b3-full-own-tile-unscaled|test_reference_oracle|$ORACLE=Oracle.PrefillSkipSetAndOutputMatchTheEngine"
  "b3-full-own-tile-unscaled|_core|$PYT tests/python/test_skip_cpu.py -k skip_set_matches_the_oracle_on_structured_data"
  "b5-visit-cursor-no-alternation|test_reference|$T/reference/test_reference --gtest_filter=Core.VisitCursorMatchesSpecOrder"
  "b4-decode-own-tile-minus-one|test_reference_oracle|$ORACLE=Oracle.DecodeGroupedHeadsMatchTheEngine"
  "c1-lambda-ge-1-skips|test_reference_oracle|$ORACLE=Oracle.LambdaAtLeastOneRunsDenseOnMultiTileSequences"
  "c2-resolve-lambda-clamped|test_reference_oracle|$ORACLE=Oracle.LambdaAtLeastOneRunsDenseOnMultiTileSequences"
  "d1-fit-b-plus-3pct|test_calibration_fit|$T/calibration/test_calibration_fit --gtest_filter=Fit.LogLinearRecoversKnownLine"
  "d1-fit-b-plus-3pct|test_calibration_workloads|$T/calibration/test_calibration_workloads"
  "d2-inverse-exponent-plus-3pct|test_calibration_fit|$T/calibration/test_calibration_fit --gtest_filter=Fit.NoiseLowersR2AndInverseLawSeesWrongScaling"
  "d3-curve-count-off-by-one|test_calibration_workloads|$T/calibration/test_calibration_workloads"
  "e1-check-lists-components-without-block|test_calibration_check|$T/calibration/test_calibration_check --gtest_filter=Check.GoodFileSummary"
  "e2-check-component-name-truncated|test_calibration_check|$T/calibration/test_calibration_check --gtest_filter=Check.GoodFileSummary"
  "f1-demo-rel-error-no-sqrt|test_cli|$T/cli/test_cli --gtest_filter=Cli.DemoJsonQuick"
  "f2-demo-rel-error-wrong-norm|test_cli|$T/cli/test_cli --gtest_filter=Cli.DemoJsonQuick"
  "h1-recorded-delta-inf-as-zero|_core|$PYT tests/python/test_skip_cpu.py -k test_record_deltas"
  "h1-recorded-delta-inf-as-zero|test_reference_oracle|$ORACLE=Oracle.PrefillSkipSetAndOutputMatchTheEngine"
  "h2-decode-skipped-tile-still-used|_core|$PYT tests/python/test_skip_cpu.py -k test_decode_stats"
  "h2-decode-skipped-tile-still-used|test_reference_oracle|$ORACLE=Oracle.DecodeGroupedHeadsMatchTheEngine"
  "s1-strict-margin-one-twentieth|test_reference_screen|$T/reference/test_reference_screen --gtest_filter=Screen.StrictHasNoWrongScreenAndEqualsThePlainSkipPathOnRandomData"
  "s2-wrong-screen-not-counted|test_reference_screen|$T/reference/test_reference_screen --gtest_filter=Screen.TightWrongScreensEqualAnIndependentRecount:Screen.ZeroMarginUnderestimateIsACountedWrongScreen"
  "j1-backward-dlse-sign-flipped|test_reference_backward|$T/reference/test_reference_backward --gtest_filter=Backward.LseGradientMatchesFormula"
  "j1-backward-dlse-sign-flipped|_core|$PYT tests/python/test_backward_cpu.py -k gradient_through_lse"
  "j2-backward-skipped-tile-gets-gradient|test_reference_backward|$T/reference/test_reference_backward --gtest_filter=Backward.SkipMatchesMaskedFormula"
  "j2-backward-skipped-tile-gets-gradient|_core|$PYT tests/python/test_backward_cpu.py -k skip_gradient_is_masked_softmax_gradient"
  "j3-backward-lse-over-all-keys|test_reference_backward|$T/reference/test_reference_backward --gtest_filter=Backward.WithoutLseComputesIt"
  "j3-backward-lse-over-all-keys|_core|$PYT tests/python/test_backward_cpu.py -k skip_gradient_is_masked_softmax_gradient"
  "j4-backward-gqa-dk-first-head-only|test_reference_backward|$T/reference/test_reference_backward --gtest_filter=Backward.DenseMatchesFormula"
  "j4-backward-gqa-dk-first-head-only|_core|$PYT tests/python/test_backward_cpu.py -k gradcheck_dense_gqa"
  "i1-skip-set-words-byte-order|test_reference_backward|$T/reference/test_reference_backward --gtest_filter=Backward.SkipSetWordsEqualTheSkipSet"
  "i2-skip-set-words-one-short-accepted|test_reference_backward|$T/reference/test_reference_backward --gtest_filter=Backward.SkipSetShapeAndErrors"
  "h3-v-dtype-error-names-k|_core|$PYT tests/python/test_errors_cpu.py -k test_mixed_dtypes"
  "g1-transformers-layer-index-ignored|_core|$PYT tests/python/test_transformers.py -k per_layer_settings_and_ignore_list"
  "g2-transformers-prefill-skip-dropped|_core|$PYT tests/python/test_transformers.py -k per_layer_settings_and_ignore_list"
  "g3-transformers-recorder-drops-skipped|_core|$PYT tests/python/test_transformers.py -k per_layer_settings_and_ignore_list"
  "g4-decode-accepts-q-len-9|_core|$PYT tests/python/test_decode_cpu.py -k q_len_8_is_the_largest_decode"
  "g5-config-gate-ignored|_core|$PYT tests/python/test_config_cpu.py -k config_drives_attention"
  "g6-config-prefill-uses-decode-fit|_core|$PYT tests/python/test_config_cpu.py -k config_drives_attention"
  "k1-reference-times-reciprocal-of-l|test_reference_seed|$T/reference/test_reference_seed --gtest_filter=SeedMax.SeedFarAboveARowOfAKeptGroupGivesItsSoftmax"
  "k2-ring-first-chunk-lse-minus-inf|_core|$PYT tests/python/test_diffusers_cp_cpu.py -k ring"
  "k3-ring-training-unseeded|_core|$PYT tests/python/test_diffusers_cp_cpu.py -k ring"
  "k4-ring-seed-own-tile-by-row|_core|$PYT tests/python/test_diffusers_cp_cpu.py -k ring"
  "k5-diffusers-training-falls-back|_core|$PYT tests/python/test_diffusers_cpu.py -k training_runs_through_blasst"
  "k6-transformers-short-training-decodes|_core|$PYT tests/python/test_transformers.py -k training_step_matches_sdpa"
)

SELECTED=("$@")
want() {
  [ ${#SELECTED[@]} -eq 0 ] && return 0
  local s; for s in "${SELECTED[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1
}
patched_files() { sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$1" | sort -u; }
# The first failing assertion of a gtest log (file:line, the message, the innermost trace) or the
# pytest summary lines, and the failed test names, on one line.
message() {
  { awk '/: Failure$/ && !f {f=1; n=split($1, a, "/"); print a[n]; next}
         f == 1 && /^Google Test trace:/ {f=2; next}
         f == 1 && (/: Failure$/ || /^\[/) {exit}
         f == 1 {if (++k <= 6) print; next}
         f == 2 {n=split($0, a, "/"); print "[" a[n] "]"; exit}' "$1"
    grep -E "^E  " "$1" | head -n 3
    grep -oE "^\[  FAILED  \] [A-Za-z0-9_.]+ \(|^FAILED [^ ]+" "$1" | sed 's/^\[  FAILED  \] /FAILED /; s/ ($//' |
      sort -u | head -n 4; } | tr -s ' \n' ' ' | cut -c1-400
}
run() {  # run LOG CMD... -> rc
  local log=$1; shift
  timeout 900 bash -c "$*" > "$log" 2>&1
}

names=()
for row in "${ROWS[@]}"; do
  n=${row%%|*}
  want "$n" || continue
  [[ " ${names[*]-} " == *" $n "* ]] || names+=("$n")
done
[ ${#names[@]} -gt 0 ] || { echo "cpu_mutants: nothing selected" >&2; exit 2; }

LINES=()
for n in "${names[@]}"; do
  p=$MUTDIR/$n.patch
  mapfile -t files < <(patched_files "$p")
  if ! git diff --quiet -- "${files[@]}"; then
    echo "cpu_mutants: local changes in ${files[*]}: refusing to apply $n" >&2; exit 2
  fi
  git apply --check "$p" || { LINES+=("$n | - | PATCH DID NOT APPLY | -"); continue; }
  rows=(); targets=()
  for row in "${ROWS[@]}"; do
    [ "${row%%|*}" = "$n" ] || continue
    rows+=("$row")
    IFS='|' read -r _ tg _ <<< "$row"
    targets+=($tg)
  done
  mapfile -t targets < <(printf '%s\n' "${targets[@]}" | sort -u)
  t0=$(date +%s)
  git apply "$p"
  trap 'git checkout -q -- "${files[@]}"; exit 130' INT TERM
  if ! ninja -C "$BUILD" -j "$JOBS" "${targets[@]}" > "$OUT/$n.build.log" 2>&1; then
    git checkout -q -- "${files[@]}"
    LINES+=("$n | - | MUTANT DID NOT BUILD ($OUT/$n.build.log) | -"); continue
  fi
  declare -a got=()
  i=0
  for row in "${rows[@]}"; do
    IFS='|' read -r _ _ cmd <<< "$row"
    run "$OUT/$n.$i.mutant.log" "$cmd"; rc=$?
    if [ $rc -eq 0 ]; then got[$i]="PASS <-- not caught"; else got[$i]="FAIL (rc=$rc): $(message "$OUT/$n.$i.mutant.log")"; fi
    i=$((i + 1))
  done
  git checkout -q -- "${files[@]}"
  trap - INT TERM
  ninja -C "$BUILD" -j "$JOBS" "${targets[@]}" > "$OUT/$n.restore.log" 2>&1 || { echo "cpu_mutants: restore build failed" >&2; exit 1; }
  i=0
  for row in "${rows[@]}"; do
    IFS='|' read -r _ _ cmd <<< "$row"
    run "$OUT/$n.$i.restored.log" "$cmd"; rc=$?
    after=$([ $rc -eq 0 ] && echo PASS || echo "FAIL (rc=$rc): $(message "$OUT/$n.$i.restored.log")")
    LINES+=("$n | ${cmd#"$PWD/"} | ${got[$i]} | $after")
    i=$((i + 1))
  done
  echo "cpu_mutants: $n done ($(( $(date +%s) - t0 )) s)" >&2
done
echo "mutant | test | on the mutant | after restore"
echo "--- | --- | --- | ---"
printf '%s\n' "${LINES[@]}"
