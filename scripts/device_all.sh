#!/usr/bin/env bash
# Everything on the GPU machine in one call: build the whole project with the sm_90a kernels and
# the Python extension, run every GoogleTest suite (GPU suites included), the decode suite with the
# cp.async load path, the Python GPU tests and examples, compute-sanitizer (memcheck, racecheck) on
# the small sanitizer suites, and, when a baseline tree sits in .baseline/, the before/after
# benchmark; optionally GPU mutants (MUTANTS="name ...") and the eager host overhead (EAGER=1).
# Logs under $OUT; a short table last. Full benchmarks: scripts/device_{prefill,decode}.sh.
# Carry .deps/cutlass, .deps/include and .deps/googletest (scripts/bootstrap.sh makes them), and
# .deps/wheels for the diffusers tests (scripts/device_wheels.sh makes it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_all}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-device}
SUMMARY=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/gpu.txt" 2>&1

t0=$(date +%s)
# LINEINFO=1: -lineinfo, so that the sanitizers name source lines.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=ON \
  ${LINEINFO:+-DCMAKE_CUDA_FLAGS=-lineinfo} -DPython_EXECUTABLE="$(command -v python3)" > "$OUT/build.log" 2>&1 &&
  cmake --build "$BUILD" -j "$(nproc)" >> "$OUT/build.log" 2>&1
rc=$?
SUMMARY+=("build: rc=$rc ($(( $(date +%s) - t0 )) s)")
if [ $rc -ne 0 ]; then grep -E "error|FAILED" "$OUT/build.log" | head -40; printf '%s\n' "${SUMMARY[@]}"; exit 1; fi

# A GPU suite that finds no GPU fails here instead of skipping (tests/gpu_common.hpp). A hung kernel
# costs one test CTEST_PER_TEST_S seconds, not the whole ctest run.
export BLASST_REQUIRE_GPU=1
# CTEST=0 leaves the GoogleTest suites out; DECODE_VARIANTS=0 the decode suite's extra load paths.
if [ "${CTEST:-1}" = 1 ]; then
t0=$(date +%s)
timeout ${CTEST_TIMEOUT:-240} ctest --test-dir "$BUILD" -j 4 --timeout ${CTEST_PER_TEST_S:-200} --output-on-failure > "$OUT/ctest.log" 2>&1
rc=$?
SUMMARY+=("ctest: rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E 'tests passed' "$OUT/ctest.log")")
SUMMARY+=("  skipped: $(grep -c '(Skipped)' "$OUT/ctest.log")  failed: $(grep -E '\(Failed\)|\(Timeout\)|Exception' "$OUT/ctest.log" | tr '\n' ' ')")
else
  touch "$OUT/ctest.log"; SUMMARY+=("ctest: left out (CTEST=0)")
fi

