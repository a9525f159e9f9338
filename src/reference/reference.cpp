// The CPU oracle (SPEC §1-§5): streaming online-softmax attention over key tiles with the
// Skip-Softmax vote, for prefill (attention) and decode (contiguous or paged KV cache).
//
// Work unit = one vote group: `vote.rows` consecutive query rows x `vote.heads` query heads of one
// KV group of one sequence. Each group owns its rows, so groups run independently on threads.
// Per group and visited tile (in the visit order): scores S = scale * Q K^T (fp32 or fp64), the
// tile maxima, delta = max_r (tile_max_r - m_r) with m_r before the tile, the skip test
// float(delta) < ln(lambda), then the usual online-softmax update when not skipped.
// With the FP8 screen (SPEC §2b) the screen's decision comes first and stands; the exact delta
// is computed anyway, to count wrong screens.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/fp8.hpp"
#include "blasst/half.hpp"
#include "core/problem.hpp"
#include "core/skip_set.hpp"
#include "reference/worker_pool.hpp"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
// AVX2 clone of the two inner kernels (no FMA: identical rounding on every x86-64 machine).
#define BLASST_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define BLASST_KERNEL
#endif

namespace blasst {
namespace {

using i64 = std::int64_t;

// The running maximum of the NaN rule (docs/reference.md), as the kernels' running_max
// (src/cuda/sm90/common/skip_policy.hpp): max with NaN propagating, for tile maxima, the running
// max m and the group delta. (std::max drops a NaN second argument and keeps a NaN first one.)
template <class Acc>
Acc running_max(Acc a, Acc b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<Acc>::quiet_NaN();
  return a < b ? b : a;
}

// ---- addressing of every layout the two entry points accept -----------------------------------
struct View {
  i64 batch = 0, hq = 0, hk = 0, g = 1, d = 0, dv = 0;
  MaskKind mask = MaskKind::full;
  bool decode = false;
  double scale = 1.0;
  std::vector<i64> q_len, k_len;
  // Element offsets: q/out row (b, i, h) = base[b] + i * s_i + h * s_h; lse (b, h, i) likewise.
  std::vector<i64> q_base, o_base, lse_base, k_base, v_base;
  i64 q_si = 0, q_sh = 0, o_si = 0, o_sh = 0, lse_si = 0, lse_sh = 0;
  i64 k_sj = 0, k_sh = 0, v_sj = 0, v_sh = 0;
  // Paged cache: key j of sequence b lives in page page_table[b * pt_stride + j / page_size].
  const std::int32_t* page_table = nullptr;
  i64 pt_stride = 0, page_size = 0, k_sp = 0, v_sp = 0;
  const void *qd = nullptr, *kd = nullptr, *vd = nullptr;
  void *od = nullptr, *lsed = nullptr;
  DType in_t = DType::f32, out_t = DType::f32, lse_t = DType::f32;
  // Seeded maxima (prefill seed_max, SPEC §2a): row (b, h, i) at seed_base[b] + h * seed_sh +
  // i * seed_si; nullptr: no seed.
  const void* seedd = nullptr;
  DType seed_t = DType::f32;
  std::vector<i64> seed_base;
  i64 seed_si = 0, seed_sh = 0;

