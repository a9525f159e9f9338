// The reference engine against the independent float64 oracle of spec_oracle.hpp (SPEC §2, §2a,
// §3, §5): skip set, deltas in visit order, per-head counts and output, on multi-row vote groups
// whose rows disagree, causal and full masks, Lq != Lk, both visit orders, and decode.
// Also lambda >= 1 on multi-tile sequences of a ragged batch (SPEC §3).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common.hpp"
#include "reference/spec_oracle.hpp"

using namespace blasst;
using i64 = std::int64_t;

namespace {

constexpr i64 kT = 128;

// Structured inputs with scale 1: key j is one-hot on its tile's channel (plus two small noise
// channels), so the score of row i on tile t is a chosen level a(h, i, t) plus noise. Levels: the
// sink tile 0 high (4), the tile of the row's own position (causal: the diagonal key
// i + Lk - Lq; full: key i * Lk / Lq) +3 above its tile's level, every other tile a per-(head,
// tile) level in [-3, 1], and each (row, tile) may carry a spike of +4..6 (probability 1/40):
// the one row of its group that votes to keep a tile all its other rows would skip.
struct Data {
  i64 Lq, Lk, Hq, Hk, d, dv = 8;
  std::vector<float> q, k, v;
};

Data make_data(i64 Lq, i64 Lk, i64 Hq, i64 Hk, bool causal, std::uint64_t seed) {
  Data D{Lq, Lk, Hq, Hk, (Lk + kT - 1) / kT + 2};
  const i64 nt = (Lk + kT - 1) / kT, d = D.d;
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  D.k.assign(static_cast<std::size_t>(Lk * Hk * d), 0.0f);
  for (i64 j = 0; j < Lk; ++j)
    for (i64 h = 0; h < Hk; ++h) {
      float* kr = &D.k[(j * Hk + h) * d];
      kr[j / kT] = 1.0f;
      kr[nt] = 0.3f * nd(g);
      kr[nt + 1] = 0.3f * nd(g);
    }
  D.v.resize(static_cast<std::size_t>(Lk * Hk * D.dv));
  for (auto& x : D.v) x = nd(g);
  std::vector<float> level(static_cast<std::size_t>(Hq * nt));
  for (i64 h = 0; h < Hq; ++h)
    for (i64 t = 0; t < nt; ++t) level[h * nt + t] = t == 0 ? 4.0f : -3.0f + 4.0f * u(g);
  D.q.assign(static_cast<std::size_t>(Lq * Hq * d), 0.0f);
  for (i64 i = 0; i < Lq; ++i) {
    const i64 pos = causal ? std::max<i64>(0, i + Lk - Lq) : i * Lk / Lq;
    for (i64 h = 0; h < Hq; ++h) {
      float* qr = &D.q[(i * Hq + h) * d];
      for (i64 t = 0; t < nt; ++t) {
        float a = level[h * nt + t] + 0.5f * u(g);
        if (t == pos / kT) a += 3.0f;
        if (u(g) < 1.0f / 40) a += 4.0f + 2.0f * u(g);
        qr[t] = a;
      }
      qr[nt] = 0.3f * nd(g);
      qr[nt + 1] = 0.3f * nd(g);
    }
  }
  return D;
}

SkipConfig cfg_for(double lambda, int rows, int heads, VisitOrder order) {
  SkipConfig c = SkipConfig::from_threshold(lambda).with_order(VisitOrder::natural);
  c.vote.rows = rows;
  c.vote.heads = heads;
  c.vote.order = order;
  return c;
}

struct EngineRun {
  SkipStats st;
  std::vector<double> out;
};

EngineRun run_prefill(const Data& D, bool causal, const SkipConfig& cfg, bool fp64) {
  std::vector<float> out(static_cast<std::size_t>(D.Lq * D.Hq * D.dv), std::nanf(""));
  AttentionProblem p;
  p.q = Tensor::contiguous(const_cast<float*>(D.q.data()), DType::f32, {1, D.Lq, D.Hq, D.d});
  p.k = Tensor::contiguous(const_cast<float*>(D.k.data()), DType::f32, {1, D.Lk, D.Hk, D.d});
  p.v = Tensor::contiguous(const_cast<float*>(D.v.data()), DType::f32, {1, D.Lk, D.Hk, D.dv});
  p.out = Tensor::contiguous(out.data(), DType::f32, {1, D.Lq, D.Hq, D.dv});
  p.mask = causal ? MaskKind::causal : MaskKind::full;
  p.scale = 1.0;
  RunOptions opt;
  opt.record_deltas = true;
  opt.fp64 = fp64;
  opt.num_threads = 2;
  EngineRun r;
  reference::attention(p, cfg, opt, &r.st);
  r.out.assign(out.begin(), out.end());
  return r;
}

EngineRun run_decode(const Data& D, const SkipConfig& cfg, bool fp64) {
  std::vector<float> out(static_cast<std::size_t>(D.Lq * D.Hq * D.dv), std::nanf(""));
  DecodeProblem p;
  p.q = Tensor::contiguous(const_cast<float*>(D.q.data()), DType::f32, {1, D.Lq, D.Hq, D.d});
  p.k_cache = Tensor::contiguous(const_cast<float*>(D.k.data()), DType::f32, {1, D.Lk, D.Hk, D.d});
  p.v_cache = Tensor::contiguous(const_cast<float*>(D.v.data()), DType::f32, {1, D.Lk, D.Hk, D.dv});
  p.out = Tensor::contiguous(out.data(), DType::f32, {1, D.Lq, D.Hq, D.dv});
  p.mask = MaskKind::causal;
  p.scale = 1.0;
  RunOptions opt;
  opt.record_deltas = true;
  opt.fp64 = fp64;
  opt.num_threads = 2;
  EngineRun r;
  reference::decode(p, cfg, opt, &r.st);
  r.out.assign(out.begin(), out.end());
  return r;
}

oracle::Attention oracle_for(const Data& D, bool causal, bool decode, double lambda, int rows, int heads,
                             VisitOrder order) {
  oracle::Attention a;
  a.q = D.q.data();
  a.k = D.k.data();
  a.v = D.v.data();
  a.Lq = D.Lq;
  a.Lk = D.Lk;
  a.Hq = D.Hq;
  a.Hk = D.Hk;
  a.d = D.d;
  a.dv = D.dv;
  a.causal = causal;
  a.decode = decode;
  a.scale = 1.0;
  a.T = kT;
  a.rows = rows;
  a.heads = heads;
  a.order = order == VisitOrder::max_first ? oracle::Order::max_first : oracle::Order::natural;
  a.lambda = lambda;
  return a;
}

// Engine (fp32 and fp64 accumulation) vs oracle: every delta in visit order, the per-head
// counts, the output. The inputs keep every oracle delta at least 1e-3 away from ln(lambda), so
// the engine's fp32 scores cannot flip a decision. Returns the oracle's result.
oracle::AttentionResult compare(const Data& D, bool causal, bool decode, double lambda, int rows, int heads,
                                VisitOrder order, const std::string& what) {
  SCOPED_TRACE(what);
  const oracle::AttentionResult o = oracle::run(oracle_for(D, causal, decode, lambda, rows, heads, order));
  const double ln_lambda = std::log(lambda);
  std::vector<double> odeltas;
  for (const auto& g : o.groups)
    for (double x : g.delta) {
      odeltas.push_back(x);
      if (std::isfinite(x)) EXPECT_GT(std::abs(x - ln_lambda), 1e-3) << "test input too close to the threshold";
    }
  const SkipConfig cfg = cfg_for(lambda, rows, heads, order);
  for (bool fp64 : {false, true}) {
    SCOPED_TRACE(fp64 ? "fp64 engine" : "fp32 engine");
    const EngineRun e = decode ? run_decode(D, cfg, fp64) : run_prefill(D, causal, cfg, fp64);
    EXPECT_EQ(e.st.visited, o.visited);
    EXPECT_EQ(e.st.skipped, o.skipped);
    EXPECT_EQ(e.st.deltas.size(), odeltas.size());
    if (e.st.deltas.size() != odeltas.size()) continue;
    int bad = 0;
    for (std::size_t x = 0; x < odeltas.size(); ++x) {
      const double ed = e.st.deltas[x];
      const bool ok = std::isinf(odeltas[x]) ? ed == odeltas[x] : std::abs(ed - odeltas[x]) < 1e-4;
      if (!ok && ++bad <= 5) ADD_FAILURE() << "delta #" << x << ": engine " << ed << ", oracle " << odeltas[x];
    }
    EXPECT_EQ(bad, 0);
    double maxdiff = 0;
    for (std::size_t x = 0; x < o.out.size(); ++x) maxdiff = std::max(maxdiff, std::abs(e.out[x] - o.out[x]));
    EXPECT_LT(maxdiff, fp64 ? 1e-6 : 1e-4);  // fp64: only the f32 output rounding is left
  }
  return o;
}

struct Coverage {
  i64 visited = 0, skipped = 0, kept_by_other_row = 0;
};

// What the case exists for: some tiles skipped, some kept, and tiles that a row alone would have
// skipped (its own tile_max - m_r < ln lambda) kept because another row of its group voted no.
Coverage coverage(const oracle::AttentionResult& o, double lambda) {
  Coverage c;
  for (const auto& g : o.groups)
    for (std::size_t x = 0; x < g.order.size(); ++x) {
      ++c.visited;
      c.skipped += g.skipped[x];
      if (g.skipped[x]) continue;
      for (double rd : g.row_delta[x])
        if (rd > oracle::kNegInf && rd < std::log(lambda)) {
          ++c.kept_by_other_row;
          break;
        }
    }
  return c;
}

struct Case {
  const char* name;
  i64 Lq, Lk, Hq, Hk;
  bool causal;
};

const Case kPrefill[] = {
    {"causal Lq = Lk = 1024", 1024, 1024, 2, 1, true},
    {"causal Lq 320 < Lk 1000 (bottom-right, diagonal across tiles)", 320, 1000, 2, 2, true},
    {"full Lq 256 < Lk 1024 (own tile scaled by 4)", 256, 1024, 2, 1, false},
    {"full Lq 640 > Lk 900 (own tile scaled by 1.4)", 640, 900, 1, 1, false},
};

}  // namespace

