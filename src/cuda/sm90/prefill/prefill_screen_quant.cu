// The SPEC §2b quantisation pre-kernel of the FP8 screen: one thread per query row or key (its d
// elements in registers from d / 8 16-byte loads), e4m3 codes as SPEC §2b and the CPU reference's
// quantise (src/reference/reference.cpp: the scale fp32(max|x| / 16), codes
// e4m3(clamp(fp32(x / scale), -16, 16)) by cvt.rn.satfinite (the clamp only acts where the scale
// is a rounded subnormal), zero scale -> zero codes, a non-finite element -> NaN codes, scale and
// norms), norms from sums of squares in double in channel order without contraction, rounded
// upwards to float (the margin needs upper bounds): codes, scales and norms are SPEC's bit for bit
// (tests/gpu_prefill/test_screen_quant.cpp). Keys: one CTA of 128 threads per (key tile, KV head,
// sequence), which also writes the tile's maxima KN, KT, EK (NaN propagating) and scale.
#include "cuda/sm90/prefill/prefill_screen_quant.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "blasst/fp8.hpp"
#include "cuda/cuda_check.hpp"

namespace blasst::sm90::prefill {

namespace {

constexpr int kTileKeys = 128;
constexpr int kQThreads = 128;  // quantise_q: one thread per query row, 128 per CTA

std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

// NaN-propagating maximum of non-negative values (NaN wins).
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || b != b) ? NAN : fmaxf(a, b); }

struct VecNorms {
  float scale, norm, qnorm, err;  // rounded upwards; NaN for a non-finite vector
};

// One vector's d 16-bit elements, loaded by its own thread as d / 8 16-byte loads (q and k reach
// the prefill kernels 16-byte aligned with 16-byte strides and contiguous rows: prefill_api.cu's
// TMA rule) and kept in registers: word i holds elements 2i (low half) and 2i + 1.
template <int kD>
struct VecBits {
  std::uint32_t w[kD / 2];
};

template <int kD>
__device__ __forceinline__ VecBits<kD> load_vec(const void* src) {
  VecBits<kD> v;
  const uint4* p = static_cast<const uint4*>(src);
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) {
    const uint4 u = __ldg(p + i);
    v.w[4 * i] = u.x;
    v.w[4 * i + 1] = u.y;
    v.w[4 * i + 2] = u.z;
    v.w[4 * i + 3] = u.w;
  }
  return v;
}

__device__ __forceinline__ float bits_to_float(__nv_bfloat16*, std::uint32_t b) { return __uint_as_float(b << 16); }
__device__ __forceinline__ float bits_to_float(__half*, std::uint32_t b) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}
template <class T>
__device__ __forceinline__ float elem(std::uint32_t word, int half) {
  return bits_to_float(static_cast<T*>(nullptr), half ? word >> 16 : word & 0xffffu);
}

// The vector's largest |x| as float, or -1 when an element is not finite (SPEC §2b: such a
// vector has NaN codes and norms and takes no part in its tile's scale). The maximum runs on the
// packed 16-bit pairs with their sign bits cleared (|x| is exact in the input type): NaN
// propagating (HMNMX2.NAN), so a NaN or an infinity anywhere leaves a non-finite maximum.
template <class T, int kD>
__device__ __forceinline__ float abs_max(VecBits<kD> const& v) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  auto as2 = [](std::uint32_t w) {
    T2 h;
    static_assert(sizeof(T2) == 4);
    memcpy(&h, &w, 4);
    return h;
  };
  T2 m = as2(v.w[0] & 0x7fff7fffu);
#pragma unroll
  for (int i = 1; i < kD / 2; ++i) m = __hmax2_nan(m, as2(v.w[i] & 0x7fff7fffu));
  std::uint32_t mw;
  memcpy(&mw, &m, 4);
  const float a = fmaxf(elem<T>(mw, 0), elem<T>(mw, 1));
  const bool finite = isfinite(elem<T>(mw, 0)) && isfinite(elem<T>(mw, 1));
  return finite ? a : -1.f;
}

