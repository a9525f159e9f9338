#!/usr/bin/env bash
# One device call that checks and measures everything a session usually changes (~8 min on the
# H200): scripts/device_all.sh (build, every suite, the decode suite with both load paths and
# the 4-warp family, pytest, compute-sanitizer memcheck and racecheck), then
# bench_backward --quick (wgmma), bench_decode.py --quick and bench_backward_peers.py --quick
# (beside torch SDPA), bench_prefill.py --quick and --screen, each only while time is left (570 s
# in all). Logs under /tmp/la, packed into $OUT/logs.tgz after each step; the short tables on
# stdout.
# The GPU machine's copy has no .git: pass BLASST_COMMIT=<hash>.
# Carry .deps/cutlass, .deps/include, .deps/googletest and .deps/wheels.
cd "$(dirname "$0")/.."
S=$(date +%s); L=/tmp/la; rm -rf $L; mkdir -p $L
export BLASST_COMMIT=${BLASST_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} PYTHONUNBUFFERED=1
B=build-device
left() { echo $((570 - ($(date +%s) - S))); }
OUT=$L SANITIZE=1 AB=0 EAGER=0 SAN_TIMEOUT_S=60 CTEST_PER_TEST_S=150 PYTEST_TIMEOUT=150 BUILD_DIR=$B \
  scripts/device_all.sh > $L/all.txt 2>&1
tail -22 $L/all.txt; grep -E '\(Failed\)|\(Timeout\)' $L/ctest.log | head; echo "t=$(($(date +%s) - S))"
pk() { tar czf "${OUT:-/tmp}/logs.tgz" -C /tmp la; }
pk
timeout 60 $B/bench/backward/bench_backward --quick --kernel wgmma > $L/bwd.txt 2>&1; tail -16 $L/bwd.txt; pk
R=$(left); [ $R -gt 100 ] && R=100
[ $R -gt 30 ] && timeout $R python3 bench/decode/bench_decode.py $B/bench/decode/libblasst_decode_bench.so $L/decode \
  --quick > $L/decode.log 2>&1
echo "decode rc=$? t=$(($(date +%s) - S))"; cat $L/decode/decode_bench.md 2>/dev/null | head -30; pk
R=$(left); [ $R -gt 110 ] && R=110
[ $R -gt 20 ] && PYTHONPATH=$PWD/$B/python timeout $R python3 bench/backward/bench_backward_peers.py --quick \
  --out $L/peers > $L/peers.log 2>&1
echo "peers rc=$? t=$(($(date +%s) - S))"; cat $L/peers/*.md 2>/dev/null | head -30; pk
R=$(left); [ $R -gt 130 ] && R=130
[ $R -gt 20 ] && timeout $R python3 bench/prefill/bench_prefill.py --quick \
  --lib $B/bench/prefill/libblasst_prefill_bench.so --out $L/prefill > $L/prefill.log 2>&1
echo "prefill rc=$? t=$(($(date +%s) - S))"; cat $L/prefill/*.md 2>/dev/null | head -30; pk
R=$(left); [ $R -gt 110 ] && R=110
[ $R -gt 20 ] && timeout $R python3 bench/prefill/bench_prefill.py --screen \
  --lib $B/bench/prefill/libblasst_prefill_bench.so --out $L/screen > $L/screen.log 2>&1
echo "screen rc=$? t=$(($(date +%s) - S))"; cat $L/screen/*.md 2>/dev/null | head -30
pk
