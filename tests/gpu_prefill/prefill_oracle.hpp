// Test helpers for the GPU prefill kernel: case description, 16-bit input rounding, the kernel
// call through host staging (RunOptions::device = cuda), and an independent float64 oracle that
// reproduces the kernel's vote groups (64 rows x 1 head x 128 keys, natural order) and also
// gives the error of a naive 16-bit implementation (the tolerance yardstick).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/half.hpp"
#include "blasst/workloads.hpp"
#include "gpu_common.hpp"

namespace blasst::test {

struct Case {
  std::int64_t B = 1, Lq = 128, Lk = 128, hq = 2, hk = 2, d = 128;
  std::vector<std::int64_t> lq, lk;  // ragged when non-empty (B = size)
  bool causal = false;
  DType dt = DType::bf16;
  bool out_f32 = false;
  std::string name() const {
    std::string s = (lq.empty() ? "B" + std::to_string(B) + " Lq" + std::to_string(Lq) + " Lk" + std::to_string(Lk)
                                : "ragged" + std::to_string(lq.size())) +
                    " hq" + std::to_string(hq) + " hk" + std::to_string(hk) + " d" + std::to_string(d) +
                    (causal ? " causal " : " full ") + to_string(dt) + (out_f32 ? " out=f32" : "");
    return s;
  }
  bool ragged() const { return !lq.empty(); }
  std::int64_t nseq() const { return ragged() ? std::int64_t(lq.size()) : B; }
  std::int64_t qlen(std::int64_t b) const { return ragged() ? lq[b] : Lq; }
  std::int64_t klen(std::int64_t b) const { return ragged() ? lk[b] : Lk; }
  std::int64_t qstart(std::int64_t b) const {
    if (!ragged()) return b * Lq;
    std::int64_t s = 0;
    for (std::int64_t i = 0; i < b; ++i) s += lq[i];
    return s;
  }
  std::int64_t kstart(std::int64_t b) const {
    if (!ragged()) return b * Lk;
    std::int64_t s = 0;
    for (std::int64_t i = 0; i < b; ++i) s += lk[i];
    return s;
  }
  std::int64_t tq() const { return qstart(nseq()); }
  std::int64_t tk() const { return kstart(nseq()); }
};

inline std::uint16_t to16(float x, DType dt) { return dt == DType::bf16 ? float_to_bf16(x) : float_to_f16(x); }
inline float from16(std::uint16_t h, DType dt) { return dt == DType::bf16 ? bf16_to_float(h) : f16_to_float(h); }

// Inputs in the token-major layout [tokens, heads, d] (batched B x L flattened), already rounded
// to the 16-bit type; `qf`/`kf`/`vf` hold the rounded values as floats for the oracle.
struct Inputs {
  std::vector<std::uint16_t> q, k, v;
  std::vector<float> qf, kf, vf;
};

inline Inputs make_inputs(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                          const std::vector<float>& v) {
  Inputs in;
  auto cvt = [&](const std::vector<float>& x, std::vector<std::uint16_t>& h, std::vector<float>& f) {
    h.resize(x.size());
    f.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) { h[i] = to16(x[i], c.dt); f[i] = from16(h[i], c.dt); }
  };
  cvt(q, in.q, in.qf);
  cvt(k, in.k, in.kf);
  cvt(v, in.v, in.vf);
  return in;
}

// llm-like data (docs/workloads.md) so that skip thresholds find tiles to skip; queries and keys
// are the first Lq rows of one workload sequence.
inline Inputs llm_inputs(const Case& c, std::uint64_t seed) {
  WorkloadSpec ws;
  ws.kind = WorkloadKind::llm;
  ws.batch = c.B;
  ws.seq_len = c.Lq;
  ws.heads_q = c.hq;
  ws.heads_k = c.hk;
  ws.head_dim = c.d;
  ws.seed = seed;
  Workload w = make_workload(ws);
  return make_inputs(c, w.q, w.k, w.v);
}

// llm-like data per sequence of a ragged (or batched) case: sequence b is its own workload (seed
// + b) of max(Lq, Lk) tokens; queries are its last Lq rows (causal bottom-right alignment), keys
// and values its first Lk rows.
inline Inputs llm_ragged_inputs(const Case& c, std::uint64_t seed) {
  std::vector<float> q, k, v;
  for (std::int64_t b = 0; b < c.nseq(); ++b) {
    const std::int64_t lq = c.qlen(b), lk = c.klen(b);
    WorkloadSpec ws;
    ws.kind = WorkloadKind::llm;
    ws.seq_len = std::max<std::int64_t>(1, std::max(lq, lk));
    ws.heads_q = c.hq;
    ws.heads_k = c.hk;
    ws.head_dim = c.d;
    ws.seed = seed + std::uint64_t(b);
    const Workload w = make_workload(ws);
    const std::size_t qrow = std::size_t(c.hq * c.d), krow = std::size_t(c.hk * c.d);
    q.insert(q.end(), w.q.begin() + std::ptrdiff_t(std::size_t(ws.seq_len - lq) * qrow), w.q.end());
    k.insert(k.end(), w.k.begin(), w.k.begin() + std::ptrdiff_t(std::size_t(lk) * krow));
    v.insert(v.end(), w.v.begin(), w.v.begin() + std::ptrdiff_t(std::size_t(lk) * krow));
  }
  return make_inputs(c, q, k, v);
}

