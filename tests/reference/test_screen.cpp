// SPEC §2b on the reference engine: the e4m3 conversions against the format's definition, the
// strict screen (no wrong screen, the plain skip path's results bit for bit), the tight screen's
// wrong screens against an independent float64 recount, a crafted wrong screen at z = 0, and
// the configuration's validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/fp8.hpp"
#include "blasst/workloads.hpp"
#include "reference/common.hpp"

namespace blasst {
namespace {

using test::Dense;
using test::llm_dense;
constexpr double kInfD = std::numeric_limits<double>::infinity();

// ---- e4m3 from its definition -------------------------------------------------------------------

// The value of a code from the format's definition, in float64 (NaN for 0x7f / 0xff).
double e4m3_formula(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? (m / 8.0) * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}

// Brute force: the finite code nearest to x (ties: the even code), saturating beyond +-448.
int nearest_code(double x) {
  int best = -1;
  double bd = kInfD;
  for (int c = 0; c < 256; ++c) {
    const double v = e4m3_formula(c);
    if (std::isnan(v) || (std::signbit(v) != std::signbit(x))) continue;
    const double dist = std::fabs(x - v);
    if (dist < bd || (dist == bd && (c & 1) == 0)) {
      bd = dist;
      best = c;
    }
  }
  return best;
}

TEST(Fp8, EveryCodeDecodesToTheFormula) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_formula(c);
    const float got = e4m3_to_float(static_cast<std::uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      ++nans;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;  // -0 at 0x80
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8, EncodeRoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(static_cast<std::uint8_t>(c));
    if (std::isnan(v)) {
      EXPECT_EQ(float_to_e4m3(v) & 0x7f, 0x7f);
      continue;
    }
    EXPECT_EQ(float_to_e4m3(v), c) << c;
  }
}

TEST(Fp8, EncodeIsNearestWithTiesToEvenAndSaturates) {
  int ties = 0, checked = 0;
  // Every midpoint between neighbouring finite codes (exact in float: 5 significant bits), and
  // one float step either side of it.
  for (int c = 0; c < 0x7e; ++c)
    for (const double sgn : {1.0, -1.0}) {
      const double mid = sgn * 0.5 * (std::fabs(e4m3_formula(c)) + std::fabs(e4m3_formula(c + 1)));
      const float m = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(m), mid);
      const int even = (c & 1) == 0 ? c : c + 1;
      EXPECT_EQ(float_to_e4m3(m), (sgn < 0 ? 0x80 : 0) | even) << mid;
      EXPECT_EQ(float_to_e4m3(m), nearest_code(mid)) << mid;
      ++ties;
      for (const float x : {std::nextafter(m, 0.0f), std::nextafter(m, static_cast<float>(sgn) * 1e9f)}) {
        EXPECT_EQ(float_to_e4m3(x), nearest_code(static_cast<double>(x))) << x;
        ++checked;
      }
    }
  EXPECT_EQ(ties, 2 * 126);
  // Random magnitudes over the whole range (log-uniform, fixed seed), both signs.
  std::mt19937_64 g(19);
  std::uniform_real_distribution<double> le(-14.0, 9.5), u(0.0, 1.0);
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>((u(g) < 0.5 ? -1 : 1) * std::exp2(le(g)));
    ASSERT_EQ(float_to_e4m3(x), nearest_code(static_cast<double>(x))) << x;
    ++checked;
  }
  EXPECT_GT(checked, 20000);
  // Saturation (satfinite): beyond 448, infinities included, to +-448; NaN stays NaN.
  for (const float x : {448.0f, 449.0f, 464.0f, 479.0f, 480.0f, 1e30f, std::numeric_limits<float>::max(),
                        std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(float_to_e4m3(x), 0x7e) << x;
    EXPECT_EQ(float_to_e4m3(-x), 0xfe) << x;
  }
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
  // Below the smallest subnormal 2^-9: half of it is a tie to 0 (even), a little more is 2^-9.
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10) * 1.0001f), 0x01);
  EXPECT_EQ(float_to_e4m3(-std::ldexp(1.0f, -11)), 0x80);
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
}

// ---- the screen on the engine -------------------------------------------------------------------


// Random data with a sink: every query row gets alpha * u, key 0 of every KV head is beta * u
// (u a fixed random unit vector), so key 0 dominates every row and later tiles fall far below.
Dense sink_dense(std::int64_t L, std::int64_t Hq, std::int64_t Hk, std::int64_t d, std::uint64_t seed) {
  Dense D(1, L, L, Hq, Hk, d, d, seed);
  std::vector<float> u = test::randn(d, seed + 7);
  double n = 0;
  for (float x : u) n += static_cast<double>(x) * x;
  for (float& x : u) x = static_cast<float>(x / std::sqrt(n));
  for (std::int64_t i = 0; i < L * Hq; ++i)
    for (std::int64_t c = 0; c < d; ++c) D.q[i * d + c] += 4.0f * u[c];
  for (std::int64_t kh = 0; kh < Hk; ++kh)
    for (std::int64_t c = 0; c < d; ++c) D.k[kh * d + c] = 20.0f * u[c];
  return D;
}

