// One-pass curves (SPEC §5): exact lists, histograms, their agreement at bin edges, the inverse,
// granularity bookkeeping, and the one-pass property against real reference runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "blasst/calibration.hpp"

using namespace blasst;
using namespace blasst::calibration;

namespace {
VoteGranularity gran(int rows = 64, int heads = 1, VisitOrder o = VisitOrder::natural) {
  VoteGranularity g;
  g.rows = rows;
  g.heads = heads;
  g.order = o;
  return g;
}

std::vector<float> random_deltas(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(-6.0f, 4.0f);
  std::vector<float> d(n);
  for (auto& x : d) x = nd(rng);
  // A few first-visited tiles (+inf) and some exactly on bin edges.
  for (std::size_t i = 0; i < n; i += 97) d[i] = std::numeric_limits<float>::infinity();
  for (std::size_t i = 5; i < n; i += 131) d[i] = -3.0f + 0.0625f * static_cast<float>(i % 7);
  return d;
}

// Independent count: #{d < x} / n.
double brute(const std::vector<float>& d, double x) {
  std::size_t c = 0;
  for (float v : d) c += static_cast<double>(v) < x;
  return static_cast<double>(c) / static_cast<double>(d.size());
}
}  // namespace

TEST(Curve, ExactCurveCountsAndInverse) {
  const auto d = random_deltas(5000, 1);
  const auto c = SparsityCurve::from_deltas(d, gran());
  EXPECT_TRUE(c.exact());
  EXPECT_EQ(c.visited(), d.size());
  for (double x : {-20.0, -9.5, -6.0, -3.0, -2.9375, -1.0, -1e-9, 0.0, 3.0})
    EXPECT_DOUBLE_EQ(c.sparsity_at_log(x), brute(d, x)) << x;
  EXPECT_DOUBLE_EQ(c.max_sparsity(), brute(d, 0.0));
  for (double s : {0.0, 0.1, 0.25, 0.5, 0.77, 0.9}) {
    const double lam = lambda_for_sparsity(c, s);
    ASSERT_TRUE(std::isfinite(lam)) << s;
    const double got = brute(d, std::log(lam));
    // The first reachable sparsity >= s: k = ceil(s n) pairs skipped.
    const double k = std::ceil(s * d.size() - 1e-9);
    EXPECT_DOUBLE_EQ(got, k / d.size()) << s;
    EXPECT_DOUBLE_EQ(c.sparsity_at(lam), got);
  }
  // Above what lambda < 1 can reach: +inf.
  EXPECT_TRUE(std::isinf(lambda_for_sparsity(c, std::min(1.0, c.max_sparsity() + 0.01))));
  EXPECT_THROW(lambda_for_sparsity(c, 1.5), Error);
  EXPECT_THROW(lambda_for_sparsity(c, -0.1), Error);
  EXPECT_THROW(c.sparsity_at(0.0), Error);
  EXPECT_THROW(c.sparsity_at(std::nan("")), Error);
  EXPECT_EQ(c.sparsity_at(1.0), 0.0);  // lambda >= 1 runs dense
}

TEST(Curve, TiesAreSkippedTogether) {
  std::vector<float> d = {-5, -4, -4, -4, -2, -1};
  const auto c = SparsityCurve::from_deltas(d, gran());
  // s = 2/6 needs the first -4 skipped, which skips all three: 4/6.
  const double lam = lambda_for_sparsity(c, 2.0 / 6.0);
  EXPECT_DOUBLE_EQ(c.sparsity_at(lam), 4.0 / 6.0);
  EXPECT_DOUBLE_EQ(c.sparsity_at(lambda_for_sparsity(c, 1.0 / 6.0)), 1.0 / 6.0);
  EXPECT_DOUBLE_EQ(c.sparsity_at(lambda_for_sparsity(c, 1.0)), 1.0);
  EXPECT_THROW(SparsityCurve::from_deltas({1.0f, std::nanf("")}, gran()), Error);
}