// The vector quantised into d codes at dst (16-byte aligned) with the scale fp32(a / 16)
// (kScreenCodeMax; a: the vector's own abs_max for a query row, the tile's for a key; a < 0: NaN
// codes and norms). Element by element in the reference's order (c = 0 .. d - 1) and arithmetic
// (__fdiv_rn, the clamp, cvt.rn.satfinite; the sums of squares in double without contraction), so
// codes, scale and the double sums are the reference's bit for bit; norms rounded upwards to float.
template <class T, int kD>
__device__ __forceinline__ VecNorms quantise_vec(VecBits<kD> const& v, float a, std::uint8_t* dst) {
  VecNorms r;
  uint4 out[kD / 16];
  std::uint32_t* ow = reinterpret_cast<std::uint32_t*>(out);
  if (a < 0.f) {
#pragma unroll
    for (int i = 0; i < kD / 4; ++i) ow[i] = 0x7f7f7f7fu;  // NaN codes
    r.scale = r.norm = r.qnorm = r.err = NAN;
  } else {
    const float s = __fdiv_rn(a, kScreenCodeMax);
    double nn = 0, nq = 0, ne = 0;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) {
      const float x0 = elem<T>(v.w[i], 0), x1 = elem<T>(v.w[i], 1);
      std::uint16_t pair = 0;
      if (s > 0.f) {
        const float y0 = fminf(fmaxf(__fdiv_rn(x0, s), -kScreenCodeMax), kScreenCodeMax);
        const float y1 = fminf(fmaxf(__fdiv_rn(x1, s), -kScreenCodeMax), kScreenCodeMax);
        pair = static_cast<std::uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(y0, y1), __NV_SATFINITE, __NV_E4M3));
      }
      const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));  // exact
      const float xs[2] = {x0, x1}, vs[2] = {__low2float(h), __high2float(h)};
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const double xd = xs[j], xq = __dmul_rn(static_cast<double>(s), vs[j]), e = __dsub_rn(xd, xq);
        nn = __dadd_rn(nn, __dmul_rn(xd, xd));
        nq = __dadd_rn(nq, __dmul_rn(xq, xq));
        ne = __dadd_rn(ne, __dmul_rn(e, e));
      }
      if (i % 2 == 0) ow[i / 2] = pair;
      else ow[i / 2] |= std::uint32_t(pair) << 16;
    }
    r.scale = s;
    r.norm = __double2float_ru(sqrt(nn));
    r.qnorm = __double2float_ru(sqrt(nq));
    r.err = __double2float_ru(sqrt(ne));
  }
  uint4* d4 = reinterpret_cast<uint4*>(dst);
#pragma unroll
  for (int i = 0; i < kD / 16; ++i) d4[i] = out[i];
  return r;
}

// Query rows: vector v = (nb, rows_q, hq) flattened; one thread per row.
template <class T, int kD>
__global__ void __launch_bounds__(kQThreads) quantise_q_kernel(PrefillParams p, std::int64_t nvec, std::uint8_t* q8,
                                                              float4* q_rows) {
  const std::int64_t v = std::int64_t(blockIdx.x) * kQThreads + threadIdx.x;
  if (v >= nvec) return;
  const std::int64_t h = v % p.hq, tok = (v / p.hq) % p.rows_q, b = v / (std::int64_t(p.hq) * p.rows_q);
  const T* src = static_cast<const T*>(p.q) + b * p.q_batch + tok * p.q_row + h * p.q_head;
  const VecBits<kD> x = load_vec<kD>(src);
  const VecNorms r = quantise_vec<T, kD>(x, abs_max<T, kD>(x), q8 + v * kD);
  q_rows[v] = make_float4(r.scale, r.norm, r.qnorm, r.err);
}

// Block-wide maximum over the CTA's kTileKeys threads (4 warps) through red (4 floats), with
// op (fmaxf or nan_max); every thread gets it. Starts and ends with a barrier on red's use.
template <class Op>
__device__ __forceinline__ float block_max(float x, float* red, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  float m = red[0];
#pragma unroll
  for (int w = 1; w < kTileKeys / 32; ++w) m = op(m, red[w]);
  return m;
}

