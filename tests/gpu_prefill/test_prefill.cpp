// GPU prefill kernel (sm_90a) against an independent float64 oracle. Dense: the kernel's max
// error on O and LSE must stay within 2x the error of a naive 16-bit implementation plus a small
// floor. Skip: the per-head visited/skipped counts and delta histograms must match the oracle's
// at the kernel's vote granularity (64 rows x 1 head x 128 keys, natural order), up to ties
// within rounding, and the output must match the oracle's skip output. Fresh random data per
// test (the seed is printed on failure); outputs are poisoned with NaN before every launch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "blasst/blasst.hpp"
#include "blasst/workloads.hpp"
#include "cuda/cuda_dispatch.hpp"
#include "gpu_common.hpp"
#include "gpu_prefill/prefill_oracle.hpp"

namespace blasst::test {
namespace {

#define REQUIRE_GPU() BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device")

constexpr double kFloorO = 2e-3, kFloorLse = 2e-3;

void check_dense(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE(c.name() + " seed " + std::to_string(seed));
  const Inputs in = random_inputs(c, seed);
  const KernelOut k = run_gpu(c, in);
  const Oracle o = oracle(c, in, std::vector<double>(std::size_t(c.nseq()), -INFINITY));
  const double e_naive = max_err(o.o_naive, o.o), e = max_err(k.o, o.o);
  const double l_naive = max_err(o.lse_naive, o.lse), l = max_err(k.lse, o.lse);
  EXPECT_LE(e, 2 * e_naive + kFloorO) << "O error " << e << " vs naive " << e_naive;
  EXPECT_LE(l, 2 * l_naive + kFloorLse) << "LSE error " << l << " vs naive " << l_naive;
}

std::uint64_t seed_for(int i) { return test_seed(std::uint64_t(i)); }

TEST(GpuPrefill, DenseLengthsFullAndCausal) {
  REQUIRE_GPU();
  int i = 0;
  for (std::int64_t L : {1, 17, 127, 129, 1000, 4097}) {
    for (bool causal : {false, true}) {
      Case c;
      c.Lq = c.Lk = L;
      c.hq = c.hk = L > 2000 ? 1 : 2;
      c.d = (i % 2) ? 64 : 128;
      c.causal = causal;
      check_dense(c, seed_for(i++));
    }
  }
}

TEST(GpuPrefill, CausalUnequalLengths) {
  REQUIRE_GPU();
  int i = 20;
  // Lq < Lk (bottom-right aligned), Lq > Lk (leading rows see nothing: O = 0, LSE = -inf).
  for (auto [lq, lk] : {std::pair<int, int>{100, 300}, {129, 1000}, {300, 100}, {1, 513}, {200, 1}}) {
    Case c;
    c.Lq = lq;
    c.Lk = lk;
    c.causal = true;
    check_dense(c, seed_for(i++));
    c.causal = false;
    check_dense(c, seed_for(i++));
  }
}

TEST(GpuPrefill, GroupedQueryHeads) {
  REQUIRE_GPU();
  int i = 40;
  for (auto [hq, hk] : {std::pair<int, int>{4, 4}, {8, 2}, {16, 2}, {8, 1}}) {  // g = 1, 4, 8, Hq
    Case c;
    c.Lq = c.Lk = 300;
    c.hq = hq;
    c.hk = hk;
    c.causal = i % 2;
    check_dense(c, seed_for(i++));
  }
}

TEST(GpuPrefill, DtypesHeadDimsOutF32AndBatch) {
  REQUIRE_GPU();
  int i = 60;
  for (DType dt : {DType::bf16, DType::f16})
    for (std::int64_t d : {64, 128})
      for (bool of32 : {false, true}) {
        Case c;
        c.B = 2;
        c.Lq = 257;
        c.Lk = 383;
        c.hq = 4;
        c.hk = 2;
        c.d = d;
        c.dt = dt;
        c.out_f32 = of32;
        c.causal = i % 2;
        check_dense(c, seed_for(i++));
      }
}

TEST(GpuPrefill, RaggedBatch) {
  REQUIRE_GPU();
  int i = 80;
  for (bool causal : {false, true}) {
    Case c;
    c.lq = {1, 130, 257, 64, 0, 700};
    c.lk = {100, 130, 600, 1, 5, 700};
    c.B = std::int64_t(c.lq.size());
    c.hq = 4;
    c.hk = 1;
    c.causal = causal;
    check_dense(c, seed_for(i++));
  }
}

// Skip check against the float64 oracle on the same 16-bit inputs and the kernel's vote groups
// (64 rows x 1 head x 128 keys, natural order). lambda comes from the oracle's exact one-pass
// curve (SPEC §5) at `target`, or per sequence from `factor` (lambda = factor / Lk, >= 1: dense).
// Asserted: equal visited counts per head; skipped counts within [sure, sure + near-ties] per head
// (near-ties: |delta - ln lambda| < kTieEps, at most 1 % of the pairs); the histograms (when
// asked) up to deltas within kTieEps of a bin edge; the output and LSE within 2x the naive 16-bit
// error plus a floor, plus, on rows of a vote group with a near-tie, the exact SPEC §2 share of
// that tile (never switched off); something was skipped.
struct SkipResult {
  std::int64_t gpu_skipped = 0, visited = 0;
  std::vector<std::int64_t> ref_skipped_per_seq;
};

SkipResult check_skip(const Case& c, const Inputs& in, std::optional<double> target, std::optional<double> factor,
                      bool hist) {
  SkipResult res;
  const Oracle dense = oracle(c, in, std::vector<double>(std::size_t(c.nseq()), -INFINITY));
  std::vector<double> ln(std::size_t(c.nseq()), -INFINITY);
  SkipConfig sk;
  if (target) {
    const double l = ln_lambda_for(dense.all_deltas, *target);
    EXPECT_TRUE(std::isfinite(l)) << "target " << *target << " unreachable at lambda < 1 (max "
                                  << max_reachable_sparsity(dense.all_deltas) << "): the fixed data is inadequate";
    if (!std::isfinite(l)) return res;
    ln.assign(ln.size(), l);
    sk = SkipConfig::from_threshold(std::exp(l)).with_order(VisitOrder::natural);
  } else {
    sk = SkipConfig::from_factor(*factor).with_order(VisitOrder::natural);
    for (std::int64_t b = 0; b < c.nseq(); ++b)
      if (*factor / double(c.klen(b)) < 1) ln[std::size_t(b)] = std::log(*factor / double(c.klen(b)));
  }
  SCOPED_TRACE(c.name() + (target ? " target " + std::to_string(*target) + " lambda " + std::to_string(std::exp(ln[0]))
                                  : " factor " + std::to_string(*factor)));
  RunOptions opt;
  opt.collect_stats = true;
  opt.collect_histogram = hist;
  SkipStats st;
  const KernelOut k = run_gpu(c, in, sk, opt, &st);
  const Oracle o = oracle(c, in, ln, false);
  EXPECT_EQ(st.granularity.rows, 64);
  EXPECT_EQ(st.granularity.heads, 1);
  EXPECT_EQ(st.granularity.tile_keys, 128);
  EXPECT_EQ(st.granularity.order, VisitOrder::natural);

  std::vector<std::int64_t> ql, kl;
  for (std::int64_t b = 0; b < c.nseq(); ++b) {
    ql.push_back(c.qlen(b));
    kl.push_back(c.klen(b));
  }
  VoteGranularity vote;  // the kernel's: 64 rows x 1 head x 128 keys, natural
  const auto tasks = vote_tasks(ql, kl, c.hk, c.hq / c.hk, vote, c.causal, false);
  const SkipSet set = classify_skip_set(tasks, dense.all_deltas, ln, c.hq, true);
  expect_skip_counts(set, st);
  for (std::int64_t h = 0; h < c.hq; ++h) EXPECT_EQ(set.ref_skipped[std::size_t(h)], o.skipped[std::size_t(h)]);
  if (hist) {
    EXPECT_EQ(st.hist.size(), std::size_t(c.hq));
    for (std::int64_t h = 0; h < c.hq && h < std::int64_t(st.hist.size()); ++h)
      expect_histograms(st.hist[std::size_t(h)], dense.deltas[std::size_t(h)], "head " + std::to_string(h));
  }
  EXPECT_EQ(st.lambda.size(), std::size_t(c.nseq()));
  for (std::int64_t b = 0; b < c.nseq() && b < std::int64_t(st.lambda.size()); ++b)
    EXPECT_DOUBLE_EQ(st.lambda[std::size_t(b)], target ? std::exp(ln[0]) : *factor / double(c.klen(b))) << "seq " << b;
  res.ref_skipped_per_seq.assign(std::size_t(c.nseq()), 0);
  {
    std::size_t i = 0;
    for (const auto& t : tasks)
      for (std::size_t x = 0; x < t.tiles.size(); ++x, ++i)
        res.ref_skipped_per_seq[std::size_t(t.b)] += double(dense.all_deltas[i]) < ln[std::size_t(t.b)];
  }

  // Outputs: per-row slack of the near-ties (SPEC §2, exact share of the tile in the row).
  const double scale = 1.0 / std::sqrt(double(c.d));
  const std::int64_t D = c.d, g = c.hq / c.hk;
  std::vector<double> slack_o(std::size_t(c.tq() * c.hq), 0.0), slack_l(slack_o.size(), 0.0);
  double vmax = 0;
  for (float x : in.vf) vmax = std::max(vmax, double(std::abs(x)));
  near_tie_slack(
      tasks, set, kl, 1, 128,
      [&](std::int64_t b, std::int64_t h, std::int64_t pos, std::int64_t j) {
        if (c.causal && j > pos + c.klen(b) - c.qlen(b)) return -std::numeric_limits<double>::infinity();
        const float* qr = &in.qf[std::size_t(((c.qstart(b) + pos) * c.hq + h) * D)];
        const float* kr = &in.kf[std::size_t(((c.kstart(b) + j) * c.hk + h / g) * D)];
        double acc = 0;
        for (std::int64_t x = 0; x < D; ++x) acc += double(qr[x]) * kr[x];
        return acc * scale;
      },
      [&](std::int64_t b, std::int64_t h, std::int64_t pos) { return o.lse[std::size_t(lse_index(c, b, h, pos))]; },
      [&](std::int64_t b, std::int64_t h, std::int64_t pos, double so, double sl) {
        slack_o[std::size_t((c.qstart(b) + pos) * c.hq + h)] += so * vmax;
        slack_l[std::size_t((c.qstart(b) + pos) * c.hq + h)] += sl;
      });
  const double tol_o = 2 * max_err(dense.o_naive, dense.o) + kFloorO;
  const double tol_l = 2 * max_err(dense.lse_naive, dense.lse) + kFloorLse;
  std::size_t bad_o = 0, bad_l = 0;
  double worst_o = 0, worst_l = 0;
  for (std::int64_t b = 0; b < c.nseq(); ++b)
    for (std::int64_t pos = 0; pos < c.qlen(b); ++pos)
      for (std::int64_t h = 0; h < c.hq; ++h) {
        const std::size_t row = std::size_t((c.qstart(b) + pos) * c.hq + h);
        for (std::int64_t x = 0; x < D; ++x) {
          const double ref = o.o[row * std::size_t(D) + std::size_t(x)], got = k.o[row * std::size_t(D) + std::size_t(x)];
          const double e = std::isnan(got) ? INFINITY : std::abs(got - ref);
          worst_o = std::max(worst_o, e - slack_o[row]);
          bad_o += e > tol_o + slack_o[row];
        }
        const std::size_t li = std::size_t(lse_index(c, b, h, pos));
        const double e = max_err(std::vector<float>{k.lse[li]}, std::vector<double>{o.lse[li]});
        worst_l = std::max(worst_l, e - slack_l[row]);
        bad_l += e > tol_l + slack_l[row];
      }
  EXPECT_EQ(bad_o, 0u) << "O elements beyond " << tol_o << " (+ near-tie slack); worst excess error " << worst_o;
  EXPECT_EQ(bad_l, 0u) << "LSE entries beyond " << tol_l << " (+ near-tie slack); worst excess error " << worst_l;
  res.gpu_skipped = st.total_skipped();
  res.visited = st.total_visited();
  std::printf("[skip] %s: kernel sparsity %.4f, oracle %.4f (sure %lld, near-ties %lld of %lld pairs)\n",
              c.name().c_str(), st.sparsity(), double(set.total_ref_skipped) / double(std::max<std::int64_t>(set.total_visited, 1)),
              (long long)set.total_sure, (long long)set.total_ties, (long long)set.total_visited);
  return res;
}

// Full and causal, both head dims, llm data: lambda from the oracle's one-pass curve at 20 % and
// 50 % sparsity (the former fixed lambdas 1e-4 / 1e-2 / 0.3 skipped 0 % to most tiles depending
// on the data); the histograms are compared at the 50 % point.
TEST(GpuPrefill, SkipMatchesOracleFullAndCausal) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  int i = 0;
  for (bool causal : {false, true})
    for (std::int64_t d : {64, 128}) {
      Case c;
      c.Lq = c.Lk = 1500;
      c.hq = 4;
      c.hk = 2;
      c.d = d;
      c.causal = causal;
      const std::uint64_t seed = test_seed(200 + i++);
      SCOPED_TRACE("seed " + std::to_string(seed));
      const Inputs in = llm_inputs(c, seed);
      for (double target : {0.2, 0.5}) {
        const SkipResult r = check_skip(c, in, target, std::nullopt, target == 0.5);
        EXPECT_GT(r.gpu_skipped, 0) << "nothing skipped";
      }
    }
}

// factor mode on multi-tile ragged sequences: lambda = factor / Lk per sequence; the 300-key
// sequence (3 tiles, 5 vote groups) gets lambda 1.5 >= 1 and runs dense, the others skip.
TEST(GpuPrefill, SkipRaggedPerSequenceLambda) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  for (bool causal : {true, false}) {
    Case c;
    c.lq = {300, 700, 1100, 900};
    c.lk = {300, 700, 1100, 900};
    c.B = 4;
    c.hq = 2;
    c.hk = 1;
    c.causal = causal;
    const std::uint64_t seed = test_seed(300 + std::uint64_t(causal));
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Inputs in = llm_ragged_inputs(c, seed);
    const double factor = 450.0;  // lambda 1.5, 0.64, 0.41, 0.5
    const SkipResult r = check_skip(c, in, std::nullopt, factor, false);
    ASSERT_EQ(r.ref_skipped_per_seq.size(), 4u);
    EXPECT_EQ(r.ref_skipped_per_seq[0], 0);
    for (std::size_t b = 1; b < 4; ++b) EXPECT_GT(r.ref_skipped_per_seq[b], 0) << "seq " << b << " skips nothing";
    EXPECT_GT(r.gpu_skipped, 0);
  }
}

