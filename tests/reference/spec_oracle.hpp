// An independent float64 oracle of the Skip-Softmax contract, written from SPEC §2, §2a, §3 and
// §5 (not from src/reference): the visit order, the vote of a group of rows, the skip decision
// and the output over the kept tiles. Deliberately plain: explicit score matrices, no online
// rescaling (the output is a two-pass softmax over the kept keys), no blocking, no threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace blasst::oracle {

using i64 = std::int64_t;
inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

enum class Order { natural, max_first };

// SPEC §2a: natural = 0, 1, 2, ...; max-first = the sink tile 0, the own tile, then own-1,
// own+1, own-2, own+2, ..., every tile of [0, n) exactly once.
inline std::vector<i64> visit_order(i64 n, i64 own, Order order) {
  std::vector<i64> out;
  if (n <= 0) return out;
  if (order == Order::natural) {
    for (i64 t = 0; t < n; ++t) out.push_back(t);
    return out;
  }
  std::vector<bool> seen(static_cast<std::size_t>(n), false);
  auto add = [&](i64 t) {
    if (t >= 0 && t < n && !seen[static_cast<std::size_t>(t)]) {
      seen[static_cast<std::size_t>(t)] = true;
      out.push_back(t);
    }
  };
  add(0);
  add(own);
  for (i64 dist = 1; dist < n + std::max<i64>(own, 0) + 1; ++dist) {
    add(own - dist);
    add(own + dist);
  }
  return out;
}

// One vote group: its rows' scores (already scaled; invisible keys -inf), the shared V rows.
struct Group {
  std::vector<std::vector<double>> s;  // [rows][Lk]
  i64 own = 0;                         // own tile for max-first (the caller applies SPEC §2a)
};

struct GroupResult {
  std::vector<i64> order;             // visited tiles, in visit order
  std::vector<double> delta;          // delta_G per visited tile (same order); +inf: no max yet
  std::vector<bool> skipped;          // same order
  std::vector<std::vector<double>> row_delta;  // [visit][row]: tile_max_r - m_r (-inf: nothing visible)
  std::vector<std::vector<double>> out;        // [rows][dv], over the kept tiles only
  std::vector<double> lse;                     // per row
};

// SPEC §2: for each visited tile j (visit order), with m_r the running maxima BEFORE tile j,
// delta_G = max over rows of (tile_max_r - m_r); skip iff delta_G < ln(lambda). A skipped tile
// changes nothing (m stays). skip_on = false: lambda >= 1 or skipping off (SPEC §3): nothing is
// skipped. Visited tiles = tiles holding at least one visible key of some row (SPEC §5).
inline GroupResult run_group(const Group& g, const std::vector<std::vector<double>>& v, i64 T,
                             Order order, bool skip_on, double ln_lambda) {
  GroupResult r;
  const std::size_t R = g.s.size();
  const i64 Lk = R ? static_cast<i64>(g.s[0].size()) : 0;
  const i64 ntiles = (Lk + T - 1) / T;
  i64 n_vis = 0;
  for (i64 t = 0; t < ntiles; ++t)
    for (std::size_t i = 0; i < R; ++i)
      for (i64 j = t * T; j < std::min(Lk, t * T + T); ++j)
        if (g.s[i][static_cast<std::size_t>(j)] != kNegInf) n_vis = t + 1;
  r.order = visit_order(n_vis, std::min(g.own, n_vis - 1), order);
  std::vector<double> m(R, kNegInf);
  std::vector<bool> kept(static_cast<std::size_t>(ntiles), false);
  for (i64 t : r.order) {
    std::vector<double> rd(R, kNegInf);
    double delta = kNegInf;
    for (std::size_t i = 0; i < R; ++i) {
      double tmax = kNegInf;
      for (i64 j = t * T; j < std::min(Lk, t * T + T); ++j) tmax = std::max(tmax, g.s[i][static_cast<std::size_t>(j)]);
      if (tmax == kNegInf) continue;  // nothing visible: this row does not vote
      rd[i] = m[i] == kNegInf ? std::numeric_limits<double>::infinity() : tmax - m[i];
      delta = std::max(delta, rd[i]);
    }
    const bool skip = skip_on && delta < ln_lambda;
    r.delta.push_back(delta);
    r.skipped.push_back(skip);
    r.row_delta.push_back(rd);
    if (skip) continue;
    kept[static_cast<std::size_t>(t)] = true;
    for (std::size_t i = 0; i < R; ++i)
      for (i64 j = t * T; j < std::min(Lk, t * T + T); ++j) m[i] = std::max(m[i], g.s[i][static_cast<std::size_t>(j)]);
  }
  // Output: softmax over the keys of the kept tiles (two passes, float64).
  const std::size_t dv = v.empty() ? 0 : v[0].size();
  r.out.assign(R, std::vector<double>(dv, 0.0));
  r.lse.assign(R, kNegInf);
  for (std::size_t i = 0; i < R; ++i) {
    double mx = kNegInf;
    for (i64 j = 0; j < Lk; ++j)
      if (kept[static_cast<std::size_t>(j / T)]) mx = std::max(mx, g.s[i][static_cast<std::size_t>(j)]);
    if (mx == kNegInf) continue;  // fully masked row: O = 0, LSE = -inf
    double l = 0;
    for (i64 j = 0; j < Lk; ++j)
      if (kept[static_cast<std::size_t>(j / T)]) l += std::exp(g.s[i][static_cast<std::size_t>(j)] - mx);
    for (i64 j = 0; j < Lk; ++j) {
      if (!kept[static_cast<std::size_t>(j / T)]) continue;
      const double p = std::exp(g.s[i][static_cast<std::size_t>(j)] - mx) / l;
      for (std::size_t c = 0; c < dv; ++c) r.out[i][c] += p * v[static_cast<std::size_t>(j)][c];
    }
    r.lse[i] = mx + std::log(l);
  }
  return r;
}