struct Result {
  SkipStats st;
  SkipSet set;
  std::vector<float> out, lse;
};

Result run(Dense& D, MaskKind mask, const SkipConfig& cfg, bool fp64 = false) {
  Result r;
  RunOptions opt;
  opt.num_threads = 2;
  opt.record_deltas = true;
  opt.fp64 = fp64;
  reference::attention(D.problem(mask), cfg, opt, &r.st, &r.set);
  r.out = D.out;
  r.lse = D.lse;
  return r;
}

SkipConfig cfg_of(double lambda, VisitOrder order, ScreenMargin margin, double z = 6.0, int rows = 64,
                  int heads = 1) {
  SkipConfig c = SkipConfig::from_threshold(lambda).with_order(order);
  c.vote.rows = rows;
  c.vote.heads = heads;
  c.screen.margin = margin;
  c.screen.z = z;
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The strict screen against the plain skip path on the same input: no wrong screen, some
// screened skips, and everything else equal bit for bit.
void expect_strict_equals_plain(Dense& D, MaskKind mask, double lambda, VisitOrder order, int rows, int heads,
                                bool fp64, const char* what) {
  SCOPED_TRACE(what);
  const Result plain = run(D, mask, cfg_of(lambda, order, ScreenMargin::off, 6.0, rows, heads), fp64);
  const Result scr = run(D, mask, cfg_of(lambda, order, ScreenMargin::strict, 6.0, rows, heads), fp64);
  EXPECT_TRUE(plain.st.screened.empty());  // off: no screen statistics
  ASSERT_EQ(scr.st.screened.size(), scr.st.visited.size());
  EXPECT_EQ(scr.st.total_screen_wrong(), 0);
  EXPECT_GT(scr.st.total_screened(), 0);  // the case this test exists for happened
  EXPECT_LE(scr.st.total_screened(), plain.st.total_skipped());
  EXPECT_GT(plain.st.total_skipped(), 0);
  EXPECT_EQ(scr.st.visited, plain.st.visited);
  EXPECT_EQ(scr.st.skipped, plain.st.skipped);
  EXPECT_TRUE(same_bits(scr.st.deltas, plain.st.deltas));
  EXPECT_EQ(scr.set.bits, plain.set.bits);
  EXPECT_TRUE(same_bits(scr.out, plain.out));
  EXPECT_TRUE(same_bits(scr.lse, plain.lse));
  // The recorded screen deltas say which pairs were screened; each lies at or above its exact
  // delta (strict: the upper bound of section 2b).
  ASSERT_EQ(scr.st.screen_deltas.size(), scr.st.deltas.size());
  std::int64_t below = 0;
  for (std::size_t i = 0; i < scr.st.deltas.size(); ++i) {
    below += static_cast<double>(scr.st.screen_deltas[i]) < std::log(lambda);
    if (!std::isnan(scr.st.deltas[i])) EXPECT_GE(scr.st.screen_deltas[i], scr.st.deltas[i]) << i;
  }
  EXPECT_EQ(below, scr.st.total_screened());
  std::printf("  [%s] visited %lld, skipped %lld, screened %lld\n", what,
              static_cast<long long>(scr.st.total_visited()), static_cast<long long>(scr.st.total_skipped()),
              static_cast<long long>(scr.st.total_screened()));
}

TEST(Screen, StrictHasNoWrongScreenAndEqualsThePlainSkipPathOnASinkInput) {
  Dense D = sink_dense(1024, 2, 1, 64, 31);
  expect_strict_equals_plain(D, MaskKind::full, 0.2, VisitOrder::natural, 64, 1, false, "sink full natural");
  expect_strict_equals_plain(D, MaskKind::causal, 0.2, VisitOrder::max_first, 64, 1, false, "sink causal max-first");
  expect_strict_equals_plain(D, MaskKind::full, 0.2, VisitOrder::max_first, 32, 2, true, "sink full GQA fp64");
}

TEST(Screen, StrictHasNoWrongScreenAndEqualsThePlainSkipPathOnRandomData) {
  // i.i.d. normal data, one-row vote groups (random data rarely lets 64 rows agree).
  Dense D(1, 300, 1100, 2, 2, 32, 32, 41, 1.6f);
  expect_strict_equals_plain(D, MaskKind::full, 0.3, VisitOrder::natural, 1, 1, false, "random full");
  expect_strict_equals_plain(D, MaskKind::causal, 0.3, VisitOrder::natural, 1, 1, true, "random causal fp64");
}

TEST(Screen, StrictHasNoWrongScreenAndEqualsThePlainSkipPathOnTheLlmWorkload) {
  Dense D = llm_dense(1024, 4, 2, 64, 53);
  expect_strict_equals_plain(D, MaskKind::causal, 0.05, VisitOrder::max_first, 64, 1, false, "llm causal");
}

TEST(Screen, NonFiniteInputsAreNeverScreened) {
  // A NaN key in the tile whose screen delta lies furthest below ln(lambda) (the screen skipped
  // it): the tile is kept (NaN rule) on both paths.
  Dense D = sink_dense(1024, 1, 1, 64, 61);
  const double lambda = 0.2;
  const Result before = run(D, MaskKind::full, cfg_of(lambda, VisitOrder::natural, ScreenMargin::strict));
  ASSERT_GT(before.st.total_screened(), 0);
  const std::int64_t tiles = 8;  // 1024 keys; natural order, full mask: deltas[g * 8 + t]
  const std::vector<float>& sd = before.st.screen_deltas;
  ASSERT_EQ(sd.size(), static_cast<std::size_t>(16 * tiles));
  const auto lo = std::min_element(sd.begin(), sd.end()) - sd.begin();
  const std::int64_t g = lo / tiles, t = lo % tiles;
  ASSERT_LT(sd[lo], std::log(lambda));
  ASSERT_TRUE(before.set.skipped(0, 0, g, t));
  D.k[(t * 128 + 5) * 64 + 1] = std::numeric_limits<float>::quiet_NaN();
  expect_strict_equals_plain(D, MaskKind::full, lambda, VisitOrder::natural, 64, 1, false, "NaN key");
  const Result after = run(D, MaskKind::full, cfg_of(lambda, VisitOrder::natural, ScreenMargin::strict));
  EXPECT_FALSE(after.set.skipped(0, 0, g, t));
  EXPECT_TRUE(std::isnan(after.lse[g * 64]));
}

TEST(Screen, ScreenNeedsSkipping) {
  // Skipping off, or lambda >= 1 for the sequence: nothing is screened.
  Dense D = sink_dense(300, 1, 1, 32, 71);
  SkipConfig off;
  off.screen.margin = ScreenMargin::strict;
  const Result a = run(D, MaskKind::full, off);
  EXPECT_EQ(a.st.total_screened(), 0);
  EXPECT_EQ(a.st.total_skipped(), 0);
  SkipConfig big = cfg_of(1.0, VisitOrder::natural, ScreenMargin::strict);
  const Result b = run(D, MaskKind::full, big);
  EXPECT_EQ(b.st.total_screened(), 0);
  EXPECT_EQ(b.st.total_skipped(), 0);
  EXPECT_GT(b.st.total_visited(), 0);
}

TEST(Screen, StrictDecodeEqualsThePlainDecodeWithSplitsAndHeadGroups) {
  // llm-like KV cache (sink, recency), GQA 8/2 voting by KV group, q_len 2; unsplit natural and
  // seeded split-KV (max_first, 4 tiles per split).
  const std::int64_t B = 2, L = 2048, Hq = 8, Hk = 2, d = 64, qlen = 2;
  WorkloadSpec ws;
  ws.kind = WorkloadKind::llm;
  ws.seq_len = L;
  ws.heads_q = Hq;
  ws.heads_k = Hk;
  ws.head_dim = d;
  ws.batch = B;
  ws.seed = 101;
  Workload w = make_workload(ws);
  // The last qlen query positions of each sequence are the decode queries.
  std::vector<float> q(B * qlen * Hq * d);
  for (std::int64_t b = 0; b < B; ++b)
    std::copy_n(&w.q[((b * L) + L - qlen) * Hq * d], qlen * Hq * d, &q[b * qlen * Hq * d]);
  std::vector<std::int32_t> seqlens = {static_cast<std::int32_t>(L), static_cast<std::int32_t>(L - 300)};
  for (const auto& [order, split] :
       {std::pair{VisitOrder::natural, std::int64_t(0)}, std::pair{VisitOrder::max_first, std::int64_t(4)}}) {
    SCOPED_TRACE(to_string(order));
    Result res[2];
    for (int i = 0; i < 2; ++i) {
      SkipConfig c = cfg_of(0.05, order, i == 0 ? ScreenMargin::off : ScreenMargin::strict, 6.0, qlen, Hq / Hk);
      c.vote.split_tiles = split;
      DecodeProblem p;
      res[i].out.assign(B * qlen * Hq * d, 0.0f);
      res[i].lse.assign(B * Hq * qlen, 0.0f);
      p.q = Tensor::contiguous(q.data(), DType::f32, {B, qlen, Hq, d});
      p.k_cache = Tensor::contiguous(w.k.data(), DType::f32, {B, L, Hk, d});
      p.v_cache = Tensor::contiguous(w.v.data(), DType::f32, {B, L, Hk, d});
      p.seqlens_k = seqlens.data();
      p.out = Tensor::contiguous(res[i].out.data(), DType::f32, {B, qlen, Hq, d});
      p.lse = Tensor::contiguous(res[i].lse.data(), DType::f32, {B, Hq, qlen});
      RunOptions opt;
      opt.num_threads = 2;
      opt.record_deltas = true;
      reference::decode(p, c, opt, &res[i].st);
    }
    EXPECT_EQ(res[1].st.total_screen_wrong(), 0);
    EXPECT_GT(res[1].st.total_screened(), 0);
    EXPECT_GT(res[0].st.total_skipped(), 0);
    EXPECT_EQ(res[1].st.skipped, res[0].st.skipped);
    EXPECT_TRUE(same_bits(res[1].st.deltas, res[0].st.deltas));
    EXPECT_TRUE(same_bits(res[1].out, res[0].out));
    EXPECT_TRUE(same_bits(res[1].lse, res[0].lse));
    std::printf("  [decode %s] visited %lld, skipped %lld, screened %lld\n", to_string(order),
                static_cast<long long>(res[1].st.total_visited()), static_cast<long long>(res[1].st.total_skipped()),
                static_cast<long long>(res[1].st.total_screened()));
  }
}

// ---- an independent float64 recount of the tight screen (SPEC §2b, written from the text) -----

struct Recount {
  std::int64_t screened = 0, wrong = 0, skipped = 0;
  std::vector<std::vector<bool>> skip;  // [head * groups + group][tile]
};

struct QuantRow {
  std::vector<float> val;
  double scale = 0, norm = 0, qnorm = 0, err = 0;
};

float abs_max(const float* x, std::int64_t d) {
  float a = 0;
  for (std::int64_t c = 0; c < d; ++c) a = std::max(a, std::fabs(x[c]));
  return a;
}

// x quantised with the scale fp32(a / 16): a = its own max |x| for a query row, the tile's for a
// key, x / scale clamped to [-16, 16] (SPEC §2b).
QuantRow quant(const float* x, std::int64_t d, float a) {
  QuantRow r;
  const float s = a / 16.0f;
  r.scale = s;
  r.val.resize(d);
  for (std::int64_t c = 0; c < d; ++c) {
    r.val[c] = s > 0 ? e4m3_to_float(float_to_e4m3(std::min(16.0f, std::max(-16.0f, x[c] / s)))) : 0.0f;
    const double xq = static_cast<double>(s) * r.val[c], e = static_cast<double>(x[c]) - xq;
    r.norm += static_cast<double>(x[c]) * x[c];
    r.qnorm += xq * xq;
    r.err += e * e;
  }
  r.norm = std::sqrt(r.norm);
  r.qnorm = std::sqrt(r.qnorm);
  r.err = std::sqrt(r.err);
  return r;
}

// Full mask, B = 1, Hq = Hk, natural order, one head per vote group, fp64 exact scores (the
// engine's oracle mode), tight margin with z; the screen's decision stands. ahead: the screen
// ahead (SPEC §2b), against lower bounds lo_r that every tile raises to its FP8 tile max minus
// the margin.
Recount recount_tight(const Dense& D, double lambda, double z, int rows, int T, bool ahead = false) {
  const std::int64_t L = D.Lq, Lk = D.Lk, d = D.d, H = D.Hq;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d)), lnl = std::log(lambda);
  const double u = std::ldexp(1.0, -53), u8 = std::ldexp(1.0, -24);
  const double g1 = (d + 1) * u / (1 - (d + 1) * u), g3 = (d + 3) * u8 / (1 - (d + 3) * u8);
  const std::int64_t ntiles = (Lk + T - 1) / T, groups = (L + rows - 1) / rows;
  Recount rc;
  rc.skip.assign(H * groups, std::vector<bool>(ntiles, false));
  for (std::int64_t h = 0; h < H; ++h) {
    std::vector<QuantRow> kq(Lk);
    for (std::int64_t j0 = 0; j0 < Lk; j0 += T) {  // one scale per tile of T keys
      float a = 0;
      for (std::int64_t j = j0; j < std::min(Lk, j0 + T); ++j) a = std::max(a, abs_max(&D.k[(j * H + h) * d], d));
      for (std::int64_t j = j0; j < std::min(Lk, j0 + T); ++j) kq[j] = quant(&D.k[(j * H + h) * d], d, a);
    }
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t r0 = g * rows, nr = std::min<std::int64_t>(rows, L - r0);
      std::vector<QuantRow> qq(nr);
      for (std::int64_t r = 0; r < nr; ++r) {
        const float* q = &D.q[((r0 + r) * H + h) * d];
        qq[r] = quant(q, d, abs_max(q, d));
      }
      std::vector<double> m(nr, -kInfD), lo(nr, -kInfD);
      for (std::int64_t t = 0; t < ntiles; ++t) {
        const std::int64_t j0 = t * T, nk = std::min<std::int64_t>(T, Lk - j0);
        double KN = 0, KT = 0, EK = 0;
        for (std::int64_t j = j0; j < j0 + nk; ++j) {
          KN = std::max(KN, kq[j].norm);
          KT = std::max(KT, kq[j].qnorm);
          EK = std::max(EK, kq[j].err);
        }
        std::vector<double> tmax(nr, -kInfD);
        double delta = -kInfD, delta8 = -kInfD;
        for (std::int64_t r = 0; r < nr; ++r) {
          const float* q = &D.q[((r0 + r) * H + h) * d];
          double t8 = -kInfD;
          for (std::int64_t j = j0; j < j0 + nk; ++j) {
            const float* k = &D.k[(j * H + h) * d];
            double s = 0;
            float dot8 = 0;
            for (std::int64_t c = 0; c < d; ++c) {
              s += static_cast<double>(q[c]) * static_cast<double>(k[c]);
              dot8 += qq[r].val[c] * kq[j].val[c];
            }
            tmax[r] = std::max(tmax[r], s * scale);
            t8 = std::max(t8, static_cast<double>(dot8) * (scale * qq[r].scale * kq[j].scale));
          }
          const double A = qq[r].qnorm * EK, B = qq[r].err * KT, C = qq[r].err * EK;
          const double core = z * std::sqrt((A * A + B * B) / d) + C;
          const double rnd = g1 * qq[r].norm * KN + g3 * qq[r].qnorm * KT;
          const double margin =
              scale * (core + rnd) * (1 + std::ldexp(1.0, -30)) + (scale * d + 1) * std::ldexp(1.0, -149);
          double up = t8 + margin;
          up += std::fabs(up) * std::ldexp(1.0, -52);
          delta = std::max(delta, tmax[r] - m[r]);
          delta8 = std::max(delta8, up - (ahead ? lo[r] : m[r]));
          double low = t8 - margin;
          low -= std::fabs(low) * std::ldexp(1.0, -52);
          if (ahead) lo[r] = std::max(lo[r], low);
        }
        const bool exact_skip = static_cast<double>(static_cast<float>(delta)) < lnl;
        const bool screened = static_cast<double>(static_cast<float>(delta8)) < lnl;
        rc.screened += screened;
        rc.wrong += screened && !exact_skip;
        if (screened || exact_skip) {
          ++rc.skipped;
          rc.skip[h * groups + g][t] = true;
          continue;
        }
        for (std::int64_t r = 0; r < nr; ++r) m[r] = std::max(m[r], tmax[r]);
      }
    }
  }
  return rc;
}

