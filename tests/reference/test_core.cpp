// Core host logic (enums, Tensor, threshold, histogram, gating, half) and the reference's layouts
// (ragged, decode, paged, 16-bit inputs), plus the workload generators.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "blasst/gating.hpp"
#include "blasst/half.hpp"
#include "blasst/workloads.hpp"
#include "common.hpp"
#include "core/visit_cursor.hpp"

using namespace blasst;
using namespace blasst::test;

// The kernels' step-by-step visit order against the SPEC §2a definition written out directly:
// the sink tile, the own tile, then the rest by distance from own, the left one first at equal
// distance; own <= 1 (and -1, the kernels' "natural") is the natural order.
TEST(Core, VisitCursorMatchesSpecOrder) {
  for (int n = 1; n <= 70; ++n)
    for (int own = -1; own < n; ++own) {
      std::vector<int> want{0};
      if (own > 0) want.push_back(own);
      std::vector<int> rest;
      for (int t = 1; t < n; ++t)
        if (t != own) rest.push_back(t);
      const int o = own < 0 ? 0 : own;
      std::stable_sort(rest.begin(), rest.end(), [o](int a, int b) {
        const int da = std::abs(a - o), db = std::abs(b - o);
        return da != db ? da < db : a < b;
      });
      want.insert(want.end(), rest.begin(), rest.end());
      detail::VisitCursor c(n, own);
      std::vector<int> got;
      for (int step = 0; step < n; ++step, c.advance()) got.push_back(c.tile);
      ASSERT_EQ(got, want) << "n " << n << " own " << own;
    }
}

TEST(Core, EnumsRoundTrip) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64}) EXPECT_EQ(parse_dtype(to_string(t)), t);
  for (Phase p : {Phase::prefill, Phase::decode}) EXPECT_EQ(parse_phase(to_string(p)), p);
  for (VisitOrder o : {VisitOrder::natural, VisitOrder::max_first}) EXPECT_EQ(parse_visit_order(to_string(o)), o);
  for (WorkloadKind k : {WorkloadKind::random, WorkloadKind::llm, WorkloadKind::dit})
    EXPECT_EQ(parse_workload(to_string(k)), k);
  EXPECT_THROW(parse_dtype("f8"), Error);
  EXPECT_THROW(parse_phase("train"), Error);
  EXPECT_THROW(parse_visit_order("random"), Error);
  EXPECT_THROW(parse_workload("vit"), Error);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_STREQ(to_string(MaskKind::causal), "causal");
}

TEST(Core, TensorHelpers) {
  float buf[24];
  Tensor t = Tensor::contiguous(buf, DType::f32, {2, 3, 4});
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.stride[0], 12);
  EXPECT_EQ(t.stride[1], 4);
  EXPECT_EQ(t.stride[2], 1);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  t.stride[0] = 13;
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_THROW(Tensor::contiguous(buf, DType::f32, {1, 2, 3, 4, 5}), Error);
  EXPECT_THROW(Tensor::contiguous(buf, DType::f32, {-1}), Error);
}

TEST(Core, ResolveLambdaPrecedenceAndErrors) {
  SkipConfig c = SkipConfig::from_calibration({2.0, 3.0}, 0.5);
  EXPECT_DOUBLE_EQ(resolve_lambda(c, 1000), 2.0 * std::exp(1.5) / 1000.0);
  c.factor = 50.0;  // factor beats calibration
  EXPECT_DOUBLE_EQ(resolve_lambda(c, 1000), 0.05);
  c.threshold = 0.003;  // threshold beats both
  EXPECT_DOUBLE_EQ(resolve_lambda(c, 1000), 0.003);
  EXPECT_DOUBLE_EQ(resolve_lambda(SkipConfig::from_factor(5000), 1000), 5.0);  // >= 1: dense
  EXPECT_THROW(resolve_lambda(SkipConfig::from_factor(5), 0), Error);
  EXPECT_THROW(resolve_lambda(SkipConfig::from_factor(std::nan("")), 10), Error);
  EXPECT_THROW(resolve_lambda(SkipConfig::from_threshold(-1), 10), Error);
  EXPECT_THROW(resolve_lambda(SkipConfig::from_calibration({1, 1}, 2.0), 10), Error);
  EXPECT_THROW(resolve_lambda(SkipConfig{}, 10), Error);  // nothing to resolve
  EXPECT_NO_THROW(validate(SkipConfig{}));
}