// The visit order written out from SPEC §2a by hand, to check the oracle itself.
TEST(Oracle, VisitOrderFromTheSpecText) {
  using oracle::Order;
  EXPECT_EQ(oracle::visit_order(5, 3, Order::natural), (std::vector<i64>{0, 1, 2, 3, 4}));
  EXPECT_EQ(oracle::visit_order(8, 4, Order::max_first), (std::vector<i64>{0, 4, 3, 5, 2, 6, 1, 7}));
  EXPECT_EQ(oracle::visit_order(6, 5, Order::max_first), (std::vector<i64>{0, 5, 4, 3, 2, 1}));
  EXPECT_EQ(oracle::visit_order(5, 1, Order::max_first), (std::vector<i64>{0, 1, 2, 3, 4}));
  EXPECT_EQ(oracle::visit_order(4, 0, Order::max_first), (std::vector<i64>{0, 1, 2, 3}));
  EXPECT_EQ(oracle::visit_order(1, 0, Order::max_first), (std::vector<i64>{0}));
  // Own tiles (SPEC §2a): full 256 x 1024, group at rows 64..127 -> key 256 -> tile 2.
  oracle::Attention a;
  a.Lq = 256;
  a.Lk = 1024;
  EXPECT_EQ(oracle::own_tile(a, 64, 127), 2);
  EXPECT_EQ(oracle::own_tile(a, 192, 255), 6);
  a.causal = true;  // diagonal: key 127 + 768 = 895 -> tile 6
  EXPECT_EQ(oracle::own_tile(a, 64, 127), 6);
  a.decode = true;
  EXPECT_EQ(oracle::own_tile(a, 0, 0), 7);
}

