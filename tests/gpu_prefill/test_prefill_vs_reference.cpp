// GPU prefill skip sets against the CPU reference (blasst::reference::attention) run at the
// kernel's vote granularity (64 rows x 1 head x 128 keys, natural order) with record_deltas and
// collect_histogram: same visited pairs, same skipped pairs up to ties within rounding, same
// delta histograms up to deltas within rounding of a bin edge, and outputs within tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/workloads.hpp"
#include "gpu_prefill/prefill_oracle.hpp"

namespace blasst::test {
namespace {

void compare(const Case& c, const Inputs& in, double lambda, VisitOrder order = VisitOrder::natural) {
  SCOPED_TRACE(c.name() + " lambda " + std::to_string(lambda) + " order " + to_string(order));
  SkipConfig sk = SkipConfig::from_threshold(lambda);
  sk.vote.rows = 64;
  sk.vote.heads = 1;
  sk.vote.tile_keys = 128;
  sk.vote.order = order;
  RunOptions ropt;
  ropt.collect_histogram = true;
  ropt.record_deltas = true;
  SkipStats rs;
  // Reference on the same (16-bit rounded) values, float32 storage.
  std::vector<float> out(std::size_t(c.tq() * c.hq * c.d)), lse(std::size_t(c.tq() * c.hq));
  AttentionProblem p;
  p.q = Tensor::contiguous(const_cast<float*>(in.qf.data()), DType::f32, {c.B, c.Lq, c.hq, c.d});
  p.k = Tensor::contiguous(const_cast<float*>(in.kf.data()), DType::f32, {c.B, c.Lk, c.hk, c.d});
  p.v = Tensor::contiguous(const_cast<float*>(in.vf.data()), DType::f32, {c.B, c.Lk, c.hk, c.d});
  p.out = Tensor::contiguous(out.data(), DType::f32, {c.B, c.Lq, c.hq, c.d});
  p.lse = Tensor::contiguous(lse.data(), DType::f32, {c.B, c.hq, c.Lq});
  p.mask = c.causal ? MaskKind::causal : MaskKind::full;
  reference::attention(p, sk, ropt, &rs);

  RunOptions gopt;
  gopt.collect_histogram = true;
  SkipStats gs;
  const KernelOut k = run_gpu(c, in, sk, gopt, &gs);

  ASSERT_EQ(gs.visited.size(), rs.visited.size());
  EXPECT_EQ(gs.granularity.order, order);
  const double ln = std::log(lambda);
  std::int64_t ties = 0;
  for (float d : rs.deltas) ties += std::abs(double(d) - ln) < 1e-3 ? 1 : 0;
  std::int64_t dsk = 0;
  for (std::size_t h = 0; h < gs.visited.size(); ++h) {
    EXPECT_EQ(gs.visited[h], rs.visited[h]) << "head " << h;
    dsk += std::abs(gs.skipped[h] - rs.skipped[h]);
  }
  EXPECT_LE(dsk, ties) << "skipped pairs differ beyond ties (" << ties << ")";
  ASSERT_EQ(gs.hist.size(), rs.hist.size());
  for (std::size_t h = 0; h < gs.hist.size(); ++h) {
    EXPECT_EQ(gs.hist[h].total(), rs.hist[h].total());
    std::uint64_t a = 0, b = 0, worst = 0;
    for (std::size_t i = 0; i < gs.hist[h].counts.size(); ++i) {
      a += gs.hist[h].counts[i];
      b += rs.hist[h].counts[i];
      worst = std::max<std::uint64_t>(worst, a > b ? a - b : b - a);
    }
    EXPECT_LE(worst, std::uint64_t(std::max<std::int64_t>(ties, 2))) << "head " << h;
  }
  std::printf("[ref] %s lambda %.3g: gpu sparsity %.4f, reference %.4f\n", c.name().c_str(), lambda,
              gs.sparsity(), rs.sparsity());
  EXPECT_NEAR(gs.sparsity(), rs.sparsity(), 1e-3);
  // Outputs: reference in float32 vs kernel in 16-bit output.
  EXPECT_LE(max_err(k.o, out), 3e-2);
  EXPECT_LE(max_err(k.lse, lse), 1e-2);
}

TEST(GpuPrefillVsReference, SkipSetsAndHistograms) {
  if (!blasst::cuda_available()) GTEST_SKIP() << "no CUDA GPU: the sm_90a prefill kernel needs a Hopper device";
  int i = 0;
  for (bool causal : {true, false}) {
    Case c;
    c.Lq = c.Lk = 2000;
    c.hq = 4;
    c.hk = 1;
    c.causal = causal;
    const Inputs in = llm_inputs(c, fresh_seed() + std::uint64_t(i++));
    for (double lambda : {1e-3, 5e-2}) compare(c, in, lambda);
  }
}

// Max-first order (SPEC §2a) in the kernel: the same skip sets as the reference's max-first order
// at the kernel's vote groups. Causal with Lq == Lk and Lq != Lk (the two 64-row groups of a CTA
// may have diagonal tiles one apart), full with Lq == Lk (the llm and dit workloads).
TEST(GpuPrefillVsReference, MaxFirstSkipSets) {
  if (!blasst::cuda_available()) GTEST_SKIP() << "no CUDA GPU: the sm_90a prefill kernel needs a Hopper device";
  struct Shape {
    int lq, lk;
    bool causal;
    WorkloadKind kind;
  };
  int i = 0;
  for (Shape sh : {Shape{2000, 2000, true, WorkloadKind::llm}, Shape{1000, 2300, true, WorkloadKind::llm},
                   Shape{2000, 2000, false, WorkloadKind::dit}, Shape{1500, 1500, false, WorkloadKind::llm}}) {
    Case c;
    c.Lq = sh.lq;
    c.Lk = sh.lk;
    c.hq = 4;
    c.hk = 1;
    c.causal = sh.causal;
    WorkloadSpec ws;
    ws.kind = sh.kind;
    ws.seq_len = c.Lk;  // every shape here has Lq <= Lk
    ws.heads_q = c.hq;
    ws.heads_k = c.hk;
    ws.head_dim = c.d;
    ws.seed = fresh_seed() + std::uint64_t(i++);
    Workload w = make_workload(ws);
    // Queries: the last Lq rows of the workload (causal bottom-right alignment), keys: all Lk.
    const std::size_t qrow = std::size_t(c.hq) * c.d, krow = std::size_t(c.hk) * c.d;
    std::vector<float> q(w.q.end() - std::ptrdiff_t(std::size_t(c.Lq) * qrow), w.q.end());
    std::vector<float> k(w.k.begin(), w.k.begin() + std::ptrdiff_t(std::size_t(c.Lk) * krow));
    std::vector<float> v(w.v.begin(), w.v.begin() + std::ptrdiff_t(std::size_t(c.Lk) * krow));
    const Inputs in = make_inputs(c, q, k, v);
    for (double lambda : {1e-3, 5e-2}) compare(c, in, lambda, VisitOrder::max_first);
  }
}

// Full masks with Lq != Lk have no CTA-wide max-first order that equals every vote group's: a
// clear error, not a silently different skip set.
TEST(GpuPrefillVsReference, MaxFirstFullMaskNeedsEqualLengths) {
  if (!blasst::cuda_available()) GTEST_SKIP() << "no CUDA GPU: the sm_90a prefill kernel needs a Hopper device";
  Case c;
  c.Lq = 300;
  c.Lk = 500;
  c.hq = 2;
  c.hk = 1;
  c.causal = false;
  std::vector<float> q(std::size_t(c.Lq) * c.hq * c.d, 0.1f), kv(std::size_t(c.Lk) * c.hk * c.d, 0.1f);
  const Inputs in = make_inputs(c, q, kv, kv);
  SkipConfig sk = SkipConfig::from_threshold(1e-3);
  sk.vote.order = VisitOrder::max_first;
  try {
    (void)run_gpu(c, in, sk, RunOptions{}, nullptr);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Lq == Lk"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace blasst::test