TEST(GpuPrefill, DenseStatisticsRunSkipsNothing) {
  REQUIRE_GPU();
  Case c;
  c.Lq = c.Lk = 700;
  c.causal = true;
  const Inputs in = random_inputs(c, seed_for(100));
  RunOptions opt;
  opt.collect_histogram = true;
  SkipStats st;
  const KernelOut k = run_gpu(c, in, SkipConfig{}, opt, &st);
  const Oracle o = oracle(c, in, std::vector<double>(1, -INFINITY));
  for (std::int64_t h = 0; h < c.hq; ++h) {
    EXPECT_EQ(st.visited[h], o.visited[h]);
    EXPECT_EQ(st.skipped[h], 0);
    EXPECT_EQ(st.hist[h].total(), std::uint64_t(o.visited[h]));
  }
  EXPECT_LE(max_err(k.o, o.o), 2 * max_err(o.o_naive, o.o) + kFloorO);
}

TEST(GpuPrefill, UnsupportedCombinationsThrow) {
  if (!blasst::detail::cuda_built()) {
    if (gpu_required()) FAIL() << "BLASST_REQUIRE_GPU is set but the library was built without the kernels";
    GTEST_SKIP() << "library built without the CUDA kernels (BLASST_REQUIRE_GPU=1 makes this a failure)";
  }
  // Device-tagged tensors with aligned fake pointers: the checks run before any access.
  alignas(16) static std::uint16_t dummy[16];
  auto dev = [](Tensor t) { t.device = DeviceKind::cuda; return t; };
  auto make = [&](DType dt, std::int64_t d, std::int64_t dv) {
    AttentionProblem p;
    p.q = dev(Tensor::contiguous(dummy, dt, {1, 8, 2, d}));
    p.k = dev(Tensor::contiguous(dummy, dt, {1, 8, 2, d}));
    p.v = dev(Tensor::contiguous(dummy, dt, {1, 8, 2, dv}));
    p.out = dev(Tensor::contiguous(dummy, dt, {1, 8, 2, dv}));
    return p;
  };
  auto msg = [](const AttentionProblem& p) {
    try { detail::cuda_attention(p, {}, {}, nullptr); } catch (const Error& e) { return std::string(e.what()); }
    return std::string("no error");
  };
  EXPECT_NE(msg(make(DType::bf16, 96, 96)).find("head dimension"), std::string::npos);
  EXPECT_NE(msg(make(DType::f32, 128, 128)).find("q: dtype"), std::string::npos);
  EXPECT_NE(msg(make(DType::bf16, 128, 64)).find("v: head dimension"), std::string::npos);
  AttentionProblem p = make(DType::bf16, 128, 128);
  p.out.dtype = DType::f64;
  EXPECT_NE(msg(p).find("out: dtype"), std::string::npos);
}

}  // namespace
}  // namespace blasst::test

