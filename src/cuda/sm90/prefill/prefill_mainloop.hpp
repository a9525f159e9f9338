// Internal: the producer (TMA loads of Q once, then K and V tiles through two-stage pipelines)
// and the consumer main loop (S = Q K^T, mask, skip vote, softmax, O += P V) of the prefill
// kernel. Intra-warpgroup overlap: the P V product of tile n-1 is issued right after S_n and
// runs while the softmax of tile n is computed.
#pragma once

#include "cuda/sm90/prefill/prefill_mask.hpp"
#include "cuda/sm90/prefill/prefill_skip.hpp"
#include "cuda/sm90/prefill/prefill_softmax.hpp"
#include "cuda/sm90/prefill/prefill_tile_scheduler.hpp"

namespace blasst::sm90::prefill {

template <class Traits>
struct KernelParams {
  PrefillParams p;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::GLayout layout_q;
  typename Traits::GLayout layout_k;
  typename Traits::GLayout layout_v;
};

// The key tiles of a CTA's steps, one step at a time: the skip kernel walks the visit order
// (natural or max-first, SPEC §2a); the dense kernel always visits in natural order (its code
// stays free of the order, and the order changes nothing but rounding there).
template <class Traits>
struct TileWalk {
  ::blasst::detail::VisitCursor cur;
  int n = 0;
  __device__ __forceinline__ explicit TileWalk(PrefillWork const& w) : cur(w.n_max, w.own) {}
  __device__ __forceinline__ int tile() const {
    if constexpr (Traits::kSkip) return cur.tile;
    return n;
  }
  __device__ __forceinline__ void advance() {
    if constexpr (Traits::kSkip) cur.advance();
    else ++n;
  }
};

template <class Traits>
__device__ __forceinline__ void producer_run(KernelParams<Traits> const& kp, PrefillWork const& w,
                                             typename Traits::SharedStorage& ss,
                                             typename Traits::Pipeline& pipe_k,
                                             typename Traits::Pipeline& pipe_v) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  const bool ragged = kp.p.cu_q != nullptr;
  const int hk = w.h / kp.p.group;

  Tensor mQ = kp.tma_q.get_tma_tensor(shape(kp.layout_q));
  Tensor mK = kp.tma_k.get_tma_tensor(shape(kp.layout_k));
  Tensor mV = kp.tma_v.get_tma_tensor(shape(kp.layout_v));
  Tensor gQ = local_tile(seq_view(mQ, w.h, w.b, w.q_start, ragged),
                         Shape<Int<kBlockM>, Int<kD>>{}, make_coord(w.m_block, _0{}));
  Tensor gK = local_tile(seq_view(mK, hk, w.b, w.k_start, ragged),
                         Shape<Int<kBlockN>, Int<kD>>{}, make_coord(_, _0{}));  // (N, d, tiles)
  Tensor gV = local_tile(seq_view(mV, hk, w.b, w.k_start, ragged),
                         Shape<Int<kBlockN>, Int<kD>>{}, make_coord(_, _0{}));
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});

  auto [tQgQ, tQsQ] = tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                    group_modes<0, 2>(gQ));
  auto [tKgK, tKsK] = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                    group_modes<0, 2>(gK));
  auto [tVgV, tVsV] = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                    group_modes<0, 2>(gV));

  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.barrier_q, Traits::kTmaBytesQ);
  copy(kp.tma_q.with(ss.barrier_q), tQgQ, tQsQ);

  auto st = cutlass::make_producer_start_state<typename Traits::Pipeline>();
  if constexpr (Traits::kKAhead) {
    // K_{n+1} before V_n: V_n is first read one step after K_n, so K gets the earlier slot.
    auto st_v = st;
    TileWalk<Traits> walk_k(w), walk_v(w);
    auto load_k = [&]() {
      pipe_k.producer_acquire(st);
      copy(kp.tma_k.with(*pipe_k.producer_get_barrier(st)), tKgK(_, walk_k.tile()),
           tKsK(_, st.index()));
      walk_k.advance();
      ++st;
    };
    load_k();
    for (int n = 0; n < w.n_max; ++n) {
      if (n + 1 < w.n_max) load_k();
      pipe_v.producer_acquire(st_v);
      copy(kp.tma_v.with(*pipe_v.producer_get_barrier(st_v)), tVgV(_, walk_v.tile()),
           tVsV(_, st_v.index()));
      walk_v.advance();
      ++st_v;
    }
  } else {
    TileWalk<Traits> walk(w);
    for (int n = 0; n < w.n_max; ++n) {
      const int t = walk.tile();  // key tile of step n
      pipe_k.producer_acquire(st);
      copy(kp.tma_k.with(*pipe_k.producer_get_barrier(st)), tKgK(_, t), tKsK(_, st.index()));
      pipe_v.producer_acquire(st);
      copy(kp.tma_v.with(*pipe_v.producer_get_barrier(st)), tVgV(_, t), tVsV(_, st.index()));
      walk.advance();
      ++st;
    }
  }
}

