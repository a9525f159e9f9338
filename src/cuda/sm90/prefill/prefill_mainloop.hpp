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
struct KernelParamsCore {
  PrefillParams p;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::GLayout layout_q;
  typename Traits::GLayout layout_k;
  typename Traits::GLayout layout_v;
};
// The screen instances append the FP8 screen's arguments and TMA descriptors, the skip_ahead
// instances the plan of the screen ahead; every other instance's parameters are
// KernelParamsCore's, byte for byte.
template <class Traits, int kExtra = Traits::kScreen ? 1 : Traits::kAhead ? 2 : 0>
struct KernelParams : KernelParamsCore<Traits> {};
template <class Traits>
struct KernelParams<Traits, 2> : KernelParamsCore<Traits> {
  AheadPlan plan;
};
template <class Traits>
struct KernelParams<Traits, 1> : KernelParamsCore<Traits> {
  ScreenArgs s;
  typename Traits::TmaQ8 tma_q8;
  typename Traits::TmaK8 tma_k8;
  typename Traits::GLayout8 layout_q8;
  typename Traits::GLayout8 layout_k8;
};

// The key tiles of a CTA's steps, one step at a time: the skip kernel walks the visit order
// (natural or max-first, SPEC §2a); the dense kernel always visits in natural order (its code
// stays free of the order, and the order changes nothing but rounding there); skip_ahead walks its
// plan's list (w.n_max entries, in the visit order; the next entry is loaded one step ahead).
template <class Traits>
struct TileWalk {
  ::blasst::detail::VisitCursor cur;
  int n = 0;
  const std::uint32_t* list = nullptr;  // skip_ahead
  std::uint32_t cur_e = 0, next_e = 0;
  int count = 0;
  template <class KP>
  __device__ __forceinline__ TileWalk(KP const& kp, PrefillWork const& w) : cur(w.n_max, w.own) {
    if constexpr (Traits::kAhead) {
      list = kp.plan.list + std::size_t(blockIdx.x) * std::size_t(kp.plan.stride);
      count = w.n_max;
      cur_e = count > 0 ? __ldg(list) : 0u;
      next_e = count > 1 ? __ldg(list + 1) : 0u;
    }
  }
  __device__ __forceinline__ int tile() const {
    if constexpr (Traits::kAhead) return int(cur_e & kAheadTileMask);
    if constexpr (Traits::kSkip) return cur.tile;
    return n;
  }
  // skip_ahead: the current entry (the tile and the two groups' bits).
  __device__ __forceinline__ std::uint32_t entry() const { return cur_e; }
  __device__ __forceinline__ void advance() {
    if constexpr (Traits::kAhead) {
      ++n;
      cur_e = next_e;
      next_e = n + 1 < count ? __ldg(list + n + 1) : 0u;
    } else if constexpr (Traits::kSkip) {
      cur.advance();
    } else {
      ++n;
    }
  }
};

// Seeded maxima (SPEC §2a): each voting row's running max (or, for the screen ahead, its lower
// bound) starts at its seed, in raw-score units (the seed is in lse's units, scale * score);
// +inf becomes NaN (a row the NaN rule makes NaN: its rescale would be inf - inf; the reference
// refuses it on the host). Without seeds, or past the sequence end, m is left as it is.
template <int kRows>
__device__ __forceinline__ void load_seed_max(PrefillParams const& p, PrefillWork const& w, int const (&row)[kRows],
                                              float (&m)[kRows]) {
  if (p.seed_max == nullptr) return;
  const std::int64_t base = (p.cu_q != nullptr ? 0 : std::int64_t(w.b)) * p.seed_batch +
                            std::int64_t(w.h) * p.seed_head + std::int64_t(w.q_start) * p.seed_row;
  CUTLASS_PRAGMA_UNROLL
  for (int mi = 0; mi < kRows; ++mi) {
    if (row[mi] < w.q_len) {
      const float s = p.seed_max[base + std::int64_t(row[mi]) * p.seed_row];
      m[mi] = s == INFINITY ? NAN : s / p.scale;
    }
  }
}

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
    TileWalk<Traits> walk_k(kp, w), walk_v(kp, w);
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
    TileWalk<Traits> walk(kp, w);
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