inline std::vector<float> randn(std::size_t n, std::mt19937_64& g, float sd = 1.f) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

inline Inputs random_inputs(const Case& c, std::uint64_t seed, float sd = 1.f) {
  std::mt19937_64 g(seed);
  auto q = randn(std::size_t(c.tq() * c.hq * c.d), g, sd);
  auto k = randn(std::size_t(c.tk() * c.hk * c.d), g, sd);
  auto v = randn(std::size_t(c.tk() * c.hk * c.d), g);
  return make_inputs(c, q, k, v);
}

struct KernelOut {
  std::vector<float> o;    // [tokens, hq, d]
  std::vector<float> lse;  // batched [B, hq, Lq]; ragged [hq, Tq]
};

// Runs blasst::attention on the GPU through host staging; outputs are poisoned with NaN first.
// skip_set: when given, the call also records its skip set (SPEC §9) into these words (sized by
// skip_set_shape, poisoned with all bits set first).
// seed: when given, the seeded maxima (SPEC §2a, AttentionProblem::seed_max) in lse's layout.
inline KernelOut run_gpu(const Case& c, const Inputs& in, const SkipConfig& skip = {},
                         const RunOptions& base = {}, SkipStats* stats = nullptr,
                         std::vector<std::uint32_t>* skip_set = nullptr,
                         const std::vector<float>* seed = nullptr) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::int64_t tq = c.tq(), tk = c.tk();
  std::vector<std::uint16_t> o16(std::size_t(tq * c.hq * c.d), to16(nan, c.dt));
  std::vector<float> o32(std::size_t(tq * c.hq * c.d), nan);
  KernelOut r;
  r.lse.assign(std::size_t(tq * c.hq), nan);
  std::vector<std::int32_t> cq, ck;
  AttentionProblem p;
  void* qd = const_cast<std::uint16_t*>(in.q.data());
  void* kd = const_cast<std::uint16_t*>(in.k.data());
  void* vd = const_cast<std::uint16_t*>(in.v.data());
  void* od = c.out_f32 ? static_cast<void*>(o32.data()) : static_cast<void*>(o16.data());
  const DType odt = c.out_f32 ? DType::f32 : c.dt;
  if (!c.ragged()) {
    p.q = Tensor::contiguous(qd, c.dt, {c.B, c.Lq, c.hq, c.d});
    p.k = Tensor::contiguous(kd, c.dt, {c.B, c.Lk, c.hk, c.d});
    p.v = Tensor::contiguous(vd, c.dt, {c.B, c.Lk, c.hk, c.d});
    p.out = Tensor::contiguous(od, odt, {c.B, c.Lq, c.hq, c.d});
    p.lse = Tensor::contiguous(r.lse.data(), DType::f32, {c.B, c.hq, c.Lq});
    if (seed != nullptr)
      p.seed_max = Tensor::contiguous(const_cast<float*>(seed->data()), DType::f32, {c.B, c.hq, c.Lq});
  } else {
    for (std::int64_t b = 0; b <= c.nseq(); ++b) {
      cq.push_back(std::int32_t(c.qstart(b)));
      ck.push_back(std::int32_t(c.kstart(b)));
    }
    p.q = Tensor::contiguous(qd, c.dt, {tq, c.hq, c.d});
    p.k = Tensor::contiguous(kd, c.dt, {tk, c.hk, c.d});
    p.v = Tensor::contiguous(vd, c.dt, {tk, c.hk, c.d});
    p.out = Tensor::contiguous(od, odt, {tq, c.hq, c.d});
    p.lse = Tensor::contiguous(r.lse.data(), DType::f32, {c.hq, tq});
    if (seed != nullptr) p.seed_max = Tensor::contiguous(const_cast<float*>(seed->data()), DType::f32, {c.hq, tq});
    p.cu_seqlens_q = cq.data();
    p.cu_seqlens_k = ck.data();
    p.batch = c.nseq();
  }
  p.mask = c.causal ? MaskKind::causal : MaskKind::full;
  RunOptions opt = base;
  opt.device = DeviceKind::cuda;
  if (skip_set != nullptr) {
    skip_set->assign(std::size_t(skip_set_shape(p, skip, opt).words()), 0xffffffffu);
    p.skip_set = skip_set->data();
    p.skip_set_words = std::int64_t(skip_set->size());
  }
  attention(p, skip, opt, stats);
  if (c.out_f32) {
    r.o = std::move(o32);
  } else {
    r.o.resize(o16.size());
    for (std::size_t i = 0; i < o16.size(); ++i) r.o[i] = from16(o16[i], c.dt);
  }
  return r;
}

