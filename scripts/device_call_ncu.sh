#!/usr/bin/env bash
# One device call: ncu reports whose detail stays in the repo (the text pages and the .ncu-rep
# files come back in $OUT/ncu.tgz; earlier calls kept only the durations).
#   screen   the FP8 screen beside dense and skip (dit B 1 H 40 L 32760 d 128 full, max-first, 70 %;
#            bench/prefill/profile_screen.py): speed of light, memory tables (L2 / DRAM traffic),
#            warp states, scheduler, source-level stall sampling;
#   decode   our decode kernel at B = 8 and 1, 32k, 32/8 heads, and cuDNN's at B = 8 (memory
#            tables): scripts/device_decode.sh profile, with the memory tables added;
#   bwdgqa   the d128 causal 8k backward main kernel at H 32 with 32 and with 8 KV heads (memory
#            tables: L2 hit rate, DRAM bytes; warp states), BWD_BENCH = a bench_backward binary;
#   bwdfull  the two backward shapes furthest below cuDNN (issue 14: d128 full 8k at 0.83x, d64
#            causal 16k at 0.75x), ours (BWD_BENCH) and cuDNN's backward kernels on the same shape
#            (bench/backward/profile_peer_bwd.py): issue slots, warp states, memory tables.
# WHAT="screen decode bwdgqa bwdfull" picks; BUILD_DIR (default build-ncu) is built here (Python off, the
# bench targets only) unless NO_BUILD=1. Carry .deps/cutlass .deps/include .deps/googletest.
cd "$(dirname "$0")/.."
S=$(date +%s); B=${BUILD_DIR:-build-ncu}; L=/tmp/ncu_logs; mkdir -p $L
WHAT=${WHAT:-"screen decode bwdgqa"}; LIMIT=${LIMIT_S:-560}
t() { echo "t=$(($(date +%s) - S))"; }
left() { echo $((LIMIT - ($(date +%s) - S))); }
pack() { tar czf "${OUT:-/tmp}/ncu.tgz" -C /tmp ncu_logs; }
if [ "${NO_BUILD:-0}" != 1 ]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=OFF -DBLASST_BUILD_CLI=OFF \
    -DBLASST_DEPS_DIR="$PWD/.deps" -DBLASST_CUTLASS_INCLUDE="$PWD/.deps/cutlass/include" > $L/build.log 2>&1 &&
    cmake --build $B -j "${BUILD_JOBS:-$(nproc)}" --target blasst_prefill_bench blasst_decode_profile \
      $(case "$WHAT" in *bwd*) echo bench_backward;; esac) >> $L/build.log 2>&1
  rc=$?; echo "ncu build rc=$rc $(t)"
  [ $rc -ne 0 ] && { grep -E "error|FAILED" $L/build.log | head -20; pack; exit 1; }
fi
[ -n "${WAIT_FOR:-}" ] && while [ ! -e "$WAIT_FOR" ]; do sleep 2; done  # another script's GPU timing first
SEC="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
ncu_run() {  # name, seconds at most, ncu arguments...
  local name=$1 lim=$2; shift 2
  local r=$(left); [ $r -lt $lim ] && lim=$r
  [ $lim -lt 20 ] && { echo "ncu $name: no time left"; return; }
  timeout $lim ncu --clock-control none --export $L/$name --force-overwrite $SEC "$@" > $L/$name.txt 2>&1
  echo "ncu $name rc=$? $(grep -E '^  [a-zA-Z_].*\(|Duration|DRAM Throughput|L2 Cache Throughput|L2 Hit Rate' $L/$name.txt | tr -s ' ' | cut -c1-90 | tr '\n' ';' | cut -c1-900) $(t)"
  pack
}
for w in $WHAT; do
  case $w in
    screen) ncu_run screen 150 --section SourceCounters --kernel-name regex:'prefill|quant' --launch-skip 0 --launch-count 12 \
              python3 bench/prefill/profile_screen.py $B/bench/prefill/libblasst_prefill_bench.so 32760 1 ;;
    decode)
      P=$B/bench/decode/blasst_decode_profile
      ncu_run decode_b8 60 --kernel-name regex:decode_kernel --launch-skip 3 --launch-count 1 $P 8 32768 32 8 0 1
      ncu_run decode_b1 60 --kernel-name regex:decode_kernel --launch-skip 3 --launch-count 1 $P 1 32768 32 8 0 1
      ncu_run cudnn_b8 90 --kernel-name regex:'sdpa|fmha|attn|Attn|flash|Flash|cudnn|Sdpa|Fmha' --launch-skip 0 --launch-count 2 \
        python3 bench/decode/profile_peer.py 8 32768 32 8 2 ;;
    bwdgqa)
      for hk in 32 8; do
        ncu_run bwd_hk$hk 60 --kernel-name regex:'backward_wgmma_kernel' --launch-skip 1 --launch-count 1 \
          ${BWD_BENCH:?} --b 1 --h 32 --hk $hk --l 8192 --d 128 --causal 1 --sparsity 0 --iters 1 --kernel wgmma
      done ;;
    bwdfull)
      for shp in "8192 128 0" "16384 64 1"; do
        set -- $shp
        ncu_run bwd_L$1_d$2_c$3 70 --kernel-name regex:'backward_wgmma_kernel' --launch-skip 1 --launch-count 1 \
          ${BWD_BENCH:-$B/bench/backward/bench_backward} --b 1 --h 32 --hk 32 --l $1 --d $2 --causal $3 --sparsity 0 --iters 1 --kernel wgmma
        ncu_run cudnn_bwd_L$1_d$2_c$3 90 --kernel-name regex:'cudnn|sm90|fmha|Fmha|flash|Flash|sdpa|dgrad|bprop|Bprop' \
          --launch-skip 0 --launch-count 4 python3 bench/backward/profile_peer_bwd.py 1 32 $1 $2 $3 2
      done ;;
  esac
done
pack; t
