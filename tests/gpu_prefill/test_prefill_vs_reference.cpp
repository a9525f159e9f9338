// GPU prefill skip sets against the CPU reference (blasst::reference::attention) run at the
// kernel's vote granularity (64 rows x 1 head x 128 keys, natural order) with record_deltas and
// collect_histogram: same visited pairs, same skipped pairs up to ties within rounding, same
// delta histograms up to deltas within rounding of a bin edge, and outputs within tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/workloads.hpp"
#include "gpu_common.hpp"
#include "gpu_prefill/prefill_oracle.hpp"

namespace blasst::test {
namespace {

// The kernel's recorded skip set (SPEC §9, 32-bit words) against the reference's: the same shape,
// every pair's bit equal except at the reference's near-ties (either decision is right there), no
// bit past the last pair, and something recorded.
void expect_skip_set_words(const std::vector<std::uint32_t>& words, const blasst::SkipSet& ref,
                           const std::vector<VoteTask>& tasks, const SkipSet& classified) {
  ASSERT_EQ(std::int64_t(words.size()), (ref.batch * ref.heads * ref.groups * ref.tiles + 31) / 32);
  std::vector<char> tie(std::size_t(ref.batch * ref.heads * ref.groups * ref.tiles), 0);
  for (const auto& t : classified.tie_list) {
    const VoteTask& vt = tasks[t.task];
    tie[std::size_t(ref.index(vt.b, vt.h0, vt.r0 / 64, t.tile))] = 1;
  }
  std::int64_t differ = 0, differ_at_ties = 0, set_bits = 0;
  for (std::int64_t i = 0; i < std::int64_t(words.size()) * 32; ++i) {
    const bool got = (words[std::size_t(i / 32)] >> (i % 32)) & 1u;
    if (i >= std::int64_t(tie.size())) {
      EXPECT_FALSE(got) << "bit " << i << " past the last pair is set";
      continue;
    }
    const bool want = (ref.bits[std::size_t(i / 8)] >> (i % 8)) & 1u;
    set_bits += got;
    if (got != want) (tie[std::size_t(i)] ? differ_at_ties : differ) += 1;
  }
  EXPECT_EQ(differ, 0) << "skip-set bits that differ from the reference's away from near-ties";
  EXPECT_GT(set_bits, 0) << "the kernel recorded no skipped pair";
  std::printf("[skip set] %lld bits set (reference %lld), %lld differ at near-ties\n", (long long)set_bits,
              (long long)ref.count(), (long long)differ_at_ties);
}

// The reference (float32 on the same 16-bit-rounded values, the kernel's vote groups and order)
// once dense with record_deltas (its one-pass curve), then at the lambda of `target` on that
// curve; the kernel at the same lambda. Asserted: visited per head equal, skipped per head within
// [sure, sure + near-ties] (near-ties <= 1 % of the pairs), histograms up to deltas within
// kTieEps of a bin edge, something skipped, and O / LSE elementwise within the 16-bit tolerance
// plus, on the rows of a vote group with a near-tie, that tile's exact share (SPEC §2).
// seed: seeded maxima (SPEC §2a) in lse's layout, given to both the reference and the kernel.
void compare(const Case& c, const Inputs& in, double target, VisitOrder order = VisitOrder::natural,
             const std::vector<float>* seed = nullptr) {
  SkipConfig probe;  // disabled: dense, but the deltas recorded at this vote geometry and order
  probe.vote.rows = 64;
  probe.vote.heads = 1;
  probe.vote.tile_keys = 128;
  probe.vote.order = order;
  std::vector<float> out(std::size_t(c.tq() * c.hq * c.d)), lse(std::size_t(c.tq() * c.hq));
  AttentionProblem p;
  p.q = Tensor::contiguous(const_cast<float*>(in.qf.data()), DType::f32, {c.B, c.Lq, c.hq, c.d});
  p.k = Tensor::contiguous(const_cast<float*>(in.kf.data()), DType::f32, {c.B, c.Lk, c.hk, c.d});
  p.v = Tensor::contiguous(const_cast<float*>(in.vf.data()), DType::f32, {c.B, c.Lk, c.hk, c.d});
  p.out = Tensor::contiguous(out.data(), DType::f32, {c.B, c.Lq, c.hq, c.d});
  p.lse = Tensor::contiguous(lse.data(), DType::f32, {c.B, c.hq, c.Lq});
  if (seed != nullptr)
    p.seed_max = Tensor::contiguous(const_cast<float*>(seed->data()), DType::f32, {c.B, c.hq, c.Lq});
  p.mask = c.causal ? MaskKind::causal : MaskKind::full;
  RunOptions ropt;
  ropt.collect_histogram = true;
  ropt.record_deltas = true;
  SkipStats curve;
  reference::attention(p, probe, ropt, &curve);
  const double ln = ln_lambda_for(curve.deltas, target);
  ASSERT_TRUE(std::isfinite(ln)) << "target " << target << " unreachable at lambda < 1 (max "
                                 << max_reachable_sparsity(curve.deltas) << "): the fixed data is inadequate";
  const double lambda = std::exp(ln);
  SCOPED_TRACE(c.name() + " target " + std::to_string(target) + " lambda " + std::to_string(lambda) + " order " +
               to_string(order));
  SkipConfig sk = SkipConfig::from_threshold(lambda).with_order(VisitOrder::natural);
  sk.vote = probe.vote;
  SkipStats rs;
  blasst::SkipSet ref_set;
  reference::attention(p, sk, ropt, &rs, &ref_set);
  ASSERT_EQ(rs.deltas, curve.deltas) << "the deltas depend on lambda (SPEC §5 says they must not)";

  RunOptions gopt;
  gopt.collect_histogram = true;
  SkipStats gs;
  std::vector<std::uint32_t> words;  // the kernel's skip set (SPEC §9)
  const KernelOut k = run_gpu(c, in, sk, gopt, &gs, &words, seed);
  EXPECT_EQ(gs.granularity.order, order);
  EXPECT_EQ(gs.granularity.rows, 64);
  EXPECT_EQ(gs.granularity.heads, 1);

  const auto tasks = vote_tasks({c.Lq}, {c.Lk}, c.hk, c.hq / c.hk, probe.vote, c.causal, false);
  const SkipSet set = classify_skip_set(tasks, rs.deltas, {ln}, c.hq, true);
  expect_skip_counts(set, gs);
  for (std::int64_t h = 0; h < c.hq; ++h) EXPECT_EQ(set.ref_skipped[std::size_t(h)], rs.skipped[std::size_t(h)]);
  ASSERT_EQ(gs.hist.size(), std::size_t(c.hq));
  for (std::int64_t h = 0; h < c.hq; ++h)
    expect_histograms(gs.hist[std::size_t(h)], deltas_of(tasks, rs.deltas, h, true), "head " + std::to_string(h));
  EXPECT_GT(gs.total_skipped(), 0) << "nothing skipped";
  expect_skip_set_words(words, ref_set, tasks, set);
  std::printf("[ref] %s target %.2f lambda %.4g: gpu sparsity %.4f, reference %.4f, near-ties %lld of %lld\n",
              c.name().c_str(), target, lambda, gs.sparsity(), rs.sparsity(), (long long)set.total_ties,
              (long long)set.total_visited);

  // Outputs: bf16/f16 tolerance u (vmax + |ref|) x 2 (P rounded to the input type before P.V: u
  // vmax; the output rounded: u |ref|; l from rounded P: u |ref|), LSE u + 1e-5 |LSE|; plus the
  // near-tie slack of the row.
  const double u = unit_roundoff(c.dt), scale = 1.0 / std::sqrt(double(c.d));
  const std::int64_t D = c.d, g = c.hq / c.hk;
  double vmax = 0;
  for (float x : in.vf) vmax = std::max(vmax, double(std::abs(x)));
  std::vector<double> slack_o(std::size_t(c.tq() * c.hq), 0.0), slack_l(slack_o.size(), 0.0);
  near_tie_slack(
      tasks, set, {c.Lk}, 1, 128,
      [&](std::int64_t, std::int64_t h, std::int64_t pos, std::int64_t j) {
        if (c.causal && j > pos + c.Lk - c.Lq) return -std::numeric_limits<double>::infinity();
        const float* qr = &in.qf[std::size_t((pos * c.hq + h) * D)];
        const float* kr = &in.kf[std::size_t((j * c.hk + h / g) * D)];
        double acc = 0;
        for (std::int64_t x = 0; x < D; ++x) acc += double(qr[x]) * kr[x];
        return acc * scale;
      },
      [&](std::int64_t, std::int64_t h, std::int64_t pos) { return double(lse[std::size_t(h * c.Lq + pos)]); },
      [&](std::int64_t, std::int64_t h, std::int64_t pos, double so, double sl) {
        slack_o[std::size_t(pos * c.hq + h)] += so * vmax;
        slack_l[std::size_t(pos * c.hq + h)] += sl;
      });
  std::size_t bad_o = 0, bad_l = 0;
  double worst = 0;
  for (std::int64_t pos = 0; pos < c.Lq; ++pos)
    for (std::int64_t h = 0; h < c.hq; ++h) {
      const std::size_t row = std::size_t(pos * c.hq + h);
      for (std::int64_t x = 0; x < D; ++x) {
        const double ref = out[row * std::size_t(D) + std::size_t(x)], got = k.o[row * std::size_t(D) + std::size_t(x)];
        const double e = std::isnan(got) ? INFINITY : std::abs(got - ref);
        const double tol = 2 * u * (vmax + std::abs(ref)) + slack_o[row];
        worst = std::max(worst, e / tol);
        bad_o += e > tol;
      }
      const double lr = lse[std::size_t(h * c.Lq + pos)], lg = k.lse[std::size_t(h * c.Lq + pos)];
      if (std::isinf(lr)) bad_l += lg != lr;
      else bad_l += !(std::abs(lg - lr) <= u + 1e-5 * std::abs(lr) + slack_l[row]);
    }
  EXPECT_EQ(bad_o, 0u) << "O elements beyond tolerance; worst error / tolerance " << worst;
  EXPECT_EQ(bad_l, 0u) << "LSE entries beyond tolerance";
}

TEST(GpuPrefillVsReference, SkipSetsAndHistograms) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  int i = 0;
  for (bool causal : {true, false}) {
    Case c;
    c.Lq = c.Lk = 2000;
    c.hq = 4;
    c.hk = 1;
    c.causal = causal;
    const std::uint64_t seed = test_seed(600 + std::uint64_t(i++));
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Inputs in = llm_inputs(c, seed);
    for (double target : {0.3, 0.6}) compare(c, in, target);
  }
}

// Max-first order (SPEC §2a) in the kernel: the same skip sets as the reference's max-first order
// at the kernel's vote groups. Causal with Lq == Lk and Lq != Lk (the two 64-row groups of a CTA
// may have diagonal tiles one apart), full with Lq == Lk (the llm and dit workloads).
TEST(GpuPrefillVsReference, MaxFirstSkipSets) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  struct Shape {
    int lq, lk;
    bool causal;
    WorkloadKind kind;
  };
  int i = 0;
  for (Shape sh : {Shape{2000, 2000, true, WorkloadKind::llm}, Shape{1000, 2300, true, WorkloadKind::llm},
                   Shape{2000, 2000, false, WorkloadKind::dit}, Shape{1500, 1500, false, WorkloadKind::llm}}) {
    Case c;
    c.Lq = sh.lq;
    c.Lk = sh.lk;
    c.hq = 4;
    c.hk = 1;
    c.causal = sh.causal;
    WorkloadSpec ws;
    ws.kind = sh.kind;
    ws.seq_len = c.Lk;  // every shape here has Lq <= Lk
    ws.heads_q = c.hq;
    ws.heads_k = c.hk;
    ws.head_dim = c.d;
    ws.seed = test_seed(650 + std::uint64_t(i++));
    SCOPED_TRACE("seed " + std::to_string(ws.seed));
    Workload w = make_workload(ws);
    // Queries: the last Lq rows of the workload (causal bottom-right alignment), keys: all Lk.
    const std::size_t qrow = std::size_t(c.hq) * c.d, krow = std::size_t(c.hk) * c.d;
    std::vector<float> q(w.q.end() - std::ptrdiff_t(std::size_t(c.Lq) * qrow), w.q.end());
    std::vector<float> k(w.k.begin(), w.k.begin() + std::ptrdiff_t(std::size_t(c.Lk) * krow));
    std::vector<float> v(w.v.begin(), w.v.begin() + std::ptrdiff_t(std::size_t(c.Lk) * krow));
    const Inputs in = make_inputs(c, q, k, v);
    for (double target : {0.3, 0.6}) compare(c, in, target, VisitOrder::max_first);
  }
}

