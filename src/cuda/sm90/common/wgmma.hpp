// Internal: warpgroup GEMM helpers shared by the sm_90a kernels that use wgmma through CuTe
// (prefill, backward): one batch issue, the accumulator's (rows, cols) and register-A views, the
// f32 -> 16-bit fragment conversion, and a sequence's view of a TMA tensor.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_conversion.h>

namespace blasst::sm90 {

using namespace cute;

// Issues one warpgroup GEMM (all k-blocks) as one wgmma batch; kWait >= 0 waits until at most
// kWait batches are in flight. kRS: A lives in registers.
template <bool kZeroInit, int kWait, bool kRS, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void wg_gemm(Mma& mma, TA& a, TB const& b, TC& c) {
  if constexpr (kRS) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTLASS_PRAGMA_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (kWait >= 0) warpgroup_wait<kWait>();
  warpgroup_fence_operand(c);
  if constexpr (kRS) warpgroup_fence_operand(a);
}

// GMMA accumulator ((2 cols, 2 rows, N/8 col groups), MMA_M, MMA_N) viewed as (rows, cols).
template <class L>
CUTE_HOST_DEVICE constexpr auto acc_rowcol(L const& l) {
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)),
                     make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

// The same accumulator viewed as the register A operand of a k16 wgmma: two 8-column groups
// form one 16-wide k-block.
template <class L>
CUTE_HOST_DEVICE constexpr auto acc_to_a(L const& l) {
  auto v = get<0, 2>(l);
  auto lo = make_layout(Int<2>{}, stride(v));
  auto hi = make_layout(Int<size(v) / 2>{}, stride(v) * Int<2>{});
  return make_layout(make_layout(get<0, 0>(l), get<0, 1>(l), lo), get<1>(l),
                     make_layout(hi, get<2>(l)));
}

// Converts an f32 register tensor to To (bf16 / f16) pairwise (cvt.rn.*x2), same layout.
template <class To, class Frag>
__device__ __forceinline__ auto convert_frag(Frag const& f) {
  auto out = make_tensor<To>(f.layout());
  auto in2 = recast<cutlass::Array<float, 2>>(f);
  auto out2 = recast<cutlass::Array<To, 2>>(out);
  cutlass::NumericArrayConverter<To, float, 2> conv;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(in2); ++i) out2(i) = conv(in2(i));
  return out;
}

// Gmem tile view of one head of a sequence in a (tokens, d, heads, batch) TMA tensor: rows offset
// by the sequence start (ragged) or indexed by batch (the prefill and wgmma backward producers).
template <class TmaTensor>
__device__ __forceinline__ auto seq_view(TmaTensor const& m, int head, int b, int start, bool ragged) {
  return domain_offset(make_coord(start, _0{}), m(_, _, head, ragged ? 0 : b));
}

}  // namespace blasst::sm90
