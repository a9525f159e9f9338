// The SPEC §2b FP8 screen in the sm_90a prefill kernel (skip_screen, skip_screen_check) against the
// plain skip kernel and the CPU reference with the screen on:
//   - strict: no wrong screen (the check instance counts them), something screened, the skip set
//     (per-head skipped counts) and the outputs equal the plain skip kernel's (the screen only
//     removes work while no screen is wrong), the fast instance's outputs equal the check
//     instance's, and the kernel screens no more than the reference (its margin is the
//     reference's plus the FP8 wgmma's accumulation term, prefill_screen.hpp) up to 1 % of the
//     pairs (its FP8 sums are not the reference's exact fp32 sums);
//   - a crafted wrong-screen-prone input (tight z = 0): the wrong screens are counted, equal to the
//     reference's count, and the output follows the screened skip set as the reference's does;
//   - the screen ahead (strict) against the plain skip kernel and the reference's screen ahead,
//     and on the crafted input (z = 0: the kernel's lower bound keeps its own FP8 accumulation
//     term, so it does not screen where the reference, with fp32 sums, screens wrongly).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/workloads.hpp"
#include "gpu_common.hpp"
#include "gpu_prefill/prefill_oracle.hpp"

namespace blasst::test {
namespace {

AttentionProblem host_problem(const Case& c, const Inputs& in, std::vector<float>& out, std::vector<float>& lse) {
  out.assign(std::size_t(c.tq() * c.hq * c.d), 0.f);
  lse.assign(std::size_t(c.tq() * c.hq), 0.f);
  AttentionProblem p;
  p.q = Tensor::contiguous(const_cast<float*>(in.qf.data()), DType::f32, {c.B, c.Lq, c.hq, c.d});
  p.k = Tensor::contiguous(const_cast<float*>(in.kf.data()), DType::f32, {c.B, c.Lk, c.hk, c.d});
  p.v = Tensor::contiguous(const_cast<float*>(in.vf.data()), DType::f32, {c.B, c.Lk, c.hk, c.d});
  p.out = Tensor::contiguous(out.data(), DType::f32, {c.B, c.Lq, c.hq, c.d});
  p.lse = Tensor::contiguous(lse.data(), DType::f32, {c.B, c.hq, c.Lq});
  p.mask = c.causal ? MaskKind::causal : MaskKind::full;
  return p;
}

SkipConfig screen_cfg(double lambda, VisitOrder order, ScreenMargin margin, double z = 6.0) {
  SkipConfig s = SkipConfig::from_threshold(lambda).with_order(order);
  s.vote.rows = 64;
  s.vote.heads = 1;
  s.vote.tile_keys = 128;
  s.screen.margin = margin;
  s.screen.z = z;
  return s;
}

// Elements of a and b beyond 2 units of the 16-bit roundoff (relative to max(|a|, 1)); prints how
// many differ at all (the expectation is bit-equality: the same decisions, the same arithmetic).
std::size_t count_beyond(const std::vector<float>& a, const std::vector<float>& b, double u, const char* what) {
  std::size_t bad = 0, bits = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    bits += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    const double e = std::abs(double(a[i]) - double(b[i]));
    bad += !(e <= 2 * u * std::max(1.0, std::abs(double(a[i]))));
  }
  std::printf("  [%s] %zu of %zu elements differ bitwise\n", what, bits, a.size());
  return bad;
}

// ln(lambda) at which the reference skips `target` of the pairs (its one-pass delta curve with
// the kernel's vote groups, in `order`); not finite when the fixed data cannot reach it.
double reference_ln_lambda(const AttentionProblem& p, VisitOrder order, double target) {
  SkipConfig probe;
  probe.vote.rows = 64;
  probe.vote.heads = 1;
  probe.vote.tile_keys = 128;
  probe.vote.order = order;
  RunOptions ropt;
  ropt.record_deltas = true;
  SkipStats curve;
  reference::attention(p, probe, ropt, &curve);
  return ln_lambda_for(curve.deltas, target);
}

void strict_case(const Case& c, const Inputs& in, double target, VisitOrder order) {
  std::vector<float> out, lse;
  AttentionProblem p = host_problem(c, in, out, lse);
  const double ln = reference_ln_lambda(p, order, target);
  ASSERT_TRUE(std::isfinite(ln)) << "target " << target << " unreachable: the fixed data is inadequate";
  const double lambda = std::exp(ln);
  SCOPED_TRACE(c.name() + " target " + std::to_string(target) + " lambda " + std::to_string(lambda) + " order " +
               to_string(order));

  RunOptions sopt;
  sopt.collect_stats = true;
  SkipStats rs;  // the reference's screen
  reference::attention(p, screen_cfg(lambda, order, ScreenMargin::strict), sopt, &rs);

  SkipStats ps, cs, fs;
  const KernelOut plain = run_gpu(c, in, screen_cfg(lambda, order, ScreenMargin::off), sopt, &ps);
  const KernelOut check = run_gpu(c, in, screen_cfg(lambda, order, ScreenMargin::strict), sopt, &cs);
  const KernelOut fast = run_gpu(c, in, screen_cfg(lambda, order, ScreenMargin::strict), RunOptions{}, &fs);

  EXPECT_TRUE(ps.screened.empty());
  ASSERT_EQ(cs.screened.size(), std::size_t(c.hq));
  ASSERT_EQ(cs.screen_wrong.size(), std::size_t(c.hq));
  EXPECT_EQ(cs.total_screen_wrong(), 0) << "strict margin: a wrong screen contradicts SPEC §2b's theorem (u8?)";
  EXPECT_GT(cs.total_screened(), 0) << "nothing screened: the case this test exists for did not happen";
  EXPECT_GT(ps.total_skipped(), 0);
  EXPECT_EQ(cs.visited, ps.visited);
  EXPECT_EQ(cs.skipped, ps.skipped);
  EXPECT_EQ(rs.total_screen_wrong(), 0);
  EXPECT_LE(cs.total_screened(), rs.total_screened() + cs.total_visited() / 100)
      << "the kernel's margin is the reference's plus the FP8 accumulation term: it screens no more";
  std::printf("[screen] %s target %.2f: visited %lld, skipped %lld (plain %lld), screened %lld (reference %lld)\n",
              c.name().c_str(), target, (long long)cs.total_visited(), (long long)cs.total_skipped(),
              (long long)ps.total_skipped(), (long long)cs.total_screened(), (long long)rs.total_screened());
  const double u = unit_roundoff(c.dt);
  EXPECT_EQ(count_beyond(plain.o, check.o, u, "O: plain skip vs screen check"), 0u);
  EXPECT_EQ(count_beyond(check.o, fast.o, u, "O: screen check vs screen"), 0u);
  EXPECT_EQ(count_beyond(plain.lse, fast.lse, u, "LSE: plain skip vs screen"), 0u);
}

// The screen tests' inputs: llm-like causal and DiT-like full masks, d = 128 and 64, 3000 rows,
// 4 / 2 heads, seeds seed0, seed0 + 1, ... (batched: two sequences at d = 64).
template <class F>
void for_each_screen_case(std::uint64_t seed0, bool batched, F&& f) {
  int i = 0;
  for (const bool causal : {true, false}) {
    for (const std::int64_t d : {128, 64}) {
      Case c;
      c.B = batched && d == 64 ? 2 : 1;
      c.Lq = c.Lk = 3000;
      c.hq = 4;
      c.hk = 2;
      c.d = d;
      c.causal = causal;
      WorkloadSpec ws;
      ws.kind = causal ? WorkloadKind::llm : WorkloadKind::dit;
      ws.seq_len = c.Lk;
      ws.heads_q = c.hq;
      ws.heads_k = c.hk;
      ws.head_dim = c.d;
      ws.batch = c.B;
      ws.seed = test_seed(seed0 + std::uint64_t(i++));
      SCOPED_TRACE("seed " + std::to_string(ws.seed));
      const Workload w = make_workload(ws);
      f(c, make_inputs(c, w.q, w.k, w.v));
    }
  }
}

TEST(GpuPrefillScreen, StrictEqualsThePlainSkipKernelWithoutWrongScreens) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  for_each_screen_case(900, false, [](const Case& c, const Inputs& in) {
    for (const double target : {0.6, 0.8}) strict_case(c, in, target, VisitOrder::max_first);
  });
}

