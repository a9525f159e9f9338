// The SPEC §2b quantisation pre-kernel of the FP8 screen: one warp per query row or key, e4m3
// codes exactly as the CPU reference's quantise (src/reference/reference.cpp: the scale
// fp32(max|x| / 16), codes e4m3(clamp(fp32(x / scale), -16, 16)) by cvt.rn.satfinite (the clamp
// only acts where the scale is a rounded subnormal), zero scale -> zero codes,
// a non-finite element -> NaN codes, scale and norms), norms summed in double and rounded
// upwards to float (the margin needs upper bounds). Keys: one CTA per (key tile, KV head,
// sequence), which also writes the tile's maxima KN, KT, EK (NaN propagating).
#include "cuda/sm90/prefill/prefill_screen_quant.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>

#include "blasst/fp8.hpp"
#include "cuda/cuda_check.hpp"

namespace blasst::sm90::prefill {

namespace {

constexpr int kWarps = 8;
constexpr int kTileKeys = 128;

std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// NaN-propagating maximum of non-negative values (NaN wins).
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || b != b) ? NAN : fmaxf(a, b); }

struct VecNorms {
  float scale, norm, qnorm, err;  // rounded upwards; NaN for a non-finite vector
};

// One warp's d elements at src (contiguous; lane l holds [l * kPer, l * kPer + kPer)): their
// largest |x| as float, or -1 when one is not finite (SPEC §2b: such a vector has NaN codes and
// norms and takes no part in its tile's scale).
template <class T, int kD>
__device__ __forceinline__ float abs_max_warp(const T* src, int lane, float (&x)[kD / 32]) {
  constexpr int kPer = kD / 32;
  bool finite = true;
  float a = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    x[i] = to_float(src[lane * kPer + i]);
    finite = finite && isfinite(x[i]);
    a = fmaxf(a, fabsf(x[i]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  return __all_sync(0xffffffffu, finite) ? a : -1.f;
}

// The warp's d elements x (as abs_max_warp loaded them) quantised into d codes at dst with the
// scale fp32(a / 16) (kScreenCodeMax; a: the vector's own abs_max_warp for a query row, the tile's
// for a key; a < 0: NaN codes and norms).
template <int kD>
__device__ __forceinline__ VecNorms quantise_warp(const float (&x)[kD / 32], float a, std::uint8_t* dst, int lane) {
  constexpr int kPer = kD / 32;
  VecNorms r;
  std::uint8_t code[kPer];
  if (a < 0.f) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) code[i] = 0x7f;  // NaN
    r.scale = r.norm = r.qnorm = r.err = NAN;
  } else {
    const float s = __fdiv_rn(a, kScreenCodeMax);
    double nn = 0, nq = 0, ne = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      code[i] = 0;
      if (s > 0.f) {
        const float y = fminf(fmaxf(__fdiv_rn(x[i], s), -kScreenCodeMax), kScreenCodeMax);
        code[i] = static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
      }
      const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(code[i], __NV_E4M3)));  // exact
      const double xd = x[i], xq = static_cast<double>(s) * v, e = xd - xq;
      nn += xd * xd;
      nq += xq * xq;
      ne += e * e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      nn += __shfl_xor_sync(0xffffffffu, nn, o);
      nq += __shfl_xor_sync(0xffffffffu, nq, o);
      ne += __shfl_xor_sync(0xffffffffu, ne, o);
    }
    r.scale = s;
    r.norm = __double2float_ru(sqrt(nn));
    r.qnorm = __double2float_ru(sqrt(nq));
    r.err = __double2float_ru(sqrt(ne));
  }
  if constexpr (kPer == 4) {
    const std::uint32_t w = code[0] | (code[1] << 8) | (code[2] << 16) | (std::uint32_t(code[3]) << 24);
    reinterpret_cast<std::uint32_t*>(dst)[lane] = w;
  } else {
    const std::uint16_t w = static_cast<std::uint16_t>(code[0] | (code[1] << 8));
    reinterpret_cast<std::uint16_t*>(dst)[lane] = w;
  }
  return r;
}

