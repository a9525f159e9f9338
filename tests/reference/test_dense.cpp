// Dense reference vs an independent naive float64 attention.
#include <gtest/gtest.h>

#include <cstring>

#include "common.hpp"

using namespace blasst;
using namespace blasst::test;

namespace {

struct Case {
  std::int64_t B, Lq, Lk, Hq, Hk, d, dv;
  bool causal;
};

void check_case(const Case& c, bool fp64, double tol, std::uint64_t seed) {
  Dense D(c.B, c.Lq, c.Lk, c.Hq, c.Hk, c.d, c.dv, seed);
  RunOptions opt;
  opt.fp64 = fp64;
  opt.num_threads = 2;
  AttentionProblem p = D.problem(c.causal ? MaskKind::causal : MaskKind::full);
  // The oracle mode writes float64 outputs so that its precision is visible.
  std::vector<double> out64(D.out.size(), std::nan("")), lse64(D.lse.size(), std::nan(""));
  if (fp64) {
    p.out = Tensor::contiguous(out64.data(), DType::f64, {c.B, c.Lq, c.Hq, c.dv});
    p.lse = Tensor::contiguous(lse64.data(), DType::f64, {c.B, c.Hq, c.Lq});
  }
  reference::attention(p, {}, opt);
  if (fp64) {
    for (std::size_t i = 0; i < out64.size(); ++i) D.out[i] = static_cast<float>(out64[i]);
  }
  std::vector<double> o, l;
  naive(D.q, D.k, D.v, c.B, c.Lq, c.Lk, c.Hq, c.Hk, c.d, c.dv, c.causal, o, l);
  EXPECT_LT(fp64 ? rel_err(out64, o) : rel_err(D.out, o), tol) << "Lq=" << c.Lq << " Lk=" << c.Lk << " Hq=" << c.Hq << " Hk=" << c.Hk;
  double lerr = 0;
  for (std::size_t i = 0; i < l.size(); ++i) {
    const double got = fp64 ? lse64[i] : D.lse[i];
    if (std::isinf(l[i])) {
      EXPECT_TRUE(std::isinf(got) && got < 0) << i;
      continue;
    }
    lerr = std::max(lerr, std::abs(got - l[i]) / std::max(1.0, std::abs(l[i])));
  }
  EXPECT_LT(lerr, tol * 10);
  for (float x : D.out) ASSERT_FALSE(std::isnan(x));
}

}  // namespace

TEST(Dense, MatchesNaiveFp32) {
  const Case cases[] = {
      {1, 1, 1, 1, 1, 8, 8, false},      {1, 17, 17, 2, 1, 16, 16, true},
      {2, 127, 127, 4, 1, 32, 32, true}, {1, 129, 129, 8, 2, 64, 64, false},
      {1, 200, 300, 4, 4, 64, 48, true},  {1, 300, 200, 4, 4, 24, 24, true},
      {1, 1000, 1000, 2, 2, 64, 64, true}, {1, 5, 1000, 8, 1, 128, 128, false},
  };
  std::uint64_t seed = 10;
  for (const auto& c : cases) check_case(c, false, 1e-6, seed += 7);
}

TEST(Dense, MatchesNaiveFp64Oracle) {
  const Case cases[] = {{1, 129, 257, 4, 2, 32, 16, true}, {2, 64, 64, 8, 1, 128, 128, false}};
  std::uint64_t seed = 99;
  for (const auto& c : cases) check_case(c, true, 1e-12, seed += 7);
}

// Thread count changes neither the outputs nor the order of the recorded deltas.
TEST(Dense, DeterministicAcrossThreadCounts) {
  Dense D(2, 300, 300, 4, 2, 32, 32, 77);
  std::vector<float> out_ref, lse_ref, deltas_ref;
  for (int th : {1, 2, 3, 7}) {
    RunOptions opt;
    opt.num_threads = th;
    opt.record_deltas = true;
    SkipStats st;
    SkipConfig c = SkipConfig::from_threshold(0.05).with_order(VisitOrder::natural);
    c.vote.rows = 16;
    reference::attention(D.problem(MaskKind::causal), c, opt, &st);
    if (th == 1) {
      out_ref = D.out;
      lse_ref = D.lse;
      deltas_ref = st.deltas;
      continue;
    }
    EXPECT_EQ(0, std::memcmp(out_ref.data(), D.out.data(), out_ref.size() * 4)) << th;
    EXPECT_EQ(0, std::memcmp(lse_ref.data(), D.lse.data(), lse_ref.size() * 4)) << th;
    EXPECT_EQ(deltas_ref, st.deltas) << th;
  }
}
