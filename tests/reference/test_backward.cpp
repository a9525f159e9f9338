// SPEC §9 backward: reference::attention_backward against an independent float64 implementation
// written from the formula (dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = scale dS K,
// dK = scale dS^T Q, dV = P^T dO), dense and with the skip set as a block mask, and against
// central finite differences of the engine's own forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "blasst/blasst.hpp"
#include "cuda/cuda_dispatch.hpp"
#include "reference/common.hpp"

namespace blasst::test {
namespace {

using i64 = std::int64_t;
const double kInf = std::numeric_limits<double>::infinity();

// kept(b, h, i, j): key j is in a kept tile for row i of head h (the block mask).
using Kept = std::function<bool(i64, i64, i64, i64)>;

struct Grads {
  std::vector<double> out, dq, dk, dv;
};

// The oracle: masked softmax in two passes (no tiles, no LSE from the engine), then the formula.
Grads naive_backward(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                     const std::vector<double>& dout, i64 B, i64 Lq, i64 Lk, i64 Hq, i64 Hk, i64 d, i64 dv,
                     bool causal, const Kept& kept, const std::vector<double>* dlse = nullptr) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const i64 g = Hq / Hk;
  Grads r;
  r.out.assign(B * Lq * Hq * dv, 0.0);
  r.dq.assign(B * Lq * Hq * d, 0.0);
  r.dk.assign(B * Lk * Hk * d, 0.0);
  r.dv.assign(B * Lk * Hk * dv, 0.0);
  std::vector<double> s(Lk), p(Lk), dp(Lk);
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < Hq; ++h)
      for (i64 i = 0; i < Lq; ++i) {
        const i64 kh = h / g;
        const double* qi = &q[((b * Lq + i) * Hq + h) * d];
        const double* doi = &dout[((b * Lq + i) * Hq + h) * dv];
        double mx = -kInf;
        for (i64 j = 0; j < Lk; ++j) {
          s[j] = -kInf;
          if ((causal && j > i + Lk - Lq) || !kept(b, h, i, j)) continue;
          double acc = 0;
          for (i64 c = 0; c < d; ++c) acc += qi[c] * k[((b * Lk + j) * Hk + kh) * d + c];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        if (mx == -kInf) continue;
        double l = 0;
        for (i64 j = 0; j < Lk; ++j) l += s[j] == -kInf ? 0.0 : std::exp(s[j] - mx);
        double* oi = &r.out[((b * Lq + i) * Hq + h) * dv];
        for (i64 j = 0; j < Lk; ++j) {
          p[j] = s[j] == -kInf ? 0.0 : std::exp(s[j] - mx) / l;
          for (i64 c = 0; c < dv; ++c) oi[c] += p[j] * v[((b * Lk + j) * Hk + kh) * dv + c];
        }
        double D = 0;  // rowsum(dO * O)
        for (i64 c = 0; c < dv; ++c) D += doi[c] * oi[c];
        // LSE_i = log sum_j exp(s_ij): dLSE_i / ds_ij = p_ij, so dS_ij gains dlse_i * p_ij.
        const double dl = dlse ? (*dlse)[(b * Hq + h) * Lq + i] : 0.0;
        for (i64 j = 0; j < Lk; ++j) {
          dp[j] = 0;
          for (i64 c = 0; c < dv; ++c) dp[j] += doi[c] * v[((b * Lk + j) * Hk + kh) * dv + c];
          const double ds = p[j] * (dp[j] - D) + dl * p[j];
          for (i64 c = 0; c < d; ++c) {
            r.dq[((b * Lq + i) * Hq + h) * d + c] += scale * ds * k[((b * Lk + j) * Hk + kh) * d + c];
            r.dk[((b * Lk + j) * Hk + kh) * d + c] += scale * ds * qi[c];
          }
          for (i64 c = 0; c < dv; ++c) r.dv[((b * Lk + j) * Hk + kh) * dv + c] += p[j] * doi[c];
        }
      }
  return r;
}

std::vector<double> to_f64(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// One problem in float64 storage: forward (engine, fp64, recording the skip set), then backward.
struct Case {
  i64 B, Lq, Lk, Hq, Hk, d, dv;
  bool causal;
  std::vector<double> q, k, v, dout, out, lse, dq, dk, dv_;
  std::vector<double> dlse;  // empty: no upstream gradient into lse
  Case(i64 B_, i64 Lq_, i64 Lk_, i64 Hq_, i64 Hk_, i64 d_, i64 dv__, bool causal_, std::uint64_t seed,
       float sd = 1.0f)
      : B(B_), Lq(Lq_), Lk(Lk_), Hq(Hq_), Hk(Hk_), d(d_), dv(dv__), causal(causal_) {
    q = to_f64(randn(B * Lq * Hq * d, seed, sd));
    k = to_f64(randn(B * Lk * Hk * d, seed + 1, sd));
    v = to_f64(randn(B * Lk * Hk * dv, seed + 2));
    dout = to_f64(randn(B * Lq * Hq * dv, seed + 3));
    out.assign(B * Lq * Hq * dv, 0.0);
    lse.assign(B * Hq * Lq, 0.0);
  }
  AttentionProblem fwd() {
    AttentionProblem p;
    p.q = Tensor::contiguous(q.data(), DType::f64, {B, Lq, Hq, d});
    p.k = Tensor::contiguous(k.data(), DType::f64, {B, Lk, Hk, d});
    p.v = Tensor::contiguous(v.data(), DType::f64, {B, Lk, Hk, dv});
    p.out = Tensor::contiguous(out.data(), DType::f64, {B, Lq, Hq, dv});
    p.lse = Tensor::contiguous(lse.data(), DType::f64, {B, Hq, Lq});
    p.mask = causal ? MaskKind::causal : MaskKind::full;
    return p;
  }
  void forward(const SkipConfig& skip, SkipSet* set) {
    RunOptions opt;
    opt.fp64 = true;
    reference::attention(fwd(), skip, opt, nullptr, set);
  }
  AttentionBackwardProblem bwd() {
    dq.assign(q.size(), std::numeric_limits<double>::quiet_NaN());
    dk.assign(k.size(), std::numeric_limits<double>::quiet_NaN());
    dv_.assign(v.size(), std::numeric_limits<double>::quiet_NaN());
    const AttentionProblem f = fwd();
    AttentionBackwardProblem p;
    p.q = f.q;
    p.k = f.k;
    p.v = f.v;
    p.out = f.out;
    p.lse = f.lse;
    p.mask = f.mask;
    p.dout = Tensor::contiguous(dout.data(), DType::f64, {B, Lq, Hq, dv});
    p.dq = Tensor::contiguous(dq.data(), DType::f64, {B, Lq, Hq, d});
    p.dk = Tensor::contiguous(dk.data(), DType::f64, {B, Lk, Hk, d});
    p.dv = Tensor::contiguous(dv_.data(), DType::f64, {B, Lk, Hk, dv});
    if (!dlse.empty()) p.dlse = Tensor::contiguous(dlse.data(), DType::f64, {B, Hq, Lq});
    return p;
  }
  void backward(const SkipConfig& skip, const SkipSet* set) {
    RunOptions opt;
    opt.fp64 = true;
    reference::attention_backward(bwd(), skip, opt, set);
  }
  Grads oracle(const Kept& kept) const {
    return naive_backward(q, k, v, dout, B, Lq, Lk, Hq, Hk, d, dv, causal, kept, dlse.empty() ? nullptr : &dlse);
  }
};

Kept all_kept() {
  return [](i64, i64, i64, i64) { return true; };
}
Kept kept_by(const SkipSet& s) {
  return [&s](i64 b, i64 h, i64 i, i64 j) { return !s.skipped(b, h, i / s.vote.rows, j / s.vote.tile_keys); };
}

void expect_grads(const Case& c, const Grads& want, double tol) {
  EXPECT_LT(rel_err(c.out, want.out), tol) << "forward O";
  EXPECT_LT(rel_err(c.dq, want.dq), tol) << "dQ";
  EXPECT_LT(rel_err(c.dk, want.dk), tol) << "dK";
  EXPECT_LT(rel_err(c.dv_, want.dv), tol) << "dV";
}

SkipConfig skip_cfg(double lambda, int rows, int tile, VisitOrder order = VisitOrder::natural, int heads = 1) {
  SkipConfig s = SkipConfig::from_threshold(lambda).with_order(VisitOrder::natural);
  s.vote.rows = rows;
  s.vote.tile_keys = tile;
  s.vote.order = order;
  s.vote.heads = heads;
  return s;
}

struct Shape {
  i64 B, Lq, Lk, Hq, Hk, d, dv;
  bool causal;
};

TEST(Backward, DenseMatchesFormula) {
  const Shape shapes[] = {
      {1, 1, 1, 1, 1, 8, 8, false},    {1, 1, 1, 2, 1, 8, 4, true},     {2, 17, 17, 2, 2, 16, 16, true},
      {1, 17, 17, 3, 1, 16, 8, false}, {1, 200, 200, 2, 1, 32, 32, true}, {1, 17, 200, 4, 2, 16, 16, true},
      {1, 200, 17, 2, 2, 16, 24, true}, {2, 33, 70, 4, 1, 8, 8, false},  {1, 200, 200, 1, 1, 16, 16, false},
  };
  std::uint64_t seed = 100;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "B " << s.B << " Lq " << s.Lq << " Lk " << s.Lk << " Hq " << s.Hq
                                      << " Hk " << s.Hk << (s.causal ? " causal" : " full"));
    Case c(s.B, s.Lq, s.Lk, s.Hq, s.Hk, s.d, s.dv, s.causal, seed += 10);
    c.forward({}, nullptr);
    c.backward({}, nullptr);
    expect_grads(c, c.oracle(all_kept()), 1e-11);
  }
}