// Seeds in lse's layout (SPEC §2a): per row, the max of scale * q . k over its last visible tile (the
// tile holding key i, up to key i: causal, Lq == Lk per sequence), float64 from the rounded inputs.
std::vector<float> diagonal_tile_seeds(const Case& c, const Inputs& in) {
  const double scale = 1.0 / std::sqrt(double(c.d));
  std::vector<float> seeds(std::size_t(c.tq() * c.hq), -std::numeric_limits<float>::infinity());
  for (std::int64_t b = 0; b < c.nseq(); ++b)
    for (std::int64_t h = 0; h < c.hq; ++h)
      for (std::int64_t i = 0; i < c.qlen(b); ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = i / 128 * 128; j <= i; ++j) {
          double acc = 0;
          for (std::int64_t x = 0; x < c.d; ++x)
            acc += double(in.qf[std::size_t(((c.qstart(b) + i) * c.hq + h) * c.d + x)]) *
                   double(in.kf[std::size_t(((c.kstart(b) + j) * c.hk + h / (c.hq / c.hk)) * c.d + x)]);
          m = std::max(m, acc * scale);
        }
        seeds[std::size_t(lse_index(c, b, h, i))] = float(m);
      }
  return seeds;
}

// SPEC §2a seeded maxima (AttentionProblem::seed_max) on the skip kernel. Each row is seeded with
// the max of its scaled scores over its last visible tile (the diagonal, which the natural order
// reaches last; a ring chunk's rows would bring the sink's), computed here in float64 from the
// rounded inputs. The kernel's skip set, counts, histograms and outputs against the reference given
// the same seeds (compare); -inf seeds equal the unseeded call bit for bit; a +inf seed makes its
// row NaN on the CUDA path (the reference refuses it on the host), other heads unchanged.
TEST(GpuPrefillVsReference, SeededMaxima) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  Case c;
  c.Lq = c.Lk = 2000;
  c.hq = 4;
  c.hk = 1;
  c.causal = true;
  const std::uint64_t seed = test_seed(671);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Inputs in = llm_inputs(c, seed);
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> diag = diagonal_tile_seeds(c, in);
  for (double target : {0.3, 0.6}) compare(c, in, target, VisitOrder::natural, &diag);

  SkipConfig sk = SkipConfig::from_threshold(0.05).with_order(VisitOrder::natural);
  sk.vote.rows = 64;
  sk.vote.heads = 1;
  sk.vote.tile_keys = 128;
  std::vector<float> none(diag.size(), ninf);
  std::vector<std::uint32_t> w_plain, w_none;
  SkipStats s_plain, s_diag;
  RunOptions stats_opt;
  stats_opt.collect_stats = true;
  const KernelOut plain = run_gpu(c, in, sk, stats_opt, &s_plain, &w_plain);
  const KernelOut unseeded = run_gpu(c, in, sk, {}, nullptr, &w_none, &none);
  EXPECT_EQ(w_plain, w_none) << "-inf seeds changed the skip set";
  EXPECT_EQ(0, std::memcmp(plain.o.data(), unseeded.o.data(), plain.o.size() * sizeof(float))) << "-inf seeds changed O";
  EXPECT_EQ(0, std::memcmp(plain.lse.data(), unseeded.lse.data(), plain.lse.size() * sizeof(float)))
      << "-inf seeds changed the LSE";
  run_gpu(c, in, sk, stats_opt, &s_diag, nullptr, &diag);
  std::printf("[seed] lambda 0.05: %lld of %lld pairs skipped unseeded, %lld seeded with the diagonal tile\n",
              (long long)s_plain.total_skipped(), (long long)s_plain.total_visited(), (long long)s_diag.total_skipped());
  EXPECT_GT(s_diag.total_skipped(), s_plain.total_skipped()) << "the diagonal seed made nothing more skippable";

  std::vector<float> inf_one = none;
  const std::int64_t h_inf = 1, pos_inf = 700;
  inf_one[std::size_t(lse_index(c, 0, h_inf, pos_inf))] = std::numeric_limits<float>::infinity();
  const KernelOut n = run_gpu(c, in, sk, {}, nullptr, nullptr, &inf_one);
  EXPECT_TRUE(std::isnan(n.lse[std::size_t(lse_index(c, 0, h_inf, pos_inf))])) << "a +inf seed's LSE is not NaN";
  for (std::int64_t x = 0; x < c.d; ++x)
    EXPECT_TRUE(std::isnan(n.o[std::size_t((pos_inf * c.hq + h_inf) * c.d + x)])) << "a +inf seed's O is not NaN";
  for (std::int64_t pos = 0; pos < c.Lq; ++pos)
    for (std::int64_t h = 0; h < c.hq; ++h) {
      if (h == h_inf) continue;  // other heads: their own rows, unchanged bit for bit
      const std::size_t row = std::size_t(pos * c.hq + h);
      ASSERT_EQ(0, std::memcmp(&n.o[row * std::size_t(c.d)], &plain.o[row * std::size_t(c.d)], std::size_t(c.d) * 4))
          << "head " << h << " row " << pos;
    }
}

