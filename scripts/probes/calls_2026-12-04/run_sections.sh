#!/usr/bin/env bash
# Experiment (not committed): the causal backward's launch-section size, via the e4 tree's
# BLASST_EXP_SECTION_HEADS override; plus the text pages of the last call's ncu reports.
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/ls2; rm -rf $L; mkdir -p $L
( for f in .ab/ncu/*.ncu-rep; do n=$(basename $f .ncu-rep); ncu --import $f --page details > $L/$n.details.txt 2>&1; done
  ncu --import .ab/ncu/screen.ncu-rep --page source --csv --print-source sass > $L/screen.source.csv 2>&1 ) &
cmake -S .ab/e4 -B build-ab-e4 -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
  -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" > $L/build.log 2>&1 &&
  cmake --build build-ab-e4 -j 16 --target bench_backward >> $L/build.log 2>&1 || { tail -20 $L/build.log; exit 1; }
echo "built t=$(($(date +%s)-S))"
BB=build-ab-e4/bench/backward/bench_backward
for r in 1 2; do
  for shape in "8 8192" "8 16384" "32 8192" "32 16384"; do
    set -- $shape
    if [ $1 = 8 ]; then secs="1 2 4 8"; else secs="1 3 8 32"; fi
    for s in $secs; do
      BLASST_EXP_SECTION_HEADS=$s timeout 60 $BB --b 1 --h 32 --hk $1 --l $2 --d 128 --causal 1 --sparsity 0 --iters 20 --kernel wgmma 2>&1 |
        grep -E '^wgmma' | sed "s/^/r$r hk$1 sec$s /" >> $L/sections.txt
    done
  done
done
awk '{print $1,$2,$3,$7,$12,$13}' $L/sections.txt
wait
tar czf "$OUT/ls2.tgz" -C /tmp ls2
echo "t=$(($(date +%s)-S))"
