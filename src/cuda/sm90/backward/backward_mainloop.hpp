// Internal: one step of the backward CTA: a (query head, query block) against the CTA's key
// block, FlashAttention-2 style (SPEC §9):
//   S = Q K^T,  P = exp(S * scale - LSE) on the visible keys (0 elsewhere),  dP = dO V^T,
//   dS = P * (dP - D)  with D = rowsum(dO * O) - dLSE (preprocess),
//   dV += P^T dO,  dK += dS^T Q  (registers; scale applied in the epilogue),
//   dQ += dS K  (f32 workspace atomics; scale applied in the postprocess).
// Every operand goes through shared memory: Q, dO (cp.async), P and dS (written from the
// registers of S / dP); the five GEMMs read it with ldmatrix (.trans for the transposed views).
#pragma once

#include "cuda/sm90/backward/backward_epilogue.hpp"
#include "cuda/sm90/backward/backward_tile_scheduler.hpp"
#include "cuda/sm90/backward/backward_traits.hpp"

namespace blasst::sm90::backward {

// cp.async of rows [0, valid_rows) of a [kRows, d] tile whose row r starts at gmem + r * row_stride
// (elements) into a padded shared tile; rows past valid_rows are zero-filled (never read from
// memory: their source is the tensor's base, `safe`), so masked scores stay finite.
template <class Traits, int kRows>
__device__ __forceinline__ void load_tile_async(typename Traits::Element* smem, typename Traits::Element const* gmem,
                                                std::int64_t row_stride, int valid_rows,
                                                typename Traits::Element const* safe, int tid) {
  constexpr int kChunks = kRows * Traits::kChunksPerRow;
#pragma unroll
  for (int c = tid; c < kChunks; c += Traits::kNumThreads) {
    const int r = c / Traits::kChunksPerRow, col = (c % Traits::kChunksPerRow) * 8;
    const bool ok = r < valid_rows;
    auto const* src = ok ? gmem + std::int64_t(r) * row_stride + col : safe;
    SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>::copy(*reinterpret_cast<cute::uint128_t const*>(src),
                                                           *reinterpret_cast<cute::uint128_t*>(smem + r * Traits::kLdD + col),
                                                           ok);
  }
}

// Element offset of query row `row` of query head h in a q-shaped tensor.
__device__ __forceinline__ std::int64_t query_offset(const RowStrides& s, const BackwardWork& w, int h, int row) {
  return (std::int64_t(w.q_start) + row) * s.row + std::int64_t(h) * s.head + std::int64_t(w.b) * s.batch;
}

// C = A B^T over the K mode of two smem operands, loaded per K step by ldmatrix.
template <class TiledMma, class CopyA, class CopyB, class SA, class SB, class Acc>
__device__ __forceinline__ void smem_gemm(TiledMma const& mma, CopyA const& copy_a, CopyB const& copy_b, SA const& sA,
                                          SB const& sB, Acc& acc, int tid) {
  auto thr = mma.get_slice(tid);
  Tensor rA = thr.partition_fragment_A(sA);
  Tensor rB = thr.partition_fragment_B(sB);
  auto cpa = copy_a.get_slice(tid);
  auto cpb = copy_b.get_slice(tid);
  Tensor sA_p = cpa.partition_S(sA);
  Tensor rA_v = cpa.retile_D(rA);
  Tensor sB_p = cpb.partition_S(sB);
  Tensor rB_v = cpb.retile_D(rB);
  static_assert(decltype(size<2>(rA))::value == decltype(size<2>(rB))::value, "same K steps");
  static_assert(decltype(size<2>(sA_p))::value == decltype(size<2>(rA))::value, "copy A covers the K steps");
  static_assert(decltype(size<2>(sB_p))::value == decltype(size<2>(rB))::value, "copy B covers the K steps");
  constexpr int kSteps = decltype(size<2>(rA))::value;
  copy(copy_a, sA_p(_, _, 0), rA_v(_, _, 0));
  copy(copy_b, sB_p(_, _, 0), rB_v(_, _, 0));
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    if (k + 1 < kSteps) {  // the next step's fragments load while this step multiplies
      copy(copy_a, sA_p(_, _, k + 1), rA_v(_, _, k + 1));
      copy(copy_b, sB_p(_, _, k + 1), rB_v(_, _, k + 1));
    }
    gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// One step: query block m of query head h (its Q / dO / LSE / D already in shared memory).
template <class Traits, class AccDK, class AccDV>
__device__ void backward_step(const BackwardParams& p, const BackwardWork& w, typename Traits::SharedStorage& ss,
                              int h, int m, int tid, AccDK& acc_dk, AccDV& acc_dv) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  const int m0 = m * kBlockM, n0 = w.n_block * kBlockN;

  Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutQt{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dout), typename Traits::SmemLayoutQ{});
  Tensor sdOt = make_tensor(make_smem_ptr(ss.dout), typename Traits::SmemLayoutQt{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k), typename Traits::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k), typename Traits::SmemLayoutKt{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v), typename Traits::SmemLayoutK{});
  Tensor sP = make_tensor(make_smem_ptr(ss.p), typename Traits::SmemLayoutP{});
  Tensor sPt = make_tensor(make_smem_ptr(ss.p), typename Traits::SmemLayoutPt{});
  Tensor sdS = make_tensor(make_smem_ptr(ss.ds), typename Traits::SmemLayoutP{});
  Tensor sdSt = make_tensor(make_smem_ptr(ss.ds), typename Traits::SmemLayoutPt{});

  // ---- S = Q K^T, dP = dO V^T ------------------------------------------------------------------
  {
    typename Traits::TiledMmaSdP mma;
    auto copy_a = make_tiled_copy_A(typename Traits::SmemCopyN{}, mma);
    auto copy_b = make_tiled_copy_B(typename Traits::SmemCopyN{}, mma);
    auto thr = mma.get_slice(tid);
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    Tensor acc_dp = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    clear(acc_dp);
    smem_gemm(mma, copy_a, copy_b, sQ, sK, acc_s, tid);
    smem_gemm(mma, copy_a, copy_b, sdO, sV, acc_dp, tid);

    Tensor c = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
    Tensor tc = thr.partition_C(c);
    Tensor tP = thr.partition_C(sP);
    Tensor tdS = thr.partition_C(sdS);
    static_assert(decltype(size(tc))::value == decltype(size(acc_s))::value, "S fragment and coordinates");
    static_assert(decltype(size(tP))::value == decltype(size(acc_s))::value, "S fragment and P tile");
    const int diag = w.len_k - w.len_q;  // causal: row i sees key j iff j <= i + diag (SPEC §1)
#pragma unroll
    for (int i = 0; i < size(acc_s); ++i) {
      const int r = get<0>(tc(i));
      const int row = m0 + r, key = n0 + get<1>(tc(i));
      const bool visible = key < w.len_k && row < w.len_q && (!p.causal || key <= row + diag);
      // lse_log2 is +inf for rows past the sequence and rows that saw no key: P = 0 there.
      const float pr = visible ? exp2f(acc_s(i) * p.scale_log2 - ss.lse_log2[r]) : 0.f;
      const float ds = pr * (acc_dp(i) - ss.dsum[r]);
      tP(i) = Element(pr);
      tdS(i) = Element(ds);
    }
  }
  __syncthreads();  // P and dS complete in shared memory

  // ---- dV += P^T dO, dK += dS^T Q --------------------------------------------------------------
  {
    typename Traits::TiledMmaDKV mma;
    auto copy_a = make_tiled_copy_A(typename Traits::SmemCopyT{}, mma);
    auto copy_b = make_tiled_copy_B(typename Traits::SmemCopyT{}, mma);
    smem_gemm(mma, copy_a, copy_b, sPt, sdOt, acc_dv, tid);
    smem_gemm(mma, copy_a, copy_b, sdSt, sQt, acc_dk, tid);
  }
  // ---- dQ += dS K ------------------------------------------------------------------------------
  {
    typename Traits::TiledMmaDQ mma;
    auto copy_a = make_tiled_copy_A(typename Traits::SmemCopyN{}, mma);
    auto copy_b = make_tiled_copy_B(typename Traits::SmemCopyT{}, mma);
    Tensor acc_dq = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kD>>{});
    clear(acc_dq);
    smem_gemm(mma, copy_a, copy_b, sdS, sKt, acc_dq, tid);
    add_dq<Traits>(p, w, h, m0, tid, acc_dq);
  }
}

}  // namespace blasst::sm90::backward
