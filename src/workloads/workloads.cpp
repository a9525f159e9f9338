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
// Amplitudes are set in logit units (score = q . k / sqrt(d)). Rotary dims [0, dr) carry a
// per-KV-head vector a rotated by RoPE (base 10000): its part of q_i . k_j depends on i - j only
// and decays with distance (recency, peak kLlmRecency at distance 0). Content dims [dr, d) carry
// a per-KV-head unit direction u: each query has a component b_i along u (varying per token and
// per head), the sink key (position 0) a large one and a few heavy-hitter keys a smaller one.
// Every coordinate also gets unit-variance noise: pure noise gives scores of std ~1, as in the
// random workload.
constexpr double kLlmRecency = 5.0;                     // peak recency logit (distance 0)
constexpr double kLlmSink = 13.0;                       // sink logit for a query with b_i = 1
constexpr double kLlmHeavy = 6.0;                       // heavy-hitter logit for b_i = 1
constexpr int kLlmHeavyCount = 4;                       // heavy hitters per (sequence, KV head)
constexpr double kLlmNoise = 0.8;                       // per-coordinate noise of q and k
constexpr double kLlmHeadMin = 0.8, kLlmHeadMax = 1.2;  // per query head sink strength
constexpr double kLlmTokSpread = 0.1;                   // relative per-token spread of b_i

void rope(float* x, const std::vector<double>& thetas, i64 pos) {
  for (std::size_t p = 0; p < thetas.size(); ++p) {
    const double theta = thetas[p];
    const double c = std::cos(theta * pos), s = std::sin(theta * pos);
    const double a = x[2 * p], b = x[2 * p + 1];
    x[2 * p] = static_cast<float>(a * c - b * s);
    x[2 * p + 1] = static_cast<float>(a * s + b * c);
  }
}

void make_llm(const Dims& D, std::uint64_t seed, Workload& w) {
  const i64 d = D.d;
  const i64 dr = d >= 4 ? (d / 2) & ~i64(1) : (d >= 2 ? 2 : 0);
  const i64 dc = d - dr;
  const double sd = std::sqrt(static_cast<double>(d));
  // |a|^2 / sqrt(d) = kLlmRecency  ->  per-coordinate std of a.
  const double a_sd = dr > 0 ? std::sqrt(kLlmRecency * sd / static_cast<double>(dr)) : 0.0;
  const double root = std::sqrt(sd);  // q along u = root * b, k along u = root * logit
  std::vector<double> thetas(dr / 2);
  for (i64 p = 0; p < dr / 2; ++p) thetas[p] = std::pow(10000.0, -2.0 * double(p) / double(dr));
  parallel_for(D.B * D.Hk, [&](i64 item) {
    const i64 b = item / D.Hk, kh = item % D.Hk;
    std::vector<float> a(dr), u(std::max<i64>(dc, 1));
    Rng hr(stream_seed(seed, 1, b, kh));
    for (auto& x : a) x = static_cast<float>(a_sd * hr.normal());
    double n2 = 0;
    for (i64 c = 0; c < dc; ++c) {
      u[c] = static_cast<float>(hr.normal());
      n2 += double(u[c]) * u[c];
    }
    const double inv = n2 > 0 ? 1.0 / std::sqrt(n2) : 0.0;
    for (i64 c = 0; c < dc; ++c) u[c] = static_cast<float>(u[c] * inv);
    std::vector<i64> heavy;
    for (int t = 0; t < kLlmHeavyCount && D.L > 1; ++t)
      heavy.push_back(1 + static_cast<i64>(hr.bits() % static_cast<std::uint64_t>(D.L - 1)));
    // Keys.
    Rng kr(stream_seed(seed, 2, b, kh));
    for (i64 j = 0; j < D.L; ++j) {
      float* k = &w.k[D.ki(b, j, kh)];
      for (i64 c = 0; c < dr; ++c) k[c] = static_cast<float>(a[c] + kLlmNoise * kr.normal());
      rope(k, thetas, j);
      double along = 0;
      if (j == 0)
        along = kLlmSink;
      else if (std::find(heavy.begin(), heavy.end(), j) != heavy.end())
        along = kLlmHeavy;
      for (i64 c = 0; c < dc; ++c)
        k[dr + c] = static_cast<float>(root * along * u[c] + kLlmNoise * kr.normal());
    }
    // Queries of the heads that share this KV head.
    const i64 g = D.Hq / D.Hk;
    for (i64 hh = 0; hh < g; ++hh) {
      const i64 h = kh * g + hh;
      Rng qr(stream_seed(seed, 3, b, h));
      const double head = kLlmHeadMin + (kLlmHeadMax - kLlmHeadMin) * qr.uniform();
      for (i64 i = 0; i < D.L; ++i) {
        float* q = &w.q[D.qi(b, i, h)];
        for (i64 c = 0; c < dr; ++c) q[c] = static_cast<float>(a[c] + kLlmNoise * qr.normal());
        rope(q, thetas, i);
        const double bi = head * std::max(0.0, 1.0 + kLlmTokSpread * qr.normal());
        for (i64 c = 0; c < dc; ++c)
          q[dr + c] = static_cast<float>(root * bi * u[c] + kLlmNoise * qr.normal());
      }
    }
  });
}

