#!/usr/bin/env bash
# One device call: A/B of backward experiment trees in .ab/<name>/ (carried), each a copy of a tree
# (`git archive <commit> | tar -x -C .ab/<name>`, or the working tree's files) with
# kernel_table.inc trimmed to the BLASST_BACKWARD_KERNEL lines, so that three trees build side by
# side in ~90 s. Builds test_gpu_backward and bench_backward of each; runs the whole backward suite
# and compute-sanitizer racecheck / memcheck on GpuBackwardSanitizer.* in TEST_TREES; then
# bench_backward alternated over TREES in 2 rounds (B 1, H 32, dense) on SHAPES.
#   TREES="s2 s3 s4" TEST_TREES="s3 s4" scripts/device_call_bwd_ab.sh   (the stage-depth run of b0763c7)
# PEER=1: then torch SDPA's cuDNN / flash backward alone on SHAPES (bench/backward/time_peer_bwd.py).
# NCU_TREES="b0": then Nsight Compute's full set with source-level stall sampling (built with
# -lineinfo, which leaves the SASS as it is) on each of those trees' kernel at NCU_SHAPES, and, with
# NCU_PEER=1, cuDNN's backward kernels (full set) on the first of them; reports in $OUT/ncu.tgz
# (read with scripts/ncurep_dump.py --sass).
# Logs in $OUT/logs.tgz. Carry .deps/cutlass .deps/include .deps/googletest .ab.
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/ls; rm -rf $L; mkdir -p $L
TREES=${TREES:-"b0 e1"}; TEST_TREES=${TEST_TREES:-e1}
SHAPES=${SHAPES:-"--d 64 --causal 1 --l 8192|--d 64 --causal 0 --l 8192|--d 64 --causal 1 --l 16384|--d 128 --causal 1 --l 8192"}
t() { echo "t=$(($(date +%s) - S))"; }
pack() { tar czf "$OUT/logs.tgz" -C /tmp ls; }
n_trees=$(echo $TREES | wc -w); jobs=$(( $(nproc) / n_trees + 1 ))
for n in $TREES; do
  ( cmake -S .ab/$n -B build-ab-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF \
      -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" \
      ${NCU_TREES:+-DCMAKE_CUDA_FLAGS=-lineinfo} &&
    cmake --build build-ab-$n -j $jobs --target test_gpu_backward bench_backward ) > $L/build_$n.log 2>&1 &
done
wait
ok=""
for n in $TREES; do
  if [ -x build-ab-$n/bench/backward/bench_backward ]; then ok="$ok $n"; else echo "build $n failed:"; grep -E "error|FAILED" $L/build_$n.log | head -8; fi
done
echo "built:$ok $(t)"
export BLASST_REQUIRE_GPU=1
for n in $TEST_TREES; do
  T=build-ab-$n/tests/gpu_backward/test_gpu_backward
  [ -x $T ] || continue
  timeout 90 $T --gtest_brief=1 > $L/tests_$n.log 2>&1
  echo "test_gpu_backward $n rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' $L/tests_$n.log | tr '\n' ' ') $(grep -E '^\[  FAILED  \] Gpu' $L/tests_$n.log | tr '\n' ' ')"
  for tool in racecheck memcheck; do
    timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='GpuBackwardSanitizer.*' > $L/${tool}_$n.log 2>&1
    echo "  $tool rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $L/${tool}_$n.log | head -1)"
  done
done
t
IFS='|' read -ra shapes <<< "$SHAPES"
for r in $(seq 1 ${ROUNDS:-2}); do
  for shape in "${shapes[@]}"; do
    for n in $ok; do
      timeout 60 build-ab-$n/bench/backward/bench_backward --b 1 --h 32 $shape --sparsity 0 --iters 20 --kernel wgmma 2>&1 |
        grep -E '^wgmma' | sed "s/^/r$r $n /" >> $L/ab.txt
    done
  done
done
echo "A/B (round tree L d mask ms TFLOP/s):"; awk '{print $1, $2, $6, $7, $8, $11, $12}' $L/ab.txt
pack; t
# PEER=1: torch SDPA's cuDNN and flash backward alone on the same shapes (bench/backward/time_peer_bwd.py)
if [ "${PEER:-0}" = 1 ]; then
  pshapes=(); for shape in "${shapes[@]}"; do pshapes+=("$(echo $shape | sed 's/--[a-z]*//g' | awk '{print $3, $1, $2}')"); done
  timeout 150 python3 bench/backward/time_peer_bwd.py --shapes "${pshapes[@]}" > $L/peer.txt 2>&1
  echo "peers rc=$? (backend L d mask ms TFLOP/s):"; cat $L/peer.txt | tail -20
  pack; t
fi
NCU_SHAPES=${NCU_SHAPES:-"--d 128 --causal 0 --l 8192|--d 64 --causal 1 --l 16384"}
IFS='|' read -ra nshapes <<< "$NCU_SHAPES"
N=/tmp/ncu_src; rm -rf $N; mkdir -p $N
for n in ${NCU_TREES:-}; do
  for shape in "${nshapes[@]}"; do
    tag=$(echo "$n $shape" | tr -d '-' | tr ' ' '_')
    timeout 150 ncu --clock-control none --set full --import-source yes --export $N/$tag --force-overwrite \
      --kernel-name regex:'backward_wgmma_kernel' --launch-skip 1 --launch-count 1 \
      build-ab-$n/bench/backward/bench_backward --b 1 --h 32 $shape --sparsity 0 --iters 1 --kernel wgmma > $N/$tag.txt 2>&1
    echo "ncu $tag rc=$? $(grep -E 'Duration|Compute \(SM\) Throughput|Issue Slots Busy' $N/$tag.txt | tr -s ' ' | tr '\n' ';' | cut -c1-300) $(t)"
    tar czf "$OUT/ncu.tgz" -C /tmp ncu_src
  done
done
if [ "${NCU_PEER:-0}" = 1 ]; then
  set -- $(echo "${nshapes[0]}" | sed 's/--[a-z]*//g')  # d causal l
  timeout 150 ncu --clock-control none --set full --export $N/cudnn_d$1_c$2_l$3 --force-overwrite \
    --kernel-name regex:'cudnn|sm90|fmha|Fmha|flash|Flash|sdpa|dgrad|bprop|Bprop' --launch-skip 0 --launch-count 4 \
    python3 bench/backward/profile_peer_bwd.py 1 32 $3 $1 $2 2 > $N/cudnn.txt 2>&1
  echo "ncu cudnn rc=$? $(t)"
  tar czf "$OUT/ncu.tgz" -C /tmp ncu_src
fi