void expect_recount(Dense& D, double lambda, double z, int rows, int T, bool want_wrong, bool ahead = false) {
  SCOPED_TRACE("z = " + std::to_string(z) + (ahead ? ", ahead" : ""));
  SkipConfig c = cfg_of(lambda, VisitOrder::natural, ScreenMargin::tight, z, rows);
  c.vote.tile_keys = T;
  c.screen.ahead = ahead;
  const Result r = run(D, MaskKind::full, c, /*fp64=*/true);
  const Recount rc = recount_tight(D, lambda, z, rows, T, ahead);
  EXPECT_EQ(r.st.total_screened(), rc.screened);
  EXPECT_EQ(r.st.total_screen_wrong(), rc.wrong);
  EXPECT_EQ(r.st.total_skipped(), rc.skipped);
  for (std::int64_t h = 0; h < D.Hq; ++h)
    for (std::int64_t g = 0; g < r.set.groups; ++g)
      for (std::int64_t t = 0; t < r.set.tiles; ++t)
        ASSERT_EQ(r.set.skipped(0, h, g, t), rc.skip[h * r.set.groups + g][t]) << h << " " << g << " " << t;
  EXPECT_GT(rc.screened, 0);
  if (want_wrong) EXPECT_GT(rc.wrong, 0);  // the counter is shown at work
  std::printf("  [z = %g%s] screened %lld, wrong %lld, skipped %lld\n", z, ahead ? ", ahead" : "",
              static_cast<long long>(rc.screened),
              static_cast<long long>(rc.wrong), static_cast<long long>(rc.skipped));
}