// Seeded maxima in a ragged batch ([Hq, Tq] seeds, the sequence's offset): the kernel on the
// batch equals the kernel on each sequence alone (batched, B = 1) with that sequence's seeds, bit
// for bit in O and LSE and in the skipped counts (each CTA computes one sequence's rows alone; a
// seed read from the wrong row changes the decisions). Seeds: the diagonal-tile maxima, float64.
TEST(GpuPrefillVsReference, SeededMaximaRagged) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  Case c;
  c.lq = {300, 700, 129};
  c.lk = {300, 700, 129};
  c.hq = 2;
  c.hk = 1;
  c.causal = true;
  const std::uint64_t seed = test_seed(672);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Inputs in = llm_ragged_inputs(c, seed);
  const std::vector<float> seeds = diagonal_tile_seeds(c, in);
  SkipConfig sk = SkipConfig::from_threshold(0.05).with_order(VisitOrder::natural);
  RunOptions opt;
  opt.collect_stats = true;
  SkipStats all;
  const KernelOut r = run_gpu(c, in, sk, opt, &all, nullptr, &seeds);
  std::int64_t skipped = 0;
  for (std::int64_t b = 0; b < c.nseq(); ++b) {
    Case cb;
    cb.Lq = c.qlen(b);
    cb.Lk = c.klen(b);
    cb.hq = c.hq;
    cb.hk = c.hk;
    cb.causal = true;
    Inputs ib;
    const std::size_t qr = std::size_t(c.hq * c.d), kr = std::size_t(c.hk * c.d);
    auto rows = [](const auto& v, std::size_t from, std::size_t n) {
      return std::vector<typename std::decay_t<decltype(v)>::value_type>(v.begin() + std::ptrdiff_t(from),
                                                                         v.begin() + std::ptrdiff_t(from + n));
    };
    ib.q = rows(in.q, std::size_t(c.qstart(b)) * qr, std::size_t(cb.Lq) * qr);
    ib.qf = rows(in.qf, std::size_t(c.qstart(b)) * qr, std::size_t(cb.Lq) * qr);
    ib.k = rows(in.k, std::size_t(c.kstart(b)) * kr, std::size_t(cb.Lk) * kr);
    ib.kf = rows(in.kf, std::size_t(c.kstart(b)) * kr, std::size_t(cb.Lk) * kr);
    ib.v = rows(in.v, std::size_t(c.kstart(b)) * kr, std::size_t(cb.Lk) * kr);
    ib.vf = rows(in.vf, std::size_t(c.kstart(b)) * kr, std::size_t(cb.Lk) * kr);
    std::vector<float> sb(std::size_t(cb.Lq * c.hq));
    for (std::int64_t h = 0; h < c.hq; ++h)
      for (std::int64_t i = 0; i < cb.Lq; ++i)
        sb[std::size_t(lse_index(cb, 0, h, i))] = seeds[std::size_t(lse_index(c, b, h, i))];
    SkipStats one;
    const KernelOut rb = run_gpu(cb, ib, sk, opt, &one, nullptr, &sb);
    skipped += one.total_skipped();
    for (std::int64_t i = 0; i < cb.Lq; ++i)
      for (std::int64_t h = 0; h < c.hq; ++h) {
        ASSERT_EQ(0, std::memcmp(&r.o[std::size_t(((c.qstart(b) + i) * c.hq + h) * c.d)],
                                 &rb.o[std::size_t((i * c.hq + h) * c.d)], std::size_t(c.d) * sizeof(float)))
            << "sequence " << b << " row " << i << " head " << h;
        ASSERT_EQ(0, std::memcmp(&r.lse[std::size_t(lse_index(c, b, h, i))], &rb.lse[std::size_t(lse_index(cb, 0, h, i))],
                                 sizeof(float)))
            << "LSE, sequence " << b << " row " << i << " head " << h;
      }
  }
  EXPECT_EQ(all.total_skipped(), skipped);
  EXPECT_GT(skipped, 0) << "nothing skipped";
}

