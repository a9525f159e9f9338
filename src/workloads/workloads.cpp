// Seeded synthetic workloads (SPEC §8); the models are described in docs/workloads.md.
// Randomness: std::mt19937_64 (fully specified by the standard) and our own Box-Muller transform,
// because std::normal_distribution differs between standard libraries.
#include "blasst/workloads.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <thread>

#include "blasst/blasst.hpp"

namespace blasst {

WorkloadKind parse_workload(const std::string& s) {
  if (s == "random") return WorkloadKind::random;
  if (s == "llm") return WorkloadKind::llm;
  if (s == "dit") return WorkloadKind::dit;
  throw Error("workload: unknown name '" + s + "' (expected random, llm or dit)");
}

const char* to_string(WorkloadKind k) {
  switch (k) {
    case WorkloadKind::random:
      return "random";
    case WorkloadKind::llm:
      return "llm";
    case WorkloadKind::dit:
      return "dit";
  }
  return "invalid";
}

namespace {

using i64 = std::int64_t;
constexpr double kPi = 3.14159265358979323846;

// Normal and uniform variates from mt19937_64 with fixed arithmetic.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : g_(seed) {}
  double uniform() { return static_cast<double>(g_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1;
    do u1 = uniform();
    while (u1 <= 0.0);
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * kPi * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * kPi * u2);
  }
  std::uint64_t bits() { return g_(); }

