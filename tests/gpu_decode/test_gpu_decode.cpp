// GPU decode kernel vs the CPU oracle (reference::decode) on fresh seeded random data, with the
// SAME vote layout (rows = q_len, heads = g, split_tiles reported by the kernel). Outputs are
// poisoned (NaN) before every call so an unwritten element fails.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/half.hpp"

namespace {

using blasst::DType;
using blasst::Tensor;

#define SKIP_WITHOUT_GPU() \
  if (!blasst::cuda_available()) GTEST_SKIP() << "no CUDA GPU: sm_90 decode kernel tests skipped"

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x

std::uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

std::uint16_t to_half(float f, DType t) {
  return t == DType::bf16 ? blasst::float_to_bf16(f) : blasst::float_to_f16(f);
}
float from_half(std::uint16_t h, DType t) {
  return t == DType::bf16 ? blasst::bf16_to_float(h) : blasst::f16_to_float(h);
}

struct Case {
  int q_len = 1, hq = 8, hk = 2, d = 128;
  DType dt = DType::bf16;
  std::vector<int> lens{1000};
  int page = 0;  // 0: contiguous cache
  blasst::MaskKind mask = blasst::MaskKind::causal;
  bool structured = false;  // llm-like K: heavy tiles aligned with the queries, so skips happen
  DType out_dt = DType::f32;
  bool lse = true;
};

std::string describe(const Case& c) {
  std::string s = "q_len=" + std::to_string(c.q_len) + " hq=" + std::to_string(c.hq) +
                  " hk=" + std::to_string(c.hk) + " d=" + std::to_string(c.d) + " " + blasst::to_string(c.dt) +
                  " page=" + std::to_string(c.page) + " lens=";
  for (int l : c.lens) s += std::to_string(l) + ",";
  return s;
}

// Host copy of one decode problem (inputs as 16-bit, outputs f32/bf16).
struct HostProblem {
  Case c;
  int B = 0, cap = 0, num_pages = 0, max_pages = 0;
  std::vector<std::uint16_t> q, k, v;
  std::vector<std::int32_t> page_table, seqlens;

