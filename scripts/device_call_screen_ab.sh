#!/usr/bin/env bash
# One device call: a pending patch of the FP8 screen (issue 19 part 2) against this tree on the same
# machine. PATCH=scripts/probes/pending/<name>.patch (required).
# 1. two trimmed copies of this tree (bf16 prefill instances only, so that both build side by side
#    in ~1-2 min), .ab/base and .ab/new (+ the patch), built with -lineinfo; with PROBE=<file.cu>
#    beside them that probe, built with nvcc and run first;
# 2. the patched tree: test_gpu_prefill_screen (strict equal to the plain skip kernel, in the loop and
#    ahead; the crafted wrong-screen case), the test binaries named in EXTRA_TESTS (paths under the
#    build folder; their targets are built too) and the CPU reference's screen suite, then
#    compute-sanitizer memcheck and racecheck on the crafted case;
# 3. ncu kernel durations of both trees at the DiT shape (bench/prefill/profile_screen.py: dit B 1
#    H 40 L 32760 d 128, max-first, 90 % target), strict and tight ahead: quantisation, pre-pass and
#    pass each;
# 4. bench_prefill.py --screen on both trees;
# 5. with the time left, ncu's full set with source on one launch of each tree's kernel NCU_KERNEL
#    (a regex; default the pre-pass; NCU_NAME_BASE=demangled matches template arguments too, e.g.
#    NCU_KERNEL='KernelVariant.6>' for the skip_ahead pass, KernelVariant 6) at tight 90 %, as $OUT/ab_<tree>.ncu-rep
#    for scripts/ncurep_dump.py.
# QUICK=1 (a short budget): no reference suite, no sanitizers, ncu of the tight margin only;
# LIMIT_S (default 575) bounds the optional steps. Logs under /tmp/ldb, packed into $OUT/logs.tgz
# after each step; short tables on stdout. Carry .deps/cutlass, .deps/include and .deps/googletest.
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/ldb; rm -rf $L; mkdir -p $L
left() { echo $((${LIMIT_S:-575} - ($(date +%s) - S))); }
pk() { tar czf "${OUT:-/tmp}/logs.tgz" -C /tmp ldb; }
[ -n "${PATCH:-}" ] && [ -f "$PATCH" ] || { echo "PATCH=<pending patch> is required"; exit 1; }
P=$(readlink -f "$PATCH")
for t in base new; do
  rm -rf .ab/$t && mkdir -p .ab/$t
  tar --exclude=./.ab --exclude='./build*' --exclude=./.deps --exclude=./.git -cf - . | tar -xf - -C .ab/$t
  grep -v -E '^BLASST_(DECODE|BACKWARD)_KERNEL|^BLASST_PREFILL_KERNEL\(f16' src/cuda/sm90/kernel_table.inc \
    > .ab/$t/src/cuda/sm90/kernel_table.inc
  ln -s "$PWD/.deps" .ab/$t/.deps
