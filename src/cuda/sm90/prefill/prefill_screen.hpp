// Internal: the SPEC §2b FP8 screen in the prefill kernel (skip_screen, skip_screen_check). The
// producer loads Q8 with Q and each K8 tile with its K tile (K's stage and barrier); per tile the
// consumers compute S8 = Q8 K8^T (FP8 wgmma, e4m3 x e4m3 -> f32, issued where the skip kernel
// issues S = Q K^T, under the same ping-pong), the row's FP8 tile maximum over visible keys,
// raised by the margin, and vote on it like the exact test; a screened tile is skipped without its
// bf16 Q K^T, exponentials and P V. Every other tile gets the bf16 Q K^T and the exact vote of the
// skip kernel. skip_screen_check computes the bf16 scores of screened tiles too and counts the
// wrong screens (the decision still follows the screen).
//
// Units: the kernel's scores and running maxima are raw (q . k); the vote multiplies by the
// softmax scale (row_keeps). So the margin here is SPEC §2b's divided by the scale:
//   up_r = fl_up(fl_up(sq_r * max_j fl_up(acc_rj * sk_j)) + margin_r)
//   margin_r = (core_r + gamma_exact |q_r| KN_t + gamma_fp8 |q~_r| KT_t) (1 + 2^-16) + 2^-100
//   core_r = |q~_r| EK_t + |eq_r| KT_t + |eq_r| EK_t                         (strict)
//          = z / sqrt(d) sqrt((|q~_r| EK_t)^2 + (|eq_r| KT_t)^2) + |eq_r| EK_t   (tight(z))
// with acc the FP8 wgmma's sum of the e4m3 code products. The unit roundoffs (prefill_api.cu):
// u8 = 2^-13 for the FP8 accumulation: Hopper's FP8 wgmma is reported to keep about 14 bits of
// the aligned sum (DeepSeek-V3, section 3.3.2) and to truncate, and a chopped 14-bit significand
// has unit roundoff 2^-13; each partial sum's error is then at most u8 times the largest aligned
// addend, which sums to gamma_{d+3}(u8) sum_c |q8_c k8_c| <= gamma_{d+3}(u8) |q8||k8| (the +2
// covers the two products with the scales, each rounded upwards here anyway). u = 2^-22 for the
// exact scores (bf16 wgmma, fp32 accumulation; 4x fp32's 2^-24 because the tensor cores' own
// summation order and alignment are not documented). The factor (1 + 2^-16) covers the norms
// (computed in double by the pre-kernel, rounded upwards to float) and this float evaluation of the
// margin (a few roundings of 2^-24 each); 2^-100 stands for SPEC's absolute underflow term (in raw
// units it is below 2^-140). Every rounding errs upwards, so with u8 right the strict margin keeps
// SPEC's theorem: no wrong screen.
#pragma once

#include "cuda/sm90/prefill/prefill_mainloop.hpp"
#include "cuda/sm90/prefill/prefill_mask.hpp"
#include "cuda/sm90/prefill/prefill_skip.hpp"
#include "cuda/sm90/prefill/prefill_softmax.hpp"
#include "cuda/sm90/prefill/prefill_tile_scheduler.hpp"