// An upstream gradient into the LSE (return_lse in training), dense and with skipping.
TEST(Backward, LseGradientMatchesFormula) {
  for (const bool skip : {false, true}) {
    Case c(1, 70, 90, 2, 1, 16, 16, true, 6000, 3.0f);
    c.dlse = to_f64(randn(c.lse.size(), 6001));
    const SkipConfig cfg = skip ? skip_cfg(0.1, 4, 8) : SkipConfig{};
    SkipSet set;
    c.forward(cfg, &set);
    if (skip) {
      ASSERT_GT(set.count(), 0);
    }
    c.backward(cfg, skip ? &set : nullptr);
    expect_grads(c, c.oracle(skip ? kept_by(set) : all_kept()), 1e-11);
    const std::vector<double> with = c.dq;
    c.dlse.clear();
    c.backward(cfg, skip ? &set : nullptr);
    EXPECT_GT(rel_err(with, c.dq), 1e-3) << "dlse must change dQ";
  }
}

// Without lse the backward computes the LSE over the kept tiles itself: the same gradient.
TEST(Backward, WithoutLseComputesIt) {
  for (const bool skip : {false, true}) {
    Case c(2, 50, 70, 4, 2, 16, 16, true, 6500, 3.0f);
    const SkipConfig cfg = skip ? skip_cfg(0.1, 4, 8) : SkipConfig{};
    SkipSet set;
    c.forward(cfg, &set);
    if (skip) {
      ASSERT_GT(set.count(), 0);
    }
    c.dlse = to_f64(randn(c.lse.size(), 6501));
    c.backward(cfg, &set);
    const std::vector<double> dq = c.dq, dk = c.dk, dv = c.dv_;
    auto p = c.bwd();
    p.lse = Tensor{};
    RunOptions opt;
    opt.fp64 = true;
    reference::attention_backward(p, cfg, opt, &set);
    EXPECT_LT(rel_err(c.dq, dq), 1e-13);
    EXPECT_LT(rel_err(c.dk, dk), 1e-13);
    EXPECT_LT(rel_err(c.dv_, dv), 1e-13);
  }
}

