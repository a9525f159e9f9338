// GPU backward (SPEC §9, src/cuda/sm90/backward/) against blasst::reference::attention_backward.
//
// Data: q, k, v, dO drawn from fixed printed seeds and rounded to the kernel's 16-bit dtype; the
// forward runs on the reference (float64, recording the skip set), its O rounded to out's dtype
// and its LSE to float32. The reference backward then gets exactly those values as float64
// (the 16-bit values are exact there), so the expected gradient is the exact gradient of the same
// inputs and the comparison measures the kernel's own rounding only.
//
// Tolerance (stated once, used everywhere). The kernel rounds P and dS to the 16-bit input type
// (unit roundoff u: 2^-8 bf16, 2^-11 f16) before the dV = P^T dO, dK = dS^T Q, dQ = dS K
// products, and accumulates every sum in float32. Each product term then carries a relative error
// of at most u (rounding of P or dS; q, k, v, dO, O, LSE are the same values on both sides), so
// an output element's error is a sum of terms |t| * delta with |delta| <= u: at most u * sum|t|,
// and for the unbiased round-to-nearest errors of these random-sign terms about u / sqrt(3) times
// the element's own scale. float32 accumulation of n terms adds at most n * 2^-24 relative to
// sum|t| (the scores and dP: d terms; D: d terms; the GEMMs: up to max(g Lq, Lk) terms). Hence
//   tol = 4 u + 2 * n * 2^-24,   n = max(g * Lq, Lk, d),
// a factor 4 over the per-element statistical bound for the maximum over many elements.
// Checks: (1) max |got - want| <= tol * max |want| + floor per tensor; (2) per element, looser but
// local: |got - want| <= 16 u |want| + 2 tol * (max |want| over its row of d values)
// + tol / 4 * max |want| + floor, which catches a wrong block in a row whose gradients are small
// next to the tensor's largest. floor = d 2^-24 scale max|dO| max|v| max(|q|, |k|) covers the
// float32 rounding of dP - D where the exact value cancels to 0 (expect_close).
// Outputs are filled with NaN before every call: an element the kernel does not write fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/half.hpp"
#include "cuda/cuda_dispatch.hpp"
#include "cuda/sm90/backward/backward_params.hpp"
#include "gpu_common.hpp"

#ifdef BLASST_TEST_CUDA_RUNTIME  // CUDA builds: device tensors through the CUDA runtime
#include <cuda_runtime.h>

#include "cuda/sm90/backward/backward_work_list.hpp"  // the work list, launched by its own test
#endif

namespace blasst::test {
namespace {

#define REQUIRE_GPU() BLASST_GPU_OR_SKIP("the sm_90a backward kernel needs a Hopper device")

using i64 = std::int64_t;
using SkipSet = ::blasst::SkipSet;  // not gpu_common.hpp's classification of that name

struct Case {
  i64 B = 1, Lq = 64, Lk = 64, hq = 2, hk = 1, d = 64;
  std::vector<i64> lq, lk;  // ragged (cu_seqlens) when not empty
  bool causal = false;
  DType dtype = DType::bf16;    // q, k, v
  DType io_dtype = DType::bf16; // out and dout: q's dtype or f32
  DType grad_dtype = DType::bf16;  // dq, dk, dv: q's dtype or f32
  bool dlse = false;
  // Structured scores (a sink tile and per-tile biases, see make_data) so that skipping happens.
  bool structured = true;

