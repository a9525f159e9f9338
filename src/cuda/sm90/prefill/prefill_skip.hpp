// Internal: the Skip-Softmax vote (SPEC §2) of one consumer warpgroup (64 rows x 1 head) on one
// 128-key tile, and its optional statistics (SPEC §5).
#pragma once

#include <cmath>

#include "cuda/sm90/prefill/prefill_params.hpp"
#include "cuda/sm90/prefill/prefill_utils.hpp"

namespace blasst::sm90::prefill {

// Same rule as blasst::DeltaHistogram::bin_of: underflow bin 0, regular bins 1..kHistBins of
// width 1/16 over [-64, 0), top bin for delta >= 0 and NaN. Exact in float, so equal to the host's
// floor((delta - kLo) / width) in double: delta * 16 is exact (a power of two) and floor commutes
// with adding the integer 1024. (The double version sat on the histogram warp's path: 4 dependent
// FP64 ops per tile.)
static_assert(kHistInvWidth == 16.0f && kHistLo == -64.0f, "hist_bin relies on a power-of-two width");
__device__ __forceinline__ int hist_bin(float delta) {
  if (!(delta < 0.f)) return kHistBins + 1;
  if (delta < kHistLo) return 0;
  const int i = int(floorf(delta * kHistInvWidth)) + int(-kHistLo * kHistInvWidth);
  return 1 + min(max(i, 0), kHistBins - 1);
}

// delta_G = max over the group's rows r of (tile_max_r - m_r) * scale, in natural-log units.
// Rows past the sequence end and rows with nothing visible in the tile do not vote; a row that
// has seen no key yet (m = -inf) with a visible key gives +inf (the first tile is never skipped).
// This thread's rows only (-inf when none votes; NaN terms ignored, as fmaxf does); m must be
// the running max before the tile is folded in.
template <int kRows>
__device__ __forceinline__ float thread_delta(float const (&tmax)[kRows], float const (&m)[kRows],
                                              int const (&row)[kRows], int q_len, float scale) {
  float d = -INFINITY;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < kRows; ++i) {
    if (row[i] < q_len && tmax[i] != -INFINITY) {
      const float di = (m[i] == -INFINITY) ? INFINITY : (tmax[i] - m[i]) * scale;
      d = fmaxf(d, di);
    }
  }
  return d;
}

// Warp maximum of thread_delta (the 4 lanes of a quad hold the same rows: xor 4, 8, 16).
__device__ __forceinline__ float warp_delta(float d) {
  d = fmaxf(d, __shfl_xor_sync(0xffffffffu, d, 4));
  d = fmaxf(d, __shfl_xor_sync(0xffffffffu, d, 8));
  return fmaxf(d, __shfl_xor_sync(0xffffffffu, d, 16));
}

// This thread's share of "do not skip": some of its voting rows has delta_r >= ln(lambda). Same
// per-row terms as thread_delta, so with ln(lambda) > -inf the OR of this over the warpgroup is
// exactly !(delta_G < ln(lambda)) (NaN terms count for neither, as fmaxf ignores them; no voting
// row -> skip, as delta_G = -inf). The caller handles ln(lambda) = -inf (never skip).
template <int kRows>
__device__ __forceinline__ bool vote_keep(float const (&tmax)[kRows], float const (&m)[kRows],
                                          int const (&row)[kRows], int q_len, float scale,
                                          float ln_lambda) {
  bool keep = false;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < kRows; ++i) {
    if (row[i] < q_len && tmax[i] != -INFINITY) {
      const float di = (m[i] == -INFINITY) ? INFINITY : (tmax[i] - m[i]) * scale;
      keep = keep || (di >= ln_lambda);
    }
  }
  return keep;
}

}  // namespace blasst::sm90::prefill
