// Issue 21 on the reference engine: the NaN rule (NaN in a row's scores -> that row's output and
// LSE are NaN), IEEE infinities, the worker pool under absurd or failing thread counts, and
// buffers bounded by the input whatever vote.tile_keys says. Expected values come from IEEE
// arithmetic worked out here and from the naive float64 attention of common.hpp.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/half.hpp"
#include "reference/common.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BLASST_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define BLASST_UNDER_SANITIZER 1
#endif
#endif

namespace blasst {
namespace {

using test::Dense;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::int64_t qi(const Dense& p, std::int64_t b, std::int64_t i, std::int64_t h) { return ((b * p.Lq + i) * p.Hq + h) * p.d; }
std::int64_t ki(const Dense& p, std::int64_t b, std::int64_t j, std::int64_t kh) { return ((b * p.Lk + j) * p.Hk + kh) * p.d; }
std::int64_t oi(const Dense& p, std::int64_t b, std::int64_t i, std::int64_t h) { return ((b * p.Lq + i) * p.Hq + h) * p.dv; }
std::int64_t li(const Dense& p, std::int64_t b, std::int64_t i, std::int64_t h) { return (b * p.Hq + h) * p.Lq + i; }

// Checks one run against the rule: rows for which nan_row(b, i, h) holds are NaN in every output
// element and in the LSE; every other row matches the naive float64 attention (computed on the
// same data: those rows' scores hold no NaN).
template <class NanRow>
void expect_rule(const Dense& p, bool causal, NanRow nan_row, double tol, const char* what) {
  std::vector<double> o, lse;
  test::naive(p.q, p.k, p.v, p.B, p.Lq, p.Lk, p.Hq, p.Hk, p.d, p.dv, causal, o, lse);
  std::int64_t nan_rows = 0, finite_rows = 0;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.Hq; ++h)
      for (std::int64_t i = 0; i < p.Lq; ++i) {
        const bool want_nan = nan_row(b, i, h);
        (want_nan ? nan_rows : finite_rows) += 1;
        ASSERT_EQ(std::isnan(p.lse[li(p, b, i, h)]), want_nan) << what << " lse b" << b << " i" << i << " h" << h;
        if (!want_nan) ASSERT_NEAR(p.lse[li(p, b, i, h)], lse[li(p, b, i, h)], tol) << what;
        for (std::int64_t c = 0; c < p.dv; ++c) {
          const float x = p.out[oi(p, b, i, h) + c];
          ASSERT_EQ(std::isnan(x), want_nan) << what << " out b" << b << " i" << i << " h" << h << " c" << c;
          if (!want_nan) ASSERT_NEAR(x, o[oi(p, b, i, h) + c], tol) << what;
        }
      }
  // The case exists only when both kinds of rows occur.
  EXPECT_GT(nan_rows, 0) << what;
  EXPECT_GT(finite_rows, 0) << what;
}

TEST(NanRule, NanInOneQueryElementMakesThatRowNaN) {
  for (const bool causal : {false, true}) {
    Dense p(2, 70, 150, 4, 2, 16, 16, 2101);
    p.q[qi(p, 1, 33, 3) + 5] = kNaN;
    attention(p.problem(causal ? MaskKind::causal : MaskKind::full), SkipConfig{}, RunOptions{});
    expect_rule(p, causal, [](std::int64_t b, std::int64_t i, std::int64_t h) { return b == 1 && i == 33 && h == 3; },
                2e-5, causal ? "causal" : "full");
  }
}

// A NaN in key j reaches exactly the rows that see key j (causal: i >= j - (Lk - Lq)) of the
// query heads of that KV head; masked rows and other heads stay exact.
TEST(NanRule, NanInOneKeyReachesTheRowsThatSeeIt) {
  Dense p(1, 90, 90, 4, 2, 16, 16, 2102);
  const std::int64_t j = 40;
  p.k[ki(p, 0, j, 1) + 2] = kNaN;
  attention(p.problem(MaskKind::causal), SkipConfig{}, RunOptions{});
  expect_rule(p, true, [&](std::int64_t, std::int64_t i, std::int64_t h) { return h / 2 == 1 && i >= j; }, 2e-5,
              "causal key NaN");
}

// Skipping never hides a NaN: with an attention sink every tile but the first is skipped at this
// lambda, yet the tile holding the NaN key is kept for the vote groups that see it, and so is
// every later tile (their rows' running max is NaN from then on: delta NaN, docs/reference.md).
TEST(NanRule, SkippingNeverHidesANaN) {
  Dense p(1, 128, 512, 2, 2, 16, 16, 2103);
  for (std::int64_t h = 0; h < 2; ++h) {
    for (std::int64_t i = 0; i < p.Lq; ++i) p.q[qi(p, 0, i, h)] += 6.0f;
    p.k[ki(p, 0, 0, h)] = 10.0f;  // the sink: score ~ 15 against ~ N(0, 1) elsewhere
  }
  SkipConfig skip = SkipConfig::from_threshold(0.05).with_order(VisitOrder::natural);
  skip.vote.tile_keys = 64;
  skip.vote.rows = 32;
  RunOptions opt;
  opt.collect_stats = true;
  SkipStats clean;
  attention(p.problem(MaskKind::full), skip, opt, &clean);
  // Without the NaN the tile of key 300 (tile 4) is skipped by every group: most tiles are.
  ASSERT_GT(clean.sparsity(), 0.5) << "test data must make the reference skip";
  const std::vector<float> clean_out = p.out;

  // Clean deltas in task order: head 0's 4 vote groups first, 8 tiles each in natural order.
  // How many of them skipped tile 4 (keys 256..319), and tiles 4..7?
  RunOptions rec = opt;
  rec.record_deltas = true;
  SkipStats clean_d;
  attention(p.problem(MaskKind::full), skip, rec, &clean_d);
  const std::int64_t groups = p.Lq / skip.vote.rows, tiles = p.Lk / skip.vote.tile_keys;
  ASSERT_EQ(tiles, 8);
  ASSERT_EQ(static_cast<std::int64_t>(clean_d.deltas.size()), 2 * groups * tiles);
  std::int64_t tile4_skipped = 0, tail_skipped = 0;
  for (std::int64_t g = 0; g < groups; ++g)
    for (std::int64_t tt = 4; tt < tiles; ++tt) {
      const bool skipped = static_cast<double>(clean_d.deltas[g * tiles + tt]) < std::log(0.05);
      tile4_skipped += (tt == 4 && skipped) ? 1 : 0;
      tail_skipped += skipped ? 1 : 0;
    }
  ASSERT_GT(tile4_skipped, 0) << "the NaN must sit in a tile that would be skipped";

  const std::int64_t j = 300;
  p.k[ki(p, 0, j, 0) + 7] = kNaN;
  SkipStats st;
  attention(p.problem(MaskKind::full), skip, rec, &st);
  // Head 0: every row sees key 300 -> NaN. Head 1 is untouched and bit-equal to the clean run.
  for (std::int64_t i = 0; i < p.Lq; ++i) {
    EXPECT_TRUE(std::isnan(p.lse[li(p, 0, i, 0)])) << i;
    for (std::int64_t c = 0; c < p.dv; ++c) {
      EXPECT_TRUE(std::isnan(p.out[oi(p, 0, i, 0) + c]));
      EXPECT_EQ(p.out[oi(p, 0, i, 1) + c], clean_out[oi(p, 0, i, 1) + c]);
    }
  }
  // Head 0's deltas of tiles 4..7 are recorded as NaN (the NaN tile, then a NaN running max) and
  // none of them is skipped; tiles 0..3 and head 1 decide as in the clean run, delta for delta.
  ASSERT_EQ(st.deltas.size(), clean_d.deltas.size());
  std::int64_t nan_deltas = 0;
  for (std::size_t x = 0; x < st.deltas.size(); ++x) {
    const std::int64_t g = static_cast<std::int64_t>(x) / tiles, tt = static_cast<std::int64_t>(x) % tiles;
    const bool want_nan = g < groups && tt >= 4;
    nan_deltas += std::isnan(st.deltas[x]) ? 1 : 0;
    if (want_nan) EXPECT_TRUE(std::isnan(st.deltas[x])) << "group " << g << " tile " << tt;
    else EXPECT_EQ(st.deltas[x], clean_d.deltas[x]) << "group " << g << " tile " << tt;
  }
  EXPECT_EQ(nan_deltas, groups * 4);
  EXPECT_EQ(st.skipped[0] + tail_skipped, clean.skipped[0]);
  EXPECT_EQ(st.skipped[1], clean.skipped[1]);
}

// Split layouts merge partial states: the NaN survives the merge (natural and seeded splits).
TEST(NanRule, NanSurvivesSplitMerges) {
  for (const VisitOrder order : {VisitOrder::natural, VisitOrder::max_first}) {
    Dense p(1, 1, 700, 4, 1, 16, 16, 2104);
    p.k[ki(p, 0, 650, 0)] = kNaN;  // in the last split
    DecodeProblem d;
    d.q = Tensor::contiguous(p.q.data(), DType::f32, {1, 1, 4, 16});
    d.k_cache = Tensor::contiguous(p.k.data(), DType::f32, {1, 700, 1, 16});
    d.v_cache = Tensor::contiguous(p.v.data(), DType::f32, {1, 700, 1, 16});
    std::fill(p.out.begin(), p.out.end(), 0.0f);
    std::fill(p.lse.begin(), p.lse.end(), 0.0f);
    d.out = Tensor::contiguous(p.out.data(), DType::f32, {1, 1, 4, 16});
    d.lse = Tensor::contiguous(p.lse.data(), DType::f32, {1, 4, 1});
    SkipConfig skip;
    skip.vote.heads = 4;
    skip.vote.split_tiles = 2;
    skip.vote.order = order;
    decode(d, skip, RunOptions{});
    for (float x : p.out) EXPECT_TRUE(std::isnan(x)) << to_string(order);
    for (float x : p.lse) EXPECT_TRUE(std::isnan(x)) << to_string(order);
  }
}

// 16-bit inputs and the fp64 oracle mode follow the same rule.
TEST(NanRule, SixteenBitInputsAndFp64) {
  Dense p(1, 20, 20, 2, 2, 8, 8, 2105);
  std::vector<std::uint16_t> q16, k16, v16;
  for (float x : p.q) q16.push_back(float_to_bf16(x));
  for (float x : p.k) k16.push_back(float_to_bf16(x));
  for (float x : p.v) v16.push_back(float_to_bf16(x));
  q16[qi(p, 0, 7, 1)] = 0x7fc0;  // bf16 quiet NaN
  std::vector<std::uint16_t> o16(p.out.size());
  AttentionProblem a;
  a.q = Tensor::contiguous(q16.data(), DType::bf16, {1, 20, 2, 8});
  a.k = Tensor::contiguous(k16.data(), DType::bf16, {1, 20, 2, 8});
  a.v = Tensor::contiguous(v16.data(), DType::bf16, {1, 20, 2, 8});
  a.out = Tensor::contiguous(o16.data(), DType::bf16, {1, 20, 2, 8});
  for (const bool fp64 : {false, true}) {
    RunOptions opt;
    opt.fp64 = fp64;
    attention(a, SkipConfig{}, opt);
    for (std::int64_t i = 0; i < 20; ++i)
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t c = 0; c < 8; ++c)
          EXPECT_EQ(std::isnan(bf16_to_float(o16[oi(p, 0, i, h) + c])), i == 7 && h == 1) << fp64;
  }
}

