# One device call for main + decode-plan.patch (scripts/probes/pending/README.md; written for the tree of
# the work list and the plan, 2026-12-07;
# check the branch out first: the working tree is what runs). Carry .deps/cutlass .deps/include
# .deps/googletest, and .ab/pt (main, trimmed as device_call_bwd_trees.sh says) for the rows beside it.
# 1. the library with Python, test_gpu_backward, bench_backward, blasst_host_costs; pt's bench_backward;
# 2. test_gpu_backward whole, its sanitizer suite under racecheck / memcheck; the decode plan's GPU
#    tests, test_torch and the backward pytest files; 3. bench_backward rows, pt beside this tree;
# 4. the eager host costs (QUICK bench_eager: DecodePlan.run rows); 5. the llm 8k 70 % skip backward
# on its recorded set under ncu; 6. bench_backward_peers --quick --d64 in the time left.
export OUT; S=$(date +%s); export PYTHONPATH=$PWD/build-py/python BLASST_COMMIT=${BLASST_COMMIT:-tree-$(date +%H%M)}
D="-DBLASST_DEPS_DIR=$PWD/.deps -DBLASST_CUTLASS_INCLUDE=$PWD/.deps/cutlass/include"
(cmake -S .ab/pt -B build-ab-pt -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_CLI=OFF -DBLASST_BUILD_PYTHON=OFF -DBLASST_BUILD_TESTS=OFF $D && cmake --build build-ab-pt -j 4 --target bench_backward) > $OUT/build_pt.log 2>&1 &
(cmake -S . -B build-py -G Ninja -DCMAKE_BUILD_TYPE=Release -DBLASST_BUILD_PYTHON=ON -DBLASST_BUILD_TESTS=ON -DBLASST_BUILD_CLI=OFF -DPython_EXECUTABLE=$(command -v python3) $D && cmake --build build-py -j 16 --target _core blasst_host_costs test_gpu_backward bench_backward) > $OUT/build_py.log 2>&1
echo "built rc=$? t=$(($(date +%s)-S))"; grep -E "error" $OUT/build_py.log | head; wait
T=$(find build-py -name test_gpu_backward -type f | head -1)
BLASST_REQUIRE_GPU=1 timeout 120 $T > $OUT/test_bwd.log 2>&1; echo "test_gpu_backward rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $OUT/test_bwd.log | tr '\n' ' ')"; grep -E '^\[  FAILED' $OUT/test_bwd.log | head
for tool in racecheck memcheck; do timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='GpuBackwardSanitizer.*' > $OUT/$tool.log 2>&1; echo "$tool rc=$? $(grep -E 'SUMMARY' $OUT/$tool.log | head -1)"; done
BLASST_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q tests/python/test_decode_plan.py tests/python/test_torch.py $(ls tests/python/test_backward*.py) > $OUT/pytest.log 2>&1; echo "pytest rc=$? $(tail -1 $OUT/pytest.log) t=$(($(date +%s)-S))"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head
for row in "64 0 0.9 1 32" "128 0 0.7 1 32" "128 1 0.7 1 8 heavy" "128 1 0.7 1 8 window" "128 1 0.9 1 8 iid"; do read -r d c sp b hk set <<< "$row"; for n in pt py; do timeout 30 build-$([ $n = pt ] && echo ab-pt || echo py)/bench/backward/bench_backward --b $b --h 32 --hk $hk ${set:+--set $set} --d $d --causal $c --l 8192 --sparsity $sp --iters 10 --kernel wgmma 2>&1 | grep -E '^wgmma' | sed "s/^/$n hk$hk ${set:-iid} d$d /"; done; done | awk '{$5=""; print}' | tee $OUT/rows.txt
timeout 60 build-py/bench/decode/blasst_host_costs > $OUT/host_costs.txt 2>&1; echo "host_costs rc=$?"
timeout 120 python3 bench/decode/bench_eager.py $OUT --quick > $OUT/bench_eager.log 2>&1; echo "eager rc=$? t=$(($(date +%s)-S))"; sed -n '/^# Eager/,$p' $OUT/bench_eager.log | head -40
timeout 90 ncu --clock-control none --kernel-name regex:'count_kept|build_work|split_sum|backward_wgmma|postprocess|preprocess' --launch-skip 6 --launch-count 6 --metrics gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,dram__bytes_read.sum,lts__t_sector_hit_rate.pct --csv --page raw python3 bench/backward/profile_skip_bwd.py llm 8192 128 0.7 2 2>&1 | python3 scripts/ncu_csv.py --echo achieved gpu__time_duration.sum sm__cycles_active.min sm__cycles_active.avg sm__cycles_active.max dram__bytes_read.sum lts__t_sector_hit_rate.pct; echo "ncu t=$(($(date +%s)-S))"
# 5b. the heavy set's L2 question (RESULTS "To run first"): DRAM bytes and L2 hit rate of the main kernel, pt beside this tree
for n in pt py; do timeout 60 ncu --clock-control none --kernel-name regex:backward_wgmma --launch-skip 2 --launch-count 1 --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__cycles_active.avg --csv --page raw build-$([ $n = pt ] && echo ab-pt || echo py)/bench/backward/bench_backward --b 1 --h 32 --hk 8 --set heavy --d 128 --causal 1 --l 8192 --sparsity 0.7 --iters 1 --kernel wgmma 2>&1 | python3 scripts/ncu_csv.py gpu__time_duration.sum dram__bytes_read.sum dram__bytes_write.sum lts__t_sector_hit_rate.pct sm__cycles_active.avg | sed "s/^/$n heavy70 /"; done | tee $OUT/heavy_ncu.txt; echo "heavy ncu t=$(($(date +%s)-S))"
L=$((580-($(date +%s)-S))); [ $L -gt 60 ] && { timeout $L python3 bench/backward/bench_backward_peers.py --quick --d64 --out $OUT > $OUT/peers.log 2>&1; echo "peers rc=$? t=$(($(date +%s)-S))"; grep -E "^\|" $OUT/bench_backward_peers.md | cut -c1-200 | head -40; }
# At most 8 files come back: the logs in one archive.
(cd $OUT && tar czf logs.tgz *.log && rm -f *.log); ls $OUT
