// Seeded maxima for a key chunk (AttentionProblem::seed_max, SPEC §2a): a -inf seed changes
// nothing; ring attention simulated on one process (K/V chunks, each run seeded from the seed
// tiles, merged by LSE) matches the unsplit call and skips as much as max-first; errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common.hpp"

using namespace blasst;
using namespace blasst::test;

namespace {

constexpr double kNinf = -std::numeric_limits<double>::infinity();

SkipConfig thr(double lambda, VisitOrder order) {
  return SkipConfig::from_threshold(lambda).with_order(order);
}

RunOptions stats_opt() {
  RunOptions o;
  o.num_threads = 2;
  o.collect_stats = true;
  return o;
}

// The seed of every row (h, i) in float64 from the test's own scores: max over the keys of the
// sink tile 0 and of the row's own tile (the tile holding key r0, r0 = the first row of its
// 64-row vote group; full mask, Lq = Lk), scale 1/sqrt(d). Layout [1, Hq, L].
std::vector<double> seed_tiles_max(const Dense& D, std::int64_t T, std::int64_t rows) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(D.d));
  const std::int64_t g = D.Hq / D.Hk;
  std::vector<double> seed(D.Hq * D.Lq, kNinf);
  for (std::int64_t h = 0; h < D.Hq; ++h)
    for (std::int64_t i = 0; i < D.Lq; ++i) {
      const std::int64_t own = (i / rows) * rows / T;
      double mx = kNinf;
      for (std::int64_t tile : {std::int64_t(0), own})
        for (std::int64_t j = tile * T; j < std::min(D.Lk, (tile + 1) * T); ++j) {
          double s = 0;
          for (std::int64_t c = 0; c < D.d; ++c)
            s += static_cast<double>(D.q[(i * D.Hq + h) * D.d + c]) * D.k[(j * D.Hk + h / g) * D.d + c];
          mx = std::max(mx, s * scale);
        }
      seed[h * D.Lq + i] = mx;
    }
  return seed;
}

struct RingResult {
  std::vector<double> out, lse;  // merged, [L, Hq, dv] and [Hq, L]
  std::int64_t visited = 0, skipped = 0;
};

// Ring attention on one process: K/V split into `chunks` equal chunks, every query row run
// against each chunk (natural order inside the chunk), seeded with `seed` (nullptr: unseeded),
// the chunk results merged by LSE: M = max_c lse_c, O = sum_c e^(lse_c - M) O_c / sum_c
// e^(lse_c - M), LSE = M + ln sum_c e^(lse_c - M).
RingResult ring(const Dense& D, int chunks, const SkipConfig& skip, const std::vector<double>* seed) {
  const std::int64_t L = D.Lq, Lc = D.Lk / chunks, Hq = D.Hq, Hk = D.Hk, d = D.d, dv = D.dv;
  std::vector<std::vector<float>> outs(chunks), lses(chunks);
  RingResult r;
  for (int c = 0; c < chunks; ++c) {
    std::vector<float> k(D.k.begin() + c * Lc * Hk * d, D.k.begin() + (c + 1) * Lc * Hk * d);
    std::vector<float> v(D.v.begin() + c * Lc * Hk * dv, D.v.begin() + (c + 1) * Lc * Hk * dv);
    std::vector<double> seed_copy = seed ? *seed : std::vector<double>();
    outs[c].assign(L * Hq * dv, std::numeric_limits<float>::quiet_NaN());
    lses[c].assign(Hq * L, std::numeric_limits<float>::quiet_NaN());
    AttentionProblem p;
    p.q = Tensor::contiguous(const_cast<float*>(D.q.data()), DType::f32, {1, L, Hq, d});
    p.k = Tensor::contiguous(k.data(), DType::f32, {1, Lc, Hk, d});
    p.v = Tensor::contiguous(v.data(), DType::f32, {1, Lc, Hk, dv});
    p.out = Tensor::contiguous(outs[c].data(), DType::f32, {1, L, Hq, dv});
    p.lse = Tensor::contiguous(lses[c].data(), DType::f32, {1, Hq, L});
    if (seed) p.seed_max = Tensor::contiguous(seed_copy.data(), DType::f64, {1, Hq, L});
    SkipStats st;
    reference::attention(p, skip, stats_opt(), &st);
    r.visited += st.total_visited();
    r.skipped += st.total_skipped();
  }
  r.out.assign(L * Hq * dv, 0.0);
  r.lse.assign(Hq * L, kNinf);
  for (std::int64_t h = 0; h < Hq; ++h)
    for (std::int64_t i = 0; i < L; ++i) {
      double M = kNinf;
      for (int c = 0; c < chunks; ++c) M = std::max(M, static_cast<double>(lses[c][h * L + i]));
      if (M == kNinf) continue;  // nothing kept anywhere: O = 0, LSE = -inf
      double w_sum = 0;
      for (int c = 0; c < chunks; ++c) {
        const double w = std::exp(static_cast<double>(lses[c][h * L + i]) - M);
        w_sum += w;
        for (std::int64_t e = 0; e < dv; ++e) r.out[(i * Hq + h) * dv + e] += w * outs[c][(i * Hq + h) * dv + e];
      }
      for (std::int64_t e = 0; e < dv; ++e) r.out[(i * Hq + h) * dv + e] /= w_sum;
      r.lse[h * L + i] = M + std::log(w_sum);
    }
  return r;
}

}  // namespace