// Keys: one CTA per (tile, KV head, sequence), one thread per key: the tile's scale from the largest
// |k| of its finite keys (SPEC §2b), then each key's codes and norms; the tile's {KN, KT, EK, scale}.
template <class T, int kD>
__global__ void __launch_bounds__(kTileKeys) quantise_k_kernel(PrefillParams p, std::int64_t tiles, std::uint8_t* k8,
                                                              float4* k_tiles) {
  const int t = blockIdx.x, kh = blockIdx.y, b = blockIdx.z;
  const bool ragged = p.cu_k != nullptr;
  const std::int64_t start = ragged ? p.cu_k[b] : 0;
  const std::int64_t len = ragged ? p.cu_k[b + 1] - p.cu_k[b] : p.rows_k;
  const std::int64_t nb_row = ragged ? 0 : std::int64_t(b) * p.rows_k;  // row of token 0 in the copies
  const std::int64_t tok = std::int64_t(t) * kTileKeys + threadIdx.x;
  const bool live = tok < len;
  __shared__ float red[kTileKeys / 32];
  VecBits<kD> x{};
  float a_key = 0.f;
  if (live) {
    x = load_vec<kD>(static_cast<const T*>(p.k) + (ragged ? 0 : std::int64_t(b) * p.k_batch) + (start + tok) * p.k_row +
                     std::int64_t(kh) * p.k_head);
    a_key = abs_max<T, kD>(x);
  }
  const float a = block_max(a_key, red, [](float u, float w) { return fmaxf(u, w); });  // -1 (non-finite) never wins
  float kn = 0.f, kt = 0.f, ek = 0.f, scale = 0.f;
  if (live) {
    const std::int64_t row = nb_row + start + tok;  // row in the (nb * rows_k) flattening
    const VecNorms r = quantise_vec<T, kD>(x, a_key < 0.f ? a_key : a, k8 + (row * p.hk + kh) * kD);
    kn = r.norm;
    kt = r.qnorm;
    ek = r.err;
    if (a_key >= 0.f) scale = r.scale;
  }
  const auto nan_op = [](float u, float w) { return nan_max(u, w); };
  kn = block_max(kn, red, nan_op);
  kt = block_max(kt, red, nan_op);
  ek = block_max(ek, red, nan_op);
  scale = block_max(scale, red, [](float u, float w) { return fmaxf(u, w); });
  if (threadIdx.x == 0 && std::int64_t(t) * kTileKeys < len)
    k_tiles[(std::int64_t(b) * p.hk + kh) * tiles + t] = make_float4(kn, kt, ek, scale);
}

template <class T, int kD>
void run(const PrefillParams& p, const ScreenLayout& L, unsigned char* ws, cudaStream_t stream, ScreenArgs& a) {
  auto* q8 = reinterpret_cast<std::uint8_t*>(ws + L.q8);
  auto* k8 = reinterpret_cast<std::uint8_t*>(ws + L.k8);
  auto* q_rows = reinterpret_cast<float4*>(ws + L.q_rows);
  auto* k_tiles = reinterpret_cast<float4*>(ws + L.k_tiles);
  const std::int64_t nq = L.nb * L.rows_q * L.hq;
  if (nq > 0) {
    quantise_q_kernel<T, kD><<<static_cast<unsigned>((nq + kQThreads - 1) / kQThreads), kQThreads, 0, stream>>>(p, nq, q8,
                                                                                                        q_rows);
    BLASST_CUDA_CHECK(cudaGetLastError());
  }
  if (L.tiles > 0 && L.hk > 0 && L.batch > 0) {
    const dim3 grid(static_cast<unsigned>(L.tiles), static_cast<unsigned>(L.hk), static_cast<unsigned>(L.batch));
    quantise_k_kernel<T, kD><<<grid, kTileKeys, 0, stream>>>(p, L.tiles, k8, k_tiles);
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
