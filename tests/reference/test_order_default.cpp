// SPEC §2a default (revised): the direct threshold / factor paths visit max-first; a defaulted
// max-first falls back to natural exactly where the CUDA prefill kernel cannot run it (full mask
// with Lq != Lk for some sequence; ragged full-mask batches whose lengths are not host-visible),
// on the reference too; an explicit order is kept; configs keep their own order (natural when they
// name none); statistics and skip sets report the order used.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/config.hpp"
#include "core/problem.hpp"
#include "reference/common.hpp"

namespace blasst::test {
namespace {

// Data where the order changes the skip set: every query leans along coordinate 0 and one key
// (default: the last) towers there (logit ~ 6 * 16 / sqrt(32) = 17), so a group that visits its
// tile early (max-first: own tile and its neighbours first) skips other tiles than the natural
// order, which reaches the last tile last.
Dense late_max(std::int64_t Lq, std::int64_t Lk, std::uint64_t seed, std::int64_t key = -1) {
  Dense D(1, Lq, Lk, 2, 1, 32, 32, seed);
  for (std::int64_t i = 0; i < Lq; ++i)
    for (std::int64_t h = 0; h < 2; ++h) D.q[(i * 2 + h) * 32] += 6.0f;
  D.k[(key < 0 ? Lk - 1 : key) * 32] = 16.0f;
  return D;
}

struct Outcome {
  std::vector<float> out, lse;
  SkipStats st;
  SkipSet set;
};

Outcome run(Dense& D, MaskKind mask, const SkipConfig& cfg) {
  RunOptions opt;
  opt.collect_stats = true;
  Outcome r;
  reference::attention(D.problem(mask), cfg, opt, &r.st, &r.set);
  r.out = D.out;
  r.lse = D.lse;
  return r;
}

void expect_same(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.out.size(), b.out.size());
  EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)));
  EXPECT_EQ(a.st.skipped, b.st.skipped);
  EXPECT_EQ(a.st.visited, b.st.visited);
  EXPECT_EQ(a.set.bits, b.set.bits);
}

TEST(OrderDefault, FactoriesDefaultToMaxFirstOthersToNatural) {
  for (const SkipConfig& c : {SkipConfig::from_threshold(0.1), SkipConfig::from_factor(20.0)}) {
    EXPECT_EQ(c.vote.order, VisitOrder::max_first);
    EXPECT_FALSE(c.order_explicit);
  }
  for (const SkipConfig& c : {SkipConfig{}, SkipConfig::from_calibration({2.0, 4.0}, 0.5),
                              SkipConfig::from_piecewise({{0.1, 0.9}, {0.0, 1.0}, std::nullopt}, 0.5)}) {
    EXPECT_EQ(c.vote.order, VisitOrder::natural);
    EXPECT_TRUE(c.order_explicit);
  }
  SkipConfig c = SkipConfig::from_threshold(0.1);
  c.with_order(VisitOrder::max_first);
  EXPECT_EQ(c.vote.order, VisitOrder::max_first);
  EXPECT_TRUE(c.order_explicit);
  EXPECT_EQ(SkipConfig::from_factor(3.0).with_order(VisitOrder::natural).vote.order, VisitOrder::natural);
}

// Where the kernel can run max-first (full Lq == Lk, causal with any lengths) the default is
// max-first: stats say so and the run is bit-identical to an explicit max-first run.
TEST(OrderDefault, ThresholdDefaultRunsMaxFirst) {
  struct Shape { std::int64_t Lq, Lk; MaskKind mask; };
  for (const Shape s : {Shape{500, 500, MaskKind::full}, Shape{300, 700, MaskKind::causal}}) {
    SCOPED_TRACE(std::to_string(s.Lq) + "x" + std::to_string(s.Lk) + " " + to_string(s.mask));
    // Causal: the towering key at Lk - Lq, visible to every row.
    Dense D = late_max(s.Lq, s.Lk, 71, s.mask == MaskKind::causal ? s.Lk - s.Lq : -1);
    const Outcome def = run(D, s.mask, SkipConfig::from_threshold(0.05));
    EXPECT_EQ(def.st.granularity.order, VisitOrder::max_first);
    EXPECT_NE(def.st.counted_at.find("max_first"), std::string::npos) << def.st.counted_at;
    EXPECT_EQ(def.set.vote.order, VisitOrder::max_first);
    const Outcome mf = run(D, s.mask, SkipConfig::from_threshold(0.05).with_order(VisitOrder::max_first));
    expect_same(def, mf);
    const Outcome nat = run(D, s.mask, SkipConfig::from_threshold(0.05).with_order(VisitOrder::natural));
    EXPECT_EQ(nat.st.granularity.order, VisitOrder::natural);
    // The data makes the order matter, so the equality above is not vacuous.
    EXPECT_GT(mf.st.total_skipped(), 0);
    EXPECT_NE(mf.set.bits, nat.set.bits);
  }
  // factor= too.
  Dense D = late_max(500, 500, 72);
  const Outcome f = run(D, MaskKind::full, SkipConfig::from_factor(25.0));
  EXPECT_EQ(f.st.granularity.order, VisitOrder::max_first);
}

