// Shared helpers for the reference tests: seeded data, an independent naive float64 attention.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/workloads.hpp"

namespace blasst::test {

inline std::vector<float> randn(std::size_t n, std::uint64_t seed, float sd = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

// A dense problem with its own storage; out/lse are poisoned with NaN before every run.
struct Dense {
  std::int64_t B, Lq, Lk, Hq, Hk, d, dv;
  std::vector<float> q, k, v, out, lse;
  Dense(std::int64_t B_, std::int64_t Lq_, std::int64_t Lk_, std::int64_t Hq_, std::int64_t Hk_,
        std::int64_t d_, std::int64_t dv_, std::uint64_t seed, float sd = 1.0f)
      : B(B_), Lq(Lq_), Lk(Lk_), Hq(Hq_), Hk(Hk_), d(d_), dv(dv_) {
    q = randn(B * Lq * Hq * d, seed, sd);
    k = randn(B * Lk * Hk * d, seed + 1, sd);
    v = randn(B * Lk * Hk * dv, seed + 2);
    out.assign(B * Lq * Hq * dv, 0.0f);
    lse.assign(B * Hq * Lq, 0.0f);
  }
  AttentionProblem problem(MaskKind mask) {
    std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
    std::fill(lse.begin(), lse.end(), std::numeric_limits<float>::quiet_NaN());
    AttentionProblem p;
    p.q = Tensor::contiguous(q.data(), DType::f32, {B, Lq, Hq, d});
    p.k = Tensor::contiguous(k.data(), DType::f32, {B, Lk, Hk, d});
    p.v = Tensor::contiguous(v.data(), DType::f32, {B, Lk, Hk, dv});
    p.out = Tensor::contiguous(out.data(), DType::f32, {B, Lq, Hq, dv});
    p.lse = Tensor::contiguous(lse.data(), DType::f32, {B, Hq, Lq});
    p.mask = mask;
    return p;
  }
};

// Naive float64 softmax attention over explicit row-major arrays (independent of the engine):
// two passes (max, then sum), no tiles.
inline void naive(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                  std::int64_t B, std::int64_t Lq, std::int64_t Lk, std::int64_t Hq, std::int64_t Hk,
                  std::int64_t d, std::int64_t dv, bool causal, std::vector<double>& out,
                  std::vector<double>& lse, double scale = -1) {
  if (scale < 0) scale = 1.0 / std::sqrt(static_cast<double>(d));
  out.assign(B * Lq * Hq * dv, 0.0);
  lse.assign(B * Hq * Lq, -std::numeric_limits<double>::infinity());
  const std::int64_t g = Hq / Hk;
  std::vector<double> s(Lk);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < Lq; ++i) {
        const std::int64_t kh = h / g;
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < Lk; ++j) {
          if (causal && j > i + Lk - Lq) { s[j] = -std::numeric_limits<double>::infinity(); continue; }
          double acc = 0;
          for (std::int64_t c = 0; c < d; ++c)
            acc += static_cast<double>(q[((b * Lq + i) * Hq + h) * d + c]) * k[((b * Lk + j) * Hk + kh) * d + c];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        if (mx == -std::numeric_limits<double>::infinity()) continue;
        double l = 0;
        for (std::int64_t j = 0; j < Lk; ++j) l += std::exp(s[j] - mx);
        for (std::int64_t j = 0; j < Lk; ++j) {
          const double p = std::exp(s[j] - mx) / l;
          if (p == 0) continue;
          for (std::int64_t c = 0; c < dv; ++c)
            out[((b * Lq + i) * Hq + h) * dv + c] += p * v[((b * Lk + j) * Hk + kh) * dv + c];
        }
        lse[(b * Hq + h) * Lq + i] = mx + std::log(l);
      }
}

// ||a - b|| / ||b|| over all elements.
template <class A, class Bv>
double rel_err(const A& a, const Bv& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double x = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += x * x;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// llm-like data (src/workloads) in a Dense holder: structured, so skipping actually happens.
inline Dense llm_dense(std::int64_t L, std::int64_t Hq, std::int64_t Hk, std::int64_t d, std::uint64_t seed) {
  Dense D(1, L, L, Hq, Hk, d, d, seed);
  blasst::WorkloadSpec s;
  s.kind = blasst::WorkloadKind::llm;
  s.seq_len = L;
  s.heads_q = Hq;
  s.heads_k = Hk;
  s.head_dim = d;
  s.seed = seed;
  blasst::Workload w = blasst::make_workload(s);
  D.q = w.q;
  D.k = w.k;
  D.v = w.v;
  return D;
}

}  // namespace blasst::test