// Oracle results, in the kernel's output layouts.
struct Oracle {
  std::vector<double> o, lse;          // exact (float64) result, with the oracle's skips applied
  std::vector<float> o_naive, lse_naive;  // naive 16-bit implementation (dense only)
  std::vector<std::int64_t> visited, skipped, ties;  // per query head
  std::vector<std::vector<float>> deltas;           // per query head, every visited pair
  std::vector<float> all_deltas;  // every visited pair in the reference's task order (b, h, r0)
};

inline std::int64_t lse_index(const Case& c, std::int64_t b, std::int64_t h, std::int64_t i) {
  return c.ragged() ? h * c.tq() + c.qstart(b) + i : (b * c.hq + h) * c.Lq + i;
}

// ln_lambda per sequence (-inf: dense). Vote groups: rows [64 g, 64 g + 64) of one head.
inline Oracle oracle(const Case& c, const Inputs& in, const std::vector<double>& ln_lambda,
                     bool naive = true, double tie_eps = kTieEps) {
  const double ninf = -std::numeric_limits<double>::infinity();
  const double scale = 1.0 / std::sqrt(double(c.d));
  const std::int64_t D = c.d, T = 128, g = c.hq / c.hk;
  Oracle r;
  r.o.assign(std::size_t(c.tq() * c.hq * D), 0.0);
  r.lse.assign(std::size_t(c.tq() * c.hq), ninf);
  if (naive) {
    r.o_naive.assign(r.o.size(), 0.f);
    r.lse_naive.assign(r.lse.size(), -std::numeric_limits<float>::infinity());
  }
  r.visited.assign(c.hq, 0);
  r.skipped.assign(c.hq, 0);
  r.ties.assign(c.hq, 0);
  r.deltas.assign(c.hq, {});
  struct Task { std::int64_t b, h; };
  std::vector<Task> tasks;
  for (std::int64_t b = 0; b < c.nseq(); ++b)
    for (std::int64_t h = 0; h < c.hq; ++h) tasks.push_back({b, h});
  std::vector<std::vector<std::int64_t>> tv(tasks.size()), ts(tasks.size()), tt(tasks.size());
  std::vector<std::vector<float>> td(tasks.size());

  auto work = [&](std::size_t ti) {
    const auto [b, h] = tasks[ti];
    const std::int64_t Lq = c.qlen(b), Lk = c.klen(b), q0 = c.qstart(b), k0 = c.kstart(b);
    const std::int64_t kh = h / g;
    std::int64_t vis = 0, skp = 0, tie = 0;
    std::vector<double> s(std::size_t(64 * std::max<std::int64_t>(Lk, 1)));
    std::vector<std::int64_t> lim(64);
    std::vector<char> keep;
    for (std::int64_t r0 = 0; r0 < Lq; r0 += 64) {
      const std::int64_t nr = std::min<std::int64_t>(64, Lq - r0);
      std::int64_t glim = -1;
      for (std::int64_t i = 0; i < nr; ++i) {
        const std::int64_t row = r0 + i;
        lim[i] = std::min(c.causal ? row + Lk - Lq : Lk - 1, Lk - 1);
        glim = std::max(glim, lim[i]);
        const float* qr = &in.qf[std::size_t(((q0 + row) * c.hq + h) * D)];
        for (std::int64_t j = 0; j <= lim[i]; ++j) {
          const float* kr = &in.kf[std::size_t(((k0 + j) * c.hk + kh) * D)];
          double acc = 0;
          for (std::int64_t x = 0; x < D; ++x) acc += double(qr[x]) * kr[x];
          s[i * Lk + j] = acc * scale;
        }
      }
      const std::int64_t ntiles = (Lk + T - 1) / T;
      const std::int64_t n_vis = glim < 0 ? 0 : std::min(ntiles, glim / T + 1);
      keep.assign(std::size_t(n_vis), 1);
      std::vector<double> m(std::size_t(nr), ninf);
      for (std::int64_t t = 0; t < n_vis; ++t) {
        double delta = ninf;
        std::vector<double> tmax(std::size_t(nr), ninf);
        for (std::int64_t i = 0; i < nr; ++i) {
          for (std::int64_t j = t * T; j <= std::min(lim[i], t * T + T - 1); ++j)
            tmax[i] = std::max(tmax[i], s[i * Lk + j]);
          if (tmax[i] != ninf) delta = std::max(delta, tmax[i] - m[i]);
        }
        ++vis;
        td[ti].push_back(float(delta));
        const double ln = ln_lambda[std::size_t(b)];
        if (ln != ninf && std::abs(delta - ln) < tie_eps) ++tie;
        if (ln != ninf && delta < ln) { keep[t] = 0; ++skp; continue; }
        for (std::int64_t i = 0; i < nr; ++i) m[i] = std::max(m[i], tmax[i]);
      }
      for (std::int64_t i = 0; i < nr; ++i) {
        const std::int64_t row = r0 + i, tok = q0 + row;
        const std::size_t ob = std::size_t((tok * c.hq + h) * D);
        const std::size_t li = std::size_t(lse_index(c, b, h, row));
        // Exact over kept tiles.
        double mx = ninf;
        for (std::int64_t j = 0; j <= lim[i]; ++j) if (keep[j / T]) mx = std::max(mx, s[i * Lk + j]);
        if (mx != ninf) {
          double l = 0;
          std::vector<double> acc(std::size_t(D), 0.0);
          for (std::int64_t j = 0; j <= lim[i]; ++j) {
            if (!keep[j / T]) continue;
            const double p = std::exp(s[i * Lk + j] - mx);
            l += p;
            const float* vr = &in.vf[std::size_t(((k0 + j) * c.hk + kh) * D)];
            for (std::int64_t x = 0; x < D; ++x) acc[x] += p * vr[x];
          }
          for (std::int64_t x = 0; x < D; ++x) r.o[ob + x] = acc[x] / l;
          r.lse[li] = mx + std::log(l);
        }
        if (naive) {
          // Naive 16-bit implementation: fp32 scores and softmax over all visible keys,
          // P rounded to the input type, fp32 accumulation, O rounded to the output type.
          float fm = -std::numeric_limits<float>::infinity();
          for (std::int64_t j = 0; j <= lim[i]; ++j) fm = std::max(fm, float(s[i * Lk + j]));
          if (fm == -std::numeric_limits<float>::infinity()) continue;
          float fl = 0;
          for (std::int64_t j = 0; j <= lim[i]; ++j) fl += std::exp(float(s[i * Lk + j]) - fm);
          std::vector<float> acc(std::size_t(D), 0.f);
          for (std::int64_t j = 0; j <= lim[i]; ++j) {
            const float p = from16(to16(std::exp(float(s[i * Lk + j]) - fm) / fl, c.dt), c.dt);
            const float* vr = &in.vf[std::size_t(((k0 + j) * c.hk + kh) * D)];
            for (std::int64_t x = 0; x < D; ++x) acc[x] += p * vr[x];
          }
          for (std::int64_t x = 0; x < D; ++x)
            r.o_naive[ob + x] = c.out_f32 ? acc[x] : from16(to16(acc[x], c.dt), c.dt);
          r.lse_naive[li] = fm + std::log(fl);
        }
      }
    }
    tv[ti] = {vis};
    ts[ti] = {skp};
    tt[ti] = {tie};
  };
  const unsigned nth = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (unsigned w = 0; w < nth; ++w)
    th.emplace_back([&, w] { for (std::size_t i = w; i < tasks.size(); i += nth) work(i); });
  for (auto& x : th) x.join();
  for (std::size_t ti = 0; ti < tasks.size(); ++ti) {
    const std::int64_t h = tasks[ti].h;
    r.visited[h] += tv[ti][0];
    r.skipped[h] += ts[ti][0];
    r.ties[h] += tt[ti][0];
    r.deltas[h].insert(r.deltas[h].end(), td[ti].begin(), td[ti].end());
    r.all_deltas.insert(r.all_deltas.end(), td[ti].begin(), td[ti].end());
  }
  return r;
}

// Max |a - ref| over finite reference entries; infinite reference entries must match exactly.
// Returns +inf on NaN or on a mismatch of infinities.
template <class A, class R>
inline double max_err(const std::vector<A>& a, const std::vector<R>& ref) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = double(a[i]), y = double(ref[i]);
    if (std::isnan(x)) return std::numeric_limits<double>::infinity();
    if (std::isinf(y) || std::isinf(x)) {
      if (x != y) return std::numeric_limits<double>::infinity();
      continue;
    }
    e = std::max(e, std::abs(x - y));
  }
  return e;
}

}  // namespace blasst::test