namespace blasst::sm90::prefill {

// Per-warpgroup counts of the screen (SPEC §2b statistics).
struct ScreenCounters {
  unsigned long long screened = 0, wrong = 0;
};

// One query row's part of the screen's margin (raw-score units; see the file comment).
struct ScreenRow {
  float sq = 0.f, qn = 0.f, qt = 0.f, eq = 0.f;  // scale, |q|, |q~|, |eq|
};

// An upper bound of sqrt(x) without __fsqrt_ru's slow path (a CALL in the screen loops): rsqrtf
// errs by at most 2 ulp (CUDA Programming Guide, single-precision functions) and the product by
// half an ulp, so x * rsqrtf(x) is within 2^-21 of sqrt(x), and 1 + 2^-20 rounded upwards covers
// it. Below 2^-100 (rsqrtf's denormal range included) 2^-50 bounds it; inf and NaN pass through.
__device__ __forceinline__ float sqrt_upper(float x) {
  if (x < 0x1p-100f) return 0x1p-50f;
  if (!(x < INFINITY)) return x;
  return __fmul_ru(x * rsqrtf(x), 1.0f + 0x1p-20f);
}

__device__ __forceinline__ float screen_margin(ScreenRow const& r, float4 const& kt, ScreenArgs const& s) {
  // kt = {KN, KT, EK, 0}
  const float A = r.qt * kt.z, B = r.eq * kt.y, C = r.eq * kt.z;
  const float core = s.tight ? fmaf(s.z_over_sqrt_d, sqrt_upper(fmaf(A, A, B * B)), C) : A + B + C;
  const float rnd = fmaf(s.gamma_exact * r.qn, kt.x, s.gamma_fp8 * r.qt * kt.y);
  return fmaf(core + rnd, 1.0f + 0x1p-16f, 0x1p-100f);
}

// The screen terms of this thread's query rows (ScreenArgs::q_rows); rows past the sequence end
// keep zeros (they do not vote).
template <int kRows>
__device__ __forceinline__ void load_screen_rows(ScreenArgs const& sa, PrefillParams const& p, PrefillWork const& w,
                                                 int const (&row)[kRows], ScreenRow (&qrow)[kRows]) {
  const std::int64_t tok0 = (p.cu_q != nullptr ? 0 : std::int64_t(w.b) * p.rows_q) + w.q_start;
  CUTLASS_PRAGMA_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    if (row[mi] < w.q_len) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(sa.q_rows) + (tok0 + row[mi]) * p.hq + w.h);
      qrow[mi] = ScreenRow{v.x, v.y, v.z, v.w};
    }
  }
}

// The work tile's key tiles' screen terms (ScreenArgs::k_tiles of its sequence and KV head).
__device__ __forceinline__ const float4* screen_key_tiles(ScreenArgs const& sa, PrefillParams const& p,
                                                          PrefillWork const& w) {
  const int hk = w.h / p.group;
  return reinterpret_cast<const float4*>(sa.k_tiles) + (std::int64_t(w.b) * p.hk + hk) * sa.tiles;
}

