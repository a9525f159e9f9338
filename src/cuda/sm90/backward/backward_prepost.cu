// The backward's preprocess and postprocess kernels (backward_prepost.hpp). Plain CUDA: kD / 8
// threads per row reduce dO . O (and the grid zeroes the dQ accumulator); the postprocess is
// elementwise, 8 elements per thread. Both are instantiated per (dtype, head dim).
#include "cuda/sm90/backward/backward_prepost.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/cuda_check.hpp"
#include "cuda/sm90/common/element.hpp"
#include "cuda/sm90/common/ptx.hpp"

namespace blasst::sm90::backward {

namespace {

constexpr int kThreads = 256;

template <class E>
__device__ __forceinline__ float load_f(const void* base, std::int64_t off, bool f32) {
  return f32 ? static_cast<const float*>(base)[off] : static_cast<float>(static_cast<const E*>(base)[off]);
}

// Sequence b and position i of token `tok` (batched: tok = b * Lq + i).
__device__ __forceinline__ std::int64_t row_offset(const RowStrides& s, const BackwardParams& p, int tok, int h) {
  if (p.cu_q != nullptr) return std::int64_t(tok) * s.row + std::int64_t(h) * s.head;
  const int b = tok / p.len_q, i = tok % p.len_q;
  return std::int64_t(b) * s.batch + std::int64_t(i) * s.row + std::int64_t(h) * s.head;
}
__device__ __forceinline__ std::int64_t lse_offset(const LseStrides& s, const BackwardParams& p, int tok, int h) {
  if (p.cu_q != nullptr) return std::int64_t(h) * s.head + std::int64_t(tok) * s.row;
  const int b = tok / p.len_q, i = tok % p.len_q;
  return std::int64_t(b) * s.batch + std::int64_t(h) * s.head + std::int64_t(i) * s.row;
}

// The token's sequence b and position i in it; false for a ragged token past cu_q[B] (in none).
__device__ __forceinline__ bool token_position(const BackwardParams& p, int tok, int& b, int& i) {
  b = 0;
  i = tok;
  if (p.cu_q != nullptr) {
    if (tok >= p.cu_q[p.batch]) return false;
    int lo = 0, hi = p.batch - 1;  // the last b with cu_q[b] <= tok
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (p.cu_q[mid] <= tok) lo = mid;
      else hi = mid - 1;
    }
    b = lo;
    i = tok - p.cu_q[b];
  } else {
    b = tok / p.len_q;
    i = tok % p.len_q;
  }
  return true;
}

// kPreVec consecutive elements of a row of O or dO as floats: one 16-byte load where `vec` (a
// 16-bit tensor whose pointer and strides allow it: decided on the host), else element by element.
constexpr int kPreVec = 8;
template <class E>
__device__ __forceinline__ void load_row_chunk(const void* base, std::int64_t off, bool f32, bool vec,
                                               float (&x)[kPreVec]) {
  if (vec) {
    const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const E*>(base) + off);
    const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = unpack2<E>(w[j]);
      x[2 * j] = f.x;
      x[2 * j + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPreVec; ++j) x[j] = load_f<E>(base, off + j, f32);
  }
}