TEST(Curve, DeltasAndHistogramAgreeAtBinEdges) {
  const auto d = random_deltas(20000, 2);
  DeltaHistogram h;  // binned by the core's DeltaHistogram (another module's code)
  for (float x : d) h.add(x);
  const auto exact = SparsityCurve::from_deltas(d, gran());
  const auto hist = SparsityCurve::from_histogram(h, gran());
  EXPECT_FALSE(hist.exact());
  EXPECT_EQ(hist.visited(), exact.visited());
  for (int i = 0; i <= DeltaHistogram::kBins; i += 7) {
    const double e = DeltaHistogram::kLo + i * DeltaHistogram::kWidth;
    ASSERT_DOUBLE_EQ(hist.sparsity_at_log(e), exact.sparsity_at_log(e)) << "edge " << e;
  }
  EXPECT_DOUBLE_EQ(hist.max_sparsity(), exact.max_sparsity());
  // The histogram inverse is the smallest edge where the exact curve reaches s.
  for (double s : {0.05, 0.3, 0.5, 0.8}) {
    const double e = std::log(lambda_for_sparsity(hist, s));
    const double k = std::ceil(s * d.size() - 1e-9) / d.size();
    EXPECT_NEAR(std::remainder(e - DeltaHistogram::kLo, DeltaHistogram::kWidth), 0.0, 1e-9);
    EXPECT_GE(exact.sparsity_at_log(e + 1e-12), k) << s;
    EXPECT_LT(exact.sparsity_at_log(e - DeltaHistogram::kWidth), k) << s;
    // ...and the exact inverse lies inside that bin.
    const double x = std::log(lambda_for_sparsity(exact, s));
    EXPECT_LE(x, e + 1e-9);
    EXPECT_GT(x, e - DeltaHistogram::kWidth - 1e-9);
  }
}

TEST(Curve, MergeKeepsGranularityAndRefusesMixing) {
  const auto a = SparsityCurve::from_deltas(random_deltas(1000, 3), gran(64, 1));
  const auto b = SparsityCurve::from_deltas(random_deltas(1500, 4), gran(64, 1));
  const auto m = combine({a, b});
  EXPECT_TRUE(m.exact());
  EXPECT_EQ(m.visited(), 2500u);
  EXPECT_DOUBLE_EQ(m.sparsity_at_log(-6.0),
                   (a.sparsity_at_log(-6.0) * 1000 + b.sparsity_at_log(-6.0) * 1500) / 2500);
  // Different rows, heads, order or split: refused.
  const auto rows = SparsityCurve::from_deltas(random_deltas(10, 5), gran(128, 1));
  const auto heads = SparsityCurve::from_deltas(random_deltas(10, 5), gran(64, 2));
  const auto order = SparsityCurve::from_deltas(random_deltas(10, 5), gran(64, 1, VisitOrder::max_first));
  VoteGranularity sg = gran();
  sg.split_tiles = 4;
  const auto split = SparsityCurve::from_deltas(random_deltas(10, 5), sg);
  for (const auto* other : {&rows, &heads, &order, &split}) {
    EXPECT_THROW(combine({a, *other}), Error);
    auto x = a;
    EXPECT_THROW(x.merge(*other), Error);
  }
  // Exact + histogram pools into a histogram, still exact at edges.
  DeltaHistogram h;
  for (float x : random_deltas(1500, 4)) h.add(x);
  const auto mh = combine({a, SparsityCurve::from_histogram(h, gran())});
  EXPECT_FALSE(mh.exact());
  EXPECT_DOUBLE_EQ(mh.sparsity_at_log(-6.0), m.sparsity_at_log(-6.0));
}

TEST(Curve, FromStats) {
  SkipStats st;
  st.granularity = gran(1, 4);
  EXPECT_THROW(curves_from_stats(st), Error);  // neither deltas nor histograms
  st.visited = {3, 2};
  st.skipped = {0, 0};
  st.deltas = {-1, -2, -3, -4};
  EXPECT_THROW(curves_from_stats(st), Error);  // 4 deltas for 5 visited pairs
  st.deltas.push_back(-5);
  st.hist.resize(2);
  for (float x : {-1.f, -2.f, -3.f}) st.hist[0].add(x);
  for (float x : {-4.f, -5.f}) st.hist[1].add(x);
  const auto c = curves_from_stats(st);
  ASSERT_EQ(c.per_head.size(), 2u);
  EXPECT_TRUE(c.layer.exact());
  EXPECT_TRUE(same_granularity(c.layer.granularity(), st.granularity));
  EXPECT_EQ(c.per_head[1].visited(), 2u);
  EXPECT_DOUBLE_EQ(c.layer.sparsity_at_log(-2.5), 0.6);
}