TEST(Core, HistogramCurve) {
  DeltaHistogram h;
  EXPECT_EQ(h.sparsity_at(0.5), 0.0);
  const std::vector<double> d = {-100.0, -10.0, -5.0, -5.0, -1.0, -0.5, -0.0625, 0.0, 3.0, INFINITY, NAN};
  for (double x : d) h.add(x);
  EXPECT_EQ(h.total(), d.size());
  EXPECT_EQ(DeltaHistogram::bin_of(-100.0), 0);
  EXPECT_EQ(DeltaHistogram::bin_of(NAN), DeltaHistogram::kBins + 1);
  EXPECT_EQ(DeltaHistogram::bin_of(-64.0), 1);
  EXPECT_EQ(DeltaHistogram::bin_of(-0.0625), DeltaHistogram::kBins);
  // At bin edges the curve is the exact count of delta < ln(lambda).
  for (double e : {-64.0, -10.0, -5.0, -4.9375, -1.0, -0.5, -0.0625}) {
    std::size_t below = 0;
    for (double x : d) below += x < e;
    EXPECT_DOUBLE_EQ(h.sparsity_at(std::exp(e)), double(below) / d.size()) << e;
  }
  EXPECT_DOUBLE_EQ(h.sparsity_at(1.0), 7.0 / 11.0);
  EXPECT_THROW(h.sparsity_at(NAN), Error);
  // lambda_for inverts the curve.
  const double lam = h.lambda_for(3.0 / 11.0);
  EXPECT_GE(h.sparsity_at(lam), 3.0 / 11.0 - 1e-12);
  EXPECT_LE(lam, std::exp(-5.0) * std::exp(1.0 / 16) + 1e-15);
  EXPECT_TRUE(std::isinf(h.lambda_for(1.0)));
  EXPECT_THROW(h.lambda_for(1.5), Error);
  DeltaHistogram h2;
  h2.merge(h);
  h2.merge(h);
  EXPECT_EQ(h2.total(), 2 * d.size());
  SkipStats st;
  EXPECT_EQ(st.sparsity(), 0.0);
  st.visited = {10, 30};
  st.skipped = {5, 5};
  EXPECT_EQ(st.total_visited(), 40);
  EXPECT_DOUBLE_EQ(st.sparsity(), 0.25);
}

TEST(Core, TimestepGate) {
  TimestepGate none;
  EXPECT_TRUE(none.active());
  TimestepGate g(0.86);
  EXPECT_FALSE(g.active());  // D set, nothing published: dense (warns once)
  EXPECT_FALSE(g.active());
  g.record_timestep(999, 1000);
  EXPECT_FALSE(g.active());
  g.record_timestep(860, 1000);
  EXPECT_TRUE(g.active());
  g.record_sigma(0.1);
  EXPECT_TRUE(g.active());
  EXPECT_DOUBLE_EQ(*g.current(), 0.1);
  g.reset();
  EXPECT_FALSE(g.active());
  EXPECT_THROW(TimestepGate(1.5), Error);
  EXPECT_THROW(TimestepGate(std::nan("")), Error);
  EXPECT_THROW(g.record_timestep(1001, 1000), Error);
  EXPECT_THROW(g.record_timestep(10, 0), Error);
  EXPECT_THROW(g.record_sigma(-0.1), Error);
  TimestepGate zero(0.0);
  zero.record_sigma(0.0);
  EXPECT_TRUE(zero.active());
}

TEST(Core, HalfConversionsRoundTrip) {
  // Every finite 16-bit pattern survives 16 -> float -> 16 (NaN stays NaN).
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const std::uint16_t x = static_cast<std::uint16_t>(h);
    const float f = f16_to_float(x), b = bf16_to_float(x);
    if (std::isnan(f)) EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
    else ASSERT_EQ(float_to_f16(f), x) << h;
    if (std::isnan(b)) EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(b))));
    else ASSERT_EQ(float_to_bf16(b), x) << h;
  }
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 1.0f / 4096)), 1.0f);  // ties to even
  EXPECT_EQ(f16_to_float(float_to_f16(65520.0f)), INFINITY);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
}