TEST(Screen, TightWrongScreensEqualAnIndependentRecount) {
  Dense D(1, 256, 1024, 2, 2, 32, 32, 81, 1.6f);
  expect_recount(D, 0.3, 0.0, 1, 64, true);
  expect_recount(D, 0.3, 0.5, 1, 64, true);
  expect_recount(D, 0.3, 6.0, 1, 64, false);
  Dense S = sink_dense(512, 2, 2, 64, 83);
  expect_recount(S, 0.2, 6.0, 16, 128, false);
}

TEST(Screen, TheScreenAheadEqualsAnIndependentRecount) {
  Dense D(1, 256, 1024, 2, 2, 32, 32, 81, 1.6f);
  expect_recount(D, 0.3, 0.0, 1, 64, true, true);
  expect_recount(D, 0.3, 6.0, 1, 64, false, true);
  Dense S = sink_dense(512, 2, 2, 64, 83);
  expect_recount(S, 0.2, 6.0, 16, 128, false, true);
}

// SPEC §2b screen ahead, strict: no wrong screen (lo_r <= m_r on the plain path), so everything
// equals the plain skip path bit for bit; and it screens a subset of what the screen in the loop
// screens (delta8 with lo_r >= delta8 with m_r), here a non-empty one.
void expect_ahead_equals_plain(Dense& D, MaskKind mask, double lambda, VisitOrder order, int rows, int heads,
                               ScreenMargin margin, const char* what) {
  SCOPED_TRACE(what);
  const Result plain = run(D, mask, cfg_of(lambda, order, ScreenMargin::off, 6.0, rows, heads));
  const Result loop = run(D, mask, cfg_of(lambda, order, margin, 6.0, rows, heads));
  SkipConfig ca = cfg_of(lambda, order, margin, 6.0, rows, heads);
  ca.screen.ahead = true;
  const Result ahead = run(D, mask, ca);
  ASSERT_EQ(loop.st.total_screen_wrong(), 0);
  EXPECT_EQ(ahead.st.total_screen_wrong(), 0);
  EXPECT_GT(ahead.st.total_screened(), 0);  // the case this test exists for happened
  EXPECT_LE(ahead.st.total_screened(), loop.st.total_screened());
  EXPECT_EQ(ahead.st.visited, plain.st.visited);
  EXPECT_EQ(ahead.st.skipped, plain.st.skipped);
  EXPECT_EQ(ahead.set.bits, plain.set.bits);
  EXPECT_TRUE(same_bits(ahead.st.deltas, plain.st.deltas));
  EXPECT_TRUE(same_bits(ahead.out, plain.out));
  EXPECT_TRUE(same_bits(ahead.lse, plain.lse));
  ASSERT_EQ(ahead.st.screen_deltas.size(), loop.st.screen_deltas.size());
  for (std::size_t i = 0; i < ahead.st.screen_deltas.size(); ++i)
    if (!std::isnan(loop.st.screen_deltas[i])) EXPECT_GE(ahead.st.screen_deltas[i], loop.st.screen_deltas[i]) << i;
  std::printf("  [%s] visited %lld, skipped %lld, screened in the loop %lld, ahead %lld\n", what,
              static_cast<long long>(plain.st.total_visited()), static_cast<long long>(plain.st.total_skipped()),
              static_cast<long long>(loop.st.total_screened()), static_cast<long long>(ahead.st.total_screened()));
}

