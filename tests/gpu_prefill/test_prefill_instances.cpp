// GPU prefill: the kernel instances that must compute the same thing (kernel_table.inc: skip and
// skip_hist). Built only with the CUDA kernels (it calls the internal launch_attention on device
// memory, as the benchmark does).
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>

#include "blasst/blasst.hpp"
#include "blasst/workloads.hpp"
#include "cuda/cuda_dispatch.hpp"
#include "cuda/sm90/common/skip_policy.hpp"
#include "cuda/sm90/prefill/prefill_api.hpp"
#include "gpu_common.hpp"
#include "gpu_prefill/prefill_oracle.hpp"

namespace blasst::test {
namespace {

#define REQUIRE_GPU() BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device")

// The skip kernel with the delta histogram on (its own instance, the warps' maxima folded in
// shared memory between vote barriers) against the plain skip kernel: same decisions (equal
// counters), outputs within rounding; the histogram counts every visited pair once.
TEST(GpuPrefill, HistogramInstanceKeepsResults) {
  REQUIRE_GPU();
  namespace pf = blasst::sm90::prefill;
  Case c;
  c.Lq = c.Lk = 1500;
  c.hq = 4;
  c.hk = 2;
  c.d = 128;
  c.causal = true;
  const std::uint64_t seed = test_seed(500);
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
    std::vector<unsigned long long> hist;
  };
  const std::size_t hslots = std::size_t(c.hq) * blasst::sm90::kHistSlots;
  unsigned long long* hist = nullptr;
  ASSERT_EQ(cudaMalloc(&hist, hslots * sizeof(unsigned long long)), cudaSuccess);
  auto run = [&](const SkipConfig& sk, bool with_hist) {
    Res r;
    r.o.resize(on);
    r.cnt.resize(std::size_t(2 * c.hq));
    EXPECT_EQ(cudaMemset(od, 0xff, on * 2), cudaSuccess);  // NaN poison
    EXPECT_EQ(cudaMemset(cnt, 0, r.cnt.size() * sizeof(unsigned long long)), cudaSuccess);
    EXPECT_EQ(cudaMemset(hist, 0, hslots * sizeof(unsigned long long)), cudaSuccess);
    const bool stats = sk.enabled || with_hist;  // counters select the skip kernel
    pf::launch_attention(p, sk, nullptr, false, stats ? cnt : nullptr, stats ? cnt + c.hq : nullptr,
                         with_hist ? hist : nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(r.o.data(), od, on * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(r.cnt.data(), cnt, r.cnt.size() * sizeof(unsigned long long),
                         cudaMemcpyDeviceToHost), cudaSuccess);
    if (with_hist) {
      r.hist.resize(hslots);
      EXPECT_EQ(cudaMemcpy(r.hist.data(), hist, hslots * sizeof(unsigned long long),
                           cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return r;
  };
  auto max_rel = [&](const Res& a, const Res& b) -> double {
    double worst = 0;
    for (std::size_t i = 0; i < on; ++i) {
      const double x = from16(a.o[i], c.dt), y = from16(b.o[i], c.dt);
      if (std::isnan(x) || std::isnan(y)) return INFINITY;  // unwritten (poison) or broken
      worst = std::max(worst, std::abs(x - y) / (std::abs(x) + 1e-3));
    }
    return worst;
  };
  unsigned long long skipped_any = 0;
  for (double lambda : {1e-2, 0.3}) {
    SCOPED_TRACE("lambda " + std::to_string(lambda));
    const SkipConfig sk = SkipConfig::from_threshold(lambda).with_order(VisitOrder::natural);
    const Res a = run(sk, false), b = run(sk, true);
    EXPECT_EQ(max_rel(a, a), 0.0) << "NaN in the output (poison left or computed)";
    // The histogram runs its own instantiation (same math, another binary): equal decisions,
    // outputs within rounding (bitwise in practice: printed).
    EXPECT_LE(max_rel(a, b), 2.0 / 128) << "histogram on changes the output beyond rounding";
    EXPECT_EQ(a.cnt, b.cnt) << "histogram on changes the skip decisions";
    std::printf("[instances] lambda %g: histogram kernel vs skip kernel bitwise equal: %s\n", lambda,
                a.o == b.o ? "yes" : "no");
    for (int h = 0; h < c.hq; ++h) {
      unsigned long long total = 0;
      for (int i = 0; i < blasst::sm90::kHistSlots; ++i) total += b.hist[std::size_t(h) * blasst::sm90::kHistSlots + i];
      EXPECT_EQ(total, b.cnt[std::size_t(h)]) << "histogram of head " << h << " != visited";
      skipped_any += a.cnt[std::size_t(c.hq + h)];
    }
  }
  EXPECT_GT(skipped_any, 0u) << "nothing skipped: the comparisons above tested no skip";
  for (void* x : {qd, kd, vd, od, static_cast<void*>(cnt), static_cast<void*>(hist)}) cudaFree(x);
}

}  // namespace
}  // namespace blasst::test
