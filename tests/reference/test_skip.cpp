// Skip-Softmax semantics of the reference (SPEC §2, §2a, §5).
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "blasst/workloads.hpp"
#include "common.hpp"

using namespace blasst;
using namespace blasst::test;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();


SkipStats run(Dense& D, MaskKind mask, const SkipConfig& cfg, RunOptions opt = {}) {
  SkipStats st;
  opt.num_threads = 2;
  opt.collect_stats = true;
  reference::attention(D.problem(mask), cfg, opt, &st);
  return st;
}

SkipConfig thr(double lambda, int rows = 64, int heads = 1) {
  SkipConfig c = SkipConfig::from_threshold(lambda).with_order(VisitOrder::natural);
  c.vote.rows = rows;
  c.vote.heads = heads;
  return c;
}

}  // namespace

TEST(Skip, TinyLambdaEqualsDenseBitForBit) {
  for (MaskKind mask : {MaskKind::full, MaskKind::causal}) {
    Dense D = llm_dense(300, 4, 2, 64, 5);
    run(D, mask, {});
    const auto out0 = D.out, lse0 = D.lse;
    const SkipStats st = run(D, mask, thr(1e-30));
    EXPECT_EQ(st.total_skipped(), 0);
    EXPECT_GT(st.total_visited(), 0);
    EXPECT_EQ(0, std::memcmp(out0.data(), D.out.data(), out0.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(lse0.data(), D.lse.data(), lse0.size() * sizeof(float)));
  }
}

TEST(Skip, SparsityMonotoneInLambdaAndRunningMaxFollowsDense) {
  Dense D = llm_dense(1024, 2, 1, 64, 6);
  RunOptions rec;
  rec.record_deltas = true;
  const SkipStats dense = run(D, MaskKind::causal, {}, rec);
  std::int64_t prev = -1;
  for (double lam : {1e-4, 1e-3, 1e-2, 0.05, 0.2, 0.5, 0.9}) {
    const SkipStats st = run(D, MaskKind::causal, thr(lam), rec);
    EXPECT_GE(st.total_skipped(), prev) << lam;
    prev = st.total_skipped();
    // The skip run's deltas are the dense run's: skipped tiles never move m (SPEC §2).
    EXPECT_EQ(st.deltas, dense.deltas) << lam;
  }
  EXPECT_GT(prev, 0);
}

TEST(Skip, OnePassCurveEqualsSkipRunsExactly) {
  for (VisitOrder order : {VisitOrder::natural, VisitOrder::max_first}) {
    Dense D = llm_dense(1024, 4, 2, 64, 7);
    SkipConfig dense_cfg;
    dense_cfg.vote.order = order;
    RunOptions rec;
    rec.record_deltas = true;
    rec.collect_histogram = true;
    const SkipStats one = run(D, MaskKind::causal, dense_cfg, rec);
    ASSERT_EQ(static_cast<std::int64_t>(one.deltas.size()), one.total_visited());
    DeltaHistogram h;
    for (const auto& x : one.hist) h.merge(x);
    ASSERT_EQ(h.total(), static_cast<std::uint64_t>(one.total_visited()));
    int nonzero = 0;
    // Bin edges e = -k/16 whose exp/log round trip is exact, so ln(lambda) == e in the run.
    for (int k : {1, 3, 8, 16, 24, 40, 64, 96}) {
      const double e = -k / 16.0;
      const double lam = std::exp(e);
      if (std::log(lam) != e) continue;
      SkipConfig cfg = thr(lam);
      cfg.vote.order = order;
      const SkipStats st = run(D, MaskKind::causal, cfg);
      std::int64_t below = 0;
      for (float d : one.deltas) below += static_cast<double>(d) < std::log(lam);
      EXPECT_EQ(below, st.total_skipped()) << "lambda " << lam;
      EXPECT_EQ(st.total_visited(), one.total_visited());
      EXPECT_DOUBLE_EQ(h.sparsity_at(lam), st.sparsity()) << "lambda " << lam;
      EXPECT_EQ(h.sparsity_at(lam) * static_cast<double>(h.total()),
                static_cast<double>(st.total_skipped()));
      nonzero += st.total_skipped() > 0;
    }
    EXPECT_GE(nonzero, 5);
    // Any lambda, not only bin edges: the recorded deltas give the exact count.
    for (double lam : {0.0123, 0.377, 0.0456}) {
      SkipConfig cfg = thr(lam);
      cfg.vote.order = order;
      const SkipStats st = run(D, MaskKind::causal, cfg);
      std::int64_t below = 0;
      for (float d : one.deltas) below += static_cast<double>(d) < std::log(lam);
      EXPECT_EQ(below, st.total_skipped());
    }
  }
}

// rows = heads = 1, Hq = Hk = 1, B = 1: deltas come in (row, visit order) order, so the test knows
// exactly which (row, tile) pairs were skipped and checks them against a naive float64 softmax.
TEST(Skip, SkippedTilesAreNegligibleAndErrorWithinBound) {
  const std::int64_t L = 700, d = 32, T = 128;
  for (MaskKind mask : {MaskKind::causal, MaskKind::full}) {
    Dense D = llm_dense(L, 1, 1, d, 8);
    std::vector<double> o_dense, l_dense;
    naive(D.q, D.k, D.v, 1, L, L, 1, 1, d, d, mask == MaskKind::causal, o_dense, l_dense);
    const double lam = 0.02;
    RunOptions opt;
    opt.fp64 = true;
    opt.record_deltas = true;
    const SkipStats st = run(D, mask, thr(lam, 1, 1), opt);
    ASSERT_GT(st.total_skipped(), 0);
    const std::int64_t nt = (L + T - 1) / T;
    std::size_t pos = 0;
    const double scale = 1.0 / std::sqrt(double(d));
    double max_v = 0;
    for (float x : D.v) max_v = std::max(max_v, double(std::abs(x)));
    for (std::int64_t i = 0; i < L; ++i) {
      const std::int64_t lim = mask == MaskKind::causal ? i : L - 1;
      const std::int64_t nvis = lim / T + 1;
      // Naive scores and the row's final (dense) max and denominator.
      std::vector<double> s(L);
      double mx = -INFINITY;
      for (std::int64_t j = 0; j <= lim; ++j) {
        double a = 0;
        for (std::int64_t c = 0; c < d; ++c) a += double(D.q[i * d + c]) * D.k[j * d + c];
        s[j] = a * scale;
        mx = std::max(mx, s[j]);
      }
      double den = 0;
      for (std::int64_t j = 0; j <= lim; ++j) den += std::exp(s[j] - mx);
      double kept_den = 0, eps = 0;
      std::vector<double> kept(d, 0.0);
      for (std::int64_t t = 0; t < nvis; ++t) {
        ASSERT_LT(pos, st.deltas.size());
        const float delta = st.deltas[pos++];
        if (t == 0) EXPECT_EQ(delta, kInf) << "first visited tile must never be skipped";
        const bool skipped = static_cast<double>(delta) < std::log(lam);
        for (std::int64_t j = t * T; j <= std::min(lim, t * T + T - 1); ++j) {
          const double p = std::exp(s[j] - mx);
          if (skipped) {
            EXPECT_LT(p / den, lam) << "row " << i << " key " << j;  // SPEC §2: conservative
            eps += p / den;
          } else {
            kept_den += p;
            for (std::int64_t c = 0; c < d; ++c) kept[c] += p * D.v[j * d + c];
          }
        }
      }
      EXPECT_LE(eps, lam * T * nvis);  // SPEC §2 error bound per row
      for (std::int64_t c = 0; c < d; ++c) {
        // The skip run equals attention over the kept tiles only (a skipped tile changes nothing)
        EXPECT_NEAR(D.out[i * d + c], kept[c] / kept_den, 1e-6);
        // and stays within 2 * eps * max|v| of the dense output.
        EXPECT_LE(std::abs(D.out[i * d + c] - o_dense[i * d + c]), 2 * eps * max_v + 1e-6);
      }
      EXPECT_NEAR(D.lse[i], mx + std::log(kept_den), 1e-6);
    }
    EXPECT_EQ(pos, st.deltas.size());
  }
}

TEST(Skip, FirstVisitedTileOfEveryGroupNeverSkipped) {
  Dense D = llm_dense(1000, 2, 2, 32, 9);
  RunOptions rec;
  rec.record_deltas = true;
  // lambda just below 1: everything skippable is skipped.
  const SkipStats st = run(D, MaskKind::causal, thr(0.999), rec);
  // Groups of 64 rows: ceil(1000 / 64) = 16 per head; each visits >= 1 tile and its first is +inf.
  std::int64_t inf_count = 0;
  for (float d : st.deltas) inf_count += d == kInf;
  EXPECT_EQ(inf_count, 2 * 16);
  EXPECT_LT(st.total_skipped(), st.total_visited());
  for (float x : D.lse) EXPECT_TRUE(std::isfinite(x));
  for (float x : D.out) ASSERT_FALSE(std::isnan(x));
}

TEST(Skip, SplitKvDenseMatchesAndEverySplitStartsFresh) {
  for (MaskKind mask : {MaskKind::full, MaskKind::causal}) {
    Dense D = llm_dense(1000, 2, 1, 64, 10);
    run(D, mask, {});
    const auto out0 = D.out, lse0 = D.lse;
    for (std::int64_t split : {1, 2, 3, 100}) {
      SkipConfig dense_split;
      dense_split.vote.split_tiles = split;
      RunOptions rec;
      rec.record_deltas = true;
      const SkipStats st = run(D, mask, dense_split, rec);
      EXPECT_LT(rel_err(D.out, out0), 1e-6) << split;
      EXPECT_LT(rel_err(D.lse, lse0), 1e-6) << split;
      // Skip with lambda near 1: the first tile of every split is never skipped.
      SkipConfig sk = thr(0.999);
      sk.vote.split_tiles = split;
      const SkipStats s2 = run(D, mask, sk, rec);
      EXPECT_EQ(s2.deltas, st.deltas);
      // Count the (group, split) pairs that are visited: their first delta is +inf.
      std::int64_t expect_inf = 0;
      const std::int64_t T = 128, nt = (1000 + T - 1) / T;
      for (std::int64_t r0 = 0; r0 < 1000; r0 += 64) {
        const std::int64_t last = std::min<std::int64_t>(r0 + 63, 999);
        const std::int64_t nvis = mask == MaskKind::causal ? last / T + 1 : nt;
        expect_inf += (nvis + split - 1) / split;
      }
      std::int64_t inf_count = 0;
      for (float d : s2.deltas) inf_count += d == kInf;
      EXPECT_EQ(inf_count, 2 * expect_inf) << split;  // 2 heads
      if (split > 1) EXPECT_GT(s2.total_skipped(), 0);
      else EXPECT_EQ(s2.total_skipped(), 0);  // every tile opens its own split
    }
  }
}

TEST(Skip, MaxFirstOrderDenseMatches) {
  for (MaskKind mask : {MaskKind::full, MaskKind::causal}) {
    Dense D(1, 333, 517, 2, 1, 32, 32, 11);
    run(D, mask, {});
    const auto out0 = D.out;
    SkipConfig c;
    c.vote.order = VisitOrder::max_first;
    RunOptions rec;
    rec.record_deltas = true;
    const SkipStats st = run(D, mask, c, rec);
    EXPECT_LT(rel_err(D.out, out0), 1e-6);
    std::vector<double> o, l;
    naive(D.q, D.k, D.v, 1, 333, 517, 2, 1, 32, 32, mask == MaskKind::causal, o, l);
    EXPECT_LT(rel_err(D.out, o), 1e-6);
    EXPECT_EQ(st.counted_at.find("max_first") != std::string::npos, true);
  }
}

// max_first + split layout = seeded splits (SPEC §2a): each split starts from the maxima of the
// seed tiles (sink and own tile), so a split may skip its first tile; still exact when dense.
TEST(Skip, SeededSplitsMaxFirst) {
  for (MaskKind mask : {MaskKind::full, MaskKind::causal}) {
    Dense D = llm_dense(1000, 2, 1, 64, 13);
    run(D, mask, {});
    const auto out0 = D.out, lse0 = D.lse;
    for (std::int64_t split : {1, 2, 3}) {
      SkipConfig c;
      c.vote.order = VisitOrder::max_first;
      c.vote.split_tiles = split;
      RunOptions rec;
      rec.record_deltas = true;
      rec.collect_histogram = true;
      const SkipStats one = run(D, mask, c, rec);
      EXPECT_LT(rel_err(D.out, out0), 1e-6);
      EXPECT_LT(rel_err(D.lse, lse0), 1e-6);
      // Every row sees the sink, so no running max starts at -inf: no +inf delta anywhere.
      for (float d : one.deltas) ASSERT_NE(d, kInf);
      // The one-pass curve is still exact, and some splits skip their first tile.
      for (double lam : {0.01, 0.1, 0.5}) {
        SkipConfig sk = thr(lam);
        sk.vote = c.vote;
        RunOptions r2;
        r2.record_deltas = true;
        const SkipStats st = run(D, mask, sk, r2);
        std::int64_t below = 0;
        for (float d : one.deltas) below += static_cast<double>(d) < std::log(lam);
        EXPECT_EQ(below, st.total_skipped());
        EXPECT_EQ(st.deltas, one.deltas);
      }
      // Split-first tiles, natural order inside a split: with split = 1 every tile is one.
      if (split == 1) {
        SkipConfig sk = thr(0.5);
        sk.vote = c.vote;
        EXPECT_GT(run(D, mask, sk).total_skipped(), 0);
      }
    }
  }
}

TEST(Skip, MaxFirstSparserThanNaturalOnDit) {
  WorkloadSpec s;
  s.kind = WorkloadKind::dit;
  s.seq_len = 2048;
  s.heads_q = s.heads_k = 1;
  s.head_dim = 64;
  Workload w = make_workload(s);
  Dense D(1, 2048, 2048, 1, 1, 64, 64, 0);
  D.q = w.q;
  D.k = w.k;
  D.v = w.v;
  SkipConfig nat = thr(0.01), mf = thr(0.01);
  mf.vote.order = VisitOrder::max_first;
  const double sn = run(D, MaskKind::full, nat).sparsity();
  const double sm = run(D, MaskKind::full, mf).sparsity();
  EXPECT_GT(sm, sn);
}

TEST(Skip, GqaVoteHeads) {
  const std::int64_t Hq = 16;
  for (std::int64_t g : {1, 4, 8, 16}) {
    Dense D = llm_dense(257, Hq, Hq / g, 32, 20 + g);
    run(D, MaskKind::causal, {});
    const auto out0 = D.out;
    std::vector<double> o, l;
    naive(D.q, D.k, D.v, 1, 257, 257, Hq, Hq / g, 32, 32, true, o, l);
    EXPECT_LT(rel_err(out0, o), 1e-6) << g;
    const SkipStats st = run(D, MaskKind::causal, thr(1e-30, 64, static_cast<int>(g)));
    EXPECT_EQ(0, std::memcmp(out0.data(), D.out.data(), out0.size() * sizeof(float)));
    // Per-head counters: KV heads when heads > 1, query heads otherwise.
    EXPECT_EQ(static_cast<std::int64_t>(st.visited.size()), g > 1 ? Hq / g : Hq);
    // Voting with more heads can only make skipping harder.
    const SkipStats a = run(D, MaskKind::causal, thr(0.3, 64, 1));
    const SkipStats b = run(D, MaskKind::causal, thr(0.3, 64, static_cast<int>(g)));
    EXPECT_LE(b.sparsity(), a.sparsity() + 1e-12);
    if (g > 1) EXPECT_THROW(run(D, MaskKind::causal, thr(0.3, 64, 3)), Error);  // 3 does not divide g
  }
}

TEST(Skip, FactorIsPerSequenceAndLambdaAtLeastOneRunsDense) {
  // Ragged batch with two multi-tile sequences (300 keys = 3 tiles, 800 keys = 7 tiles), causal:
  // lambda = factor / Lk each, 400 / 300 >= 1 (that sequence runs dense: its rows equal a dense
  // run's bit for bit) and 400 / 800 = 0.5 (that one skips). With lambda >= 1 taken as a real
  // threshold, ln(lambda) > 0 would skip nearly every tile of the first sequence.
  const std::vector<std::int32_t> cu = {0, 300, 1100};
  Dense D(1, 1100, 1100, 2, 2, 32, 32, 30, 2.0f);
  // Keys past each sequence's first tile damped (scores / 4): those tiles lie far below the first
  // tile's maxima, so a lambda < 1 skips them (random scores alone keep nearly every tile alive
  // under a 64-row vote).
  for (std::int64_t t = 0; t < 1100; ++t) {
    const std::int64_t local = t < 300 ? t : t - 300;
    if (local >= 128)
      for (std::int64_t e = 0; e < 2 * 32; ++e) D.k[std::size_t(t * 2 * 32 + e)] *= 0.25f;
  }
  auto run = [&](const SkipConfig& skip, SkipStats* st) {
    AttentionProblem p = D.problem(MaskKind::causal);
    p.q = Tensor::contiguous(D.q.data(), DType::f32, {1100, 2, 32});
    p.k = Tensor::contiguous(D.k.data(), DType::f32, {1100, 2, 32});
    p.v = Tensor::contiguous(D.v.data(), DType::f32, {1100, 2, 32});
    p.out = Tensor::contiguous(D.out.data(), DType::f32, {1100, 2, 32});
    p.lse = Tensor::contiguous(D.lse.data(), DType::f32, {2, 1100});
    p.cu_seqlens_q = cu.data();
    p.cu_seqlens_k = cu.data();
    p.batch = 2;
    RunOptions opt;
    opt.collect_stats = st != nullptr;
    reference::attention(p, skip, opt, st);
    return D.out;
  };
  const std::vector<float> dense = run(SkipConfig{}, nullptr);
  SkipStats st;
  const std::vector<float> mixed = run(SkipConfig::from_factor(400.0).with_order(VisitOrder::natural), &st);
  ASSERT_EQ(st.lambda.size(), 2u);
  EXPECT_DOUBLE_EQ(st.lambda[0], 400.0 / 300.0);  // >= 1: dense for that sequence
  EXPECT_DOUBLE_EQ(st.lambda[1], 0.5);
  EXPECT_GT(st.total_skipped(), 0) << "the second sequence skipped nothing: the case is not exercised";
  const std::size_t first_seq = std::size_t(300) * 2 * 32;  // rows of sequence 0, [T, H, dv]
  EXPECT_EQ(std::memcmp(mixed.data(), dense.data(), first_seq * sizeof(float)), 0)
      << "the lambda >= 1 sequence did not run dense";
  EXPECT_NE(std::memcmp(mixed.data() + first_seq, dense.data() + first_seq,
                        (mixed.size() - first_seq) * sizeof(float)), 0)
      << "the skipping sequence equals dense";
  EXPECT_FALSE(st.counted_at.empty());
  EXPECT_EQ(st.granularity.rows, 64);
}
