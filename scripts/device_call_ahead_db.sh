#!/usr/bin/env bash
# One device call for scripts/probes/pending/screen-ahead-double-buffer.patch (issue 19 part 2):
# the screen-ahead pre-pass with two FP8 accumulators against this tree's, on the same machine.
# 1. two trimmed copies of this tree (bf16 prefill instances only), .ab/base and .ab/db (+ the
#    patch), both built (the screen test and the prefill bench library) side by side;
# 2. the patched tree: test_gpu_prefill_screen (strict ahead equal to the plain skip kernel, the
#    crafted wrong-screen case), compute-sanitizer memcheck and racecheck on the crafted case
#    (it runs the screen ahead);
# 3. ncu kernel durations of both trees at the DiT shape, 90 % target, strict and tight ahead
#    (bench/prefill/profile_screen.py): the pre-pass was 14.29 / 16.32 ms on an H100 (30770a0);
#    predicted 9-11 ms for both margins with the patch;
# 4. with the time left, bench_prefill.py --screen on the patched tree, then on this tree;
# 5. then ncu's full set on the two quantisation pre-kernels (the report for scripts/ncurep_dump.py).
# Logs under /tmp/ldb, packed into $OUT/logs.tgz after each step; short tables on stdout.
# Carry .deps/cutlass, .deps/include and .deps/googletest (no Python wheels needed).
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/ldb; rm -rf $L; mkdir -p $L
left() { echo $((575 - ($(date +%s) - S))); }
pk() { tar czf "${OUT:-/tmp}/logs.tgz" -C /tmp ldb; }
P=$PWD/scripts/probes/pending/screen-ahead-double-buffer.patch
# Two copies with kernel_table.inc cut to the bf16 prefill lines (all the test and the bench use),
# so that both build side by side in ~1-2 min: .ab/base (this tree) and .ab/db (+ the patch).
for t in base db; do
  rm -rf .ab/$t && mkdir -p .ab/$t
  tar --exclude=./.ab --exclude='./build*' --exclude=./.deps --exclude=./.git -cf - . | tar -xf - -C .ab/$t
  grep -v -E '^BLASST_(DECODE|BACKWARD)_KERNEL|^BLASST_PREFILL_KERNEL\(f16' src/cuda/sm90/kernel_table.inc \
    > .ab/$t/src/cuda/sm90/kernel_table.inc
  ln -s "$PWD/.deps" .ab/$t/.deps
done
A=.ab/db
# (git apply inside .ab/db would find this tree's repository and skip the paths: stop its search)
(cd $A && if command -v patch > /dev/null; then patch -p1 < "$P"; else GIT_CEILING_DIRECTORIES="$(dirname "$PWD")" git apply "$P"; fi) \
  > $L/apply.log 2>&1 && grep -q sqrt_upper $A/src/cuda/sm90/prefill/prefill_screen.hpp ||
  { echo "the patch does not apply"; cat $L/apply.log; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/gpu.txt
T="test_gpu_prefill_screen blasst_prefill_bench"
for t in base db; do
  src=.ab/$t
  ( cmake -S $src -B build-$t -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=OFF -DBLASST_BUILD_CLI=OFF \
      -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" > $L/build_$t.log 2>&1 &&
    cmake --build build-$t -j 8 --target $T >> $L/build_$t.log 2>&1; echo "build $t rc=$?" >> $L/build_rc.txt ) &
done
wait; cat $L/build_rc.txt; echo "t=$(($(date +%s) - S))"; grep -hE "error|spill" $L/build_*.log | grep -v " 0 bytes spill" | head
pk
BLASST_REQUIRE_GPU=1 timeout 150 build-db/tests/gpu_prefill/test_gpu_prefill_screen > $L/test_db.log 2>&1
echo "screen suite (patched) rc=$?"; grep -E "^\[ahead\]|OK \]|FAILED|Failure" $L/test_db.log | head -30; echo "t=$(($(date +%s) - S))"
for tool in memcheck racecheck; do
  timeout 45 compute-sanitizer --tool $tool --error-exitcode 9 build-db/tests/gpu_prefill/test_gpu_prefill_screen \
    --gtest_filter=GpuPrefillScreen.WrongScreensOfTightZeroAreCounted > $L/san_$tool.log 2>&1
  echo "$tool (patched, crafted case with the screen ahead): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/san_$tool.log | head -1)"
done
pk
for t in db base; do
  LIB=$(find build-$t -name libblasst_prefill_bench.so | head -1)
  for m in 5 6; do
    timeout 70 ncu --metrics gpu__time_duration.sum --csv python3 bench/prefill/profile_screen.py $LIB 32760 1 $m 0.9 \
      > $L/ncu_${t}_$m.csv 2>&1
    echo "ncu $t margin $m rc=$?"
    grep -E '"gpu__time' $L/ncu_${t}_$m.csv | grep blasst | awk -F'","' '{print $5, $NF}' |
      sed -e 's/(blasst::sm90::prefill::.*"/ /' -e 's/blasst::sm90::prefill::PrefillTraits<cutlass::bfloat16_t, //' | cut -c1-120
  done
  pk
done
echo "t=$(($(date +%s) - S))"
for t in db base; do
  R=$(left); [ $R -gt 170 ] && R=170
  [ $R -gt 40 ] && timeout $R python3 bench/prefill/bench_prefill.py --screen \
    --lib $(find build-$t -name libblasst_prefill_bench.so | head -1) --out $L/screen_$t > $L/screen_$t.log 2>&1
  echo "screen bench $t rc=$? t=$(($(date +%s) - S))"; cat $L/screen_$t/*.md 2>/dev/null | tail -4
  pk
done
# With the time left: the quantisation pre-kernels (1.8 ms of the ahead call at the DiT shape,
# H100: several times their bytes at DRAM speed) under ncu's full set, one launch each, for
# scripts/ncurep_dump.py on a machine without Nsight Compute.
R=$(left)
if [ $R -gt 60 ]; then
  timeout $((R - 10)) ncu --set full -k regex:quantise --launch-count 2 -o $L/quantise --force-overwrite \
    python3 bench/prefill/profile_screen.py $(find build-db -name libblasst_prefill_bench.so | head -1) 32760 1 6 0.9 \
    > $L/ncu_quantise.log 2>&1
  echo "ncu quantise rc=$? t=$(($(date +%s) - S))"; tail -2 $L/ncu_quantise.log
  pk
fi
