// Internal: the merge of the split-KV partials, inside the split kernel. Every CTA of a (sequence,
// KV head) group raises its flag after writing its partial and then reads the group's flags; a CTA
// that finds them all raised merges the group's splits into out / lse (one launch per call, no
// kernel boundary between the splits and the merge: issue 18, docs/decode_kernel.md "Host cost of a
// call").
//
// Flags, not a counter: when every split finishes at once (dense, B = 1) a counter's atomics
// serialise on one word (a CAS loop made B = 1, 32k dense 5-6 % slower than the separate merge
// kernel it replaced: H200 A/B of ff0832a and 8890f09 vs 33cb6a6), flags are one store and one
// parallel read per CTA. The store, a sequentially consistent fence (__threadfence), then the
// reads: the CTA whose fence comes last in that order sees every flag, so at least one CTA merges;
// two that both see them all write the same bits (the merge reads the splits in their order).
// The flags need no zeroed memory (the pool's blocks and a caller's workspace hold whatever was
// there): a raised flag holds the call's epoch, a fresh non-zero number per call from the host, so a
// flag left by an earlier call or garbage reads as lowered. The merging CTA lowers the group's
// flags after its merge (every CTA has raised its flag by then), so the replays of a CUDA graph
// (same epoch, same flags) start lowered.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/common/ptx.hpp"
#include "cuda/sm90/decode/decode_params.hpp"

namespace blasst::sm90::decode {

// The flags of group (b, h): one per split.
__device__ __forceinline__ unsigned long long* group_flags(const Params& p, int b, int h) {
  return p.split_flags + (static_cast<std::int64_t>(b) * p.hk + h) * p.num_splits;
}

// Lowers the group's flags (the merging CTA, after its merge; a second merger, if any, has read
// them already): the next replay of a graph starts with every flag lowered.
__device__ __forceinline__ void lower_flags(const Params& p, int b, int h) {
  if (p.num_splits == 1) return;
  unsigned long long* flags = group_flags(p, b, h);
  for (int s = threadIdx.x; s < p.num_splits; s += blockDim.x) flags[s] = 0ull;
}

// Called by every thread of a CTA once its partial (or empty partial) is written: true in every
// thread of a CTA that found every flag of its group raised, which then reads the other splits'
// partials (through L2) and lowers the flags (lower_flags).
__device__ __forceinline__ bool all_flags_raised(const Params& p, int b, int h, int split) {
  if (p.num_splits == 1) {  // the only split: nothing to wait for but this CTA's own stores
    __syncthreads();
    return true;
  }
  __threadfence();  // this thread's partial stores before the flag
  __syncthreads();
  int all = 0;
  if (threadIdx.x < 32) {  // warp 0: lane 0 raises the flag, every lane reads a share of the flags
    volatile unsigned long long* flags = group_flags(p, b, h);
    if (threadIdx.x == 0) flags[split] = p.split_epoch;
    __threadfence();  // lane 0: the flag before the reads (SC order); every lane: its reads after
    __syncwarp();
    __threadfence();
    bool raised = true;
    for (int s = threadIdx.x; s < p.num_splits; s += 32) raised &= flags[s] == p.split_epoch;
    all = __all_sync(0xffffffffu, raised) ? 1 : 0;
    if (all) __threadfence();  // the other splits' flags (and so their partials) before our reads
  }
  return __syncthreads_or(all) != 0;
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

// The end of every CTA, its partial (or empty partial) written: a CTA that finds every flag of
// its group raised merges the splits into out / lse, then lowers the flags.
template <int D, int kWarps>
__device__ __forceinline__ void finish_split(const Params& p, int b, int h, int split) {
  if (!all_flags_raised(p, b, h, split)) return;
  merge_group<D, kWarps>(p, b, h);
  lower_flags(p, b, h);
}

}  // namespace blasst::sm90::decode