  bool ragged() const { return !lq.empty(); }
  i64 nseq() const { return ragged() ? i64(lq.size()) : B; }
  i64 len_q(i64 b) const { return ragged() ? lq[std::size_t(b)] : Lq; }
  i64 len_k(i64 b) const { return ragged() ? lk[std::size_t(b)] : Lk; }
  i64 start_q(i64 b) const {
    i64 s = 0;
    for (i64 x = 0; x < b; ++x) s += len_q(x);
    return s;
  }
  i64 start_k(i64 b) const {
    i64 s = 0;
    for (i64 x = 0; x < b; ++x) s += len_k(x);
    return s;
  }
  i64 tq() const { return ragged() ? start_q(nseq()) : B * Lq; }
  i64 tk() const { return ragged() ? start_k(nseq()) : B * Lk; }
  i64 max_q() const {
    i64 m = 0;
    for (i64 b = 0; b < nseq(); ++b) m = std::max(m, len_q(b));
    return m;
  }
  i64 max_k() const {
    i64 m = 0;
    for (i64 b = 0; b < nseq(); ++b) m = std::max(m, len_k(b));
    return m;
  }
  std::string name() const {
    std::string s = std::string(to_string(dtype)) + " d" + std::to_string(d) + " hq" + std::to_string(hq) + ":" +
                    std::to_string(hk) + (causal ? " causal" : " full");
    if (ragged()) {
      s += " ragged q{";
      for (i64 x : lq) s += std::to_string(x) + ",";
      s += "} k{";
      for (i64 x : lk) s += std::to_string(x) + ",";
      s += "}";
    } else {
      s += " B" + std::to_string(B) + " Lq" + std::to_string(Lq) + " Lk" + std::to_string(Lk);
    }
    if (io_dtype == DType::f32) s += " out/dout f32";
    if (grad_dtype == DType::f32) s += " grads f32";
    if (dlse) s += " dlse";
    return s;
  }
  // Element offset of (sequence b, position i, head h, column 0) in a q-like or k-like tensor.
  i64 q_row(i64 b, i64 i, i64 h, i64 heads) const { return ((start_q_tok(b) + i) * heads + h) * d; }
  i64 k_row(i64 b, i64 j, i64 h) const { return ((start_k_tok(b) + j) * hk + h) * d; }
  i64 start_q_tok(i64 b) const { return ragged() ? start_q(b) : b * Lq; }
  i64 start_k_tok(i64 b) const { return ragged() ? start_k(b) : b * Lk; }
  // Offset of (b, h, i) in an lse-like tensor: [B, H, Lq] or [H, Tq].
  i64 lse_at(i64 b, i64 h, i64 i) const { return ragged() ? h * tq() + start_q(b) + i : (b * hq + h) * Lq + i; }
};

double round_to(DType t, double x) {
  switch (t) {
    case DType::bf16: return double(bf16_to_float(float_to_bf16(float(x))));
    case DType::f16: return double(f16_to_float(float_to_f16(float(x))));
    case DType::f32: return double(float(x));
    case DType::f64: return x;
  }
  return x;
}

double unit_u(DType t) { return unit_roundoff(t); }

// Host storage of one tensor in a given dtype (16-bit as raw bits).
struct Buffer {
  DType dtype = DType::f32;
  std::vector<std::uint16_t> h;
  std::vector<float> f;
  std::vector<double> g;
  void assign(DType t, const std::vector<double>& x) {
    dtype = t;
    h.clear();
    f.clear();
    g.clear();
    if (t == DType::bf16 || t == DType::f16) {
      h.resize(x.size());
      for (std::size_t i = 0; i < x.size(); ++i)
        h[i] = t == DType::bf16 ? float_to_bf16(float(x[i])) : float_to_f16(float(x[i]));
    } else if (t == DType::f32) {
      f.assign(x.begin(), x.end());
    } else {
      g = x;
    }
  }
  void poison(DType t, std::size_t n) {
    dtype = t;
    h.clear();
    f.clear();
    g.clear();
    if (t == DType::bf16) h.assign(n, 0x7fc0);
    else if (t == DType::f16) h.assign(n, 0x7e00);
    else if (t == DType::f32) f.assign(n, std::numeric_limits<float>::quiet_NaN());
    else g.assign(n, std::numeric_limits<double>::quiet_NaN());
  }
  void* data() {
    if (!h.empty()) return h.data();
    if (!f.empty()) return f.data();
    return g.data();
  }
  std::vector<double> values() const {
    std::vector<double> x;
    if (dtype == DType::bf16) for (auto v : h) x.push_back(bf16_to_float(v));
    else if (dtype == DType::f16) for (auto v : h) x.push_back(f16_to_float(v));
    else if (dtype == DType::f32) x.assign(f.begin(), f.end());
    else x = g;
    return x;
  }
};

// A [B, L, H, x] (batched) or [T, H, x] (ragged) tensor over `data`.
Tensor rows_tensor(const Case& c, void* data, DType t, i64 len, i64 tokens, i64 heads, i64 x) {
  if (c.ragged()) return Tensor::contiguous(data, t, {tokens, heads, x});
  return Tensor::contiguous(data, t, {c.B, len, heads, x});
}
Tensor lse_tensor(const Case& c, void* data, DType t) {
  if (c.ragged()) return Tensor::contiguous(data, t, {c.hq, c.tq()});
  return Tensor::contiguous(data, t, {c.B, c.hq, c.Lq});
}

struct Data {
  std::vector<double> q, k, v, dout, dlse;  // exact 16-bit (dout: io dtype) values
  std::vector<double> out, lse;             // forward results as the kernel receives them
  std::vector<std::int32_t> cu_q, cu_k;
  SkipSet set;      // recorded by the forward (all kept when dense)
  SkipStats stats;  // the forward's visited / skipped pairs
};

SkipConfig vote_cfg() {
  SkipConfig cfg;
  cfg.vote.rows = 64;
  cfg.vote.heads = 1;
  cfg.vote.tile_keys = 128;
  cfg.vote.order = VisitOrder::natural;
  return cfg;
}

// Random normal q, k, v, dO (and dLSE); structured: column 0 of every query is A and column 0 of
// key j is beta of its tile (8 for the sink tile 0, a random integer 0..8 elsewhere), adding
// A * beta * scale (about 1.25 beta nats) to the scores, so tiles differ by up to 10 nats and the
// forward's vote skips a part of them. All values rounded to the kernel's dtypes.
// A ragged case's cu_seqlens of its queries (keys: of its keys): 0, then the running sums of the
// sequences' lengths; empty for a batched case.
std::vector<std::int32_t> cu_seqlens(const Case& c, bool keys) {
  std::vector<std::int32_t> cu;
  if (!c.ragged()) return cu;
  cu.push_back(0);
  for (i64 b = 0; b < c.nseq(); ++b) cu.push_back(std::int32_t(cu.back() + (keys ? c.len_k(b) : c.len_q(b))));
  return cu;
}

Data make_data(const Case& c, std::uint64_t seed, const SkipConfig& fwd_skip) {
  Data in;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_int_distribution<int> beta_d(0, 8);
  const i64 tq = c.tq(), tk = c.tk();
  in.q.resize(std::size_t(tq * c.hq * c.d));
  in.k.resize(std::size_t(tk * c.hk * c.d));
  in.v.resize(std::size_t(tk * c.hk * c.d));
  in.dout.resize(std::size_t(tq * c.hq * c.d));
  for (auto& x : in.q) x = round_to(c.dtype, nd(rng));
  for (auto& x : in.k) x = round_to(c.dtype, nd(rng));
  for (auto& x : in.v) x = round_to(c.dtype, nd(rng));
  for (auto& x : in.dout) x = round_to(c.dtype, nd(rng));  // exact in io_dtype too
  if (c.structured) {
    const double A = std::round(1.25 * std::sqrt(double(c.d)));
    for (i64 t = 0; t < tq; ++t)
      for (i64 h = 0; h < c.hq; ++h) in.q[std::size_t((t * c.hq + h) * c.d)] = A;
    for (i64 b = 0; b < c.nseq(); ++b)
      for (i64 h = 0; h < c.hk; ++h) {
        std::vector<double> beta(std::size_t((c.len_k(b) + 127) / 128 + 1));
        for (std::size_t t = 0; t < beta.size(); ++t) beta[t] = t == 0 ? 8.0 : double(beta_d(rng));
        for (i64 j = 0; j < c.len_k(b); ++j) in.k[std::size_t(c.k_row(b, j, h))] = beta[std::size_t(j / 128)];
      }
  }
  if (c.dlse) {
    in.dlse.resize(std::size_t(tq * c.hq));
    for (auto& x : in.dlse) x = double(float(0.5 * nd(rng)));
  }
  in.cu_q = cu_seqlens(c, false);
  in.cu_k = cu_seqlens(c, true);
  // Forward on the reference in float64, recording the skip set.
  std::vector<double> out(in.dout.size()), lse(std::size_t(tq * c.hq));
  AttentionProblem p;
  p.q = rows_tensor(c, in.q.data(), DType::f64, c.Lq, tq, c.hq, c.d);
  p.k = rows_tensor(c, in.k.data(), DType::f64, c.Lk, tk, c.hk, c.d);
  p.v = rows_tensor(c, in.v.data(), DType::f64, c.Lk, tk, c.hk, c.d);
  p.out = rows_tensor(c, out.data(), DType::f64, c.Lq, tq, c.hq, c.d);
  p.lse = lse_tensor(c, lse.data(), DType::f64);
  p.mask = c.causal ? MaskKind::causal : MaskKind::full;
  if (c.ragged()) {
    p.cu_seqlens_q = in.cu_q.data();
    p.cu_seqlens_k = in.cu_k.data();
    p.batch = c.nseq();
  }
  RunOptions opt;
  opt.fp64 = true;
  opt.collect_stats = true;
  reference::attention(p, fwd_skip, opt, &in.stats, &in.set);
  in.out.resize(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) in.out[i] = round_to(c.io_dtype, out[i]);
  in.lse.resize(lse.size());
  for (std::size_t i = 0; i < lse.size(); ++i) in.lse[i] = double(float(lse[i]));
  return in;
}

struct Grads {
  std::vector<double> dq, dk, dv;
};

// The backward problem over host buffers of the given dtypes.
struct Call {
  Buffer q, k, v, out, dout, lse, dlse, dq, dk, dv;
  AttentionBackwardProblem p;
  Call(const Case& c, Data& in, DType in_t, DType io_t, DType grad_t, DType lse_t) {
    q.assign(in_t, in.q);
    k.assign(in_t, in.k);
    v.assign(in_t, in.v);
    out.assign(io_t, in.out);
    dout.assign(io_t, in.dout);
    lse.assign(lse_t, in.lse);
    dq.poison(grad_t, in.q.size());
    dk.poison(grad_t, in.k.size());
    dv.poison(grad_t, in.v.size());
    const i64 tq = c.tq(), tk = c.tk();
    p.q = rows_tensor(c, q.data(), in_t, c.Lq, tq, c.hq, c.d);
    p.k = rows_tensor(c, k.data(), in_t, c.Lk, tk, c.hk, c.d);
    p.v = rows_tensor(c, v.data(), in_t, c.Lk, tk, c.hk, c.d);
    p.out = rows_tensor(c, out.data(), io_t, c.Lq, tq, c.hq, c.d);
    p.dout = rows_tensor(c, dout.data(), io_t, c.Lq, tq, c.hq, c.d);
    p.lse = lse_tensor(c, lse.data(), lse_t);
    if (c.dlse) {
      dlse.assign(lse_t, in.dlse);
      p.dlse = lse_tensor(c, dlse.data(), lse_t);
    }
    p.dq = rows_tensor(c, dq.data(), grad_t, c.Lq, tq, c.hq, c.d);
    p.dk = rows_tensor(c, dk.data(), grad_t, c.Lk, tk, c.hk, c.d);
    p.dv = rows_tensor(c, dv.data(), grad_t, c.Lk, tk, c.hk, c.d);
    p.mask = c.causal ? MaskKind::causal : MaskKind::full;
    if (c.ragged()) {
      p.cu_seqlens_q = in.cu_q.data();
      p.cu_seqlens_k = in.cu_k.data();
      p.batch = c.nseq();
    }
  }
  Grads grads() const { return {dq.values(), dk.values(), dv.values()}; }
};

// Both main kernels run every comparison below: mma_sync (the library's default) and wgmma (TMA +
// wgmma, warp-specialised), through the same host layer (detail::cuda_attention_backward_on).
constexpr sm90::BackwardKernel kKernels[] = {sm90::BackwardKernel::mma_sync, sm90::BackwardKernel::wgmma};
// (A local name: sm90::to_string is in the CUDA part of the library, and this suite also builds
// without it.)
const char* kernel_name(sm90::BackwardKernel k) { return k == sm90::BackwardKernel::wgmma ? "wgmma" : "mma_sync"; }

Grads run_gpu(const Case& c, Data& in, const SkipConfig& cfg, const SkipSet* set, sm90::BackwardKernel kernel) {
  Call call(c, in, c.dtype, c.io_dtype, c.grad_dtype, DType::f32);
  RunOptions opt;
  opt.device = DeviceKind::cuda;  // host tensors, staged through device memory
  detail::cuda_attention_backward_on(call.p, cfg, opt, set, kernel);
  return call.grads();
}

Grads run_ref(const Case& c, Data& in, const SkipConfig& cfg, const SkipSet* set) {
  Call call(c, in, DType::f64, DType::f64, DType::f64, DType::f64);
  reference::attention_backward(call.p, cfg, RunOptions{}, set);
  return call.grads();
}

double tolerance(const Case& c) {
  const double n = double(std::max({c.hq / c.hk * c.max_q(), c.max_k(), c.d}));
  return 4 * unit_u(c.dtype) + 2 * n * 0x1p-24;
}

// max |got - want| / max |want| (NaN or inf in got: +inf). 0 when both are all zero.
double rel_max_err(const std::vector<double>& got, const std::vector<double>& want) {
  double e = 0, m = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(got[i] - want[i]);
    e = std::isfinite(got[i]) ? std::max(e, d) : INFINITY;
    m = std::max(m, std::abs(want[i]));
  }
  if (e == 0) return 0;
  return m > 0 ? e / m : INFINITY;
}

// floor: an absolute term for float32 accumulation where the exact gradient cancels to (nearly)
// zero, which no relative bound covers: with one visible key per row (L = 1, a causal row 0),
// dP_ij - D_i = dO_i . (v_j - O_i) is exactly 0, while the kernel's float32 dP and D (d terms each,
// summed in different orders) leave ~sqrt(d) 2^-24 |dO| |v| of it, times P, scale and |k| or |q|.
// See expect_grads: d 2^-24 scale max|dO| max|v| max(|q|, |k|), sqrt(d) above that estimate.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, i64 d, double u, double tol,
                  double floor, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double m = 0, e = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    m = std::max(m, std::abs(want[i]));
    e = std::isfinite(got[i]) ? std::max(e, std::abs(got[i] - want[i])) : INFINITY;
  }
  EXPECT_LE(e, tol * m + floor) << what << ": max error " << e << " (max|want| = " << m << ", tol " << tol
                                << ", floor " << floor << ")";
  std::size_t bad = 0, first = want.size();
  for (std::size_t r = 0; r < want.size(); r += std::size_t(d)) {
    double rowmax = 0;
    for (i64 c = 0; c < d; ++c) rowmax = std::max(rowmax, std::abs(want[r + std::size_t(c)]));
    for (i64 c = 0; c < d; ++c) {
      const std::size_t i = r + std::size_t(c);
      const double lim = 16 * u * std::abs(want[i]) + 2 * tol * rowmax + 0.25 * tol * m + floor;
      if (!(std::abs(got[i] - want[i]) <= lim)) {
        if (bad++ == 0) first = i;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements outside the per-element bound; first at " << first
                     << " (row " << first / std::size_t(d) << "): got "
                     << (first < got.size() ? got[first] : 0.0) << ", want " << (first < want.size() ? want[first] : 0.0);
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::abs(v));
  return m;
}

void expect_grads(const Case& c, const Data& in, const Grads& g, const Grads& r) {
  const double u = unit_u(c.dtype), tol = tolerance(c);
  const double scale = 1.0 / std::sqrt(double(c.d));
  const double floor = double(c.d) * 0x1p-24 * scale * max_abs(in.dout) * max_abs(in.v) *
                       std::max(max_abs(in.q), max_abs(in.k));
  expect_close(g.dq, r.dq, c.d, u, tol, floor, "dq");
  expect_close(g.dk, r.dk, c.d, u, tol, floor, "dk");
  expect_close(g.dv, r.dv, c.d, u, tol, floor, "dv");
}

void check_dense(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE(c.name() + " dense seed " + std::to_string(seed));
  Data in = make_data(c, seed, SkipConfig{});
  const Grads r = run_ref(c, in, SkipConfig{}, nullptr);
  for (const auto kernel : kKernels) {
    SCOPED_TRACE(std::string("kernel ") + kernel_name(kernel));
    expect_grads(c, in, run_gpu(c, in, SkipConfig{}, nullptr, kernel), r);
  }
}

// The forward skips with lambda = exp(-2): a tile whose bias lies 2 nats or more below the sink's
// (beta <= 6: 7 of 9 non-sink tiles, give or take the noise). The recorded set must be neither
// empty nor full (the sink tile, visited first, is never skipped), and the kernel, given it, must
// match the reference given it.
void check_skip(const Case& c, std::uint64_t seed, double lambda = std::exp(-2.0)) {
  SCOPED_TRACE(c.name() + " skip seed " + std::to_string(seed));
  SkipConfig cfg = SkipConfig::from_threshold(lambda);
  cfg.vote = vote_cfg().vote;
  Data in = make_data(c, seed, cfg);
  const i64 skipped = in.set.count();
  ASSERT_EQ(skipped, in.stats.total_skipped()) << "the recorded set and the forward's statistics disagree";
  ASSERT_GT(skipped, 0) << "nothing skipped: the data does not exercise the skip set";
  ASSERT_LT(skipped, in.stats.total_visited()) << "everything skipped";
  std::printf("[skip] %s: %lld of %lld visited pairs skipped\n", c.name().c_str(), (long long)skipped,
              (long long)in.stats.total_visited());
  const Grads r = run_ref(c, in, cfg, &in.set);
  for (const auto kernel : kKernels) {
    SCOPED_TRACE(std::string("kernel ") + kernel_name(kernel));
    expect_grads(c, in, run_gpu(c, in, cfg, &in.set, kernel), r);
  }
}

std::uint64_t seed_for(int i) { return test_seed(std::uint64_t(1400 + i)); }

TEST(GpuBackward, DenseLengthsFullAndCausal) {
  REQUIRE_GPU();
  int i = 0;
  for (i64 L : {1, 17, 1000, 4097}) {
    for (bool causal : {false, true}) {
      Case c;
      c.Lq = c.Lk = L;
      c.hq = 2;
      c.hk = L > 2000 ? 2 : 1;  // two reference work units at L = 4097 (it threads over KV heads)
      c.d = L > 2000 ? 64 : (i % 2 ? 64 : 128);
      c.causal = causal;
      check_dense(c, seed_for(i++));
    }
  }
}

TEST(GpuBackward, UnequalLengths) {
  REQUIRE_GPU();
  int i = 20;
  // Lq < Lk (bottom-right causal), Lq > Lk (leading rows see nothing: zero gradient), one row, one key.
  for (auto [lq, lk] : {std::pair<i64, i64>{100, 300}, {129, 1000}, {300, 100}, {1, 513}, {200, 1}, {1000, 257}}) {
    for (bool causal : {true, false}) {
      Case c;
      c.Lq = lq;
      c.Lk = lk;
      c.causal = causal;
      c.d = i % 2 ? 64 : 128;
      check_dense(c, seed_for(i++));
    }
  }
}

TEST(GpuBackward, GroupedQueryHeads) {
  REQUIRE_GPU();
  int i = 40;
  for (auto [hq, hk] : {std::pair<i64, i64>{4, 4}, {8, 2}, {8, 1}}) {  // MHA, GQA 8:2, MQA
    for (bool causal : {false, true}) {
      Case c;
      c.Lq = c.Lk = 300;
      c.hq = hq;
      c.hk = hk;
      c.causal = causal;
      check_dense(c, seed_for(i++));
    }
  }
}

TEST(GpuBackward, RaggedBatch) {
  REQUIRE_GPU();
  int i = 60;
  for (bool causal : {false, true}) {
    for (i64 d : {64, 128}) {
      Case c;
      c.lq = {70, 200, 1, 260, 0};
      c.lk = {300, 130, 64, 400, 50};
      c.hq = 8;
      c.hk = 2;
      c.d = d;
      c.causal = causal;
      check_dense(c, seed_for(i++));
    }
  }
}

TEST(GpuBackward, BatchHeadDimsAndDtypes) {
  REQUIRE_GPU();
  int i = 80;
  for (DType t : {DType::bf16, DType::f16})
    for (i64 d : {64, 128}) {
      Case c;
      c.B = 3;
      c.Lq = 257;
      c.Lk = 383;
      c.hq = 4;
      c.hk = 2;
      c.d = d;
      c.dtype = c.io_dtype = c.grad_dtype = t;
      c.causal = i % 2;
      check_dense(c, seed_for(i++));
    }
}

TEST(GpuBackward, Float32OutputsInputsAndDlse) {
  REQUIRE_GPU();
  int i = 100;
  for (DType t : {DType::bf16, DType::f16}) {
    Case c;
    c.Lq = c.Lk = 500;
    c.hq = 4;
    c.hk = 2;
    c.dtype = t;
    c.io_dtype = t;
    c.grad_dtype = DType::f32;
    c.causal = true;
    check_dense(c, seed_for(i++));
    c.io_dtype = DType::f32;  // out and dout in f32 (dO is rounded to q's dtype for the GEMMs: exact here)
    check_dense(c, seed_for(i++));
    c.dlse = true;
    c.io_dtype = t;
    check_dense(c, seed_for(i++));
  }
}

TEST(GpuBackward, SkipSetMatchesReference) {
  REQUIRE_GPU();
  int i = 120;
  {
    Case c;
    c.Lq = c.Lk = 1000;
    c.causal = false;
    check_skip(c, seed_for(i++));
    c.causal = true;
    c.d = 128;
    check_skip(c, seed_for(i++));
  }
  {
    Case c;  // GQA 8:2, unequal lengths, f16
    c.Lq = 700;
    c.Lk = 1300;
    c.hq = 8;
    c.hk = 2;
    c.dtype = c.io_dtype = c.grad_dtype = DType::f16;
    for (bool causal : {false, true}) {
      c.causal = causal;
      check_skip(c, seed_for(i++));
    }
  }
  {
    Case c;  // ragged, GQA, dlse, f32 gradients
    c.lq = {300, 64, 900};
    c.lk = {700, 1000, 900};
    c.hq = 4;
    c.hk = 2;
    c.d = 128;
    c.dlse = true;
    c.grad_dtype = DType::f32;
    for (bool causal : {false, true}) {
      c.causal = causal;
      check_skip(c, seed_for(i++));
    }
  }
  {
    Case c;  // long: 4097, the last tile one key wide
    c.Lq = c.Lk = 4097;
    c.hq = c.hk = 2;
    c.causal = true;
    check_skip(c, seed_for(i++));
  }
}

// A wrong set (one kept pair of the sink tile flipped to skipped) must make the kernel disagree
// with the reference given the correct set: the skip set really is read, pair by pair.
TEST(GpuBackward, WrongSkipSetDisagrees) {
  REQUIRE_GPU();
  Case c;  // 4 vote groups x 2 tiles: the flipped pair is a quarter of the sink tile's rows
  c.Lq = c.Lk = 256;
  c.hq = 1;
  c.hk = 1;
  const std::uint64_t seed = seed_for(140);
  SCOPED_TRACE(c.name() + " seed " + std::to_string(seed));
  SkipConfig cfg = SkipConfig::from_threshold(std::exp(-2.0));
  cfg.vote = vote_cfg().vote;
  Data in = make_data(c, seed, cfg);
  // (sequence 0, head 0, vote group 2, tile 0): the sink tile, visited first, never skipped.
  ASSERT_FALSE(in.set.skipped(0, 0, 2, 0));
  SkipSet wrong = in.set;
  wrong.set(0, 0, 2, 0);
  const Grads r = run_ref(c, in, cfg, &in.set);
  const Grads r_wrong = run_ref(c, in, cfg, &wrong);
  const double tol = tolerance(c);
  for (const auto kernel : kKernels) {
    SCOPED_TRACE(std::string("kernel ") + kernel_name(kernel));
    const Grads g_right = run_gpu(c, in, cfg, &in.set, kernel);
    const Grads g_wrong = run_gpu(c, in, cfg, &wrong, kernel);
    expect_grads(c, in, g_right, r);
    const double e_dq = rel_max_err(g_wrong.dq, r.dq), e_dk = rel_max_err(g_wrong.dk, r.dk),
                 e_dv = rel_max_err(g_wrong.dv, r.dv);
    // dq: the 64 rows lose their dominant tile (an O(1) change of their gradient); dk, dv of the
    // sink tile lose 64 of their 256 rows' terms (a smaller, but still several-tol change).
    EXPECT_GT(e_dq, 10 * tol) << "dq did not change with the flipped bit";
    EXPECT_GT(e_dk, 2 * tol) << "dk did not change with the flipped bit";
    EXPECT_GT(e_dv, 2 * tol) << "dv did not change with the flipped bit";
    // Given the wrong set, the reference agrees with the kernel again (the kernel used that set).
    expect_grads(c, in, g_wrong, r_wrong);
  }
}

// The work list's heavy rule from its text (backward_params.hpp, backward_work_list.hpp), on the
// host: per sequence, a (KV head, key block) whose kept vote groups over the groups its CTA walks
// (causal: a group is walked by block n when its last row sees the block's first key, SPEC §1)
// are >= kHeavyNum / kHeavyDen x the mean over the sequence's blocks, and more than none. Heavy
// blocks split by query head when the KV group has several. Returns (b, kh, n) of each.
struct SplitKey {
  i64 b, kh, n;
  bool operator<(const SplitKey& o) const { return std::tie(b, kh, n) < std::tie(o.b, o.kh, o.n); }
  bool operator==(const SplitKey& o) const { return b == o.b && kh == o.kh && n == o.n; }
};
std::vector<i64> kept_groups(const Case& c, const SkipSet& set, i64 b, i64 h) {  // per key block
  const i64 lq = c.len_q(b), lk = c.len_k(b), nb = (lk + 127) / 128, groups = (lq + 63) / 64;
  std::vector<i64> kept(std::size_t(nb), 0);
  for (i64 n = 0; n < nb; ++n)
    for (i64 g = 0; g < groups; ++g) {
      if (c.causal && 64 * g + 63 + lk - lq < 128 * n) continue;  // no row of g sees key 128 n
      kept[std::size_t(n)] += set.skipped(b, h, g, n) ? 0 : 1;
    }
  return kept;
}
// Kept vote groups of each (KV head kh, key block n) of sequence b, summed over the KV group's
// query heads: [kh * nb + n].
std::vector<i64> block_totals(const Case& c, const SkipSet& set, i64 b) {
  const i64 group = c.hq / c.hk, nb = (c.len_k(b) + 127) / 128;
  std::vector<i64> total(std::size_t(c.hk * nb), 0);
  for (i64 h = 0; h < c.hq; ++h) {
    const std::vector<i64> k = kept_groups(c, set, b, h);
    for (i64 n = 0; n < nb; ++n) total[std::size_t((h / group) * nb + n)] += k[std::size_t(n)];
  }
  return total;
}
std::vector<SplitKey> expected_heavy(const Case& c, const SkipSet& set) {
  std::vector<SplitKey> out;
  for (i64 b = 0; b < c.nseq(); ++b) {
    const i64 nb = (c.len_k(b) + 127) / 128;
    const std::vector<i64> total = block_totals(c, set, b);
    i64 sum = 0;
    for (i64 t : total) sum += t;
    for (i64 x = 0; x < c.hk * nb; ++x)
      if (total[std::size_t(x)] > 0 &&
          total[std::size_t(x)] * c.hk * nb * sm90::backward::kHeavyDen >= sm90::backward::kHeavyNum * sum)
        out.push_back({b, x / nb, x % nb});
  }
  return out;
}

// The split rule from its text (backward_params.hpp): a heavy block splits, when the KV group has
// several query heads, if its cost (kCtaFixedCost + kept groups) is above kSplitShareNum /
// kSplitShareDen of an SM's share of the call: the kept groups of every sequence plus
// kCtaFixedCost for each of batch x hk x (the longest sequence's key blocks), over num_sms.
std::vector<SplitKey> expected_split(const Case& c, const SkipSet& set, i64 num_sms) {
  std::vector<SplitKey> out;
  const i64 group = c.hq / c.hk;
  if (group <= 1) return out;
  namespace bw = sm90::backward;
  i64 call = 0, max_nb = 0;
  std::vector<std::vector<i64>> total(std::size_t(c.nseq()));  // [b][kh * nb + n]
  for (i64 b = 0; b < c.nseq(); ++b) {
    max_nb = std::max(max_nb, (c.len_k(b) + 127) / 128);
    total[std::size_t(b)] = block_totals(c, set, b);
    for (i64 t : total[std::size_t(b)]) call += t;
  }
  call += bw::kCtaFixedCost * c.nseq() * c.hk * max_nb;
  for (const SplitKey& k : expected_heavy(c, set)) {
    const i64 nb = (c.len_k(k.b) + 127) / 128;
    const i64 t = total[std::size_t(k.b)][std::size_t(k.kh * nb + k.n)];
    if ((bw::kCtaFixedCost + t) * bw::kSplitShareDen * num_sms > bw::kSplitShareNum * call) out.push_back(k);
  }
  return out;
}

// Fewer SMs than any sm_90 part has (H20: 78): a block that splits at this count splits on the
// device too (the rule's left side grows with the SMs).
constexpr i64 kFewestSms = 64;

// The work list's split blocks (a skip set and GQA: backward_work_list.hpp): the kernels' parts and
// their sum against the reference, with the recorded set, with a set that skips key block 0 for
// every vote group of one query head (that part keeps nothing: its slot must read as zeros) and
// for one vote group of another (a part with a hole), and with a heavy-hitter set (every group
// keeps tiles 0 and 3, most skip the rest); GQA 4:1 and 8:2, both masks, ragged, both head dims.
// The heavy-hitter and holed sets are checked to split key block 0 by the rule's text
// (expected_heavy), so the cases this test exists for happen. The holed set is the heavy one
// with the holes.
TEST(GpuBackward, WorkListSplitBlocksMatchReference) {
  REQUIRE_GPU();
  int i = 150;
  for (int shape = 0; shape < 2; ++shape) {
    for (bool causal : {false, true}) {
      Case c;
      if (shape == 0) {
        c.Lq = c.Lk = 600;
        c.hq = 4;
        c.hk = 1;
        c.d = 64;
      } else {
        c.lq = {300, 520};
        c.lk = {300, 700};
        c.hq = 8;
        c.hk = 2;
        c.d = 128;
      }
      c.causal = causal;
      const std::uint64_t seed = seed_for(i++);
      SCOPED_TRACE(c.name() + " seed " + std::to_string(seed));
      SkipConfig cfg = SkipConfig::from_threshold(std::exp(-2.0));
      cfg.vote = vote_cfg().vote;
      Data in = make_data(c, seed, cfg);
      ASSERT_GT(in.set.count(), 0) << "nothing skipped: the call would not split block 0";
      SkipSet heavy = in.set;  // tiles 0 and 3 kept by every group, one in six of the others
      std::mt19937_64 rng(seed);
      for (i64 b = 0; b < heavy.batch; ++b)
        for (i64 h = 0; h < heavy.heads; ++h)
          for (i64 g = 0; g < heavy.groups; ++g)
            for (i64 t = 1; t < heavy.tiles; ++t) heavy.set(b, h, g, t, t != 3 && rng() % 6 != 0);
      SkipSet holed = heavy;
      for (i64 b = 0; b < holed.batch; ++b) {
        const i64 len_q = c.lq.empty() ? c.Lq : c.lq[std::size_t(b)];
        for (i64 g = 0; g < (len_q + 63) / 64; ++g) holed.set(b, 1, g, 0);  // query head 1: block 0 all skipped
        holed.set(b, 2, 0, 0);                                            // query head 2: one vote group
      }
      for (const SkipSet* set : {&in.set, &heavy, &holed}) {
        SCOPED_TRACE(set == &holed ? "holed set" : set == &heavy ? "heavy-hitter set" : "recorded set");
        if (set != &in.set) {
          const std::vector<SplitKey> h = expected_split(c, *set, kFewestSms);
          ASSERT_NE(std::find(h.begin(), h.end(), SplitKey{0, 0, 0}), h.end())
              << "key block 0 of KV head 0 does not split: the case is not tested";
        }
        const Grads r = run_ref(c, in, cfg, set);
        for (const auto kernel : kKernels) {
          SCOPED_TRACE(std::string("kernel ") + kernel_name(kernel));
          expect_grads(c, in, run_gpu(c, in, cfg, set, kernel), r);
        }
      }
    }
  }
}

// What the CUDA path refuses, each before any CUDA work (so this runs on a CUDA build without a
// GPU too); a CPU-only build refuses every CUDA call.
TEST(GpuBackward, RefusesClearly) {
  Case c;
  c.Lq = c.Lk = 100;
  Data in = make_data(c, 7, SkipConfig{});
  RunOptions opt;
  opt.device = DeviceKind::cuda;
  auto expect_error = [&](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
    } catch (const Error& e) {
      const std::string want = detail::cuda_built() ? needle : "without CUDA";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  {
    Call call(c, in, DType::bf16, DType::bf16, DType::bf16, DType::f32);
    call.p.lse = Tensor{};
    expect_error([&] { attention_backward(call.p, {}, opt); }, "lse: the CUDA backward kernel needs the forward's LSE");
  }
  {
    Call call(c, in, DType::bf16, DType::bf16, DType::f64, DType::f32);
    expect_error([&] { attention_backward(call.p, {}, opt); }, "dq: dtype f64 is not supported");
  }
  {
    Call call(c, in, DType::f32, DType::f32, DType::f32, DType::f32);
    expect_error([&] { attention_backward(call.p, {}, opt); }, "q: dtype f32 is not supported");
  }
  {
    Call call(c, in, DType::bf16, DType::bf16, DType::bf16, DType::f32);
    SkipConfig on = SkipConfig::from_threshold(0.01);
    on.vote = vote_cfg().vote;
    expect_error([&] { attention_backward(call.p, on, opt); }, "pass the forward's skip set");
    SkipConfig coarse = on;
    coarse.vote.rows = 128;
    Data in2 = make_data(c, 8, coarse);
    Call call2(c, in2, DType::bf16, DType::bf16, DType::bf16, DType::f32);
    expect_error([&] { attention_backward(call2.p, coarse, opt, &in2.set); }, "vote rows 64 x tile_keys 128");
  }
  {
    Case c32 = c;
    c32.d = 32;
    Data in32 = make_data(c32, 9, SkipConfig{});
    Call call(c32, in32, DType::bf16, DType::bf16, DType::bf16, DType::f32);
    expect_error([&] { attention_backward(call.p, {}, opt); }, "head dimension d = 32 is not supported");
  }
}

#ifdef BLASST_TEST_CUDA_RUNTIME
void check_cuda(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

int device_sms() {
  int dev = 0, n = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "SM count");
  return n;
}

// Device buffers of the tests that call with device tensors, freed when it goes.
struct DeviceBuffers {
  std::vector<void*> owned;
  DeviceBuffers() = default;
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (void* ptr : owned) EXPECT_EQ(cudaFree(ptr), cudaSuccess) << "cudaFree";
  }
  void* alloc(std::size_t bytes) {
    void* ptr = nullptr;
    check_cuda(cudaMalloc(&ptr, bytes < 16 ? 16 : bytes), "cudaMalloc");
    owned.push_back(ptr);
    return ptr;
  }
  // A device copy of t whose data starts `lead_elems` elements into its allocation, behind guard
  // bytes 0x5a.
  Tensor copy(const Tensor& t, std::size_t lead_elems = 0) {
    const std::size_t bytes = std::size_t(t.numel()) * dtype_size(t.dtype), lead = lead_elems * dtype_size(t.dtype);
    char* ptr = static_cast<char*>(alloc(lead + bytes));
    if (lead > 0) check_cuda(cudaMemset(ptr, 0x5a, lead), "cudaMemset");
    check_cuda(cudaMemcpy(ptr + lead, t.data, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    Tensor d = t;
    d.data = ptr + lead;
    d.device = DeviceKind::cuda;
    return d;
  }
};

// The work list itself (launch_work_list on the device, read back): every (KV head, key block) of
// each sequence exactly once as a whole or, when split, as parts 0 .. group - 1 with its split
// index; the heavy blocks those of the rule (expected_heavy, computed here from the bits), split
// as the split rule says (expected_split: under GQA, above an SM's share of the call; the list is
// built for the device's SMs, where these small calls split heavy blocks, and for one SM, where
// none splits) and whole otherwise; their items first, by section of the fixed launch order (causal:
// its sections of KV heads; full mask: each KV head), longest first within one (costs
// kCtaFixedCost + kept groups, non-increasing up to the width of one of its 4096 / sections
// buckets); then every other block in the fixed order (launch_block_and_head); the counts in the
// counters. Batched and ragged, both masks, GQA 4:1 and 8:2 and MHA, a heavy-hitter set.
TEST(GpuBackward, WorkListCoversAndOrders) {
  REQUIRE_GPU();
  namespace bw = sm90::backward;
  int trial = 0;
  for (int shape = 0; shape < 3; ++shape)
    for (bool causal : {false, true}) {
      Case c;
      if (shape == 0) {
        c.B = 2;
        c.Lq = 2000;
        c.Lk = 2100;
        c.hq = 8;
        c.hk = 2;
      } else if (shape == 1) {
        c.lq = {700, 0, 1500, 64};
        c.lk = {900, 10, 1300, 1};
        c.hq = 4;
        c.hk = 1;
      } else {
        c.B = 1;
        c.Lq = c.Lk = 1000;
        c.hq = c.hk = 3;
      }
      c.causal = causal;
      SCOPED_TRACE(c.name());
      std::mt19937_64 rng(test_seed(7000 + trial++));
      i64 max_q = 0, max_k = 0;
      for (i64 b = 0; b < c.nseq(); ++b) max_q = std::max(max_q, c.len_q(b)), max_k = std::max(max_k, c.len_k(b));
      const i64 groups = (max_q + 63) / 64, tiles = (max_k + 127) / 128, group = c.hq / c.hk;
      SkipSet set;
      VoteGranularity vote;
      vote.rows = 64;
      vote.tile_keys = 128;
      set.resize(vote, c.nseq(), c.hq, groups, tiles);
      for (i64 b = 0; b < c.nseq(); ++b)  // tiles 0 and 3 kept, the rest mostly skipped
        for (i64 h = 0; h < c.hq; ++h)
          for (i64 g = 0; g < groups; ++g)
            for (i64 t = 1; t < tiles; ++t)
              if (t != 3 && rng() % 5 != 0) set.set(b, h, g, t);
      const std::vector<SplitKey> want = expected_heavy(c, set);
      ASSERT_GT(want.size(), 0u) << "no heavy block: the case is not tested";

      for (const int num_sms : {device_sms(), 1}) {
        SCOPED_TRACE("SMs " + std::to_string(num_sms));
        const std::vector<SplitKey> want_split = expected_split(c, set, num_sms);
        DeviceBuffers dev;
        bw::BackwardParams p;
        p.batch = int(c.nseq());
        p.hq = int(c.hq);
        p.hk = int(c.hk);
        p.group = int(group);
        p.causal = causal;
        p.head_dim = 64;
        p.num_n_blocks = int(tiles);
        p.causal_section_heads = bw::causal_launch_section_heads(p.hk, p.group, p.num_n_blocks);
        const std::vector<std::int32_t> cu_q = cu_seqlens(c, false), cu_k = cu_seqlens(c, true);
        if (c.ragged()) {
          p.cu_q = static_cast<const int*>(dev.alloc(cu_q.size() * 4));
          p.cu_k = static_cast<const int*>(dev.alloc(cu_k.size() * 4));
          check_cuda(cudaMemcpy(const_cast<int*>(p.cu_q), cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice), "cu_q");
          check_cuda(cudaMemcpy(const_cast<int*>(p.cu_k), cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice), "cu_k");
        } else {
          p.len_q = int(c.Lq);
          p.len_k = int(c.Lk);
        }
        void* bits = dev.alloc(set.bits.size());
        check_cuda(cudaMemcpy(bits, set.bits.data(), set.bits.size(), cudaMemcpyHostToDevice), "bits");
        p.skip_bits = static_cast<const std::uint8_t*>(bits);
        p.skip_groups = groups;
        p.skip_tiles = tiles;
        p.split_cap = bw::split_capacity(p.batch, p.hk, p.group, p.num_n_blocks, p.head_dim);
        p.work_items = bw::work_items_capacity(p.num_n_blocks, p.hk, p.group, p.split_cap);
        std::size_t bytes[6];
        bw::work_list_bytes(p, bytes);
        bw::WorkListScratch scratch;
        scratch.counts = static_cast<int*>(dev.alloc(bytes[0]));
        scratch.split_of = static_cast<int*>(dev.alloc(bytes[1]));
        scratch.items = static_cast<bw::WorkItem*>(dev.alloc(bytes[2]));
        scratch.splits = static_cast<bw::SplitBlock*>(dev.alloc(bytes[3]));
        scratch.counters = static_cast<int*>(dev.alloc(bytes[4]));
        scratch.parts = nullptr;  // not touched by the list
        check_cuda(cudaMemset(scratch.items, 0xff, bytes[2]), "poison items");
        check_cuda(cudaMemset(scratch.counters, 0xff, bytes[4]), "poison counters");
        bw::launch_work_list(p, scratch, int(max_q), num_sms, nullptr);
        check_cuda(cudaDeviceSynchronize(), "launch_work_list");
        std::vector<bw::WorkItem> items(bytes[2] / sizeof(bw::WorkItem));
        std::vector<bw::SplitBlock> splits(bytes[3] / sizeof(bw::SplitBlock));
        std::vector<int> counters(bytes[4] / 4);
        check_cuda(cudaMemcpy(items.data(), scratch.items, bytes[2], cudaMemcpyDeviceToHost), "items");
        if (bytes[3] > 0) check_cuda(cudaMemcpy(splits.data(), scratch.splits, bytes[3], cudaMemcpyDeviceToHost), "splits");
        check_cuda(cudaMemcpy(counters.data(), scratch.counters, bytes[4], cudaMemcpyDeviceToHost), "counters");
        std::vector<SplitKey> got_splits;
        for (i64 b = 0; b < c.nseq(); ++b) {
          SCOPED_TRACE("sequence " + std::to_string(b));
          const i64 nb = (c.len_k(b) + 127) / 128;
          const int nsplit = counters[std::size_t(p.batch + b)];
          ASSERT_TRUE(nsplit >= 0 && nsplit <= p.split_cap) << nsplit;
          std::vector<std::vector<i64>> kept(std::size_t(c.hq));
          for (i64 h = 0; h < c.hq; ++h) kept[std::size_t(h)] = kept_groups(c, set, b, h);
          i64 max_cost = 1;
          for (i64 kh = 0; kh < c.hk; ++kh)
            for (i64 n = 0; n < nb; ++n) {
              i64 t = 0;
              for (i64 hh = 0; hh < group; ++hh) t += kept[std::size_t(kh * group + hh)][std::size_t(n)];
              max_cost = std::max(max_cost, bw::kCtaFixedCost + t);
            }
          std::vector<int> seen(std::size_t(c.hk * nb * (group + 1)), 0);  // [kh][n][part + 1]
          std::vector<int> fixed_at(std::size_t(c.hk * nb), -1);  // (kh, n) -> its fixed launch index
          for (int x = 0; x < int(c.hk * nb); ++x) {
            int n = -1, kh = -1;
            bw::launch_block_and_head(x, int(nb), p.hk, causal, p.causal_section_heads, false, n, kh);
            fixed_at[std::size_t(kh * nb + n)] = x;
          }
          auto is_heavy = [&](i64 kh, i64 n) {
            return std::find(want.begin(), want.end(), SplitKey{b, kh, n}) != want.end();
          };
          auto is_split = [&](i64 kh, i64 n) {
            return std::find(want_split.begin(), want_split.end(), SplitKey{b, kh, n}) != want_split.end();
          };
          // Sections of the fixed order (causal: sections of KV heads; full mask: each KV head) order
          // the heavy items; cost buckets per section: 4096 / sections.
          auto section_of = [&](i64 kh) { return causal ? kh / p.causal_section_heads : kh; };
          const i64 sections = causal ? (c.hk + p.causal_section_heads - 1) / p.causal_section_heads : c.hk;
          const i64 bucket_width = (max_cost + 4096 / sections - 2) / (4096 / sections - 1);
          i64 expect_items = 0, prev_cost = -1, prev_section = -1;
          int prev_fixed = -1;
          bool in_heavy = true;
          const int count = counters[std::size_t(b)];
          for (int i = 0; i < count; ++i) {
            const bw::WorkItem it = items[std::size_t(b * p.work_items + i)];
            ASSERT_TRUE(it.kh >= 0 && it.kh < c.hk && it.n_block >= 0 && it.n_block < nb && it.part >= -1 &&
                        it.part < group) << "item " << i << " (" << it.n_block << ", " << it.kh << ", " << it.part << ")";
            ++seen[std::size_t((it.kh * nb + it.n_block) * (group + 1) + it.part + 1)];
            const bool heavy = is_heavy(it.kh, it.n_block);
            if (!heavy) in_heavy = false;
            ASSERT_TRUE(heavy == in_heavy) << "item " << i << ": a heavy block after the fixed-order ones";
            if (heavy) {
              const i64 sec = section_of(it.kh);
              ASSERT_GE(sec, prev_section) << "item " << i << ": a heavy item of an earlier section after a later one";
              if (sec != prev_section) prev_cost = -1;
              prev_section = sec;
            }
            if (heavy) {
              i64 k = 0;
              for (i64 hh = (it.part < 0 ? 0 : it.part); hh < (it.part < 0 ? group : it.part + 1); ++hh)
                k += kept[std::size_t(it.kh * group + hh)][std::size_t(it.n_block)];
              const i64 cost = bw::kCtaFixedCost + k;
              if (prev_cost >= 0)
                ASSERT_LE(cost, prev_cost + bucket_width) << "item " << i << ": a longer one after a shorter";
              prev_cost = cost;
              ASSERT_EQ(it.part >= 0, is_split(it.kh, it.n_block)) << "item " << i << ": split as the rule says";
            } else {
              ASSERT_EQ(it.part, -1) << "item " << i;
              const int fx = fixed_at[std::size_t(it.kh * nb + it.n_block)];
              ASSERT_GT(fx, prev_fixed) << "item " << i << ": out of the fixed launch order";
              prev_fixed = fx;
            }
            if (it.part >= 0) {
              ASSERT_TRUE(it.split >= 0 && it.split < nsplit) << "item " << i << " split " << it.split;
              const bw::SplitBlock sb = splits[std::size_t(b * p.split_cap + it.split)];
              ASSERT_TRUE(sb.kh == it.kh && sb.n_block == it.n_block) << "item " << i << ": its split block differs";
            }
          }
          for (int sp = 0; sp < nsplit; ++sp) {
            const bw::SplitBlock sb = splits[std::size_t(b * p.split_cap + sp)];
            got_splits.push_back({b, sb.kh, sb.n_block});
          }
          for (i64 kh = 0; kh < c.hk; ++kh)
            for (i64 n = 0; n < nb; ++n) {
              const bool split = is_split(kh, n);
              const int* cnt = &seen[std::size_t((kh * nb + n) * (group + 1))];
              ASSERT_EQ(cnt[0], split ? 0 : 1) << "(" << n << ", " << kh << ") as a whole";
              for (i64 q = 0; q < group; ++q) ASSERT_EQ(cnt[q + 1], split ? 1 : 0) << "(" << n << ", " << kh << ") part " << q;
              expect_items += split ? group : 1;
            }
          ASSERT_EQ(count, expect_items);
        }
        std::sort(got_splits.begin(), got_splits.end());
        std::vector<SplitKey> want_sorted = want_split;
        std::sort(want_sorted.begin(), want_sorted.end());
        if (group > 1)
          ASSERT_LE(want.size(), std::size_t(p.split_cap) * std::size_t(c.nseq())) << "the test's cap must hold every heavy block";
        // both branches of the rule happen: on the device's SMs these small calls split heavy
        // blocks (GQA), on one SM none (a block's cost is never above the whole call's)
        if (group > 1 && num_sms > 1) ASSERT_GT(want_split.size(), 0u) << "no heavy block split: the case is not tested";
        if (num_sms == 1) ASSERT_TRUE(want_split.empty()) << "one SM: no block is above its share";
        ASSERT_EQ(got_splits.size(), want_sorted.size()) << "split blocks: device vs the rule";
        for (std::size_t x = 0; x < want_sorted.size(); ++x)
          ASSERT_TRUE(got_splits[x] == want_sorted[x]) << "split " << x << ": (" << got_splits[x].b << ", " << got_splits[x].kh
                                                     << ", " << got_splits[x].n << ") vs (" << want_sorted[x].b << ", "
                                                     << want_sorted[x].kh << ", " << want_sorted[x].n << ")";
      }
    }
}

// The public call on device tensors (no staging): device-resident cu_seqlens, a stream of the
// caller's, scratch from RunOptions::workspace sized by attention_backward_workspace_bytes (and
// a workspace one byte short refused), a skip set; results against the reference.
TEST(GpuBackward, DeviceTensorsStreamAndCallerWorkspace) {
  REQUIRE_GPU();
  Case c;
  c.lq = {130, 257, 64};
  c.lk = {200, 129, 700};
  c.hq = 4;
  c.hk = 2;
  c.d = 128;
  c.causal = true;
  const std::uint64_t seed = seed_for(160);
  SCOPED_TRACE(c.name() + " seed " + std::to_string(seed));
  SkipConfig cfg = SkipConfig::from_threshold(std::exp(-2.0));
  cfg.vote = vote_cfg().vote;
  Data in = make_data(c, seed, cfg);
  Call host(c, in, c.dtype, c.io_dtype, c.grad_dtype, DType::f32);
  DeviceBuffers dev;
  auto check = check_cuda;
  AttentionBackwardProblem p = host.p;
  for (auto [h, d] : {std::pair{&host.p.q, &p.q}, {&host.p.k, &p.k}, {&host.p.v, &p.v}, {&host.p.out, &p.out},
                      {&host.p.dout, &p.dout}, {&host.p.lse, &p.lse}, {&host.p.dq, &p.dq}, {&host.p.dk, &p.dk},
                      {&host.p.dv, &p.dv}})
    *d = dev.copy(*h);  // dq, dk, dv: the NaN-poisoned host buffers
  const std::size_t off_bytes = in.cu_q.size() * sizeof(std::int32_t);
  void *cu_q = dev.alloc(off_bytes), *cu_k = dev.alloc(off_bytes);
  check(cudaMemcpy(cu_q, in.cu_q.data(), off_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(cu_k, in.cu_k.data(), off_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  p.cu_seqlens_q = static_cast<const std::int32_t*>(cu_q);
  p.cu_seqlens_k = static_cast<const std::int32_t*>(cu_k);

  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  RunOptions opt;
  opt.stream = stream;
  const std::size_t ws_bytes = attention_backward_workspace_bytes(p, cfg, opt, &in.set);
  ASSERT_GT(ws_bytes, 0u);
  void* ws = dev.alloc(ws_bytes);
  opt.workspace = ws;
  opt.workspace_bytes = ws_bytes - 1;
  try {
    attention_backward(p, cfg, opt, &in.set);
    ADD_FAILURE() << "a workspace one byte short was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RunOptions::workspace"), std::string::npos) << e.what();
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  opt.workspace_bytes = ws_bytes;
  attention_backward(p, cfg, opt, &in.set);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (auto [h, d] : {std::pair{&host.p.dq, &p.dq}, {&host.p.dk, &p.dk}, {&host.p.dv, &p.dv}})
    check(cudaMemcpy(h->data, d->data, std::size_t(h->numel()) * dtype_size(h->dtype), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  ASSERT_GT(in.set.count(), 0);
  expect_grads(c, in, host.grads(), run_ref(c, in, cfg, &in.set));
}

// dQ leaves the postprocess with 16-byte stores, dK / dV the wgmma kernel's epilogue with 4-byte
// pair stores, where each tensor's pointer and strides allow it, and element by element otherwise
// (backward_prepost.cu, backward_epilogue.hpp): a dq that starts two elements past a 16-byte
// boundary and a dk / dv one element past a 4-byte one take the element paths (both kernels); an O
// one element past a 16-byte boundary takes the preprocess's element loads. The gradients must
// still equal the reference, and the elements in front of each tensor keep their guard bytes.
TEST(GpuBackward, MisalignedOutputsTakeTheElementStores) {
  REQUIRE_GPU();
  Case c;
  c.Lq = c.Lk = 200;
  c.hq = 2;
  c.hk = 1;
  c.d = 64;
  c.causal = true;
  const std::uint64_t seed = seed_for(170);
  SCOPED_TRACE(c.name() + " seed " + std::to_string(seed));
  Data in = make_data(c, seed, SkipConfig{});
  const Grads want = run_ref(c, in, SkipConfig{}, nullptr);
  auto check = check_cuda;
  for (const auto kernel : kKernels) {
    SCOPED_TRACE(std::string("kernel ") + kernel_name(kernel));
    Call host(c, in, c.dtype, c.io_dtype, c.grad_dtype, DType::f32);
    DeviceBuffers dev;
    AttentionBackwardProblem p = host.p;
    for (auto [h, d] : {std::pair{&host.p.q, &p.q}, {&host.p.k, &p.k}, {&host.p.v, &p.v}, {&host.p.dout, &p.dout},
                        {&host.p.lse, &p.lse}})
      *d = dev.copy(*h);
    // O shifted by one element: the preprocess reads it (and dO) element by element, not 16 bytes
    // at a time (O is read by nothing else, so no alignment is asked of it).
    p.out = dev.copy(host.p.out, 1);
    ASSERT_NE(reinterpret_cast<std::uintptr_t>(p.out.data) % 16, 0u) << "out is 16-byte aligned: the case did not happen";
    const std::size_t lead_dq = 2, lead_kv = 1;  // the NaN-poisoned host buffers, shifted
    p.dq = dev.copy(host.p.dq, lead_dq);
    p.dk = dev.copy(host.p.dk, lead_kv);
    p.dv = dev.copy(host.p.dv, lead_kv);
    ASSERT_NE(reinterpret_cast<std::uintptr_t>(p.dq.data) % 16, 0u) << "dq is 16-byte aligned: the case did not happen";
    ASSERT_NE(reinterpret_cast<std::uintptr_t>(p.dk.data) % 4, 0u) << "dk is 4-byte aligned: the case did not happen";
    detail::cuda_attention_backward_on(p, SkipConfig{}, RunOptions{}, nullptr, kernel);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (auto [d, lead] : {std::pair{&p.dq, lead_dq}, {&p.dk, lead_kv}, {&p.dv, lead_kv}}) {
      std::vector<unsigned char> guard(lead * dtype_size(d->dtype), 0);
      check(cudaMemcpy(guard.data(), static_cast<char*>(d->data) - guard.size(), guard.size(), cudaMemcpyDeviceToHost),
            "cudaMemcpy");
      for (unsigned char b : guard) EXPECT_EQ(b, 0x5a) << "a store landed in front of the tensor";
    }
    for (auto [h, d] : {std::pair{&host.p.dq, &p.dq}, {&host.p.dk, &p.dk}, {&host.p.dv, &p.dv}})
      check(cudaMemcpy(h->data, d->data, std::size_t(h->numel()) * dtype_size(h->dtype), cudaMemcpyDeviceToHost),
            "cudaMemcpy");
    expect_grads(c, in, host.grads(), want);
  }
}
#endif

// attention_backward_workspace_bytes: D and LSE [Hq, B x Lq rounded up to 128 rows per sequence
// (kLseRowAlign: every vote group's rows one aligned run)], the f32 dQ accumulator over the same rows
// [Hq, rows, d] (in 64 x 64 tiles), the converted dO (f32 dout only) and the skip bits, each
// 256-byte aligned, and with a skip set under GQA / MQA the work list's arrays; 0 for the
// reference. Sizing runs no CUDA work (a CUDA build without a GPU answers too).
TEST(GpuBackward, WorkspaceBytes) {
  Case c;
  c.B = 2;
  c.Lq = 300;
  c.Lk = 200;
  c.hq = 4;
  c.hk = 2;
  SkipConfig cfg = SkipConfig::from_threshold(std::exp(-2.0));
  cfg.vote = vote_cfg().vote;
  Data in = make_data(c, 11, cfg);
  auto up = [](std::size_t n) { return (n + 255) / 256 * 256; };
  const std::size_t tokens = std::size_t(c.B * c.Lq), rows = tokens * std::size_t(c.hq);
  const std::size_t lse_rows = std::size_t(c.B) * 384 * std::size_t(c.hq);  // 300 rows -> 3 blocks of 128
  {
    Call call(c, in, DType::bf16, DType::bf16, DType::bf16, DType::f32);
    EXPECT_EQ(attention_backward_workspace_bytes(call.p), 0u);  // CPU tensors: the reference
    RunOptions opt;
    opt.device = DeviceKind::cuda;
    if (!detail::cuda_built()) {
      EXPECT_THROW(attention_backward_workspace_bytes(call.p, {}, opt), Error);
      return;
    }
    EXPECT_EQ(attention_backward_workspace_bytes(call.p, {}, opt), up(lse_rows * 64 * 4) + 2 * up(lse_rows * 4));
    // With the set, the work list (backward_work_list.hpp): per sequence, the kept counts
    // [hq][nb] and split indices [hk][nb] (ints), the items (16 bytes; nb x hk plus group - 1 for
    // each possible split), the split blocks (8 bytes), two counters, and the f32 dK / dV parts of
    // the split blocks [cap][group][2][128][d]; cap = every block here (the 64 MiB budget allows
    // far more than nb x hk = 2 x 2 at d 64), group 2. nb = 2 (200 keys).
    const std::size_t B = std::size_t(c.B), nb = 2, cap = nb * std::size_t(c.hk), group = 2;
    const std::size_t items = nb * std::size_t(c.hk) + cap * (group - 1);
    EXPECT_EQ(attention_backward_workspace_bytes(call.p, cfg, opt, &in.set),
              up(lse_rows * 64 * 4) + 2 * up(lse_rows * 4) + up(in.set.bits.size()) + up(B * std::size_t(c.hq) * nb * 4) +
                  up(B * std::size_t(c.hk) * nb * 4) + up(B * items * 16) + up(B * cap * 8) + up(2 * B * 4) +
                  up(B * cap * group * 2 * 128 * std::size_t(c.d) * 4));
  }
  {
    // MHA: no work list (nothing to split; backward_api.cu), so the set adds only its bits.
    Case m = c;
    m.hk = m.hq;
    Data mha = make_data(m, 12, cfg);
    ASSERT_GT(mha.set.count(), 0) << "nothing skipped: the case is not tested";
    Call call(m, mha, DType::bf16, DType::bf16, DType::bf16, DType::f32);
    RunOptions opt;
    opt.device = DeviceKind::cuda;
    EXPECT_EQ(attention_backward_workspace_bytes(call.p, cfg, opt, &mha.set),
              up(lse_rows * 64 * 4) + 2 * up(lse_rows * 4) + up(mha.set.bits.size()));
  }
  {
    Call call(c, in, DType::bf16, DType::f32, DType::bf16, DType::f32);  // f32 out / dout
    RunOptions opt;
    opt.device = DeviceKind::cuda;
    EXPECT_EQ(attention_backward_workspace_bytes(call.p, {}, opt),
              up(lse_rows * 64 * 4) + 2 * up(lse_rows * 4) + up(rows * 64 * 2));
  }
  {
    // Ragged: the LSE / D rows per head are the tokens plus 128 per sequence, rounded up to 128
    // (BackwardParams::rows_ld): 495 + 5 * 128 = 1135 -> 1152.
    Case r;
    r.lq = {300, 1, 64, 0, 130};
    r.lk = {200, 70, 64, 10, 130};
    r.hq = 4;
    r.hk = 2;
    Data rin = make_data(r, 12, SkipConfig{});
    Call call(r, rin, DType::bf16, DType::bf16, DType::bf16, DType::f32);
    RunOptions opt;
    opt.device = DeviceKind::cuda;
    const std::size_t rrows = 1152 * std::size_t(r.hq);
    EXPECT_EQ(attention_backward_workspace_bytes(call.p, {}, opt), up(rrows * 64 * 4) + 2 * up(rrows * 4));
  }
}

// The LSE / D row layout (lse_row_start): every sequence starts at a multiple of A = 128 (the
// d = 64 kernel's query block), its A-row blocks never reach the next sequence's start, and the
// last one ends inside rows_ld (ragged: tokens + A B rounded up to A; batched: B * round_up(Lq, A)).
// Host arithmetic only, random ragged layouts with empty sequences.
TEST(GpuBackward, LseRowLayoutDoesNotOverlap) {
  std::mt19937_64 rng(test_seed(4242));
  for (int trial = 0; trial < 2000; ++trial) {
    const int batch = 1 + int(rng() % 40);
    std::vector<int> cu(std::size_t(batch) + 1, 0);
    for (int b = 0; b < batch; ++b) cu[std::size_t(b) + 1] = cu[std::size_t(b)] + int(rng() % 4 == 0 ? 0 : rng() % 300);
    constexpr std::int64_t A = 128;
    const std::int64_t rows_ld = (std::int64_t(cu.back()) + A * batch + A - 1) / A * A;
    std::int64_t prev_end = 0;
    for (int b = 0; b < batch; ++b) {
      const std::int64_t start = sm90::backward::lse_row_start(b, 0, cu.data());
      const std::int64_t len = cu[std::size_t(b) + 1] - cu[std::size_t(b)];
      const std::int64_t end = start + (len + A - 1) / A * A;
      ASSERT_EQ(start % A, 0) << "trial " << trial << " sequence " << b;
      ASSERT_GE(start, prev_end) << "trial " << trial << " sequence " << b << " overlaps the one before";
      ASSERT_LE(end, rows_ld) << "trial " << trial << " sequence " << b;
      prev_end = end;
    }
    const int lq = int(rng() % 300);
    for (int b = 0; b < batch; ++b)
      ASSERT_EQ(sm90::backward::lse_row_start(b, lq, nullptr), std::int64_t(b) * ((lq + A - 1) / A * A));
    // padded_position (the postprocess's row -> token map) inverts the layout: every padded row
    // of the workspace is the row of exactly the (b, i) that lse_row_start puts there, or padding.
    for (const bool ragged : {true, false}) {
      const std::int64_t rows = ragged ? rows_ld : std::int64_t(batch) * ((lq + A - 1) / A * A);
      std::vector<int> owner(std::size_t(rows), -1);
      for (int b = 0; b < batch; ++b) {
        const std::int64_t start = sm90::backward::lse_row_start(b, lq, ragged ? cu.data() : nullptr);
        const int len = ragged ? cu[std::size_t(b) + 1] - cu[std::size_t(b)] : lq;
        for (int i = 0; i < len; ++i) owner[std::size_t(start + i)] = b * 1000 + i;
      }
      for (std::int64_t row = 0; row < rows; ++row) {
        int b = -1, i = -1, len = -1;
        const bool in = sm90::backward::padded_position(row, batch, lq, ragged ? cu.data() : nullptr, b, i, len);
        ASSERT_EQ(in, owner[std::size_t(row)] >= 0) << "trial " << trial << " ragged " << ragged << " row " << row;
        if (in) ASSERT_EQ(b * 1000 + i, owner[std::size_t(row)]) << "trial " << trial << " ragged " << ragged << " row " << row;
      }
    }
  }
}

// The postprocess's read of a dQ accumulator tile (dq_tile_read) against the layout the wgmma
// kernel writes (dq_in_tile): float4 blk of thread t (floats 4 (128 blk + t) + {0, 1}) is columns
// c, c + 1 of row r, + {2, 3} those of row r + 8; every element of the tile is read exactly once.
TEST(GpuBackward, PostprocessTileRead) {
  std::vector<int> seen(64 * 64, 0);
  for (int t = 0; t < 128; ++t)
    for (int blk = 0; blk < 8; ++blk) {
      int r = -1, c = -1;
      sm90::backward::dq_tile_read(t, blk, r, c);
      ASSERT_TRUE(r >= 0 && r % 16 < 8 && r + 8 < 64 && c >= 0 && c % 2 == 0 && c + 2 <= 64) << "t " << t;
      const int f = 4 * (128 * blk + t);
      for (int e = 0; e < 2; ++e) {
        ASSERT_EQ(sm90::backward::dq_in_tile(r, c + e), f + e) << "t " << t << " blk " << blk;
        ASSERT_EQ(sm90::backward::dq_in_tile(r + 8, c + e), f + 2 + e) << "t " << t << " blk " << blk;
        ++seen[std::size_t(r * 64 + c + e)];
        ++seen[std::size_t((r + 8) * 64 + c + e)];
      }
    }
  for (int x = 0; x < 64 * 64; ++x) ASSERT_EQ(seen[std::size_t(x)], 1) << "element " << x;
}

// The launch order (host-checked, no GPU): every (key block, KV head) of a grid exactly once, for
// both masks and every section size, a short last section included; within a causal section the
// key blocks never decrease (the longest, block 0, first), and a section's heads are consecutive.
// With sink_first (a skip set: block 0 keeps every vote group, SPEC §2a), the first hk launches
// are block 0 of each KV head in order, and the rest follow the same rules over blocks 1.. .
TEST(GpuBackward, LaunchOrderCoversEveryBlockOnce) {
  for (int nb : {1, 2, 5, 64, 129}) {
    for (int hk : {1, 2, 3, 8, 32}) {
      for (bool causal : {false, true}) {
        for (bool sink_first : {false, true}) {
          for (int sec = 1; sec <= hk; ++sec) {
            SCOPED_TRACE("nb " + std::to_string(nb) + " hk " + std::to_string(hk) + " causal " +
                         std::to_string(causal) + " sink_first " + std::to_string(sink_first) + " section " +
                         std::to_string(sec));
            std::vector<int> seen(std::size_t(nb) * std::size_t(hk), 0);
            int prev_n = -1, prev_section = -1, prev_kh = -1;
            const int sinks = sink_first && nb > 1 ? hk : 0;
            for (int x = 0; x < nb * hk; ++x) {
              int n = -1, kh = -1;
              sm90::backward::launch_block_and_head(x, nb, hk, causal, sec, sink_first, n, kh);
              ASSERT_TRUE(n >= 0 && n < nb && kh >= 0 && kh < hk) << "x " << x << " -> (" << n << ", " << kh << ")";
              ASSERT_EQ(seen[std::size_t(kh) * std::size_t(nb) + std::size_t(n)]++, 0)
                  << "x " << x << " repeats (" << n << ", " << kh << ")";
              if (x < sinks) {
                ASSERT_EQ(n, 0) << "x " << x << ": the sink blocks first";
                ASSERT_EQ(kh, x) << "x " << x;
                continue;
              }
              if (sinks > 0) ASSERT_GE(n, 1) << "x " << x << ": block 0 again after the sink blocks";
              if (causal) {
                const int section = kh / sec;
                ASSERT_GE(section, prev_section) << "x " << x;
                if (section == prev_section) ASSERT_GE(n, prev_n) << "x " << x << ": a shorter block before a longer one";
                prev_section = section;
                prev_n = n;
              } else {
                ASSERT_GE(kh, prev_kh) << "x " << x << ": full mask is head-major";
                prev_kh = kh;
              }
            }
          }
        }
      }
    }
  }
}

// The section rule's picks for the shapes it was measured on (bench/RESULTS.md, 2026-12-04: the
// best section sizes were GQA 32/8 at 8k: 2, 4 or 8 heads, at 16k: 1; MHA 32 at 8k: 8, at 16k:
// 1-3; sections that do not divide hk were slower: GQA 8k with 3, MHA 8k with 15) and its bounds.
TEST(GpuBackward, CausalSectionsFollowTheMeasurement) {
  using sm90::backward::causal_launch_section_heads;
  const int gqa_8k = causal_launch_section_heads(8, 4, 64), gqa_16k = causal_launch_section_heads(8, 4, 128);
  const int mha_8k = causal_launch_section_heads(32, 1, 64), mha_16k = causal_launch_section_heads(32, 1, 128);
  EXPECT_TRUE(gqa_8k == 2 || gqa_8k == 4 || gqa_8k == 8) << gqa_8k;
  EXPECT_EQ(gqa_16k, 1);
  EXPECT_EQ(mha_8k, 8);
  EXPECT_TRUE(mha_16k >= 1 && mha_16k <= 3) << mha_16k;
  for (int hk : {1, 2, 3, 5, 6, 7, 8, 12, 32, 40, 64})
    for (int nb : {1, 3, 16, 64, 128, 512})
      for (int group : {1, 4, 8}) {
        const int s = causal_launch_section_heads(hk, group, nb);
        ASSERT_TRUE(s >= 1 && s <= hk && hk % s == 0) << "hk " << hk << " nb " << nb << " group " << group << ": " << s;
      }
  EXPECT_EQ(causal_launch_section_heads(5, 1, 1), 5);        // tiny work: one section of every head
  EXPECT_EQ(causal_launch_section_heads(4, 64, 1024), 1);    // huge work: one head per section
  EXPECT_EQ(causal_launch_section_heads(7, 4, 64), 1);       // a prime hk whose work does not fit: one head
}

}  // namespace
}  // namespace blasst::test

namespace blasst::test {
namespace {

// Small configurations for compute-sanitizer (memcheck, racecheck): ragged + GQA + causal (rows
// that see no key, partial tiles, an empty sequence), dense and with a skip set, both head dims.
TEST(GpuBackwardSanitizer, Small) {
  BLASST_GPU_OR_SKIP("the sm_90a backward kernel needs a Hopper device");
  for (i64 d : {64, 128}) {
    Case c;
    c.lq = {200, 0, 400};
    c.lk = {600, 130, 500};
    c.hq = 2;
    c.hk = 1;
    c.d = d;
    c.causal = true;
    check_dense(c, test_seed(1500 + std::uint64_t(d)));
    check_skip(c, test_seed(1600 + std::uint64_t(d)));
  }
}

}  // namespace
}  // namespace blasst::test
