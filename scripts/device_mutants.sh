#!/usr/bin/env bash
# Mutation check of the GPU tests (issue 22): each patch in tests/mutants/gpu/ breaks one rule of
# the kernels' host or device code on purpose (the patch's first lines say which); this script
# applies it, rebuilds only the test target that must catch it (ninja, incremental), runs that
# test with --gtest_filter and BLASST_REQUIRE_GPU=1, expects a non-zero exit, and puts the tree
# and the build back exactly as they were. One table line per mutant:
#   mutant | test | expected FAIL | got
# A mutant that the test does NOT catch ("got PASS") is a weak test: report it, do not "fix" it here.
#
# Usage (on the GPU machine, tree configured and built in build/ as for the GPU tests):
#   scripts/device_mutants.sh                 # baseline run of each named test, then every mutant
#   scripts/device_mutants.sh NAME...         # only these mutants (file names without .patch)
# Env: BUILD_DIR (build), JOBS (nproc), OUT (/tmp/device_mutants: logs), BASELINE=0 skips the
# baseline runs, TEST_TIMEOUT (150 s per test run), START_BY_S (400: no mutant starts after that
# many seconds; the table says SKIPPED, run those by name in a second call).
#
# Restoring: the patched sources are copied (cp -p: content and mtime) before the patch and copied
# back after; the build outputs the mutant build overwrites (the objects whose recorded
# dependencies in ninja's deps log include a patched file, libblasst.a, the test binary) are
# stashed the same way and put back, so nothing is compiled twice (the prefill own-tile mutant
# patches a header of all 12 prefill kernel instantiations). Any other build file the mutant
# build wrote is detected (newer than a marker) and then the target is rebuilt from the restored
# sources instead (slower, same result; the table says so). Any exit (error, Ctrl-C) restores.
# Checked on the CPU build with TABLE_FILE/MUTDIR (below): outputs byte-identical afterwards, e.g.
#   echo 'a1-vote-one-row|test_reference_oracle|tests/reference/test_reference_oracle|Oracle.*' > /tmp/t
#   TABLE_FILE=/tmp/t MUTDIR=tests/mutants/cpu BUILD_DIR=build-cpu JOBS=2 scripts/device_mutants.sh
# The first step is a real `ninja -C $BUILD <targets>`: a no-op on a built tree ("preflight N s").
#
# CPU counterpart: scripts/cpu_mutants.sh with tests/mutants/cpu/*.patch (reference engine,
# calibration, `blasst` command, Python package).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
OUT=${OUT:-/tmp/device_mutants}
TEST_TIMEOUT=${TEST_TIMEOUT:-150}
START_BY_S=${START_BY_S:-400}  # no mutant starts later than this (a 10-minute command limit)
MUTDIR=${MUTDIR:-tests/mutants/gpu}
mkdir -p "$OUT"

# mutant name | ninja target | test binary (under the build dir) | gtest filter
# (the expensive one first: the start-by guard below then only ever postpones cheap ones)
TABLE=(
  "prefill-own-tile-minus-one|test_gpu_prefill_ref|tests/gpu_prefill/test_gpu_prefill_ref|GpuPrefillVsReference.MaxFirstSkipSets"
  "lambda-ge-1-not-dense|test_gpu_prefill|tests/gpu_prefill/test_gpu_prefill|GpuPrefill.SkipRaggedPerSequenceLambda"
  "decode-lambda-of-longest-sequence|test_gpu_decode|tests/gpu_decode/test_gpu_decode|GpuDecode.SkipMatchesReferenceFactorPerSequence"
  "prefill-vote-nan-skips|test_gpu_nan_rule|tests/gpu_prefill/test_gpu_nan_rule|GpuNanRule.NanKeyInASkippableTile"
  "decode-seeds-not-sink-and-last-tile|test_gpu_decode|tests/gpu_decode/test_gpu_decode|GpuDecode.SeededSplitsMatchReference"
  "prefill-nan-row-written-empty|test_gpu_nan_rule|tests/gpu_prefill/test_gpu_nan_rule|GpuNanRule.NanInOneQueryElementDense"
  "decode-vote-nan-skips|test_gpu_nan_rule|tests/gpu_prefill/test_gpu_nan_rule|GpuNanRule.DecodeNanKeyThroughTheSplitMerge"
  "decode-merge-nan-row-written-empty|test_gpu_nan_rule|tests/gpu_prefill/test_gpu_nan_rule|GpuNanRule.DecodeNanKeyThroughTheSplitMerge"
  "decode-merge-flags-not-lowered|test_gpu_decode|tests/gpu_decode/test_gpu_decode|GpuDecode.InKernelMergeAcrossCallsAndGraphReplays"
  "decode-merge-epoch-ignored|test_gpu_decode|tests/gpu_decode/test_gpu_decode|GpuDecode.InKernelMergeAcrossCallsAndGraphReplays"
  "decode-epilogue-reciprocal|test_gpu_decode|tests/gpu_decode/test_gpu_decode|GpuDecode.SeededSplitSubnormalRowSum"
  "backward-skip-set-ignored|test_gpu_backward|tests/gpu_backward/test_gpu_backward|GpuBackward.SkipSetMatchesReference"
  "backward-removed-block-by-first-head|test_gpu_backward|tests/gpu_backward/test_gpu_backward|GpuBackward.SkipSetMatchesReference"
  "backward-kept-walk-off-by-one|test_gpu_backward|tests/gpu_backward/test_gpu_backward|GpuBackward.SkipSetMatchesReference"
  "backward-step-half-not-masked|test_gpu_backward|tests/gpu_backward/test_gpu_backward|GpuBackward.SkipSetMatchesReference"
  "backward-causal-mask-last-row|test_gpu_backward|tests/gpu_backward/test_gpu_backward|GpuBackward.GroupedQueryHeads"
  "backward-split-sum-drops-part|test_gpu_backward|tests/gpu_backward/test_gpu_backward|GpuBackward.WorkListSplitBlocksMatchReference"
  "backward-work-list-drops-item|test_gpu_backward|tests/gpu_backward/test_gpu_backward|GpuBackward.WorkListCoversAndOrders"
  "backward-lse-rows-unpadded|test_gpu_backward|tests/gpu_backward/test_gpu_backward|GpuBackward.RaggedBatch:GpuBackward.BatchHeadDimsAndDtypes"
)