  HostProblem(const Case& cs, std::uint64_t seed) : c(cs) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    B = static_cast<int>(c.lens.size());
    cap = std::max(1, *std::max_element(c.lens.begin(), c.lens.end()));
    seqlens.assign(c.lens.begin(), c.lens.end());
    const int g = c.hq / c.hk;
    // Per KV head a direction shared by its query heads: structured K puts some tiles on it.
    std::vector<float> dir(static_cast<std::size_t>(c.hk) * c.d);
    for (auto& x : dir) x = nd(rng);
    q.resize(static_cast<std::size_t>(B) * c.q_len * c.hq * c.d);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < c.q_len; ++t)
        for (int h = 0; h < c.hq; ++h)
          for (int e = 0; e < c.d; ++e) {
            float x = nd(rng);
            if (c.structured) x = 0.5f * dir[(h / g) * c.d + e] + 0.5f * x;
            q[((static_cast<std::size_t>(b) * c.q_len + t) * c.hq + h) * c.d + e] = to_half(x, c.dt);
          }
    // Keys/values of every sequence in logical order; placed into pages below.
    std::vector<std::vector<float>> heavy(B);
    std::bernoulli_distribution coin(0.15);
    for (int b = 0; b < B; ++b) {
      const int nt = (c.lens[b] + 127) / 128;
      heavy[b].assign(nt, 0.f);
      for (int t = 0; t < nt; ++t) heavy[b][t] = coin(rng) ? 1.f : 0.f;
    }
    auto key_val = [&](int b, int j, int h, int e, bool is_k) {
      float x = nd(rng);
      if (is_k && c.structured) {
        float a = heavy[b][j / 128] * (0.6f + 0.4f * static_cast<float>((j * 7919) % 13) / 13.f);
        if (j == 0) a = 1.2f;  // attention sink
        x = 0.5f * x + a * dir[h * c.d + e];
      }
      return to_half(x, c.dt);
    };
    const std::size_t row = static_cast<std::size_t>(c.hk) * c.d;
    if (c.page == 0) {
      k.assign(static_cast<std::size_t>(B) * cap * row, to_half(NAN, c.dt));
      v = k;
      for (int b = 0; b < B; ++b)
        for (int j = 0; j < c.lens[b]; ++j)
          for (int h = 0; h < c.hk; ++h)
            for (int e = 0; e < c.d; ++e) {
              const std::size_t o = (static_cast<std::size_t>(b) * cap + j) * row + h * c.d + e;
              k[o] = key_val(b, j, h, e, true);
              v[o] = key_val(b, j, h, e, false);
            }
      // Keys past a sequence's length are NaN: reading them would poison the output.
    } else {
      max_pages = (cap + c.page - 1) / c.page;
      int used = 0;
      for (int l : c.lens) used += (l + c.page - 1) / c.page;
      num_pages = used + 3;
      std::vector<int> perm(num_pages);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      page_table.assign(static_cast<std::size_t>(B) * max_pages, -1);  // unused entries invalid
      k.assign(static_cast<std::size_t>(num_pages) * c.page * row, to_half(NAN, c.dt));
      v = k;
      int next = 0;
      for (int b = 0; b < B; ++b)
        for (int pg = 0; pg < (c.lens[b] + c.page - 1) / c.page; ++pg) page_table[b * max_pages + pg] = perm[next++];
      for (int b = 0; b < B; ++b)
        for (int j = 0; j < c.lens[b]; ++j) {
          const int pg = page_table[b * max_pages + j / c.page];
          for (int h = 0; h < c.hk; ++h)
            for (int e = 0; e < c.d; ++e) {
              const std::size_t o = (static_cast<std::size_t>(pg) * c.page + j % c.page) * row + h * c.d + e;
              k[o] = key_val(b, j, h, e, true);
              v[o] = key_val(b, j, h, e, false);
            }
        }
    }
  }

  // A DecodeProblem over the given buffers (host or device).
  blasst::DecodeProblem problem(void* qp, void* kp, void* vp, const std::int32_t* pt, const std::int32_t* sl,
                                void* op, void* lp, blasst::DeviceKind dev) const {
    blasst::DecodeProblem p;
    p.q = Tensor::contiguous(qp, c.dt, {B, c.q_len, c.hq, c.d}, dev);
    if (c.page == 0) {
      p.k_cache = Tensor::contiguous(kp, c.dt, {B, cap, c.hk, c.d}, dev);
      p.v_cache = Tensor::contiguous(vp, c.dt, {B, cap, c.hk, c.d}, dev);
    } else {
      p.k_cache = Tensor::contiguous(kp, c.dt, {num_pages, c.page, c.hk, c.d}, dev);
      p.v_cache = Tensor::contiguous(vp, c.dt, {num_pages, c.page, c.hk, c.d}, dev);
      p.page_table = pt;
      p.page_table_stride = max_pages;
    }
    p.seqlens_k = sl;
    p.out = Tensor::contiguous(op, c.out_dt, {B, c.q_len, c.hq, c.d}, dev);
    if (lp) p.lse = Tensor::contiguous(lp, DType::f32, {B, c.hq, c.q_len}, dev);
    p.mask = c.mask;
    return p;
  }
  std::size_t out_elems() const { return static_cast<std::size_t>(B) * c.q_len * c.hq * c.d; }
  std::size_t lse_elems() const { return static_cast<std::size_t>(B) * c.hq * c.q_len; }
};

struct Result {
  std::vector<float> out, lse;
  blasst::SkipStats stats;
};

float out_at(const std::vector<unsigned char>& raw, std::size_t i, DType t) {
  if (t == DType::f32) { float f; std::memcpy(&f, raw.data() + 4 * i, 4); return f; }
  std::uint16_t h; std::memcpy(&h, raw.data() + 2 * i, 2);
  return from_half(h, t);
}

