// Internal: normalises O by the final denominator and writes O and LSE (natural log) straight
// from registers. Rows past the sequence end are not written. Rows that saw no key get O = 0
// and LSE = -inf (SPEC §1), never NaN.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/sm90/prefill/prefill_mainloop.hpp"

namespace blasst::sm90::prefill {

template <class Traits, class TensorO, class Softmax>
__device__ __forceinline__ void epilogue(KernelParams<Traits> const& kp, PrefillWork const& w,
                                         int mma_tid, TensorO& tOrO, Softmax& sm) {
  using Element = typename Traits::Element;
  const PrefillParams& p = kp.p;
  typename Traits::TiledMmaPV mma1;
  auto thr1 = mma1.get_thread_slice(mma_tid);
  Tensor cO = make_identity_tensor(select<0, 1>(typename Traits::TileShapePV{}));
  Tensor tOcO = thr1.partition_C(cO);
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
  Tensor tOrO_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
  constexpr int kRows = decltype(size<0>(tOrO_rc))::value;
  constexpr int kCols = decltype(size<1>(tOrO_rc))::value;
  const int row0 = w.m_block * Traits::kBlockM;
  const bool ragged = p.cu_q != nullptr;

  CUTLASS_PRAGMA_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    const float l = quad_sum(sm.l[mi]);
    // l = 0 when the row saw nothing (the row maximum's weight is 1), or when a seed (seed_max)
    // far above the row's kept scores flushed each of their exponentials to 0 (ftz: below
    // 2^-126 of the seed's weight, a mass an LSE merge cannot see): O = 0, LSE = -inf. Otherwise
    // l >= 2^-126 and 1 / l is finite. A NaN l (NaN rule) makes O and LSE NaN.
    const bool empty = l == 0.f;
    const float inv = empty ? 0.f : 1.f / l;
    const int row = row0 + int(get<0>(tOcO_rc(mi, 0)));
    if (row >= w.q_len) continue;
    const std::int64_t tok = std::int64_t(w.q_start) + row;
    const std::int64_t bo = ragged ? 0 : std::int64_t(w.b);
    if (p.lse != nullptr && mma_tid % 4 == 0) {
      const float lse = empty ? -INFINITY : sm.m[mi] * p.scale + logf(l);
      p.lse[bo * p.lse_batch + std::int64_t(w.h) * p.lse_head + tok * p.lse_row] = lse;
    }
    const std::int64_t base = bo * p.o_batch + tok * p.o_row + std::int64_t(w.h) * p.o_head;
    CUTLASS_PRAGMA_UNROLL
    for (int ni = 0; ni < kCols; ni += 2) {
      const int col = int(get<1>(tOcO_rc(mi, ni)));  // (ni, ni+1) are adjacent columns
      const float a = tOrO_rc(mi, ni) * inv, b = tOrO_rc(mi, ni + 1) * inv;
      if (p.out_f32) {
        *reinterpret_cast<float2*>(static_cast<float*>(p.o) + base + col) = make_float2(a, b);
      } else if constexpr (cute::is_same_v<Element, cutlass::bfloat16_t>) {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.o) + base + col) =
            __floats2bfloat162_rn(a, b);
      } else {
        *reinterpret_cast<__half2*>(static_cast<__half*>(p.o) + base + col) = __floats2half2_rn(a, b);
      }
    }
  }
}

}  // namespace blasst::sm90::prefill
