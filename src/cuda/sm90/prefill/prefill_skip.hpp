// Internal: the Skip-Softmax vote (SPEC §2) of one consumer warpgroup (64 rows x 1 head) on one
// 128-key tile, and its optional statistics (SPEC §5), over this thread's rows. The per-row rule
// is the policy's (src/cuda/sm90/common/skip_policy.hpp).
#pragma once

#include "cuda/sm90/common/skip_policy.hpp"
#include "cuda/sm90/prefill/prefill_utils.hpp"

namespace blasst::sm90::prefill {

// delta_G = max over the group's rows r of (tile_max_r - m_r) * scale, in natural-log units,
// over this thread's voting rows (rows past the sequence end do not vote); -inf when none votes,
// NaN when a voting row's delta is NaN (running_max: the histogram's top bin). m must be the
// running max before the tile is folded in. For the histogram only: row_delta_for_bin's value,
// which bins as row_delta's (it shares the vote's arithmetic: one select and one max per row).
template <int kRows>
__device__ __forceinline__ float thread_delta(float const (&tmax)[kRows], float const (&m)[kRows],
                                              int const (&row)[kRows], int q_len, float scale) {
  float d = -INFINITY;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < kRows; ++i) {
    d = running_max(d, row[i] < q_len ? row_delta_for_bin(tmax[i], m[i], scale) : -INFINITY);
  }
  return d;
}

// Warp maximum of thread_delta (the 4 lanes of a quad hold the same rows: xor 4, 8, 16).
__device__ __forceinline__ float warp_delta(float d) {
  d = running_max(d, __shfl_xor_sync(0xffffffffu, d, 4));
  d = running_max(d, __shfl_xor_sync(0xffffffffu, d, 8));
  return running_max(d, __shfl_xor_sync(0xffffffffu, d, 16));
}

// This thread's share of "do not skip": one of its voting rows keeps the tile. The OR of this
// over the warpgroup is exactly !(delta_G < ln(lambda)) for ln(lambda) > -inf; the caller
// handles ln(lambda) = -inf (never skip).
template <int kRows>
__device__ __forceinline__ bool vote_keep(float const (&tmax)[kRows], float const (&m)[kRows],
                                          int const (&row)[kRows], int q_len, float scale,
                                          float ln_lambda) {
  bool keep = false;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < kRows; ++i) keep |= (row[i] < q_len) & row_keeps(tmax[i], m[i], scale, ln_lambda);
  return keep;
}

}  // namespace blasst::sm90::prefill