// The skip set of a ragged batch (SPEC §9), GQA 4:2, causal with Lq != Lk per sequence: the
// kernel's words against the float64 oracle's skipped pairs (natural order) away from near-ties;
// a dense call and a lambda >= 1 call overwrite poisoned words with zeros; too few words are a
// clear error.
// The skip set of a sequence longer than the kernel's register window (1024 key tiles: bits of
// later tiles are set one by one, earlier ones written once per CTA from a register): every
// visited pair's bit against the oracle's decision, on both sides of tile 1024, with the words of
// a short second sequence after it (vote groups that do not start on a word boundary).
TEST(GpuPrefillVsReference, SkipSetPastTheRegisterWindow) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  Case c;
  c.lq = {64, 100};
  c.lk = {1030 * 128 - 60, 300};  // 1030 tiles, the last one partial
  c.hq = 2;
  c.hk = 1;
  c.d = 64;
  c.causal = true;
  const std::uint64_t seed = test_seed(690);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Inputs in = random_inputs(c, seed);
  const std::vector<double> dense_ln(c.lq.size(), -std::numeric_limits<double>::infinity());
  const Oracle curve = oracle(c, in, dense_ln, false);
  const double ln = ln_lambda_for(curve.all_deltas, 0.5);
  ASSERT_TRUE(std::isfinite(ln)) << "target 0.5 unreachable at lambda < 1: the fixed data is inadequate";
  SkipConfig sk = SkipConfig::from_threshold(std::exp(ln)).with_order(VisitOrder::natural);
  std::vector<std::uint32_t> words;
  SkipStats gs;
  RunOptions gopt;
  gopt.collect_stats = true;  // no histogram: the skip_record instance
  (void)run_gpu(c, in, sk, gopt, &gs, &words);

  VoteGranularity vote;
  const auto tasks = vote_tasks(c.lq, c.lk, c.hk, c.hq / c.hk, vote, true, false);
  const std::int64_t groups = (100 + 63) / 64, tiles = 1030;
  ASSERT_EQ(std::int64_t(words.size()), (2 * c.hq * groups * tiles + 31) / 32);
  std::size_t i = 0;
  std::int64_t sure_past = 0, sure_before = 0, ties = 0, extra = 0;
  std::vector<char> seen(std::size_t(2 * c.hq * groups * tiles), 0);
  for (const auto& t : tasks)
    for (const std::int64_t tile : t.tiles) {
      ASSERT_LT(i, curve.all_deltas.size()) << "oracle deltas do not match the vote groups";
      const double d = curve.all_deltas[i++];
      const std::int64_t bit = ((t.b * c.hq + t.h0) * groups + t.r0 / 64) * tiles + tile;
      seen[std::size_t(bit)] = 1;
      const bool got = (words[std::size_t(bit / 32)] >> (bit % 32)) & 1u;
      if (std::abs(d - ln) < kTieEps) { ++ties; continue; }
      const bool want = d < ln;
      (tile >= 1024 ? sure_past : sure_before) += want;
      EXPECT_EQ(got, want) << "sequence " << t.b << " head " << t.h0 << " rows " << t.r0 << " tile " << tile
                           << ": delta " << d << ", ln lambda " << ln;
    }
  ASSERT_EQ(i, curve.all_deltas.size());
  for (std::size_t b = 0; b < seen.size(); ++b)
    if (!seen[b]) extra += (words[b / 32] >> (b % 32)) & 1u;
  for (std::size_t b = seen.size(); b < words.size() * 32; ++b) extra += (words[b / 32] >> (b % 32)) & 1u;
  EXPECT_EQ(extra, 0) << "bits set for pairs that are not visited";
  EXPECT_GT(sure_before, 0) << "nothing skipped inside the window";
  EXPECT_GT(sure_past, 0) << "nothing skipped past tile 1024: the case does not test that path";
  EXPECT_LE(double(ties), kMaxTieShare * double(curve.all_deltas.size()));
  std::printf("[skip set] past the window: %lld / %lld sure skipped pairs before / past tile 1024, %lld near-ties\n",
              (long long)sure_before, (long long)sure_past, (long long)ties);
}