// The fallback: full mask, Lq != Lk (cross-attention), default order -> natural, exactly the
// explicit natural run; an explicit max-first still runs max-first on the reference.
TEST(OrderDefault, FullMaskUnequalLengthsFallsBackToNatural) {
  for (const auto& [Lq, Lk] : {std::pair<std::int64_t, std::int64_t>{200, 700}, {700, 300}}) {
    SCOPED_TRACE(std::to_string(Lq) + "x" + std::to_string(Lk));
    Dense D = late_max(Lq, Lk, 73);
    const Outcome def = run(D, MaskKind::full, SkipConfig::from_threshold(0.05));
    EXPECT_EQ(def.st.granularity.order, VisitOrder::natural);
    EXPECT_NE(def.st.counted_at.find("natural"), std::string::npos) << def.st.counted_at;
    EXPECT_EQ(def.set.vote.order, VisitOrder::natural);
    const Outcome nat = run(D, MaskKind::full, SkipConfig::from_threshold(0.05).with_order(VisitOrder::natural));
    expect_same(def, nat);
    const Outcome mf = run(D, MaskKind::full, SkipConfig::from_threshold(0.05).with_order(VisitOrder::max_first));
    EXPECT_EQ(mf.st.granularity.order, VisitOrder::max_first);
    EXPECT_EQ(mf.set.vote.order, VisitOrder::max_first);
    EXPECT_GT(mf.st.total_skipped(), 0);
    EXPECT_NE(mf.set.bits, nat.set.bits);  // the order matters on this data
    // skip_set_shape states the vote of the call's path: natural for the default here.
    EXPECT_EQ(skip_set_shape(D.problem(MaskKind::full), SkipConfig::from_threshold(0.05)).vote.order,
              VisitOrder::natural);
    EXPECT_EQ(skip_set_shape(D.problem(MaskKind::full),
                             SkipConfig::from_threshold(0.05).with_order(VisitOrder::max_first)).vote.order,
              VisitOrder::max_first);
  }
}