// Query rows: vector v = (nb, rows_q, hq) flattened; warp-per-row.
template <class T, int kD>
__global__ void __launch_bounds__(32 * kWarps) quantise_q_kernel(PrefillParams p, std::int64_t nvec, std::uint8_t* q8,
                                                                float4* q_rows) {
  const std::int64_t v = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (v >= nvec) return;
  const int lane = threadIdx.x % 32;
  const std::int64_t h = v % p.hq, tok = (v / p.hq) % p.rows_q, b = v / (std::int64_t(p.hq) * p.rows_q);
  const T* src = static_cast<const T*>(p.q) + b * p.q_batch + tok * p.q_row + h * p.q_head;
  float x[kD / 32];
  const float a = abs_max_warp<T, kD>(src, lane, x);
  const VecNorms r = quantise_warp<kD>(x, a, q8 + v * kD, lane);
  if (lane == 0) q_rows[v] = make_float4(r.scale, r.norm, r.qnorm, r.err);
}

// Keys: one CTA per (tile, KV head, sequence): the tile's scale from the largest |k| of its finite
// keys (SPEC §2b), then each key's codes and norms; the tile's {KN, KT, EK, scale}.
template <class T, int kD>
__global__ void __launch_bounds__(32 * kWarps) quantise_k_kernel(PrefillParams p, std::int64_t tiles,
                                                                std::uint8_t* k8, float4* k_tiles) {
  constexpr int kKeysPerWarp = kTileKeys / kWarps;
  const int t = blockIdx.x, kh = blockIdx.y, b = blockIdx.z;
  const bool ragged = p.cu_k != nullptr;
  const std::int64_t start = ragged ? p.cu_k[b] : 0;
  const std::int64_t len = ragged ? p.cu_k[b + 1] - p.cu_k[b] : p.rows_k;
  const std::int64_t nb_row = ragged ? 0 : std::int64_t(b) * p.rows_k;  // row of token 0 in the copies
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ float red[kWarps][4];
  float x[kKeysPerWarp][kD / 32];
  float a_key[kKeysPerWarp];
  float a = 0.f;
#pragma unroll
  for (int i = 0; i < kKeysPerWarp; ++i) {
    const std::int64_t tok = std::int64_t(t) * kTileKeys + warp + i * kWarps;
    a_key[i] = 0.f;
    if (tok < len) {
      const T* src = static_cast<const T*>(p.k) + (ragged ? 0 : std::int64_t(b) * p.k_batch) + (start + tok) * p.k_row +
                     std::int64_t(kh) * p.k_head;
      a_key[i] = abs_max_warp<T, kD>(src, lane, x[i]);
      a = fmaxf(a, a_key[i]);
    }
  }
  if (lane == 0) red[warp][3] = a;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) a = fmaxf(a, red[w][3]);
  float kn = 0.f, kt = 0.f, ek = 0.f, scale = 0.f;
#pragma unroll
  for (int i = 0; i < kKeysPerWarp; ++i) {
    const std::int64_t tok = std::int64_t(t) * kTileKeys + warp + i * kWarps;
    if (tok < len) {
      const std::int64_t row = nb_row + start + tok;  // row in the (nb * rows_k) flattening
      const VecNorms r = quantise_warp<kD>(x[i], a_key[i] < 0.f ? a_key[i] : a, k8 + (row * p.hk + kh) * kD, lane);
      kn = nan_max(kn, r.norm);
      kt = nan_max(kt, r.qnorm);
      ek = nan_max(ek, r.err);
      if (a_key[i] >= 0.f) scale = r.scale;
    }
  }
  __syncthreads();
  if (lane == 0) {
    red[warp][0] = kn;
    red[warp][1] = kt;
    red[warp][2] = ek;
    red[warp][3] = scale;
  }
  __syncthreads();
  if (threadIdx.x == 0 && std::int64_t(t) * kTileKeys < len) {
    for (int w = 1; w < kWarps; ++w) {
      kn = nan_max(kn, red[w][0]);
      kt = nan_max(kt, red[w][1]);
      ek = nan_max(ek, red[w][2]);
      scale = fmaxf(scale, red[w][3]);
    }
    k_tiles[(std::int64_t(b) * p.hk + kh) * tiles + t] = make_float4(kn, kt, ek, scale);
  }
}