// Lq > Lk causal: the first Lq - Lk rows see no key: zero gradient, not NaN.
TEST(Backward, FullyMaskedRowsGetZeroGradient) {
  Case c(1, 20, 5, 1, 1, 8, 8, true, 7);
  c.forward({}, nullptr);
  c.backward({}, nullptr);
  for (i64 i = 0; i < 15; ++i)
    for (i64 e = 0; e < 8; ++e) EXPECT_EQ(c.dq[i * 8 + e], 0.0) << "row " << i;
  expect_grads(c, c.oracle(all_kept()), 1e-11);
}

// Skipping: the gradient of the kept-tiles function, the recorded skip set as a block mask. Also:
// the oracle's masked forward equals the engine's skip forward (the set is the one it used), and
// recomputing the set in the backward (skip_set = nullptr) gives the same result bit for bit.
TEST(Backward, SkipMatchesMaskedFormula) {
  struct S {
    Shape sh;
    SkipConfig cfg;
  };
  const S cases[] = {
      {{1, 200, 200, 2, 1, 16, 16, true}, skip_cfg(0.05, 8, 16)},
      {{1, 200, 200, 2, 2, 16, 16, false}, skip_cfg(0.3, 4, 16, VisitOrder::max_first)},
      {{2, 17, 200, 4, 2, 16, 8, true}, skip_cfg(0.05, 4, 16, VisitOrder::max_first, 2)},
      {{1, 200, 17, 2, 1, 8, 8, true}, skip_cfg(0.1, 8, 4)},
      {{1, 64, 96, 4, 1, 16, 16, false}, [] {
         SkipConfig s = skip_cfg(0.3, 4, 8, VisitOrder::max_first, 2);
         s.vote.split_tiles = 3;  // seeded splits
         return s;
       }()},
  };
  std::uint64_t seed = 500;
  for (const S& t : cases) {
    const Shape& s = t.sh;
    SCOPED_TRACE(::testing::Message() << "Lq " << s.Lq << " Lk " << s.Lk << " Hq " << s.Hq << " Hk " << s.Hk
                                      << (s.causal ? " causal" : " full"));
    Case c(s.B, s.Lq, s.Lk, s.Hq, s.Hk, s.d, s.dv, s.causal, seed += 10, 3.0f);
    SkipSet set;
    c.forward(t.cfg, &set);
    ASSERT_EQ(set.batch, s.B);
    ASSERT_EQ(set.heads, s.Hq);
    const i64 total = set.batch * set.heads * set.groups * set.tiles;
    EXPECT_GT(set.count(), 0) << "the case must skip something";
    EXPECT_LT(set.count(), total);
    c.backward(t.cfg, &set);
    const Grads want = c.oracle(kept_by(set));
    expect_grads(c, want, 1e-11);
    // Skipping changed the gradient (else the case would not test the mask).
    EXPECT_GT(rel_err(c.dq, c.oracle(all_kept()).dq), 1e-6);
    const std::vector<double> dq = c.dq, dk = c.dk, dv = c.dv_;
    c.backward(t.cfg, nullptr);  // recomputed skip set
    EXPECT_EQ(c.dq, dq);
    EXPECT_EQ(c.dk, dk);
    EXPECT_EQ(c.dv_, dv);
  }
}

