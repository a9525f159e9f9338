#!/usr/bin/env bash
# One device call for scripts/probes/pending/screen-ahead-f16.patch (issue 19 part 2): the
# screen-ahead pre-pass accumulating in f16 with packed-pair maxima, the screen codes within +-16
# (so that f16 cannot overflow), the tight margin's sqrt without its slow path; against this tree
# on the same machine.
# 1. two trimmed copies of this tree (bf16 prefill instances only), .ab/base and .ab/f16 (+ the
#    patch), built side by side with -lineinfo, and the CPU reference's screen suite of the patched
#    tree (its crafted cases were re-derived for the new codes); beside them
#    scripts/probes/f16_qgmma_rounding.cu: the f16-accumulated FP8 wgmma against exact sums, to
#    check the accumulation term the patch puts in the margin;
# 2. the patched tree: test_gpu_prefill_screen (strict ahead equal to the plain skip kernel: the
#    check of the f16 accumulation term; the crafted wrong-screen case), compute-sanitizer memcheck
#    and racecheck on the crafted case;
# 3. ncu kernel durations of both trees at the DiT shape, 90 % target, strict and tight ahead
#    (bench/prefill/profile_screen.py): pre-pass 11.51 / 12.57 ms on an H100 (a530ddd);
#    predicted with the patch: 9-10.5 ms (the loop's ~257 SASS per warp and step -> ~205);
# 4. bench_prefill.py --screen on both trees (ahead tight at 90 %: 1.63x -> 1.75-1.9x predicted);
# 5. with the time left, ncu's full set with source on one launch of each tree's pre-pass (tight,
#    90 %), as $OUT/ahead_<tree>.ncu-rep for scripts/ncurep_dump.py.
# QUICK=1 (a short budget): no reference suite, no sanitizers, ncu of the tight margin only.
# Logs under /tmp/ldb, packed into $OUT/logs.tgz after each step; short tables on stdout.
# Carry .deps/cutlass, .deps/include and .deps/googletest.
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/ldb; rm -rf $L; mkdir -p $L
left() { echo $((${LIMIT_S:-575} - ($(date +%s) - S))); }
pk() { tar czf "${OUT:-/tmp}/logs.tgz" -C /tmp ldb; }
P=$PWD/scripts/probes/pending/screen-ahead-f16.patch
# Two copies with kernel_table.inc cut to the bf16 prefill lines (all the test and the bench use),
# so that both build side by side in ~1-2 min: .ab/base (this tree) and .ab/f16 (+ the patch).
for t in base f16; do
  rm -rf .ab/$t && mkdir -p .ab/$t
  tar --exclude=./.ab --exclude='./build*' --exclude=./.deps --exclude=./.git -cf - . | tar -xf - -C .ab/$t
  grep -v -E '^BLASST_(DECODE|BACKWARD)_KERNEL|^BLASST_PREFILL_KERNEL\(f16' src/cuda/sm90/kernel_table.inc \
    > .ab/$t/src/cuda/sm90/kernel_table.inc
  ln -s "$PWD/.deps" .ab/$t/.deps
done
A=.ab/f16
# (git apply inside .ab/f16 would find this tree's repository and skip the paths: stop its search)
apply() { if command -v patch > /dev/null; then patch -p1 < "$1"; else GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply "$1"; fi; }
(cd $A && apply "$P") > $L/apply.log 2>&1 && grep -q half_tile_max $A/src/cuda/sm90/prefill/prefill_screen_ahead.cu ||
  { echo "the patch does not apply"; cat $L/apply.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/gpu.txt
T="test_gpu_prefill_screen blasst_prefill_bench test_reference_screen"
for t in base f16; do
  src=.ab/$t
  ( cmake -S $src -B build-$t -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=OFF -DBLASST_BUILD_CLI=OFF -DCMAKE_CUDA_FLAGS=-lineinfo \
      -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" > $L/build_$t.log 2>&1 &&
    cmake --build build-$t -j 6 --target $T >> $L/build_$t.log 2>&1; echo "build $t rc=$?" >> $L/build_rc.txt ) &
done
( nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I include -I .deps/cutlass/include \
    -I "$(dirname "$(dirname "$(command -v nvcc)")")/include/cccl" -o /tmp/f16probe scripts/probes/f16_qgmma_rounding.cu \
    > $L/probe_build.log 2>&1; echo "probe build rc=$?" >> $L/build_rc.txt ) &
wait; cat $L/build_rc.txt; echo "t=$(($(date +%s) - S))"; grep -hE "error|spill" $L/build_*.log | grep -v " 0 bytes spill" | head
pk
timeout 30 /tmp/f16probe > $L/probe.log 2>&1; echo "f16 wgmma rounding probe rc=$?"; cat $L/probe.log
if [ "${QUICK:-0}" != 1 ]; then
timeout 60 build-f16/tests/reference/test_reference_screen > $L/test_ref_f16.log 2>&1
echo "reference screen suite (f16 tree) rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/test_ref_f16.log | tr '\n' ' ')"
fi
BLASST_REQUIRE_GPU=1 timeout 150 build-f16/tests/gpu_prefill/test_gpu_prefill_screen > $L/test_f16.log 2>&1
echo "screen suite (f16 pre-pass) rc=$?"; grep -E "^\[ahead\]|OK \]|FAILED|Failure" $L/test_f16.log | head -30; echo "t=$(($(date +%s) - S))"
[ "${QUICK:-0}" = 1 ] && SAN="" || SAN="memcheck racecheck"
for tool in $SAN; do
  timeout 45 compute-sanitizer --tool $tool --error-exitcode 9 build-f16/tests/gpu_prefill/test_gpu_prefill_screen \
    --gtest_filter=GpuPrefillScreen.WrongScreensOfTightZeroAreCounted > $L/san_$tool.log 2>&1
  echo "$tool (f16 tree, crafted case with the screen ahead): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/san_$tool.log | head -1)"
done
pk
for t in f16 base; do
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
for t in f16 base; do
  R=$(left); [ $R -gt 170 ] && R=170
  [ $R -gt 40 ] && timeout $R python3 bench/prefill/bench_prefill.py --screen \
    --lib $(find build-$t -name libblasst_prefill_bench.so | head -1) --out $L/screen_$t > $L/screen_$t.log 2>&1
  echo "screen bench $t rc=$? t=$(($(date +%s) - S))"; cat $L/screen_$t/*.md 2>/dev/null | tail -4
  pk
done
# With the time left: ncu's full set with source on one launch of each tree's pre-pass (tight, 90 %).
for t in f16 base; do
  R=$(left)
  [ $R -gt 50 ] || break
  timeout $((R - 10)) ncu --set full --import-source yes -k regex:screen_ahead_kernel --launch-count 1 \
    -o "${OUT:-/tmp}/ahead_$t" --force-overwrite \
    python3 bench/prefill/profile_screen.py $(find build-$t -name libblasst_prefill_bench.so | head -1) 32760 1 6 0.9 \
    > $L/ncu_full_$t.log 2>&1
  echo "ncu full $t rc=$? t=$(($(date +%s) - S))"; tail -1 $L/ncu_full_$t.log
  pk
done
