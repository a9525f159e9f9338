// Internal: the decode CTA's epilogue: row sums across warps, then the normalised fp32 partial
// (O, LSE in natural-log units) of its split; decode_merge.cu combines the splits.
#pragma once

#include "cuda/sm90/decode/decode_mainloop.cuh"

namespace blasst::sm90::decode {

template <class Traits>
__device__ __forceinline__ void write_partial(DecodeCta<Traits>& c) {
  using Cta = DecodeCta<Traits>;
  constexpr int W = Cta::W, MT = Cta::MT, kRows = Cta::kRows, D = Cta::D, kThr = Cta::kThr;
  const Params& p = c.p;
  const int warp = c.warp, lane = c.lane, tid = c.tid;
  // Row sums: quad, then across warps (every warp saw different keys).
  __syncthreads();  // every warp is done with the rings: their memory is reused below
  float* lred = &c.ss.red[0][0][0];  // [W][kRows]
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float v = c.l_run[mt][hf];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if ((lane & 3) == 0) lred[warp * kRows + mt * 16 + hf * 8 + (lane >> 2)] = v;
    }
  if constexpr (MT == 1) {
    // Each warp's O covers its keys only: sum the 8 partial outputs through shared memory (the K
    // ring, idle now), then normalise and write rows < R with coalesced stores.
    float* sO = reinterpret_cast<float*>(c.ss.k[0]);  // [W][16][D]
#pragma unroll
    for (int nt = 0; nt < Cta::kDN; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = hf * 8 + (lane >> 2), col = nt * 8 + 2 * (lane & 3);
        *reinterpret_cast<float2*>(sO + (warp * 16 + r) * D + col) =
            make_float2(c.o_acc[0][nt][hf * 2], c.o_acc[0][nt][hf * 2 + 1]);
      }
    __syncthreads();
    for (int idx = tid; idx < p.rows * D; idx += kThr) {
      const int r = idx / D, col = idx % D;
      float l = 0.f, o = 0.f;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        l += lred[w * kRows + r];
        o += sO[(w * 16 + r) * D + col];
      }
      p.o_part[(c.part_row0 + r) * D + col] = l > 0.f ? o / l : 0.f;
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = hf * 8 + (lane >> 2);
      if (warp == 0 && (lane & 3) == 0 && r < p.rows) {
        float l = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) l += lred[w * kRows + r];
        p.lse_part[c.part_row0 + r] = l > 0.f ? (c.m_run[0][hf] + log2f(l)) * 0.69314718055994531f : -INFINITY;
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
          for (int w = 0; w < W; ++w) l += lred[w * kRows + r];
          const bool empty = !(l > 0.f);
          const float inv = empty ? 0.f : 1.f / l;
          float* dst = p.o_part + (c.part_row0 + r) * D + warp * (D / W) + 2 * (lane & 3);
#pragma unroll
          for (int nt = 0; nt < Cta::kNT; ++nt)
            *reinterpret_cast<float2*>(dst + nt * 8) =
                make_float2(c.o_acc[mt][nt][hf * 2] * inv, c.o_acc[mt][nt][hf * 2 + 1] * inv);
          if (warp == 0 && (lane & 3) == 0)
            p.lse_part[c.part_row0 + r] = empty ? -INFINITY : (c.m_run[mt][hf] + log2f(l)) * 0.69314718055994531f;
        }
      }
    }
  }
}

}  // namespace blasst::sm90::decode
