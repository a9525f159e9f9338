// Internal: score masking (SPEC §1): keys past the sequence end, and the bottom-right aligned
// causal mask (query i sees key j iff j <= i + Lk - Lq).
#pragma once

#include <cmath>

#include "cuda/sm90/prefill/prefill_utils.hpp"

namespace blasst::sm90::prefill {

// True when some score of key tile n can be masked for some row of the CTA (only then the
// per-element mask runs).
__device__ __forceinline__ bool tile_needs_mask(int n, int kBlockN, int row0, int q_len,
                                                int k_len, bool causal) {
  const int last_key = (n + 1) * kBlockN - 1;
  if (last_key >= k_len) return true;
  return causal && last_key > row0 + k_len - q_len;
}

// s: accumulator in (rows, cols) view; c: matching identity coordinates (row, col) in the CTA
// tile. row0/col0: first query row / key of the tile within the sequence.
template <class TS, class TC>
__device__ __forceinline__ void apply_mask(TS& s, TC const& c, int row0, int col0, int q_len,
                                           int k_len, bool causal) {
  const int diag = k_len - q_len;
  CUTLASS_PRAGMA_UNROLL
  for (int mi = 0; mi < size<0>(s); ++mi) {
    const int row = row0 + int(get<0>(c(mi, 0)));
    const int lim = causal ? min(k_len, row + diag + 1) : k_len;  // keys < lim are visible
    CUTLASS_PRAGMA_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) {
      if (col0 + int(get<1>(c(mi, ni))) >= lim) s(mi, ni) = -INFINITY;
    }
  }
}

}  // namespace blasst::sm90::prefill
