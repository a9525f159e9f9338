// Merge of the split-KV partials: O = sum_s w_s O_s / sum_s w_s with w_s = exp(LSE_s - max LSE),
// LSE = max + log(sum w). One warp per output row (b, token, query head). Always runs (also with
// one split): it converts the fp32 partial to the output dtype and writes the strided outputs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_check.hpp"
#include "cuda/sm90/common/ptx.hpp"
#include "cuda/sm90/decode/decode_params.hpp"

namespace blasst::sm90::decode {

namespace {

__global__ void __launch_bounds__(128) merge_kernel(const __grid_constant__ MergeParams p) {
  // Launched with programmatic stream serialisation: wait until the split kernel's writes are
  // visible before reading them.
  grid_dependency_wait();
  const int lane = threadIdx.x & 31;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  const std::int64_t total = static_cast<std::int64_t>(p.batch) * p.hk * p.rows;
  if (row >= total) return;
  const int r = static_cast<int>(row % p.rows);
  const int h = static_cast<int>((row / p.rows) % p.hk);
  const int b = static_cast<int>(row / (static_cast<std::int64_t>(p.rows) * p.hk));
  const int qi = r / p.group, hq = h * p.group + r % p.group;

  // Partial rows of this output row: [b, h, s, r]. The lanes read the LSEs of 32 splits at once;
  // each split's weight then reaches every lane by a shuffle, and the O loads of kUnroll splits
  // are issued before any is used (a serial split loop waited one L2 latency per split: ~6 us of
  // a 45 us B = 1, 32k call, H200 ncu vs eager timing, 9337138).
  const std::int64_t base = (static_cast<std::int64_t>(b) * p.hk + h) * p.num_splits;
  float mx = -INFINITY;
  // NaN propagating (running_max): a NaN partial (NaN rule) makes every weight, O and LSE NaN.
  for (int s = lane; s < p.num_splits; s += 32) mx = running_max(mx, p.lse_part[(base + s) * p.rows + r]);
  for (int o = 16; o > 0; o >>= 1) mx = running_max(mx, __shfl_xor_sync(0xffffffffu, mx, o));

  const int per_lane = p.dv / 32;  // 2 or 4
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  float wsum = 0.f;
  if (mx != -INFINITY) {
    constexpr int kUnroll = 8;
    for (int s0 = 0; s0 < p.num_splits; s0 += 32) {
      const int s = s0 + lane;
      const float l = s < p.num_splits ? p.lse_part[(base + s) * p.rows + r] : -INFINITY;
      const float w_lane = l == -INFINITY ? 0.f : __expf(l - mx);  // empty partials: weight 0
      float ws = w_lane;
      for (int o = 16; o > 0; o >>= 1) ws += __shfl_xor_sync(0xffffffffu, ws, o);
      wsum += ws;
      const int cnt = min(32, p.num_splits - s0);
      for (int j0 = 0; j0 < cnt; j0 += kUnroll) {
        float4 v[kUnroll];
        float w[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          // Past cnt: weight 0 and a load of split s0 (in range; finite unless the row is NaN).
          const bool in = j0 + u < cnt;
          const int j = in ? j0 + u : 0;
          w[u] = __shfl_sync(0xffffffffu, w_lane, j);
          if (!in) w[u] = 0.f;
          const float* src = p.o_part + ((base + s0 + j) * p.rows + r) * p.dv + lane * per_lane;
          if (per_lane == 4) {
            v[u] = *reinterpret_cast<const float4*>(src);
          } else {
            const float2 t = *reinterpret_cast<const float2*>(src);
            v[u] = make_float4(t.x, t.y, 0.f, 0.f);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          acc[0] += w[u] * v[u].x; acc[1] += w[u] * v[u].y; acc[2] += w[u] * v[u].z; acc[3] += w[u] * v[u].w;
        }
      }
    }
  }
  const float inv = wsum != 0.f ? 1.f / wsum : 0.f;  // fully masked row: O = 0, LSE = -inf
  const std::int64_t o_off = b * p.o_sb + qi * p.o_st + hq * p.o_sh + lane * per_lane;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (e >= per_lane) break;
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

}  // namespace

void launch_merge(const MergeParams& p, cudaStream_t stream) {
  const std::int64_t rows = static_cast<std::int64_t>(p.batch) * p.hk * p.rows;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>((rows + 3) / 4));
  cfg.blockDim = dim3(128);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  BLASST_CUDA_CHECK(cudaLaunchKernelEx(&cfg, merge_kernel, p));
}

}  // namespace blasst::sm90::decode
