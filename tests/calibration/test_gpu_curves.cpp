// Curves measured by the GPU kernels (delta histograms, bf16 inputs) against the reference's exact
// delta lists on the same bf16-rounded inputs: the kernels calibrate what they run. Skipped
// without a Hopper GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "blasst/calibration.hpp"
#include "blasst/half.hpp"
#include "blasst/workloads.hpp"
#include "gpu_common.hpp"

using namespace blasst;
using namespace blasst::calibration;

namespace {
// Largest |difference| of two curves over the histogram's bin edges.
double max_gap(const SparsityCurve& a, const SparsityCurve& b) {
  double m = 0;
  for (int i = 0; i <= DeltaHistogram::kBins; ++i) {
    const double e = DeltaHistogram::kLo + i * DeltaHistogram::kWidth;
    m = std::max(m, std::abs(a.sparsity_at_log(e) - b.sparsity_at_log(e)));
  }
  return m;
}
}  // namespace

TEST(GpuCurves, KernelHistogramsMatchReference) {
  BLASST_GPU_OR_SKIP("the kernel-vs-reference curve check needs the sm_90a kernels");
  WorkloadSpec s;
  s.kind = WorkloadKind::llm;
  s.seq_len = 4096;
  s.heads_q = 8;
  s.heads_k = 2;
  s.head_dim = 128;
  s.seed = blasst::test::test_seed(3);
  SCOPED_TRACE("seed " + std::to_string(s.seed));
  Workload w = make_workload(s);
  // Round to bf16 once, so both sides see the same values.
  for (auto* x : {&w.q, &w.k, &w.v})
    for (auto& f : *x) f = bf16_to_float(float_to_bf16(f));
  PrefillInput in{w.q.data(), w.k.data(), w.v.data(), s.seq_len, s.heads_q, s.heads_k, s.head_dim,
                  MaskKind::causal};
  const auto g = default_prefill_granularity();
  MeasureOptions gpu;
  gpu.device = DeviceKind::cuda;
  const auto kc = measure_prefill(in, g, gpu);
  const auto rc = measure_prefill(in, g);
  EXPECT_TRUE(same_granularity(kc.layer.granularity(), g)) << describe(kc.layer.granularity());
  EXPECT_FALSE(kc.layer.exact());
  EXPECT_EQ(kc.layer.visited(), rc.layer.visited());
  const double gap = max_gap(kc.layer, rc.layer);
  std::printf("prefill: kernel vs reference curve, max gap at bin edges %.5f\n", gap);
  EXPECT_LT(gap, 0.01);
  ASSERT_EQ(kc.per_head.size(), rc.per_head.size());
  for (std::size_t h = 0; h < kc.per_head.size(); ++h) EXPECT_LT(max_gap(kc.per_head[h], rc.per_head[h]), 0.02) << h;

  // Decode: 4 query heads per KV head (x q_len tokens) vote together, split every 8 tiles.
  for (int Q : {1, 2}) {
    auto dg = default_decode_granularity(s.heads_q / s.heads_k, 8, VisitOrder::natural, Q);
    const auto kd = measure_decode(DecodeInput{in, 32, Q}, dg, gpu);
    const auto rd = measure_decode(DecodeInput{in, 32, Q}, dg);
    EXPECT_TRUE(same_granularity(kd.layer.granularity(), dg)) << describe(kd.layer.granularity());
    EXPECT_EQ(kd.layer.visited(), rd.layer.visited());
    const double dgap = max_gap(kd.layer, rd.layer);
    std::printf("decode q_len %d: kernel vs reference curve, max gap at bin edges %.5f\n", Q, dgap);
    EXPECT_LT(dgap, 0.02);
  }
}
