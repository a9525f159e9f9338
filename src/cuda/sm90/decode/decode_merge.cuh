// Internal: the merge of the split-KV partials, inside the split kernel. Every CTA of a (sequence,
// KV head) group counts its arrival after writing its partial; the last to arrive merges the
// group's splits into out / lse (one launch per call, no kernel boundary between the splits and
// the merge: issue 18, docs/decode_kernel.md "Host cost of a call").
//
// The arrival count needs no zeroed memory (the pool's blocks and a caller's workspace hold
// whatever was there): each group has a 64-bit word (epoch << 16 | arrivals), and the host gives
// every call a fresh 48-bit epoch, so a word from an earlier call (or garbage) reads as "no
// arrival yet". The last CTA resets its word to 0, so the replays of a CUDA graph (same epoch,
// same word) count from zero again.
//
// At B = 1 the merge is on the critical path, so its L2 round trips count (the first version, with
// a load before the CAS, the reset before the reads and 8-split load batches, made B = 1, 32k dense
// 6 % slower than the merge kernel it replaced: H200 A/B of ff0832a vs 33cb6a6).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/common/ptx.hpp"
#include "cuda/sm90/decode/decode_params.hpp"

namespace blasst::sm90::decode {

// 48-bit epochs, never 0 (a reset word) nor 2^48 - 1 (a word of 0xff bytes).
inline constexpr unsigned long long kEpochMask = (1ull << 48) - 1;

// One more arrival of this call (epoch) at its group's word; true for the arrival that makes n.
// Thread 0 of a CTA, after the CTA's partial is visible device-wide.
__device__ __forceinline__ bool count_arrival(unsigned long long* word, unsigned long long epoch, int n) {
  unsigned long long cur = *reinterpret_cast<volatile unsigned long long*>(word);
  unsigned long long mine;
  for (;;) {
    mine = (cur >> 16) == epoch ? cur + 1 : (epoch << 16) | 1ull;  // an older call's word: first arrival
    const unsigned long long seen = atomicCAS(word, cur, mine);
    if (seen == cur) break;
    cur = seen;
  }
  return static_cast<int>(mine & 0xffffull) == n;
}

// Every split of this call has counted (the last CTA, after its merge: no store in flight before
// the merge's reads): the next replay of a graph starts at 0.
__device__ __forceinline__ void reset_arrivals(const Params& p, int b, int h) {
  if (p.num_splits > 1 && threadIdx.x == 0) p.split_arrivals[static_cast<std::int64_t>(b) * p.hk + h] = 0ull;
}

// Called by every thread of a CTA once its partial (or empty partial) is written: true in every
// thread of the group's last CTA, which then reads the other splits' partials (through L2) and
// resets the group's word (reset_arrivals).
__device__ __forceinline__ bool arrive_last(const Params& p, int b, int h) {
  if (p.num_splits == 1) {  // the only split: nothing to wait for but this CTA's own stores
    __syncthreads();
    return true;
  }
  __threadfence();  // this thread's partial stores before the arrival
  __syncthreads();
  int last = 0;
  if (threadIdx.x == 0) {
    last = count_arrival(p.split_arrivals + static_cast<std::int64_t>(b) * p.hk + h, p.split_epoch, p.num_splits);
    if (last) __threadfence();  // the other splits' arrivals (and so their partials) before our reads
  }
  return __syncthreads_or(last) != 0;
}

// O = sum_s w_s O_s / sum_s w_s with w_s = exp(LSE_s - max LSE), LSE = max + log(sum w) for every
// row of group (b, h); one warp per row, the lanes over D. Fully masked rows: O = 0, LSE = -inf;
// a NaN partial makes the row's O and LSE NaN (the NaN rule). Writes the strided outputs in the
// output dtype.
template <int D, int kWarps>
__device__ __forceinline__ void merge_group(const Params& p, int b, int h) {
  constexpr int kPerLane = D / 32;  // 2 or 4
  static_assert(kPerLane == 2 || kPerLane == 4, "D = 64 or 128");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t base = (static_cast<std::int64_t>(b) * p.hk + h) * p.num_splits;
  for (int r = warp; r < p.rows; r += kWarps) {
    const int qi = r / p.group, hq = h * p.group + r % p.group;
    // The lanes read the LSEs of 32 splits at once; each split's weight then reaches every lane by
    // a shuffle, and the O loads of kUnroll splits are issued before any is used (a serial split
    // loop waited one L2 latency per split: ~6 us of a 45 us B = 1, 32k call, 9337138).
    // The first 32 LSEs stay in registers for the weights (one L2 round trip less: the merge is on
    // the critical path at B = 1), and up to 16 splits' O loads are in flight together.
    const float l0 = lane < p.num_splits ? __ldcg(p.lse_part + (base + lane) * p.rows + r) : -INFINITY;
    float mx = l0;
    for (int s = lane + 32; s < p.num_splits; s += 32) mx = running_max(mx, __ldcg(p.lse_part + (base + s) * p.rows + r));
    for (int o = 16; o > 0; o >>= 1) mx = running_max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float acc[kPerLane] = {};
    float wsum = 0.f;
    if (mx != -INFINITY) {
      constexpr int kUnroll = 16;
      for (int s0 = 0; s0 < p.num_splits; s0 += 32) {
        const int s = s0 + lane;
        const float l = s0 == 0 ? l0 : s < p.num_splits ? __ldcg(p.lse_part + (base + s) * p.rows + r) : -INFINITY;
        const float w_lane = l == -INFINITY ? 0.f : __expf(l - mx);  // empty partials: weight 0
        float ws = w_lane;
        for (int o = 16; o > 0; o >>= 1) ws += __shfl_xor_sync(0xffffffffu, ws, o);
        wsum += ws;
        const int cnt = min(32, p.num_splits - s0);
        for (int j0 = 0; j0 < cnt; j0 += kUnroll) {
          float v[kUnroll][kPerLane];
          float w[kUnroll];
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            // Past cnt: weight 0 and a load of split s0 (in range; finite unless the row is NaN).
            const bool in = j0 + u < cnt;
            const int j = in ? j0 + u : 0;
            w[u] = __shfl_sync(0xffffffffu, w_lane, j);
            if (!in) w[u] = 0.f;
            const float* src = p.o_part + ((base + s0 + j) * p.rows + r) * D + lane * kPerLane;
            if constexpr (kPerLane == 4) {
              const float4 t = __ldcg(reinterpret_cast<const float4*>(src));
              v[u][0] = t.x; v[u][1] = t.y; v[u][2] = t.z; v[u][3] = t.w;
            } else {
              const float2 t = __ldcg(reinterpret_cast<const float2*>(src));
              v[u][0] = t.x; v[u][1] = t.y;
            }
          }
#pragma unroll
          for (int u = 0; u < kUnroll; ++u)
#pragma unroll
            for (int e = 0; e < kPerLane; ++e) acc[e] += w[u] * v[u][e];
        }
      }
    }
    const float inv = wsum != 0.f ? 1.f / wsum : 0.f;  // fully masked row: O = 0, LSE = -inf
    const std::int64_t o_off = b * p.o_sb + qi * p.o_st + hq * p.o_sh + lane * kPerLane;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const float v = acc[e] * inv;
      switch (p.out_dtype) {  // the host admits these four (decode_api.cu, can_implement)
        case DType::f32: static_cast<float*>(p.out)[o_off + e] = v; break;
        case DType::f64: static_cast<double*>(p.out)[o_off + e] = v; break;
        case DType::bf16: static_cast<__nv_bfloat16*>(p.out)[o_off + e] = __float2bfloat16_rn(v); break;
        case DType::f16: static_cast<__half*>(p.out)[o_off + e] = __float2half_rn(v); break;
      }
    }
    if (p.lse != nullptr && lane == 0) {
      const float lse = wsum != 0.f ? mx + logf(wsum) : -INFINITY;
      const std::int64_t l_off = b * p.l_sb + hq * p.l_sh + qi * p.l_st;
      if (p.lse_dtype == DType::f64) static_cast<double*>(p.lse)[l_off] = lse;
      else static_cast<float*>(p.lse)[l_off] = lse;
    }
  }
}

}  // namespace blasst::sm90::decode