// Runs the GPU kernel on device copies (outputs poisoned with NaN first).
Result run_gpu(const HostProblem& hp, const blasst::SkipConfig& skip, const blasst::RunOptions& opt0) {
  Result r;
  auto alloc_copy = [](const void* src, std::size_t n) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, std::max<std::size_t>(n, 16)), cudaSuccess);
    if (src && n) EXPECT_EQ(cudaMemcpy(d, src, n, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  };
  const std::size_t osz = blasst::dtype_size(hp.c.out_dt);
  void* dq = alloc_copy(hp.q.data(), hp.q.size() * 2);
  void* dk = alloc_copy(hp.k.data(), hp.k.size() * 2);
  void* dv = alloc_copy(hp.v.data(), hp.v.size() * 2);
  void* dpt = hp.page_table.empty() ? nullptr : alloc_copy(hp.page_table.data(), hp.page_table.size() * 4);
  void* dsl = alloc_copy(hp.seqlens.data(), hp.seqlens.size() * 4);
  void* dout = alloc_copy(nullptr, hp.out_elems() * osz);
  void* dlse = hp.c.lse ? alloc_copy(nullptr, hp.lse_elems() * 4) : nullptr;
  EXPECT_EQ(cudaMemset(dout, 0xff, hp.out_elems() * osz), cudaSuccess);  // NaN poison
  if (dlse) EXPECT_EQ(cudaMemset(dlse, 0xff, hp.lse_elems() * 4), cudaSuccess);
  auto p = hp.problem(dq, dk, dv, static_cast<std::int32_t*>(dpt), static_cast<std::int32_t*>(dsl), dout, dlse,
                      blasst::DeviceKind::cuda);
  blasst::RunOptions opt = opt0;
  blasst::decode(p, skip, opt, &r.stats);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> raw(hp.out_elems() * osz);
  EXPECT_EQ(cudaMemcpy(raw.data(), dout, raw.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  r.out.resize(hp.out_elems());
  for (std::size_t i = 0; i < r.out.size(); ++i) r.out[i] = out_at(raw, i, hp.c.out_dt);
  if (dlse) {
    r.lse.resize(hp.lse_elems());
    EXPECT_EQ(cudaMemcpy(r.lse.data(), dlse, r.lse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  for (void* x : {dq, dk, dv, dpt, dsl, dout, dlse})
    if (x) cudaFree(x);
  return r;
}

Result run_ref(const HostProblem& hp, const blasst::SkipConfig& skip, bool stats) {
  Result r;
  r.out.assign(hp.out_elems(), NAN);
  r.lse.assign(hp.lse_elems(), NAN);
  Case c = hp.c;
  HostProblem& h = const_cast<HostProblem&>(hp);
  auto p = h.problem(h.q.data(), h.k.data(), h.v.data(), h.page_table.empty() ? nullptr : h.page_table.data(),
                     h.seqlens.data(), r.out.data(), r.lse.data(), blasst::DeviceKind::cpu);
  p.out.dtype = DType::f32;
  p.lse = Tensor::contiguous(r.lse.data(), DType::f32, {hp.B, c.hq, c.q_len});
  blasst::RunOptions opt;
  opt.collect_stats = stats;
  opt.collect_histogram = stats;
  blasst::reference::decode(p, skip, opt, stats ? &r.stats : nullptr);
  return r;
}

// ||a - b|| / ||b|| over finite references; every GPU element must be finite.
void expect_close(const Result& gpu, const Result& ref, double tol, const std::string& what) {
  ASSERT_EQ(gpu.out.size(), ref.out.size());
  double num = 0, den = 0, maxabs = 0, maxref = 0;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    if (!std::isfinite(gpu.out[i])) { ++bad; continue; }
    const double e = gpu.out[i] - ref.out[i];
    num += e * e;
    den += double(ref.out[i]) * ref.out[i];
    maxabs = std::max(maxabs, std::fabs(e));
    maxref = std::max(maxref, std::fabs(double(ref.out[i])));
  }
  EXPECT_EQ(bad, 0u) << what << ": non-finite (unwritten?) output elements";
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  EXPECT_LT(rel, tol) << what << ": relative L2 error";
  EXPECT_LE(maxabs, 5 * tol * std::max(maxref, 1e-3)) << what << ": max abs error";
  if (!ref.lse.empty() && !gpu.lse.empty()) {
    for (std::size_t i = 0; i < ref.lse.size(); ++i) {
      if (std::isinf(ref.lse[i])) {
        EXPECT_TRUE(std::isinf(gpu.lse[i]) && gpu.lse[i] < 0) << what << ": lse[" << i << "] should be -inf";
      } else {
        EXPECT_NEAR(gpu.lse[i], ref.lse[i], 2e-3 + 1e-4 * std::fabs(ref.lse[i])) << what << ": lse[" << i << "]";
      }
    }
  }
}

// Dense check, with the kernel's own split layout and optionally a forced one.
void check_dense(const Case& c, std::int64_t split_tiles = 0) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(describe(c) + " split_tiles=" + std::to_string(split_tiles) + " seed=" + std::to_string(seed));
  HostProblem hp(c, seed);
  blasst::SkipConfig skip;
  skip.vote.split_tiles = split_tiles;
  blasst::RunOptions opt;
  opt.collect_stats = true;
  Result gpu = run_gpu(hp, skip, opt);
  Result ref = run_ref(hp, blasst::SkipConfig{}, false);
  const double tol = c.out_dt == DType::f32 ? 1e-2 : 2e-2;
  expect_close(gpu, ref, tol, "dense");
  EXPECT_EQ(gpu.stats.total_skipped(), 0);
  EXPECT_EQ(gpu.stats.granularity.rows, c.q_len);
  EXPECT_EQ(gpu.stats.granularity.heads, c.hq / c.hk);
  EXPECT_EQ(gpu.stats.granularity.tile_keys, 128);
  if (split_tiles > 0 && gpu.stats.granularity.split_tiles > 0) EXPECT_EQ(gpu.stats.granularity.split_tiles, split_tiles);
}

// Skip check: same layout in the reference; same skipped pairs (counts per KV head, up to ties
// within rounding) and outputs within tolerance.
// target > 0: lambda (a threshold) is taken from the reference's one-pass curve of this data at
// that sparsity (0.15: with the kernel's short splits at B = 1 and 2 KV heads, some seeds cannot
// reach 0.3 at any lambda < 1, H200 run of 6ff5dca), with the kernel's own split layout (a GPU call with lambda >= 1 reports it) and
// the same vote group and order, so every fresh seed skips a real share of tiles (fixed lambdas
// left 0-0.006 for some seeds: H200 runs of 06efc5a and f05b4c2; short splits in natural order
// skip little, as the first tile of each split is always kept).
void check_skip(const Case& c, const blasst::SkipConfig& skip0, std::int64_t split_tiles = 0,
                double min_sparsity = 0.01, double dense_tol = 0.3, double target = 0.0) {
  // (min_sparsity may be lowered below when the one-pass curve cannot reach the target.)
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(describe(c) + " split_tiles=" + std::to_string(split_tiles) + " seed=" + std::to_string(seed));
  HostProblem hp(c, seed);
  blasst::SkipConfig skip = skip0;
  if (target > 0) {
    blasst::SkipConfig probe = blasst::SkipConfig::from_factor(1e30);  // lambda >= 1: nothing skipped
    probe.vote = skip0.vote;
    probe.vote.split_tiles = split_tiles;
    blasst::RunOptions po;
    po.collect_stats = true;
    const Result layout = run_gpu(hp, probe, po);
    blasst::SkipConfig curve = blasst::SkipConfig::from_threshold(0.5);
    curve.vote = skip0.vote;
    curve.vote.rows = c.q_len;
    curve.vote.heads = c.hq / c.hk;
    curve.vote.split_tiles = layout.stats.granularity.split_tiles;
    Result r = run_ref(hp, curve, true);
    blasst::DeltaHistogram merged;
    for (const auto& hh : r.stats.hist) merged.merge(hh);
    // Wide vote groups (16-32 rows) in short natural-order splits may not reach the target at any
    // lambda < 1 (H200 run of 805d98c): then the largest reachable share (lambda 0.9), and the
    // adequacy floor drops to 0; the per-head skipped counts and histograms are still compared.
    double lam = merged.lambda_for(target);
    if (!(lam > 0 && lam < 1)) lam = merged.lambda_for(target / 3);
    if (!(lam > 0 && lam < 1)) {
      lam = 0.9;
      min_sparsity = 0.0;
    }
    const blasst::VoteGranularity vote = skip0.vote;
    skip = blasst::SkipConfig::from_threshold(lam);
    skip.vote = vote;
    SCOPED_TRACE("lambda from the one-pass curve: " + std::to_string(lam));
  }
  skip.vote.split_tiles = split_tiles;
  blasst::RunOptions opt;
  opt.collect_histogram = true;
  Result gpu = run_gpu(hp, skip, opt);
  blasst::SkipConfig rs = skip;
  rs.vote.rows = c.q_len;
  rs.vote.heads = c.hq / c.hk;
  rs.vote.split_tiles = gpu.stats.granularity.split_tiles;
  Result ref = run_ref(hp, rs, true);
  ASSERT_EQ(gpu.stats.visited.size(), static_cast<std::size_t>(c.hk));
  ASSERT_EQ(ref.stats.visited.size(), static_cast<std::size_t>(c.hk));
  for (int h = 0; h < c.hk; ++h) {
    EXPECT_EQ(gpu.stats.visited[h], ref.stats.visited[h]) << "kv head " << h;
    const double slack = 1 + 0.01 * static_cast<double>(ref.stats.visited[h]);
    EXPECT_LE(std::fabs(double(gpu.stats.skipped[h] - ref.stats.skipped[h])), slack) << "kv head " << h;
    ASSERT_EQ(gpu.stats.hist.size(), static_cast<std::size_t>(c.hk));
    EXPECT_EQ(gpu.stats.hist[h].total(), static_cast<std::uint64_t>(ref.stats.visited[h]));
    // Histograms agree up to deltas that round across a bin edge.
    std::uint64_t diff = 0;
    for (std::size_t i = 0; i < ref.stats.hist[h].counts.size(); ++i)
      diff += gpu.stats.hist[h].counts[i] > ref.stats.hist[h].counts[i]
                  ? gpu.stats.hist[h].counts[i] - ref.stats.hist[h].counts[i]
                  : ref.stats.hist[h].counts[i] - gpu.stats.hist[h].counts[i];
    EXPECT_LE(static_cast<double>(diff), 2 + 0.02 * static_cast<double>(ref.stats.visited[h])) << "kv head " << h;
  }
  // Input adequacy, not kernel behaviour: the check above only means something if tiles were
  // skipped. The floor is loose because the data is fresh each run (H200 run of 62881c8 saw
  // 0.038-0.041 at 20000 keys for some seeds, under the former 0.05 floor).
  EXPECT_GE(ref.stats.sparsity(), min_sparsity) << "the structured data should give real sparsity";
  ASSERT_EQ(gpu.stats.lambda.size(), ref.stats.lambda.size());
  for (std::size_t b = 0; b < ref.stats.lambda.size(); ++b) EXPECT_DOUBLE_EQ(gpu.stats.lambda[b], ref.stats.lambda[b]);
  expect_close(gpu, ref, 1e-2, "skip");
  // And the skip output stays close to the dense one (the SPEC §2 bound: small lambda).
  Result dense = run_ref(hp, blasst::SkipConfig{}, false);
  Result gpu_out = gpu;
  gpu_out.lse.clear();  // skipping moves the LSE a little; only the output is compared here
  expect_close(gpu_out, dense, dense_tol, "skip vs dense");
}

TEST(GpuDecode, DenseLengths) {
  SKIP_WITHOUT_GPU();
  for (int L : {1, 17, 127, 129, 1000, 70000}) {
    Case c;
    c.lens = {L};
    check_dense(c);
  }
}

TEST(GpuDecode, DenseMixedBatchAndForcedSplits) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.lens = {1, 17, 127, 129, 1000, 3000, 0, 5000};
  check_dense(c);
  check_dense(c, 1);
  check_dense(c, 3);
  c.q_len = 4;
  check_dense(c, 2);
}

TEST(GpuDecode, PagedEveryPageSize) {
  SKIP_WITHOUT_GPU();
  for (int ps : {16, 32, 64, 128}) {
    Case c;
    c.page = ps;
    c.lens = {1, 129, 1000, 4000, 77};
    check_dense(c);
    c.q_len = 3;
    check_dense(c, 2);
  }
}

TEST(GpuDecode, GqaRatiosAndQueryLengths) {
  SKIP_WITHOUT_GPU();
  struct H { int hq, hk; };
  for (H h : {H{4, 4}, H{16, 4}, H{16, 2}, H{16, 1}}) {  // g = 1, 4, 8, Hq (MQA)
    for (int ql : {1, 4}) {
      Case c;
      c.hq = h.hq;
      c.hk = h.hk;
      c.q_len = ql;
      c.lens = {300, 2500};
      check_dense(c);
    }
  }
  Case c;  // 64 rows: g = 8, q_len = 8
  c.hq = 16;
  c.hk = 2;
  c.q_len = 8;
  c.lens = {7, 1500};
  check_dense(c);
  c.mask = blasst::MaskKind::full;
  check_dense(c);
}

TEST(GpuDecode, DtypesHeadDimsOutputs) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::bf16, DType::f16})
    for (int d : {64, 128}) {
      Case c;
      c.dt = dt;
      c.d = d;
      c.lens = {640, 2049};
      c.q_len = 2;
      check_dense(c);
      c.out_dt = dt;  // output in the input dtype
      c.lse = false;
      check_dense(c);
    }
}

