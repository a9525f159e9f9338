// Internal: the Skip-Softmax policy every kernel uses (SPEC §2, §3, §5), the one place that says
//   - what lambda a sequence gets (SkipThreshold: the threshold rules of SPEC §3 as the kernels
//     see them, filled on the host by make_skip_threshold from the user's SkipConfig);
//   - how one query row votes on a tile (row_delta / row_keeps) - a kernel ORs row_keeps over
//     its vote group (documented per kernel, src/core/kernel_geometry.hpp);
//   - how a delta is binned for the SPEC §5 histogram (the host's DeltaHistogram rule) and the
//     layout of the kernels' histogram buffers ([head][kHistSlots] counts);
//   - the kernels' tile size (kTileKeys).
// The visit order is detail::VisitCursor (src/core/visit_cursor.hpp, host and device).
#pragma once

#include <cmath>
#include <cstdint>

#include "blasst/blasst.hpp"
#include "core/hist_bin.hpp"
#include "core/kernel_geometry.hpp"

#if defined(__CUDACC__)
#define BLASST_SKIP_HD __host__ __device__ __forceinline__
#define BLASST_SKIP_D __device__ __forceinline__
#else
#define BLASST_SKIP_HD inline
#define BLASST_SKIP_D inline
#endif

namespace blasst::sm90 {

// SPEC §3 as a kernel applies it per sequence: no skipping, one lambda for every sequence (a
// direct threshold), or lambda = factor / Lk (a factor, raw or calibrated). A sequence whose
// lambda is >= 1 runs dense.
enum class LambdaRule : int { never = 0, constant = 1, factor_over_length = 2 };

struct SkipThreshold {
  LambdaRule rule = LambdaRule::never;
  double value = 0.0;  // lambda (constant) or factor (factor_over_length)

  // log(lambda) of a sequence with Lk keys, natural (kLog2 = false) or base 2 (for kernels that
  // score in log2 units); -inf: that sequence skips nothing. Double until the final rounding, as
  // the host's resolve_lambda.
  template <bool kLog2>
  BLASST_SKIP_HD float log_lambda(std::int64_t Lk) const {
    const double lam = rule == LambdaRule::constant             ? value
                       : rule == LambdaRule::factor_over_length ? value / static_cast<double>(Lk)
                                                                : 1.0;
    if (!(lam < 1.0)) return -INFINITY;
    return static_cast<float>(kLog2 ? log2(lam) : log(lam));
  }
  // Whether some sequence of at most max_Lk keys can skip (else a dense kernel computes the same).
  bool can_skip(std::int64_t max_Lk) const {
    return rule == LambdaRule::constant ? value < 1.0
           : rule == LambdaRule::factor_over_length ? value < static_cast<double>(max_Lk)
                                                    : false;
  }
};

// The threshold rule of a validated SkipConfig (skipping off: never).
inline SkipThreshold make_skip_threshold(const SkipConfig& skip) {
  SkipThreshold t;
  if (!skip.enabled) return t;
  // resolve_lambda(skip, 1) is lambda itself for a direct threshold and the factor otherwise
  // (factor / 1); it also reports an unusable configuration.
  t.value = resolve_lambda(skip, 1);
  t.rule = skip.threshold ? LambdaRule::constant : LambdaRule::factor_over_length;
  return t;
}

// The running maximum of the NaN rule (docs/reference.md): max with NaN propagating, for tile
// maxima, the running max m and the vote's group delta. A NaN visible score makes its row's tile
// max NaN, then its m NaN, so the row's delta is NaN in that tile and in every later tile it sees
// and the row keeps them all (row_keeps); its O and LSE come out NaN. On the device it is one
// FMNMX.NAN, the cost of fmaxf (which drops NaN).
BLASST_SKIP_HD float running_max(float a, float b) {
#if defined(__CUDA_ARCH__)
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
#else
  return (a != a || b != b) ? a + b : (a < b ? b : a);
#endif
}

// One query row's part of the vote (SPEC §2), in the kernel's score units (scale converts the
// difference to the units of log_lambda: the softmax scale for raw scores, 1 for pre-scaled ones).
//   row_delta: (tile_max - m) * scale; -inf when the row sees no key of the tile (it does not
//   vote); +inf when the row has seen no key yet (m = -inf: the first tile is never skipped);
//   NaN when tile_max or m is NaN (running_max).
//   row_keeps: the row asks to keep the tile, i.e. !(row_delta < log_lambda) for a voting row
//   (a NaN delta keeps). A vote group skips the tile iff no row keeps it; the caller handles
//   log_lambda = -inf (nothing is skipped).
// Selects, no early return (both sit on the skip kernels' paths).
BLASST_SKIP_D float row_delta(float tile_max, float m, float scale) {
  const float d = m == -INFINITY ? INFINITY : (tile_max - m) * scale;
  return tile_max == -INFINITY ? -INFINITY : d;
}
// row_delta as the histogram sees it: the same bin (hist_bin) for every input, without the
// m = -inf select: there (tile_max - m) * scale is +inf (NaN for a NaN tile max or a zero scale),
// the top bin like row_delta's +inf; everything else is row_delta's value. The product and the
// tile_max test are row_keeps' own, so a kernel that votes and bins computes them once.
BLASST_SKIP_D float row_delta_for_bin(float tile_max, float m, float scale) {
  const float d = (tile_max - m) * scale;
  return tile_max != -INFINITY ? d : -INFINITY;
}
// Bitwise & on purpose: the vote sits on the softmax's critical path, and a short-circuit && made
// ptxas branch around it (BRA + BSYNC before the BAR.RED in the prefill skip kernel; +2-3 % at
// 50-70 % sparsity on the H200, 9a59ea1) where selects are enough. No select for m = -inf either
// (a compare and a select per row on that path): there (tile_max - m) * scale is +inf, or NaN
// for a NaN tile max or a zero scale, and both keep, exactly as row_delta's +inf does; this needs
// scale >= 0, which the problem guarantees (finite and > 0; a float that underflows is +0).
BLASST_SKIP_D bool row_keeps(float tile_max, float m, float scale, float log_lambda) {
  const float d = (tile_max - m) * scale;
  return (tile_max != -INFINITY) & !(d < log_lambda);
}

// SPEC §5 histogram: the host's bin rule and the kernels' buffer layout, [head][kHistSlots].
using detail::hist_bin;
using detail::kHistBins;
using detail::kHistSlots;

inline constexpr int kTileKeys = detail::kKernelTileKeys;

// Per-thread statistics of a skip kernel.
struct SkipCounters {
  unsigned long long visited = 0, skipped = 0;
};

}  // namespace blasst::sm90

#undef BLASST_SKIP_HD
#undef BLASST_SKIP_D