// The vote of a group, by hand: row 0 alone would skip tile 1 (delta -5), row 1 votes to keep it
// (delta +1): the group keeps it and both rows use it; voting per row skips it for row 0.
TEST(Oracle, GroupVoteByHand) {
  const double ni = oracle::kNegInf;
  oracle::Group g;
  g.s = {{5, 5, 0, 0}, {1, 1, 2, 2}};  // T = 2: tile 0 = keys 0-1, tile 1 = keys 2-3
  std::vector<std::vector<double>> v = {{0}, {0}, {1}, {1}};
  const auto r = oracle::run_group(g, v, 2, oracle::Order::natural, true, std::log(0.1));
  ASSERT_EQ(r.order, (std::vector<i64>{0, 1}));
  EXPECT_TRUE(std::isinf(r.delta[0]) && r.delta[0] > 0);
  EXPECT_DOUBLE_EQ(r.delta[1], 1.0);
  EXPECT_DOUBLE_EQ(r.row_delta[1][0], -5.0);
  EXPECT_FALSE(r.skipped[1]);
  EXPECT_NEAR(r.out[0][0], 2 * std::exp(-5.0) / (2 + 2 * std::exp(-5.0)), 1e-15);
  oracle::Group g0;
  g0.s = {g.s[0]};
  const auto r0 = oracle::run_group(g0, v, 2, oracle::Order::natural, true, std::log(0.1));
  EXPECT_TRUE(r0.skipped[1]);
  EXPECT_EQ(r0.out[0][0], 0.0);
  (void)ni;
}

