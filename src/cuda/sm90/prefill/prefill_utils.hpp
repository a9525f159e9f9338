// Internal: small device helpers of the prefill kernel: named barrier ids and quad reductions
// (warpgroup GEMM issue, accumulator views and conversion: common/wgmma.hpp).
#pragma once

#include <cutlass/numeric_conversion.h>

#include "cuda/sm90/common/ptx.hpp"
#include "cuda/sm90/common/wgmma.hpp"
#include "cuda/sm90/common/skip_policy.hpp"
#include "cuda/sm90/prefill/prefill_traits.hpp"

namespace blasst::sm90::prefill {

using namespace cute;

// Named barrier ids (0 is __syncthreads; the barriers themselves are in common/ptx.hpp): one
// skip-vote barrier per consumer warpgroup, the ping-pong issue barriers, and (skip_hist) the
// hand-over of each warpgroup's last tile to its histogram warp.
inline constexpr int kBarVote0 = 1;
inline constexpr int kBarSched0 = 3;
inline constexpr int kBarHistLast0 = 5;

// The row maximum over the 4 threads of a quad, NaN propagating (running_max: the NaN rule).
__device__ __forceinline__ float quad_max(float x) {
  x = running_max(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return running_max(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace blasst::sm90::prefill