# Python wheels the GPU machine lacks (it has no network): carried in .deps/wheels (made here with
# scripts/device_wheels.sh: diffusers at the pin, importlib_metadata, zipp, pillow for py3.12), each
# installed only when its module is missing.
if [ -d .deps/wheels ]; then
  for w in .deps/wheels/*.whl; do
    mod=$(basename "$w" | cut -d- -f1 | tr 'A-Z' 'a-z'); [ "$mod" = pillow ] && mod=PIL
    python3 -c "import $mod" 2>/dev/null ||
      python3 -m pip install -q --no-deps --no-index "$w" >> "$OUT/wheels.log" 2>&1
  done
  SUMMARY+=("wheels: $(python3 -c 'import diffusers; print("diffusers", diffusers.__version__)' 2>&1 | tail -1)")
fi

# PYTEST=0 leaves the Python GPU tests and the example out (e.g. when the package did not change);
# PYTEST_FILES="..." runs those files in that order instead of tests/python (e.g. the files a timed-out
# run did not reach, first).
if [ "${PYTEST:-1}" = 1 ]; then
  t0=$(date +%s)
  export PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" BLASST_REQUIRE_GPU=1
  timeout ${PYTEST_TIMEOUT:-330} python3 -m pytest -p no:cacheprovider -q -rs ${PYTEST_FILES:-tests/python} > "$OUT/pytest.log" 2>&1
  rc=$?
  SUMMARY+=("pytest (GPU required): rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/pytest.log")")
  timeout 60 python3 python/examples/denoise_loop.py --cuda --steps 8 > "$OUT/examples.log" 2>&1
  SUMMARY+=("example denoise_loop: rc=$?")
else
  touch "$OUT/pytest.log"; SUMMARY+=("pytest: left out (PYTEST=0)")
fi

if [ "${DECODE_VARIANTS:-1}" = 1 ]; then
# The decode suite again with the cp.async load path (the fallback for layouts a tensor map cannot
# describe; the test routes its calls through it: tests/gpu_decode).
t0=$(date +%s)
BLASST_TEST_DECODE_LOADS=cpasync timeout ${CPASYNC_TIMEOUT:-120} "$BUILD/tests/gpu_decode/test_gpu_decode" \
  --gtest_brief=1 > "$OUT/decode_cpasync.log" 2>&1
SUMMARY+=("decode tests, cp.async loads: rc=$? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/decode_cpasync.log" | tr '\n' ' ')")

# The decode suite again with the 4-warp family forced (two CTAs per SM; the library picks it for
# long caches only: tests/gpu_decode's BLASST_TEST_DECODE_WARPS hook).
t0=$(date +%s)
BLASST_TEST_DECODE_WARPS=4 timeout ${CPASYNC_TIMEOUT:-120} "$BUILD/tests/gpu_decode/test_gpu_decode" \
  --gtest_brief=1 > "$OUT/decode_w4.log" 2>&1
SUMMARY+=("decode tests, 4-warp family: rc=$? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/decode_w4.log" | tr '\n' ' ')")
t0=$(date +%s)
BLASST_TEST_DECODE_WARPS=4 BLASST_TEST_DECODE_LOADS=cpasync timeout ${CPASYNC_TIMEOUT:-120} \
  "$BUILD/tests/gpu_decode/test_gpu_decode" --gtest_brief=1 > "$OUT/decode_w4_cpasync.log" 2>&1
SUMMARY+=("decode tests, 4-warp family with cp.async loads: rc=$? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/decode_w4_cpasync.log" | tr '\n' ' ')")
fi

# compute-sanitizer on the small sanitizer suites of the kernels (SANITIZE=0 skips them; SAN_SUITES
# picks some of decode, prefill, backward). Each racecheck hazard's report lines are counted by site
# in sanitizer_sites.txt (source lines with LINEINFO=1).
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    for suite in "gpu_decode/test_gpu_decode GpuDecodeSanitizer.* decode" "gpu_prefill/test_gpu_prefill GpuPrefillSanitizer.* prefill" \
                 "gpu_backward/test_gpu_backward GpuBackwardSanitizer.* backward"; do
      set -- $suite
      case " ${SAN_SUITES:-decode prefill backward} " in *" $3 "*) ;; *) continue ;; esac
      t0=$(date +%s)
      timeout ${SAN_TIMEOUT_S:-90} compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/tests/$1" \
        --gtest_filter="$2" > "$OUT/sanitizer_${tool}_$(basename "$1").log" 2>&1
      SUMMARY+=("compute-sanitizer $tool $2: rc=$? ($(( $(date +%s) - t0 )) s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_${tool}_$(basename "$1").log" | head -1)")
      { echo "== $tool $2"; grep -E "hazard detected| Thread " "$OUT/sanitizer_${tool}_$(basename "$1").log" |
          sed -E 's/0x[0-9a-f]+/0x_/g; s/\([0-9]+,[0-9]+,[0-9]+\)/(_)/g' | sort | uniq -c | sort -rn | head -40; } >> "$OUT/sanitizer_sites.txt"
    done
  done
fi

# Before/after speed against a baseline tree in .baseline/ (carried; e.g. `git archive <rev> | tar
# -x -C .baseline`): both builds' bench libraries timed in one process (scripts/device_ab.sh).
if [ -d .baseline ] && [ "${AB:-1}" = 1 ]; then
  t0=$(date +%s)
  OUT="$OUT" NEW_BUILD="$BUILD" AB_TIMEOUT_S=${AB_TIMEOUT_S:-240} scripts/device_ab.sh .baseline \
    --rounds ${AB_ROUNDS:-6} > "$OUT/ab.log" 2>&1
  SUMMARY+=("before/after benchmark: rc=$? ($(( $(date +%s) - t0 )) s), table in ab_compare.md")
fi

# MUTANTS="name ...": those GPU mutants on this build (scripts/device_mutants.sh; the tree and the
# build are restored after each). EAGER=1: the host overhead of eager calls and the 3-shape decode
# eager/graph table (scripts/device_eager.sh, QUICK=1) on this build.
if [ -n "${MUTANTS:-}" ]; then
  t0=$(date +%s)
  OUT="$OUT/mutants" BUILD_DIR="$BUILD" timeout ${MUT_TIMEOUT_S:-300} scripts/device_mutants.sh $MUTANTS \
    > "$OUT/mutants.log" 2>&1
  SUMMARY+=("mutants ($MUTANTS): rc=$? ($(( $(date +%s) - t0 )) s): $(grep -c 'did not catch' "$OUT/mutants.log") not caught")
fi
if [ "${EAGER:-0}" = 1 ]; then
  t0=$(date +%s)
  OUT="$OUT" BUILD_DIR="$BUILD" QUICK=1 timeout ${EAGER_TIMEOUT_S:-150} scripts/device_eager.sh > "$OUT/eager.log" 2>&1
  SUMMARY+=("eager host overhead: rc=$? ($(( $(date +%s) - t0 )) s), tables in eager.log")
fi

# The device tool returns a handful of files: the sanitizer and wheel logs travel packed.
# (ls fails when a name is missing, e.g. no wheels.log: under pipefail that used to skip the rm and
# leave too many files to come back.)
(cd "$OUT" && { ls sanitizer_*.log wheels.log 2> /dev/null || true; } | tar czf logs.tgz -T - && rm -f sanitizer_*.log wheels.log)

echo "==== failures (if any)"
grep -E "FAILED|Failure|Error" "$OUT/ctest.log" "$OUT/pytest.log" | head -30
echo "==== summary ($(cat "$OUT/gpu.txt"))"
printf '%s\n' "${SUMMARY[@]}"