TEST(Screen, StrictAheadHasNoWrongScreenAndEqualsThePlainSkipPath) {
  Dense S = sink_dense(1024, 2, 1, 64, 31);
  expect_ahead_equals_plain(S, MaskKind::full, 0.2, VisitOrder::natural, 64, 1, ScreenMargin::strict,
                            "sink full natural");
  expect_ahead_equals_plain(S, MaskKind::causal, 0.2, VisitOrder::max_first, 64, 1, ScreenMargin::strict,
                            "sink causal max-first");
  Dense D = llm_dense(1024, 4, 2, 64, 53);
  expect_ahead_equals_plain(D, MaskKind::causal, 0.05, VisitOrder::max_first, 64, 1, ScreenMargin::strict,
                            "llm causal max-first");
  expect_ahead_equals_plain(D, MaskKind::causal, 0.05, VisitOrder::max_first, 64, 1, ScreenMargin::tight,
                            "llm causal max-first, tight z = 6");
}

TEST(Screen, TightScreensMoreThanStrictAndLargeZIsNoLooserThanStrict) {
  Dense D = llm_dense(1024, 4, 2, 64, 91);
  const double lambda = 0.05;
  const Result plain = run(D, MaskKind::causal, cfg_of(lambda, VisitOrder::max_first, ScreenMargin::off));
  const Result strict = run(D, MaskKind::causal, cfg_of(lambda, VisitOrder::max_first, ScreenMargin::strict));
  ASSERT_EQ(strict.st.total_screen_wrong(), 0);
  ASSERT_GT(strict.st.total_screened(), 0);
  // z >= sqrt(2d): the tight margin is at least the strict one (SPEC §2b), pair by pair.
  const double zbig = std::sqrt(2.0 * 64) * (1 + 1e-9);
  std::int64_t prev = -1;
  for (const double z : {zbig, 8.0, 6.0, 4.0}) {
    SCOPED_TRACE(z);
    const Result t = run(D, MaskKind::causal, cfg_of(lambda, VisitOrder::max_first, ScreenMargin::tight, z));
    if (z == zbig) {
      EXPECT_EQ(t.st.total_screen_wrong(), 0);
      EXPECT_LE(t.st.total_screened(), strict.st.total_screened());
    }
    if (z == 6.0) EXPECT_GT(t.st.total_screened(), strict.st.total_screened());
    // While no screen is wrong, the paths follow the exact running maxima, so a smaller margin
    // screens a superset: counts are non-increasing in z.
    if (t.st.total_screen_wrong() == 0) {
      EXPECT_GE(t.st.total_screened(), prev);
      EXPECT_EQ(t.set.bits, plain.set.bits);
      EXPECT_TRUE(same_bits(t.out, plain.out));
      prev = t.st.total_screened();
    }
    std::printf("  [z = %g] screened %lld (strict %lld), wrong %lld, skipped %lld of %lld\n", z,
                static_cast<long long>(t.st.total_screened()), static_cast<long long>(strict.st.total_screened()),
                static_cast<long long>(t.st.total_screen_wrong()), static_cast<long long>(t.st.total_skipped()),
                static_cast<long long>(t.st.total_visited()));
  }
}

