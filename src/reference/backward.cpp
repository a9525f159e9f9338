// SPEC §9 backward on the CPU: the exact gradient of the kept-tiles attention with the skip set
// held fixed, accumulated in float64.
//
// With P_ij = exp(s_ij - LSE_i) over the visible keys of the kept tiles (0 elsewhere; LSE is the
// forward's, over kept keys), D_i = sum_c dO_ic O_ic:
//   dV_j = sum_i P_ij dO_i,   dS_ij = P_ij (dO_i . v_j - D_i),
//   dQ_i = scale sum_j dS_ij k_j,   dK_j = scale sum_i dS_ij q_i.
// With an upstream dLSE (optional), dS_ij = P_ij (dO_i . v_j - D_i + dLSE_i): dLSE_i/ds_ij = P_ij.
// A skipped (vote group, key tile) pair is a block mask: its scores are not even computed.
// Work unit = one (sequence, KV head): it owns dK/dV of that head and dQ of its g query heads,
// so units run independently on threads. The skip set comes from the caller (recorded by
// reference::attention) or is recomputed here by running that same forward with recording: the
// vote lives in one place (reference.cpp).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/half.hpp"
#include "core/problem.hpp"
#include "core/skip_set.hpp"
#include "reference/worker_pool.hpp"

namespace blasst {

void SkipSet::resize(const VoteGranularity& vote_, std::int64_t batch_, std::int64_t heads_,
                     std::int64_t groups_, std::int64_t tiles_) {
  vote = vote_;
  batch = batch_;
  heads = heads_;
  groups = groups_;
  tiles = tiles_;
  bits.assign(static_cast<std::size_t>((batch * heads * groups * tiles + 7) / 8), 0);
}

std::int64_t SkipSet::count() const {
  std::int64_t n = 0;
  for (const std::uint8_t b : bits) n += __builtin_popcount(b);
  return n;
}

namespace {

using i64 = std::int64_t;


double load(const void* base, i64 off, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[off];
    case DType::f64: return static_cast<const double*>(base)[off];
    case DType::f16: return f16_to_float(static_cast<const std::uint16_t*>(base)[off]);
    case DType::bf16: return bf16_to_float(static_cast<const std::uint16_t*>(base)[off]);
  }
  return 0.0;
}

void store(void* base, i64 off, DType t, double x) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[off] = static_cast<float>(x); break;
    case DType::f64: static_cast<double*>(base)[off] = x; break;
    case DType::f16: static_cast<std::uint16_t*>(base)[off] = float_to_f16(static_cast<float>(x)); break;
    case DType::bf16: static_cast<std::uint16_t*>(base)[off] = float_to_bf16(static_cast<float>(x)); break;
  }
}

// Element offset of row (b, i, h) of a [B, L, H, x] or ragged [T, H, x] tensor.
struct Rows {
  const Tensor* t;
  bool ragged;
  const std::vector<i64>* start;
  i64 at(i64 b, i64 i, i64 h) const {
    if (ragged) return ((*start)[b] + i) * t->stride[0] + h * t->stride[1];
    return b * t->stride[0] + i * t->stride[1] + h * t->stride[2];
  }
};

struct Unit {
  i64 b, kh;
};

class Backward {
 public:
  Backward(const AttentionBackwardProblem& p, const detail::ResolvedAttention& r, const SkipSet* set)
      : p_(p), r_(r), set_(set) {}