template <class T, int kD>
void run(const PrefillParams& p, const ScreenLayout& L, unsigned char* ws, cudaStream_t stream, ScreenArgs& a) {
  auto* q8 = reinterpret_cast<std::uint8_t*>(ws + L.q8);
  auto* k8 = reinterpret_cast<std::uint8_t*>(ws + L.k8);
  auto* q_rows = reinterpret_cast<float4*>(ws + L.q_rows);
  auto* k_tiles = reinterpret_cast<float4*>(ws + L.k_tiles);
  const std::int64_t nq = L.nb * L.rows_q * L.hq;
  if (nq > 0) {
    quantise_q_kernel<T, kD><<<static_cast<unsigned>((nq + kWarps - 1) / kWarps), 32 * kWarps, 0, stream>>>(p, nq, q8, q_rows);
    BLASST_CUDA_CHECK(cudaGetLastError());
  }
  if (L.tiles > 0 && L.hk > 0 && L.batch > 0) {
    const dim3 grid(static_cast<unsigned>(L.tiles), static_cast<unsigned>(L.hk), static_cast<unsigned>(L.batch));
    quantise_k_kernel<T, kD><<<grid, 32 * kWarps, 0, stream>>>(p, L.tiles, k8, k_tiles);
    BLASST_CUDA_CHECK(cudaGetLastError());
  }
  a.q8 = q8;
  a.k8 = k8;
  a.q_rows = reinterpret_cast<const float*>(q_rows);
  a.k_tiles = reinterpret_cast<const float*>(k_tiles);
  a.tiles = static_cast<int>(L.tiles);
}

}  // namespace

ScreenLayout screen_layout(const PrefillParams& p, int d, std::int64_t tiles, bool ahead) {
  ScreenLayout L;
  L.nb = p.cu_q != nullptr ? 1 : p.batch;
  L.rows_q = p.rows_q;
  L.rows_k = p.rows_k;
  L.hq = p.hq;
  L.hk = p.hk;
  L.d = d;
  L.batch = p.batch;
  L.tiles = tiles;
  std::size_t off = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t at = off;
    off += align256(bytes);
    return at;
  };
  const auto u = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  L.q8 = take(u(L.nb * L.rows_q * L.hq * d));
  L.k8 = take(u(L.nb * L.rows_k * L.hk * d));
  L.q_rows = take(u(L.nb * L.rows_q * L.hq) * sizeof(float4));
  L.k_tiles = take(u(L.batch * L.hk * L.tiles) * sizeof(float4));
  if (ahead) {
    L.ctas = static_cast<std::int64_t>(p.hq) * p.batch * p.num_m_blocks;  // HeavyFirstScheduler::grid
    L.plan_list = take(u(L.ctas * L.tiles) * sizeof(std::uint32_t));
    L.plan_count = take(u(L.ctas) * sizeof(int));
  }
  L.bytes = off;
  return L;
}

void screen_quantise(const PrefillParams& p, DType dtype, const ScreenLayout& L, void* ws, cudaStream_t stream,
                     ScreenArgs& args) {
  auto* base = static_cast<unsigned char*>(ws);
  if (dtype == DType::bf16 && L.d == 128) return run<__nv_bfloat16, 128>(p, L, base, stream, args);
  if (dtype == DType::bf16 && L.d == 64) return run<__nv_bfloat16, 64>(p, L, base, stream, args);
  if (dtype == DType::f16 && L.d == 128) return run<__half, 128>(p, L, base, stream, args);
  if (dtype == DType::f16 && L.d == 64) return run<__half, 64>(p, L, base, stream, args);
  throw Error(std::string("the FP8 screen's quantisation has no instance for ") + to_string(dtype) +
              ", d = " + std::to_string(L.d));
}

}  // namespace blasst::sm90::prefill