template <class Traits>
__device__ __forceinline__ void producer_run_screen(KernelParams<Traits> const& kp, PrefillWork const& w,
                                                    typename Traits::SharedStorage& ss,
                                                    typename Traits::Pipeline& pipe_k,
                                                    typename Traits::Pipeline& pipe_v) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  const bool ragged = kp.p.cu_q != nullptr;
  const int hk = w.h / kp.p.group;

  Tensor mQ = kp.tma_q.get_tma_tensor(shape(kp.layout_q));
  Tensor mK = kp.tma_k.get_tma_tensor(shape(kp.layout_k));
  Tensor mV = kp.tma_v.get_tma_tensor(shape(kp.layout_v));
  Tensor mQ8 = kp.tma_q8.get_tma_tensor(shape(kp.layout_q8));
  Tensor mK8 = kp.tma_k8.get_tma_tensor(shape(kp.layout_k8));
  Tensor gQ = local_tile(seq_view(mQ, w.h, w.b, w.q_start, ragged), Shape<Int<kBlockM>, Int<kD>>{},
                         make_coord(w.m_block, _0{}));
  Tensor gQ8 = local_tile(seq_view(mQ8, w.h, w.b, w.q_start, ragged), Shape<Int<kBlockM>, Int<kD>>{},
                          make_coord(w.m_block, _0{}));
  Tensor gK = local_tile(seq_view(mK, hk, w.b, w.k_start, ragged), Shape<Int<kBlockN>, Int<kD>>{},
                         make_coord(_, _0{}));  // (N, d, tiles)
  Tensor gK8 = local_tile(seq_view(mK8, hk, w.b, w.k_start, ragged), Shape<Int<kBlockN>, Int<kD>>{},
                          make_coord(_, _0{}));
  Tensor gV = local_tile(seq_view(mV, hk, w.b, w.k_start, ragged), Shape<Int<kBlockN>, Int<kD>>{},
                         make_coord(_, _0{}));
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sQ8 = make_tensor(make_smem_ptr(ss.q8.data()), typename Traits::SmemLayoutQ8{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
  Tensor sK8 = make_tensor(make_smem_ptr(ss.k8.data()), typename Traits::SmemLayoutK8{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});

  auto [tQgQ, tQsQ] = tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
  auto [tQgQ8, tQsQ8] =
      tma_partition(kp.tma_q8, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ8), group_modes<0, 2>(gQ8));
  auto [tKgK, tKsK] = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tKgK8, tKsK8] =
      tma_partition(kp.tma_k8, _0{}, Layout<_1>{}, group_modes<0, 2>(sK8), group_modes<0, 2>(gK8));
  auto [tVgV, tVsV] = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));

  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.barrier_q,
                                                                 Traits::kTmaBytesQ + Traits::kTmaBytesQ8);
  copy(kp.tma_q.with(ss.barrier_q), tQgQ, tQsQ);
  copy(kp.tma_q8.with(ss.barrier_q), tQgQ8, tQsQ8);

  // K_{n+1} (with K8_{n+1}, one stage, one barrier: pipe_k's transaction bytes count both) before
  // V_n, as in the skip kernel.
  auto st = cutlass::make_producer_start_state<typename Traits::Pipeline>();
  auto st_v = st;
  TileWalk<Traits> walk_k(kp, w), walk_v(kp, w);
  auto load_k = [&]() {
    pipe_k.producer_acquire(st);
    auto* bar = pipe_k.producer_get_barrier(st);
    copy(kp.tma_k.with(*bar), tKgK(_, walk_k.tile()), tKsK(_, st.index()));
    copy(kp.tma_k8.with(*bar), tKgK8(_, walk_k.tile()), tKsK8(_, st.index()));
    walk_k.advance();
    ++st;
  };
  load_k();
  for (int n = 0; n < w.n_max; ++n) {
    if (n + 1 < w.n_max) load_k();
    pipe_v.producer_acquire(st_v);
    copy(kp.tma_v.with(*pipe_v.producer_get_barrier(st_v)), tVgV(_, walk_v.tile()), tVsV(_, st_v.index()));
    walk_v.advance();
    ++st_v;
  }
}