// SPEC §5 one-pass property through the reference engine: the curve from one dense run predicts
// the sparsity of runs with skipping on, exactly, for prefill (full and causal, both orders) and
// for split-KV decode with grouped-query votes.
TEST(Curve, OnePassCurvePredictsReferenceRuns) {
  const std::int64_t L = 700, hq = 4, hk = 2, d = 32;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(L * hq * d), k(L * hk * d), v(L * hk * d);
  // Queries share a direction u = (1, ..., 1) and key 0 (a sink) points along it, scoring about
  // 8 against typical scores of +-1.4: tiles far below the running max, a gradual curve.
  for (auto& x : q) x = nd(rng) + 1.0f;
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (std::int64_t h = 0; h < hk; ++h)
    for (std::int64_t c = 0; c < d; ++c) k[h * d + c] = 8.0f / std::sqrt(float(d));
  int checked = 0;
  for (MaskKind mask : {MaskKind::full, MaskKind::causal})
    for (VisitOrder order : {VisitOrder::natural, VisitOrder::max_first}) {
      VoteGranularity g = default_prefill_granularity(order);
      g.rows = 32;
      g.tile_keys = 64;
      PrefillInput in{q.data(), k.data(), v.data(), L, hq, hk, d, mask};
      const auto c = measure_prefill(in, g);
      ASSERT_TRUE(c.layer.exact());
      ASSERT_EQ(c.per_head.size(), static_cast<std::size_t>(hq));
      EXPECT_TRUE(same_granularity(c.layer.granularity(), g));
      for (double s : {0.1, 0.3, 0.5}) {
        const double lam = lambda_for_sparsity(c.layer, s);
        if (!std::isfinite(lam)) continue;
        std::vector<float> out(L * hq * d);
        AttentionProblem p;
        p.q = Tensor::contiguous(q.data(), DType::f32, {1, L, hq, d});
        p.k = Tensor::contiguous(k.data(), DType::f32, {1, L, hk, d});
        p.v = Tensor::contiguous(v.data(), DType::f32, {1, L, hk, d});
        p.out = Tensor::contiguous(out.data(), DType::f32, {1, L, hq, d});
        p.mask = mask;
        SkipConfig cfg = SkipConfig::from_threshold(lam).with_order(VisitOrder::natural);
        cfg.vote = g;
        RunOptions ro;
        ro.collect_stats = true;
        SkipStats st;
        reference::attention(p, cfg, ro, &st);
        EXPECT_DOUBLE_EQ(st.sparsity(), c.layer.sparsity_at(lam))
            << to_string(mask) << " " << to_string(order) << " s=" << s;
        EXPECT_GE(st.sparsity(), s - 1e-12);
        ++checked;
      }
    }
  EXPECT_GE(checked, 8);  // most (mask, order, s) cases reach their target
  // Decode: 2 query heads per KV head vote together, split every 2 tiles; one token per step and
  // two (speculative decoding: both tokens vote together).
  PrefillInput seq{q.data(), k.data(), v.data(), L, hq, hk, d, MaskKind::causal};
  for (int Q : {1, 2}) {
    VoteGranularity gg = default_decode_granularity(hq / hk, 2, VisitOrder::natural, Q);
    gg.tile_keys = 64;
    const auto c = measure_decode(DecodeInput{seq, 8, Q}, gg);
    EXPECT_EQ(c.per_head.size(), static_cast<std::size_t>(hk));  // counted per KV head
    EXPECT_EQ(c.layer.granularity().heads, 2);
    EXPECT_EQ(c.layer.granularity().rows, Q);
    EXPECT_EQ(c.layer.granularity().split_tiles, 2);
    EXPECT_GT(c.layer.visited(), 0u);
    // The same 8 decode steps as a contiguous cache per step (an independent layout).
    const std::int64_t B = 8;
    std::vector<float> kc(B * L * hk * d, 0.0f), vc(B * L * hk * d, 0.0f), qd(B * Q * hq * d),
        od(B * Q * hq * d);
    std::vector<std::int32_t> lens(B);
    for (std::int64_t b = 0; b < B; ++b) {
      lens[b] = static_cast<std::int32_t>(L - B + 1 + b);
      std::copy(k.begin(), k.begin() + lens[b] * hk * d, kc.begin() + b * L * hk * d);
      std::copy(v.begin(), v.begin() + lens[b] * hk * d, vc.begin() + b * L * hk * d);
      std::copy(q.begin() + (lens[b] - Q) * hq * d, q.begin() + lens[b] * hq * d,
                qd.begin() + b * Q * hq * d);
    }
    for (double s : {0.1, 0.3}) {
      const double lam = lambda_for_sparsity(c.layer, s);
      if (!std::isfinite(lam)) continue;
      DecodeProblem p;
      p.q = Tensor::contiguous(qd.data(), DType::f32, {B, Q, hq, d});
      p.k_cache = Tensor::contiguous(kc.data(), DType::f32, {B, L, hk, d});
      p.v_cache = Tensor::contiguous(vc.data(), DType::f32, {B, L, hk, d});
      p.seqlens_k = lens.data();
      p.out = Tensor::contiguous(od.data(), DType::f32, {B, Q, hq, d});
      SkipConfig cfg = SkipConfig::from_threshold(lam).with_order(VisitOrder::natural);
      cfg.vote = gg;
      RunOptions ro;
      ro.collect_stats = true;
      SkipStats st;
      reference::decode(p, cfg, ro, &st);
      EXPECT_DOUBLE_EQ(st.sparsity(), c.layer.sparsity_at(lam)) << "decode q_len " << Q << " s=" << s;
      EXPECT_GT(st.sparsity(), 0.0);
      ++checked;
    }
  }
  EXPECT_THROW(measure_decode(DecodeInput{seq, 8, 9}, default_decode_granularity(2)), Error);
  EXPECT_THROW(measure_decode(DecodeInput{seq, L, 2}, default_decode_granularity(2)), Error);
  EXPECT_GE(checked, 11);
}

