#!/usr/bin/env bash
# One device call (2026-12-04 p.m.): the wgmma backward's Q / dO pipeline depth. Three experiment
# trees in .ab/ (carried; `git archive HEAD`, kernel_table.inc trimmed to the backward instances so
# that they build in ~2 min side by side): s2 = kStages 2 (the library's), s3 = 3, s4 = 4 at d = 64
# and 3 at d = 128 (s3 and s4 are the same kernel at d = 128: a noise check). Builds test_gpu_backward
# and bench_backward of each, runs the whole backward suite on s3 and s4, then bench_backward
# alternated s2 / s3 / s4 in 2 rounds (B 1, H 32). Logs in $OUT/logs.tgz.
# Carry .deps/cutlass .deps/include .deps/googletest .ab.
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/ls; rm -rf $L; mkdir -p $L
t() { echo "t=$(($(date +%s) - S))"; }
pack() { tar czf "$OUT/logs.tgz" -C /tmp ls; }
TREES="s2 s3 s4"
for n in $TREES; do
  ( cmake -S .ab/$n -B build-ab-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
      -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" &&
    cmake --build build-ab-$n -j 6 --target test_gpu_backward bench_backward ) > $L/build_$n.log 2>&1 &
done
ok=""
for n in $TREES; do wait -n; done
for n in $TREES; do
  if [ -x build-ab-$n/bench/backward/bench_backward ]; then ok="$ok $n"; else echo "build $n failed:"; grep -E "error|FAILED" $L/build_$n.log | head -8; fi
done
echo "built:$ok $(t)"
export BLASST_REQUIRE_GPU=1
for n in s3 s4; do
  [ -x build-ab-$n/tests/gpu_backward/test_gpu_backward ] || continue
  timeout 90 build-ab-$n/tests/gpu_backward/test_gpu_backward --gtest_brief=1 > $L/tests_$n.log 2>&1
  echo "test_gpu_backward $n rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' $L/tests_$n.log | tr '\n' ' ') $(grep -E '^\[  FAILED  \] Gpu' $L/tests_$n.log | tr '\n' ' ')"
done
t
for r in 1 2; do
  for shape in "--d 128 --causal 1 --l 8192" "--d 128 --causal 0 --l 8192" "--d 128 --causal 0 --l 16384" \
               "--d 64 --causal 1 --l 8192" "--d 64 --causal 0 --l 8192" "--d 64 --causal 1 --l 16384"; do
    for n in $ok; do
      timeout 60 build-ab-$n/bench/backward/bench_backward --b 1 --h 32 $shape --sparsity 0 --iters 20 --kernel wgmma 2>&1 |
        grep -E '^wgmma' | sed "s/^/r$r $n /" >> $L/ab.txt
    done
  done
done
echo "A/B (round tree L d mask ms TFLOP/s):"; awk '{print $1, $2, $6, $7, $8, $11, $12}' $L/ab.txt
pack; t