TEST(Oracle, PrefillSkipSetAndOutputMatchTheEngine) {
  const double lambda = 0.3;
  for (const Case& c : kPrefill)
    for (VisitOrder order : {VisitOrder::natural, VisitOrder::max_first}) {
      const std::string what = std::string(c.name) + ", " + to_string(order);
      const Data D = make_data(c.Lq, c.Lk, c.Hq, c.Hk, c.causal, 1000 + c.Lq + c.Lk);
      const auto o64 = compare(D, c.causal, false, lambda, 64, 1, order, what + ", 64-row votes");
      const auto o1 = compare(D, c.causal, false, lambda, 1, 1, order, what + ", 1-row votes");
      const Coverage cv = coverage(o64, lambda);
      EXPECT_GT(cv.skipped, cv.visited / 10) << what;
      EXPECT_LT(cv.skipped, cv.visited) << what;
      EXPECT_GT(cv.kept_by_other_row, 0) << what;
      // Per-row votes skip a strictly larger share of the pairs than 64-row votes.
      const Coverage c1 = coverage(o1, lambda);
      EXPECT_GT(static_cast<double>(c1.skipped) / c1.visited, static_cast<double>(cv.skipped) / cv.visited)
          << what;
    }
}

// One row that alone would skip a tile, kept because another row of its 64-row group votes no:
// the engine's output for that row includes the tile (equals the group oracle) and differs from
// what that row gets with per-row votes (the tile skipped).
TEST(Oracle, RowThatWouldSkipIsKeptByItsGroup) {
  const double lambda = 0.3;
  for (VisitOrder order : {VisitOrder::natural, VisitOrder::max_first}) {
    const Data D = make_data(512, 1024, 1, 1, true, 77);
    const auto o64 = oracle::run(oracle_for(D, true, false, lambda, 64, 1, order));
    const auto o1 = oracle::run(oracle_for(D, true, false, lambda, 1, 1, order));
    const EngineRun e = run_prefill(D, true, cfg_for(lambda, 64, 1, order), true);
    int found = 0;
    for (std::size_t gi = 0; gi < o64.groups.size() && found < 20; ++gi) {
      const auto& g = o64.groups[gi];
      for (std::size_t x = 0; x < g.order.size(); ++x) {
        if (g.skipped[x]) continue;
        for (std::size_t r = 0; r < g.row_delta[x].size(); ++r) {
          const double rd = g.row_delta[x][r];
          if (!(rd > oracle::kNegInf && rd < std::log(lambda))) continue;
          const i64 i = o64.group_rows[gi][r];  // head 0: the row index
          double to_group = 0, to_single = 0;
          for (i64 c = 0; c < D.dv; ++c) {
            const std::size_t at = static_cast<std::size_t>(i * D.dv + c);
            to_group = std::max(to_group, std::abs(e.out[at] - o64.out[at]));
            to_single = std::max(to_single, std::abs(e.out[at] - o1.out[at]));
          }
          // Only rows whose per-row run differs at all: a later difference in m could also
          // skip other tiles; the group run must match the group oracle regardless.
          EXPECT_LT(to_group, 1e-6) << "row " << i << ", tile " << g.order[x];
          if (to_single > 1e-4) ++found;
        }
      }
    }
    EXPECT_GE(found, 10) << to_string(order);
  }
}

TEST(Oracle, DecodeGroupedHeadsMatchTheEngine) {
  const double lambda = 0.3;
  for (VisitOrder order : {VisitOrder::natural, VisitOrder::max_first})
    for (i64 qlen : {1, 4}) {
      const Data D = make_data(qlen, 1000, 4, 2, true, 500 + qlen);
      const std::string what = std::string("decode q_len ") + std::to_string(qlen) + ", " + to_string(order);
      const auto o = compare(D, true, true, lambda, static_cast<int>(qlen), 2, order, what);
      const Coverage cv = coverage(o, lambda);
      EXPECT_GT(cv.skipped, 0) << what;
      EXPECT_LT(cv.skipped, cv.visited) << what;
      if (qlen > 1) EXPECT_GT(cv.kept_by_other_row, 0) << what;
    }
}