TEST(GpuDecode, SkipMatchesReferenceThreshold) {
  SKIP_WITHOUT_GPU();
  blasst::SkipConfig skip = blasst::SkipConfig::from_threshold(0.02);  // replaced: target 0.3
  for (int ql : {1, 4}) {
    Case c;
    c.structured = true;
    c.q_len = ql;
    c.lens = {20000};
    check_skip(c, skip, 0, 0.01, 0.4, 0.15);   // the kernel's own split layout
    check_skip(c, skip, 7, 0.01, 0.4, 0.15);   // a forced one
    check_skip(c, skip, 40, 0.05, 0.4, 0.3);   // long splits: the sink's split skips most tiles
    c.page = 64;
    c.lens = {9000, 129, 3000};
    check_skip(c, skip, 0, 0.01, 0.4, 0.15);
  }
}

TEST(GpuDecode, SkipMatchesReferenceFactorPerSequence) {
  SKIP_WITHOUT_GPU();
  // lambda = factor / Lk: the 1000-key sequence gets lambda >= 1 (dense), the others skip.
  blasst::SkipConfig skip = blasst::SkipConfig::from_factor(1500.0);
  Case c;
  c.structured = true;
  c.hq = 32;
  c.hk = 8;
  c.lens = {70000, 1000, 33000};
  check_skip(c, skip);
  c.dt = DType::f16;
  c.d = 64;
  c.lens = {12000};
  check_skip(c, skip, 5);
}