TEST(Core, HalfInputsMatchNaiveOnDequantisedData) {
  for (DType t : {DType::f16, DType::bf16}) {
    Dense D(1, 130, 200, 4, 2, 32, 32, 40);
    auto conv = [&](std::vector<float>& x, std::vector<std::uint16_t>& h) {
      h.resize(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        h[i] = t == DType::f16 ? float_to_f16(x[i]) : float_to_bf16(x[i]);
        x[i] = t == DType::f16 ? f16_to_float(h[i]) : bf16_to_float(h[i]);
      }
    };
    std::vector<std::uint16_t> qh, kh, vh, oh(D.out.size());
    conv(D.q, qh);
    conv(D.k, kh);
    conv(D.v, vh);
    AttentionProblem p = D.problem(MaskKind::causal);
    p.q = Tensor::contiguous(qh.data(), t, {1, 130, 4, 32});
    p.k = Tensor::contiguous(kh.data(), t, {1, 200, 2, 32});
    p.v = Tensor::contiguous(vh.data(), t, {1, 200, 2, 32});
    reference::attention(p);  // f32 output
    std::vector<double> o, l;
    naive(D.q, D.k, D.v, 1, 130, 200, 4, 2, 32, 32, true, o, l);
    EXPECT_LT(rel_err(D.out, o), 1e-6);
    const auto out32 = D.out;
    p.out = Tensor::contiguous(oh.data(), t, {1, 130, 4, 32});  // output in q's dtype
    reference::attention(p);
    for (std::size_t i = 0; i < oh.size(); ++i) {
      const std::uint16_t want = t == DType::f16 ? float_to_f16(out32[i]) : float_to_bf16(out32[i]);
      ASSERT_EQ(oh[i], want) << i;
    }
  }
}

TEST(Core, StridedInputsMatchContiguous) {
  // q embedded in a wider buffer (head-dim padding) and lse with a padded row stride.
  Dense D(2, 50, 70, 2, 1, 16, 16, 41);
  reference::attention(D.problem(MaskKind::causal));
  const auto out0 = D.out, lse0 = D.lse;
  std::vector<float> qpad(2 * 50 * 2 * 24, NAN), lpad(2 * 2 * 64, NAN);
  for (std::int64_t r = 0; r < 2 * 50 * 2; ++r)
    for (int c = 0; c < 16; ++c) qpad[r * 24 + c] = D.q[r * 16 + c];
  AttentionProblem p = D.problem(MaskKind::causal);
  p.q.data = qpad.data();
  p.q.stride[2] = 24;
  p.q.stride[1] = 48;
  p.q.stride[0] = 2400;
  p.lse.data = lpad.data();
  p.lse.stride[1] = 64;
  p.lse.stride[0] = 128;
  reference::attention(p);
  EXPECT_EQ(0, std::memcmp(out0.data(), D.out.data(), out0.size() * 4));
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 50; ++i) EXPECT_EQ(lpad[b * 128 + h * 64 + i], lse0[(b * 2 + h) * 50 + i]);
}