// Every vote group of a head group shares its decision (vote.heads = 2): bits agree across them.
TEST(Backward, RecordedSetMatchesStats) {
  Case c(1, 200, 200, 4, 2, 16, 16, true, 900, 2.0f);
  const SkipConfig cfg = skip_cfg(0.05, 8, 16, VisitOrder::natural, 2);
  SkipSet set;
  SkipStats st;
  RunOptions opt;
  opt.fp64 = true;
  opt.collect_stats = true;
  reference::attention(c.fwd(), cfg, opt, &st, &set);
  EXPECT_EQ(set.count(), 2 * st.total_skipped());  // one bit per query head of a 2-head group
  for (i64 h = 0; h < 4; h += 2)
    for (i64 g = 0; g < set.groups; ++g)
      for (i64 t = 0; t < set.tiles; ++t) EXPECT_EQ(set.skipped(0, h, g, t), set.skipped(0, h + 1, g, t));
}

// A wrong skip set gives a wrong gradient: one flipped bit (a kept tile with visible keys marked
// skipped) moves dQ, dK, dV away from the oracle of the true set.
TEST(Backward, WrongSkipSetIsDetected) {
  Case c(1, 200, 200, 2, 1, 16, 16, true, 1200, 2.0f);
  const SkipConfig cfg = skip_cfg(0.05, 8, 16);
  SkipSet set;
  c.forward(cfg, &set);
  const Grads want = c.oracle(kept_by(set));
  SkipSet wrong = set;
  // Group 10 (rows 80..87) keeps its diagonal tile 5 (keys 80..95): never skipped (it raises m).
  ASSERT_FALSE(wrong.skipped(0, 0, 10, 5));
  wrong.set(0, 0, 10, 5);
  c.backward(cfg, &wrong);
  EXPECT_GT(rel_err(c.dq, want.dq), 1e-4);
  EXPECT_GT(rel_err(c.dk, want.dk), 1e-4);
  EXPECT_GT(rel_err(c.dv_, want.dv), 1e-4);
}