// SPEC §2b screen ahead, strict: the screen-ahead kernel's plan and the skip_ahead pass against
// the plain skip kernel (no wrong screen by the theorem, so the per-head skipped counts and the
// outputs equal the plain kernel's: only tiles nobody needs are left out), something screened,
// no more than the reference's screen ahead screens (its FP8 sums differ: up to 1 % of the pairs),
// and no wrong-screen counts reported (the pass does not compute them).
void ahead_case(const Case& c, const Inputs& in, double target) {
  const VisitOrder order = VisitOrder::max_first;
  std::vector<float> out, lse;
  AttentionProblem p = host_problem(c, in, out, lse);
  const double ln = reference_ln_lambda(p, order, target);
  ASSERT_TRUE(std::isfinite(ln)) << "target " << target << " unreachable: the fixed data is inadequate";
  const double lambda = std::exp(ln);
  SCOPED_TRACE(c.name() + " target " + std::to_string(target) + " lambda " + std::to_string(lambda));
  SkipConfig ahead = screen_cfg(lambda, order, ScreenMargin::strict);
  ahead.screen.ahead = true;

  RunOptions sopt;
  sopt.collect_stats = true;
  SkipStats rs, ps, as, fs;
  reference::attention(p, ahead, sopt, &rs);
  const KernelOut plain = run_gpu(c, in, screen_cfg(lambda, order, ScreenMargin::off), sopt, &ps);
  const KernelOut a = run_gpu(c, in, ahead, sopt, &as);
  const KernelOut f = run_gpu(c, in, ahead, RunOptions{}, &fs);
  EXPECT_EQ(rs.total_screen_wrong(), 0);
  ASSERT_EQ(as.screened.size(), std::size_t(c.hq));
  EXPECT_TRUE(as.screen_wrong.empty()) << "the pass counts no wrong screens: none may be reported";
  EXPECT_GT(as.total_screened(), 0) << "nothing screened ahead: the case this test exists for did not happen";
  EXPECT_EQ(as.visited, ps.visited);
  EXPECT_EQ(as.skipped, ps.skipped) << "strict: the screen ahead only leaves out tiles the plain kernel skips";
  EXPECT_LE(as.total_screened(), rs.total_screened() + as.total_visited() / 100);
  std::printf("[ahead] %s target %.2f: visited %lld, skipped %lld (plain %lld), screened ahead %lld (reference %lld)\n",
              c.name().c_str(), target, (long long)as.total_visited(), (long long)as.total_skipped(),
              (long long)ps.total_skipped(), (long long)as.total_screened(), (long long)rs.total_screened());
  const double u = unit_roundoff(c.dt);
  EXPECT_EQ(count_beyond(plain.o, a.o, u, "O: plain skip vs screen ahead"), 0u);
  EXPECT_EQ(count_beyond(a.o, f.o, u, "O: screen ahead with vs without statistics"), 0u);
  EXPECT_EQ(count_beyond(plain.lse, f.lse, u, "LSE: plain skip vs screen ahead"), 0u);
}