  i64 k_off(i64 b, i64 j, i64 kh) const {
    if (page_table) {
      const i64 pg = page_table[b * pt_stride + j / page_size];
      return pg * k_sp + (j % page_size) * k_sj + kh * k_sh;
    }
    return k_base[b] + j * k_sj + kh * k_sh;
  }
  i64 v_off(i64 b, i64 j, i64 kh) const {
    if (page_table) {
      const i64 pg = page_table[b * pt_stride + j / page_size];
      return pg * v_sp + (j % page_size) * v_sj + kh * v_sh;
    }
    return v_base[b] + j * v_sj + kh * v_sh;
  }
};

// Fields shared by both phases: shapes, data pointers, dtypes and the row/head strides of a
// layout whose sequence dimension is `o` (0 for ragged [T, H, d], 1 for [B, L, H, d]).
template <class Resolved>
View make_view(const Resolved& r, const Tensor& q, const Tensor& k, const Tensor& v_,
               const Tensor& out, const Tensor& lse, int o) {
  View v;
  v.batch = r.batch;
  v.hq = r.hq;
  v.hk = r.hk;
  v.g = r.group;
  v.d = r.d;
  v.dv = r.dv;
  v.mask = r.mask;
  v.scale = r.scale;
  v.k_len = r.k_len;
  v.qd = q.data;
  v.kd = k.data;
  v.vd = v_.data;
  v.od = out.data;
  v.lsed = lse.data;
  v.in_t = r.dtype;
  v.out_t = out.dtype;
  v.lse_t = lse.dtype;
  v.q_si = q.stride[o];
  v.q_sh = q.stride[o + 1];
  v.o_si = out.stride[o];
  v.o_sh = out.stride[o + 1];
  v.k_sj = k.stride[o];
  v.k_sh = k.stride[o + 1];
  v.v_sj = v_.stride[o];
  v.v_sh = v_.stride[o + 1];
  if (lse.defined()) {
    v.lse_sh = lse.stride[o];
    v.lse_si = lse.stride[o + 1];
  }
  return v;
}

// The dtype switch sits outside the element loop.
template <class Acc>
void load_row(Acc* dst, const void* base, i64 off, DType t, i64 n) {
  switch (t) {
    case DType::f32: {
      const float* s = static_cast<const float*>(base) + off;
      for (i64 i = 0; i < n; ++i) dst[i] = static_cast<Acc>(s[i]);
      break;
    }
    case DType::f64: {
      const double* s = static_cast<const double*>(base) + off;
      for (i64 i = 0; i < n; ++i) dst[i] = static_cast<Acc>(s[i]);
      break;
    }
    case DType::f16: {
      const std::uint16_t* s = static_cast<const std::uint16_t*>(base) + off;
      for (i64 i = 0; i < n; ++i) dst[i] = static_cast<Acc>(f16_to_float(s[i]));
      break;
    }
    case DType::bf16: {
      const std::uint16_t* s = static_cast<const std::uint16_t*>(base) + off;
      for (i64 i = 0; i < n; ++i) dst[i] = static_cast<Acc>(bf16_to_float(s[i]));
      break;
    }
  }
}

template <class Acc>
void store_row(void* base, i64 off, DType t, const Acc* src, i64 n) {
  switch (t) {
    case DType::f32: {
      float* s = static_cast<float*>(base) + off;
      for (i64 i = 0; i < n; ++i) s[i] = static_cast<float>(src[i]);
      break;
    }
    case DType::f64: {
      double* s = static_cast<double*>(base) + off;
      for (i64 i = 0; i < n; ++i) s[i] = static_cast<double>(src[i]);
      break;
    }
    case DType::f16: {
      std::uint16_t* s = static_cast<std::uint16_t*>(base) + off;
      for (i64 i = 0; i < n; ++i) s[i] = float_to_f16(static_cast<float>(src[i]));
      break;
    }
    case DType::bf16: {
      std::uint16_t* s = static_cast<std::uint16_t*>(base) + off;
      for (i64 i = 0; i < n; ++i) s[i] = float_to_bf16(static_cast<float>(src[i]));
      break;
    }
  }
}

constexpr int kRB = 4;   // rows per register block
constexpr int kCB = 16;  // columns per register block

i64 round_up(i64 x, i64 m) { return (x + m - 1) / m * m; }

// 32-byte vectors (GCC/Clang vector extension): 8 floats or 4 doubles; lowered to two SSE
// registers in the default clone, one AVX register in the avx2 clone.
template <class Acc>
struct VecT;
template <>
struct VecT<float> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct VecT<double> {
  typedef double type __attribute__((vector_size(32)));
};
template <class Acc>
using Vec = typename VecT<Acc>::type;
template <class Acc>
constexpr int kLanes = static_cast<int>(32 / sizeof(Acc));

template <class Acc>
__attribute__((always_inline)) inline void vload(Vec<Acc>& v, const Acc* p) {
  std::memcpy(&v, p, sizeof v);  // unaligned load; by reference to keep vectors out of the ABI
}
template <class Acc>
__attribute__((always_inline)) inline void vstore(Acc* p, const Vec<Acc>& v) {
  std::memcpy(p, &v, sizeof v);
}

// S[r][j] = sum_c Q[r][c] * Kt[c][j] for r < rows (multiple of kRB), j < cols (multiple of kCB).
// Each output is a sequential sum over c (no FMA contraction: the baseline has none and the
// avx2 clone is not given fma), so the result does not depend on which clone runs.
template <class Acc>
BLASST_KERNEL void qk_kernel(const Acc* __restrict Q, const Acc* __restrict Kt, Acc* __restrict S,
                             i64 rows, i64 d, i64 cols) {
  constexpr int NV = kCB / kLanes<Acc>;
  for (i64 r = 0; r < rows; r += kRB) {
    const Acc* q0 = Q + r * d;
    for (i64 j = 0; j < cols; j += kCB) {
      Vec<Acc> acc[kRB][NV] = {};
      for (i64 c = 0; c < d; ++c) {
        Vec<Acc> kv[NV];
        for (int v = 0; v < NV; ++v) vload(kv[v], Kt + c * cols + j + v * kLanes<Acc>);
        for (int i = 0; i < kRB; ++i) {
          const Acc q = q0[i * d + c];
          for (int v = 0; v < NV; ++v) acc[i][v] += q * kv[v];
        }
      }
      for (int i = 0; i < kRB; ++i)
        for (int v = 0; v < NV; ++v) vstore(S + (r + i) * cols + j + v * kLanes<Acc>, acc[i][v]);
    }
  }
}

// O[r][c] += sum_{j < nk} P[r][j] * V[j][c]; O has dvp (multiple of kCB) columns, P has pcols.
template <class Acc>
BLASST_KERNEL void pv_kernel(const Acc* __restrict P, const Acc* __restrict V, Acc* __restrict O,
                             i64 rows, i64 nk, i64 pcols, i64 dvp) {
  constexpr int NV = kCB / kLanes<Acc>;
  for (i64 r = 0; r < rows; r += kRB) {
    for (i64 c = 0; c < dvp; c += kCB) {
      Vec<Acc> acc[kRB][NV];
      for (int i = 0; i < kRB; ++i)
        for (int v = 0; v < NV; ++v) vload(acc[i][v], O + (r + i) * dvp + c + v * kLanes<Acc>);
      for (i64 j = 0; j < nk; ++j) {
        Vec<Acc> vv[NV];
        for (int v = 0; v < NV; ++v) vload(vv[v], V + j * dvp + c + v * kLanes<Acc>);
        for (int i = 0; i < kRB; ++i) {
          const Acc p = P[(r + i) * pcols + j];
          for (int v = 0; v < NV; ++v) acc[i][v] += p * vv[v];
        }
      }
      for (int i = 0; i < kRB; ++i)
        for (int v = 0; v < NV; ++v) vstore(O + (r + i) * dvp + c + v * kLanes<Acc>, acc[i][v]);
    }
  }
}

// ---- SPEC §2b FP8 screen -------------------------------------------------------------------------
// One quantised vector (a query row or a key): the e4m3 values (unscaled) and, in double, its
// scale and the norms |x|, |x~|, |x - x~| (x~ = scale * value). A non-finite element makes the
// values and norms NaN: such a row or key is never screened.
struct Quantised {
  double scale = 0, norm = 0, qnorm = 0, err = 0;
};

// max |x_c| in float over a finite vector; -1 when an element is not finite (SPEC §2b: a vector with
// a non-finite element has NaN codes and norms and takes no part in its tile's scale).
template <class Acc>
float finite_abs_max(const Acc* x, i64 n) {
  float a = 0;
  for (i64 c = 0; c < n; ++c) {
    const float xf = static_cast<float>(x[c]);
    if (!(std::isfinite(xf) && std::isfinite(x[c]))) return -1.0f;
    a = std::max(a, std::fabs(xf));
  }
  return a;
}

// x quantised with the scale fp32(a / 16) (a: its own max |x_c| for a query row, the tile's for
// a key; finite_abs_max's -1 makes the values and norms NaN), x / scale clamped to [-16, 16]
// (kScreenCodeMax: it only acts where the scale is a rounded subnormal).
template <class Acc>
Quantised quantise(const Acc* x, i64 n, float a, float* values) {
  Quantised r;
  if (a < 0) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (i64 c = 0; c < n; ++c) values[c] = nan;
    r.scale = r.norm = r.qnorm = r.err = std::numeric_limits<double>::quiet_NaN();
    return r;
  }
  const float s = a / kScreenCodeMax;
  r.scale = s;
  double nn = 0, nq = 0, ne = 0;
  for (i64 c = 0; c < n; ++c) {
    const float y = std::clamp(static_cast<float>(x[c]) / s, -kScreenCodeMax, kScreenCodeMax);
    const float v = s > 0.0f ? e4m3_to_float(float_to_e4m3(y)) : 0.0f;
    values[c] = v;
    const double xd = static_cast<double>(x[c]), xq = static_cast<double>(s) * v, e = xd - xq;
    nn += xd * xd;
    nq += xq * xq;
    ne += e * e;
  }
  r.norm = std::sqrt(nn);
  r.qnorm = std::sqrt(nq);
  r.err = std::sqrt(ne);
  return r;
}

// gamma_n(u) = n u / (1 - n u) (the summation bound), +inf where it does not apply.
double gamma_n(double n, double u) {
  return n * u < 0.5 ? n * u / (1.0 - n * u) : std::numeric_limits<double>::infinity();
}

// The smallest Acc >= x.
template <class Acc>
Acc round_upwards(double x) {
  Acc f = static_cast<Acc>(x);
  if (static_cast<double>(f) < x) f = std::nextafter(f, std::numeric_limits<Acc>::infinity());
  return f;
}
// The largest Acc <= x.
template <class Acc>
Acc round_downwards(double x) {
  Acc f = static_cast<Acc>(x);
  if (static_cast<double>(f) > x) f = std::nextafter(f, -std::numeric_limits<Acc>::infinity());
  return f;
}

// Per-tile maxima of the key quantities (SPEC §2b: KN_t, KT_t, EK_t), NaN propagating.
struct KeyTileNorms {
  double norm = 0, qnorm = 0, err = 0;
};

struct Task {
  i64 b, kh, h0, r0, nr;  // sequence, KV head, first query head, first row, rows
};

struct Settings {
  VoteGranularity vote;
  bool stats = false, hist = false, deltas = false;
  std::vector<bool> skip_on;      // per sequence: lambda < 1 and skipping enabled
  std::vector<double> ln_lambda;  // per sequence
  i64 nstat = 0;                  // per-head counters: query heads or KV heads
  Fp8Screen screen;               // SPEC §2b
  bool screen_on = false;         // screen.margin != off
};

struct ThreadStats {
  std::vector<std::int64_t> visited, skipped, screened, screen_wrong;
  std::vector<DeltaHistogram> hist;
};

// The visit order of the tiles 0..n_vis-1 of one vote group (SPEC §2a).
void visit_order(const Settings& st, i64 n_vis, i64 own, std::vector<i64>& order) {
  order.clear();
  if (n_vis <= 0) return;
  if (st.vote.order == VisitOrder::natural) {
    for (i64 t = 0; t < n_vis; ++t) order.push_back(t);
    return;
  }
  own = std::clamp<i64>(own, 0, n_vis - 1);
  order.push_back(0);  // sink tile
  if (own != 0) order.push_back(own);
  for (i64 dist = 1; dist < n_vis; ++dist) {
    const i64 lo = own - dist, hi = own + dist;
    if (lo > 0) order.push_back(lo);
    if (hi < n_vis && hi != 0) order.push_back(hi);
  }
}

template <class Acc>
class Engine {
 public:
  Engine(const View& v, const Settings& s) : v_(v), s_(s) {}

