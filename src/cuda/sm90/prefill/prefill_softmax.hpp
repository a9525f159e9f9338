// Internal: the streaming softmax of one thread's rows (SPEC §1): running max m (raw scores),
// running denominator l, and the rescale of O when m grows. Maxima propagate NaN (running_max, the
// NaN rule of docs/reference.md): a NaN score makes m, P, l and O of its row NaN. Exponentials are exp2 with
// scale*log2(e) folded into one FFMA.
#pragma once

#include <cmath>

#include "cuda/sm90/common/ptx.hpp"  // exp2_ftz
#include "cuda/sm90/prefill/prefill_utils.hpp"

namespace blasst::sm90::prefill {

// t[0] = max(t[0 .. 2W)), halving the width each level (compile-time strides: t stays in registers).
template <int W>
__device__ __forceinline__ void tree_max(float* t) {
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < W; ++i) t[i] = running_max(t[i], t[i + W]);
  if constexpr (W > 1) tree_max<W / 2>(t);
}

template <int kRows>
struct OnlineSoftmax {
  float m[kRows];  // running max of raw scores (-inf: nothing seen)
  float l[kRows];  // thread-partial denominator (quad-summed at the end)

  __device__ __forceinline__ OnlineSoftmax() {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) { m[i] = -INFINITY; l[i] = 0.f; }
  }

  // Row maxima of the (masked) tile, reduced over the 4 threads that share a row.
  // kTree: pairwise tree (dependent depth log2(cols) instead of cols - 1). The skip variant's
  // vote needs every row maximum before the first exponential, so the serial chain would sit
  // whole on its critical path; dense interleaves it with the exponentials (kept as it was).
  template <bool kTree, class TS>
  __device__ __forceinline__ void tile_max(TS const& s, float (&tmax)[kRows]) const {
    constexpr int kCols = decltype(size<1>(s))::value;
    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      float x;
      if constexpr (kTree) {
        static_assert((kCols & (kCols - 1)) == 0, "power-of-two columns per thread");
        float t[kCols];
        CUTLASS_PRAGMA_UNROLL
        for (int ni = 0; ni < kCols; ++ni) t[ni] = s(mi, ni);
        tree_max<kCols / 2>(t);
        x = t[0];
      } else {
        x = s(mi, 0);
        CUTLASS_PRAGMA_UNROLL
        for (int ni = 1; ni < kCols; ++ni) x = running_max(x, s(mi, ni));
      }
      tmax[mi] = quad_max(x);
    }
  }

  // Folds the tile into m and l, overwrites s with P = exp(scale*(s - m_new)), and returns the
  // factor alpha by which O must be rescaled.
  template <class TS>
  __device__ __forceinline__ void update(TS& s, float const (&tmax)[kRows], float scale_log2,
                                         float (&alpha)[kRows]) {
    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const float m_new = running_max(m[mi], tmax[mi]);
      // A row with nothing visible yet keeps m = -inf: use 0 so that exp2(-inf - 0) = 0.
      const float m_scaled = (m_new == -INFINITY) ? 0.f : m_new * scale_log2;
      alpha[mi] = exp2_ftz(m[mi] * scale_log2 - m_scaled);  // m = -inf -> 0 (O and l are 0 anyway)
      m[mi] = m_new;
      float sum = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int ni = 0; ni < size<1>(s); ++ni) {
        s(mi, ni) = exp2_ftz(fmaf(s(mi, ni), scale_log2, -m_scaled));
        sum += s(mi, ni);
      }
      l[mi] = l[mi] * alpha[mi] + sum;
    }
  }

  template <class TO>
  __device__ __forceinline__ static void rescale(TO& o, float const (&alpha)[kRows]) {
    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      CUTLASS_PRAGMA_UNROLL
      for (int ni = 0; ni < size<1>(o); ++ni) o(mi, ni) *= alpha[mi];
    }
  }
};

}  // namespace blasst::sm90::prefill