done
# (git apply inside .ab/new would find this tree's repository and skip the paths: stop its search)
apply() { if command -v patch > /dev/null; then patch -p1 < "$1"; else GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply "$1"; fi; }
(cd .ab/new && apply "$P") > $L/apply.log 2>&1 || { echo "the patch does not apply"; cat $L/apply.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/gpu.txt
T="test_gpu_prefill_screen blasst_prefill_bench test_reference_screen $(for e in ${EXTRA_TESTS:-}; do basename "$e"; done)"
for t in base new; do
  tt=$T; [ $t = base ] && tt="test_gpu_prefill_screen blasst_prefill_bench"
  ( cmake -S .ab/$t -B build-$t -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=OFF -DBLASST_BUILD_CLI=OFF \
      -DCMAKE_CUDA_FLAGS=-lineinfo -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" \
      > $L/build_$t.log 2>&1 &&
    cmake --build build-$t -j 6 --target $tt >> $L/build_$t.log 2>&1; echo "build $t rc=$?" >> $L/build_rc.txt ) &
done
if [ -n "${PROBE:-}" ]; then
  ( nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I include -I .deps/cutlass/include \
      -I "$(dirname "$(dirname "$(command -v nvcc)")")/include/cccl" -o /tmp/ab_probe "$PROBE" \
      > $L/probe_build.log 2>&1; echo "probe build rc=$?" >> $L/build_rc.txt ) &
fi
wait; cat $L/build_rc.txt; echo "t=$(($(date +%s) - S))"; grep -hE "error|spill" $L/build_*.log | grep -v " 0 bytes spill" | head
pk
if [ -n "${PROBE:-}" ]; then timeout 30 /tmp/ab_probe > $L/probe.log 2>&1; echo "probe $PROBE rc=$?"; cat $L/probe.log; fi
if [ "${QUICK:-0}" != 1 ]; then
  timeout 60 build-new/tests/reference/test_reference_screen > $L/test_ref.log 2>&1
  echo "reference screen suite (patched) rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/test_ref.log | tr '\n' ' ')"
fi
export BLASST_REQUIRE_GPU=1
for e in ${EXTRA_TESTS:-}; do
  timeout 120 build-new/$e > $L/$(basename "$e").log 2>&1
  echo "$e (patched) rc=$? $(grep -E '^\[  (PASSED|FAILED)|Failure' $L/$(basename "$e").log | head -4 | tr '\n' ' ')"
done
timeout 150 build-new/tests/gpu_prefill/test_gpu_prefill_screen > $L/test_screen.log 2>&1
echo "screen suite (patched) rc=$?"; grep -E "^\[ahead\]|OK \]|FAILED|Failure" $L/test_screen.log | head -30; echo "t=$(($(date +%s) - S))"
[ "${QUICK:-0}" = 1 ] && SAN="" || SAN="memcheck racecheck"
for tool in $SAN; do
  timeout 45 compute-sanitizer --tool $tool --error-exitcode 9 build-new/tests/gpu_prefill/test_gpu_prefill_screen \
    --gtest_filter=GpuPrefillScreen.WrongScreensOfTightZeroAreCounted > $L/san_$tool.log 2>&1
  echo "$tool (patched, crafted case): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/san_$tool.log | head -1)"
done
pk
for t in new base; do
  LIB=$(find build-$t -name libblasst_prefill_bench.so | head -1)
  for m in $([ "${QUICK:-0}" = 1 ] && echo 6 || echo 5 6); do
    timeout 70 ncu --metrics gpu__time_duration.sum --csv python3 bench/prefill/profile_screen.py $LIB 32760 1 $m 0.9 \
      > $L/ncu_${t}_$m.csv 2>&1
    echo "ncu $t margin $m rc=$?"
    grep -E '"gpu__time' $L/ncu_${t}_$m.csv | grep blasst | awk -F'","' '{n=$5; sub(/\(.*/,"",n); print n, $NF}' |
      sed -e 's/blasst::\|sm90::\|prefill::\|<unnamed>::\|cutlass:://g' -e 's/"//g'
  done
  pk
done
echo "t=$(($(date +%s) - S))"
for t in new base; do
  R=$(left); [ $R -gt 170 ] && R=170
  [ $R -gt 40 ] && timeout $R python3 bench/prefill/bench_prefill.py --screen \
    --lib $(find build-$t -name libblasst_prefill_bench.so | head -1) --out $L/screen_$t > $L/screen_$t.log 2>&1
  echo "screen bench $t rc=$? t=$(($(date +%s) - S))"; cat $L/screen_$t/*.md 2>/dev/null | tail -4
  pk
done
for t in new base; do
  R=$(left)
  [ $R -gt 50 ] || break
  timeout $((R - 10)) ncu --set full --import-source yes --kernel-name-base "${NCU_NAME_BASE:-function}" \
    -k "regex:${NCU_KERNEL:-screen_ahead_kernel}" --launch-count 1 \
    -o "${OUT:-/tmp}/ab_$t" --force-overwrite \
    python3 bench/prefill/profile_screen.py $(find build-$t -name libblasst_prefill_bench.so | head -1) 32760 1 6 0.9 \
    > $L/ncu_full_$t.log 2>&1
  echo "ncu full $t rc=$? t=$(($(date +%s) - S))"; tail -1 $L/ncu_full_$t.log
  pk
done
