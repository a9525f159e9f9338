// GPU decode kernel vs the CPU oracle (reference::decode) on fixed-seed data (tests/gpu_common.hpp:
// BLASST_TEST_SEED explores other seeds), with the SAME vote layout (rows = q_len, heads = g,
// split_tiles reported by the kernel). Outputs are poisoned (NaN) before every call so an
// unwritten element fails.
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
#include "cuda/sm90/decode/decode_api.hpp"
#include "gpu_common.hpp"

namespace {

using blasst::DType;
using blasst::Tensor;

#define SKIP_WITHOUT_GPU() BLASST_GPU_OR_SKIP("the sm_90a decode kernel needs a Hopper device")

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x

using blasst::test::test_seed;

// The K/V load path under test: the library's choice (tensor maps wherever they describe the
// cache), or, with BLASST_TEST_DECODE_LOADS=cpasync (scripts/device_decode.sh runs the suite both
// ways), the per-thread cp.async fallback for every GPU call. The library itself reads no
// environment; the test routes its calls through the internal entry that takes the path.
blasst::sm90::decode::LoadPath test_loads() {
  const char* e = std::getenv("BLASST_TEST_DECODE_LOADS");
  const std::string v = e ? e : "";
  if (v == "cpasync") return blasst::sm90::decode::LoadPath::cp_async;
  if (!v.empty() && v != "tma") {
    ADD_FAILURE() << "BLASST_TEST_DECODE_LOADS: expected tma or cpasync, got '" << v << "'";
  }
  return blasst::sm90::decode::LoadPath::automatic;
}

// The instance family under test: the library's rule, or, with BLASST_TEST_DECODE_WARPS=4 (or 8),
// the 4-warp instances (two CTAs per SM; d = 128 with g * q_len <= 16, the 8-warp ones elsewhere)
// or the 8-warp ones for every GPU call, so that one suite covers every instance the library may
// pick (scripts/device_decode.sh runs it both ways; EveryInstantiationMatchesReference runs both
// families in any case). Like the load path, a variable of the test, not of the library.
// A test may force a family for its own calls (ForceWarps), whatever the variable says.
blasst::sm90::decode::Warps* g_forced_warps = nullptr;
blasst::sm90::decode::Warps test_warps() {
  if (g_forced_warps != nullptr) return *g_forced_warps;
  const char* e = std::getenv("BLASST_TEST_DECODE_WARPS");
  const std::string v = e ? e : "";
  if (v == "4") return blasst::sm90::decode::Warps::four;
  if (v == "8") return blasst::sm90::decode::Warps::eight;
  if (!v.empty() && v != "auto") ADD_FAILURE() << "BLASST_TEST_DECODE_WARPS: expected 4, 8 or auto, got '" << v << "'";
  return blasst::sm90::decode::Warps::automatic;
}

struct ForceWarps {
  blasst::sm90::decode::Warps w;
  explicit ForceWarps(blasst::sm90::decode::Warps x) : w(x) { g_forced_warps = &w; }
  ~ForceWarps() { g_forced_warps = nullptr; }
  ForceWarps(const ForceWarps&) = delete;
  ForceWarps& operator=(const ForceWarps&) = delete;
};

// blasst::decode on the CUDA path with the load path and the instance family under test.
void gpu_decode(const blasst::DecodeProblem& p, const blasst::SkipConfig& s, const blasst::RunOptions& o,
                blasst::SkipStats* st = nullptr) {
  blasst::sm90::decode::run(p, s, o, st, test_loads(), test_warps());
}
// blasst::decode_workspace_bytes of that call (the family changes the split layout).
std::size_t gpu_workspace_bytes(const blasst::DecodeProblem& p, const blasst::SkipConfig& s, const blasst::RunOptions& o) {
  if (test_warps() == blasst::sm90::decode::Warps::automatic) return blasst::decode_workspace_bytes(p, s, o);
  return blasst::sm90::decode::workspace_bytes(p, s, o, o.collect_stats || o.collect_histogram || o.record_deltas,
                                               test_warps());
}

// The fixed seed of a case: FNV-1a of its description, so a case keeps its data whatever runs
// before it (a --gtest_filter run reproduces a full run).
std::uint64_t case_seed(const std::string& what) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : what) h = (h ^ ch) * 1099511628211ull;
  return test_seed(h);
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