// The backward applies the same rule: the default's recorded skip set (natural here) is accepted
// with the same default config, and the gradient equals the explicit natural one bitwise.
TEST(OrderDefault, BackwardFollowsTheForwardsOrder) {
  Dense D = late_max(150, 400, 74, 0);  // the towering key in the sink tile: natural skips too
  const Outcome fwd = run(D, MaskKind::full, SkipConfig::from_threshold(0.05));
  ASSERT_EQ(fwd.set.vote.order, VisitOrder::natural);
  ASSERT_GT(fwd.set.count(), 0);
  const std::vector<float> dout = randn(fwd.out.size(), 75);
  auto grads = [&](const SkipConfig& cfg, const SkipSet* set) {
    std::vector<float> out = fwd.out, lse = fwd.lse, dq(D.q.size()), dk(D.k.size()), dv(D.v.size());
    std::vector<float> go = dout;
    AttentionBackwardProblem b;
    const AttentionProblem p = D.problem(MaskKind::full);
    b.q = p.q;
    b.k = p.k;
    b.v = p.v;
    b.out = Tensor::contiguous(out.data(), DType::f32, {1, D.Lq, D.Hq, D.dv});
    b.lse = Tensor::contiguous(lse.data(), DType::f32, {1, D.Hq, D.Lq});
    b.dout = Tensor::contiguous(go.data(), DType::f32, {1, D.Lq, D.Hq, D.dv});
    b.dq = Tensor::contiguous(dq.data(), DType::f32, {1, D.Lq, D.Hq, D.d});
    b.dk = Tensor::contiguous(dk.data(), DType::f32, {1, D.Lk, D.Hk, D.d});
    b.dv = Tensor::contiguous(dv.data(), DType::f32, {1, D.Lk, D.Hk, D.dv});
    b.mask = MaskKind::full;
    reference::attention_backward(b, cfg, {}, set);
    dq.insert(dq.end(), dk.begin(), dk.end());
    dq.insert(dq.end(), dv.begin(), dv.end());
    return dq;
  };
  const std::vector<float> with_set = grads(SkipConfig::from_threshold(0.05), &fwd.set);
  const std::vector<float> recomputed = grads(SkipConfig::from_threshold(0.05), nullptr);
  const std::vector<float> natural =
      grads(SkipConfig::from_threshold(0.05).with_order(VisitOrder::natural), nullptr);
  EXPECT_EQ(0, std::memcmp(with_set.data(), natural.data(), natural.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(recomputed.data(), natural.data(), natural.size() * sizeof(float)));
  // An explicit max-first vote does not match the default's recorded (natural) set.
  EXPECT_THROW(grads(SkipConfig::from_threshold(0.05).with_order(VisitOrder::max_first), &fwd.set), Error);
}

// Ragged full-mask batches: max-first by default only when Lq == Lk for every sequence.
TEST(OrderDefault, RaggedFullMaskPerSequenceRule) {
  const std::int64_t H = 2, d = 32;
  auto order_of = [&](std::vector<std::int32_t> lq, std::vector<std::int32_t> lk) {
    std::vector<std::int32_t> cq{0}, ck{0};
    for (auto x : lq) cq.push_back(cq.back() + x);
    for (auto x : lk) ck.push_back(ck.back() + x);
    auto q = randn(std::size_t(cq.back() * H * d), 81), k = randn(std::size_t(ck.back() * H * d), 82),
         v = randn(std::size_t(ck.back() * H * d), 83);
    std::vector<float> out(q.size());
    AttentionProblem p;
    p.q = Tensor::contiguous(q.data(), DType::f32, {cq.back(), H, d});
    p.k = Tensor::contiguous(k.data(), DType::f32, {ck.back(), H, d});
    p.v = Tensor::contiguous(v.data(), DType::f32, {ck.back(), H, d});
    p.out = Tensor::contiguous(out.data(), DType::f32, {cq.back(), H, d});
    p.cu_seqlens_q = cq.data();
    p.cu_seqlens_k = ck.data();
    p.batch = static_cast<std::int64_t>(lq.size());
    p.mask = MaskKind::full;
    RunOptions opt;
    opt.collect_stats = true;
    SkipStats st;
    reference::attention(p, SkipConfig::from_threshold(0.05), opt, &st);
    return st.granularity.order;
  };
  EXPECT_EQ(order_of({130, 260}, {130, 260}), VisitOrder::max_first);
  EXPECT_EQ(order_of({130, 260}, {130, 300}), VisitOrder::natural);
  EXPECT_EQ(order_of({300, 130}, {130, 300}), VisitOrder::natural);  // equal totals, unequal sequences
}

// The rule itself (src/core/problem.hpp), on resolved problems the CUDA path can see too: device
// offsets with both bounds given leave the lengths unknown, so a defaulted max-first is natural.
TEST(OrderDefault, EffectiveOrderRule) {
  detail::ResolvedAttention r;
  r.mask = MaskKind::full;
  r.ragged = true;
  r.batch = 2;
  r.max_q_len = r.max_k_len = 256;  // lengths not read (q_len / k_len empty)
  const SkipConfig def = SkipConfig::from_threshold(0.1);
  const SkipConfig mf = SkipConfig::from_threshold(0.1).with_order(VisitOrder::max_first);
  const SkipConfig nat = SkipConfig::from_threshold(0.1).with_order(VisitOrder::natural);
  EXPECT_FALSE(detail::prefill_supports_max_first(r));
  EXPECT_EQ(detail::effective_attention_order(def, r), VisitOrder::natural);
  EXPECT_EQ(detail::effective_attention_order(mf, r), VisitOrder::max_first);  // kept: the kernel refuses it
  r.q_len = {100, 256};
  r.k_len = {100, 256};
  EXPECT_EQ(detail::effective_attention_order(def, r), VisitOrder::max_first);
  r.mask = MaskKind::causal;
  r.k_len = {50, 256};
  EXPECT_EQ(detail::effective_attention_order(def, r), VisitOrder::max_first);  // causal: any lengths
  r.mask = MaskKind::full;
  EXPECT_EQ(detail::effective_attention_order(def, r), VisitOrder::natural);
  EXPECT_EQ(detail::effective_attention_order(nat, r), VisitOrder::natural);
  const SkipConfig eff = detail::with_effective_order(def, r);
  EXPECT_EQ(eff.vote.order, VisitOrder::natural);
  EXPECT_TRUE(eff.order_explicit);
}

// Decode has no max-first limit (max-first = seeded splits): the default is max-first there.
TEST(OrderDefault, DecodeDefaultIsMaxFirst) {
  const std::int64_t B = 1, qlen = 1, Hq = 4, Hk = 1, d = 32, L = 700;
  auto q = randn(B * qlen * Hq * d, 91), kc = randn(B * L * Hk * d, 92), vc = randn(B * L * Hk * d, 93);
  std::vector<float> o(B * qlen * Hq * d);
  DecodeProblem p;
  p.q = Tensor::contiguous(q.data(), DType::f32, {B, qlen, Hq, d});
  p.k_cache = Tensor::contiguous(kc.data(), DType::f32, {B, L, Hk, d});
  p.v_cache = Tensor::contiguous(vc.data(), DType::f32, {B, L, Hk, d});
  p.out = Tensor::contiguous(o.data(), DType::f32, {B, qlen, Hq, d});
  SkipConfig cfg = SkipConfig::from_threshold(0.05);
  cfg.vote.rows = qlen;
  cfg.vote.heads = Hq / Hk;
  cfg.vote.split_tiles = 2;
  RunOptions opt;
  opt.collect_stats = true;
  SkipStats st;
  reference::decode(p, cfg, opt, &st);
  EXPECT_EQ(st.granularity.order, VisitOrder::max_first);
}

// Configs keep their own order: "blasst".visit_order when present (explicit, so never downgraded),
// natural when absent (interop fits, SPEC §7), a raw scalar factor included.
TEST(OrderDefault, ConfigsKeepTheirOrder) {
  auto cfg_json = [](const std::string& tsf, const std::string& ext) {
    return "{\"sparse_attention_config\": {\"config_groups\": {\"group_0\": {\"algorithm\": \"skip_softmax\", "
           "\"threshold_scale_factor\": " + tsf + ", \"target_sparsity\": {\"prefill\": 0.5, \"decode\": 0.5}" + ext +
           "}}}}";
  };
  const std::string fit = "{\"formula\": \"a * exp(b * target_sparsity)\", \"prefill\": {\"a\": 2.0, \"b\": 4.0}, "
                          "\"decode\": {\"a\": 0.1, \"b\": 9.0}}";
  const std::string mf_ext = ", \"blasst\": {\"visit_order\": \"max_first\"}";
  const std::string nat_ext = ", \"blasst\": {\"visit_order\": \"natural\"}";
  struct Case { std::string tsf, ext; VisitOrder want; };
  for (const Case& c : {Case{fit, "", VisitOrder::natural}, Case{"25.0", "", VisitOrder::natural},
                        Case{fit, mf_ext, VisitOrder::max_first}, Case{"25.0", mf_ext, VisitOrder::max_first},
                        Case{fit, nat_ext, VisitOrder::natural}}) {
    SCOPED_TRACE(c.tsf + c.ext);
    const auto parsed = config::parse(cfg_json(c.tsf, c.ext));
    ASSERT_TRUE(parsed.has_value());
    const SkipConfig s = config::resolve(*parsed, "layers.0.attn", Phase::prefill);
    EXPECT_EQ(s.vote.order, c.want);
    EXPECT_TRUE(s.order_explicit);
    // Lq == Lk (no fallback possible) and Lq != Lk (where a default would fall back): the
    // config's order either way on the reference.
    for (const auto& [Lq, Lk] : {std::pair<std::int64_t, std::int64_t>{500, 500}, {200, 700}}) {
      Dense D = late_max(Lq, Lk, 95);
      EXPECT_EQ(run(D, MaskKind::full, s).st.granularity.order, c.want) << Lq << "x" << Lk;
    }
  }
}

}  // namespace
}  // namespace blasst::test