namespace blasst::test {
namespace {

// Small configurations for compute-sanitizer (memcheck, racecheck) in scripts/device_prefill.sh:
// ragged + GQA + causal (a row range that sees no key, a partial tile), dense and skip with
// statistics and histograms, both head dims; every result is checked against the oracle as in the
// full tests (dense: within 2x the naive 16-bit error; skip: lambda from the one-pass curve at
// 20 % (the d128 data reaches 29 % at most), exact counts up to near-ties, something skipped).
TEST(GpuPrefillSanitizer, Small) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  for (std::int64_t d : {64, 128}) {
    Case c;
    c.lq = {70, 200, 260};
    c.lk = {300, 130, 400};
    c.B = 3;
    c.hq = 2;
    c.hk = 1;
    c.d = d;
    c.causal = true;
    const std::uint64_t seed = test_seed(400 + std::uint64_t(d));
    SCOPED_TRACE(c.name() + " seed " + std::to_string(seed));
    const Inputs in = llm_ragged_inputs(c, seed);
    const KernelOut dense = run_gpu(c, in);
    const Oracle o = oracle(c, in, std::vector<double>(std::size_t(c.nseq()), -INFINITY));
    EXPECT_LE(max_err(dense.o, o.o), 2 * max_err(o.o_naive, o.o) + kFloorO);
    EXPECT_LE(max_err(dense.lse, o.lse), 2 * max_err(o.lse_naive, o.lse) + kFloorLse);
    const SkipResult r = check_skip(c, in, 0.2, std::nullopt, true);
    EXPECT_GT(r.gpu_skipped, 0);
    EXPECT_GT(r.visited, 0);
  }
}

}  // namespace
}  // namespace blasst::test