// Central finite differences of L = sum(dO * O) + sum(dLSE * LSE) through the engine's own forward, dense and with
// skipping (the perturbation is small enough not to move a decision: checked).
TEST(Backward, FiniteDifferences) {
  for (const bool skip : {false, true}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (skip ? "skip" : "dense") << (causal ? " causal" : " full"));
      Case c(1, 9, 11, 2, 1, 4, 3, causal, skip ? 3000 : 3100, 2.0f);
      c.dlse = to_f64(randn(c.lse.size(), 3200));  // L also reads the LSE
      const SkipConfig cfg = skip ? skip_cfg(0.05, 2, 3) : SkipConfig{};
      SkipSet set;
      c.forward(cfg, &set);
      if (skip) {
        ASSERT_GT(set.count(), 0);
      }
      c.backward(cfg, skip ? &set : nullptr);
      const auto loss = [&]() {
        SkipSet s2;
        c.forward(cfg, &s2);
        EXPECT_EQ(s2.bits, set.bits) << "a perturbation moved a skip decision";
        double L = 0;
        for (std::size_t e = 0; e < c.out.size(); ++e) L += c.dout[e] * c.out[e];
        for (std::size_t e = 0; e < c.lse.size(); ++e) L += c.dlse[e] * c.lse[e];
        return L;
      };
      const double eps = 1e-6;
      for (auto [x, g, name] : {std::tuple{&c.q, &c.dq, "q"}, std::tuple{&c.k, &c.dk, "k"},
                                std::tuple{&c.v, &c.dv_, "v"}}) {
        const std::vector<double> grad = *g;
        for (std::size_t e = 0; e < x->size(); ++e) {
          const double x0 = (*x)[e];
          (*x)[e] = x0 + eps;
          const double lp = loss();
          (*x)[e] = x0 - eps;
          const double lm = loss();
          (*x)[e] = x0;
          EXPECT_NEAR((lp - lm) / (2 * eps), grad[e], 1e-6) << name << "[" << e << "]";
        }
      }
    }
  }
}