// The delta histogram (SPEC §5) of consumer warpgroup cwg, binned by one warp of the producer
// warpgroup (warp 1 + cwg; skip_hist only). It joins the warpgroup's vote barrier of every tile
// (voting keep = false, so the vote is unchanged) and, after the barrier of tile n, reads the 32
// quad deltas of tile n-1 that the barrier orders, reduces them to delta_G (running_max: NaN
// stays NaN, the top bin), bins it with the policy's rule and counts it once when the tile is
// visible to the group. The last tile comes through kBarHistLast0 + cwg. Its work overlaps the
// consumers' next tile, so the vote barrier never waits for it; it holds the producer
// warpgroup's 24 registers.
template <class Traits>
__device__ __forceinline__ void hist_warp_run(KernelParams<Traits> const& kp, PrefillWork const& w,
                                              typename Traits::SharedStorage& ss, int cwg) {
  const PrefillParams& p = kp.p;
  const int lane = threadIdx.x % 32;
  const int n_vis = visible_tiles(w.m_block * Traits::kBlockM + cwg * 64, 64, w.q_len, w.k_len,
                                  p.causal, Traits::kBlockN);
  unsigned long long* const head_hist = p.hist + std::size_t(w.h) * kHistSlots;
  const float* const slots = &ss.hist_delta[cwg][0][0];
  auto bin_tile = [&](int n, int tile) {
    float d = slots[(n & 1) * Traits::kHistDeltaSlots + lane];
    d = running_max(d, __shfl_xor_sync(0xffffffffu, d, 1));
    d = running_max(d, __shfl_xor_sync(0xffffffffu, d, 2));
    d = warp_delta(d);
    if (lane == 0 && tile < n_vis && p.hist != nullptr) atomicAdd(head_hist + hist_bin(d), 1ull);
  };
  TileWalk<Traits> walk(kp, w);
  int prev_tile = 0;
  for (int n = 0; n < w.n_max; ++n) {
    named_sync_or(kBarVote0 + cwg, Traits::kVoteThreads, false);
    if (n > 0) bin_tile(n - 1, prev_tile);
    prev_tile = walk.tile();
    walk.advance();
  }
  named_sync(kBarHistLast0 + cwg, Traits::kVoteThreads);
  bin_tile(w.n_max - 1, prev_tile);
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

  if constexpr (Traits::kSkip) load_seed_max(p, w, row, sm.m);

  float ln_lambda = -INFINITY;  // -inf: this sequence skips nothing (SPEC §3)
  int n_vis = 0;
  if constexpr (Traits::kSkip) {
    ln_lambda = p.threshold.template log_lambda<false>(w.k_len);
    n_vis = visible_tiles(row0 + cwg * 64, 64, w.q_len, w.k_len, p.causal, kBlockN);
  }
  // ln(lambda) = -inf never skips; the vote still runs (statistics, and no shortcut that would
  // make the 0 %-sparsity cost look smaller than with a real lambda).
  const bool can_skip = ln_lambda > -INFINITY;
  int n_skipped = 0;
  [[maybe_unused]] int n_listed_vis = 0;  // skip_ahead: listed tiles visible to the group
  // Non-null: the skip set is recorded (SPEC §9; skip_record and skip_hist instances only, null
  // elsewhere so its code folds away). set_row: bit index of this vote group's tile 0. For tiles
  // [0, kSetWindowTiles) the bits are gathered in one register spread over the warp (lane l holds
  // tiles [32 l, 32 l + 32)): one shift and one OR per thread, no memory access, no branch;
  // skip_record gathers the KEPT tiles, on the kept-tile path, whose exponentials leave issue
  // slots free, so the short skipped-tile path carries only the window test (warp-uniform);
  // skip_hist gathers the skipped ones on the skipped path (Traits::kRecordKept). Warp 0 of the
  // warpgroup writes the skipped visible tiles once, after the loop (record_set_bits). Tiles past
  // the window (sequences of more than 128K keys) are set one by one when skipped, by the
  // warpgroup's first thread, as before (the branch is in the plain skip kernel's place).
  std::uint32_t* const skip_set = Traits::kRecordSet ? p.skip_set : nullptr;
  const bool record_lane = skip_set != nullptr && mma_tid % 128 == 0;  // the warpgroup's first thread
  const long long set_row =
      (static_cast<long long>(w.b * p.hq + w.h) * p.set_groups + (row0 / 64 + cwg)) * p.set_tiles;
  constexpr int kSetWindowTiles = 32 * 32;
  [[maybe_unused]] std::uint32_t set_bits = 0;  // this lane's 32 tiles of the window
  const int lane_tile0 = 32 * (threadIdx.x % 32);  // the first of them

  // Histogram (skip_hist): the consumer's whole part is one thread_delta and one shared store per
  // quad right after the vote (off the vote's path, while the P V product of the tile before
  // runs); the warpgroup's histogram warp (hist_warp_run, in the producer warpgroup) reads the
  // slots of tile n after the vote barrier of tile n+1, which it joins, and bins them. Before:
  // shuffles and a store in every warp, and warp 0 binning and counting in the S wgmma's wait
  // (+10-13 % over the skip kernel on the H200; the vote barrier waited for warp 0).
  [[maybe_unused]] float* const hist_slot =
      &ss.hist_delta[cwg][0][((mma_tid / 32) % 4) * 8 + (threadIdx.x % 32) / 4];  // [parity][quad]
  [[maybe_unused]] const bool quad_leader = threadIdx.x % 4 == 0;

  cutlass::arch::ClusterTransactionBarrier::wait(&ss.barrier_q, 0);

  TileWalk<Traits> walk(kp, w);        // the key tile of step n
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
    if constexpr (kPV != 0) warpgroup_wait<1>(); else warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    pipe_k.consumer_release(st);

    const int tile = walk.tile();  // masks and counts go by the key tile
    // skip_ahead: the plan skips this tile for this group (the other one needs it). The warp vote
    // makes the entry's bit uniform for ptxas; it is the same in every thread.
    bool planned = false;
    if constexpr (Traits::kAhead) planned = __any_sync(0xffffffffu, ((walk.entry() >> (30 + cwg)) & 1u) == 0u);
    walk.advance();                // (the next step's tile: off this step's critical path)
    if (tile_needs_mask(tile, kBlockN, row0, w.q_len, w.k_len, p.causal)) {
      apply_mask(tSrS_rc, tScS_rc, row0, tile * kBlockN, w.q_len, w.k_len, p.causal);
    }
    float tmax[kRows];
    sm.template tile_max<Traits::kTreeMax>(tSrS_rc, tmax);

    bool skip = false;
    if constexpr (Traits::kSkip) {
      const bool keep = vote_keep(tmax, sm.m, row, w.q_len, p.scale, ln_lambda);
      if (planned) {
        skip = true;  // the plan's decision stands (SPEC §2b); no vote (every warp of the group agrees)
      } else {
        // One BAR.RED of per-thread predicates decides (no warpgroup max on the softmax's path;
        // bar.red also orders shared memory like bar.sync, which the histogram slots rely on).
        const bool any_keep = named_sync_or(kBarVote0 + cwg, Traits::kVoteThreads, keep);
        if constexpr (Traits::kHist) {
          // This quad's delta of tile n (m is still the maximum before the tile), for the
          // histogram warp after the next vote barrier; the slot of this parity was read before
          // the barrier just passed.
          const float d = thread_delta(tmax, sm.m, row, w.q_len, p.scale);
          if (quad_leader) hist_slot[(n & 1) * Traits::kHistDeltaSlots] = d;
        }
        // The BAR.RED gives all 128 threads the same answer, but ptxas cannot know it: a branch
        // on it counts as divergent, and then the loop kept its loop-carried state (pipeline
        // stages, wgmma descriptors, the visit cursor) in vector registers, moved to uniform
        // ones before every wgmma (R2UR), with BSSY/BSYNC reconvergence around the branches. The
        // warp vote of an equal value is that value, and ptxas knows its result is uniform
        // (VOTEU).
        skip = __any_sync(0xffffffffu, can_skip && !any_keep);
      }
      n_skipped += skip && tile < n_vis ? 1 : 0;
      if constexpr (Traits::kAhead) n_listed_vis += tile < n_vis ? 1 : 0;
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
        // Past the window, the skip set's bit, after the V stages are released (off the vote ->
        // release path); tile is warp-uniform, so the window test is a uniform branch.
        if constexpr (Traits::kRecordSet) {
          if constexpr (!Traits::kRecordKept) set_bits |= shl_or_zero(1u, std::uint32_t(tile - lane_tile0));
          if (tile >= kSetWindowTiles) red_or_bit(skip_set, set_row + tile, record_lane && tile < n_vis);
        }
      }
    }
    float alpha[kRows];
    if (!skip) sm.update(tSrS_rc, tmax, p.scale_log2, alpha);
    if constexpr (!Traits::kEarlyV) finish_v_prev();
    if (!skip) {
      // A kept tile's bit, into the lane that holds it (a shift past 31 gives 0 in the others).
      if constexpr (Traits::kRecordKept) set_bits |= shl_or_zero(1u, std::uint32_t(tile - lane_tile0));
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
  // The last tile's deltas to the histogram warp: a full barrier on both sides (bar.sync), not
  // the arrive / sync pair PTX allows for this hand-off, which compute-sanitizer's racecheck
  // reported as a race between these slot stores and the histogram warp's last read (ee6aec0).
  // The wait is once per work tile, for a warp that is one tile behind.
  if constexpr (Traits::kHist) named_sync(kBarHistLast0 + cwg, Traits::kVoteThreads);
  if constexpr (Traits::kRecordSet) {
    // Every warp of the warpgroup holds the same bits; warp 0 writes the skipped ones (kept:
    // the complement), visible only (< n_vis; the window ends at 1024 tiles, past the last lane).
    if (skip_set != nullptr && (mma_tid / 32) % 4 == 0) {
      record_set_bits(skip_set, set_row, lane_tile0, Traits::kRecordKept ? ~set_bits : set_bits, n_vis);
    }
  }
  // The walk visits every tile of [0, n_max) once, and [0, n_vis) are the visible ones: no
  // per-step count.
  cnt.visited = static_cast<unsigned long long>(n_vis);
  cnt.skipped = static_cast<unsigned long long>(n_skipped);
  // skip_ahead: the visible tiles the plan did not list were skipped by both groups.
  if constexpr (Traits::kAhead) cnt.skipped += static_cast<unsigned long long>(n_vis - n_listed_vis);
}

}  // namespace blasst::sm90::prefill