// ---- dit ---------------------------------------------------------------------------------------
// Tokens on a T x H x W grid (row-major: t slowest). q and k are random Fourier features of the
// grid position, cos/sin(w . p) with w ~ N(0, diag(1/lt^2, 1/ls^2, 1/ls^2)): q_i . k_j approximates a
// Gaussian kernel of the 3-D distance, so attention falls off with distance. Frames are similar
// (lt > ls): the same spatial location in another frame still scores high.
constexpr double kDitAmp = 1.4;    // feature amplitude; peak score ~ amp^2 * sqrt(d) / 2
constexpr double kDitNoise = 0.3;  // per-token noise
constexpr double kDitSpatialMin = 1.5, kDitSpatialMax = 4.0;    // ls range over heads (grid cells)
constexpr double kDitTemporalMin = 2.0, kDitTemporalMax = 8.0;  // lt range over heads (frames)

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

void make_dit(const Dims& D, std::uint64_t seed, Workload& w) {
  const i64 d = D.d, nf = d / 2;
  i64 T, H, W;
  grid_shape(D.L, T, H, W);
  parallel_for(D.B * D.Hk, [&](i64 item) {
    const i64 b = item / D.Hk, kh = item % D.Hk;
    std::vector<double> om(3 * nf), ph(nf);
    auto feat = [&](float* x, i64 pos, Rng& r, double amp) {
      const double t = double(pos / (H * W)), y = double((pos / W) % H), xx = double(pos % W);
      for (i64 f = 0; f < nf; ++f) {
        const double arg = om[3 * f] * t + om[3 * f + 1] * y + om[3 * f + 2] * xx + ph[f];
        x[2 * f] = static_cast<float>(amp * std::cos(arg) + kDitNoise * r.normal());
        x[2 * f + 1] = static_cast<float>(amp * std::sin(arg) + kDitNoise * r.normal());
      }
      if (d % 2) x[d - 1] = static_cast<float>(kDitNoise * r.normal());
    };
    Rng hr(stream_seed(seed, 11, b, kh));
    // Per KV head: its own length scales and frequencies (some heads local, some wider).
    const double ls = kDitSpatialMin + (kDitSpatialMax - kDitSpatialMin) * hr.uniform();
    const double lt = kDitTemporalMin + (kDitTemporalMax - kDitTemporalMin) * hr.uniform();
    for (i64 f = 0; f < nf; ++f) {
      om[3 * f] = hr.normal() / lt;
      om[3 * f + 1] = hr.normal() / ls;
      om[3 * f + 2] = hr.normal() / ls;
      ph[f] = 2.0 * kPi * hr.uniform();
    }
    Rng kr(stream_seed(seed, 12, b, kh));
    for (i64 j = 0; j < D.L; ++j) feat(&w.k[D.ki(b, j, kh)], j, kr, kDitAmp);
    const i64 g = D.Hq / D.Hk;
    for (i64 hh = 0; hh < g; ++hh) {
      const i64 h = kh * g + hh;
      Rng qr(stream_seed(seed, 13, b, h));
      for (i64 i = 0; i < D.L; ++i) feat(&w.q[D.qi(b, i, h)], i, qr, kDitAmp);
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
