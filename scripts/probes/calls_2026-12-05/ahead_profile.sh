#!/usr/bin/env bash
# The screen ahead: its GPU test after the crafted-case fix, then ncu kernel durations of dense, skip and the screen ahead (tight z = 6, strict) at the DiT shape, 90 %.
B=build-device; S=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=OFF > /tmp/b.log 2>&1 && cmake --build $B -j 16 --target test_gpu_prefill_screen blasst_prefill_bench >> /tmp/b.log 2>&1; echo "build rc=$? t=$(($(date +%s)-S))"; grep -E "error" /tmp/b.log | head
BLASST_REQUIRE_GPU=1 timeout 120 $B/tests/gpu_prefill/test_gpu_prefill_screen 2>&1 | grep -E "^\[ahead\]|^\[screen\]|OK|FAILED|Failure" | head -30; echo "t=$(($(date +%s)-S))"
LIB=$(find $B -name libblasst_prefill_bench.so | head -1)
for m in 6 5; do timeout 100 ncu --metrics gpu__time_duration.sum --csv python3 bench/prefill/profile_screen.py $LIB 32760 1 $m 0.9 > /tmp/ncu_$m.csv 2>&1; echo "ncu margin $m rc=$?"; grep -E '"gpu__time' /tmp/ncu_$m.csv | awk -F'","' '{print $5, $NF}' | sed 's/(blasst::sm90::prefill::PrefillTraits//' | cut -c1-150; done
cp /tmp/ncu_*.csv $OUT/; echo "t=$(($(date +%s)-S))"