 private:
  std::mt19937_64 g_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// Independent streams per (tensor, batch, head) so that changing one size does not reshuffle the
// others' data more than necessary; the mix is splitmix64.
std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t x =
      seed ^ (a * 0x9e3779b97f4a7c15ull) ^ (b * 0xc2b2ae3d27d4eb4full) ^ (c * 0x165667b19e3779f9ull);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Runs fn(0..n-1) on up to hardware_concurrency threads. Each item owns its random streams and
// output rows, so the result does not depend on the thread count.
template <class Fn>
void parallel_for(i64 n, Fn fn) {
  const i64 nt = std::min<i64>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (nt <= 1) {
    for (i64 i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<i64> next{0};
  std::vector<std::thread> th;
  for (i64 t = 0; t < nt; ++t)
    th.emplace_back([&] {
      for (i64 i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  for (auto& x : th) x.join();
}

struct Dims {
  i64 B, L, Hq, Hk, d;
  i64 qi(i64 b, i64 i, i64 h) const { return ((b * L + i) * Hq + h) * d; }
  i64 ki(i64 b, i64 j, i64 h) const { return ((b * L + j) * Hk + h) * d; }
};

void fill_normal(std::vector<float>& v, std::uint64_t seed, double sd) {
  Rng r(seed);
  for (auto& x : v) x = static_cast<float>(sd * r.normal());
}

// ---- llm ---------------------------------------------------------------------------------------
// Logits are designed, in logit units (score = q . k / sqrt(d)), as
//   sink (key 0):      S_i = P0 + sigma_h + eps_i       (a dedicated channel, no noise)
//   other keys j < i:  P(i - j) + heavy_j + noise,  P(D) ~ P0 - ln(1 + D / kLlmD0)
// P is a scale-free (power-law) recency: attention weight ~ 1 / distance, so a tile's maximum
// relative to the sink falls as -ln(distance) and the tiles that pass the skip test at
// lambda = factor / L are those beyond a fixed FRACTION of the context (the inverse law).
// P is RoPE applied to a constant vector: sum_p A cos(w_p (i - j)) over np frequencies spaced
// geometrically from 1 / kLlmD0 to 1 / kLlmDmax with equal amplitude A = ln(Dmax / D0) / np:
// each octave of distance loses the same number of logits (slope 1 per unit ln D). The
// unresolved (oscillating) frequencies leave a bounded ripple (std ~0.5 logit at d = 128).
constexpr double kLlmD0 = 16.0;                         // distance where the decay starts
constexpr double kLlmDmax = 131072.0;                   // decay resolved up to this distance
constexpr double kLlmSigmaLo = 1.0, kLlmSigmaHi = 5.0;  // per query head: sink above the peak
constexpr double kLlmTokSpread = 1.0;                   // per-token N(0, 1) spread of the sink
constexpr double kLlmNoise = 0.35;                      // per-coordinate noise (not the sink)
constexpr double kLlmHeavyRate = 1.0 / 1024.0;          // heavy hitters: fraction of keys
constexpr double kLlmHeavyLo = 1.0, kLlmHeavyHi = 3.0;  // their logit bonus (any distance)

void make_llm(const Dims& D, std::uint64_t seed, Workload& w) {
  const i64 d = D.d;
  const double sd = std::sqrt(static_cast<double>(d));
  const i64 c_sink = 0, c_heavy = d >= 4 ? 1 : -1;
  const i64 p0 = d >= 4 ? 2 : 1;
  const i64 np = std::max<i64>(0, (d - p0) / 2);
  const double span = std::log(kLlmDmax / kLlmD0);
  const double amp = np > 0 ? span / double(np) : 0.0;  // logits per pair
  const double peak = amp * double(np);
  const double root = std::sqrt(amp * sd);
  const double ks = std::pow(sd, 0.5) * 4.0;  // sink key magnitude
  const double hq = std::pow(sd, 0.5);        // heavy-hitter channel scale
  parallel_for(D.B * D.Hk, [&](i64 item) {
    const i64 b = item / D.Hk, kh = item % D.Hk;
    Rng hr(stream_seed(seed, 1, b, kh));
    const double u = hr.uniform();
    std::vector<double> om(static_cast<std::size_t>(np));
    for (i64 p = 0; p < np; ++p) om[p] = std::exp(-std::log(kLlmD0) - span * (double(p) + u) / double(np));
    auto profile = [&](float* x, i64 pos, Rng& r) {
      for (i64 p = 0; p < np; ++p) {
        const double a = om[p] * double(pos);
        x[p0 + 2 * p] = static_cast<float>(root * std::cos(a) + kLlmNoise * r.normal());
        x[p0 + 2 * p + 1] = static_cast<float>(root * std::sin(a) + kLlmNoise * r.normal());
      }
      for (i64 c = p0 + 2 * np; c < d; ++c) x[c] = static_cast<float>(kLlmNoise * r.normal());
    };
    Rng kr(stream_seed(seed, 2, b, kh));
    for (i64 j = 0; j < D.L; ++j) {
      float* k = &w.k[D.ki(b, j, kh)];
      const double heavy = kr.uniform();
      const double hb = kLlmHeavyLo + (kLlmHeavyHi - kLlmHeavyLo) * kr.uniform();
      if (j == 0) {
        k[c_sink] = static_cast<float>(ks);  // pure sink: nothing else, no noise
        continue;
      }
      profile(k, j, kr);
      k[c_sink] = 0.0f;
      if (c_heavy >= 0) k[c_heavy] = heavy < kLlmHeavyRate ? static_cast<float>(hb * hq) : 0.0f;
    }
    const i64 g = D.Hq / D.Hk;
    for (i64 hh = 0; hh < g; ++hh) {
      const i64 h = kh * g + hh;
      Rng qr(stream_seed(seed, 3, b, h));
      const double sig = kLlmSigmaLo + (kLlmSigmaHi - kLlmSigmaLo) * qr.uniform();
      for (i64 i = 0; i < D.L; ++i) {
        float* q = &w.q[D.qi(b, i, h)];
        profile(q, i, qr);
        const double s = peak + sig + kLlmTokSpread * qr.normal();
        q[c_sink] = static_cast<float>(s * sd / ks);
        if (c_heavy >= 0) q[c_heavy] = static_cast<float>(sd / hq);
      }
    }
  });
}

void grid_shape(i64 L, i64& T, i64& H, i64& W) {
  // Divisor triple with H ~ W and T ~ sqrt(H W) / 4 (video latents: few frames, square frames).
  double best = std::numeric_limits<double>::infinity();
  T = 1;
  H = 1;
  W = L;
  for (i64 t = 1; t <= L; ++t) {
    if (L % t) continue;
    const i64 hw = L / t;
    for (i64 h = 1; h * h <= hw; ++h) {
      if (hw % h) continue;
      const i64 ww = hw / h;
      const double cost = std::abs(std::log(double(h) / double(ww))) +
                          0.5 * std::abs(std::log(4.0 * double(t) / std::sqrt(double(hw))));
      if (cost < best) {
        best = cost;
        T = t;
        H = h;
        W = ww;
      }
    }
  }
}

// ---- dit ---------------------------------------------------------------------------------------
// Tokens on a T x H x W grid (row-major, t slowest; grid_shape). Logits, in logit units:
//   register/sink (token 0): S_i = P0 + kDitSinkLo..Hi (per query head) + N(0, kDitTokSpread^2)
//   other keys:              P(r) + noise,   P(r) ~ P0 - 3 ln(r / kDitR0) for r in [R0, Rmax]
// r = Euclidean distance in a metric where the grid box is a cube of side L^(1/3) (one token per
// unit volume; frames are as far apart as the box is deep over its T frames). Attention weight
// ~ r^-3 is the 3-D scale-free decay: every octave of distance holds the same attention mass,
// so the keys that pass the skip test at lambda = factor / L are a fixed FRACTION of the grid.
// P is a sum of nf plane waves A cos(w_f . dp) (the same w_f in q and k: RoPE-like), scales
// 1 / |w_f| spaced geometrically over [R0, Rmax], random directions; the isotropic average of a
// plane wave of scale s is sinc(r / s), and the log-uniform mixture of scales gives the log decay.
// The early register key gives full attention a reference visited first in natural order: without
// one, the running max before a row's own neighbourhood is set by other keys at comparable
// distance ratios, which do not change with L, and no lambda ~ 1 / L law can hold.
constexpr double kDitR0 = 0.7, kDitRmax = 64.0;   // resolved distances (metric units)
constexpr double kDitSinkLo = 0.0, kDitSinkHi = 2.0;  // sink logit above the local peak, per head
constexpr double kDitTokSpread = 0.5;
constexpr double kDitNoise = 0.3;

void make_dit(const Dims& D, std::uint64_t seed, Workload& w) {
  const i64 d = D.d;
  const double sd = std::sqrt(static_cast<double>(d));
  i64 T, H, W;
  grid_shape(D.L, T, H, W);
  const double M = std::cbrt(double(D.L));  // metric box: a cube of side L^(1/3), density 1
  const double sc[3] = {M / double(T), M / double(H), M / double(W)};
  const i64 p0 = 1;
  const i64 nf = std::max<i64>(0, (d - p0) / 2);
  const double span = std::log(kDitRmax / kDitR0);
  const double amp = nf > 0 ? 3.0 * span / double(nf) : 0.0;  // slope 3 per unit ln r
  const double peak = amp * double(nf);
  const double root = std::sqrt(amp * sd);
  const double ks = std::pow(sd, 0.5) * 4.0;
  parallel_for(D.B * D.Hk, [&](i64 item) {
    const i64 b = item / D.Hk, kh = item % D.Hk;
    Rng hr(stream_seed(seed, 11, b, kh));
    std::vector<double> om(static_cast<std::size_t>(3 * nf));
    const double u = hr.uniform();
    for (i64 f = 0; f < nf; ++f) {
      const double s = kDitR0 * std::exp(span * (double(f) + u) / double(nf));  // scale of feature f
      double v[3], n2 = 0;
      do {
        n2 = 0;
        for (auto& x : v) { x = hr.normal(); n2 += x * x; }
      } while (n2 < 1e-12);
      for (int a = 0; a < 3; ++a) om[3 * f + a] = v[a] / std::sqrt(n2) / s * sc[a];  // per grid step
    }
    auto feat = [&](float* x, i64 pos, Rng& r) {
      const double c3[3] = {double(pos / (H * W)), double((pos / W) % H), double(pos % W)};
      for (i64 f = 0; f < nf; ++f) {
        const double ang = om[3 * f] * c3[0] + om[3 * f + 1] * c3[1] + om[3 * f + 2] * c3[2];
        x[p0 + 2 * f] = static_cast<float>(root * std::cos(ang) + kDitNoise * r.normal());
        x[p0 + 2 * f + 1] = static_cast<float>(root * std::sin(ang) + kDitNoise * r.normal());
      }
      for (i64 c = p0 + 2 * nf; c < d; ++c) x[c] = static_cast<float>(kDitNoise * r.normal());
    };
    Rng kr(stream_seed(seed, 12, b, kh));
    for (i64 j = 0; j < D.L; ++j) {
      float* k = &w.k[D.ki(b, j, kh)];
      if (j == 0) {
        k[0] = static_cast<float>(ks);
        continue;
      }
      feat(k, j, kr);
      k[0] = 0.0f;
    }
    const i64 g = D.Hq / D.Hk;
    for (i64 hh = 0; hh < g; ++hh) {
      const i64 h = kh * g + hh;
      Rng qr(stream_seed(seed, 13, b, h));
      const double above = kDitSinkLo + (kDitSinkHi - kDitSinkLo) * qr.uniform();
      for (i64 i = 0; i < D.L; ++i) {
        float* q = &w.q[D.qi(b, i, h)];
        feat(q, i, qr);
        const double s = peak + above + kDitTokSpread * qr.normal();
        q[0] = static_cast<float>(s * sd / ks);
      }
    }
  });
}

}  // namespace

Workload make_workload(const WorkloadSpec& s) {
  if (s.batch < 1) throw Error("workload: batch must be >= 1, got " + std::to_string(s.batch));
  if (s.seq_len < 1) throw Error("workload: seq_len must be >= 1, got " + std::to_string(s.seq_len));
  if (s.heads_q < 1 || s.heads_k < 1 || s.heads_q % s.heads_k != 0)
    throw Error("workload: heads_q (" + std::to_string(s.heads_q) +
                ") must be a positive multiple of heads_k (" + std::to_string(s.heads_k) + ")");
  if (s.head_dim < 1) throw Error("workload: head_dim must be >= 1, got " + std::to_string(s.head_dim));
  if (s.kind != WorkloadKind::random && s.kind != WorkloadKind::llm && s.kind != WorkloadKind::dit)
    throw Error("workload: invalid kind");
  const double n = double(s.batch) * double(s.seq_len) * double(s.heads_q) * double(s.head_dim);
  if (n > 4.0e9) throw Error("workload: q would hold " + std::to_string(n) + " elements (limit 4e9)");
  Workload w;
  w.spec = s;
  const Dims D{s.batch, s.seq_len, s.heads_q, s.heads_k, s.head_dim};
  w.q.assign(static_cast<std::size_t>(D.B * D.L * D.Hq * D.d), 0.0f);
  w.k.assign(static_cast<std::size_t>(D.B * D.L * D.Hk * D.d), 0.0f);
  w.v.assign(w.k.size(), 0.0f);
  fill_normal(w.v, stream_seed(s.seed, 100, 0, 0), 1.0);  // values: N(0, 1) for every kind
  switch (s.kind) {
    case WorkloadKind::random:
      fill_normal(w.q, stream_seed(s.seed, 101, 0, 0), 1.0);
      fill_normal(w.k, stream_seed(s.seed, 102, 0, 0), 1.0);
      break;
    case WorkloadKind::llm:
      make_llm(D, s.seed, w);
      break;
    case WorkloadKind::dit:
      make_dit(D, s.seed, w);
      break;
  }
  return w;
}

}  // namespace blasst