TEST(GpuPrefillVsReference, SkipSetRaggedDenseAndErrors) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  Case c;
  c.lq = {300, 1000, 129, 64};
  c.lk = {700, 1000, 1290, 64};
  c.hq = 4;
  c.hk = 2;
  c.causal = true;
  const std::uint64_t seed = test_seed(680);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const Inputs in = llm_ragged_inputs(c, seed);
  const std::vector<double> dense_ln(c.lq.size(), -std::numeric_limits<double>::infinity());
  const Oracle curve = oracle(c, in, dense_ln, false);
  const double ln = ln_lambda_for(curve.all_deltas, 0.4);
  ASSERT_TRUE(std::isfinite(ln)) << "target 0.4 unreachable at lambda < 1: the fixed data is inadequate";
  const double lambda = std::exp(ln);
  // One factor for all sequences would give each its own lambda; a direct threshold gives one.
  SkipConfig sk = SkipConfig::from_threshold(lambda).with_order(VisitOrder::natural);
  std::vector<std::uint32_t> words;
  SkipStats gs;
  RunOptions gopt;
  gopt.collect_stats = true;
  (void)run_gpu(c, in, sk, gopt, &gs, &words);

  VoteGranularity vote;  // the kernel's: 64 rows x 1 head x 128 keys, natural order
  const auto tasks = vote_tasks(c.lq, c.lk, c.hk, c.hq / c.hk, vote, true, false);
  const std::int64_t groups = (1000 + 63) / 64, tiles = (1290 + 127) / 128;
  ASSERT_EQ(std::int64_t(words.size()), (4 * c.hq * groups * tiles + 31) / 32);
  std::size_t i = 0;
  std::int64_t sure = 0, agree = 0, ties = 0, extra = 0;
  std::vector<char> seen(std::size_t(4 * c.hq * groups * tiles), 0);
  for (const auto& t : tasks)
    for (const std::int64_t tile : t.tiles) {
      ASSERT_LT(i, curve.all_deltas.size()) << "oracle deltas do not match the vote groups";
      const double d = curve.all_deltas[i++];
      const std::int64_t bit = ((t.b * c.hq + t.h0) * groups + t.r0 / 64) * tiles + tile;
      seen[std::size_t(bit)] = 1;
      const bool got = (words[std::size_t(bit / 32)] >> (bit % 32)) & 1u;
      if (std::abs(d - ln) < kTieEps) { ++ties; continue; }
      const bool want = d < ln;
      sure += want;
      agree += got == want;
      EXPECT_EQ(got, want) << "sequence " << t.b << " head " << t.h0 << " rows " << t.r0 << " tile " << tile
                           << ": delta " << d << ", ln lambda " << ln;
    }
  ASSERT_EQ(i, curve.all_deltas.size());
  for (std::size_t b = 0; b < seen.size(); ++b)  // pairs no vote group visits: never set
    if (!seen[b]) extra += (words[b / 32] >> (b % 32)) & 1u;
  for (std::size_t b = seen.size(); b < words.size() * 32; ++b) extra += (words[b / 32] >> (b % 32)) & 1u;
  EXPECT_EQ(extra, 0) << "bits set for pairs that are not visited";
  EXPECT_GT(sure, 0) << "nothing skipped: the case does not test recording";
  EXPECT_LE(double(ties), kMaxTieShare * double(curve.all_deltas.size()));
  std::printf("[skip set] ragged: %lld sure skipped pairs, %lld near-ties, kernel sparsity %.4f\n",
              (long long)sure, (long long)ties, gs.sparsity());

  for (const SkipConfig& none : {SkipConfig{}, SkipConfig::from_threshold(1.0).with_order(VisitOrder::natural)}) {
    std::vector<std::uint32_t> w;
    (void)run_gpu(c, in, none, RunOptions{}, nullptr, &w);
    ASSERT_EQ(w.size(), words.size());
    std::size_t nonzero = 0;
    for (std::uint32_t x : w) nonzero += x != 0;
    EXPECT_EQ(nonzero, 0u) << "a call that skips nothing must zero every word (they were poisoned)";
  }

  // Too few words: an Error naming skip_set_words, before any launch.
  AttentionProblem p;
  std::vector<std::uint16_t> o(in.q.size());
  std::vector<std::int32_t> cq{0, 300, 1300, 1429, 1493}, ck{0, 700, 1700, 2990, 3054};
  p.q = Tensor::contiguous(const_cast<std::uint16_t*>(in.q.data()), c.dt, {c.tq(), c.hq, c.d});
  p.k = Tensor::contiguous(const_cast<std::uint16_t*>(in.k.data()), c.dt, {c.tk(), c.hk, c.d});
  p.v = Tensor::contiguous(const_cast<std::uint16_t*>(in.v.data()), c.dt, {c.tk(), c.hk, c.d});
  p.out = Tensor::contiguous(o.data(), c.dt, {c.tq(), c.hq, c.d});
  p.cu_seqlens_q = cq.data();
  p.cu_seqlens_k = ck.data();
  p.batch = 4;
  p.mask = MaskKind::causal;
  std::vector<std::uint32_t> few(words.size() - 1);
  p.skip_set = few.data();
  p.skip_set_words = std::int64_t(few.size());
  RunOptions opt;
  opt.device = DeviceKind::cuda;
  try {
    attention(p, sk, opt);
    ADD_FAILURE() << "expected an error for too few skip-set words";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("skip_set_words"), std::string::npos) << e.what();
  }
}