// D = rowsum(dO * O) per (query token, query head) row: kD / 8 threads a row, 8 elements each
// (16-byte loads where `vec`), a shuffle reduction inside the row's lanes; rows in the order
// tok * hq + h, so a warp reads consecutive heads of a token (contiguous in [B, L, H, d]). The f32
// dQ accumulator is zeroed here as well, in place of a separate memset pass: the whole buffer
// (padding rows included) as one contiguous range, 16-byte stores, each CTA its grid-stride share
// (zeroing it row by row in its tile order scattered 8-byte stores: the kernel ran at ~1 TB/s).
template <class E, int kD>
__global__ void __launch_bounds__(kThreads) preprocess_kernel(const BackwardParams p, bool vec) {
  constexpr int kLanes = kD / kPreVec;  // threads per row: 8 (d 64) or 16 (d 128)
  static_assert(32 % kLanes == 0, "a row's lanes inside one warp");
  {
    const std::int64_t n4 = std::int64_t(p.hq) * p.rows_ld * kD / 4;
    float4* acc4 = reinterpret_cast<float4*>(p.dq_accum);
    for (std::int64_t k = std::int64_t(blockIdx.x) * kThreads + threadIdx.x; k < n4;
         k += std::int64_t(gridDim.x) * kThreads)
      acc4[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const int sub = int(threadIdx.x) % kLanes, c0 = sub * kPreVec;
  const std::int64_t row = std::int64_t(blockIdx.x) * (kThreads / kLanes) + threadIdx.x / kLanes;
  // No early return: the reduction's shuffles take the whole warp (a row's lanes share `live`).
  const bool live = row < std::int64_t(p.tokens_q) * p.hq;
  const int tok = live ? int(row / p.hq) : 0, h = live ? int(row % p.hq) : 0;
  int b = 0, i = 0;
  const bool in_sequence = live && token_position(p, tok, b, i);
  float g[kPreVec], o[kPreVec];
  float acc = 0.f;
  if (live) {
    load_row_chunk<E>(p.dout, row_offset(p.dout_s, p, tok, h) + c0, p.dout_f32, vec, g);
    load_row_chunk<E>(p.out, row_offset(p.out_s, p, tok, h) + c0, p.out_f32, vec, o);
#pragma unroll
    for (int j = 0; j < kPreVec; ++j) acc += o[j] * g[j];
    if (p.dout_conv != nullptr)  // row = tok * hq + h: [tokens_q, hq, d], 16-byte aligned chunks
      *reinterpret_cast<uint4*>(static_cast<E*>(p.dout_conv) + row * kD + c0) =
          make_uint4(pack2<E>(g[0], g[1]), pack2<E>(g[2], g[3]), pack2<E>(g[4], g[5]), pack2<E>(g[6], g[7]));
  }
  if (live && !in_sequence) {  // a ragged token past cu_q[B]: dq 0 (the postprocess writes sequence rows only)
    const std::int64_t off = row_offset(p.dq_s, p, tok, h) + c0;
#pragma unroll
    for (int j = 0; j < kPreVec; ++j) {
      if (p.dq_f32) static_cast<float*>(p.dq)[off + j] = 0.f;
      else static_cast<E*>(p.dq)[off + j] = static_cast<E>(0.f);
    }
  }
#pragma unroll
  for (int s = kLanes / 2; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
  if (sub == 0 && in_sequence) {
    const int len = p.cu_q != nullptr ? p.cu_q[b + 1] - p.cu_q[b] : p.len_q;
    const float lse = p.lse[lse_offset(p.lse_s, p, tok, h)];
    const float dlse = p.dlse != nullptr ? p.dlse[lse_offset(p.dlse_s, p, tok, h)] : 0.f;
    const std::int64_t at = std::int64_t(h) * p.rows_ld + lse_row_start(b, p.len_q, p.cu_q) + i;
    // dS = P (dP - D + dLSE) (SPEC §9 with an upstream dLSE; src/reference/backward.cpp).
    p.dsum[at] = acc - dlse;
    // A row that saw no key has LSE = -inf and O = 0: +inf makes its P exactly 0 (no gradient).
    p.lse_log2[at] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
    // The sequence's last row fills its padding up to the next multiple of kLseRowAlign the same way.
    if (i == len - 1)
      for (int r = 1; (i + r) % kLseRowAlign != 0; ++r) {
        p.dsum[at + r] = 0.f;
        p.lse_log2[at + r] = INFINITY;
      }
  }
}

// dq = scale * dq_accum, one warpgroup per (query head, 64-row block): the block's kD / 64
// accumulator tiles are one contiguous run of 16 KB each (dq_tile_offset), read a float4 per
// thread and instruction (dq_tile_read: a warp's load is 512 contiguous bytes), scaled, converted
// to dq's element and put in shared memory as the block's 64 rows of dq; then read back 16 bytes
// a thread along the rows, so a warp's stores cover whole rows (kD x 2 or 4 contiguous bytes:
// 16-byte stores where dq's pointer and strides allow, `vec_store`, decided on the host; else
// element by element). The former mapping, a thread per 8-element row chunk, read 8-byte halves
// of 16-byte groups; a tile's share of 64 contiguous bytes a thread with 16-byte stores to 32
// rows a warp was slower still (00aa903). Padding rows and blocks are not written; dq of ragged
// tokens past cu_q[B] is zeroed by the preprocess.
constexpr int kPostThreads = 128;  // dq_in_tile's warpgroup
static_assert(kLseRowAlign % kDqTile == 0, "a 64-row block lies in one sequence's rows");

// Row pitch of the staging tile in 32-bit words: the row plus 16 bytes (16-bit dq) or 32 bytes
// (f32), so that the transpose's stores (rows r of 8 lanes, column pairs of 4) and the row reads
// (8 lanes, 128 contiguous bytes) are free of bank conflicts.
template <class O, int kD>
constexpr int post_pitch_words() {
  return sizeof(O) == 2 ? kD / 2 + 4 : kD + 8;
}

template <class O, int kD>
__device__ __forceinline__ void postprocess_block(const BackwardParams& p, bool vec_store, std::uint32_t* stage,
                                                  int h, std::int64_t padded, int b, int i0, int len) {
  constexpr int kColTiles = kD / kDqTile, kPitch = post_pitch_words<O, kD>();
  const int t = int(threadIdx.x);
  const float4* src = reinterpret_cast<const float4*>(p.dq_accum + dq_tile_offset(h, padded, 0, p.rows_ld, kD));
  float4 v[kColTiles * 8];
#pragma unroll
  for (int k = 0; k < kColTiles * 8; ++k) v[k] = src[k * kPostThreads + t];
#pragma unroll
  for (int k = 0; k < kColTiles * 8; ++k) {
    int r, c;
    dq_tile_read(t, k % 8, r, c);
    c += (k / 8) * kDqTile;
    if constexpr (sizeof(O) == 2) {
      stage[r * kPitch + c / 2] = pack2<O>(v[k].x * p.scale, v[k].y * p.scale);
      stage[(r + 8) * kPitch + c / 2] = pack2<O>(v[k].z * p.scale, v[k].w * p.scale);
    } else {
      *reinterpret_cast<float2*>(&stage[r * kPitch + c]) = make_float2(v[k].x * p.scale, v[k].y * p.scale);
      *reinterpret_cast<float2*>(&stage[(r + 8) * kPitch + c]) = make_float2(v[k].z * p.scale, v[k].w * p.scale);
    }
  }
  __syncthreads();
  constexpr int kElems = 16 / int(sizeof(O));       // elements per 16-byte chunk
  constexpr int kChunks = kD / kElems;              // chunks per row
  constexpr int kIters = kDqTile * kChunks / kPostThreads;
  const int rows = len - i0 < kDqTile ? len - i0 : kDqTile;
  const int tok0 = (p.cu_q != nullptr ? p.cu_q[b] : b * p.len_q) + i0;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int x = it * kPostThreads + t, row = x / kChunks, chunk = x % kChunks;
    if (row >= rows) break;  // rows grow with it
    const uint4 u = *reinterpret_cast<const uint4*>(&stage[row * kPitch + chunk * 4]);
    const std::int64_t off = row_offset(p.dq_s, p, tok0 + row, h) + chunk * kElems;
    O* dst = static_cast<O*>(p.dq) + off;
    if (vec_store) {
      *reinterpret_cast<uint4*>(dst) = u;
    } else {
      const O* e = reinterpret_cast<const O*>(&u);
#pragma unroll
      for (int j = 0; j < kElems; ++j) dst[j] = e[j];
    }
  }
}

template <class E, int kD>
__global__ void __launch_bounds__(kPostThreads) postprocess_kernel(const BackwardParams p, bool vec_store) {
  const int row_blocks = p.rows_ld / kDqTile;
  const int h = int(blockIdx.x / unsigned(row_blocks));
  const std::int64_t padded = std::int64_t(blockIdx.x - unsigned(h) * unsigned(row_blocks)) * kDqTile;
  int b, i0, len;
  if (!padded_position(padded, p.batch, p.len_q, p.cu_q, b, i0, len)) return;  // a padding block
  extern __shared__ __align__(16) std::uint32_t stage[];  // 64 x post_pitch_words (launch_post)
  if (p.dq_f32) postprocess_block<float, kD>(p, vec_store, stage, h, padded, b, i0, len);
  else postprocess_block<E, kD>(p, vec_store, stage, h, padded, b, i0, len);
}

template <class E, int kD>
void launch_pre(const BackwardParams& p, cudaStream_t stream) {
  const std::int64_t rows = std::int64_t(p.tokens_q) * p.hq;
  if (rows == 0) return;
  constexpr int kRowsPerCta = kThreads / (kD / kPreVec);
  const std::int64_t blocks = (rows + kRowsPerCta - 1) / kRowsPerCta;
  // 16-byte loads of 8 16-bit elements where O's and dO's pointers and strides allow them.
  const bool vec = !p.out_f32 && !p.dout_f32 && rows_vectorizable(p.out, p.out_s, 2, kPreVec) &&
                   rows_vectorizable(p.dout, p.dout_s, 2, kPreVec);
  preprocess_kernel<E, kD><<<dim3(unsigned(blocks)), kThreads, 0, stream>>>(p, vec);
  BLASST_CUDA_CHECK(cudaGetLastError());
}

template <class E, int kD>
void launch_post(const BackwardParams& p, cudaStream_t stream) {
  if (std::int64_t(p.tokens_q) * p.hq == 0) return;
  const std::int64_t blocks = std::int64_t(p.hq) * (p.rows_ld / kDqTile);
  // 16-byte stores: 4 f32 or 8 16-bit elements at a time.
  const int elem_bytes = p.dq_f32 ? 4 : 2;
  const bool vec_store = rows_vectorizable(p.dq, p.dq_s, elem_bytes, 16 / elem_bytes);
  const std::size_t stage_bytes =
      std::size_t(kDqTile) * 4 * (p.dq_f32 ? post_pitch_words<float, kD>() : post_pitch_words<E, kD>());
  postprocess_kernel<E, kD><<<dim3(unsigned(blocks)), kPostThreads, stage_bytes, stream>>>(p, vec_store);
  BLASST_CUDA_CHECK(cudaGetLastError());
}

[[noreturn]] void bad_dtype(DType t) {
  throw Error(std::string("q: dtype ") + to_string(t) + " has no backward pre/postprocess (bf16 or f16)");
}

[[noreturn]] void bad_head_dim(int d) {
  throw Error("backward pre/postprocess: head dim " + std::to_string(d) + " (64 or 128)");
}

// launch(element, head dim) for the (dtype, head dim) of a pre / postprocess launch.
template <class Launch>
void dispatch(const BackwardParams& p, DType dtype, Launch&& launch) {
  auto by_dim = [&](auto element) {
    switch (p.head_dim) {
      case 64: return launch(element, std::integral_constant<int, 64>{});
      case 128: return launch(element, std::integral_constant<int, 128>{});
      default: bad_head_dim(p.head_dim);
    }
  };
  switch (dtype) {
    case DType::bf16: return by_dim(typename Element<DType::bf16>::cuda{});
    case DType::f16: return by_dim(typename Element<DType::f16>::cuda{});
    default: bad_dtype(dtype);
  }
}

}  // namespace

void launch_preprocess(const BackwardParams& p, DType dtype, cudaStream_t stream) {
  dispatch(p, dtype, [&](auto e, auto d) { launch_pre<decltype(e), decltype(d)::value>(p, stream); });
}

void launch_postprocess(const BackwardParams& p, DType dtype, cudaStream_t stream) {
  dispatch(p, dtype, [&](auto e, auto d) { launch_post<decltype(e), decltype(d)::value>(p, stream); });
}

}  // namespace blasst::sm90::backward