TEST(GpuDecode, StagedHostTensors) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.lens = {700, 1300};
  c.page = 32;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  HostProblem hp(c, seed);
  std::vector<float> out(hp.out_elems(), NAN), lse(hp.lse_elems(), NAN);
  auto p = hp.problem(hp.q.data(), hp.k.data(), hp.v.data(), hp.page_table.data(), hp.seqlens.data(), out.data(),
                      lse.data(), blasst::DeviceKind::cpu);
  blasst::RunOptions opt;
  opt.device = blasst::DeviceKind::cuda;
  blasst::decode(p, {}, opt);
  Result gpu{out, lse, {}};
  expect_close(gpu, run_ref(hp, {}, false), 1e-2, "staged");
}

// A head-major cache ([B, Hk, L, d] in memory, viewed as [B, L, Hk, d] through strides) also goes
// through tensor maps (4-D boxes): same outputs as the reference on the same view. (Output and LSE
// are filled with NaN first, so an unwritten element fails.)
TEST(GpuDecode, HeadMajorCacheView) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.lens = {1000, 300};
  c.q_len = 2;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  HostProblem hp(c, seed);
  const int B = hp.B, L = hp.cap, hk = c.hk, d = c.d;
  // Permute [B, L, Hk, d] -> [B, Hk, L, d].
  std::vector<std::uint16_t> kh(hp.k.size()), vh(hp.v.size());
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < L; ++j)
      for (int h = 0; h < hk; ++h)
        for (int e = 0; e < d; ++e) {
          const std::size_t src = ((static_cast<std::size_t>(b) * L + j) * hk + h) * d + e;
          const std::size_t dst = ((static_cast<std::size_t>(b) * hk + h) * L + j) * d + e;
          kh[dst] = hp.k[src];
          vh[dst] = hp.v[src];
        }
  const std::int64_t st[4] = {std::int64_t(hk) * L * d, d, std::int64_t(L) * d, 1};
  auto view = [&](blasst::DecodeProblem p) {
    for (int i = 0; i < 4; ++i) p.k_cache.stride[i] = p.v_cache.stride[i] = st[i];
    return p;
  };
  // Reference on the host view; the GPU on the same view through the staged path (device copies
  // of each tensor's span, strides kept).
  auto run = [&](blasst::DeviceKind dev) {
    Result r;
    r.out.assign(hp.out_elems(), NAN);
    r.lse.assign(hp.lse_elems(), NAN);
    auto p = view(hp.problem(hp.q.data(), kh.data(), vh.data(), nullptr, hp.seqlens.data(), r.out.data(),
                             r.lse.data(), blasst::DeviceKind::cpu));
    blasst::RunOptions opt;
    opt.device = dev;
    if (dev == blasst::DeviceKind::cpu) blasst::reference::decode(p, {}, opt, nullptr);
    else blasst::decode(p, {}, opt, nullptr);
    return r;
  };
  const Result ref = run(blasst::DeviceKind::cpu);
  const Result gpu = run(blasst::DeviceKind::cuda);
  expect_close(gpu, ref, 1e-2, "head-major view");
}