TEST(Core, RaggedEqualsEachSequenceAlone) {
  const std::vector<std::int64_t> lq = {1, 17, 0, 200, 129}, lk = {5, 17, 3, 129, 300};
  const std::int64_t Hq = 4, Hk = 2, d = 32;
  std::vector<std::int32_t> cq = {0}, ck = {0};
  for (std::size_t b = 0; b < lq.size(); ++b) {
    cq.push_back(cq.back() + static_cast<std::int32_t>(lq[b]));
    ck.push_back(ck.back() + static_cast<std::int32_t>(lk[b]));
  }
  const std::int64_t Tq = cq.back(), Tk = ck.back();
  auto q = randn(Tq * Hq * d, 50), k = randn(Tk * Hk * d, 51), v = randn(Tk * Hk * d, 52);
  std::vector<float> o(Tq * Hq * d, NAN), l(Hq * Tq, NAN);
  AttentionProblem p;
  p.q = Tensor::contiguous(q.data(), DType::f32, {Tq, Hq, d});
  p.k = Tensor::contiguous(k.data(), DType::f32, {Tk, Hk, d});
  p.v = Tensor::contiguous(v.data(), DType::f32, {Tk, Hk, d});
  p.out = Tensor::contiguous(o.data(), DType::f32, {Tq, Hq, d});
  p.lse = Tensor::contiguous(l.data(), DType::f32, {Hq, Tq});
  p.cu_seqlens_q = cq.data();
  p.cu_seqlens_k = ck.data();
  p.batch = static_cast<std::int64_t>(lq.size());
  p.mask = MaskKind::causal;
  SkipStats st;
  RunOptions opt;
  opt.collect_stats = true;
  reference::attention(p, SkipConfig::from_factor(20.0).with_order(VisitOrder::natural), opt, &st);
  ASSERT_EQ(st.lambda.size(), lq.size());
  for (std::size_t b = 0; b < lq.size(); ++b) {
    EXPECT_DOUBLE_EQ(st.lambda[b], 20.0 / lk[b]);
    // The same sequence alone, as a B = 1 problem.
    std::vector<float> oq(lq[b] * Hq * d), ol(Hq * lq[b]);
    AttentionProblem s;
    s.q = Tensor::contiguous(q.data() + cq[b] * Hq * d, DType::f32, {1, lq[b], Hq, d});
    s.k = Tensor::contiguous(k.data() + ck[b] * Hk * d, DType::f32, {1, lk[b], Hk, d});
    s.v = Tensor::contiguous(v.data() + ck[b] * Hk * d, DType::f32, {1, lk[b], Hk, d});
    s.out = Tensor::contiguous(oq.data(), DType::f32, {1, lq[b], Hq, d});
    s.lse = Tensor::contiguous(ol.data(), DType::f32, {1, Hq, lq[b]});
    s.mask = MaskKind::causal;
    reference::attention(s, SkipConfig::from_factor(20.0).with_order(VisitOrder::natural));
    for (std::int64_t i = 0; i < lq[b] * Hq * d; ++i) ASSERT_EQ(o[cq[b] * Hq * d + i], oq[i]);
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < lq[b]; ++i) ASSERT_EQ(l[h * Tq + cq[b] + i], ol[h * lq[b] + i]);
  }
}