// (a) seed_max = -inf everywhere is no seed: O, LSE and the statistics are today's, bit for bit.
TEST(SeedMax, MinusInfinityIsNoSeedBitForBit) {
  for (MaskKind mask : {MaskKind::full, MaskKind::causal})
    for (VisitOrder order : {VisitOrder::natural, VisitOrder::max_first})
      for (DType st : {DType::f32, DType::f64}) {
        Dense D = llm_dense(700, 2, 1, 64, 31);
        const SkipConfig skip = thr(0.05, order);
        SkipStats s0, s1;
        reference::attention(D.problem(mask), skip, stats_opt(), &s0);
        const auto out0 = D.out, lse0 = D.lse;
        ASSERT_GT(s0.total_skipped(), 0);
        std::vector<float> sf(2 * 700, -std::numeric_limits<float>::infinity());
        std::vector<double> sd(2 * 700, kNinf);
        AttentionProblem p = D.problem(mask);
        p.seed_max = st == DType::f32 ? Tensor::contiguous(sf.data(), DType::f32, {1, 2, 700})
                                      : Tensor::contiguous(sd.data(), DType::f64, {1, 2, 700});
        reference::attention(p, skip, stats_opt(), &s1);
        EXPECT_EQ(std::memcmp(D.out.data(), out0.data(), out0.size() * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(D.lse.data(), lse0.data(), lse0.size() * sizeof(float)), 0);
        EXPECT_EQ(s1.visited, s0.visited);
        EXPECT_EQ(s1.skipped, s0.skipped);
      }
}

// (b) Ring on one process, dense: seeded chunks merged by LSE are the unsplit attention (softmax
// does not depend on the reference max), and so are unseeded ones.
TEST(SeedMax, RingDenseEqualsUnsplit) {
  Dense D = llm_dense(1024, 2, 1, 64, 7);
  std::vector<double> o, l;
  naive(D.q, D.k, D.v, 1, 1024, 1024, 2, 1, 64, 64, false, o, l);
  const std::vector<double> seed = seed_tiles_max(D, 128, 64);
  for (int chunks : {2, 4}) {
    for (const std::vector<double>* s : {&seed, static_cast<const std::vector<double>*>(nullptr)}) {
      const RingResult r = ring(D, chunks, SkipConfig{}, s);
      EXPECT_LT(rel_err(r.out, o), 1e-6) << chunks << " chunks, seeded " << (s != nullptr);
      EXPECT_LT(rel_err(r.lse, l), 1e-6) << chunks << " chunks, seeded " << (s != nullptr);
      EXPECT_EQ(r.skipped, 0);
    }
  }
}

// (b) Ring with skipping on a sink-heavy input: the seeded ring skips at least what the unsplit
// max-first call skips (less a margin of 1 % of the pairs: float seeds vs the kernel's float
// scores, and a seeded chunk may skip tiles the unsplit walk visited before its max settled),
// the unseeded ring clearly less; outputs stay as close to the exact attention as the unsplit's.
TEST(SeedMax, SeededRingSkipsAsUnsplitMaxFirst) {
  Dense D = llm_dense(1024, 2, 1, 64, 7);
  std::vector<double> o, l;
  naive(D.q, D.k, D.v, 1, 1024, 1024, 2, 1, 64, 64, false, o, l);
  const std::vector<double> seed = seed_tiles_max(D, 128, 64);
  for (double lambda : {0.05, 0.1}) {  // 38 % and 55 % of the pairs skipped unsplit
    SkipStats s0;
    reference::attention(D.problem(MaskKind::full), thr(lambda, VisitOrder::max_first), stats_opt(), &s0);
    const double err0 = rel_err(D.out, o);
    ASSERT_GT(s0.total_skipped(), 0);
    for (int chunks : {2, 4}) {
      const RingResult rs = ring(D, chunks, thr(lambda, VisitOrder::natural), &seed);
      const RingResult ru = ring(D, chunks, thr(lambda, VisitOrder::natural), nullptr);
      const std::string at = "lambda " + std::to_string(lambda) + ", " + std::to_string(chunks) + " chunks";
      EXPECT_EQ(rs.visited, s0.total_visited()) << at;  // every (vote group, tile) pair once
      EXPECT_EQ(ru.visited, s0.total_visited()) << at;
      const double margin = 0.01 * static_cast<double>(s0.total_visited());
      EXPECT_GE(static_cast<double>(rs.skipped), static_cast<double>(s0.total_skipped()) - margin) << at;
      // The unseeded ring loses at least the first tile of every chunk of every vote group that
      // the unsplit call skipped, and much more while the chunk's max climbs.
      EXPECT_LT(static_cast<double>(ru.skipped), static_cast<double>(rs.skipped) - 5 * margin) << at;
      EXPECT_LT(rel_err(rs.out, o), 2 * err0 + 1e-6) << at;
    }
  }
}

// A seed above every score of its row: every tile fails the test, the kept set is empty, O = 0
// and LSE = -inf (as a fully masked row); without skipping the same seed changes nothing.
TEST(SeedMax, SeedAboveEveryScoreSkipsTheRow) {
  Dense D(1, 64, 300, 1, 1, 32, 32, 3);
  std::vector<double> seed(64, 1000.0);
  AttentionProblem p = D.problem(MaskKind::full);
  p.seed_max = Tensor::contiguous(seed.data(), DType::f64, {1, 1, 64});
  SkipStats st;
  reference::attention(p, thr(0.5, VisitOrder::natural), stats_opt(), &st);
  EXPECT_EQ(st.total_skipped(), st.total_visited());
  EXPECT_EQ(st.total_visited(), 3);
  for (float x : D.out) EXPECT_EQ(x, 0.0f);
  for (float x : D.lse) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
  // Dense with a finite seed below each row max: softmax does not depend on the reference max.
  std::vector<double> o, l;
  naive(D.q, D.k, D.v, 1, 64, 300, 1, 1, 32, 32, false, o, l);
  for (std::int64_t i = 0; i < 64; ++i) seed[i] = l[i] - std::log(300.0);  // <= the row max
  p = D.problem(MaskKind::full);
  p.seed_max = Tensor::contiguous(seed.data(), DType::f64, {1, 1, 64});
  reference::attention(p, SkipConfig{}, stats_opt(), nullptr);
  EXPECT_LT(rel_err(D.out, o), 1e-6);
  EXPECT_LT(rel_err(D.lse, l), 1e-6);
}

// A seed far above one row's scores while its vote group keeps every tile (the other rows are
// unseeded): with f32 inputs the row's exponentials fall to subnormals (e^-95 of the seed) and
// its L is subnormal. Its O and LSE are still the exact softmax of its keys, to the few bits a
// subnormal L holds, never NaN (1 / L overflows to inf; O * inf was NaN); the other rows are exact.
TEST(SeedMax, SeedFarAboveARowOfAKeptGroupGivesItsSoftmax) {
  Dense D(1, 64, 300, 1, 1, 32, 32, 4);
  std::vector<double> o, l;
  naive(D.q, D.k, D.v, 1, 64, 300, 1, 1, 32, 32, false, o, l);
  std::vector<double> row_max(64, kNinf);
  const double scale = 1.0 / std::sqrt(32.0);
  for (std::int64_t i = 0; i < 64; ++i)
    for (std::int64_t j = 0; j < 300; ++j) {
      double s = 0;
      for (std::int64_t c = 0; c < 32; ++c) s += double(D.q[i * 32 + c]) * D.k[j * 32 + c];
      row_max[i] = std::max(row_max[i], s * scale);
    }
  std::vector<double> seed(64, kNinf);
  seed[7] = row_max[7] + 95.0;  // e^-95 = 5.5e-42: subnormal in f32 (min normal 1.2e-38)
  AttentionProblem p = D.problem(MaskKind::full);
  p.seed_max = Tensor::contiguous(seed.data(), DType::f64, {1, 1, 64});
  SkipStats st;
  reference::attention(p, thr(1e-3, VisitOrder::natural), stats_opt(), &st);
  EXPECT_EQ(st.total_skipped(), 0);  // the unseeded rows keep every tile
  for (std::int64_t i = 0; i < 64; ++i) {
    const double tol = i == 7 ? 1e-2 : 1e-5;  // row 7: a subnormal L (about 12 bits)
    EXPECT_NEAR(D.lse[i], l[i], tol) << "row " << i;
    for (std::int64_t e = 0; e < 32; ++e)
      ASSERT_NEAR(D.out[i * 32 + e], o[i * 32 + e], tol) << "row " << i << ", column " << e;
  }
}

// NaN rule (docs/reference.md): a NaN seed is a NaN running max: the row's tiles are never
// skipped and its O and LSE are NaN; the other rows are unchanged.
TEST(SeedMax, NanSeedFollowsTheNanRule) {
  Dense D = llm_dense(300, 1, 1, 32, 9);
  const SkipConfig skip = thr(0.5, VisitOrder::natural);
  reference::attention(D.problem(MaskKind::full), skip, stats_opt(), nullptr);
  const auto out0 = D.out;
  std::vector<float> seed(300, -std::numeric_limits<float>::infinity());
  seed[5] = std::numeric_limits<float>::quiet_NaN();
  AttentionProblem p = D.problem(MaskKind::full);
  p.seed_max = Tensor::contiguous(seed.data(), DType::f32, {1, 1, 300});
  SkipStats st;
  RunOptions opt = stats_opt();
  opt.record_deltas = true;
  reference::attention(p, skip, opt, &st);
  EXPECT_TRUE(std::isnan(D.lse[5]));
  for (std::int64_t e = 0; e < 32; ++e) EXPECT_TRUE(std::isnan(D.out[5 * 32 + e]));
  // Group 0 (rows 0..63) holds the NaN row: every one of its deltas is NaN (never skipped).
  for (std::size_t t = 0; t < 3; ++t) EXPECT_TRUE(std::isnan(st.deltas[t]));
  for (std::int64_t i = 64; i < 300; ++i)
    for (std::int64_t e = 0; e < 32; ++e) ASSERT_EQ(D.out[i * 32 + e], out0[i * 32 + e]);
}

// (c) Validation: shape, dtype, device and values name seed_max; the ragged layout is lse's.
TEST(SeedMax, Errors) {
  Dense D(2, 40, 50, 2, 1, 16, 16, 1);
  auto expect_error = [&](const Tensor& seed, const std::string& what) {
    AttentionProblem p = D.problem(MaskKind::full);
    p.seed_max = seed;
    try {
      reference::attention(p, {}, {}, nullptr);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("seed_max", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  std::vector<double> s(2 * 2 * 40 + 8, 0.0);
  std::vector<std::uint16_t> h(2 * 2 * 40, 0);
  expect_error(Tensor::contiguous(s.data(), DType::f64, {2, 2}), "rank");
  expect_error(Tensor::contiguous(s.data(), DType::f64, {1, 2, 40}), "batch");
  expect_error(Tensor::contiguous(s.data(), DType::f64, {2, 1, 40}), "query heads");
  expect_error(Tensor::contiguous(s.data(), DType::f64, {2, 2, 41}), "queries");
  expect_error(Tensor::contiguous(h.data(), DType::bf16, {2, 2, 40}), "dtype");
  expect_error(Tensor::contiguous(s.data(), DType::f64, {2, 2, 40}, DeviceKind::cuda), "device");
  Tensor undefined = Tensor::contiguous(nullptr, DType::f64, {2, 2, 40});
  expect_error(undefined, "not defined");
  s[2 * 40 + 7] = std::numeric_limits<double>::infinity();  // sequence 1, head 0, query 7
  expect_error(Tensor::contiguous(s.data(), DType::f64, {2, 2, 40}), "+inf at sequence 1, head 0, query 7");
}

// Ragged batch: seed_max has lse's ragged layout [Hq, Tq]; a per-sequence seed acts per sequence.
TEST(SeedMax, RaggedLayout) {
  Dense D(1, 100, 100, 1, 1, 16, 16, 4);
  std::vector<std::int32_t> cu = {0, 40, 100};
  std::vector<double> seed(100, kNinf);
  for (int i = 40; i < 100; ++i) seed[i] = 1000.0;  // sequence 1: everything skipped
  std::vector<float> out(100 * 16), lse(100);
  AttentionProblem p;
  p.q = Tensor::contiguous(D.q.data(), DType::f32, {100, 1, 16});
  p.k = Tensor::contiguous(D.k.data(), DType::f32, {100, 1, 16});
  p.v = Tensor::contiguous(D.v.data(), DType::f32, {100, 1, 16});
  p.out = Tensor::contiguous(out.data(), DType::f32, {100, 1, 16});
  p.lse = Tensor::contiguous(lse.data(), DType::f32, {1, 100});
  p.seed_max = Tensor::contiguous(seed.data(), DType::f64, {1, 100});
  p.cu_seqlens_q = cu.data();
  p.cu_seqlens_k = cu.data();
  p.batch = 2;
  SkipStats st;
  reference::attention(p, thr(0.5, VisitOrder::natural), stats_opt(), &st);
  for (int i = 0; i < 40; ++i) EXPECT_TRUE(std::isfinite(lse[i])) << i;
  for (int i = 40; i < 100; ++i) EXPECT_EQ(lse[i], -std::numeric_limits<float>::infinity()) << i;
  EXPECT_EQ(st.total_skipped(), 1);  // sequence 1's single vote group and tile
}