// A crafted input where the FP8 maximum underestimates the exact one: with z = 0 (no statistical
// margin) the screen skips a tile the exact test keeps, the counter says so and the output
// follows the screened skip set; strict keeps it. Expected values from float64 arithmetic here.
TEST(Screen, ZeroMarginUnderestimateIsACountedWrongScreen) {
  // d = 2, one query row, two keys in two 1-key tiles. q = (1, 1) quantises exactly (both
  // elements are the row max). k0 = (a, a) quantises exactly; k1 = (1, 0.84): 0.84 / (1/16) =
  // 13.44 rounds down to 13 in the binade [8, 16) (quantum 1).
  const float a = 1.2886f;
  std::vector<float> q = {1.0f, 1.0f}, k = {a, a, 1.0f, 0.84f}, v = {1.0f, 0.0f, 0.0f, 1.0f};
  const float sk1 = 1.0f / 16.0f;
  ASSERT_EQ(e4m3_to_float(float_to_e4m3(0.84f / sk1)), 13.0f);
  const double scale = 1.0 / std::sqrt(2.0);
  const double s0 = scale * 2.0 * a, s1 = scale * (1.0 + double(0.84f)), s8 = scale * (1.0 + 13.0 * sk1);
  const double lnl = 0.5 * ((s1 - s0) + (s8 - s0));  // between the FP8 and the exact delta
  ASSERT_LT(s8 - s0, lnl);
  ASSERT_GT(s1 - s0, lnl);
  std::vector<float> out(2), lse(1);
  AttentionProblem p;
  p.q = Tensor::contiguous(q.data(), DType::f32, {1, 1, 1, 2});
  p.k = Tensor::contiguous(k.data(), DType::f32, {1, 2, 1, 2});
  p.v = Tensor::contiguous(v.data(), DType::f32, {1, 2, 1, 2});
  p.out = Tensor::contiguous(out.data(), DType::f32, {1, 1, 1, 2});
  p.lse = Tensor::contiguous(lse.data(), DType::f32, {1, 1, 1});
  RunOptions opt;
  opt.collect_stats = true;
  opt.fp64 = true;
  for (const ScreenMargin mg : {ScreenMargin::tight, ScreenMargin::strict, ScreenMargin::off}) {
    SCOPED_TRACE(to_string(mg));
    SkipConfig c = cfg_of(std::exp(lnl), VisitOrder::natural, mg, 0.0, 1);
    c.vote.tile_keys = 1;
    SkipStats st;
    reference::attention(p, c, opt, &st);
    EXPECT_EQ(st.total_visited(), 2);
    if (mg == ScreenMargin::tight) {  // z = 0: screened, wrongly; the screen's decision stands
      EXPECT_EQ(st.total_screened(), 1);
      EXPECT_EQ(st.total_screen_wrong(), 1);
      EXPECT_EQ(st.total_skipped(), 1);
      EXPECT_EQ(out[0], 1.0f);
      EXPECT_EQ(out[1], 0.0f);
      EXPECT_NEAR(lse[0], s0, 1e-6);
    } else {  // strict and plain keep key 1: softmax over both keys
      if (mg == ScreenMargin::strict) {
        EXPECT_EQ(st.total_screened(), 0);
        EXPECT_EQ(st.total_screen_wrong(), 0);
      }
      EXPECT_EQ(st.total_skipped(), 0);
      const double p1 = 1.0 / (1.0 + std::exp(s0 - s1));
      EXPECT_NEAR(out[0], 1.0 - p1, 1e-6);
      EXPECT_NEAR(out[1], p1, 1e-6);
      EXPECT_NEAR(lse[0], s0 + std::log1p(std::exp(s1 - s0)), 1e-6);
    }
  }
}