  // skips: when recording the skip set (SPEC §9), the tiles this group skipped are appended.
  // screen_deltas: with deltas and the screen on, each visited pair's delta8 (NaN where the
  // sequence has no screen: skipping off or lambda >= 1).
  void run(const Task& t, ThreadStats& ts, std::vector<float>* deltas, std::vector<float>* screen_deltas,
           std::vector<i64>* skips) {
    const i64 T = s_.vote.tile_keys;
    const i64 Lq = v_.q_len[t.b], Lk = v_.k_len[t.b];
    const i64 nh = t.nr > 0 ? s_.vote.heads : 0;
    const i64 R = nh * t.nr, Rp = round_up(std::max<i64>(R, 1), kRB);
    // A tile never holds more than Lk keys: buffers are sized by min(T, Lk), so a huge
    // vote.tile_keys costs nothing beyond one tile of the input (issue 21).
    const i64 d = v_.d, dv = v_.dv, dvp = round_up(dv, kCB);
    const i64 Tp = round_up(std::max<i64>(1, std::min<i64>(T, Lk)), kCB);
    const Acc ninf = -std::numeric_limits<Acc>::infinity();

    const i64 ntiles = (Lk + T - 1) / T;
    Q_.assign(static_cast<size_t>(Rp * d), Acc(0));
    lim_.resize(R);
    i64 group_lim = -1;
    for (i64 hh = 0; hh < nh; ++hh)
      for (i64 i = 0; i < t.nr; ++i) {
        const i64 ri = hh * t.nr + i, pos = t.r0 + i;
        load_row(&Q_[ri * d], v_.qd, v_.q_base[t.b] + pos * v_.q_si + (t.h0 + hh) * v_.q_sh, v_.in_t, d);
        // Keys j <= lim are visible (causal: bottom-right aligned).
        lim_[ri] = v_.mask == MaskKind::causal ? pos + Lk - Lq : Lk - 1;
        lim_[ri] = std::min(lim_[ri], Lk - 1);
        group_lim = std::max(group_lim, lim_[ri]);
      }
    const i64 n_vis = group_lim < 0 ? 0 : std::min(ntiles, group_lim / T + 1);
    const bool screen = s_.screen_on && s_.skip_on[t.b];
    if (screen) {
      Q8_.assign(static_cast<size_t>(Rp * d), 0.0f);
      qq_.resize(R);
      for (i64 ri = 0; ri < R; ++ri) qq_[ri] = quantise(&Q_[ri * d], d, finite_abs_max(&Q_[ri * d], d), &Q8_[ri * d]);
    }
    // Own tile for max_first: decode and causal: the last visible (diagonal) tile; full
    // attention: the tile holding key r0 * Lk / Lq.
    i64 own = n_vis - 1;
    if (!v_.decode && v_.mask == MaskKind::full && Lq > 0) own = (t.r0 * Lk / Lq) / T;
    const i64 split = s_.vote.split_tiles;
    // max_first with a split layout (SPEC §2a, split-KV decode): every split visits its own tiles
    // in natural order, but starts from running maxima seeded with the scores of the seed tiles
    // (sink tile 0 and the own tile), computed once per vote group.
    const bool seeded = split > 0 && s_.vote.order == VisitOrder::max_first;
    if (seeded) {
      order_.clear();
      for (i64 tt = 0; tt < n_vis; ++tt) order_.push_back(tt);
    } else {
      visit_order(s_, n_vis, own, order_);
    }

    const bool skip_on = s_.skip_on[t.b];
    const double ln_lambda = s_.ln_lambda[t.b];
    const i64 sidx = s_.vote.heads == 1 ? t.h0 : t.kh;

    // Merged state (M, L, OO) and the current split's state (m, l, O).
    M_.assign(R, ninf);
    L_.assign(R, Acc(0));
    OO_.assign(static_cast<size_t>(R * dvp), Acc(0));
    m_.assign(R, ninf);
    l_.assign(R, Acc(0));
    O_.assign(static_cast<size_t>(Rp * dvp), Acc(0));
    if (t.b != cache_b_ || t.kh != cache_kh_) {  // tiles of another (sequence, KV head)
      cache_b_ = t.b;
      cache_kh_ = t.kh;
      k_ok_.assign(static_cast<size_t>(ntiles), 0);
      v_ok_.assign(static_cast<size_t>(ntiles), 0);
      if (s_.screen_on) {
        k8_ok_.assign(static_cast<size_t>(ntiles), 0);
        K8all_.resize(static_cast<size_t>(ntiles * d * Tp));
        SK_.resize(static_cast<size_t>(ntiles * Tp));
        KT_.resize(static_cast<size_t>(ntiles));
      }
      Kall_.resize(static_cast<size_t>(ntiles * d * Tp));
      Vall_.resize(static_cast<size_t>(ntiles * Tp * dvp));
    }
    S_.assign(static_cast<size_t>(Rp * Tp), Acc(0));
    if (screen) S8_.assign(static_cast<size_t>(Rp * Tp), 0.0f);
    tmax_.resize(R);
    row_nan_.assign(R, 0);
    krow_.resize(std::max(d, dv));
    seed_.assign(R, ninf);
    if (seeded && n_vis > 0) {
      for (const i64 st : {i64(0), std::clamp<i64>(own, 0, n_vis - 1)}) {
        scores(t, st, T, Lk, R, Rp, Tp);
        for (i64 ri = 0; ri < R; ++ri) seed_[ri] = running_max(seed_[ri], tmax_[ri]);
      }
    }
    // The caller's seeded maxima (seed_max, e.g. ring attention's seed tiles) join the same seed:
    // a NaN seed is a NaN running max (NaN rule).
    if (v_.seedd) {
      for (i64 hh = 0; hh < nh; ++hh)
        for (i64 i = 0; i < t.nr; ++i) {
          const i64 ri = hh * t.nr + i;
          Acc x = Acc(0);  // load_row writes it (GCC cannot see that)
          load_row(&x, v_.seedd, v_.seed_base[t.b] + (t.h0 + hh) * v_.seed_sh + (t.r0 + i) * v_.seed_si,
                   v_.seed_t, 1);
          seed_[ri] = running_max(seed_[ri], x);
        }
    }
    m_ = seed_;
    lo_ = seed_;  // SPEC §2b screen ahead: the lower bounds start where the maxima do

    i64 cur_split = -1;
    for (const i64 tile : order_) {
      if (split > 0 && tile / split != cur_split) {
        // Splits are visited one after the other; each starts from m = -inf (or the seed).
        if (cur_split >= 0) merge_split(R, dvp);
        cur_split = tile / split;
      }
      const i64 j0 = tile * T, nk = std::min(T, Lk - j0);
      scores(t, tile, T, Lk, R, Rp, Tp);
      // NaN rule: a row whose tile max or running max is NaN (it has seen a NaN score) makes
      // delta NaN, and NaN < ln(lambda) is false: the tile is kept, so the NaN reaches the row.
      Acc delta = ninf;
      for (i64 ri = 0; ri < R; ++ri)
        if (tmax_[ri] != ninf) delta = running_max(delta, tmax_[ri] - m_[ri]);  // m = -inf: +inf
      // The decision uses the delta rounded to float, exactly as recorded (SPEC §5 one-pass curve).
      const float delta_f = static_cast<float>(delta);
      if (s_.stats) {
        ++ts.visited[sidx];
        if (s_.hist) ts.hist[sidx].add(static_cast<double>(delta_f));
        if (deltas) deltas->push_back(delta_f);
      }
      bool skip = skip_on && static_cast<double>(delta_f) < ln_lambda;
      // SPEC §2b: the screen's decision stands; a screened pair the exact test keeps is counted.
      // The screen ahead compares with lo_ (then raised by this tile's lower bounds, whatever the
      // decision: it follows the FP8 scores alone).
      const float delta8 = screen ? screen_delta(t, tile, T, Lk, R, Rp, Tp) : std::numeric_limits<float>::quiet_NaN();
      if (s_.stats && screen_deltas) screen_deltas->push_back(delta8);
      if (screen && static_cast<double>(delta8) < ln_lambda) {
        if (s_.stats) {
          ++ts.screened[sidx];
          if (!skip) ++ts.screen_wrong[sidx];
        }
        skip = true;
      }
      if (skip) {
        if (s_.stats) ++ts.skipped[sidx];
        if (skips) skips->push_back(tile);
        continue;  // a skipped tile changes nothing
      }

      const Acc* vt = v_tile(t, tile, j0, nk, Tp, dvp);
      for (i64 ri = 0; ri < R; ++ri) {
        Acc* s = &S_[ri * Tp];
        if (tmax_[ri] == ninf) {  // nothing visible for this row in this tile
          for (i64 jj = 0; jj < nk; ++jj) s[jj] = Acc(0);
          continue;
        }
        const Acc mnew = running_max(m_[ri], tmax_[ri]);
        if (std::isnan(mnew)) row_nan_[ri] = 1;  // NaN rule: the whole row is NaN at the end
        const Acc alpha = m_[ri] == ninf ? Acc(0) : std::exp(m_[ri] - mnew);
        Acc sum = 0;
        for (i64 jj = 0; jj < nk; ++jj) {
          const Acc p = s[jj] == ninf ? Acc(0) : std::exp(s[jj] - mnew);
          s[jj] = p;
          sum += p;
        }
        if (alpha != Acc(1)) {
          Acc* o = &O_[ri * dvp];
          for (i64 c = 0; c < dv; ++c) o[c] *= alpha;
        }
        l_[ri] = l_[ri] * alpha + sum;
        m_[ri] = mnew;
      }
      pv_kernel<Acc>(S_.data(), vt, O_.data(), Rp, nk, Tp, dvp);
    }
    merge_split(R, dvp);

    // Finalise and write O and LSE.
    orow_.resize(dv);
    for (i64 hh = 0; hh < nh; ++hh)
      for (i64 i = 0; i < t.nr; ++i) {
        const i64 ri = hh * t.nr + i, pos = t.r0 + i, h = t.h0 + hh;
        Acc lse;
        if (row_nan_[ri] || std::isnan(L_[ri])) {  // NaN rule: the whole row and its LSE are NaN
          std::fill(orow_.begin(), orow_.end(), std::numeric_limits<Acc>::quiet_NaN());
          lse = std::numeric_limits<Acc>::quiet_NaN();
        } else if (L_[ri] > Acc(0)) {
          // Divided, not multiplied by 1 / L: a seed far above the row's kept scores (seed_max)
          // can leave L subnormal, whose reciprocal overflows to inf (and 0 * inf is NaN).
          for (i64 c = 0; c < dv; ++c) orow_[c] = OO_[ri * dvp + c] / L_[ri];
          lse = M_[ri] + std::log(L_[ri]);
        } else {  // fully masked row: O = 0, LSE = -inf, never NaN
          std::fill(orow_.begin(), orow_.end(), Acc(0));
          lse = ninf;
        }
        store_row(v_.od, v_.o_base[t.b] + pos * v_.o_si + h * v_.o_sh, v_.out_t, orow_.data(), dv);
        if (v_.lsed)
          store_row(v_.lsed, v_.lse_base[t.b] + h * v_.lse_sh + pos * v_.lse_si, v_.lse_t, &lse, 1);
      }
  }

