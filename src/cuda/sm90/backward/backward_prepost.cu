// The backward's preprocess and postprocess kernels (backward_prepost.hpp). Plain CUDA: one warp
// per row reduces dO . O; the postprocess is elementwise.
#include "cuda/sm90/backward/backward_prepost.hpp"

#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/sm90/common/element.hpp"

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

template <class E>
__global__ void __launch_bounds__(kThreads) preprocess_kernel(const BackwardParams p) {
  const int lane = int(threadIdx.x) % 32;
  const std::int64_t row = std::int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (row >= std::int64_t(p.tokens_q) * p.hq) return;
  const int tok = int(row / p.hq), h = int(row % p.hq);
  const std::int64_t o_off = row_offset(p.out_s, p, tok, h), do_off = row_offset(p.dout_s, p, tok, h);
  float acc = 0.f;
  E* conv = p.dout_conv != nullptr ? static_cast<E*>(p.dout_conv) + row * p.head_dim : nullptr;
  for (int c = lane; c < p.head_dim; c += 32) {
    const float g = load_f<E>(p.dout, do_off + c, p.dout_f32);
    acc += load_f<E>(p.out, o_off + c, p.out_f32) * g;
    if (conv != nullptr) conv[c] = static_cast<E>(g);  // row = tok * hq + h: [tokens_q, hq, d]
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
  if (lane == 0) {
    // The token's sequence b and position i in it (ragged: tokens past cu_q[B] belong to none).
    int b = 0, i = 0, len = p.len_q;
    if (p.cu_q != nullptr) {
      if (tok >= p.cu_q[p.batch]) return;
      int lo = 0, hi = p.batch - 1;  // the last b with cu_q[b] <= tok
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (p.cu_q[mid] <= tok) lo = mid;
        else hi = mid - 1;
      }
      b = lo;
      i = tok - p.cu_q[b];
      len = p.cu_q[b + 1] - p.cu_q[b];
    } else {
      b = tok / p.len_q;
      i = tok % p.len_q;
    }
    const float lse = p.lse[lse_offset(p.lse_s, p, tok, h)];
    const float dlse = p.dlse != nullptr ? p.dlse[lse_offset(p.dlse_s, p, tok, h)] : 0.f;
    const std::int64_t at = std::int64_t(h) * p.rows_ld + lse_row_start(b, p.len_q, p.cu_q) + i;
    // dS = P (dP - D + dLSE) (SPEC §9 with an upstream dLSE; src/reference/backward.cpp).
    p.dsum[at] = acc - dlse;
    // A row that saw no key has LSE = -inf and O = 0: +inf makes its P exactly 0 (no gradient).
    p.lse_log2[at] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
    // The sequence's last row fills its padding up to the next multiple of 64 the same way.
    if (i == len - 1)
      for (int r = 1; (i + r) % kLseRowAlign != 0; ++r) {
        p.dsum[at + r] = 0.f;
        p.lse_log2[at + r] = INFINITY;
      }
  }
}

template <class E>
__global__ void __launch_bounds__(kThreads) postprocess_kernel(const BackwardParams p) {
  const std::int64_t e = std::int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const std::int64_t n = std::int64_t(p.tokens_q) * p.hq * p.head_dim;
  if (e >= n) return;
  const int c = int(e % p.head_dim);
  const std::int64_t th = e / p.head_dim;
  const int h = int(th % p.hq), tok = int(th / p.hq);
  const float x = p.dq_accum[e] * p.scale;  // dq_accum is [tokens_q, hq, d], contiguous
  const std::int64_t off = row_offset(p.dq_s, p, tok, h) + c;
  if (p.dq_f32) static_cast<float*>(p.dq)[off] = x;
  else static_cast<E*>(p.dq)[off] = static_cast<E>(x);
}

template <class E>
void launch_pre(const BackwardParams& p, cudaStream_t stream) {
  const std::int64_t rows = std::int64_t(p.tokens_q) * p.hq;
  if (rows == 0) return;
  const std::int64_t blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
  preprocess_kernel<E><<<dim3(unsigned(blocks)), kThreads, 0, stream>>>(p);
  BLASST_CUDA_CHECK(cudaGetLastError());
}

template <class E>
void launch_post(const BackwardParams& p, cudaStream_t stream) {
  const std::int64_t n = std::int64_t(p.tokens_q) * p.hq * p.head_dim;
  if (n == 0) return;
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  postprocess_kernel<E><<<dim3(unsigned(blocks)), kThreads, 0, stream>>>(p);
  BLASST_CUDA_CHECK(cudaGetLastError());
}

[[noreturn]] void bad_dtype(DType t) {
  throw Error(std::string("q: dtype ") + to_string(t) + " has no backward pre/postprocess (bf16 or f16)");
}

}  // namespace

void launch_preprocess(const BackwardParams& p, DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::bf16: return launch_pre<Element<DType::bf16>::cuda>(p, stream);
    case DType::f16: return launch_pre<Element<DType::f16>::cuda>(p, stream);
    default: bad_dtype(dtype);
  }
}

void launch_postprocess(const BackwardParams& p, DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::bf16: return launch_post<Element<DType::bf16>::cuda>(p, stream);
    case DType::f16: return launch_post<Element<DType::f16>::cuda>(p, stream);
    default: bad_dtype(dtype);
  }
}

}  // namespace blasst::sm90::backward
