// Internal: the epilogue of one decode CTA: the normalised fp32 partial (O, LSE in natural-log
// units) of its split, which decode_merge.cuh combines with the other splits' partials; a split
// past its sequence's end writes an empty partial.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/decode/decode_mainloop.cuh"
#include "cuda/sm90/decode/decode_params.hpp"
#include "cuda/sm90/decode/decode_scheduler.cuh"

namespace blasst::sm90::decode {

// A split past this sequence's end: O = 0, LSE = -inf (the merge gives it weight 0).
template <class Traits>
__device__ __forceinline__ void write_empty_partial(const Params& p, const DecodeWork& w) {
  constexpr int D = Traits::D, kThr = Traits::kThreads;
  for (int r = threadIdx.x; r < p.rows; r += kThr) {
    p.lse_part[w.part_row0 + r] = -INFINITY;
    for (int c = 0; c < D; ++c) p.o_part[(w.part_row0 + r) * D + c] = 0.f;
  }
}

// The CTA's partial: O / l and LSE = (m + log2 l) ln 2 per row < R (l = 0: nothing seen, O = 0
// and LSE = -inf; a NaN l stays NaN: the NaN rule). Reuses the rings: every warp must be done
// with them (the first barrier).
template <class Traits>
__device__ __forceinline__ void write_partial(const Params& p, const DecodeWork& w, const DecodeSmem<Traits>& sm,
                                              const typename DecodeMainloop<Traits>::RowVals& m_run,
                                              const typename DecodeMainloop<Traits>::RowVals& l_run,
                                              const typename DecodeMainloop<Traits>::OutAcc& o_acc) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr int D = Traits::D, MT = Traits::MT, W = Traits::kWarps, kThr = Traits::kThreads;
  constexpr int kRows = Traits::kRows, kDN = Traits::kDN, kNT = Traits::kNT;
  // Row sums: quad, then across warps (every warp saw different keys).
  __syncthreads();  // every warp is done with the rings: their memory is reused below
  float* lred = sm.sRed;  // [W][kRows]
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float v = l_run[mt][hf];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if ((lane & 3) == 0) lred[warp * kRows + mt * 16 + hf * 8 + (lane >> 2)] = v;
    }
  if constexpr (MT == 1) {
    // Each warp's O covers its keys only: sum the 8 partial outputs through shared memory (the K
    // ring, idle now), then normalise and write rows < R with coalesced stores.
    float* sO = reinterpret_cast<float*>(sm.sK);  // [W][16][D]
#pragma unroll
    for (int nt = 0; nt < kDN; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = hf * 8 + (lane >> 2), c = nt * 8 + 2 * (lane & 3);
        *reinterpret_cast<float2*>(sO + (warp * 16 + r) * D + c) =
            make_float2(o_acc[0][nt][hf * 2], o_acc[0][nt][hf * 2 + 1]);
      }
    __syncthreads();
    for (int idx = tid; idx < p.rows * D; idx += kThr) {
      const int r = idx / D, c = idx % D;
      float l = 0.f, o = 0.f;
#pragma unroll
      for (int wp = 0; wp < W; ++wp) {
        l += lred[wp * kRows + r];
        o += sO[(wp * 16 + r) * D + c];
      }
      p.o_part[(w.part_row0 + r) * D + c] = l != 0.f ? o / l : 0.f;  // l = 0: nothing seen; NaN: NaN
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = hf * 8 + (lane >> 2);
      if (warp == 0 && (lane & 3) == 0 && r < p.rows) {
        float l = 0.f;
#pragma unroll
        for (int wp = 0; wp < W; ++wp) l += lred[wp * kRows + r];
        p.lse_part[w.part_row0 + r] = l != 0.f ? (m_run[0][hf] + log2f(l)) * 0.69314718055994531f : -INFINITY;
      }
    }
  } else {
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = mt * 16 + hf * 8 + (lane >> 2);
        if (r < p.rows) {
          float l = 0.f;
#pragma unroll
          for (int wp = 0; wp < W; ++wp) l += lred[wp * kRows + r];
          const bool empty = l == 0.f;  // nothing seen (a NaN l stays NaN: the NaN rule)
          // O / l, not O * (1 / l) (as the one-m-tile path above): in a seeded split (SPEC §2a)
          // m starts at the row's maximum over the seed tiles, which may lie in another split, so
          // this split's l is unbounded below: with every kept key >= 128 log2 units under the
          // seed, l is subnormal (exp2f and the sums keep subnormals; no ftz here), 1 / l
          // overflows to +inf, and O * inf is inf, or NaN where O = 0 (P rounded to 16 bits
          // flushes below 2^-133 while l's fp32 sum does not), which the merge's weight
          // exp(LSE - max) ~ 0 does not cancel (0 * inf = NaN): the trained model's NaN decode
          // with two or more seeded splits and 32 rows (MT = 4). A division with a subnormal
          // divisor is exact IEEE division: finite, and 0 for O = 0.
          float* dst = p.o_part + (w.part_row0 + r) * D + warp * (D / W) + 2 * (lane & 3);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
            *reinterpret_cast<float2*>(dst + nt * 8) =
                empty ? make_float2(o_acc[mt][nt][hf * 2] * 0.f, o_acc[mt][nt][hf * 2 + 1] * 0.f)  // as before
                      : make_float2(o_acc[mt][nt][hf * 2] / l, o_acc[mt][nt][hf * 2 + 1] / l);
          if (warp == 0 && (lane & 3) == 0)
            p.lse_part[w.part_row0 + r] = empty ? -INFINITY : (m_run[mt][hf] + log2f(l)) * 0.69314718055994531f;
        }
      }
    }
  }
}

}  // namespace blasst::sm90::decode