// A ragged batch equals each sequence run alone (bitwise), with skipping.
TEST(Backward, RaggedEqualsEachSequence) {
  const i64 Hq = 2, Hk = 1, d = 8, dv = 8;
  const i64 lq[] = {17, 1, 40}, lk[] = {30, 5, 40};
  const SkipConfig cfg = skip_cfg(0.05, 4, 8);
  std::vector<Case> seqs;
  std::vector<double> q, k, v, dout, out, lse_t;
  std::vector<std::int32_t> cq{0}, ck{0};
  i64 skipped = 0;
  for (int b = 0; b < 3; ++b) {
    seqs.emplace_back(1, lq[b], lk[b], Hq, Hk, d, dv, true, 4000 + 10 * b, 2.0f);
    Case& c = seqs.back();
    SkipSet set;
    c.forward(cfg, &set);
    skipped += set.count();
    c.backward(cfg, nullptr);
    q.insert(q.end(), c.q.begin(), c.q.end());
    k.insert(k.end(), c.k.begin(), c.k.end());
    v.insert(v.end(), c.v.begin(), c.v.end());
    dout.insert(dout.end(), c.dout.begin(), c.dout.end());
    out.insert(out.end(), c.out.begin(), c.out.end());
    cq.push_back(cq.back() + static_cast<std::int32_t>(lq[b]));
    ck.push_back(ck.back() + static_cast<std::int32_t>(lk[b]));
  }
  EXPECT_GT(skipped, 0) << "the case must skip something";
  const i64 tq = cq.back(), tk = ck.back();
  lse_t.assign(Hq * tq, 0.0);  // [Hq, Tq]
  for (int b = 0; b < 3; ++b)
    for (i64 h = 0; h < Hq; ++h)
      for (i64 i = 0; i < lq[b]; ++i) lse_t[h * tq + cq[b] + i] = seqs[b].lse[h * lq[b] + i];
  std::vector<double> dq(q.size()), dk(k.size()), dvv(v.size());
  AttentionBackwardProblem p;
  p.q = Tensor::contiguous(q.data(), DType::f64, {tq, Hq, d});
  p.k = Tensor::contiguous(k.data(), DType::f64, {tk, Hk, d});
  p.v = Tensor::contiguous(v.data(), DType::f64, {tk, Hk, dv});
  p.out = Tensor::contiguous(out.data(), DType::f64, {tq, Hq, dv});
  p.dout = Tensor::contiguous(dout.data(), DType::f64, {tq, Hq, dv});
  p.lse = Tensor::contiguous(lse_t.data(), DType::f64, {Hq, tq});
  p.dq = Tensor::contiguous(dq.data(), DType::f64, {tq, Hq, d});
  p.dk = Tensor::contiguous(dk.data(), DType::f64, {tk, Hk, d});
  p.dv = Tensor::contiguous(dvv.data(), DType::f64, {tk, Hk, dv});
  p.cu_seqlens_q = cq.data();
  p.cu_seqlens_k = ck.data();
  p.batch = 3;
  p.mask = MaskKind::causal;
  RunOptions opt;
  opt.fp64 = true;
  attention_backward(p, cfg, opt);
  std::size_t oq = 0, ok = 0;
  for (int b = 0; b < 3; ++b) {
    const Case& c = seqs[b];
    EXPECT_TRUE(std::equal(c.dq.begin(), c.dq.end(), dq.begin() + oq)) << "dq of sequence " << b;
    EXPECT_TRUE(std::equal(c.dk.begin(), c.dk.end(), dk.begin() + ok)) << "dk of sequence " << b;
    EXPECT_TRUE(std::equal(c.dv_.begin(), c.dv_.end(), dvv.begin() + ok * dv / d)) << "dv of sequence " << b;
    oq += c.dq.size();
    ok += c.dk.size();
  }
}

// f32 tensors (the forward's usual output), threads: agree with the f64 oracle to float precision.
TEST(Backward, Float32TensorsAndThreads) {
  Dense f(2, 65, 65, 4, 2, 16, 16, 77);
  AttentionProblem fp = f.problem(MaskKind::causal);
  reference::attention(fp, {});
  std::vector<float> dout = randn(f.out.size(), 78), dq(f.q.size()), dk(f.k.size()), dv(f.v.size());
  AttentionBackwardProblem p;
  p.q = fp.q;
  p.k = fp.k;
  p.v = fp.v;
  p.out = fp.out;
  p.lse = fp.lse;
  p.mask = fp.mask;
  p.dout = Tensor::contiguous(dout.data(), DType::f32, {2, 65, 4, 16});
  p.dq = Tensor::contiguous(dq.data(), DType::f32, {2, 65, 4, 16});
  p.dk = Tensor::contiguous(dk.data(), DType::f32, {2, 65, 2, 16});
  p.dv = Tensor::contiguous(dv.data(), DType::f32, {2, 65, 2, 16});
  RunOptions opt;
  opt.num_threads = 3;
  attention_backward(p, {}, opt);
  const Grads want = naive_backward(to_f64(f.q), to_f64(f.k), to_f64(f.v), to_f64(dout), 2, 65, 65, 4, 2, 16,
                                    16, true, all_kept());
  EXPECT_LT(rel_err(dq, want.dq), 1e-5);
  EXPECT_LT(rel_err(dk, want.dk), 1e-5);
  EXPECT_LT(rel_err(dv, want.dv), 1e-5);
}