 private:
  // SPEC §2b: delta8 of the current tile, rounded to float like delta: max over the rows with a
  // visible key (tmax_ != -inf, as for delta) of up_r - m_r, up_r = the FP8 tile max plus the
  // margin, rounded upwards to Acc. Call after scores() for the same tile. The screen ahead uses
  // lo_r instead of m_r and then raises lo_r to the tile's lower bound low_r = the FP8 tile max
  // minus the margin, rounded downwards (NaN propagating).
  float screen_delta(const Task& t, i64 tile, i64 T, i64 Lk, i64 R, i64 Rp, i64 Tp) {
    const Acc ninf = -std::numeric_limits<Acc>::infinity();
    const double dninf = -std::numeric_limits<double>::infinity();
    const i64 d = v_.d, j0 = tile * T, nk = std::min(T, Lk - j0);
    const float* k8 = k8_tile(t, tile, j0, nk, Tp);
    qk_kernel<float>(Q8_.data(), k8, S8_.data(), Rp, d, Tp);  // fp32 sums of exact products
    const double* sk = &SK_[static_cast<size_t>(tile * Tp)];
    const KeyTileNorms& kt = KT_[static_cast<size_t>(tile)];
    const double sigma = static_cast<double>(static_cast<Acc>(v_.scale));  // the exact path's scale
    const double dd = static_cast<double>(d);
    const double g_exact = gamma_n(dd + 1, std::numeric_limits<Acc>::epsilon() / 2);
    const double g_fp8 = gamma_n(dd + 3, std::numeric_limits<float>::epsilon() / 2);
    const bool tight = s_.screen.margin == ScreenMargin::tight;
    Acc delta8 = ninf;
    for (i64 ri = 0; ri < R; ++ri) {
      if (tmax_[ri] == ninf) continue;  // no visible key in this tile (as for delta)
      const Quantised& q = qq_[ri];
      const float* s8 = &S8_[ri * Tp];
      const i64 nvis = std::clamp<i64>(lim_[ri] - j0 + 1, 0, nk);
      const double row = sigma * q.scale;
      double t8 = dninf;
      for (i64 jj = 0; jj < nvis; ++jj) t8 = running_max(t8, static_cast<double>(s8[jj]) * (row * sk[jj]));
      const double A = q.qnorm * kt.err, B = q.err * kt.qnorm, C = q.err * kt.err;
      const double core = tight ? s_.screen.z * std::sqrt((A * A + B * B) / dd) + C : A + B + C;
      const double rnd = g_exact * q.norm * kt.norm + g_fp8 * q.qnorm * kt.qnorm;
      const double margin = sigma * (core + rnd) * (1.0 + 0x1p-30) + (sigma * dd + 1.0) * 0x1p-149;
      double up = t8 + margin;
      up += std::fabs(up) * 0x1p-52;  // the rounding of this sum
      const Acc ref = s_.screen.ahead ? lo_[ri] : m_[ri];
      delta8 = running_max(delta8, round_upwards<Acc>(up) - ref);  // ref = -inf: +inf
      if (s_.screen.ahead) {
        double low = t8 - margin;
        low -= std::fabs(low) * 0x1p-52;
        lo_[ri] = running_max(lo_[ri], round_downwards<Acc>(low));
      }
    }
    return static_cast<float>(delta8);
  }

