#!/usr/bin/env bash
# Every mutant patch (tests/mutants/{cpu,gpu}/*.patch, used by scripts/cpu_mutants.sh and
# scripts/device_mutants.sh) must still apply to the sources: a patch that no longer applies is a
# mutation check that silently stopped running. Run by ctest (Mutants.PatchesApply); exit 77
# (skipped) when git is not installed.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v git >/dev/null 2>&1 || { echo "git not installed: skipped"; exit 77; }
bad=0 n=0
for f in tests/mutants/cpu/*.patch tests/mutants/gpu/*.patch; do
  n=$((n + 1))
  if ! out=$(git apply --check "$f" 2>&1); then
    echo "does not apply: $f"; echo "$out" | head -3; bad=$((bad + 1))
  fi
done
echo "$n mutant patches, $bad do not apply"
[ "$n" -gt 0 ] && [ "$bad" -eq 0 ]