template <class Traits, class TensorO, class Softmax>
__device__ __forceinline__ void consumer_mainloop_screen(KernelParams<Traits> const& kp, PrefillWork const& w,
                                                         typename Traits::SharedStorage& ss,
                                                         typename Traits::Pipeline& pipe_k,
                                                         typename Traits::Pipeline& pipe_v, int mma_tid,
                                                         TensorO& tOrO, Softmax& sm, SkipCounters& cnt,
                                                         ScreenCounters& scnt) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  const PrefillParams& p = kp.p;
  const ScreenArgs& sa = kp.s;
  const int cwg = mma_tid / 128;

  typename Traits::TiledMmaQK mma0;
  typename Traits::TiledMmaPV mma1;
  typename Traits::TiledMmaQK8 mma8;
  auto thr0 = mma0.get_thread_slice(mma_tid);
  auto thr1 = mma1.get_thread_slice(mma_tid);
  auto thr8 = mma8.get_thread_slice(mma_tid);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
  Tensor sQ8 = make_tensor(make_smem_ptr(ss.q8.data()), typename Traits::SmemLayoutQ8{});
  Tensor sK8 = make_tensor(make_smem_ptr(ss.k8.data()), typename Traits::SmemLayoutK8{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutVt{});
  Tensor tSrQ = thr0.partition_fragment_A(sQ);
  Tensor tSrK = thr0.partition_fragment_B(sK);
  Tensor tSrQ8 = thr8.partition_fragment_A(sQ8);
  Tensor tSrK8 = thr8.partition_fragment_B(sK8);
  Tensor tOrV = thr1.partition_fragment_B(sVt);

  Tensor cS = make_identity_tensor(select<0, 1>(typename Traits::TileShapeQK{}));
  Tensor tScS = thr0.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  Tensor tScS8 = thr8.partition_C(cS);
  Tensor tScS8_rc = make_tensor(tScS8.data(), acc_rowcol(tScS8.layout()));

  Tensor tSrS0 = partition_fragment_C(mma0, select<0, 1>(typename Traits::TileShapeQK{}));
  Tensor tSrS0_rc = make_tensor(tSrS0.data(), acc_rowcol(tSrS0.layout()));
  Tensor tOrO_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
  Tensor tOrP = make_tensor<Element>(acc_to_a(tSrS0.layout()));
  constexpr int kRows = decltype(size<0>(tSrS0_rc))::value;

  const int row0 = w.m_block * kBlockM;
  int row[kRows];
  CUTLASS_PRAGMA_UNROLL
  for (int mi = 0; mi < kRows; ++mi) row[mi] = row0 + int(get<0>(tScS_rc(mi, 0)));

  load_seed_max(p, w, row, sm.m);  // seeded maxima (SPEC §2a), as in the skip kernel

  // This thread's query rows: scale and norms (rows past the sequence end do not vote).
  ScreenRow qrow[kRows];
  load_screen_rows(sa, p, w, row, qrow);
  const float4* const kt_seq = screen_key_tiles(sa, p, w);

  const float ln_lambda = p.threshold.template log_lambda<false>(w.k_len);
  const int n_vis = visible_tiles(row0 + cwg * 64, 64, w.q_len, w.k_len, p.causal, kBlockN);
  const bool can_skip = ln_lambda > -INFINITY;
  int n_skipped = 0, n_screened = 0, n_wrong = 0;

  cutlass::arch::ClusterTransactionBarrier::wait(&ss.barrier_q, 0);

  TileWalk<Traits> walk(kp, w);
  typename Traits::PipelineState st;   // tile n
  typename Traits::PipelineState stp;  // tile n-1
  bool pv_pending = false;             // the P V product of tile n-1 is still to issue
  const int other = (cwg + 1) % Traits::kNumMmaWG;

  for (int n = 0; n < w.n_max; ++n) {
    const int tile = walk.tile();
    walk.advance();
    // The tile's key quantities (its norm maxima and its one key scale): issued before the waits.
    const float4 kt = __ldg(kt_seq + tile);

    Tensor acc8 = partition_fragment_C(mma8, select<0, 1>(typename Traits::TileShapeQK{}));
    Tensor acc8_rc = make_tensor(acc8.data(), acc_rowcol(acc8.layout()));
    pipe_k.consumer_wait(st);
    if constexpr (Traits::kPingPong) named_sync(kBarSched0 + cwg, Traits::kNumMmaThreads);
    wg_gemm<true, -1, false>(mma8, tSrQ8, tSrK8(_, _, _, st.index()), acc8);
    // P V of tile n-1 (a uniform branch: pv_pending is !skip, made uniform by the vote), else an
    // empty group, so that wait_group 1 means "S8_n done".
    if (pv_pending) {
      pipe_v.consumer_wait(stp);
      wg_gemm<false, -1, true>(mma1, tOrP, tOrV(_, _, _, stp.index()), tOrO);
    } else {
      warpgroup_commit_batch();
    }
    if constexpr (Traits::kPingPong) named_arrive(kBarSched0 + other, Traits::kNumMmaThreads);
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc8);

    // FP8 tile maxima: the row maximum of the raw sums (invisible keys -inf, NaN propagates), then
    // times the tile's key scale and the row's scale, each rounded upwards (max and a positive
    // scale commute, and rounding upwards is monotone: the maximum of the scaled scores).
    const bool needs_mask = tile_needs_mask(tile, kBlockN, row0, w.q_len, w.k_len, p.causal);
    if (needs_mask) apply_mask(acc8_rc, tScS8_rc, row0, tile * kBlockN, w.q_len, w.k_len, p.causal);
    float up8[kRows];
    sm.template tile_max<true>(acc8_rc, up8);
    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      const float up = __fadd_ru(__fmul_ru(__fmul_ru(up8[mi], kt.w), qrow[mi].sq), screen_margin(qrow[mi], kt, sa));
      up8[mi] = up8[mi] == -INFINITY ? -INFINITY : up;  // no visible key: the row does not vote
    }
    const bool keep8 = vote_keep(up8, sm.m, row, w.q_len, p.scale, ln_lambda);
    const bool any_keep8 = named_sync_or(kBarVote0 + cwg, Traits::kVoteThreads, keep8);
    // Uniform for ptxas (VOTEU), as the skip kernel's decision.
    const bool screened = __any_sync(0xffffffffu, can_skip && !any_keep8);

    bool skip = screened;
    Tensor tSrS = partition_fragment_C(mma0, select<0, 1>(typename Traits::TileShapeQK{}));
    Tensor tSrS_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    float tmax[kRows];
    if (Traits::kScreenCheck || !screened) {
      // The exact test (SPEC §2) on the bf16 scores: S_n, then the skip kernel's vote.
      wg_gemm<true, -1, false>(mma0, tSrQ, tSrK(_, _, _, st.index()), tSrS);
      warpgroup_wait<0>();  // S_n and the P V product of tile n-1
      warpgroup_fence_operand(tSrS);
      if (needs_mask) apply_mask(tSrS_rc, tScS_rc, row0, tile * kBlockN, w.q_len, w.k_len, p.causal);
      sm.template tile_max<Traits::kTreeMax>(tSrS_rc, tmax);
      const bool keep = vote_keep(tmax, sm.m, row, w.q_len, p.scale, ln_lambda);
      const bool any_keep = named_sync_or(kBarVote0 + cwg, Traits::kVoteThreads, keep);
      const bool exact_skip = __any_sync(0xffffffffu, can_skip && !any_keep);
      if constexpr (Traits::kScreenCheck) n_wrong += screened && !exact_skip && tile < n_vis ? 1 : 0;
      skip = screened || exact_skip;
    }
    pipe_k.consumer_release(st);
    n_screened += screened && tile < n_vis ? 1 : 0;
    n_skipped += skip && tile < n_vis ? 1 : 0;

    // V stages: tile n-1's after its P V product; a skipped tile's own stage unread.
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    if (pv_pending) pipe_v.consumer_release(stp);
    if (skip) {
      pipe_v.consumer_wait(st);
      pipe_v.consumer_release(st);
    } else {
      float alpha[kRows];
      sm.update(tSrS_rc, tmax, p.scale_log2, alpha);
      Softmax::rescale(tOrO_rc, alpha);
      Tensor p_lp = convert_frag<Element>(tSrS);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(tOrP); ++i) tOrP(i) = p_lp(i);
    }
    pv_pending = !skip;
    stp = st;
    ++st;
  }
  if (pv_pending) {
    pipe_v.consumer_wait(stp);
    wg_gemm<false, 0, true>(mma1, tOrP, tOrV(_, _, _, stp.index()), tOrO);
    pipe_v.consumer_release(stp);
  }
  cnt.visited = static_cast<unsigned long long>(n_vis);
  cnt.skipped = static_cast<unsigned long long>(n_skipped);
  scnt.screened = static_cast<unsigned long long>(n_screened);
  scnt.wrong = static_cast<unsigned long long>(n_wrong);
}

}  // namespace blasst::sm90::prefill