// Infinities follow IEEE arithmetic: a +inf visible score gives inf - inf = NaN in the softmax
// (the row is NaN); inf * 0 is NaN (the row is NaN); scores that are all -inf weigh nothing,
// like masked keys (the row is 0 with LSE = -inf).
TEST(NanRule, InfiniteQueriesFollowIeee) {
  Dense p(1, 4, 40, 1, 1, 4, 4, 2106);
  for (std::int64_t j = 0; j < p.Lk; ++j) p.k[ki(p, 0, j, 0) + 0] = 0.5f + std::abs(p.k[ki(p, 0, j, 0) + 0]);
  p.k[ki(p, 0, 11, 0) + 1] = 0.0f;
  p.q[qi(p, 0, 1, 0) + 0] = kInf;   // row 1: every score +inf -> NaN
  p.q[qi(p, 0, 2, 0) + 0] = -kInf;  // row 2: every score -inf -> nothing visible
  p.q[qi(p, 0, 3, 0) + 1] = kInf;   // row 3: inf * k[11][1] = inf * 0 = NaN
  attention(p.problem(MaskKind::full), SkipConfig{}, RunOptions{});
  std::vector<double> o, lse;
  test::naive(p.q, p.k, p.v, 1, 4, 40, 1, 1, 4, 4, false, o, lse);
  EXPECT_NEAR(p.lse[0], lse[0], 2e-5);  // row 0 is untouched
  for (std::int64_t c = 0; c < 4; ++c) EXPECT_NEAR(p.out[c], o[c], 2e-5);
  for (std::int64_t i : {1, 3}) {
    EXPECT_TRUE(std::isnan(p.lse[i])) << i;
    for (std::int64_t c = 0; c < 4; ++c) EXPECT_TRUE(std::isnan(p.out[oi(p, 0, i, 0) + c])) << i;
  }
  EXPECT_EQ(p.lse[2], -kInf);
  for (std::int64_t c = 0; c < 4; ++c) EXPECT_EQ(p.out[oi(p, 0, 2, 0) + c], 0.0f);
}