TEST(Core, DecodeContiguousAndPagedMatchAttention) {
  const std::int64_t B = 3, qlen = 2, Hq = 8, Hk = 2, d = 64, ps = 16, maxp = 40;
  const std::vector<std::int32_t> sl = {1, 300, 637};
  const std::int64_t Lmax = ps * maxp;
  auto q = randn(B * qlen * Hq * d, 60), kc = randn(B * Lmax * Hk * d, 61), vc = randn(B * Lmax * Hk * d, 62);
  SkipConfig cfg = SkipConfig::from_threshold(0.01).with_order(VisitOrder::natural);
  cfg.vote.rows = qlen;
  cfg.vote.heads = Hq / Hk;
  RunOptions opt;
  opt.record_deltas = true;
  // Contiguous cache.
  std::vector<float> o1(B * qlen * Hq * d, NAN), l1(B * Hq * qlen, NAN);
  DecodeProblem p;
  p.q = Tensor::contiguous(q.data(), DType::f32, {B, qlen, Hq, d});
  p.k_cache = Tensor::contiguous(kc.data(), DType::f32, {B, Lmax, Hk, d});
  p.v_cache = Tensor::contiguous(vc.data(), DType::f32, {B, Lmax, Hk, d});
  p.seqlens_k = sl.data();
  p.out = Tensor::contiguous(o1.data(), DType::f32, {B, qlen, Hq, d});
  p.lse = Tensor::contiguous(l1.data(), DType::f32, {B, Hq, qlen});
  SkipStats s1;
  reference::decode(p, cfg, opt, &s1);
  // Paged: the same keys scattered over pages in a shuffled order.
  const std::int64_t np = B * maxp;
  std::vector<std::int32_t> perm(np);
  for (std::int64_t i = 0; i < np; ++i) perm[i] = static_cast<std::int32_t>((i * 37 + 11) % np);
  std::vector<float> kp(np * ps * Hk * d), vp(np * ps * Hk * d);
  std::vector<std::int32_t> table(B * maxp);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t pg = 0; pg < maxp; ++pg) {
      const std::int32_t phys = perm[b * maxp + pg];
      table[b * maxp + pg] = phys;
      std::memcpy(&kp[phys * ps * Hk * d], &kc[(b * Lmax + pg * ps) * Hk * d], ps * Hk * d * 4);
      std::memcpy(&vp[phys * ps * Hk * d], &vc[(b * Lmax + pg * ps) * Hk * d], ps * Hk * d * 4);
    }
  std::vector<float> o2(o1.size(), NAN), l2(l1.size(), NAN);
  DecodeProblem pp = p;
  pp.k_cache = Tensor::contiguous(kp.data(), DType::f32, {np, ps, Hk, d});
  pp.v_cache = Tensor::contiguous(vp.data(), DType::f32, {np, ps, Hk, d});
  pp.page_table = table.data();
  pp.page_table_stride = maxp;
  pp.out = Tensor::contiguous(o2.data(), DType::f32, {B, qlen, Hq, d});
  pp.lse = Tensor::contiguous(l2.data(), DType::f32, {B, Hq, qlen});
  SkipStats s2;
  reference::decode(pp, cfg, opt, &s2);
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * 4));
  EXPECT_EQ(0, std::memcmp(l1.data(), l2.data(), l1.size() * 4));
  EXPECT_EQ(s1.deltas, s2.deltas);
  EXPECT_EQ(s1.visited.size(), static_cast<std::size_t>(Hk));  // heads = g: per KV head
  // Each sequence equals causal attention with Lq = qlen (bottom-right aligned), dense.
  for (std::int64_t b = 0; b < B; ++b) {
    std::vector<float> qb(q.begin() + b * qlen * Hq * d, q.begin() + (b + 1) * qlen * Hq * d);
    std::vector<float> kb(kc.begin() + b * Lmax * Hk * d, kc.begin() + (b * Lmax + sl[b]) * Hk * d);
    std::vector<float> vb(vc.begin() + b * Lmax * Hk * d, vc.begin() + (b * Lmax + sl[b]) * Hk * d);
    std::vector<double> o, l;
    naive(qb, kb, vb, 1, qlen, sl[b], Hq, Hk, d, d, true, o, l);
    std::vector<float> od(qlen * Hq * d), ld(Hq * qlen);
    DecodeProblem pd = p;
    pd.q = Tensor::contiguous(qb.data(), DType::f32, {1, qlen, Hq, d});
    pd.k_cache = Tensor::contiguous(kb.data(), DType::f32, {1, sl[b], Hk, d});
    pd.v_cache = Tensor::contiguous(vb.data(), DType::f32, {1, sl[b], Hk, d});
    pd.seqlens_k = nullptr;
    pd.out = Tensor::contiguous(od.data(), DType::f32, {1, qlen, Hq, d});
    pd.lse = Tensor::contiguous(ld.data(), DType::f32, {1, Hq, qlen});
    reference::decode(pd);
    EXPECT_LT(rel_err(od, o), 1e-6) << b;
    for (std::int64_t i = 0; i < Hq * qlen; ++i) {
      if (std::isinf(l[i])) EXPECT_TRUE(std::isinf(ld[i]) && ld[i] < 0);  // seqlen 1, row 0 masked
      else EXPECT_NEAR(ld[i], l[i], 1e-5);
    }
  }
}

TEST(Workloads, SeededShapesAndStructure) {
  for (WorkloadKind kind : {WorkloadKind::random, WorkloadKind::llm, WorkloadKind::dit}) {
    WorkloadSpec s;
    s.kind = kind;
    s.batch = 2;
    s.seq_len = 300;
    s.heads_q = 4;
    s.heads_k = 2;
    s.head_dim = 64;
    s.seed = 7;
    const Workload a = make_workload(s), b = make_workload(s);
    EXPECT_EQ(a.q.size(), 2u * 300 * 4 * 64);
    EXPECT_EQ(a.k.size(), 2u * 300 * 2 * 64);
    EXPECT_EQ(a.v.size(), a.k.size());
    EXPECT_EQ(a.q, b.q);
    EXPECT_EQ(a.k, b.k);
    EXPECT_EQ(a.v, b.v);
    s.seed = 8;
    EXPECT_NE(make_workload(s).q, a.q);
    for (float x : a.q) ASSERT_TRUE(std::isfinite(x));
  }
  WorkloadSpec bad;
  bad.heads_q = 3;
  bad.heads_k = 2;
  EXPECT_THROW(make_workload(bad), Error);
  bad.heads_q = 4;
  bad.seq_len = 0;
  EXPECT_THROW(make_workload(bad), Error);
}