  // The FP8 copy of a K tile (transposed [d][Tp], padding 0), its keys' scale (one per tile,
  // SPEC §2b: the largest |k| of the tile's finite keys) and the tile's norm maxima; cached per
  // (sequence, KV head) like k_tile.
  const float* k8_tile(const Task& t, i64 tile, i64 j0, i64 nk, i64 Tp) {
    const i64 d = v_.d;
    float* kt = &K8all_[static_cast<size_t>(tile * d * Tp)];
    if (!k8_ok_[tile]) {
      k8row_.resize(d);
      double* sk = &SK_[static_cast<size_t>(tile * Tp)];
      KeyTileNorms mx;
      float a_tile = 0;
      for (i64 jj = 0; jj < nk; ++jj) {
        load_row(krow_.data(), v_.kd, v_.k_off(t.b, j0 + jj, t.kh), v_.in_t, d);
        a_tile = std::max(a_tile, finite_abs_max(krow_.data(), d));
      }
      for (i64 jj = 0; jj < nk; ++jj) {
        load_row(krow_.data(), v_.kd, v_.k_off(t.b, j0 + jj, t.kh), v_.in_t, d);
        const float a_key = finite_abs_max(krow_.data(), d);
        const Quantised kq = quantise(krow_.data(), d, a_key < 0 ? a_key : a_tile, k8row_.data());
        for (i64 c = 0; c < d; ++c) kt[c * Tp + jj] = k8row_[c];
        sk[jj] = kq.scale;
        mx.norm = running_max(mx.norm, kq.norm);
        mx.qnorm = running_max(mx.qnorm, kq.qnorm);
        mx.err = running_max(mx.err, kq.err);
      }
      for (i64 jj = nk; jj < Tp; ++jj) {
        sk[jj] = 0;
        for (i64 c = 0; c < d; ++c) kt[c * Tp + jj] = 0.0f;
      }
      KT_[static_cast<size_t>(tile)] = mx;
      k8_ok_[tile] = 1;
    }
    return kt;
  }

