// Internal: maps a CTA to its work (query block, head, sequence). A 1-D grid, head-major: the
// CTAs that run together share one head's K/V (L2 hits instead of one HBM stream per head), and
// within a head the query blocks go from the last to the first, so the heaviest causal CTAs start
// first and the light ones fill the tail.
#pragma once

#include "core/visit_cursor.hpp"
#include "cuda/sm90/prefill/prefill_params.hpp"

namespace blasst::sm90::prefill {

struct PrefillWork {
  int m_block = 0, h = 0, b = 0;
  int q_start = 0, q_len = 0, k_start = 0, k_len = 0;
  int n_max = 0;  // key tiles visited by the CTA: tiles 0..n_max-1, in visit order
  int own = 0;    // max-first: the CTA's own tile (-1: natural order)
};

// The visit order of a CTA's key tiles is walked with detail::VisitCursor (src/core/visit_cursor.hpp):
// natural (own = -1), or max-first (own >= 0): the sink tile 0, the own tile, then own-1, own+1,
// own-2, own+2, ... within [1, n_max), exactly as the reference's visit_order
// (src/reference/reference.cpp) lists them.
// Why one order per CTA matches both 64-row vote groups: causal, the own tile is the last
// visible one (n_max - 1 for the CTA's last rows); the first group's own tile is the same or one
// less, and restricted to its visible tiles the CTA's order is that group's order (own + k is
// never visible to it). Full mask with Lq == Lk: both groups' own tiles are row0 / 128.

struct HeavyFirstScheduler {
  static dim3 grid(const PrefillParams& p) {
    return dim3(unsigned(p.hq) * unsigned(p.batch) * unsigned(p.num_m_blocks), 1, 1);
  }

  // Returns false when the block lies past its sequence's end (ragged batches).
  template <int kBlockM, int kBlockN>
  __device__ static bool get(const PrefillParams& p, PrefillWork& w) {
    const int bh = int(blockIdx.x) / p.num_m_blocks;
    w.m_block = p.num_m_blocks - 1 - (int(blockIdx.x) - bh * p.num_m_blocks);
    w.h = bh % p.hq;
    w.b = bh / p.hq;
    if (p.cu_q) {
      w.q_start = p.cu_q[w.b];
      w.q_len = p.cu_q[w.b + 1] - w.q_start;
      w.k_start = p.cu_k[w.b];
      w.k_len = p.cu_k[w.b + 1] - w.k_start;
    } else {
      w.q_start = 0; w.q_len = p.rows_q; w.k_start = 0; w.k_len = p.rows_k;
    }
    if (w.m_block * kBlockM >= w.q_len) return false;
    const int n_tiles = (w.k_len + kBlockN - 1) / kBlockN;
    w.n_max = n_tiles;
    if (p.causal) {
      const int row_last = min(w.q_len, (w.m_block + 1) * kBlockM) - 1;
      const int lim = row_last + w.k_len - w.q_len;  // last key visible to the CTA's last row
      w.n_max = lim < 0 ? 0 : min(n_tiles, lim / kBlockN + 1);
    }
    w.own = -1;
    if (p.visit_order == 1 && w.n_max > 0) {
      // Causal: the diagonal tile; full: the tile holding key row0 * Lk / Lq (SPEC §2a).
      const long long row0 = static_cast<long long>(w.m_block) * kBlockM;
      const int own = p.causal ? w.n_max - 1 : static_cast<int>(row0 * w.k_len / max(w.q_len, 1) / kBlockN);
      w.own = min(max(own, 0), w.n_max - 1);
    }
    return true;
  }
};

// Key tiles holding at least one visible key for query rows [r0, r0 + 64) (SPEC §5 "visited").
__device__ __forceinline__ int visible_tiles(int r0, int rows, int q_len, int k_len, bool causal,
                                             int kBlockN) {
  const int r_last = min(r0 + rows, q_len) - 1;
  if (r_last < r0) return 0;
  const int n_tiles = (k_len + kBlockN - 1) / kBlockN;
  if (!causal) return n_tiles;
  const int lim = r_last + k_len - q_len;
  return lim < 0 ? 0 : min(n_tiles, lim / kBlockN + 1);
}

}  // namespace blasst::sm90::prefill