// One sequence of a prefill (or decode) call in the SPEC layout q [Lq, Hq, d], k [Lk, Hk, d],
// v [Lk, Hk, dv] (fp32 inputs, computed in float64), vote groups of `rows` consecutive rows of
// `heads` query heads of one KV group, ordered like the reference reports its deltas
// (KV head, head subgroup, row block).
struct Attention {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  i64 Lq = 0, Lk = 0, Hq = 1, Hk = 1, d = 0, dv = 0;
  bool causal = false;
  bool decode = false;  // own tile = the last tile (SPEC §2a decode)
  double scale = 0;     // 0: 1/sqrt(d)
  i64 T = 128, rows = 64, heads = 1;
  Order order = Order::natural;
  double lambda = 1.0;  // >= 1: dense (SPEC §3)
};

struct AttentionResult {
  std::vector<GroupResult> groups;        // task order
  std::vector<std::vector<i64>> group_rows;  // per group: (head * Lq + row) of each of its rows
  std::vector<double> out;                // [Lq, Hq, dv]
  std::vector<i64> visited, skipped;      // per query head (heads == 1) or per KV head
};

// The own tile of a vote group (SPEC §2a). Causal prefill: the diagonal tile, taken at the
// group's last row (the tile of key r_last + Lk - Lq, its last visible key); full attention: the
// tile of key r0 * Lk / Lq (the group's first position scaled by Lk / Lq); decode: the last tile.
inline i64 own_tile(const Attention& a, i64 r0, i64 r_last) {
  if (a.decode) return (a.Lk - 1) / a.T;
  if (a.causal) return std::max<i64>(0, r_last + a.Lk - a.Lq) / a.T;
  return r0 * a.Lk / a.Lq / a.T;
}

inline AttentionResult run(const Attention& a) {
  AttentionResult res;
  const double scale = a.scale > 0 ? a.scale : 1.0 / std::sqrt(static_cast<double>(a.d));
  const i64 g = a.Hq / a.Hk;
  res.out.assign(static_cast<std::size_t>(a.Lq * a.Hq * a.dv), 0.0);
  const i64 nstat = a.heads == 1 ? a.Hq : a.Hk;
  res.visited.assign(static_cast<std::size_t>(nstat), 0);
  res.skipped.assign(static_cast<std::size_t>(nstat), 0);
  const bool skip_on = a.lambda < 1.0;
  const double ln_lambda = skip_on ? std::log(a.lambda) : kNegInf;
  for (i64 kh = 0; kh < a.Hk; ++kh) {
    std::vector<std::vector<double>> vv(static_cast<std::size_t>(a.Lk), std::vector<double>(static_cast<std::size_t>(a.dv)));
    for (i64 j = 0; j < a.Lk; ++j)
      for (i64 c = 0; c < a.dv; ++c) vv[j][c] = a.v[(j * a.Hk + kh) * a.dv + c];
    for (i64 h0 = kh * g; h0 < kh * g + g; h0 += a.heads)
      for (i64 r0 = 0; r0 < a.Lq; r0 += a.rows) {
        const i64 r1 = std::min(a.Lq, r0 + a.rows);
        Group grp;
        std::vector<i64> ids;
        for (i64 h = h0; h < h0 + a.heads; ++h)
          for (i64 i = r0; i < r1; ++i) {
            std::vector<double> s(static_cast<std::size_t>(a.Lk), kNegInf);
            for (i64 j = 0; j < a.Lk; ++j) {
              if (a.causal && j > i + a.Lk - a.Lq) continue;
              double acc = 0;
              for (i64 c = 0; c < a.d; ++c)
                acc += static_cast<double>(a.q[(i * a.Hq + h) * a.d + c]) * a.k[(j * a.Hk + kh) * a.d + c];
              s[j] = acc * scale;
            }
            grp.s.push_back(std::move(s));
            ids.push_back(h * a.Lq + i);
          }
        grp.own = own_tile(a, r0, r1 - 1);
        GroupResult gr = run_group(grp, vv, a.T, a.order, skip_on, ln_lambda);
        const i64 sidx = a.heads == 1 ? h0 : kh;
        res.visited[sidx] += static_cast<i64>(gr.order.size());
        for (bool sk : gr.skipped) res.skipped[sidx] += sk;
        for (std::size_t x = 0; x < ids.size(); ++x) {
          const i64 h = ids[x] / a.Lq, i = ids[x] % a.Lq;
          for (i64 c = 0; c < a.dv; ++c) res.out[(i * a.Hq + h) * a.dv + c] = gr.out[x][c];
        }
        res.group_rows.push_back(ids);
        res.groups.push_back(std::move(gr));
      }
  }
  return res;
}

}  // namespace blasst::oracle