template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Backward, ValidationNamesTheArgument) {
  Case c(1, 17, 17, 2, 1, 8, 8, true, 5000);
  c.forward({}, nullptr);
  {
    auto p = c.bwd();
    p.lse.shape[1] = 3;
    expect_error([&] { attention_backward(p); }, "lse: ");
  }
  {
    auto p = c.bwd();
    p.dq.shape[1] = 16;
    expect_error([&] { attention_backward(p); }, "dq: shape");
  }
  {
    auto p = c.bwd();
    p.dout.dtype = DType::f16;
    expect_error([&] { attention_backward(p); }, "dout: dtype");
  }
  {
    auto p = c.bwd();
    p.dk.rank = 3;
    expect_error([&] { attention_backward(p); }, "dk: expected rank 4");
  }
  {
    auto p = c.bwd();
    p.dv.stride[3] = 2;
    expect_error([&] { attention_backward(p); }, "dv: the last dimension must be contiguous");
  }
  {
    auto p = c.bwd();
    p.dlse = p.lse;
    p.dlse.shape[2] = 3;
    expect_error([&] { attention_backward(p); }, "dlse: shape");
    p.lse = Tensor{};  // the layout is checked against q's without lse too
    expect_error([&] { attention_backward(p); }, "dlse: shape");
    p = c.bwd();
    p.dlse = p.lse;
    p.dlse.dtype = DType::bf16;
    expect_error([&] { attention_backward(p); }, "dlse: dtype");
  }
  {
    auto p = c.bwd();
    p.k.shape[3] = 4;
    expect_error([&] { attention_backward(p); }, "k: ");
  }
  {
    auto p = c.bwd();
    p.dq.device = DeviceKind::cuda;  // q on the host: the reference, which names the odd tensor
    expect_error([&] { attention_backward(p); }, "dq: tensor is on cuda but the call runs on cpu");
  }
  {
    auto p = c.bwd();
    RunOptions opt;
    opt.device = DeviceKind::cuda;  // the CUDA path: float64 tensors are refused before any CUDA work
    expect_error([&] { attention_backward(p, {}, opt); },
                 detail::cuda_built() ? "q: dtype f64 is not supported by the CUDA backward kernel" : "without CUDA");
  }
  {
    const SkipConfig cfg = skip_cfg(0.05, 4, 8);
    SkipSet set;
    c.forward(cfg, &set);
    SkipSet other = set;
    other.vote.rows = 8;
    expect_error([&] { attention_backward(c.bwd(), cfg, {}, &other); }, "skip_set: recorded with another vote");
    other = set;
    other.tiles += 1;
    expect_error([&] { attention_backward(c.bwd(), cfg, {}, &other); }, "skip_set: dimensions");
    other = set;
    other.bits.pop_back();
    expect_error([&] { attention_backward(c.bwd(), cfg, {}, &other); }, "skip_set: bits holds");
  }
}