// An infinite key component: rows with q[3] > 0 get a +inf score (NaN row), rows with q[3] < 0
// a -inf score, which weighs nothing: those rows equal attention without that key.
TEST(NanRule, InfiniteKeyFollowsIeee) {
  Dense p(1, 12, 40, 1, 1, 4, 4, 2110);
  p.k[ki(p, 0, 20, 0) + 3] = kInf;
  attention(p.problem(MaskKind::full), SkipConfig{}, RunOptions{});
  expect_rule(p, false, [&](std::int64_t, std::int64_t i, std::int64_t) { return p.q[qi(p, 0, i, 0) + 3] > 0; },
              2e-5, "k inf");
}

// ---- the worker pool --------------------------------------------------------------------------

// 40000 one-row vote groups and --threads 40000: the pool used to start one thread per task up
// to the request (and abort when the system ran out); it now runs 4 x the hardware threads.
TEST(WorkerPool, AbsurdThreadCountsAreClamped) {
  Dense p(1, 10000, 16, 4, 4, 4, 4, 2107);
  SkipConfig one_row;
  one_row.vote.rows = 1;  // 10000 rows x 4 heads = 40000 tasks
  RunOptions one;
  one.num_threads = 1;
  attention(p.problem(MaskKind::causal), one_row, one);
  const std::vector<float> ref = p.out;
  for (const int n : {40000, 1 << 30}) {
    RunOptions many;
    many.num_threads = n;
    attention(p.problem(MaskKind::causal), one_row, many);
    EXPECT_EQ(p.out, ref) << n;
  }
}