// Every instantiation (dtype x head dim x dense/skip x m-tiles): g * q_len <= 16 rows run the
// one-m-tile kernels, 17..64 rows the four-m-tile ones; paged with splits, ragged tails.
TEST(GpuDecode, EveryInstantiationMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (int ql : {2, 4}) {  // hq 16 / hk 2: 16 rows (one m-tile) or 32 rows (four)
        Case c;
        c.dt = dt;
        c.d = d;
        c.hq = 16;
        c.hk = 2;
        c.lens = {640, 2049, 129};
        c.q_len = ql;
        check_dense(c);
        check_dense(c, 3);
        c.structured = true;
        c.lens = {d == 128 ? 20000 : 12000};
        check_skip(c, blasst::SkipConfig::from_threshold(0.02), d == 128 ? 0 : 5, 0.01, 0.4, 0.15);
      }
  Case c;  // 64 rows: g = 8, q_len = 8
  c.hq = 16;
  c.hk = 2;
  c.q_len = 8;
  c.lens = {7, 1500};
  check_dense(c);
  c.page = 16;
  c.q_len = 3;
  c.lens = {1, 129, 1000, 77};
  check_dense(c, 2);
  Case sk;  // paged skip with q_len > 1 (the setting of SkipMatchesReferenceThreshold)
  sk.page = 64;
  sk.structured = true;
  sk.q_len = 4;
  sk.lens = {9000, 129, 3000};
  check_skip(sk, blasst::SkipConfig::from_threshold(0.02), 0, 0.01, 0.4, 0.15);
}