// The skip set as 32-bit words (AttentionProblem::skip_set, SPEC §9): the reference forward writes
// exactly the SkipSet's bits (as little-endian words; poisoned words overwritten, the bits past the
// last pair zero), and the backward given those words equals the backward given the SkipSet,
// bit for bit. Ragged-free shape with a partial last tile, max-first order, a 2-head vote.
TEST(Backward, SkipSetWordsEqualTheSkipSet) {
  Case c(2, 150, 170, 4, 2, 16, 16, false, 1300, 3.0f);
  const SkipConfig cfg = skip_cfg(0.3, 16, 32, VisitOrder::max_first, 2);
  SkipSet set;
  c.forward(cfg, &set);
  ASSERT_GT(set.count(), 0) << "nothing skipped: the case does not test the set";
  ASSERT_LT(set.count(), set.batch * set.heads * set.groups * set.tiles) << "everything skipped";

  AttentionProblem f = c.fwd();
  const SkipSetShape shape = skip_set_shape(f, cfg);
  EXPECT_EQ(shape.batch, 2);
  EXPECT_EQ(shape.heads, 4);
  EXPECT_EQ(shape.groups, (150 + 15) / 16);
  EXPECT_EQ(shape.tiles, (170 + 31) / 32);
  EXPECT_EQ(shape.vote.rows, 16);
  EXPECT_EQ(shape.words(), (2 * 4 * 10 * 6 + 31) / 32);
  std::vector<std::uint32_t> words(std::size_t(shape.words()), 0xffffffffu);
  f.skip_set = words.data();
  f.skip_set_words = std::int64_t(words.size());
  RunOptions opt;
  opt.fp64 = true;
  reference::attention(f, cfg, opt);
  for (i64 i = 0; i < std::int64_t(words.size()) * 32; ++i) {
    const bool got = (words[std::size_t(i / 32)] >> (i % 32)) & 1u;
    const bool want = i < shape.pairs() && ((set.bits[std::size_t(i / 8)] >> (i % 8)) & 1u);
    ASSERT_EQ(got, want) << "bit " << i;
  }

  c.backward(cfg, &set);
  const std::vector<double> dq = c.dq, dk = c.dk, dv = c.dv_;
  AttentionBackwardProblem b = c.bwd();
  b.skip_set = words.data();
  b.skip_set_words = std::int64_t(words.size());
  reference::attention_backward(b, cfg, opt);
  EXPECT_EQ(c.dq, dq);
  EXPECT_EQ(c.dk, dk);
  EXPECT_EQ(c.dv_, dv);
  // The words are what the backward reads: a flipped kept bit moves the gradient.
  ASSERT_FALSE(set.skipped(1, 3, 5, 2));
  const i64 i = set.index(1, 3, 5, 2);
  words[std::size_t(i / 32)] |= 1u << (i % 32);
  b = c.bwd();
  b.skip_set = words.data();
  b.skip_set_words = std::int64_t(words.size());
  reference::attention_backward(b, cfg, opt);
  EXPECT_NE(c.dq, dq);
}

// The CUDA path's shape is the prefill kernel's vote (64 rows x 1 head x 128 keys) whatever
// skip.vote says; max_seqlen bounds set the dimensions; bad word counts are clear errors.
TEST(Backward, SkipSetShapeAndErrors) {
  Case c(1, 200, 300, 2, 1, 16, 16, true, 1400);
  const SkipConfig cfg = skip_cfg(0.05, 16, 32);
  AttentionProblem f = c.fwd();
  RunOptions cuda;
  cuda.device = DeviceKind::cuda;
  const SkipSetShape k = skip_set_shape(f, cfg, cuda);
  EXPECT_EQ(k.vote.rows, 64);
  EXPECT_EQ(k.vote.tile_keys, 128);
  EXPECT_EQ(k.vote.heads, 1);
  EXPECT_EQ(k.groups, 4);
  EXPECT_EQ(k.tiles, 3);
  EXPECT_EQ(k.words(), 1);

  std::vector<std::uint32_t> words(8, 0);
  f.skip_set = words.data();
  f.skip_set_words = skip_set_shape(f, cfg).words() - 1;
  expect_error([&] { reference::attention(f, cfg); }, "skip_set_words: ");
  f.skip_set = nullptr;
  f.skip_set_words = 4;
  expect_error([&] { reference::attention(f, cfg); }, "skip_set_words: given without skip_set");
  f.skip_set_words = -1;
  expect_error([&] { reference::attention(f, cfg); }, "skip_set_words must be >= 0");

  SkipSet set;
  c.forward(cfg, &set);
  AttentionBackwardProblem b = c.bwd();
  b.skip_set = words.data();
  b.skip_set_words = std::int64_t(words.size());
  expect_error([&] { reference::attention_backward(b, cfg, {}, &set); }, "skip_set: given twice");
  b.skip_set_words = 0;
  expect_error([&] { reference::attention_backward(b, cfg); }, "skip_set_words: 0 words cannot hold");
}

}  // namespace
}  // namespace blasst::test