#ifndef BLASST_UNDER_SANITIZER
// Thread creation that fails part-way (here: an address-space limit leaves room for few thread
// stacks) used to end in std::terminate with the started threads never joined. The pool now
// stops spawning and the threads it has finish the work: same result, no crash.
TEST(WorkerPool, FailingThreadCreationStillFinishes) {
  const unsigned want = std::min(1024u, 4 * std::max(1u, std::thread::hardware_concurrency()));
  ASSERT_GE(want, 4u);
  Dense p(1, 256, 256, 4, 4, 16, 16, 2108);
  RunOptions one;
  one.num_threads = 1;
  attention(p.problem(MaskKind::full), SkipConfig{}, one);
  const std::vector<float> ref = p.out;
  std::fill(p.out.begin(), p.out.end(), kNaN);

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: cap the address space a little above what is mapped now, so that only a couple of
    // 8 MB thread stacks fit; first show that the cap does stop thread creation.
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const rlim_t now = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE));
    const rlimit lim{now + (20u << 20), now + (20u << 20)};
    if (now == 0 || ::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(10);
    {
      std::vector<std::thread> probe;
      bool failed = false;
      for (unsigned i = 0; i < want && !failed; ++i) {
        try {
          probe.emplace_back([] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
        } catch (const std::system_error&) {
          failed = true;
        }
      }
      for (auto& t : probe) t.join();
      if (!failed) ::_exit(11);  // the limit did not bite: the case would not be tested
    }
    RunOptions many;
    many.num_threads = static_cast<int>(want);
    try {
      attention(p.problem(MaskKind::full), SkipConfig{}, many);
    } catch (...) {
      ::_exit(12);
    }
    ::_exit(p.out == ref ? 0 : 13);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died (signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << "): thread creation failure not handled";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setrlimit failed, 11: the limit did not stop thread creation, "
                                       "12: attention threw, 13: wrong result";
}
#endif

// ---- buffers bounded by the input -------------------------------------------------------------

// vote.tile_keys beyond Lk means one tile: the result equals tile_keys = Lk bit for bit, and the
// memory is that of one tile of the input, not of tile_keys keys (4M keys x d = 96 was 1.5 GB).
TEST(Limits, HugeTileKeysCostOnlyTheInput) {
  Dense p(1, 64, 64, 2, 2, 96, 96, 2109);
  SkipConfig one_tile;
  one_tile.vote.tile_keys = 64;
  attention(p.problem(MaskKind::full), one_tile, RunOptions{});
  const std::vector<float> ref = p.out;
  for (const int t : {4000000, std::numeric_limits<int>::max()}) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      SkipConfig huge;
      huge.vote.tile_keys = t;
      huge.vote.rows = std::numeric_limits<int>::max();
      try {
        attention(p.problem(MaskKind::full), huge, RunOptions{});
      } catch (...) {
        ::_exit(12);
      }
      ::_exit(p.out == ref ? 0 : 13);
    }
    int status = 0;
    rusage ru{};
    ASSERT_EQ(::wait4(pid, &status, 0, &ru), pid);
    ASSERT_TRUE(WIFEXITED(status)) << t;
    EXPECT_EQ(WEXITSTATUS(status), 0) << t << " (12: threw, 13: differs from one tile of Lk keys)";
    EXPECT_LT(ru.ru_maxrss, 400 * 1024) << t << ": peak RSS " << ru.ru_maxrss << " kB";
  }
}

}  // namespace
}  // namespace blasst