// Max-first order in decode = seeded splits (SPEC §2a): every split starts from the scores of the
// sink and last tiles. Same skipped pairs as the reference with the reported layout (which the
// kernel reports even with a single split), also with forced splits, paged, q_len > 1, lambda >= 1
// for one sequence (its deltas still count against the seeds) and both m-tile families.
TEST(GpuDecode, SeededSplitsMatchReference) {
  SKIP_WITHOUT_GPU();
  // Seeded splits skip more tiles at the same lambda than unseeded ones, so the sanity bound on
  // the distance from the dense output is looser here (0.5; H200 runs of ba856d5 / e0fc43b saw
  // 0.318 and 0.389 at lambda 0.125 and 0.02-0.045): the kernel-vs-reference checks are the point.
  // lambda: from each fresh input's one-pass curve at 30 % (a fixed 0.02 left one seed's paged
  // case 0.62 from dense while the kernel matched the reference: H200 cp.async run of 162092d).
  constexpr double kDenseTol = 0.5, kTarget = 0.3;
  blasst::SkipConfig skip = blasst::SkipConfig::from_threshold(0.02);
  skip.vote.order = blasst::VisitOrder::max_first;
  for (int ql : {1, 4}) {
    Case c;
    c.structured = true;
    c.q_len = ql;
    c.lens = {20000};
    check_skip(c, skip, 0, 0.01, kDenseTol, kTarget);
    check_skip(c, skip, 7, 0.01, kDenseTol, kTarget);
    check_skip(c, skip, 1000, 0.01, kDenseTol, kTarget);  // one split: seeded too
    c.page = 32;
    c.lens = {9000, 129, 3000, 0};
    check_skip(c, skip, 5, 0.02, kDenseTol, kTarget);
  }
  blasst::SkipConfig f = blasst::SkipConfig::from_factor(1500.0);
  f.vote.order = blasst::VisitOrder::max_first;
  Case c;
  c.structured = true;
  c.hq = 32;
  c.hk = 8;
  c.lens = {70000, 1000, 33000};
  check_skip(c, f, 0, 0.01, kDenseTol);
  c.dt = DType::f16;
  c.d = 64;
  c.hq = 16;
  c.hk = 2;
  c.q_len = 8;  // 64 rows vote together: lambda from this data's one-pass curve (a fixed factor
  // 1500, lambda 0.125, skipped nothing for one fresh seed: H200 run of d85171c)
  c.lens = {12000};
  check_skip(c, f, 5, 0.01, kDenseTol, 0.15);
}

