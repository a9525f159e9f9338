# One device call for the pending backward work list (scripts/probes/pending/README.md): trees in .ab
# (pt = main, wl = main + backward-work-list.patch, ws = wl + backward-work-list-sections.patch (call_worklist2.sh);
# kernel_table.inc trimmed to its BLASST_BACKWARD_KERNEL
# lines; bench/results and docs removed to keep the carry small). Carry .deps/cutlass .deps/include
# .deps/googletest .ab. call_worklist.sh also builds the mutant trees and runs the peers on a _core build
# of the working tree (check the branch out first).
export OUT; S=$(date +%s)
ROUNDS=1 TREES="pt wl ws" TEST_TREES="wl ws" ROWS="128:1:8192:0.7:8 128:1:8192:0.7:8:window 128:1:8192:0.7:8:heavy 128:1:16384:0.5:8:heavy 128:1:8192:0.9:8 64:0:8192:0.9 128:0:8192:0.7 128:0:8192:0 64:0:8192:0 128:1:16384:0.7:8:window" scripts/device_call_bwd_trees.sh 2>&1 | tail -30
t=$(find build-ab-wl -name test_gpu_backward -type f|head -1); BLASST_REQUIRE_GPU=1 timeout 60 $t --gtest_filter='GpuBackward.WorkList*' 2>&1 | grep -A5 Failure | head -20
X=build-ab-wl/bench/backward/bench_backward; for a in "--d 64 --causal 0 --sparsity 0.9" "--d 128 --causal 1 --hk 8 --set window --sparsity 0.7"; do timeout 60 ncu --clock-control none --kernel-name regex:'count_kept|build_work|split_sum|backward_wgmma|postprocess|preprocess' --launch-skip 6 --launch-count 6 --metrics gpu__time_duration.sum --csv --page raw $X --b 1 --h 32 --l 8192 --kernel wgmma --iters 1 $a 2>&1 | python3 scripts/ncu_csv.py gpu__time_duration.sum; echo "--- $a"; done; echo "t=$(($(date +%s)-S))"
# Where the llm-shaped skip call's time goes (the work list's measured gain was a third of its model's):
# per-kernel durations, the main kernel's SM busy spread and its source-level profile, GQA 32/8 causal 8k
# heavy-hitter set at 70 % (reports in $OUT/floor_wl/floor.tgz; read with scripts/ncurep_dump.py --sass).
ROWS=none DUR_ROWS="128:0 128:0.7" NCU_ROWS="128:0.7" FLOOR_L=8192 FLOOR_CAUSAL=1 FLOOR_EXTRA="--hk 8 --set heavy" BUILD_DIR=build-ab-wl LIMIT_S=240 OUT=$OUT/floor_wl scripts/device_call_bwd_floor.sh 2>&1 | tail -12