// The tight model's named failure: error energy on the channel where q~ is large. d = 128, q = e0,
// k1 = (0.84, 1, 0, ...): k1's whole quantisation error sits on channel 0, so q~.ek = |q~||ek|,
// sqrt(d) / z = 1.9 times the model's z sigma at z = 6. Tight screens the tile wrongly (counted);
// strict keeps it. Expected values from float64 arithmetic here.
TEST(Screen, ErrorOnTheQueryChannelBreaksTheTightModelAndIsCounted) {
  const std::int64_t d = 128;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d)), z = 6.0;
  const double e = double(0.84f) - 13.0 / 16.0;  // k1's error on channel 0 (0.84 * 16 = 13.44 -> 13)
  ASSERT_EQ(e4m3_to_float(float_to_e4m3(0.84f / (1.0f / 16.0f))), 13.0f);
  const double gap = scale * e, tight = scale * z * e / std::sqrt(static_cast<double>(d));
  ASSERT_LT(tight, 0.6 * gap);  // the model's margin misses this error
  const float a = static_cast<float>(double(0.84f) + 0.5 / scale);  // key 0: score s1 + 0.5
  std::vector<float> q(d, 0.0f), k(2 * d, 0.0f), v(2 * d, 0.0f), out(d), lse(1);
  q[0] = 1.0f;
  k[0] = a;
  k[d] = 0.84f;
  k[d + 1] = 1.0f;
  v[0] = 1.0f;
  v[d + 1] = 1.0f;
  const double s0 = scale * a, s1 = scale * 0.84f;
  const double lnl = (s1 - s0) - 0.25 * gap;  // above s8 + tight margin, below the exact delta
  AttentionProblem p;
  p.q = Tensor::contiguous(q.data(), DType::f32, {1, 1, 1, d});
  p.k = Tensor::contiguous(k.data(), DType::f32, {1, 2, 1, d});
  p.v = Tensor::contiguous(v.data(), DType::f32, {1, 2, 1, d});
  p.out = Tensor::contiguous(out.data(), DType::f32, {1, 1, 1, d});
  p.lse = Tensor::contiguous(lse.data(), DType::f32, {1, 1, 1});
  RunOptions opt;
  opt.collect_stats = true;
  for (const ScreenMargin mg : {ScreenMargin::tight, ScreenMargin::strict}) {
    SCOPED_TRACE(to_string(mg));
    SkipConfig c = cfg_of(std::exp(lnl), VisitOrder::natural, mg, z, 1);
    c.vote.tile_keys = 1;
    SkipStats st;
    reference::attention(p, c, opt, &st);
    const bool wrong = mg == ScreenMargin::tight;
    EXPECT_EQ(st.total_screened(), wrong ? 1 : 0);
    EXPECT_EQ(st.total_screen_wrong(), wrong ? 1 : 0);
    EXPECT_EQ(st.total_skipped(), wrong ? 1 : 0);
    const double p1 = wrong ? 0.0 : 1.0 / (1.0 + std::exp(s0 - s1));
    EXPECT_NEAR(out[0], 1.0 - p1, 1e-6);
    EXPECT_NEAR(out[1], p1, 1e-6);
  }
}