TEST(GpuPrefillScreen, StrictAheadEqualsThePlainSkipKernel) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  // batched at d = 64: the plan's CTA index runs over sequences too
  for_each_screen_case(950, true, [](const Case& c, const Inputs& in) {
    for (const double target : {0.6, 0.8}) ahead_case(c, in, target);
  });
}

// d = 128, L = 256 (4 vote groups x 2 tiles), one head, q_i = e0 for every row. Tile 0: key 0 =
// 4 e0 (score 4, every other key 0); tile 1: key 128 = (x, 1, 0, ...) with x = 0.90234375 (bf16):
// x * 16 = 14.4375 rounds to the e4m3 value 14, so its FP8 score 14/16 = 0.875 underestimates x
// by 0.027, more than the kernel's accumulation term gamma_131(2^-13) |q~||k~| = 0.0216. lambda
// between the FP8 and the exact delta: with tight z = 0 every group screens tile 1 wrongly
// (counted, 4 of 4, as the reference counts), the outputs follow; strict screens nothing.
TEST(GpuPrefillScreen, WrongScreensOfTightZeroAreCounted) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  Case c;
  c.Lq = c.Lk = 256;
  c.hq = c.hk = 1;
  c.d = 128;
  const float x = 0.90234375f;
  std::vector<float> q(std::size_t(c.Lq * c.d), 0.f), k(std::size_t(c.Lk * c.d), 0.f), v(k.size(), 0.f);
  for (std::int64_t i = 0; i < c.Lq; ++i) q[std::size_t(i * c.d)] = 1.f;
  k[0] = 4.f;
  k[std::size_t(128 * c.d)] = x;
  k[std::size_t(128 * c.d + 1)] = 1.f;
  v[0] = 1.f;
  v[std::size_t(128 * c.d + 1)] = 1.f;
  const Inputs in = make_inputs(c, q, k, v);
  ASSERT_EQ(in.kf[std::size_t(128 * c.d)], x);
  const double scale = 1.0 / std::sqrt(128.0);
  const double kt = std::sqrt((14.0 / 16) * (14.0 / 16) + 1.0);  // |k~| of key 128
  const double up_kernel = 14.0 / 16 + 131 * 0x1p-13 / (1 - 131 * 0x1p-13) * kt;
  ASSERT_LT(up_kernel, x);
  const double ln = (0.5 * (up_kernel + x) - 4.0) * scale;
  std::vector<float> out, lse;
  AttentionProblem p = host_problem(c, in, out, lse);
  RunOptions sopt;
  sopt.collect_stats = true;
  for (const ScreenMargin mg : {ScreenMargin::tight, ScreenMargin::strict}) {
    SCOPED_TRACE(to_string(mg));
    const SkipConfig cfg = screen_cfg(std::exp(ln), VisitOrder::natural, mg, 0.0);
    SkipStats rs, gs;
    reference::attention(p, cfg, sopt, &rs);
    const KernelOut g = run_gpu(c, in, cfg, sopt, &gs);
    EXPECT_EQ(gs.total_visited(), 8);
    ASSERT_EQ(gs.screened.size(), 1u);
    const std::int64_t want = mg == ScreenMargin::tight ? 4 : 0;
    EXPECT_EQ(rs.total_screened(), want);
    EXPECT_EQ(rs.total_screen_wrong(), want);
    EXPECT_EQ(gs.total_screened(), want);
    EXPECT_EQ(gs.total_screen_wrong(), want);
    EXPECT_EQ(gs.total_skipped(), rs.total_skipped());
    // The screened skip set decides the output: the reference's, within the 16-bit tolerance.
    const double u = unit_roundoff(c.dt);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < out.size(); ++i) bad += !(std::abs(double(g.o[i]) - out[i]) <= 2 * u * (1 + std::abs(out[i])));
    for (std::size_t i = 0; i < lse.size(); ++i) bad += !(std::abs(double(g.lse[i]) - lse[i]) <= u + 1e-5 * std::abs(lse[i]));
    EXPECT_EQ(bad, 0u);
  }
  // The screen ahead on the same input, at the same lambda. Tile 0 comes first (lo = -inf: never
  // screened) and raises lo to its lower bound: the reference's 4 - (tiny: u8 = 2^-24), the
  // kernel's 4 - g |q~| |k~_0| = 4 - 0.085 (its FP8 accumulation term with the f16 accumulator,
  // g = (1 + gamma_131(2^-13)) (1 + gamma_5(2^-10)) - 1, counted again below the maximum). The
  // reference then screens tile 1 ahead in every group, wrongly (4 of 4, as in the loop); the
  // kernel must not: its lower bound lies 0.085 below 4, more than the gap
  // (x - up_kernel) / 2 = 0.003 that lambda leaves, so every group keeps tile 1 and the exact test
  // keeps it too. It reports no wrong-screen counts (the pass computes none).
  SkipConfig cfg = screen_cfg(std::exp(ln), VisitOrder::natural, ScreenMargin::tight, 0.0);
  cfg.screen.ahead = true;
  const double g131 = 131 * 0x1p-13 / (1 - 131 * 0x1p-13), g5 = 5 * 0x1p-10 / (1 - 5 * 0x1p-10);
  ASSERT_GT(((1 + g131) * (1 + g5) - 1) * 4.0, 0.5 * (x - up_kernel));  // the premise above, in float64
  SkipStats rs, gs;
  reference::attention(p, cfg, sopt, &rs);
  EXPECT_EQ(rs.total_screened(), 4);
  EXPECT_EQ(rs.total_screen_wrong(), 4);
  const KernelOut g = run_gpu(c, in, cfg, sopt, &gs);
  EXPECT_EQ(gs.total_visited(), 8);
  EXPECT_EQ(gs.total_screened(), 0);
  EXPECT_TRUE(gs.screen_wrong.empty());
  EXPECT_EQ(gs.total_skipped(), 0);
  // Nothing skipped: the reference without a screen gives the output.
  reference::attention(p, screen_cfg(std::exp(ln), VisitOrder::natural, ScreenMargin::off), sopt, &rs);
  EXPECT_EQ(rs.total_skipped(), 0);
  const double u = unit_roundoff(c.dt);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < out.size(); ++i) bad += !(std::abs(double(g.o[i]) - out[i]) <= 2 * u * (1 + std::abs(out[i])));
  EXPECT_EQ(bad, 0u);
}

// The screen refuses what it does not cover yet, naming the argument.
TEST(GpuPrefillScreen, SkipSetWithTheScreenIsAnError) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  Case c;
  c.Lq = c.Lk = 256;
  const Inputs in = random_inputs(c, 5);
  std::vector<std::uint32_t> words;
  try {
    run_gpu(c, in, screen_cfg(0.01, VisitOrder::natural, ScreenMargin::strict), RunOptions{}, nullptr, &words);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("skip.screen.margin"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace blasst::test