// SPEC §3: lambda = factor / Lk per sequence; lambda >= 1 runs that sequence dense. Ragged batch
// of two multi-tile sequences: A (Lk = 512, 4 tiles) gets lambda = 600/512 >= 1, B (Lk = 2048,
// 16 tiles) lambda = 600/2048 < 1. A is bitwise the dense output and skips nothing; B skips.
TEST(Oracle, LambdaAtLeastOneRunsDenseOnMultiTileSequences) {
  const i64 La = 512, Lb = 2048, H = 2;
  for (VisitOrder order : {VisitOrder::natural, VisitOrder::max_first}) {
    SCOPED_TRACE(to_string(order));
    const Data A = make_data(La, La, H, H, true, 91);
    const Data B = make_data(Lb, Lb, H, H, true, 92);
    ASSERT_EQ(A.dv, B.dv);
    // Pack both into one ragged batch; d is the larger of the two (zero-padded channels).
    const i64 d = std::max(A.d, B.d), dv = A.dv, T = La + Lb;
    std::vector<float> q(static_cast<std::size_t>(T * H * d), 0.0f), k = q, v(static_cast<std::size_t>(T * H * dv));
    auto pack = [&](const Data& X, i64 off) {
      for (i64 i = 0; i < X.Lq; ++i)
        for (i64 h = 0; h < H; ++h) {
          for (i64 c = 0; c < X.d; ++c) {
            q[((off + i) * H + h) * d + c] = X.q[(i * H + h) * X.d + c];
            k[((off + i) * H + h) * d + c] = X.k[(i * H + h) * X.d + c];
          }
          for (i64 c = 0; c < dv; ++c) v[((off + i) * H + h) * dv + c] = X.v[(i * H + h) * dv + c];
        }
    };
    pack(A, 0);
    pack(B, La);
    const std::vector<std::int32_t> cu = {0, static_cast<std::int32_t>(La), static_cast<std::int32_t>(T)};
    auto run_batch = [&](const SkipConfig& cfg, SkipStats* st) {
      std::vector<float> out(static_cast<std::size_t>(T * H * dv), std::nanf(""));
      AttentionProblem p;
      p.q = Tensor::contiguous(q.data(), DType::f32, {T, H, d});
      p.k = Tensor::contiguous(k.data(), DType::f32, {T, H, d});
      p.v = Tensor::contiguous(v.data(), DType::f32, {T, H, dv});
      p.out = Tensor::contiguous(out.data(), DType::f32, {T, H, dv});
      p.cu_seqlens_q = cu.data();
      p.cu_seqlens_k = cu.data();
      p.batch = 2;
      p.mask = MaskKind::causal;
      p.scale = 1.0;
      RunOptions opt;
      opt.collect_stats = true;
      opt.num_threads = 2;
      reference::attention(p, cfg, opt, st);
      return out;
    };
    SkipConfig dense;
    dense.vote.order = order;
    SkipStats sd, ss;
    const std::vector<float> out_dense = run_batch(dense, &sd);
    SkipConfig cfg = SkipConfig::from_factor(600.0).with_order(VisitOrder::natural);
    cfg.vote.order = order;
    const std::vector<float> out_skip = run_batch(cfg, &ss);
    ASSERT_EQ(ss.lambda.size(), 2u);
    EXPECT_DOUBLE_EQ(ss.lambda[0], 600.0 / La);
    EXPECT_DOUBLE_EQ(ss.lambda[1], 600.0 / Lb);
    // A: bitwise dense.
    const std::size_t na = static_cast<std::size_t>(La * H * dv);
    EXPECT_EQ(0, std::memcmp(out_dense.data(), out_skip.data(), na * sizeof(float)));
    // B: the oracle at lambda_B (its own skip set) and really skipping.
    const auto ob = oracle::run(oracle_for(B, true, false, 600.0 / Lb, 64, 1, order));
    i64 ob_vis = 0, ob_skip = 0;
    for (auto x : ob.visited) ob_vis += x;
    for (auto x : ob.skipped) ob_skip += x;
    ASSERT_GT(ob_skip, 0);
    double maxdiff = 0;
    for (std::size_t x = 0; x < ob.out.size(); ++x)
      maxdiff = std::max(maxdiff, std::abs(static_cast<double>(out_skip[na + x]) - ob.out[x]));
    EXPECT_LT(maxdiff, 1e-4);
    EXPECT_NE(0, std::memcmp(out_dense.data() + na, out_skip.data() + na, ob.out.size() * sizeof(float)));
    // Statistics: all of A's tiles visited, none skipped; B's skipped are exactly the oracle's.
    const auto oa = oracle::run(oracle_for(A, true, false, 2.0, 64, 1, order));
    i64 oa_vis = 0;
    for (auto x : oa.visited) oa_vis += x;
    EXPECT_EQ(ss.total_visited(), oa_vis + ob_vis);
    EXPECT_EQ(ss.total_skipped(), ob_skip);
    EXPECT_EQ(sd.total_skipped(), 0);
    // A is a sequence that does skip when its lambda is below 1 (so running it dense matters).
    const auto oa_skip = oracle::run(oracle_for(A, true, false, 0.9, 64, 1, order));
    i64 oa_sk = 0;
    for (auto x : oa_skip.skipped) oa_sk += x;
    EXPECT_GT(oa_sk, 0);
  }
}