# TABLE_FILE=path: another table, same four fields per line (with MUTDIR: a dry run of this
# script's apply / stash / restore steps on a CPU build, e.g. with tests/mutants/cpu patches).
if [ -n "${TABLE_FILE:-}" ]; then mapfile -t TABLE < <(grep -vE '^\s*(#|$)' "$TABLE_FILE"); fi

if [ ! -f "$BUILD/build.ninja" ]; then
  echo "device_mutants: $BUILD/build.ninja not found: configure and build the tree first (BUILD_DIR=...)" >&2
  exit 2
fi

# patch(1) first: the tree on the GPU machine may be a copy without a usable .git (a worktree's
# .git file points outside it, and git then refuses to run); strict: no fuzz, no backup files.
apply_patch() {
  if command -v patch >/dev/null 2>&1; then patch -s -p1 -F0 --no-backup-if-mismatch < "$1"; else git apply "$1"; fi
}
check_patch() {
  if command -v patch >/dev/null 2>&1; then patch -s -p1 -F0 --dry-run < "$1" > /dev/null; else git apply --check "$1"; fi
}
patched_files() { sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$1" | sort -u; }

STASH=""
LEFT=0
restore() {  # puts the sources and the stashed build outputs back; safe to call twice
  [ -n "$STASH" ] || return 0
  if [ -d "$STASH/src" ]; then (cd "$STASH/src" && find . -type f -print0) | while IFS= read -r -d '' f; do
    cp -p "$STASH/src/$f" "$ROOT/$f"; done; fi
  if [ -d "$STASH/build" ]; then (cd "$STASH/build" && find . -type f -print0) | while IFS= read -r -d '' f; do
    cp -p "$STASH/build/$f" "$ROOT/$BUILD/$f"; done; fi
  # Build outputs written by the mutant build that were not stashed (ninja's own logs and the
  # test lists of gtest_discover_tests aside): they would keep the mutant, so rebuild from the
  # restored sources instead (touch: newer than those outputs).
  LEFT=0
  if [ -f "$STASH/marker" ]; then
    LEFT=$(find "$ROOT/$BUILD" -type f -newer "$STASH/marker" ! -name .ninja_log ! -name .ninja_deps \
             ! -name '*_tests.cmake' ! -name '*_include.cmake' ! -path '*/Testing/*' ! -name 'cmake.verify_globs' | wc -l)
    if [ "$LEFT" -gt 0 ] && [ -d "$STASH/src" ]; then
      (cd "$STASH/src" && find . -type f -print0) | while IFS= read -r -d '' f; do touch "$ROOT/$f"; done
    fi
  fi
  rm -rf "$STASH"
  STASH=""
}
trap 'restore' EXIT
trap 'echo "device_mutants: interrupted, tree restored" >&2; restore; exit 130' INT TERM

# Objects whose dependencies in ninja's deps log (the source and every header it read) include
# one of the given files (paths relative to the tree): what a patch of those files recompiles.
dependents() {
  ninja -C "$BUILD" -t deps 2>/dev/null | awk -v files="$*" '
    BEGIN { n = split(files, f, " ") }
    /^[^ \t]/ { obj = $1; sub(/:$/, "", obj); next }
    NF { d = $1
         for (i = 1; i <= n; i++) { s = "/" f[i]
           if (d == f[i] || (length(d) > length(s) && substr(d, length(d) - length(s) + 1) == s)) { print obj; break } } }' |
    sort -u
}
# 0: ninja has nothing to do for the targets; 1: it has; 2: unknown (a dry run of a tree with
# CONFIGURE_DEPENDS globs stops at "Re-running CMake").
dry_state() {
  local out; out=$(ninja -C "$BUILD" -n "$@" 2>&1)
  if grep -q "Re-running CMake" <<< "$out"; then return 2; fi
  if grep -qE "^\[[0-9]+/[0-9]+\] (Building|Linking)" <<< "$out"; then return 1; fi
  return 0
}

run_test() {  # run_test BINARY FILTER LOG -> rc
  BLASST_REQUIRE_GPU=1 timeout "$TEST_TIMEOUT" "$BUILD/$1" --gtest_filter="$2" --gtest_color=no > "$3" 2>&1
}
first_failures() {  # the first failing assertion (file:line, message, innermost trace), failed tests
  { awk '/: Failure$/ && !f {f=1; n=split($1, a, "/"); print a[n]; next}
         f == 1 && /^Google Test trace:/ {f=2; next}
         f == 1 && (/: Failure$/ || /^\[/) {exit}
         f == 1 {if (++k <= 6) print; next}
         f == 2 {n=split($0, a, "/"); print "[" a[n] "]"; exit}' "$1"
    grep -oE "^\[  FAILED  \] [A-Za-z0-9_.]+ \(" "$1" | sed 's/^\[  FAILED  \] /FAILED /; s/ ($//' | sort -u | head -n 4
  } | tr -s ' \n' ' ' | cut -c1-400
}

SELECTED=("$@")
want() {
  [ ${#SELECTED[@]} -eq 0 ] && return 0
  local s; for s in "${SELECTED[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1
}

# ---- preflight: every patch applies, the targets are up to date ------------------------------
targets=()
for row in "${TABLE[@]}"; do
  IFS='|' read -r name target bin filter <<< "$row"
  want "$name" || continue
  [ -f "$MUTDIR/$name.patch" ] || { echo "device_mutants: $MUTDIR/$name.patch missing" >&2; exit 2; }
  check_patch "$MUTDIR/$name.patch" || { echo "device_mutants: $name.patch does not apply to this tree" >&2; exit 2; }
  ninja -C "$BUILD" -t query "$target" > /dev/null 2>&1 || { echo "device_mutants: no ninja target $target in $BUILD" >&2; exit 2; }
  targets+=("$target")
done
[ ${#targets[@]} -gt 0 ] || { echo "device_mutants: no mutant selected (known: $(printf '%s ' "${TABLE[@]%%|*}"))" >&2; exit 2; }
mapfile -t targets < <(printf '%s\n' "${targets[@]}" | sort -u)
t0=$(date +%s)
# A real (incremental) build: a no-op when the tree is built; a dry run cannot tell in a tree
# with CONFIGURE_DEPENDS globs.
ninja -C "$BUILD" -j "$JOBS" "${targets[@]}" > "$OUT/build-baseline.log" 2>&1 ||
  { tail -30 "$OUT/build-baseline.log"; exit 2; }
echo "device_mutants: preflight $(( $(date +%s) - t0 )) s; logs in $OUT"

LINES=()
DETAILS=()
REBUILT=()
LIB=${LIB:-libblasst.a}  # the library every test links (under the build dir)
# ---- baseline: the targeted tests pass on the unmodified tree --------------------------------
if [ "${BASELINE:-1}" != 0 ]; then
  declare -A seen=()
  for row in "${TABLE[@]}"; do
    IFS='|' read -r name target bin filter <<< "$row"
    want "$name" || continue
    [ -n "${seen[$filter]:-}" ] && continue
    seen[$filter]=1
    t1=$(date +%s)
    run_test "$bin" "$filter" "$OUT/baseline-${filter}.log"
    rc=$?
    got=$([ $rc -eq 0 ] && echo PASS || echo "FAIL (rc=$rc)")
    LINES+=("(none: baseline) | $filter | expected PASS | $got | test $(( $(date +%s) - t1 )) s")
    [ $rc -eq 0 ] || DETAILS+=("baseline $filter: $(first_failures "$OUT/baseline-${filter}.log")")
  done
fi

# ---- mutants ---------------------------------------------------------------------------------
for row in "${TABLE[@]}"; do
  IFS='|' read -r name target bin filter <<< "$row"
  want "$name" || continue
  p="$MUTDIR/$name.patch"
  log="$OUT/$name"
  t1=$(date +%s)
  if [ $(( t1 - t0 )) -ge "$START_BY_S" ]; then
    LINES+=("$name | $filter | expected FAIL | SKIPPED (past START_BY_S=$START_BY_S s: run \`scripts/device_mutants.sh $name\`)")
    continue
  fi
  STASH=$(mktemp -d "${TMPDIR:-/tmp}/mutant-stash.XXXXXX")
  mapfile -t files < <(patched_files "$p")
  for f in "${files[@]}"; do mkdir -p "$STASH/src/$(dirname "$f")"; cp -p "$f" "$STASH/src/$f"; done
  # Stash what the mutant build overwrites: the objects that depend on the patched files, the
  # library and the test binary.
  outs=("$LIB" "$bin")
  mapfile -t -O 2 outs < <(dependents "${files[@]}")
  for o in "${outs[@]}"; do
    [ -f "$BUILD/$o" ] || continue
    mkdir -p "$STASH/build/$(dirname "$o")"
    cp -p "$BUILD/$o" "$STASH/build/$o"
  done
  n_out=$(find "$STASH/build" -type f 2>/dev/null | wc -l)
  if ! apply_patch "$p"; then
    restore
    LINES+=("$name | $filter | expected FAIL | PATCH DID NOT APPLY")
    continue
  fi
  sleep 1; touch "$STASH/marker"; sleep 1
  if ! ninja -C "$BUILD" -j "$JOBS" "$target" > "$log.build.log" 2>&1; then
    restore
    LINES+=("$name | $filter | expected FAIL | MUTANT DID NOT BUILD (see $log.build.log) | build $(( $(date +%s) - t1 )) s")
    [ "$LEFT" -gt 0 ] && ninja -C "$BUILD" -j "$JOBS" "${targets[@]}" > "$log.restore.log" 2>&1
    continue
  fi
  n_built=$(grep -cE "^\[[0-9]+/[0-9]+\] (Building|Linking)" "$log.build.log")
  if ! grep -qE "^\[[0-9]+/[0-9]+\] Building" "$log.build.log"; then
    # ninja compiled nothing: the mutant is not in the binary, a PASS would mean nothing
    restore
    LINES+=("$name | $filter | expected FAIL | NOT COMPILED (ninja saw no changed input; see $log.build.log)")
    continue
  fi
  t2=$(date +%s)
  run_test "$bin" "$filter" "$log.test.log"
  rc=$?
  t3=$(date +%s)
  restore
  restored="$n_built steps built, $n_out outputs restored"
  if [ "$LEFT" -gt 0 ]; then
    REBUILT+=("$name")
    # every selected target: the rebuilt library is newer than the other test binaries
    ninja -C "$BUILD" -j "$JOBS" "${targets[@]}" > "$log.restore.log" 2>&1 &&
      restored="$n_built steps built; restore REBUILT ($LEFT outputs not stashed)" ||
      restored="RESTORE BUILD FAILED (see $log.restore.log)"
  fi
  t4=$(date +%s)
  case $rc in
    0) got="PASS  <-- the test did not catch the mutant" ;;
    124|137) got="TIMEOUT (rc=$rc)" ;;
    *) got="FAIL (rc=$rc)" ;;
  esac
  LINES+=("$name | $filter | expected FAIL | $got | build $(( t2 - t1 )) s, test $(( t3 - t2 )) s, restore $(( t4 - t3 )) s, $restored")
  [ $rc -ne 0 ] && DETAILS+=("$name: $(first_failures "$log.test.log")")
done

# ---- the tree is as before -------------------------------------------------------------------
dry_state "${targets[@]}"
case $? in
  0) final="ninja: no work left for ${targets[*]}" ;;
  1) final="WARNING: ninja has work left for ${targets[*]}" ;;
  *) final="(ninja dry run not conclusive here: CONFIGURE_DEPENDS globs)" ;;
esac
[ ${#REBUILT[@]} -gt 0 ] && final="$final; restored by a rebuild: ${REBUILT[*]}"
echo
echo "mutant | test | expected | got | time"
echo "--- | --- | --- | --- | ---"
printf '%s\n' "${LINES[@]}"
echo
echo "first failing assertions (full logs: $OUT):"
printf '  %s\n' "${DETAILS[@]}"
echo "total $(( $(date +%s) - t0 )) s; $final"
