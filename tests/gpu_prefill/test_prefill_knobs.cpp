// GPU prefill: the bench knobs of prefill_launch.hpp that must not change results. Built only
// with the CUDA kernels (it calls the internal launch_attention on device memory).
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cmath>

#include "blasst/blasst.hpp"
#include "blasst/workloads.hpp"
#include "cuda/cuda_dispatch.hpp"
#include "cuda/sm90/prefill/prefill_launch.hpp"
#include "gpu_prefill/prefill_oracle.hpp"

namespace blasst::test {
namespace {

#define REQUIRE_GPU()                                                                   \
  if (!blasst::cuda_available()) GTEST_SKIP() << "no CUDA GPU: the sm_90a prefill kernel " \
                                                 "needs a Hopper device"

// llm-like data (as in test_prefill.cpp) so that lambda 0.3 skips tiles.
Inputs llm_inputs(const Case& c, std::uint64_t seed) {
  WorkloadSpec ws;
  ws.kind = WorkloadKind::llm;
  ws.batch = c.B;
  ws.seq_len = c.Lq;
  ws.heads_q = c.hq;
  ws.heads_k = c.hk;
  ws.head_dim = c.d;
  ws.seed = seed;
  Workload w = make_workload(ws);
  return make_inputs(c, w.q, w.k, w.v);
}

// The bench knobs that must not change results (bench/prefill): the run-2 vote (shuffles + smem
// max + bar.sync) against the library's BAR.RED vote (same binary, same decisions: bitwise-equal
// outputs and equal counters), and the gated dense instantiation against dense (same math in
// another binary: within rounding). Device tensors through launch_attention (the bench's path).
TEST(GpuPrefill, BenchKnobsKeepResults) {
  REQUIRE_GPU();
  namespace pf = blasst::sm90::prefill;
  Case c;
  c.Lq = c.Lk = 1500;
  c.hq = 4;
  c.hk = 2;
  c.d = 128;
  c.causal = true;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Inputs in = llm_inputs(c, seed);
  auto upload = [](const std::vector<std::uint16_t>& h) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, h.size() * 2), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  };
  void* qd = upload(in.q);
  void* kd = upload(in.k);
  void* vd = upload(in.v);
  const std::size_t on = std::size_t(c.Lq * c.hq * c.d);
  void* od = nullptr;
  unsigned long long* cnt = nullptr;  // visited [hq], skipped [hq]
  ASSERT_EQ(cudaMalloc(&od, on * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&cnt, 2 * c.hq * sizeof(unsigned long long)), cudaSuccess);
  auto dev = [](Tensor t) { t.device = DeviceKind::cuda; return t; };
  AttentionProblem p;
  p.q = dev(Tensor::contiguous(qd, c.dt, {1, c.Lq, c.hq, c.d}));
  p.k = dev(Tensor::contiguous(kd, c.dt, {1, c.Lk, c.hk, c.d}));
  p.v = dev(Tensor::contiguous(vd, c.dt, {1, c.Lk, c.hk, c.d}));
  p.out = dev(Tensor::contiguous(od, c.dt, {1, c.Lq, c.hq, c.d}));
  p.mask = MaskKind::causal;
  struct Res {
    std::vector<std::uint16_t> o;
    std::vector<unsigned long long> cnt;
  };
  auto run = [&](const SkipConfig& sk, int knobs) {
    Res r;
    r.o.resize(on);
    r.cnt.resize(std::size_t(2 * c.hq));
    EXPECT_EQ(cudaMemset(od, 0xff, on * 2), cudaSuccess);  // NaN poison
    EXPECT_EQ(cudaMemset(cnt, 0, r.cnt.size() * sizeof(unsigned long long)), cudaSuccess);
    const bool stats = sk.enabled;
    pf::launch_attention(p, sk, nullptr, false, stats ? cnt : nullptr, stats ? cnt + c.hq : nullptr,
                         nullptr, knobs);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(r.o.data(), od, on * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(r.cnt.data(), cnt, r.cnt.size() * sizeof(unsigned long long),
                         cudaMemcpyDeviceToHost), cudaSuccess);
    return r;
  };
  unsigned long long skipped_any = 0;
  for (double lambda : {1e-2, 0.3}) {
    SCOPED_TRACE("lambda " + std::to_string(lambda));
    const SkipConfig sk = SkipConfig::from_threshold(lambda);
    const Res a = run(sk, 0), b = run(sk, pf::kKnobLegacyVote);
    EXPECT_TRUE(a.o == b.o) << "library vote and run-2 vote give different outputs";
    EXPECT_EQ(a.cnt, b.cnt);
    for (int h = 0; h < c.hq; ++h) skipped_any += a.cnt[std::size_t(c.hq + h)];
  }
  EXPECT_GT(skipped_any, 0u) << "nothing skipped: the comparison above tested no skip";
  const Res d0 = run(SkipConfig{}, 0), d1 = run(SkipConfig{}, pf::kKnobDenseGated);
  // Different binaries: ptxas may contract differently around the branch, so within 2 bf16
  // ulps of the value (not bitwise); the bench reports whether it is bitwise.
  double worst = 0;
  for (std::size_t i = 0; i < on; ++i) {
    const double x = from16(d0.o[i], c.dt), y = from16(d1.o[i], c.dt);
    ASSERT_FALSE(std::isnan(x) || std::isnan(y)) << "NaN at " << i;
    worst = std::max(worst, std::abs(x - y) / (std::abs(x) + 1e-3));
  }
  EXPECT_LE(worst, 2.0 / 128) << "gated dense differs from dense";
  for (void* x : {qd, kd, vd, od, static_cast<void*>(cnt)}) cudaFree(x);
}

}  // namespace
}  // namespace blasst::test