// The generic path: any callable that returns SkipStats (a whole model run, say).
TEST(Curve, MeasureWithCallback) {
  VoteGranularity g = gran(32, 2);
  int calls = 0;
  const auto c = measure_with(
      [&](const SkipConfig& probe, const RunOptions& ro) {
        ++calls;
        EXPECT_TRUE(probe.enabled);
        EXPECT_TRUE(same_granularity(probe.vote, g));
        EXPECT_LT(resolve_lambda(probe, 1 << 20), 1e-300);  // nothing can be skipped
        EXPECT_TRUE(ro.collect_histogram);
        EXPECT_TRUE(ro.record_deltas);
        SkipStats st;
        st.granularity = probe.vote;
        st.visited = {2, 1};
        st.skipped = {0, 0};
        st.deltas = {-3.0f, std::numeric_limits<float>::infinity(), -1.0f};
        return st;
      },
      g);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(c.layer.exact());
  EXPECT_DOUBLE_EQ(c.layer.sparsity_at_log(-2.0), 1.0 / 3.0);
  // A "probe" that skipped something did not follow the dense trajectory: refused.
  EXPECT_THROW(measure_with(
                   [&](const SkipConfig& probe, const RunOptions&) {
                     SkipStats st;
                     st.granularity = probe.vote;
                     st.visited = {3};
                     st.skipped = {1};
                     st.deltas = {-3.0f, -2.0f, -1.0f};
                     return st;
                   },
                   g),
               Error);
  EXPECT_THROW(measure_with(StatsRunner{}, g), Error);
  // Bad measuring inputs name the argument.
  PrefillInput bad{};
  EXPECT_THROW(measure_prefill(bad, g), Error);
  EXPECT_THROW(default_decode_granularity(0), Error);
}