  // S = scale * Q K^T for one tile, invisible keys -inf; tmax_ = each row's largest visible
  // score, NaN when one of them is NaN (q or k holding NaN, inf * 0, inf - inf: running_max).
  void scores(const Task& t, i64 tile, i64 T, i64 Lk, i64 R, i64 Rp, i64 Tp) {
    const Acc ninf = -std::numeric_limits<Acc>::infinity();
    const Acc scale = static_cast<Acc>(v_.scale);
    const i64 j0 = tile * T, nk = std::min(T, Lk - j0);
    qk_kernel<Acc>(Q_.data(), k_tile(t, tile, j0, nk, Tp), S_.data(), Rp, v_.d, Tp);
    for (i64 ri = 0; ri < R; ++ri) {
      Acc* s = &S_[ri * Tp];
      const i64 nvis = std::clamp<i64>(lim_[ri] - j0 + 1, 0, nk);  // visible keys of this row
      Acc mx = ninf;
      bool nan = false;
      for (i64 jj = 0; jj < nvis; ++jj) {
        s[jj] *= scale;
        mx = std::max(mx, s[jj]);  // a NaN s[jj] leaves mx as it was: flagged instead
        nan |= s[jj] != s[jj];
      }
      for (i64 jj = nvis; jj < Tp; ++jj) s[jj] = ninf;
      tmax_[ri] = nan ? std::numeric_limits<Acc>::quiet_NaN() : mx;
    }
  }

  // The converted tiles of the current (sequence, KV head) are kept per thread: consecutive
  // tasks (vote groups of the same head) reuse them instead of converting K and V again.
  // K tile: transposed to [d][Tp], keys beyond nk zero. V tile: [Tp][dvp], padding zero.
  const Acc* k_tile(const Task& t, i64 tile, i64 j0, i64 nk, i64 Tp) {
    const i64 d = v_.d;
    Acc* kt = &Kall_[static_cast<size_t>(tile * d * Tp)];
    if (!k_ok_[tile]) {
      for (i64 jj = 0; jj < nk; ++jj) {
        load_row(krow_.data(), v_.kd, v_.k_off(t.b, j0 + jj, t.kh), v_.in_t, d);
        for (i64 c = 0; c < d; ++c) kt[c * Tp + jj] = krow_[c];
      }
      for (i64 c = 0; c < d; ++c)
        for (i64 jj = nk; jj < Tp; ++jj) kt[c * Tp + jj] = Acc(0);
      k_ok_[tile] = 1;
    }
    return kt;
  }
  const Acc* v_tile(const Task& t, i64 tile, i64 j0, i64 nk, i64 Tp, i64 dvp) {
    Acc* vt = &Vall_[static_cast<size_t>(tile * Tp * dvp)];
    if (!v_ok_[tile]) {
      std::fill(vt, vt + Tp * dvp, Acc(0));
      for (i64 jj = 0; jj < nk; ++jj) load_row(&vt[jj * dvp], v_.vd, v_.v_off(t.b, j0 + jj, t.kh), v_.in_t, v_.dv);
      v_ok_[tile] = 1;
    }
    return vt;
  }

  // Exact merge of the current split's (m, l, O) into (M, L, OO), then reset the split state
  // (m back to -inf, or to the seed in seeded layouts).
  void merge_split(i64 R, i64 dvp) {
    const Acc ninf = -std::numeric_limits<Acc>::infinity();
    for (i64 ri = 0; ri < R; ++ri) {
      if (l_[ri] != Acc(0)) {  // l > 0, or NaN (NaN rule: carried into the merged state)
        const Acc mn = std::max(M_[ri], m_[ri]);
        const Acc a = M_[ri] == ninf ? Acc(0) : std::exp(M_[ri] - mn);
        const Acc b = std::exp(m_[ri] - mn);
        L_[ri] = L_[ri] * a + l_[ri] * b;
        for (i64 c = 0; c < dvp; ++c) OO_[ri * dvp + c] = OO_[ri * dvp + c] * a + O_[ri * dvp + c] * b;
        M_[ri] = mn;
      }
      m_[ri] = seed_[ri];
      lo_[ri] = seed_[ri];
      l_[ri] = Acc(0);
      for (i64 c = 0; c < dvp; ++c) O_[ri * dvp + c] = Acc(0);
    }
  }

