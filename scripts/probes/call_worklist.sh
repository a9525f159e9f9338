# One device call for the pending backward work list (scripts/probes/pending/README.md): trees in .ab
# (pt = main, wl = main + backward-work-list.patch; kernel_table.inc trimmed to its BLASST_BACKWARD_KERNEL
# lines; bench/results and docs removed to keep the carry small). Carry .deps/cutlass .deps/include
# .deps/googletest .ab. call_worklist.sh also builds the mutant trees and runs the peers on a _core build
# of the working tree (check the branch out first).
export OUT; S=$(date +%s)
(cmake -S . -B build-py -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=ON -DBLASST_BUILD_TESTS=OFF -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_BENCH=OFF -DPython_EXECUTABLE=$(command -v python3) -DBLASST_DEPS_DIR=$PWD/.deps -DBLASST_CUTLASS_INCLUDE=$PWD/.deps/cutlass/include && cmake --build build-py -j 6 --target _core) > $OUT/build_py.log 2>&1 &
for m in m1:backward-split-sum-drops-part m2:backward-work-list-drops-item; do n=${m%%:*}; rm -rf .ab/$n; cp -r .ab/wl .ab/$n; (cd .ab/$n && patch -sp1 < ../../scripts/probes/pending/${m#*:}.mutant.patch); done
ROUNDS=1 TREES="pt wl" TEST_TREES="wl" MUT_TREES="m1:GpuBackward.WorkListSplitBlocksMatchReference m2:GpuBackward.WorkListCoversAndOrders" ROWS="128:1:8192:0:8 128:1:8192:0.7:8 128:1:8192:0.7:8:window 128:1:16384:0.7:8:window 128:1:8192:0.9:8 64:0:8192:0 64:0:8192:0.9 128:0:8192:0 128:0:8192:0.7" scripts/device_call_bwd_trees.sh 2>&1 | tail -42
t=$(find build-ab-wl -name test_gpu_backward -type f|head -1); BLASST_REQUIRE_GPU=1 timeout 60 $t --gtest_filter='GpuBackward.WorkList*' 2>&1 | grep -A5 Failure | head -24
wait; echo "core built t=$(($(date +%s)-S)) $(tail -1 $OUT/build_py.log | cut -c1-80)"
BLASST_COMMIT=wl-$(date +%H%M) PYTHONPATH=$PWD/build-py/python timeout 150 python3 bench/backward/bench_backward_peers.py --quick --d64 --out $OUT > $OUT/peers.log 2>&1; echo "peers rc=$? t=$(($(date +%s)-S))"; grep -E "^\|" $OUT/bench_backward_peers.md | cut -c1-220 | head -40
# The llm 8k 70 % call with its recorded set under ncu: per-kernel durations and the main kernel's SM
# busy spread, DRAM bytes read and L2 hit rate (the work list's measured gain was a third of its
# model's on these sets, ~its model on the window set; suspect: the heavy parts run first from every
# KV head at once, so Q / dO of all 32 query heads (128 MB at 8k d128) compete for the 50 MB L2,
# where the fixed order's sections hold 2 KV heads (32 MB); bench/RESULTS.md 2026-12-07).
PYTHONPATH=$PWD/build-py/python timeout 150 ncu --clock-control none --kernel-name regex:'count_kept|build_work|split_sum|backward_wgmma|postprocess|preprocess' --launch-skip 6 --launch-count 6 --metrics gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,dram__bytes_read.sum,lts__t_sector_hit_rate.pct --csv --page raw python3 bench/backward/profile_skip_bwd.py llm 8192 128 0.7 2 2>&1 | python3 scripts/ncu_csv.py --echo achieved gpu__time_duration.sum sm__cycles_active.min sm__cycles_active.avg sm__cycles_active.max dram__bytes_read.sum lts__t_sector_hit_rate.pct
echo "t=$(($(date +%s)-S))"
