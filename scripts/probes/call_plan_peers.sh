# One device call for a tree holding the work list and the decode plan (scripts/probes/pending/README.md;
# check the branch out first: the working tree is what runs). Carry .deps/cutlass .deps/include.
# 1. the Python extension and blasst_host_costs; 2. the decode plan's GPU tests and test_torch;
# 3. the eager host costs (QUICK bench_eager: DecodePlan.run rows); 4. the llm 8k 70 % skip backward
# on its recorded set under ncu (per-kernel durations, SM busy spread, DRAM bytes, L2 hit rate);
# 5. bench_backward_peers --quick --d64 (ours beside cuDNN / flash, same process).
export OUT; S=$(date +%s); export PYTHONPATH=$PWD/build-py/python BLASST_COMMIT=${BLASST_COMMIT:-tree-$(date +%H%M)}
(cmake -S . -B build-py -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=ON -DBLASST_BUILD_TESTS=OFF -DBLASST_BUILD_CLI=OFF -DPython_EXECUTABLE=$(command -v python3) -DBLASST_DEPS_DIR=$PWD/.deps -DBLASST_CUTLASS_INCLUDE=$PWD/.deps/cutlass/include && cmake --build build-py -j 16 --target _core blasst_host_costs) > $OUT/build_py.log 2>&1
echo "built rc=$? t=$(($(date +%s)-S))"; grep -E "error" $OUT/build_py.log | head
BLASST_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -x tests/python/test_decode_plan.py tests/python/test_torch.py > $OUT/pytest.log 2>&1; echo "pytest rc=$? $(tail -1 $OUT/pytest.log) t=$(($(date +%s)-S))"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head
timeout 60 build-py/bench/decode/blasst_host_costs > $OUT/host_costs.txt 2>&1; echo "host_costs rc=$?"
timeout 120 python3 bench/decode/bench_eager.py $OUT --quick > $OUT/bench_eager.log 2>&1; echo "eager rc=$? t=$(($(date +%s)-S))"; sed -n '/^# Eager/,$p' $OUT/bench_eager.log | head -40
timeout 120 ncu --clock-control none --kernel-name regex:'count_kept|build_work|split_sum|backward_wgmma|postprocess|preprocess' --launch-skip 6 --launch-count 6 --metrics gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,dram__bytes_read.sum,lts__t_sector_hit_rate.pct --csv --page raw python3 bench/backward/profile_skip_bwd.py llm 8192 128 0.7 2 2>&1 | python3 scripts/ncu_csv.py --echo achieved gpu__time_duration.sum sm__cycles_active.min sm__cycles_active.avg sm__cycles_active.max dram__bytes_read.sum lts__t_sector_hit_rate.pct; echo "ncu t=$(($(date +%s)-S))"
timeout $((570-($(date +%s)-S))) python3 bench/backward/bench_backward_peers.py --quick --d64 --out $OUT > $OUT/peers.log 2>&1; echo "peers rc=$? t=$(($(date +%s)-S))"; grep -E "^\|" $OUT/bench_backward_peers.md | cut -c1-200 | head -40