  void run(const Unit& u) {
    const i64 Lq = r_.q_len[u.b], Lk = r_.k_len[u.b], d = r_.d, dv = r_.dv, g = r_.group;
    const double scale = r_.scale;
    const Rows qr{&p_.q, r_.ragged, &r_.q_start}, outr{&p_.out, r_.ragged, &r_.q_start},
        dor{&p_.dout, r_.ragged, &r_.q_start}, dqr{&p_.dq, r_.ragged, &r_.q_start},
        kr{&p_.k, r_.ragged, &r_.k_start}, vr{&p_.v, r_.ragged, &r_.k_start},
        dkr{&p_.dk, r_.ragged, &r_.k_start}, dvr{&p_.dv, r_.ragged, &r_.k_start};
    K_.resize(static_cast<std::size_t>(Lk * d));
    V_.resize(static_cast<std::size_t>(Lk * dv));
    dK_.assign(static_cast<std::size_t>(Lk * d), 0.0);
    dV_.assign(static_cast<std::size_t>(Lk * dv), 0.0);
    for (i64 j = 0; j < Lk; ++j) {
      for (i64 c = 0; c < d; ++c) K_[j * d + c] = load(p_.k.data, kr.at(u.b, j, u.kh) + c, p_.k.dtype);
      for (i64 c = 0; c < dv; ++c) V_[j * dv + c] = load(p_.v.data, vr.at(u.b, j, u.kh) + c, p_.v.dtype);
    }
    q_.resize(d);
    dq_.resize(d);
    do_.resize(dv);
    const i64 T = set_ ? set_->vote.tile_keys : std::max<i64>(Lk, 1);
    const i64 rows = set_ ? set_->vote.rows : 1;
    for (i64 hh = 0; hh < g; ++hh) {
      const i64 h = u.kh * g + hh;
      for (i64 i = 0; i < Lq; ++i) {
        std::fill(dq_.begin(), dq_.end(), 0.0);
        const i64 lim = std::min(Lk - 1, p_.mask == MaskKind::causal ? i + Lk - Lq : Lk - 1);
        for (i64 c = 0; c < d; ++c) q_[c] = load(p_.q.data, qr.at(u.b, i, h) + c, p_.q.dtype);
        double lse;
        if (has_lse_) {
          const i64 off = r_.ragged ? h * p_.lse.stride[0] + (r_.q_start[u.b] + i) * p_.lse.stride[1]
                                    : u.b * p_.lse.stride[0] + h * p_.lse.stride[1] + i * p_.lse.stride[2];
          lse = load(p_.lse.data, off, p_.lse.dtype);
        } else {
          lse = kept_lse(u, h, i, lim, T, rows, d, scale);
        }
        double dlse = 0.0;
        if (p_.dlse.defined()) {
          const i64 off = r_.ragged ? h * p_.dlse.stride[0] + (r_.q_start[u.b] + i) * p_.dlse.stride[1]
                                    : u.b * p_.dlse.stride[0] + h * p_.dlse.stride[1] + i * p_.dlse.stride[2];
          dlse = load(p_.dlse.data, off, p_.dlse.dtype);
        }
        // A row that saw nothing (LSE = -inf, O = 0) has no gradient.
        if (lim >= 0 && lse != -std::numeric_limits<double>::infinity()) {
          double D = 0.0;
          for (i64 c = 0; c < dv; ++c) {
            do_[c] = load(p_.dout.data, dor.at(u.b, i, h) + c, p_.dout.dtype);
            D += do_[c] * load(p_.out.data, outr.at(u.b, i, h) + c, p_.out.dtype);
          }
          D -= dlse;  // dS = P (dP - D + dlse)
          for (i64 j0 = 0; j0 <= lim; j0 += T) {
            if (set_ && set_->skipped(u.b, h, i / rows, j0 / T)) continue;  // block mask
            const i64 j1 = std::min(lim, j0 + T - 1);
            for (i64 j = j0; j <= j1; ++j) {
              const double* kj = &K_[j * d];
              const double* vj = &V_[j * dv];
              double s = 0.0, dp = 0.0;
              for (i64 c = 0; c < d; ++c) s += q_[c] * kj[c];
              const double pij = std::exp(s * scale - lse);
              for (i64 c = 0; c < dv; ++c) dp += do_[c] * vj[c];
              const double ds = pij * (dp - D);
              double* dkj = &dK_[j * d];
              double* dvj = &dV_[j * dv];
              for (i64 c = 0; c < d; ++c) {
                dq_[c] += ds * kj[c];
                dkj[c] += ds * q_[c];
              }
              for (i64 c = 0; c < dv; ++c) dvj[c] += pij * do_[c];
            }
          }
        }
        for (i64 c = 0; c < d; ++c) store(p_.dq.data, dqr.at(u.b, i, h) + c, p_.dq.dtype, scale * dq_[c]);
      }
    }
    for (i64 j = 0; j < Lk; ++j) {
      for (i64 c = 0; c < d; ++c) store(p_.dk.data, dkr.at(u.b, j, u.kh) + c, p_.dk.dtype, scale * dK_[j * d + c]);
      for (i64 c = 0; c < dv; ++c) store(p_.dv.data, dvr.at(u.b, j, u.kh) + c, p_.dv.dtype, dV_[j * dv + c]);
    }
  }