// ---- configuration --------------------------------------------------------------------------------

void expect_error(const SkipConfig& c, const std::string& text) {
  try {
    validate(c);
    ADD_FAILURE() << "no error, expected: " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(Screen, ConfigurationIsValidated) {
  SkipConfig c = SkipConfig::from_threshold(0.1);
  EXPECT_EQ(c.screen.margin, ScreenMargin::off);
  EXPECT_EQ(c.screen.z, 6.0);
  c.screen.margin = ScreenMargin::tight;
  for (const double z : {std::numeric_limits<double>::quiet_NaN(), kInfD, -kInfD, -0.5}) {
    c.screen.z = z;
    expect_error(c, "skip.screen.z must be finite and >= 0, got ");
  }
  c.screen.z = 0.0;
  EXPECT_NO_THROW(validate(c));
  c.screen.margin = static_cast<ScreenMargin>(7);
  expect_error(c, "skip.screen.margin: invalid value 7");
  c.screen.margin = ScreenMargin::off;
  c.screen.ahead = true;
  expect_error(c, "skip.screen.ahead: the screen ahead needs a margin (strict or tight), got margin off");
  c.screen.margin = ScreenMargin::strict;
  EXPECT_NO_THROW(validate(c));
  c.screen.margin = static_cast<ScreenMargin>(7);
  // The engine validates too.
  Dense D(1, 8, 8, 1, 1, 4, 4, 3);
  RunOptions opt;
  EXPECT_THROW(reference::attention(D.problem(MaskKind::full), c, opt), Error);
  for (const ScreenMargin m : {ScreenMargin::off, ScreenMargin::strict, ScreenMargin::tight})
    EXPECT_EQ(parse_screen_margin(to_string(m)), m);
  try {
    parse_screen_margin("loose");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("screen margin: unknown name 'loose'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace blasst