// Writes one lane's part of a vote group's skip set: `bits` holds tiles [tile0, tile0 + 32) of
// the group whose tile 0 is bit `set_row` of `words`; only visible tiles (< n_vis) count. The
// 32 bits straddle two words unless set_row is a multiple of 32; a word may be shared with the
// neighbouring groups, hence red.or. At most two per lane, once per CTA.
__device__ __forceinline__ void record_set_bits(std::uint32_t* words, long long set_row, int tile0,
                                                std::uint32_t bits, int n_vis) {
  const int nv = n_vis - tile0;
  if (nv < 32) bits = nv <= 0 ? 0u : bits & ((1u << nv) - 1u);
  if (bits == 0u) return;
  const long long i = set_row + tile0;
  std::uint32_t* const word = words + (i >> 5);
  const int s = int(i & 31);
  atomicOr(word, bits << s);
  if (s != 0 && (bits >> (32 - s)) != 0u) atomicOr(word + 1, bits >> (32 - s));
}

template <class Traits, class TensorO, class Softmax>
__device__ __forceinline__ void consumer_mainloop(KernelParams<Traits> const& kp,
                                                  PrefillWork const& w,
                                                  typename Traits::SharedStorage& ss,
                                                  typename Traits::Pipeline& pipe_k,
                                                  typename Traits::Pipeline& pipe_v,
                                                  int mma_tid, TensorO& tOrO, Softmax& sm,
                                                  SkipCounters& cnt) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  const PrefillParams& p = kp.p;
  const int cwg = mma_tid / 128;

  typename Traits::TiledMmaQK mma0;
  typename Traits::TiledMmaPV mma1;
  auto thr0 = mma0.get_thread_slice(mma_tid);
  auto thr1 = mma1.get_thread_slice(mma_tid);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutVt{});
  Tensor tSrQ = thr0.partition_fragment_A(sQ);
  Tensor tSrK = thr0.partition_fragment_B(sK);
  Tensor tOrV = thr1.partition_fragment_B(sVt);

  Tensor cS = make_identity_tensor(select<0, 1>(typename Traits::TileShapeQK{}));
  Tensor tScS = thr0.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));

  Tensor tSrS0 = partition_fragment_C(mma0, select<0, 1>(typename Traits::TileShapeQK{}));
  Tensor tSrS0_rc = make_tensor(tSrS0.data(), acc_rowcol(tSrS0.layout()));
  Tensor tOrO_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
  // P of the previous tile, in the register-A layout of the P V wgmma.
  Tensor tOrP = make_tensor<Element>(acc_to_a(tSrS0.layout()));
  constexpr int kRows = decltype(size<0>(tSrS0_rc))::value;

  const int row0 = w.m_block * kBlockM;  // first query row of the CTA within the sequence
  int row[kRows];
  CUTLASS_PRAGMA_UNROLL
  for (int mi = 0; mi < kRows; ++mi) row[mi] = row0 + int(get<0>(tScS_rc(mi, 0)));

  // Seeded maxima (SPEC §2a): each voting row's running max starts at its seed, in raw-score
  // units (the seed is in lse's units, scale * score); +inf becomes NaN (a row the NaN rule makes
  // NaN: its rescale would be inf - inf; the reference refuses it on the host).
  if constexpr (Traits::kSkip) {
    if (p.seed_max != nullptr) {
      const std::int64_t base = (p.cu_q != nullptr ? 0 : std::int64_t(w.b)) * p.seed_batch +
                                std::int64_t(w.h) * p.seed_head + std::int64_t(w.q_start) * p.seed_row;
      CUTLASS_PRAGMA_UNROLL
      for (int mi = 0; mi < kRows; ++mi) {
        if (row[mi] < w.q_len) {
          const float s = p.seed_max[base + std::int64_t(row[mi]) * p.seed_row];
          sm.m[mi] = s == INFINITY ? NAN : s / p.scale;
        }
      }
    }
  }

  float ln_lambda = -INFINITY;  // -inf: this sequence skips nothing (SPEC §3)
  int n_vis = 0;
  if constexpr (Traits::kSkip) {
    ln_lambda = p.threshold.template log_lambda<false>(w.k_len);
    n_vis = visible_tiles(row0 + cwg * 64, 64, w.q_len, w.k_len, p.causal, kBlockN);
  }
  // ln(lambda) = -inf never skips; the vote still runs (statistics, and no shortcut that would
  // make the 0 %-sparsity cost look smaller than with a real lambda).
  const bool can_skip = ln_lambda > -INFINITY;
  // Non-null: histogram on (skip_hist instance only; null elsewhere, so all its code folds away).
  unsigned long long* const hist = Traits::kHist ? p.hist : nullptr;
  int n_skipped = 0;
  // Non-null: the skip set is recorded (SPEC §9; skip_record and skip_hist instances only, null
  // elsewhere so its code folds away). set_row: bit index of this vote group's tile 0. The bits
  // of tiles [0, kSetWindowTiles) are gathered in one register spread over the warp (lane l holds
  // tiles [32 l, 32 l + 32)): a skipped tile costs every thread one shift and one OR, with no
  // memory access and no branch on the skipped-tile path, and warp 0 of the warpgroup writes
  // the words once, after the loop (record_set_bits). Tiles past the window (sequences of more
  // than 128K keys) are set one by one by the warpgroup's first thread, as before.
  std::uint32_t* const skip_set = Traits::kRecordSet ? p.skip_set : nullptr;
  const bool record_lane = skip_set != nullptr && mma_tid % 128 == 0;  // the warpgroup's first thread
  const long long set_row =
      (static_cast<long long>(w.b * p.hq + w.h) * p.set_groups + (row0 / 64 + cwg)) * p.set_tiles;
  constexpr int kSetWindowTiles = 32 * 32;
  [[maybe_unused]] std::uint32_t set_bits = 0;  // this lane's 32 tiles of the window
  const int lane_tile0 = 32 * (threadIdx.x % 32);  // the first of them

  // Histogram (statistics), kept off the softmax's critical path and free of divergent branches:
  // in step n+1, while its S wgmma runs, each warp reduces its delta maximum of tile n and stores
  // it in its own smem slot; in step n+2 (after tile n+1's vote barrier, which orders those
  // stores) warp 0 of the warpgroup reads the four slots at once, all its lanes bin the maximum
  // alike and lane 0 counts it. The last two tiles are binned after one extra barrier. Whatever
  // warp 0 does here delays the next vote barrier if it outlasts the S wgmma (ncu, H200, 78202c4:
  // barrier stalls 0.25 -> 0.76 per instruction), so the chain is kept short: one 16-byte smem
  // read, float binning, the tiles' visibility carried in registers.
  float* const hslot = &ss.hist_delta[cwg][0][0];  // [tile parity][warp]
  const int wg_warp = (mma_tid / 32) % 4;
  const int lane = threadIdx.x % 32;
  const bool hist_warp = hist != nullptr && wg_warp == 0;
  bool vis1 = false, vis2 = false;  // tiles of the previous two steps visible to this warpgroup
  // The tile of step n into the histogram (warp 0 of the warpgroup), when visible.
  auto hist_flush = [&](int n, bool visible) {
    const float4 v = *reinterpret_cast<const float4*>(hslot + (n & 1) * 4);
    const int bin = hist_bin(running_max(running_max(v.x, v.y), running_max(v.z, v.w)));
    if (lane == 0 && visible) atomicAdd(hist + std::size_t(w.h) * kHistSlots + bin, 1ull);
  };
  float d_prev = -INFINITY;  // this thread's delta of the previous tile (histogram only)
  // This warp's maximum of step n's tile into its slot (NaN when a row's delta is NaN: the top
  // bin, as on the host).
  auto hist_store = [&](int n) {
    const float d = warp_delta(d_prev);
    if (lane == 0) hslot[(n & 1) * 4 + wg_warp] = d;
  };
  // In step n's wgmma gap: tile n-1 into this warp's slot; warp 0 bins tile n-2.
  auto hist_gap = [&](int n) {
    hist_store(n - 1);
    if (hist_warp && n >= 2) hist_flush(n - 2, vis2);
  };

  cutlass::arch::ClusterTransactionBarrier::wait(&ss.barrier_q, 0);

  TileWalk<Traits> walk(w);            // the key tile of step n
  typename Traits::PipelineState st;   // tile n
  typename Traits::PipelineState stp;  // tile n-1
  // The P V product of tile n-1 is still to issue (tile n-1 kept). Dense: always, after tile 0.
  bool pv_pending = false;
  const int other = (cwg + 1) % Traits::kNumMmaWG;

  // One tile. kFirst: nothing pending yet (peeled). kPV: 1 = the P V of tile n-1 is issued here
  // (dense; compile-time, straight-line), 0 = it is not (tile n-1 skipped), 2 = decided at run
  // time by pv_pending (the skip variant's single loop body: a uniform branch around the P V
  // wgmma batch; when it is not issued an empty wgmma group is committed in its place, so
  // wait_group 1 still means "S_n done").
  auto step = [&](int n, auto first_tag, auto pv_tag) {
    constexpr bool kFirst = decltype(first_tag)::value;
    constexpr int kPV = kFirst ? 0 : decltype(pv_tag)::value;
    Tensor tSrS = partition_fragment_C(mma0, select<0, 1>(typename Traits::TileShapeQK{}));
    Tensor tSrS_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    pipe_k.consumer_wait(st);
    if constexpr (Traits::kPingPong) named_sync(kBarSched0 + cwg, Traits::kNumMmaThreads);
    wg_gemm<true, -1, false>(mma0, tSrQ, tSrK(_, _, _, st.index()), tSrS);
    if constexpr (kPV == 1) {
      pipe_v.consumer_wait(stp);
      wg_gemm<false, -1, true>(mma1, tOrP, tOrV(_, _, _, stp.index()), tOrO);
    } else if constexpr (kPV == 2) {
      // pv_pending is warp-uniform for ptxas (it is !skip, see the vote): a uniform branch, no
      // wgmma serialization.
      if (pv_pending) {
        pipe_v.consumer_wait(stp);
        wg_gemm<false, -1, true>(mma1, tOrP, tOrV(_, _, _, stp.index()), tOrO);
      } else {
        warpgroup_commit_batch();  // empty group
      }
    }
    if constexpr (Traits::kPingPong) named_arrive(kBarSched0 + other, Traits::kNumMmaThreads);
    if constexpr (!kFirst) {
      if (hist != nullptr) hist_gap(n);
    }
    if constexpr (kPV != 0) warpgroup_wait<1>(); else warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    pipe_k.consumer_release(st);

    const int tile = walk.tile();  // masks and counts go by the key tile
    walk.advance();                // (the next step's tile: off this step's critical path)
    if (tile_needs_mask(tile, kBlockN, row0, w.q_len, w.k_len, p.causal)) {
      apply_mask(tSrS_rc, tScS_rc, row0, tile * kBlockN, w.q_len, w.k_len, p.causal);
    }
    float tmax[kRows];
    sm.template tile_max<Traits::kTreeMax>(tSrS_rc, tmax);

    bool skip = false;
    [[maybe_unused]] float d_thread = -INFINITY;  // histogram only
    if constexpr (Traits::kSkip) {
      // One BAR.RED of per-thread predicates decides (no warpgroup max on the softmax's path;
      // bar.red also orders shared memory like bar.sync, which the histogram slots rely on).
      const bool keep = vote_keep(tmax, sm.m, row, w.q_len, p.scale, ln_lambda);
      if (hist != nullptr) d_thread = thread_delta(tmax, sm.m, row, w.q_len, p.scale);
      const bool any_keep = named_sync_or(kBarVote0 + cwg, 128, keep);
      // The BAR.RED gives all 128 threads the same answer, but ptxas cannot know it: a branch
      // on it counts as divergent, and then the loop kept its loop-carried state (pipeline
      // stages, wgmma descriptors, the visit cursor) in vector registers, moved to uniform ones
      // before every wgmma (R2UR), with BSSY/BSYNC reconvergence around the branches. The warp
      // vote of an equal value is that value, and ptxas knows its result is uniform (VOTEU).
      skip = __any_sync(0xffffffffu, can_skip && !any_keep);
      n_skipped += skip && tile < n_vis ? 1 : 0;
    }

    // V stages: the one of tile n-1 is released after its P V product is done (kept) or unread
    // (skipped); kEarlyV does that before the exponentials and frees a skipped tile's own
    // stage in its own step (then nothing is left for tile n-1 when it was skipped).
    auto finish_v_prev = [&]() {
      if constexpr (kPV == 1) {
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        pipe_v.consumer_release(stp);
      } else if constexpr (kPV == 2) {
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        if constexpr (Traits::kEarlyV) {
          if (pv_pending) pipe_v.consumer_release(stp);
        } else {
          if (!pv_pending) pipe_v.consumer_wait(stp);  // skipped tile n-1: released unread
          pipe_v.consumer_release(stp);
        }
      } else if constexpr (!kFirst && !Traits::kEarlyV) {
        pipe_v.consumer_wait(stp);
        pipe_v.consumer_release(stp);
      }
    };
    if constexpr (Traits::kEarlyV) {
      finish_v_prev();
      if (skip) {
        pipe_v.consumer_wait(st);
        pipe_v.consumer_release(st);
        // The skip set's bit, after the V stages are released (off the vote -> release path):
        // into the lane that holds the tile (a shift past 31 gives 0 in the others); the window
        // test is warp-uniform (tile is), so it is a uniform branch.
        if constexpr (Traits::kRecordSet) {
          set_bits |= shl_or_zero(1u, std::uint32_t(tile - lane_tile0));
          if (tile >= kSetWindowTiles) red_or_bit(skip_set, set_row + tile, record_lane && tile < n_vis);
        }
      }
    }
    float alpha[kRows];
    if (!skip) sm.update(tSrS_rc, tmax, p.scale_log2, alpha);
    if constexpr (Traits::kSkip) {
      if (hist != nullptr) {
        d_prev = d_thread;
        vis2 = vis1;
        vis1 = tile < n_vis;
      }
    }
    if constexpr (!Traits::kEarlyV) finish_v_prev();
    if (!skip) {
      Softmax::rescale(tOrO_rc, alpha);
      Tensor p_lp = convert_frag<Element>(tSrS);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(tOrP); ++i) tOrP(i) = p_lp(i);
    }
    pv_pending = !skip;
    stp = st;
    ++st;
  };

  using PV0 = cute::integral_constant<int, 0>;
  using PV1 = cute::integral_constant<int, 1>;
  using PV2 = cute::integral_constant<int, 2>;
  step(0, cute::true_type{}, PV0{});
  for (int n = 1; n < w.n_max; ++n) {
    if constexpr (!Traits::kSkip) {
      step(n, cute::false_type{}, PV1{});
    } else {
      step(n, cute::false_type{}, PV2{});
    }
  }
  if (!Traits::kSkip || pv_pending) {
    pipe_v.consumer_wait(stp);
    wg_gemm<false, 0, true>(mma1, tOrP, tOrV(_, _, _, stp.index()), tOrO);
    pipe_v.consumer_release(stp);
  } else if (!Traits::kEarlyV) {
    pipe_v.consumer_wait(stp);  // last tile skipped: its V stage is released unread
    pipe_v.consumer_release(stp);
  }
  if (hist != nullptr) {
    hist_store(w.n_max - 1);  // the last tile's warp maxima
    named_sync(kBarVote0 + cwg, 128);  // orders every warp's stores before the flushes
    if (hist_warp) {
      if (w.n_max >= 2) hist_flush(w.n_max - 2, vis2);
      hist_flush(w.n_max - 1, vis1);
    }
  }
  if constexpr (Traits::kRecordSet) {
    // Every warp of the warpgroup holds the same bits; warp 0 writes them (invisible tiles, which
    // the vote always skips, masked off here instead of on every skipped tile).
    if (skip_set != nullptr && (mma_tid / 32) % 4 == 0) {
      record_set_bits(skip_set, set_row, lane_tile0, set_bits, n_vis);
    }
  }
  // The walk visits every tile of [0, n_max) once, and [0, n_vis) are the visible ones: no
  // per-step count.
  cnt.visited = static_cast<unsigned long long>(n_vis);
  cnt.skipped = static_cast<unsigned long long>(n_skipped);
}

}  // namespace blasst::sm90::prefill