// Full masks with Lq != Lk have no CTA-wide max-first order that equals every vote group's: a
// clear error, not a silently different skip set.
TEST(GpuPrefillVsReference, MaxFirstFullMaskNeedsEqualLengths) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  Case c;
  c.Lq = 300;
  c.Lk = 500;
  c.hq = 2;
  c.hk = 1;
  c.causal = false;
  std::vector<float> q(std::size_t(c.Lq) * c.hq * c.d, 0.1f), kv(std::size_t(c.Lk) * c.hk * c.d, 0.1f);
  const Inputs in = make_inputs(c, q, kv, kv);
  const SkipConfig sk = SkipConfig::from_threshold(1e-3).with_order(VisitOrder::max_first);  // explicit
  try {
    (void)run_gpu(c, in, sk, RunOptions{}, nullptr);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Lq == Lk"), std::string::npos) << e.what();
  }
}

// SPEC §2a default (revised): a threshold config without an explicit order is max-first where the
// kernel can run it (full mask, Lq == Lk; causal, any lengths) and natural where it cannot (full
// mask, Lq != Lk: cross-attention keeps working). On the GPU the default run equals the explicit
// run of the order it reports, bit for bit, and the reference reports the same order and visits
// the same pairs.
TEST(GpuPrefillVsReference, DefaultOrderAndItsFallback) {
  BLASST_GPU_OR_SKIP("the sm_90a prefill kernel needs a Hopper device");
  struct Shape { std::int64_t Lq, Lk; bool causal; VisitOrder want; };
  for (const Shape s : {Shape{300, 500, false, VisitOrder::natural}, Shape{500, 300, false, VisitOrder::natural},
                        Shape{512, 512, false, VisitOrder::max_first}, Shape{300, 500, true, VisitOrder::max_first}}) {
    Case c;
    c.Lq = s.Lq;
    c.Lk = s.Lk;
    c.hq = 2;
    c.hk = 1;
    c.causal = s.causal;
    SCOPED_TRACE(c.name());
    // A towering key every row sees (logit ~ 17 over i.i.d. noise), so the threshold skips.
    std::mt19937_64 g(901);
    std::vector<float> q = randn(std::size_t(c.Lq) * c.hq * c.d, g), k = randn(std::size_t(c.Lk) * c.hk * c.d, g),
                       v = randn(std::size_t(c.Lk) * c.hk * c.d, g);
    for (std::int64_t i = 0; i < c.Lq; ++i)
      for (std::int64_t h = 0; h < c.hq; ++h) q[std::size_t((i * c.hq + h) * c.d)] += 6.0f;
    // Key 0, the sink tile: visited first in both orders (a towering last key would come last in
    // the natural order and leave nothing skippable before it: the first H200 run, a0106a0).
    const std::int64_t key = 0;
    k[std::size_t(key * c.hk * c.d)] = 16.0f * std::sqrt(float(c.d) / 32.0f);
    const Inputs in = make_inputs(c, q, k, v);
    RunOptions opt;
    opt.collect_stats = true;
    SkipStats def_st, exp_st;
    const SkipConfig def = SkipConfig::from_threshold(0.05);
    const KernelOut a = run_gpu(c, in, def, opt, &def_st);  // the default: never an error here
    EXPECT_EQ(def_st.granularity.order, s.want);
    const KernelOut b = run_gpu(c, in, SkipConfig::from_threshold(0.05).with_order(s.want), opt, &exp_st);
    EXPECT_EQ(exp_st.granularity.order, s.want);
    ASSERT_EQ(a.o.size(), b.o.size());
    for (std::size_t i = 0; i < a.o.size(); ++i) ASSERT_EQ(a.o[i], b.o[i]) << i;
    EXPECT_EQ(def_st.skipped, exp_st.skipped);
    EXPECT_GT(def_st.total_skipped(), 0) << "the data must make the threshold skip";
    // The reference applies the same rule on the same problem.
    std::vector<float> out(std::size_t(c.Lq * c.hq * c.d));
    AttentionProblem p;
    p.q = Tensor::contiguous(const_cast<float*>(in.qf.data()), DType::f32, {c.B, c.Lq, c.hq, c.d});
    p.k = Tensor::contiguous(const_cast<float*>(in.kf.data()), DType::f32, {c.B, c.Lk, c.hk, c.d});
    p.v = Tensor::contiguous(const_cast<float*>(in.vf.data()), DType::f32, {c.B, c.Lk, c.hk, c.d});
    p.out = Tensor::contiguous(out.data(), DType::f32, {c.B, c.Lq, c.hq, c.d});
    p.mask = c.causal ? MaskKind::causal : MaskKind::full;
    SkipStats rs;
    reference::attention(p, def, opt, &rs);
    EXPECT_EQ(rs.granularity.order, s.want);
    EXPECT_EQ(rs.visited, def_st.visited);
  }
}

}  // namespace
}  // namespace blasst::test
