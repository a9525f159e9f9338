// GPU prefill skip sets against the CPU reference (blasst::reference::attention) run at the
// kernel's vote granularity (64 rows x 1 head x 128 keys, natural order) with record_deltas and
// collect_histogram: same visited pairs, same skipped pairs up to ties within rounding, same
// delta histograms up to deltas within rounding of a bin edge, and outputs within tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/workloads.hpp"
#include "gpu_common.hpp"
#include "gpu_prefill/prefill_oracle.hpp"

namespace blasst::test {
namespace {

// The reference (float32 on the same 16-bit-rounded values, the kernel's vote groups and order)
// once dense with record_deltas (its one-pass curve), then at the lambda of `target` on that
// curve; the kernel at the same lambda. Asserted: visited per head equal, skipped per head within
// [sure, sure + near-ties] (near-ties <= 1 % of the pairs), histograms up to deltas within
// kTieEps of a bin edge, something skipped, and O / LSE elementwise within the 16-bit tolerance
// plus, on the rows of a vote group with a near-tie, that tile's exact share (SPEC §2).
void compare(const Case& c, const Inputs& in, double target, VisitOrder order = VisitOrder::natural) {
  SkipConfig probe;  // disabled: dense, but the deltas recorded at this vote geometry and order
  probe.vote.rows = 64;
  probe.vote.heads = 1;
  probe.vote.tile_keys = 128;
  probe.vote.order = order;
  std::vector<float> out(std::size_t(c.tq() * c.hq * c.d)), lse(std::size_t(c.tq() * c.hq));
  AttentionProblem p;
  p.q = Tensor::contiguous(const_cast<float*>(in.qf.data()), DType::f32, {c.B, c.Lq, c.hq, c.d});
  p.k = Tensor::contiguous(const_cast<float*>(in.kf.data()), DType::f32, {c.B, c.Lk, c.hk, c.d});
  p.v = Tensor::contiguous(const_cast<float*>(in.vf.data()), DType::f32, {c.B, c.Lk, c.hk, c.d});
  p.out = Tensor::contiguous(out.data(), DType::f32, {c.B, c.Lq, c.hq, c.d});
  p.lse = Tensor::contiguous(lse.data(), DType::f32, {c.B, c.hq, c.Lq});
  p.mask = c.causal ? MaskKind::causal : MaskKind::full;
  RunOptions ropt;
  ropt.collect_histogram = true;
  ropt.record_deltas = true;
  SkipStats curve;
  reference::attention(p, probe, ropt, &curve);
  const double ln = ln_lambda_for(curve.deltas, target);
  ASSERT_TRUE(std::isfinite(ln)) << "target " << target << " unreachable at lambda < 1 (max "
                                 << max_reachable_sparsity(curve.deltas) << "): the fixed data is inadequate";
  const double lambda = std::exp(ln);
  SCOPED_TRACE(c.name() + " target " + std::to_string(target) + " lambda " + std::to_string(lambda) + " order " +
               to_string(order));
  SkipConfig sk = SkipConfig::from_threshold(lambda);
  sk.vote = probe.vote;
  SkipStats rs;
  reference::attention(p, sk, ropt, &rs);
  ASSERT_EQ(rs.deltas, curve.deltas) << "the deltas depend on lambda (SPEC §5 says they must not)";

  RunOptions gopt;
  gopt.collect_histogram = true;
  SkipStats gs;
  const KernelOut k = run_gpu(c, in, sk, gopt, &gs);
  EXPECT_EQ(gs.granularity.order, order);
  EXPECT_EQ(gs.granularity.rows, 64);
  EXPECT_EQ(gs.granularity.heads, 1);

  const auto tasks = vote_tasks({c.Lq}, {c.Lk}, c.hk, c.hq / c.hk, probe.vote, c.causal, false);
  const SkipSet set = classify_skip_set(tasks, rs.deltas, {ln}, c.hq, true);
  expect_skip_counts(set, gs);
  for (std::int64_t h = 0; h < c.hq; ++h) EXPECT_EQ(set.ref_skipped[std::size_t(h)], rs.skipped[std::size_t(h)]);
  ASSERT_EQ(gs.hist.size(), std::size_t(c.hq));
  for (std::int64_t h = 0; h < c.hq; ++h)
    expect_histograms(gs.hist[std::size_t(h)], deltas_of(tasks, rs.deltas, h, true), "head " + std::to_string(h));
  EXPECT_GT(gs.total_skipped(), 0) << "nothing skipped";
  std::printf("[ref] %s target %.2f lambda %.4g: gpu sparsity %.4f, reference %.4f, near-ties %lld of %lld\n",
              c.name().c_str(), target, lambda, gs.sparsity(), rs.sparsity(), (long long)set.total_ties,
              (long long)set.total_visited);

  // Outputs: bf16/f16 tolerance u (vmax + |ref|) x 2 (P rounded to the input type before P.V: u
  // vmax; the output rounded: u |ref|; l from rounded P: u |ref|), LSE u + 1e-5 |LSE|; plus the
  // near-tie slack of the row.
  const double u = unit_roundoff(c.dt), scale = 1.0 / std::sqrt(double(c.d));
  const std::int64_t D = c.d, g = c.hq / c.hk;
  double vmax = 0;
  for (float x : in.vf) vmax = std::max(vmax, double(std::abs(x)));
  std::vector<double> slack_o(std::size_t(c.tq() * c.hq), 0.0), slack_l(slack_o.size(), 0.0);
  near_tie_slack(
      tasks, set, {c.Lk}, 1, 128,
      [&](std::int64_t, std::int64_t h, std::int64_t pos, std::int64_t j) {
        if (c.causal && j > pos + c.Lk - c.Lq) return -std::numeric_limits<double>::infinity();
        const float* qr = &in.qf[std::size_t((pos * c.hq + h) * D)];
        const float* kr = &in.kf[std::size_t((j * c.hk + h / g) * D)];
        double acc = 0;
        for (std::int64_t x = 0; x < D; ++x) acc += double(qr[x]) * kr[x];
        return acc * scale;
      },
      [&](std::int64_t, std::int64_t h, std::int64_t pos) { return double(lse[std::size_t(h * c.Lq + pos)]); },
      [&](std::int64_t, std::int64_t h, std::int64_t pos, double so, double sl) {
        slack_o[std::size_t(pos * c.hq + h)] += so * vmax;
        slack_l[std::size_t(pos * c.hq + h)] += sl;
      });
  std::size_t bad_o = 0, bad_l = 0;
  double worst = 0;
  for (std::int64_t pos = 0; pos < c.Lq; ++pos)
    for (std::int64_t h = 0; h < c.hq; ++h) {
      const std::size_t row = std::size_t(pos * c.hq + h);
      for (std::int64_t x = 0; x < D; ++x) {
        const double ref = out[row * std::size_t(D) + std::size_t(x)], got = k.o[row * std::size_t(D) + std::size_t(x)];
        const double e = std::isnan(got) ? INFINITY : std::abs(got - ref);
        const double tol = 2 * u * (vmax + std::abs(ref)) + slack_o[row];
        worst = std::max(worst, e / tol);
        bad_o += e > tol;
      }
      const double lr = lse[std::size_t(h * c.Lq + pos)], lg = k.lse[std::size_t(h * c.Lq + pos)];
      if (std::isinf(lr)) bad_l += lg != lr;
      else bad_l += !(std::abs(lg - lr) <= u + 1e-5 * std::abs(lr) + slack_l[row]);
    }
  EXPECT_EQ(bad_o, 0u) << "O elements beyond tolerance; worst error / tolerance " << worst;
  EXPECT_EQ(bad_l, 0u) << "LSE entries beyond tolerance";
}

TEST(GpuPrefillVsReference, SkipSetsAndHistograms) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  int i = 0;
  for (bool causal : {true, false}) {
    Case c;
    c.Lq = c.Lk = 2000;
    c.hq = 4;
    c.hk = 1;
    c.causal = causal;
    const std::uint64_t seed = test_seed(600 + std::uint64_t(i++));
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Inputs in = llm_inputs(c, seed);
    for (double target : {0.3, 0.6}) compare(c, in, target);
  }
}

// Max-first order (SPEC §2a) in the kernel: the same skip sets as the reference's max-first order
// at the kernel's vote groups. Causal with Lq == Lk and Lq != Lk (the two 64-row groups of a CTA
// may have diagonal tiles one apart), full with Lq == Lk (the llm and dit workloads).
TEST(GpuPrefillVsReference, MaxFirstSkipSets) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
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
    ws.seed = test_seed(650 + std::uint64_t(i++));
    SCOPED_TRACE("seed " + std::to_string(ws.seed));
    Workload w = make_workload(ws);
    // Queries: the last Lq rows of the workload (causal bottom-right alignment), keys: all Lk.
    const std::size_t qrow = std::size_t(c.hq) * c.d, krow = std::size_t(c.hk) * c.d;
    std::vector<float> q(w.q.end() - std::ptrdiff_t(std::size_t(c.Lq) * qrow), w.q.end());
    std::vector<float> k(w.k.begin(), w.k.begin() + std::ptrdiff_t(std::size_t(c.Lk) * krow));
    std::vector<float> v(w.v.begin(), w.v.begin() + std::ptrdiff_t(std::size_t(c.Lk) * krow));
    const Inputs in = make_inputs(c, q, k, v);
    for (double target : {0.3, 0.6}) compare(c, in, target, VisitOrder::max_first);
  }
}

// Full masks with Lq != Lk have no CTA-wide max-first order that equals every vote group's: a
// clear error, not a silently different skip set.
TEST(GpuPrefillVsReference, MaxFirstFullMaskNeedsEqualLengths) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
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