  const View& v_;
  const Settings& s_;
  std::vector<Acc> Q_, S_, O_, OO_, m_, l_, M_, L_, tmax_, krow_, orow_, Kall_, Vall_, seed_;
  std::vector<Acc> lo_;  // SPEC §2b screen ahead: the lower bounds of the running maxima
  std::vector<i64> lim_, order_;
  std::vector<char> k_ok_, v_ok_, row_nan_;
  // SPEC §2b screen state: Q8_ [Rp][d] and K8all_ e4m3 values, S8_ FP8 dot products, SK_ key
  // scales, KT_ per-tile key norm maxima, qq_ per-row scales and norms.
  std::vector<float> Q8_, S8_, K8all_, k8row_;
  std::vector<double> SK_;
  std::vector<KeyTileNorms> KT_;
  std::vector<Quantised> qq_;
  std::vector<char> k8_ok_;
  i64 cache_b_ = -1, cache_kh_ = -1;
};

std::string counted_at(const VoteGranularity& g) {
  std::string s = std::to_string(g.rows) + (g.rows == 1 ? " row x " : " rows x ") +
                  std::to_string(g.heads) + (g.heads == 1 ? " head" : " heads") + " x " +
                  std::to_string(g.tile_keys) + " keys, " + to_string(g.order) + " order";
  if (g.split_tiles > 0) s += ", split every " + std::to_string(g.split_tiles) + " tiles";
  return s;
}

// skip_set: recorded with dimensions [batch, Hq, ceil(max_q / rows), ceil(max_k / tile_keys)]
// (SkipSetShape: max_q, max_k are the problem's bounds).
void run_all(const View& v, const SkipConfig& skip, const RunOptions& opt, SkipStats* stats,
             SkipSet* skip_set = nullptr, i64 max_q = 0, i64 max_k = 0) {
  validate(skip);
  const VoteGranularity& vote = skip.vote;
  if (v.g % vote.heads != 0)
    throw Error("skip.vote.heads = " + std::to_string(vote.heads) +
                " must divide the query heads per KV head g = Hq / Hk = " + std::to_string(v.g));
  if (opt.num_threads < 0) throw Error("num_threads must be >= 0, got " + std::to_string(opt.num_threads));

  Settings st;
  st.vote = vote;
  st.hist = opt.collect_histogram;
  st.deltas = opt.record_deltas && stats;
  st.stats = (opt.collect_stats || opt.collect_histogram || opt.record_deltas) && stats;
  st.hist = st.hist && st.stats;
  st.nstat = vote.heads == 1 ? v.hq : v.hk;
  st.screen = skip.screen;
  st.screen_on = skip.screen.margin != ScreenMargin::off;
  st.skip_on.assign(v.batch, false);
  st.ln_lambda.assign(v.batch, -std::numeric_limits<double>::infinity());
  std::vector<double> lambdas(v.batch, 1.0);
  if (skip.enabled) {
    for (i64 b = 0; b < v.batch; ++b) {
      // A sequence without keys has nothing to skip; its lambda is reported as infinite.
      lambdas[b] = v.k_len[b] > 0 ? resolve_lambda(skip, v.k_len[b])
                                  : std::numeric_limits<double>::infinity();
      st.skip_on[b] = lambdas[b] < 1.0;
      if (st.skip_on[b]) st.ln_lambda[b] = std::log(lambdas[b]);
    }
  }

  std::vector<Task> tasks;
  for (i64 b = 0; b < v.batch; ++b)
    for (i64 kh = 0; kh < v.hk; ++kh)
      for (i64 hs = 0; hs < v.g / vote.heads; ++hs)
        for (i64 r0 = 0; r0 < v.q_len[b]; r0 += vote.rows)
          tasks.push_back({b, kh, kh * v.g + hs * vote.heads, r0, std::min<i64>(vote.rows, v.q_len[b] - r0)});

  std::vector<std::vector<float>> task_deltas(st.deltas ? tasks.size() : 0);
  std::vector<std::vector<float>> task_sdeltas(st.deltas && st.screen_on ? tasks.size() : 0);
  // Skipped tiles per task (threads never share a byte of the packed set: packed after the join).
  std::vector<std::vector<i64>> task_skips(skip_set ? tasks.size() : 0);
  const unsigned nthreads = detail::worker_count(opt.num_threads, tasks.size());
  std::vector<ThreadStats> tstats(nthreads);
  for (auto& ts : tstats) {
    if (st.stats) {
      ts.visited.assign(st.nstat, 0);
      ts.skipped.assign(st.nstat, 0);
      ts.screened.assign(st.nstat, 0);
      ts.screen_wrong.assign(st.nstat, 0);
    }
    if (st.hist) ts.hist.assign(st.nstat, DeltaHistogram{});
  }
  detail::run_workers(nthreads, tasks.size(), [&](unsigned w, detail::WorkQueue& queue) {
    auto run = [&](auto& e) {
      for (std::size_t i; queue.take(i);)
        e.run(tasks[i], tstats[w], st.deltas ? &task_deltas[i] : nullptr,
              task_sdeltas.empty() ? nullptr : &task_sdeltas[i], skip_set ? &task_skips[i] : nullptr);
    };
    if (opt.fp64) {
      Engine<double> e(v, st);
      run(e);
    } else {
      Engine<float> e(v, st);
      run(e);
    }
  });

  if (skip_set) {
    for (i64 b = 0; b < v.batch; ++b) {
      max_q = std::max(max_q, v.q_len[b]);
      max_k = std::max(max_k, v.k_len[b]);
    }
    skip_set->resize(vote, v.batch, v.hq, (max_q + vote.rows - 1) / vote.rows,
                     (max_k + vote.tile_keys - 1) / vote.tile_keys);
    for (std::size_t i = 0; i < task_skips.size(); ++i)
      for (const i64 tile : task_skips[i])
        for (i64 hh = 0; hh < vote.heads; ++hh)
          skip_set->set(tasks[i].b, tasks[i].h0 + hh, tasks[i].r0 / vote.rows, tile);
  }

  if (stats) {
    *stats = SkipStats{};
    stats->granularity = vote;
    stats->counted_at = counted_at(vote);
    stats->lambda = lambdas;
    if (st.stats) {
      stats->visited.assign(st.nstat, 0);
      stats->skipped.assign(st.nstat, 0);
      if (st.screen_on) {
        stats->screened.assign(st.nstat, 0);
        stats->screen_wrong.assign(st.nstat, 0);
      }
      if (st.hist) stats->hist.assign(st.nstat, DeltaHistogram{});
      for (auto& ts : tstats)
        for (i64 h = 0; h < st.nstat; ++h) {
          stats->visited[h] += ts.visited[h];
          stats->skipped[h] += ts.skipped[h];
          if (st.screen_on) {
            stats->screened[h] += ts.screened[h];
            stats->screen_wrong[h] += ts.screen_wrong[h];
          }
          if (st.hist) stats->hist[h].merge(ts.hist[h]);
        }
      if (st.deltas) {
        std::size_t n = 0;
        for (auto& d : task_deltas) n += d.size();
        stats->deltas.reserve(n);
        for (auto& d : task_deltas) stats->deltas.insert(stats->deltas.end(), d.begin(), d.end());
        stats->screen_deltas.reserve(st.screen_on ? n : 0);
        for (auto& d : task_sdeltas) stats->screen_deltas.insert(stats->screen_deltas.end(), d.begin(), d.end());
      }
    }
  }
}

}  // namespace

