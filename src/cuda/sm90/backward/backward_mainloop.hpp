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

// cp.async of the Q and dO tiles of step (query head h, query block m) into stage `stage`.
template <class Traits>
__device__ __forceinline__ void load_q_dout_async(const BackwardParams& p, const BackwardWork& w,
                                                  typename Traits::SharedStorage& ss, int stage, int h, int m, int tid) {
  using Element = typename Traits::Element;
  auto const* q = static_cast<Element const*>(p.q);
  auto const* dout = static_cast<Element const*>(p.dout_main);
  const int m0 = m * Traits::kBlockM;
  load_tile_async<Traits, Traits::kBlockM>(ss.q[stage], q + query_offset(p.q_s, w, h, m0), p.q_s.row, w.len_q - m0,
                                           q, tid);
  load_tile_async<Traits, Traits::kBlockM>(ss.dout[stage], dout + query_offset(p.dout_main_s, w, h, m0),
                                           p.dout_main_s.row, w.len_q - m0, dout, tid);
}

// C = A B^T over the K mode of two smem operands, loaded per K step by ldmatrix; kAhead: the next
// step's fragments load while this step multiplies (more registers live).
template <bool kAhead, class TiledMma, class CopyA, class CopyB, class SA, class SB, class Acc>
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
  if constexpr (kAhead) {
    copy(copy_a, sA_p(_, _, 0), rA_v(_, _, 0));
    copy(copy_b, sB_p(_, _, 0), rB_v(_, _, 0));
  }
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    if constexpr (kAhead) {
      if (k + 1 < kSteps) {
        copy(copy_a, sA_p(_, _, k + 1), rA_v(_, _, k + 1));
        copy(copy_b, sB_p(_, _, k + 1), rB_v(_, _, k + 1));
      }
    } else {
      copy(copy_a, sA_p(_, _, k), rA_v(_, _, k));
      copy(copy_b, sB_p(_, _, k), rB_v(_, _, k));
    }
    gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// One step: query block m of query head h (its Q / dO in `stage`, LSE / D in shared memory).
template <class Traits, class AccDK, class AccDV>
__device__ void backward_step(const BackwardParams& p, const BackwardWork& w, typename Traits::SharedStorage& ss,
                              int stage, int h, int m, int tid, AccDK& acc_dk, AccDV& acc_dv) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  const int m0 = m * kBlockM, n0 = w.n_block * kBlockN;

  Tensor sQ = make_tensor(make_smem_ptr(ss.q[stage]), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.q[stage]), typename Traits::SmemLayoutQt{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dout[stage]), typename Traits::SmemLayoutQ{});
  Tensor sdOt = make_tensor(make_smem_ptr(ss.dout[stage]), typename Traits::SmemLayoutQt{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k), typename Traits::SmemLayoutKt{});
  Tensor sPt = make_tensor(make_smem_ptr(ss.p), typename Traits::SmemLayoutPt{});
  Tensor sdS = make_tensor(make_smem_ptr(ss.ds), typename Traits::SmemLayoutP{});
  Tensor sdSt = make_tensor(make_smem_ptr(ss.ds), typename Traits::SmemLayoutPt{});

  // ---- S = Q K^T, dP = dO V^T, per key slice; P and dS to shared memory ------------------------
  // (Unrolled: a rolled slice loop spills about 300 bytes at d = 128.)
  constexpr int kSlice = Traits::kBlockNSdP;
#pragma unroll
  for (int slice = 0; slice < Traits::kSdPSplit; ++slice) {
    Tensor sKs = make_tensor(make_smem_ptr(ss.k + slice * kSlice * Traits::kLdD), typename Traits::SmemLayoutKSlice{});
    Tensor sVs = make_tensor(make_smem_ptr(ss.v + slice * kSlice * Traits::kLdD), typename Traits::SmemLayoutKSlice{});
    Tensor sPs = make_tensor(make_smem_ptr(ss.p + slice * kSlice), typename Traits::SmemLayoutPSlice{});
    Tensor sdSs = make_tensor(make_smem_ptr(ss.ds + slice * kSlice), typename Traits::SmemLayoutPSlice{});
    typename Traits::TiledMmaSdP mma;
    auto copy_a = make_tiled_copy_A(typename Traits::SmemCopyN{}, mma);
    auto copy_b = make_tiled_copy_B(typename Traits::SmemCopyN{}, mma);
    auto thr = mma.get_slice(tid);
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kSlice>>{});
    Tensor acc_dp = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kSlice>>{});
    clear(acc_s);
    clear(acc_dp);
    smem_gemm<true>(mma, copy_a, copy_b, sQ, sKs, acc_s, tid);
    smem_gemm<true>(mma, copy_a, copy_b, sdO, sVs, acc_dp, tid);

    Tensor c = make_identity_tensor(Shape<Int<kBlockM>, Int<kSlice>>{});
    Tensor tc = thr.partition_C(c);
    Tensor tP = thr.partition_C(sPs);
    Tensor tdS = thr.partition_C(sdSs);
    static_assert(decltype(size(tc))::value == decltype(size(acc_s))::value, "S fragment and coordinates");
    static_assert(decltype(size(tP))::value == decltype(size(acc_s))::value, "S fragment and P tile");
    const int diag = w.len_k - w.len_q;  // causal: row i sees key j iff j <= i + diag (SPEC §1)
    const int k0 = n0 + slice * kSlice;
#pragma unroll
    for (int i = 0; i < size(acc_s); ++i) {
      const int r = get<0>(tc(i));
      const int row = m0 + r, key = k0 + get<1>(tc(i));
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
    smem_gemm<true>(mma, copy_a, copy_b, sPt, sdOt, acc_dv, tid);
    smem_gemm<true>(mma, copy_a, copy_b, sdSt, sQt, acc_dk, tid);
  }
  // ---- dQ += dS K ------------------------------------------------------------------------------
  {
    typename Traits::TiledMmaDQ mma;
    auto copy_a = make_tiled_copy_A(typename Traits::SmemCopyN{}, mma);
    auto copy_b = make_tiled_copy_B(typename Traits::SmemCopyT{}, mma);
    Tensor acc_dq = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kD>>{});
    clear(acc_dq);
    smem_gemm<true>(mma, copy_a, copy_b, sdS, sKt, acc_dq, tid);
    add_dq<Traits>(p, w, h, m0, tid, acc_dq);
  }
}

}  // namespace blasst::sm90::backward