TEST(Workloads, StructuredKindsAreSparserThanRandom) {
  auto sparsity = [](WorkloadKind kind, MaskKind mask) {
    WorkloadSpec s;
    s.kind = kind;
    s.seq_len = 2048;
    s.heads_q = s.heads_k = 2;
    s.head_dim = 64;
    Workload w = make_workload(s);
    std::vector<float> o(w.q.size());
    AttentionProblem p;
    p.q = Tensor::contiguous(w.q.data(), DType::f32, {1, 2048, 2, 64});
    p.k = Tensor::contiguous(w.k.data(), DType::f32, {1, 2048, 2, 64});
    p.v = Tensor::contiguous(w.v.data(), DType::f32, {1, 2048, 2, 64});
    p.out = Tensor::contiguous(o.data(), DType::f32, {1, 2048, 2, 64});
    p.mask = mask;
    SkipStats st;
    RunOptions opt;
    opt.collect_stats = true;
    reference::attention(p, SkipConfig::from_threshold(0.05).with_order(VisitOrder::natural), opt, &st);
    return st.sparsity();
  };
  const double r = sparsity(WorkloadKind::random, MaskKind::causal);
  const double l = sparsity(WorkloadKind::llm, MaskKind::causal);
  const double d = sparsity(WorkloadKind::dit, MaskKind::full);
  EXPECT_LT(r, 0.05);
  EXPECT_GT(l, 0.1);
  EXPECT_GT(d, 0.1);
}

// DecodePlan on CPU tensors: each run is decode() of the planned problem with the run's q, out and
// lse (equal to the byte, across a cache write and raised lengths between runs); an lse given to a
// plan without one, or missing from a plan with one, is refused; host tensors for the CUDA path
// (which decode() stages) are refused by the plan, before any CUDA call.
TEST(Core, DecodePlanRunsTheDecodeOfItsProblem) {
  const std::int64_t B = 2, Lmax = 300, Hq = 4, Hk = 2, d = 16;
  std::vector<float> kc(B * Lmax * Hk * d), vc(kc.size()), q1(B * Hq * d), q2(q1.size());
  std::uint64_t x = 12345;
  auto rnd = [&x]() {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((x >> 40) % 2001) / 1000.0f - 1.0f;
  };
  for (auto* v : {&kc, &vc, &q1, &q2})
    for (float& e : *v) e = rnd();
  std::vector<std::int32_t> sl = {200, 131};
  std::vector<float> out_p(q1.size(), NAN), lse_p(B * Hq, NAN), out_d(q1.size(), NAN), lse_d(B * Hq, NAN);
  DecodeProblem p;
  p.q = Tensor::contiguous(q1.data(), DType::f32, {B, 1, Hq, d});
  p.k_cache = Tensor::contiguous(kc.data(), DType::f32, {B, Lmax, Hk, d});
  p.v_cache = Tensor::contiguous(vc.data(), DType::f32, {B, Lmax, Hk, d});
  p.seqlens_k = sl.data();
  p.out = Tensor::contiguous(out_p.data(), DType::f32, {B, 1, Hq, d});
  p.lse = Tensor::contiguous(lse_p.data(), DType::f32, {B, Hq, 1});
  const SkipConfig cfg = SkipConfig::from_threshold(0.05);
  DecodePlan plan(p, cfg);
  for (int step = 0; step < 2; ++step) {
    const std::vector<float>& q = step == 0 ? q1 : q2;
    std::fill(out_p.begin(), out_p.end(), NAN);
    plan.run(q.data(), out_p.data(), lse_p.data());
    DecodeProblem pd = p;
    pd.q.data = const_cast<float*>(q.data());
    pd.out.data = out_d.data();
    pd.lse.data = lse_d.data();
    decode(pd, cfg);
    EXPECT_EQ(0, std::memcmp(out_p.data(), out_d.data(), out_p.size() * 4)) << "step " << step;
    EXPECT_EQ(0, std::memcmp(lse_p.data(), lse_d.data(), lse_p.size() * 4)) << "step " << step;
    kc[(0 * Lmax + 7) * Hk * d] += 1.0f;  // a cache write, then one more key each
    for (auto& l : sl) ++l;
  }
  EXPECT_THROW(plan.run(q1.data(), out_p.data(), nullptr), Error);  // the plan has an lse
  DecodeProblem nolse = p;
  nolse.lse = Tensor{};
  DecodePlan plan2(nolse, cfg);
  EXPECT_THROW(plan2.run(q1.data(), out_p.data(), lse_p.data()), Error);
  RunOptions staged;
  staged.device = DeviceKind::cuda;
  EXPECT_THROW(DecodePlan(p, cfg, staged), Error);
}
