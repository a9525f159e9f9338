// GPU prefill kernel (sm_90a) against an independent float64 oracle. Dense: the kernel's max
// error on O and LSE must stay within 2x the error of a naive 16-bit implementation plus a small
// floor. Skip: the per-head visited/skipped counts and delta histograms must match the oracle's
// at the kernel's vote granularity (64 rows x 1 head x 128 keys, natural order), up to ties
// within rounding, and the output must match the oracle's skip output. Fresh random data per
// test (the seed is printed on failure); outputs are poisoned with NaN before every launch.
#include <gtest/gtest.h>

#include <cmath>

#include "blasst/blasst.hpp"
#include "blasst/workloads.hpp"
#include "cuda/cuda_dispatch.hpp"
#include "gpu_prefill/prefill_oracle.hpp"

namespace blasst::test {
namespace {

#define REQUIRE_GPU()                                                                   \
  if (!blasst::cuda_available()) GTEST_SKIP() << "no CUDA GPU: the sm_90a prefill kernel " \
                                                 "needs a Hopper device"

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

std::uint64_t seed_for(int i) { return fresh_seed() + std::uint64_t(i) * 7919; }

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
  int i = 0;
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
  int i = 0;
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
  int i = 0;
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
  int i = 0;
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

void check_skip(const Case& c, const Inputs& in, double lambda, bool hist) {
  SCOPED_TRACE(c.name() + " lambda " + std::to_string(lambda));
  SkipConfig sk = SkipConfig::from_threshold(lambda);
  RunOptions opt;
  opt.collect_stats = true;
  opt.collect_histogram = hist;
  SkipStats st;
  const KernelOut k = run_gpu(c, in, sk, opt, &st);
  const Oracle dense = oracle(c, in, std::vector<double>(std::size_t(c.nseq()), -INFINITY));
  const Oracle o = oracle(c, in, std::vector<double>(std::size_t(c.nseq()), std::log(lambda)), false);
  ASSERT_EQ(st.visited.size(), std::size_t(c.hq));
  ASSERT_EQ(st.skipped.size(), std::size_t(c.hq));
  EXPECT_EQ(st.granularity.rows, 64);
  EXPECT_EQ(st.granularity.heads, 1);
  EXPECT_EQ(st.granularity.tile_keys, 128);
  std::int64_t ties = 0, skipped = 0;
  for (std::int64_t h = 0; h < c.hq; ++h) {
    EXPECT_EQ(st.visited[h], o.visited[h]) << "head " << h;
    EXPECT_LE(std::abs(st.skipped[h] - o.skipped[h]), o.ties[h]) << "head " << h;
    ties += o.ties[h];
    skipped += o.skipped[h];
  }
  if (hist) {
    ASSERT_EQ(st.hist.size(), std::size_t(c.hq));
    for (std::int64_t h = 0; h < c.hq; ++h) {
      DeltaHistogram oh;
      for (float d : o.deltas[h]) oh.add(d);
      EXPECT_EQ(st.hist[h].total(), oh.total());
      // Cumulative counts at every bin edge agree up to deltas within rounding of that edge.
      std::uint64_t ck = 0, co = 0;
      for (int b = 0; b < DeltaHistogram::kBins + 2; ++b) {
        ck += st.hist[h].counts[b];
        co += oh.counts[b];
        if (ck != co) {
          const double edge = b <= DeltaHistogram::kBins ? DeltaHistogram::kLo + b * DeltaHistogram::kWidth : 0.0;
          std::uint64_t near = 0;
          for (float d : o.deltas[h]) near += std::abs(d - edge) < 1e-3 ? 1 : 0;
          EXPECT_LE(ck > co ? ck - co : co - ck, near) << "head " << h << " bin " << b;
        }
      }
    }
  }
  // The skip output matches the oracle's skip output; a tie decided the other way moves at most
  // lambda * 128 of a row's mass.
  const double e_naive = max_err(dense.o_naive, dense.o);
  const double tie_slack = ties > 0 ? lambda * 128 * 8.0 : 0.0;
  EXPECT_LE(max_err(k.o, o.o), 2 * e_naive + kFloorO + tie_slack);
  EXPECT_LE(max_err(k.lse, o.lse), 2 * max_err(dense.lse_naive, dense.lse) + kFloorLse + tie_slack);
  std::printf("[skip] %s lambda %.3g: skipped %lld pairs, ties %lld\n", c.name().c_str(), lambda,
              (long long)skipped, (long long)ties);
}

TEST(GpuPrefill, SkipMatchesOracleFullAndCausal) {
  REQUIRE_GPU();
  int i = 0;
  for (bool causal : {false, true})
    for (std::int64_t d : {64, 128}) {
      Case c;
      c.Lq = c.Lk = 1500;
      c.hq = 4;
      c.hk = 2;
      c.d = d;
      c.causal = causal;
      const Inputs in = llm_inputs(c, seed_for(i++));
      for (double lambda : {1e-4, 1e-2, 0.3}) check_skip(c, in, lambda, lambda == 1e-2);
    }
}

TEST(GpuPrefill, SkipRaggedPerSequenceLambda) {
  REQUIRE_GPU();
  // factor mode: lambda = factor / Lk per sequence; the short sequence runs dense (lambda >= 1).
  Case c;
  c.lq = {300, 50, 900};
  c.lk = {300, 50, 900};
  c.B = 3;
  c.hq = 2;
  c.hk = 1;
  c.causal = true;
  const Inputs in = random_inputs(c, seed_for(1), 2.0f);
  const double factor = 60.0;
  SkipConfig sk = SkipConfig::from_factor(factor);
  RunOptions opt;
  opt.collect_stats = true;
  SkipStats st;
  const KernelOut k = run_gpu(c, in, sk, opt, &st);
  std::vector<double> ln;
  for (auto L : c.lk) ln.push_back(factor / double(L) >= 1 ? -INFINITY : std::log(factor / double(L)));
  const Oracle o = oracle(c, in, ln, false);
  ASSERT_EQ(st.lambda.size(), 3u);
  EXPECT_DOUBLE_EQ(st.lambda[1], factor / 50.0);
  for (std::int64_t h = 0; h < c.hq; ++h) {
    EXPECT_EQ(st.visited[h], o.visited[h]);
    EXPECT_LE(std::abs(st.skipped[h] - o.skipped[h]), o.ties[h]);
  }
  EXPECT_LE(max_err(k.o, o.o), 2e-2);
}

TEST(GpuPrefill, DenseStatisticsRunSkipsNothing) {
  REQUIRE_GPU();
  Case c;
  c.Lq = c.Lk = 700;
  c.causal = true;
  const Inputs in = random_inputs(c, seed_for(3));
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
  if (!blasst::detail::cuda_built()) GTEST_SKIP() << "no CUDA GPU: library built without the kernels";
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
// ragged + GQA + causal, dense and skip with statistics, both head dims.
TEST(GpuPrefillSanitizer, Small) {
  if (!blasst::cuda_available()) GTEST_SKIP() << "no CUDA GPU: the sm_90a prefill kernel needs a Hopper device";
  for (std::int64_t d : {64, 128}) {
    Case c;
    c.lq = {70, 200};
    c.lk = {300, 130};
    c.B = 2;
    c.hq = 2;
    c.hk = 1;
    c.d = d;
    c.causal = true;
    const Inputs in = random_inputs(c, fresh_seed(), 2.0f);
    const KernelOut dense = run_gpu(c, in);
    RunOptions opt;
    opt.collect_histogram = true;
    SkipStats st;
    const KernelOut sk = run_gpu(c, in, SkipConfig::from_threshold(0.05), opt, &st);
    for (float x : dense.o) ASSERT_FALSE(std::isnan(x));
    for (float x : sk.o) ASSERT_FALSE(std::isnan(x));
    EXPECT_GT(st.total_visited(), 0);
  }
}

}  // namespace
}  // namespace blasst::test