namespace reference {

void attention(const AttentionProblem& p, const SkipConfig& skip, const RunOptions& opt,
               SkipStats* stats) {
  attention(p, skip, opt, stats, nullptr);
}

void attention(const AttentionProblem& p, const SkipConfig& skip_in, const RunOptions& opt,
               SkipStats* stats, SkipSet* skip_set) {
  const detail::ResolvedAttention r = detail::validate_attention(p, DeviceKind::cpu);
  // SPEC §2a: the order the prefill kernel would use (a defaulted max-first falls back to natural
  // where the kernel cannot do it); stats and the skip set report it.
  const SkipConfig skip = detail::with_effective_order(skip_in, r);
  View v = make_view(r, p.q, p.k, p.v, p.out, p.lse, r.ragged ? 0 : 1);
  v.q_len = r.q_len;
  for (i64 b = 0; b < r.batch; ++b) {
    if (r.ragged) {
      v.q_base.push_back(r.q_start[b] * v.q_si);
      v.o_base.push_back(r.q_start[b] * v.o_si);
      v.lse_base.push_back(r.q_start[b] * v.lse_si);
      v.k_base.push_back(r.k_start[b] * v.k_sj);
      v.v_base.push_back(r.k_start[b] * v.v_sj);
    } else {
      v.q_base.push_back(b * p.q.stride[0]);
      v.o_base.push_back(b * p.out.stride[0]);
      v.lse_base.push_back(p.lse.defined() ? b * p.lse.stride[0] : 0);
      v.k_base.push_back(b * p.k.stride[0]);
      v.v_base.push_back(b * p.v.stride[0]);
    }
  }
  if (p.seed_max.defined()) {
    v.seedd = p.seed_max.data;
    v.seed_t = p.seed_max.dtype;
    v.seed_sh = p.seed_max.stride[r.ragged ? 0 : 1];
    v.seed_si = p.seed_max.stride[r.ragged ? 1 : 2];
    for (i64 b = 0; b < r.batch; ++b) {
      v.seed_base.push_back(r.ragged ? r.q_start[b] * v.seed_si : b * p.seed_max.stride[0]);
      // +inf would make every kept tile's rescale inf - inf: refused.
      for (i64 h = 0; h < r.hq; ++h)
        for (i64 i = 0; i < r.q_len[b]; ++i) {
          double x;
          load_row(&x, v.seedd, v.seed_base[b] + h * v.seed_sh + i * v.seed_si, v.seed_t, 1);
          if (x == std::numeric_limits<double>::infinity())
            throw Error("seed_max: +inf at sequence " + std::to_string(b) + ", head " + std::to_string(h) +
                        ", query " + std::to_string(i) + " (seeds are finite, -inf (no seed) or NaN)");
        }
    }
  }
  SkipSet local;
  SkipSet* rec = skip_set != nullptr ? skip_set : p.skip_set != nullptr ? &local : nullptr;
  if (p.skip_set != nullptr) {
    validate(skip);
    detail::check_skip_set_words(p.skip_set_words, detail::skip_set_shape_of(r, skip.vote), "skip_set_words");
  }
  run_all(v, skip, opt, stats, rec, r.max_q_len, r.max_k_len);
  if (p.skip_set != nullptr) detail::pack_skip_set_words(*rec, p.skip_set);
}

void decode(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt,
            SkipStats* stats) {
  const detail::ResolvedDecode r = detail::validate_decode(p, DeviceKind::cpu);
  View v = make_view(r, p.q, p.k_cache, p.v_cache, p.out, p.lse, 1);
  v.decode = true;
  v.q_len.assign(r.batch, r.q_len);
  if (r.paged) {
    v.page_table = p.page_table;
    v.pt_stride = r.max_pages_per_seq;
    v.page_size = r.page_size;
    v.k_sp = p.k_cache.stride[0];
    v.v_sp = p.v_cache.stride[0];
  }
  for (i64 b = 0; b < r.batch; ++b) {
    v.q_base.push_back(b * p.q.stride[0]);
    v.o_base.push_back(b * p.out.stride[0]);
    v.lse_base.push_back(p.lse.defined() ? b * p.lse.stride[0] : 0);
    v.k_base.push_back(r.paged ? 0 : b * p.k_cache.stride[0]);
    v.v_base.push_back(r.paged ? 0 : b * p.v_cache.stride[0]);
  }
  run_all(v, skip, opt, stats);
}

}  // namespace reference
}  // namespace blasst