 private:
  // log sum_j exp(s_ij) over the visible keys of the kept tiles of row i (q_ loaded), two passes
  // (max, then sum); -inf when nothing is kept. NaN scores propagate (NaN rule).
  double kept_lse(const Unit& u, i64 h, i64 i, i64 lim, i64 T, i64 rows, i64 d, double scale) {
    const double ninf = -std::numeric_limits<double>::infinity();
    s_.assign(static_cast<std::size_t>(std::max<i64>(lim + 1, 0)), ninf);
    double mx = ninf;
    bool nan = false;
    for (i64 j0 = 0; j0 <= lim; j0 += T) {
      if (set_ && set_->skipped(u.b, h, i / rows, j0 / T)) continue;
      for (i64 j = j0; j <= std::min(lim, j0 + T - 1); ++j) {
        double s = 0.0;
        for (i64 c = 0; c < d; ++c) s += q_[c] * K_[j * d + c];
        s_[j] = s * scale;
        nan |= std::isnan(s_[j]);
        mx = std::max(mx, s_[j]);
      }
    }
    if (nan) return std::numeric_limits<double>::quiet_NaN();
    if (mx == ninf) return ninf;
    double l = 0.0;
    for (const double s : s_)
      if (s != ninf) l += std::exp(s - mx);
    return mx + std::log(l);
  }

  const AttentionBackwardProblem& p_;
  const detail::ResolvedAttention& r_;
  const SkipSet* set_;
  const bool has_lse_ = p_.lse.defined() || p_.lse.rank != 0;
  std::vector<double> K_, V_, dK_, dV_, q_, dq_, do_, s_;
};

}  // namespace

namespace reference {

void attention_backward(const AttentionBackwardProblem& p, const SkipConfig& skip_in,
                        const RunOptions& opt, const SkipSet* skip_set) {
  const AttentionProblem fwd = detail::forward_of(p);
  const detail::ResolvedAttention r = detail::validate_attention_backward(p, DeviceKind::cpu);
  const SkipConfig skip = detail::with_effective_order(skip_in, r);  // as the forward (SPEC §2a)
  validate(skip);
  if (opt.num_threads < 0) throw Error("num_threads must be >= 0, got " + std::to_string(opt.num_threads));

  // The set's dimensions (SkipSetShape): the problem's bounds, as the forward recorded them.
  const SkipSetShape shape = detail::skip_set_shape_of(r, skip.vote);
  SkipSet recomputed;
  const SkipSet* set = nullptr;
  if (p.skip_set != nullptr) {
    if (skip_set != nullptr) throw Error("skip_set: given twice (as words in the problem and as a SkipSet)");
    detail::check_skip_set_words(p.skip_set_words, shape, "skip_set_words");
    recomputed = detail::unpack_skip_set_words(p.skip_set, shape);
    set = &recomputed;
  } else if (skip_set) {
    detail::validate_skip_set(*skip_set, skip, r.batch, r.hq, r.max_q_len, r.max_k_len);
    set = skip_set;
  } else if (skip.enabled) {
    // Recompute the forward's skip set exactly: the same engine, inputs and settings (opt.fp64
    // included: the scores the vote reads depend on it). Its O and LSE go to scratch buffers.
    std::vector<double> out_scratch(static_cast<std::size_t>(p.out.numel()));
    AttentionProblem f = fwd;
    f.out = p.out.rank == 4 ? Tensor::contiguous(out_scratch.data(), DType::f64,
                                                 {p.out.shape[0], p.out.shape[1], p.out.shape[2], p.out.shape[3]})
                            : Tensor::contiguous(out_scratch.data(), DType::f64,
                                                 {p.out.shape[0], p.out.shape[1], p.out.shape[2]});
    f.lse = Tensor{};
    RunOptions fo;
    fo.fp64 = opt.fp64;
    fo.num_threads = opt.num_threads;
    reference::attention(f, skip, fo, nullptr, &recomputed);
    set = &recomputed;
  }

  std::vector<Unit> units;
  for (i64 b = 0; b < r.batch; ++b)
    for (i64 kh = 0; kh < r.hk; ++kh) units.push_back({b, kh});
  detail::run_workers(detail::worker_count(opt.num_threads, units.size()), units.size(),
                      [&](unsigned, detail::WorkQueue& queue) {
                        Backward bw(p, r, set);
                        for (std::size_t i; queue.take(i);) bw.run(units[i]);
                      });
}

}  // namespace reference
}  // namespace blasst