// Unsupported combinations are clear errors raised before any CUDA work (runs without a GPU).
TEST(GpuDecode, UnsupportedCombosAreErrors) {
  Case c;
  c.lens = {300};
  HostProblem hp(c, 1);
  std::vector<float> out(hp.out_elems()), lse(hp.lse_elems());
  blasst::RunOptions opt;
  opt.device = blasst::DeviceKind::cuda;
  auto expect_error = [&](blasst::DecodeProblem p, const blasst::SkipConfig& s, const char* needle) {
    try {
      blasst::decode(p, s, opt);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const blasst::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto base = [&] {
    return hp.problem(hp.q.data(), hp.k.data(), hp.v.data(), nullptr, hp.seqlens.data(), out.data(), lse.data(),
                      blasst::DeviceKind::cpu);
  };
  {  // f32 inputs
    std::vector<float> q32(hp.q.size()), k32(hp.k.size()), v32(hp.v.size());
    auto p = base();
    p.q = Tensor::contiguous(q32.data(), DType::f32, {1, 1, 8, 128});
    p.k_cache = Tensor::contiguous(k32.data(), DType::f32, {1, hp.cap, 2, 128});
    p.v_cache = Tensor::contiguous(v32.data(), DType::f32, {1, hp.cap, 2, 128});
    expect_error(p, {}, "bf16 and f16");
  }
  {  // 96 > 64 query rows per KV head
    std::vector<std::uint16_t> q(static_cast<std::size_t>(96) * 2 * 128);
    std::vector<float> o(q.size());
    auto p = base();
    p.q = Tensor::contiguous(q.data(), DType::bf16, {1, 1, 192, 128});
    p.out = Tensor::contiguous(o.data(), DType::f32, {1, 1, 192, 128});
    p.lse = Tensor{};
    expect_error(p, {}, "g * q_len <= 64");
  }
  {
    setenv("BLASST_DECODE_LOADS", "bulk", 1);  // the bulk-row path is gone: a clear error
    expect_error(base(), {}, "BLASST_DECODE_LOADS");
    unsetenv("BLASST_DECODE_LOADS");
  }
  {
    blasst::SkipConfig s = blasst::SkipConfig::from_threshold(0.01);
    s.vote.tile_keys = 64;
    expect_error(base(), s, "tile_keys");
  }
}


// Small case for compute-sanitizer (memcheck, racecheck) in scripts/device_decode.sh: paged,
// ragged, q_len > 1, skip on, forced splits, both instantiation families.
TEST(GpuDecodeSanitizer, Small) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.page = 16;
  c.q_len = 2;
  c.lens = {1, 129, 700};
  check_dense(c, 2);
  c.structured = true;
  c.lens = {2000};
  check_skip(c, blasst::SkipConfig::from_threshold(0.05), 4, 0.0);
}

TEST(GpuDecodeSanitizer, SmallSeededAndWideRows) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.page = 16;
  c.hq = 16;
  c.hk = 2;
  c.q_len = 4;  // 32 rows: the four-m-tile kernels
  c.lens = {1, 129, 700};
  check_dense(c, 2);
  c.d = 64;
  check_dense(c);
  c.d = 128;
  c.structured = true;
  c.lens = {2000};
  check_skip(c, blasst::SkipConfig::from_threshold(0.05), 4, 0.0);
  blasst::SkipConfig s = blasst::SkipConfig::from_threshold(0.05);
  s.vote.order = blasst::VisitOrder::max_first;
  c.q_len = 1;
  // Seeded: lambda from this data's one-pass curve at 30 % (the fixed 0.05 skipped so much for one
  // fresh seed that the output sat 0.83 from dense, while the kernel matched the reference: H200
  // racecheck run of cd4d709); looser skip-vs-dense bound (see SeededSplitsMatchReference).
  check_skip(c, s, 4, 0.0, 0.5, 0.3);
}

}  // namespace