// n bytes of device memory (at least 16), holding a copy of src when given.
void* device_copy(const void* src, std::size_t n) {
  void* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<std::size_t>(n, 16)), cudaSuccess);
  if (src && n) EXPECT_EQ(cudaMemcpy(d, src, n, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// Runs the GPU kernel on device copies (outputs poisoned with NaN first).
Result run_gpu(const HostProblem& hp, const blasst::SkipConfig& skip, const blasst::RunOptions& opt0) {
  Result r;
  const std::size_t osz = blasst::dtype_size(hp.c.out_dt);
  void* dq = device_copy(hp.q.data(), hp.q.size() * 2);
  void* dk = device_copy(hp.k.data(), hp.k.size() * 2);
  void* dv = device_copy(hp.v.data(), hp.v.size() * 2);
  void* dpt = hp.page_table.empty() ? nullptr : device_copy(hp.page_table.data(), hp.page_table.size() * 4);
  void* dsl = device_copy(hp.seqlens.data(), hp.seqlens.size() * 4);
  void* dout = device_copy(nullptr, hp.out_elems() * osz);
  void* dlse = hp.c.lse ? device_copy(nullptr, hp.lse_elems() * 4) : nullptr;
  EXPECT_EQ(cudaMemset(dout, 0xff, hp.out_elems() * osz), cudaSuccess);  // NaN poison
  if (dlse) EXPECT_EQ(cudaMemset(dlse, 0xff, hp.lse_elems() * 4), cudaSuccess);
  auto p = hp.problem(dq, dk, dv, static_cast<std::int32_t*>(dpt), static_cast<std::int32_t*>(dsl), dout, dlse,
                      blasst::DeviceKind::cuda);
  blasst::RunOptions opt = opt0;
  gpu_decode(p, skip, opt, &r.stats);
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

Result run_ref(const HostProblem& hp, const blasst::SkipConfig& skip, bool stats, bool deltas = false) {
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
  opt.record_deltas = stats && deltas;
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
  const std::uint64_t seed = case_seed("dense " + describe(c) + " " + std::to_string(split_tiles) +
                                       (c.mask == blasst::MaskKind::full ? " full" : "") + " out=" +
                                       blasst::to_string(c.out_dt) + (c.lse ? "" : " nolse"));
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

// Skip check against the reference with the kernel's layout (rows = q_len, heads = g, the
// split_tiles the kernel reports, the same order) on the same 16-bit inputs.
// target > 0: lambda from the reference's exact one-pass curve (SPEC §5, recorded deltas) at
// min(target, 0.6 x the largest share any lambda < 1 reaches, which must be >= 2 %: short
// natural-order splits keep their first tile, so the reachable share depends on the layout);
// target == 0: skip0's own threshold source (factor: lambda = factor / Lk per sequence).
// Asserted: visited per KV head equal; skipped per KV head within [sure, sure + near-ties]
// (near-ties: |delta - ln lambda| < kTieEps, <= 1 % of the pairs); histograms up to deltas within
// kTieEps of a bin edge; lambda per sequence; something skipped; O elementwise within
// 2 u (vmax + |ref|) and LSE within u + 2e-4 + 1e-5 |LSE| (u: unit roundoff of the input type),
// plus on rows of a vote group with a near-tie that tile's exact share (SPEC §2); and against the
// dense reference, each row moves at most 2 vmax w (w: the row's skipped mass share, exact from
// the two reference LSEs) and its LSE never rises. Returns the reference's skipped pairs per
// sequence.
std::vector<std::int64_t> check_skip(const Case& c, const blasst::SkipConfig& skip0, std::int64_t split_tiles,
                                     double target) {
  const std::uint64_t seed =
      case_seed("skip " + describe(c) + " " + std::to_string(split_tiles) + " " + blasst::to_string(skip0.vote.order));
  SCOPED_TRACE(describe(c) + " split_tiles=" + std::to_string(split_tiles) + " seed=" + std::to_string(seed));
  HostProblem hp(c, seed);
  const int g = c.hq / c.hk;
  blasst::SkipConfig skip = skip0;
  skip.vote.split_tiles = split_tiles;
  // The kernel's split layout, reported by a GPU call with the skip instantiation on (its
  // occupancy, hence the layout, differs from the dense one's): lambda 1e-30 (any lambda < 1
  // selects it, as do the factor and seeded runs below).
  blasst::SkipConfig probe = blasst::SkipConfig::from_threshold(1e-30).with_order(blasst::VisitOrder::natural);
  probe.vote = skip.vote;
  blasst::RunOptions po;
  po.collect_stats = true;
  const Result layout = run_gpu(hp, probe, po);
  blasst::VoteGranularity vote = skip.vote;
  vote.rows = c.q_len;
  vote.heads = g;
  vote.tile_keys = 128;
  vote.split_tiles = layout.stats.granularity.split_tiles;
  std::vector<std::int64_t> ql(c.lens.size(), c.q_len), kl(c.lens.begin(), c.lens.end());
  const auto tasks = blasst::test::vote_tasks(ql, kl, c.hk, g, vote, c.mask == blasst::MaskKind::causal, true);
  if (target > 0) {
    blasst::SkipConfig curve;  // disabled: dense, deltas recorded at this layout and order
    curve.vote = vote;
    const Result r = run_ref(hp, curve, true, true);
    const double reach = blasst::test::max_reachable_sparsity(r.stats.deltas);
    // Natural order keeps the first tile of every split: with the kernel's 2-3-tile splits at
    // B = 1 the reference reaches 4.5-13 % on these fixed data (CPU check of the reference side).
    EXPECT_GE(reach, 0.02) << "the fixed data leave too few skippable pairs at split_tiles " << vote.split_tiles;
    const double t = std::min(target, 0.6 * reach);
    const double ln = blasst::test::ln_lambda_for(r.stats.deltas, t);
    if (!std::isfinite(ln)) {
      ADD_FAILURE() << "no lambda < 1 reaches " << t;
      return {};
    }
    skip = blasst::SkipConfig::from_threshold(std::exp(ln)).with_order(blasst::VisitOrder::natural);
    skip.vote = skip0.vote;
    skip.vote.split_tiles = split_tiles;
    std::printf("[decode skip] %s split %lld: reachable %.3f, target %.3f, lambda %.4g\n", describe(c).c_str(),
                (long long)split_tiles, reach, t, std::exp(ln));
  }
  SCOPED_TRACE("lambda source: " + std::string(skip.threshold ? "threshold " + std::to_string(*skip.threshold)
                                                              : "factor " + std::to_string(skip.factor.value_or(0))));
  blasst::RunOptions opt;
  opt.collect_histogram = true;
  Result gpu = run_gpu(hp, skip, opt);
  EXPECT_EQ(gpu.stats.granularity.split_tiles, vote.split_tiles) << "the layout changed with lambda";
  EXPECT_EQ(gpu.stats.granularity.rows, c.q_len);
  EXPECT_EQ(gpu.stats.granularity.heads, g);
  EXPECT_EQ(gpu.stats.granularity.order, skip0.vote.order);
  blasst::SkipConfig rs = skip;
  rs.vote = vote;
  Result ref = run_ref(hp, rs, true, true);
  std::vector<double> ln(c.lens.size(), -INFINITY);
  for (std::size_t b = 0; b < ln.size(); ++b)
    if (ref.stats.lambda[b] < 1) ln[b] = std::log(ref.stats.lambda[b]);
  const blasst::test::SkipSet set = blasst::test::classify_skip_set(tasks, ref.stats.deltas, ln, c.hk, false);
  blasst::test::expect_skip_counts(set, gpu.stats);
  for (int h = 0; h < c.hk; ++h) EXPECT_EQ(set.ref_skipped[std::size_t(h)], ref.stats.skipped[std::size_t(h)]);
  if (gpu.stats.hist.size() != static_cast<std::size_t>(c.hk) || gpu.stats.lambda.size() != ref.stats.lambda.size()) {
    ADD_FAILURE() << "statistics sizes: hist " << gpu.stats.hist.size() << ", lambda " << gpu.stats.lambda.size();
    return {};
  }
  for (int h = 0; h < c.hk; ++h)
    blasst::test::expect_histograms(gpu.stats.hist[std::size_t(h)],
                                    blasst::test::deltas_of(tasks, ref.stats.deltas, h, false),
                                    "kv head " + std::to_string(h));
  for (std::size_t b = 0; b < ref.stats.lambda.size(); ++b) EXPECT_DOUBLE_EQ(gpu.stats.lambda[b], ref.stats.lambda[b]);
  EXPECT_GT(gpu.stats.total_skipped(), 0) << "nothing skipped";
  std::printf("[decode skip] %s split %lld: gpu sparsity %.4f, reference %.4f, near-ties %lld of %lld\n",
              describe(c).c_str(), (long long)vote.split_tiles, gpu.stats.sparsity(), ref.stats.sparsity(),
              (long long)set.total_ties, (long long)set.total_visited);

  // Scores of the 16-bit inputs in float64, for the near-tie shares.
  const std::size_t krow = static_cast<std::size_t>(c.hk) * c.d;
  auto key_at = [&](int b, std::int64_t j) -> std::size_t {
    if (c.page == 0) return (static_cast<std::size_t>(b) * hp.cap + std::size_t(j)) * krow;
    const int pg = hp.page_table[std::size_t(b) * hp.max_pages + std::size_t(j / c.page)];
    return (static_cast<std::size_t>(pg) * c.page + std::size_t(j % c.page)) * krow;
  };
  const double scale = 1.0 / std::sqrt(double(c.d));
  std::vector<double> slack_o(hp.lse_elems(), 0.0), slack_l(hp.lse_elems(), 0.0);  // [B, hq, q_len]
  double vmax = 0;
  for (int b = 0; b < hp.B; ++b)
    for (std::int64_t j = 0; j < c.lens[std::size_t(b)]; ++j)
      for (std::size_t e = 0; e < krow; ++e) vmax = std::max(vmax, double(std::fabs(from_half(hp.v[key_at(b, j) + e], c.dt))));
  auto lse_at = [&](std::int64_t b, std::int64_t h, std::int64_t pos) {
    return std::size_t((b * c.hq + h) * c.q_len + pos);
  };
  blasst::test::near_tie_slack(
      tasks, set, kl, g, 128,
      [&](std::int64_t b, std::int64_t h, std::int64_t pos, std::int64_t j) {
        if (c.mask == blasst::MaskKind::causal && j > pos + c.lens[std::size_t(b)] - c.q_len)
          return -std::numeric_limits<double>::infinity();
        const std::size_t qo = ((std::size_t(b) * c.q_len + std::size_t(pos)) * c.hq + std::size_t(h)) * c.d;
        const std::size_t ko = key_at(int(b), j) + std::size_t(h / g) * c.d;
        double acc = 0;
        for (int e = 0; e < c.d; ++e) acc += double(from_half(hp.q[qo + e], c.dt)) * from_half(hp.k[ko + e], c.dt);
        return acc * scale;
      },
      [&](std::int64_t b, std::int64_t h, std::int64_t pos) { return double(ref.lse[lse_at(b, h, pos)]); },
      [&](std::int64_t b, std::int64_t h, std::int64_t pos, double so, double sl) {
        slack_o[lse_at(b, h, pos)] += so * vmax;
        slack_l[lse_at(b, h, pos)] += sl;
      });
  const Result dense = run_ref(hp, blasst::SkipConfig{}, false);
  const double u = blasst::test::unit_roundoff(c.dt);
  std::size_t bad_o = 0, bad_l = 0, bad_dense = 0, nonfinite = 0;
  double worst = 0;
  for (int b = 0; b < hp.B; ++b)
    for (int pos = 0; pos < c.q_len; ++pos)
      for (int h = 0; h < c.hq; ++h) {
        const std::size_t li = lse_at(b, h, pos);
        const std::size_t ob = ((std::size_t(b) * c.q_len + pos) * c.hq + h) * c.d;
        // Skipped mass share of this row (reference skip LSE vs dense LSE).
        const double w = std::isfinite(ref.lse[li]) ? -std::expm1(double(ref.lse[li]) - dense.lse[li]) : 0.0;
        for (int e = 0; e < c.d; ++e) {
          const double got = gpu.out[ob + e], want = ref.out[ob + e];
          if (!std::isfinite(got)) { ++nonfinite; continue; }
          const double tol = 2 * u * (vmax + std::fabs(want));
          const double err = std::fabs(got - want);
          worst = std::max(worst, err / (tol + slack_o[li]));
          bad_o += err > tol + slack_o[li];
          bad_dense += std::fabs(got - dense.out[ob + e]) > 2 * vmax * w + tol + slack_o[li];
        }
        if (c.lse) {
          const double lg = gpu.lse[li], lr = ref.lse[li];
          const double tl = u + 2e-4 + 1e-5 * std::fabs(lr);
          if (std::isinf(lr)) bad_l += !(std::isinf(lg) && lg < 0);
          else bad_l += !(std::fabs(lg - lr) <= tl + slack_l[li]) || lg > dense.lse[li] + tl;
        }
      }
  EXPECT_EQ(nonfinite, 0u) << "non-finite (unwritten?) output elements";
  EXPECT_EQ(bad_o, 0u) << "O elements beyond tolerance; worst error / tolerance " << worst;
  EXPECT_EQ(bad_l, 0u) << "LSE entries beyond tolerance (or above the dense LSE)";
  EXPECT_EQ(bad_dense, 0u) << "O moved from dense beyond 2 vmax x the skipped mass share";
  std::vector<std::int64_t> per_seq(c.lens.size(), 0);
  if (!set.layout_ok) return per_seq;
  std::size_t i = 0;
  for (const auto& t : tasks)
    for (std::size_t x = 0; x < t.tiles.size(); ++x, ++i)
      per_seq[std::size_t(t.b)] += double(ref.stats.deltas[i]) < ln[std::size_t(t.b)];
  return per_seq;
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
  const blasst::SkipConfig skip = blasst::SkipConfig::from_threshold(0.5).with_order(blasst::VisitOrder::natural);  // lambda: from the curve
  for (int ql : {1, 4}) {
    Case c;
    c.structured = true;
    c.q_len = ql;
    c.lens = {20000};
    check_skip(c, skip, 0, 0.3);   // the kernel's own split layout
    check_skip(c, skip, 7, 0.3);   // a forced one
    check_skip(c, skip, 40, 0.3);  // long splits: the sink's split skips most tiles
    c.page = 64;
    c.lens = {9000, 129, 3000};
    check_skip(c, skip, 0, 0.3);
  }
}

TEST(GpuDecode, SkipMatchesReferenceFactorPerSequence) {
  SKIP_WITHOUT_GPU();
  // lambda = factor / Lk: the 1000-key sequence gets lambda >= 1 (dense), the others skip.
  blasst::SkipConfig skip = blasst::SkipConfig::from_factor(1500.0).with_order(blasst::VisitOrder::natural);
  Case c;
  c.structured = true;
  c.hq = 32;
  c.hk = 8;
  c.lens = {70000, 1000, 33000};
  const auto per_seq = check_skip(c, skip, 0, 0.0);
  ASSERT_EQ(per_seq.size(), 3u);
  EXPECT_EQ(per_seq[1], 0) << "lambda 1.5 >= 1: the 1000-key sequence (8 tiles) runs dense";
  EXPECT_GT(per_seq[0], 0);
  EXPECT_GT(per_seq[2], 0);
  c.dt = DType::f16;
  c.d = 64;
  c.lens = {12000};
  check_skip(c, skip, 5, 0.0);
}

TEST(GpuDecode, StagedHostTensors) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.lens = {700, 1300};
  c.page = 32;
  const std::uint64_t seed = case_seed("staged " + describe(c));
  SCOPED_TRACE("seed=" + std::to_string(seed));
  HostProblem hp(c, seed);
  std::vector<float> out(hp.out_elems(), NAN), lse(hp.lse_elems(), NAN);
  auto p = hp.problem(hp.q.data(), hp.k.data(), hp.v.data(), hp.page_table.data(), hp.seqlens.data(), out.data(),
                      lse.data(), blasst::DeviceKind::cpu);
  blasst::RunOptions opt;
  opt.device = blasst::DeviceKind::cuda;
  gpu_decode(p, {}, opt);
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
  const std::uint64_t seed = case_seed("head-major " + describe(c));
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
    else gpu_decode(p, {}, opt, nullptr);
    return r;
  };
  const Result ref = run(blasst::DeviceKind::cpu);
  const Result gpu = run(blasst::DeviceKind::cuda);
  expect_close(gpu, ref, 1e-2, "head-major view");
}

// Every instantiation (dtype x head dim x dense/skip x m-tiles x warps): g * q_len <= 16 rows run
// the one-m-tile kernels, 17..64 rows the four-m-tile ones, and d = 128 with one m-tile also the
// 4-warp ones (forced: the library picks them for large grids only); paged with splits, ragged tails.
TEST(GpuDecode, EveryInstantiationMatchesReference) {
  SKIP_WITHOUT_GPU();
  using blasst::sm90::decode::Warps;
  for (Warps family : {Warps::eight, Warps::four})
  for (DType dt : {DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (int ql : {2, 4}) {  // hq 16 / hk 2: 16 rows (one m-tile) or 32 rows (four)
        if (family == Warps::four && (d != 128 || ql != 2)) continue;  // no 4-warp instance
        ForceWarps force(family);
        SCOPED_TRACE(family == Warps::four ? "4 warps" : "8 warps");
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
        check_skip(c, blasst::SkipConfig::from_threshold(0.5).with_order(blasst::VisitOrder::natural), d == 128 ? 0 : 5, 0.3);
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
  check_skip(sk, blasst::SkipConfig::from_threshold(0.5).with_order(blasst::VisitOrder::natural), 0, 0.3);
}

// The 4-warp instances (two CTAs per SM): K comes in 64-key half tiles, two per 128-key vote, so
// the lengths here end in either half of a tile (and exactly at its middle), pages are smaller
// and larger than a half tile (boxes of page_size rows), a tile's second half may lie wholly past
// the sequence's end, splits are forced to 1-3 tiles (K parts wrap the 3-slot ring at every phase)
// and seeded splits score their seed tiles from the V slots. Asserts that the plan picks them.
TEST(GpuDecode, FourWarpInstances) {
  SKIP_WITHOUT_GPU();
  using blasst::sm90::decode::Warps;
  ForceWarps force(Warps::four);
  {
    Case c;
    c.lens = {64, 65};
    HostProblem hp(c, 1);
    std::vector<float> o(hp.out_elems());
    auto p = hp.problem(hp.q.data(), hp.k.data(), hp.v.data(), nullptr, hp.seqlens.data(), o.data(), nullptr,
                        blasst::DeviceKind::cpu);
    EXPECT_EQ(blasst::sm90::decode::planned_warps(p, {}, Warps::four), 4);
    EXPECT_EQ(blasst::sm90::decode::planned_warps(p, {}, Warps::eight), 8);
    c.hq = 32;
    c.hk = 2;
    c.q_len = 2;  // g 16 x 2 tokens = 32 rows: four m-tiles, no 4-warp instance
    HostProblem hw(c, 1);
    std::vector<float> ow(hw.out_elems());
    auto pw = hw.problem(hw.q.data(), hw.k.data(), hw.v.data(), nullptr, hw.seqlens.data(), ow.data(), nullptr,
                         blasst::DeviceKind::cpu);
    EXPECT_EQ(blasst::sm90::decode::planned_warps(pw, {}, Warps::four), 8);
  }
  for (DType dt : {DType::bf16, DType::f16}) {
    Case c;
    c.dt = dt;
    c.lens = {1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 300, 0, 2000};
    check_dense(c);
    check_dense(c, 1);
    check_dense(c, 2);
    check_dense(c, 3);
    c.mask = blasst::MaskKind::full;
    c.q_len = 4;  // g 4 x 4 tokens = 16 rows
    check_dense(c, 2);
  }
  for (int ps : {16, 32, 64, 128, 256}) {
    Case c;
    c.page = ps;
    c.lens = {1, 64, 65, 129, 1000, 4000, 77};
    check_dense(c, ps == 64 ? 1 : 3);
  }
  Case sk;
  sk.structured = true;
  sk.lens = {20000, 7001};
  check_skip(sk, blasst::SkipConfig::from_threshold(0.5).with_order(blasst::VisitOrder::natural), 0, 0.3);
  check_skip(sk, blasst::SkipConfig::from_threshold(0.5).with_order(blasst::VisitOrder::natural), 5, 0.3);
  blasst::SkipConfig seeded = blasst::SkipConfig::from_threshold(0.5).with_order(blasst::VisitOrder::max_first);
  check_skip(sk, seeded, 0, 0.3);
  sk.page = 32;
  sk.q_len = 4;
  sk.lens = {9000, 129, 3000};
  check_skip(sk, seeded, 3, 0.3);
}

// Max-first order in decode = seeded splits (SPEC §2a): every split starts from the scores of the
// sink and last tiles. Same skipped pairs as the reference with the reported layout (which the
// kernel reports even with a single split), also with forced splits, paged, q_len > 1, lambda >= 1
// for one sequence (its deltas still count against the seeds) and both m-tile families.
TEST(GpuDecode, SeededSplitsMatchReference) {
  SKIP_WITHOUT_GPU();
  // lambda: from the reference's one-pass curve of this data at 30 % (check_skip); the distance
  // from the dense output is bounded per row by the exact skipped mass share.
  constexpr double kTarget = 0.3;
  blasst::SkipConfig skip = blasst::SkipConfig::from_threshold(0.5).with_order(blasst::VisitOrder::natural);
  skip.vote.order = blasst::VisitOrder::max_first;
  for (int ql : {1, 4}) {
    Case c;
    c.structured = true;
    c.q_len = ql;
    c.lens = {20000};
    check_skip(c, skip, 0, kTarget);
    check_skip(c, skip, 7, kTarget);
    check_skip(c, skip, 1000, kTarget);  // one split: seeded too
    c.page = 32;
    c.lens = {9000, 129, 3000, 0};
    check_skip(c, skip, 5, kTarget);
  }
  blasst::SkipConfig f = blasst::SkipConfig::from_factor(1500.0).with_order(blasst::VisitOrder::natural);
  f.vote.order = blasst::VisitOrder::max_first;
  Case c;
  c.structured = true;
  c.hq = 32;
  c.hk = 8;
  c.lens = {70000, 1000, 33000};
  const auto per_seq = check_skip(c, f, 0, 0.0);
  ASSERT_EQ(per_seq.size(), 3u);
  EXPECT_EQ(per_seq[1], 0) << "lambda 1.5 >= 1: the 1000-key sequence runs dense";
  EXPECT_GT(per_seq[0] + per_seq[2], 0);
  c.dt = DType::f16;
  c.d = 64;
  c.hq = 16;
  c.hk = 2;
  c.q_len = 8;  // 64 rows vote together: lambda from this data's one-pass curve at 15 %
  c.lens = {12000};
  check_skip(c, f, 5, 0.15);
}

// The trained model's decode shape (bench/model, issue 15): Hq 8 / Hk 2, d 64, 8 query rows per
// step (32 rows vote together: the four-m-tile path, 32 of its 64 rows), causal, max-first with
// seeded splits of 16 tiles, a cache longer than the sequence. On the H200 (9167d4d) the model's teacher-forced decode loss
// was NaN with skipping at every L >= 4096 (two or more splits) and finite at 2048 (one split),
// while the CPU reference gave finite outputs on the same checkpoint.
TEST(GpuDecode, SeededSplitsTrainedModelShape) {
  SKIP_WITHOUT_GPU();
  blasst::SkipConfig skip = blasst::SkipConfig::from_threshold(0.5).with_order(blasst::VisitOrder::natural);
  skip.vote.order = blasst::VisitOrder::max_first;
  Case c;
  c.structured = true;
  c.hq = 8;
  c.hk = 2;
  c.d = 64;
  c.q_len = 8;
  c.lens = {4096, 3850, 6000};
  for (double target : {0.2, 0.5}) {
    check_skip(c, skip, 16, target);
    check_skip(c, skip, 0, target);
  }
  c.d = 128;
  check_skip(c, skip, 16, 0.3);

  // The model's call sequence: one cache of 4096 keys, seqlens growing by 8 per call (3848 ...
  // 4096), one fixed lambda: every output finite, and something skipped. lambda from the
  // reference's one-pass curve of these data at 50 % (the kernel's layout at seqlen 4096: 8 rows x
  // 4 heads vote, 16-tile seeded splits, max-first). A fixed lambda of 0.02 skipped nothing here on
  // the H200 (33f1f1b): 32 rows voting together on the structured data need a larger one.
  c.d = 64;
  c.lens = {4096};
  HostProblem hp(c, case_seed("model call sequence"));
  blasst::SkipConfig curve;  // disabled: dense, deltas recorded at the kernel's layout and order
  curve.vote.rows = c.q_len;
  curve.vote.heads = c.hq / c.hk;
  curve.vote.split_tiles = 16;
  curve.vote.order = blasst::VisitOrder::max_first;
  const double ln = blasst::test::ln_lambda_for(run_ref(hp, curve, true, true).stats.deltas, 0.5);
  ASSERT_TRUE(std::isfinite(ln)) << "no lambda < 1 reaches 50 % on these data";
  blasst::SkipConfig fixed = blasst::SkipConfig::from_threshold(std::exp(ln)).with_order(blasst::VisitOrder::natural);
  fixed.vote.order = blasst::VisitOrder::max_first;
  fixed.vote.split_tiles = 16;
  std::int64_t skipped = 0;
  for (int e = 3848; e <= 4096; e += 8) {
    hp.seqlens[0] = e;
    blasst::RunOptions opt;
    opt.collect_stats = true;
    const Result r = run_gpu(hp, fixed, opt);
    std::size_t nonfinite = 0;
    for (float x : r.out) nonfinite += std::isfinite(x) ? 0 : 1;
    EXPECT_EQ(nonfinite, 0u) << "seqlen " << e << ": " << nonfinite << " non-finite outputs of " << r.out.size()
                             << " (sparsity " << r.stats.sparsity() << ")";
    skipped += r.stats.total_skipped();
  }
  EXPECT_GT(skipped, 0) << "nothing skipped over the call sequence";
}

// A seeded split whose row sum l is subnormal (decode_epilogue.cuh): with max-first's seeded
// splits (SPEC §2a) a split's running max starts at the row's maximum over the seed tiles, which
// may lie in another split, so the split's l has no lower bound. Here query head 0 of KV group 0
// scores 28 * 28 / 8 = 98 nats (141.4 log2 units) on key 0 and 0 on every other key, and the other
// rows of its vote group score 0 everywhere (they keep every tile): split 1 (tiles 16-31) sums
// ~2048 * 2^-141.4 = 2^-130.4 for that row, below 2^-128, where 1 / l overflows to +inf; P rounded
// to bf16 is 0 there (below 2^-134), so O * (1 / l) = 0 * inf = NaN, and the merge's weight
// exp(LSE_1 - max) ~ 2^-130 does not cancel it. The four-m-tile partial (32 rows at q_len 8)
// multiplied by the reciprocal (NaN rows before the fix); one m-tile (q_len 1) divided already.
// The exact output of the row is V of key 0 (every other weight ~2^-141). (Host emulation of the
// arithmetic: NaN for gaps of ~139-160 log2 units with 2048 kept keys.)
TEST(GpuDecode, SeededSplitSubnormalRowSum) {
  SKIP_WITHOUT_GPU();
  for (int q_len : {8, 1}) {
    Case c;
    c.hq = 8;
    c.hk = 2;
    c.d = 64;
    c.q_len = q_len;
    c.lens = {4096};
    SCOPED_TRACE(describe(c));
    HostProblem hp(c, case_seed("seeded split subnormal row sum"));
    std::fill(hp.q.begin(), hp.q.end(), to_half(0.f, c.dt));
    std::fill(hp.k.begin(), hp.k.end(), to_half(0.f, c.dt));
    for (int t = 0; t < q_len; ++t) hp.q[(static_cast<std::size_t>(t) * c.hq + 0) * c.d + 0] = to_half(28.f, c.dt);
    hp.k[0] = to_half(28.f, c.dt);  // key 0, KV head 0, coordinate 0
    blasst::SkipConfig skip = blasst::SkipConfig::from_threshold(0.5).with_order(blasst::VisitOrder::natural);
    skip.vote.order = blasst::VisitOrder::max_first;
    skip.vote.split_tiles = 16;  // two splits; the sink's split 0, and split 1 far below the seed
    blasst::RunOptions opt;
    opt.collect_stats = true;
    const Result gpu = run_gpu(hp, skip, opt);
    EXPECT_EQ(gpu.stats.total_skipped(), 0) << "every tile is some row's maximum: nothing to skip";
    std::size_t nonfinite = 0;
    for (float x : gpu.out) nonfinite += std::isfinite(x) ? 0 : 1;
    EXPECT_EQ(nonfinite, 0u) << nonfinite << " non-finite outputs of " << gpu.out.size();
    // Row (t, head 0): V of key 0, head 0.
    for (int t = 0; t < q_len; ++t)
      for (int e = 0; e < c.d; ++e) {
        const float want = from_half(hp.v[static_cast<std::size_t>(e)], c.dt);
        EXPECT_NEAR(gpu.out[(static_cast<std::size_t>(t) * c.hq + 0) * c.d + e], want, 1e-2 * (1 + std::fabs(want)))
            << "token " << t << " column " << e;
      }
    blasst::SkipConfig rs = skip;
    rs.vote.rows = c.q_len;
    rs.vote.heads = c.hq / c.hk;
    rs.vote.tile_keys = 128;
    expect_close(gpu, run_ref(hp, rs, false), 1e-2, "seeded, subnormal l");
  }
}

// RunOptions::workspace: a caller-provided region of exactly decode_workspace_bytes gives the same
// outputs (bitwise) and statistics as the library's own pool; a region one byte short is an Error
// naming RunOptions::workspace, raised before the launch.
TEST(GpuDecode, CallerWorkspace) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.lens = {9000, 700};
  c.q_len = 2;
  c.page = 32;
  c.structured = true;
  const std::uint64_t seed = case_seed("workspace " + describe(c));
  SCOPED_TRACE("seed=" + std::to_string(seed));
  HostProblem hp(c, seed);
  // lambda from the reference's one-pass curve at the kernel's layout (8-tile natural splits) at 30 %.
  blasst::SkipConfig curve;
  curve.vote.rows = c.q_len;
  curve.vote.heads = c.hq / c.hk;
  curve.vote.split_tiles = 8;
  const double ln = blasst::test::ln_lambda_for(run_ref(hp, curve, true, true).stats.deltas, 0.3);
  ASSERT_TRUE(std::isfinite(ln)) << "no lambda < 1 reaches 30 % on these data";
  blasst::SkipConfig skip = blasst::SkipConfig::from_threshold(std::exp(ln)).with_order(blasst::VisitOrder::natural);
  skip.vote.split_tiles = 8;  // several splits: the partials live in the workspace
  blasst::RunOptions opt;
  opt.collect_histogram = true;
  std::vector<float> host_out(hp.out_elems()), host_lse(hp.lse_elems());
  auto host_problem = hp.problem(hp.q.data(), hp.k.data(), hp.v.data(), hp.page_table.data(), hp.seqlens.data(),
                                 host_out.data(), host_lse.data(), blasst::DeviceKind::cpu);
  blasst::RunOptions size_opt = opt;
  size_opt.device = blasst::DeviceKind::cuda;
  const std::size_t bytes = gpu_workspace_bytes(host_problem, skip, size_opt);
  ASSERT_GT(bytes, 0u);
  EXPECT_EQ(blasst::decode_workspace_bytes(host_problem, skip, blasst::RunOptions{}), 0u) << "the CPU reference";
  void* ws = nullptr;
  CK(cudaMalloc(&ws, bytes));
  CK(cudaMemset(ws, 0xff, bytes));  // garbage the kernels must not depend on
  const Result pool = run_gpu(hp, skip, opt);
  blasst::RunOptions given = opt;
  given.workspace = ws;
  given.workspace_bytes = bytes;
  const Result mine = run_gpu(hp, skip, given);
  EXPECT_EQ(std::memcmp(pool.out.data(), mine.out.data(), pool.out.size() * sizeof(float)), 0) << "outputs differ";
  EXPECT_EQ(std::memcmp(pool.lse.data(), mine.lse.data(), pool.lse.size() * sizeof(float)), 0) << "LSE differs";
  EXPECT_EQ(pool.stats.visited, mine.stats.visited);
  EXPECT_EQ(pool.stats.skipped, mine.stats.skipped);
  EXPECT_GT(mine.stats.total_skipped(), 0) << "nothing skipped: the statistics counters went unexercised";
  ASSERT_EQ(mine.stats.hist.size(), pool.stats.hist.size());
  for (std::size_t h = 0; h < pool.stats.hist.size(); ++h) EXPECT_EQ(pool.stats.hist[h].counts, mine.stats.hist[h].counts);
  blasst::RunOptions short_opt = size_opt;
  short_opt.workspace = ws;
  short_opt.workspace_bytes = bytes - 1;
  try {
    blasst::SkipStats st;  // the statistics counters are part of the size
    gpu_decode(host_problem, skip, short_opt, &st);
    ADD_FAILURE() << "a workspace one byte short was accepted";
  } catch (const blasst::Error& e) {
    EXPECT_NE(std::string(e.what()).find("RunOptions::workspace"), std::string::npos) << e.what();
  }
  cudaFree(ws);
}

// Ordinary caches load through tensor maps, not the cp.async fallback: a tensor map the driver
// refuses makes the call fall back silently (same results, slower), so only this says which path
// ran. Every dtype, head dim, contiguous and paged (16, 64, 128 keys a page), both instance
// families; device buffers (the maps encode their addresses).
TEST(GpuDecode, OrdinaryCachesLoadThroughTensorMaps) {
  SKIP_WITHOUT_GPU();
  using blasst::sm90::decode::Warps;
  for (DType dt : {DType::bf16, DType::f16}) {
    for (int d : {64, 128}) {
      for (int page : {0, 16, 64, 128}) {
        Case c;
        c.dt = dt;
        c.d = d;
        c.page = page;
        c.lens = {300, 1000};
        SCOPED_TRACE(describe(c));
        HostProblem hp(c, 7);
        void* dq = device_copy(hp.q.data(), hp.q.size() * 2);
        void* dk = device_copy(hp.k.data(), hp.k.size() * 2);
        void* dv = device_copy(hp.v.data(), hp.v.size() * 2);
        void* dsl = device_copy(hp.seqlens.data(), hp.seqlens.size() * 4);
        void* dpt = page ? device_copy(hp.page_table.data(), hp.page_table.size() * 4) : nullptr;
        void* dout = device_copy(nullptr, hp.out_elems() * 4);
        auto p = hp.problem(dq, dk, dv, static_cast<std::int32_t*>(dpt), static_cast<std::int32_t*>(dsl), dout,
                            nullptr, blasst::DeviceKind::cuda);
        for (Warps w : {Warps::eight, Warps::four})
          EXPECT_TRUE(blasst::sm90::decode::tensor_map_loads(p, {}, w))
              << (w == Warps::four ? "4" : "8") << "-warp instance: the call would load by cp.async";
        for (void* x : {dq, dk, dv, dsl, dpt, dout})
          if (x) cudaFree(x);
      }
    }
  }
}

// The merge runs in the split kernel: a CTA that finds every split flag of its (sequence, KV head)
// raised merges (decode_merge.cuh); the flags live in the workspace, which nothing zeroes. So: a
// caller's workspace of 0xff garbage, the same workspace again in a second call, and CUDA-graph
// replays (same epoch, same flags; with the caller's workspace and with the pool's graph memory)
// must each give the eager call's outputs bit for bit (the merge's order is the splits' order,
// whichever CTA runs it), with out and lse poisoned before every run. The replays alternate two
// queries, so a merge of stale partials (flags left raised by the replay before) shows, and after
// every run on the caller's workspace its flags are read back: all lowered (a flag left raised
// is otherwise hidden when the last merge lands last). Ragged lengths leave empty splits (past a
// sequence's end), which raise flags too.
TEST(GpuDecode, InKernelMergeAcrossCallsAndGraphReplays) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.lens = {9000, 700, 1};
  c.q_len = 2;
  const std::uint64_t seed = case_seed("in-kernel merge " + describe(c));
  SCOPED_TRACE("seed=" + std::to_string(seed));
  HostProblem hp(c, seed);
  blasst::SkipConfig skip;
  skip.vote.split_tiles = 4;  // 18 splits for the long sequence, empty ones for the others
  const Result ref = run_ref(hp, skip, false);
  HostProblem hp_b = hp;  // the second query: the first one's elements in reverse order
  std::reverse(hp_b.q.begin(), hp_b.q.end());
  const Result ref_b = run_ref(hp_b, skip, false);

  void* dq = device_copy(hp.q.data(), hp.q.size() * 2);
  void* dk = device_copy(hp.k.data(), hp.k.size() * 2);
  void* dv = device_copy(hp.v.data(), hp.v.size() * 2);
  void* dsl = device_copy(hp.seqlens.data(), hp.seqlens.size() * 4);
  const std::size_t out_bytes = hp.out_elems() * 4, lse_bytes = hp.lse_elems() * 4;
  void* dout = device_copy(nullptr, out_bytes);
  void* dlse = device_copy(nullptr, lse_bytes);
  auto p = hp.problem(dq, dk, dv, nullptr, static_cast<std::int32_t*>(dsl), dout, dlse, blasst::DeviceKind::cuda);
  cudaStream_t stream = nullptr;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  blasst::RunOptions pool_opt;
  pool_opt.stream = stream;
  const std::size_t ws_bytes = gpu_workspace_bytes(p, skip, pool_opt);
  void* ws = device_copy(nullptr, ws_bytes);
  CK(cudaMemset(ws, 0xff, ws_bytes));  // garbage: every flag all ones
  blasst::RunOptions given = pool_opt;
  given.workspace = ws;
  given.workspace_bytes = ws_bytes;

  auto poison = [&] {
    EXPECT_EQ(cudaMemsetAsync(dout, 0xff, out_bytes, stream), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(dlse, 0xff, lse_bytes, stream), cudaSuccess);
  };
  auto fetch = [&] {
    Result r;
    r.out.resize(hp.out_elems());
    r.lse.resize(hp.lse_elems());
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(r.out.data(), dout, out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(r.lse.data(), dlse, lse_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return r;
  };
  auto same = [](const Result& a, const Result& b, const std::string& what) {
    EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4), 0) << what << ": outputs differ";
    EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4), 0) << what << ": LSE differs";
  };

  const auto region = blasst::sm90::decode::split_flags_region(p, skip, test_warps());
  ASSERT_GT(region.bytes, 0u) << "one split: no flags under test";
  ASSERT_LE(region.offset + region.bytes, ws_bytes);
  auto flags_lowered = [&](const std::string& what) {
    std::vector<unsigned long long> f(region.bytes / sizeof(unsigned long long));
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(f.data(), static_cast<unsigned char*>(ws) + region.offset, region.bytes,
                         cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::count(f.begin(), f.end(), 0ull), static_cast<std::ptrdiff_t>(f.size()))
        << what << ": split flags left raised after the call";
  };
  auto set_q = [&](const HostProblem& h) {
    EXPECT_EQ(cudaMemcpyAsync(dq, h.q.data(), h.q.size() * 2, cudaMemcpyHostToDevice, stream), cudaSuccess);
  };

  poison();
  gpu_decode(p, skip, given);
  const Result first = fetch();
  expect_close(first, ref, 2e-2, "first call, garbage workspace");
  flags_lowered("first call, garbage workspace");
  set_q(hp_b);
  poison();
  gpu_decode(p, skip, given);
  const Result first_b = fetch();
  expect_close(first_b, ref_b, 2e-2, "second call (second query), same workspace");
  set_q(hp);
  poison();
  gpu_decode(p, skip, given);
  same(fetch(), first, "third call, same workspace");
  flags_lowered("third call");

  for (const blasst::RunOptions* opt : {&given, &pool_opt}) {
    const std::string what = opt == &given ? "graph replay, caller's workspace" : "graph replay, pool";
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    gpu_decode(p, skip, *opt);
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 4; ++rep) {
      set_q(rep % 2 == 0 ? hp_b : hp);
      poison();
      CK(cudaGraphLaunch(exec, stream));
      same(fetch(), rep % 2 == 0 ? first_b : first, what + " " + std::to_string(rep));
      if (opt == &given) flags_lowered(what + " " + std::to_string(rep));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  CK(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  for (void* x : {dq, dk, dv, dsl, dout, dlse, ws}) cudaFree(x);
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
    expect_error(p, {}, "supports bf16 or f16, got f32");
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
    blasst::SkipConfig s = blasst::SkipConfig::from_threshold(0.01).with_order(blasst::VisitOrder::natural);
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
  check_skip(c, blasst::SkipConfig::from_threshold(0.5).with_order(blasst::VisitOrder::natural), 4, 0.3);
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
  check_skip(c, blasst::SkipConfig::from_threshold(0.5).with_order(blasst::VisitOrder::natural), 4, 0.3);
  blasst::SkipConfig s = blasst::SkipConfig::from_threshold(0.5).with_order(blasst::VisitOrder::natural);
  s.vote.order = blasst::VisitOrder::max_first;
  c.q_len = 1;
  // Seeded splits: lambda from this data's one-pass curve at 30 %, as everywhere in check_skip.
  check_skip(c, s, 4, 0.3);
}

}  // namespace
