// Internal: the warp-specialised sm_90a backward kernel (TMA + wgmma; BackwardWgmmaTraits) and its
// host launcher. Same work split, skip-set walk, preprocess / postprocess and workspace as the
// mma.sync kernel of backward_kernel.hpp (SPEC §9); per step (query head h, query block m of
// kBlockM rows: 64 at d = 128, 128 at d = 64):
//   S^T = K Q^T, dP^T = V dO^T                          (SS wgmma, 64 keys per warpgroup)
//   P^T = exp2(S^T * scale_log2 - LSE_log2), masked;  dS^T = P^T * (dP^T - D)     (registers)
//   dV += P^T dO (RS wgmma, A from registers; issued before dS is formed, runs under it)
//   dS^T -> shared memory (stmatrix.trans);  dQ = dS K (SS wgmma over all 128 keys: half the
//   head dim per warpgroup at d = 128, half the rows at d = 64), then dK += dS^T Q (RS wgmma),
//   which runs while dQ goes to shared memory and into the f32 workspace by one bulk reduce-add
//   per warpgroup.
// Included only by the generated instance files (src/cuda/sm90/kernel_table.inc).
#pragma once


#include <cuda_runtime.h>

#include <cutlass/arch/reg_reconfig.h>

#include <algorithm>

#include "blasst/blasst.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/sm90/backward/backward_epilogue.hpp"
#include "cuda/sm90/backward/backward_tile_scheduler.hpp"
#include "cuda/sm90/backward/backward_wgmma_traits.hpp"
#include "cuda/sm90/common/element.hpp"
#include "cuda/sm90/common/ptx.hpp"
#include "cuda/sm90/common/wgmma.hpp"
#include "cuda/sm90/kernel_table.hpp"

namespace blasst::sm90::backward {

template <class Traits>
struct WgmmaParams {
  BackwardParams p;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaQ tma_do;
  typename Traits::TmaK tma_k;
  typename Traits::TmaK tma_v;
  typename Traits::GLayout layout_q, layout_do, layout_k, layout_v;
};

// Named barriers of the two consumer warpgroups (0 is __syncthreads): dS full (both halves of the
// step's dS buffer written).
inline constexpr int kBarDsFull = 2;
inline constexpr int kBarTileZeroed = 3;  // rows past a ragged sequence's end zeroed (below)
inline constexpr int kBarDqFull = 4;      // + warpgroup: its dQ tile is in shared memory (128 threads)

// Ragged batches: a tile's TMA reads past its sequence's end into the next sequence (the tensor's
// extent is the whole token axis). Rows [valid, rows) of a landed tile are zeroed by the consumer
// threads so that they add exactly 0 to every product (a masked P of 0 times a NaN there would
// not), as the mma.sync kernel's zero-filled loads do; then made visible to the wgmma reads.
template <class Element, class TileT>
__device__ void zero_rows_from(TileT&& tile, int valid, int tid, int nthreads) {
  constexpr int kRows = decltype(size<0>(tile))::value, kCols = decltype(size<1>(tile))::value;
  for (int e = valid * kCols + tid; e < kRows * kCols; e += nthreads) tile(e / kCols, e % kCols) = Element(0.f);
}

template <class Traits>
__device__ void wg_producer(WgmmaParams<Traits> const& kp, BackwardWork const& w,
                            typename Traits::SharedStorage& ss, typename Traits::Pipeline& pipe,
                            const std::uint32_t* kept_words) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  constexpr int kVoteRows = Traits::kVoteRows;
  const BackwardParams& p = kp.p;
  const bool ragged = p.cu_q != nullptr;
  Tensor mQ = kp.tma_q.get_tma_tensor(shape(kp.layout_q));
  Tensor mdO = kp.tma_do.get_tma_tensor(shape(kp.layout_do));
  Tensor mK = kp.tma_k.get_tma_tensor(shape(kp.layout_k));
  Tensor mV = kp.tma_v.get_tma_tensor(shape(kp.layout_v));
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});

  // K and V of the CTA's key block, once.
  Tensor gK = local_tile(seq_view(mK, w.kh, w.b, w.k_start, ragged), Shape<Int<kBlockN>, Int<kD>>{},
                         make_coord(w.n_block, _0{}));
  Tensor gV = local_tile(seq_view(mV, w.kh, w.b, w.k_start, ragged), Shape<Int<kBlockN>, Int<kD>>{},
                         make_coord(w.n_block, _0{}));
  auto [tKgK, tKsK] = tma_partition(kp.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tVgV, tVsV] = tma_partition(kp.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.barrier_kv, 2 * Traits::kTmaBytesK);
  copy(kp.tma_k.with(ss.barrier_kv), tKgK, tKsK);
  copy(kp.tma_v.with(ss.barrier_kv), tVgV, tVsV);

  // Q and dO of every kept step, in the consumers' order: each slot's vote group by its own TMA
  // copies and LSE / D bulk copies; the step's groups published in the step ring first.
  constexpr int G = Traits::kGroupsPerStep;
  auto st = cutlass::make_producer_start_state<typename Traits::Pipeline>();
  int x = 0;
  BackwardStep<G> step{};
  bool have = BackwardScheduler::next_step<G>(p, w, kept_words, x, step);
  for (int k = 0; have; ++k) {
    BackwardStep<G> next{};
    const bool more = BackwardScheduler::next_step<G>(p, w, kept_words, x, next);
    int* e = ss.steps.data() + (k % Traits::kStepRing) * Traits::kStepInts;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < G; ++r) {
      e[Traits::kStepHh + r] = step.hh[r];
      e[Traits::kStepG + r] = step.g[r];
    }
    e[Traits::kStepLive] = int(step.live);
    e[Traits::kStepLast] = int(!more);
    pipe.producer_acquire(st);  // its arrive releases the entry to the consumers' wait
    auto* full = pipe.producer_get_barrier(st);
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < G; ++r) {
      const int h = w.kh * p.group + step.hh[r];
      Tensor gQ = local_tile(seq_view(mQ, h, w.b, w.q_start, ragged), Shape<Int<kVoteRows>, Int<kD>>{},
                             make_coord(step.g[r], _0{}));
      Tensor gdO = local_tile(seq_view(mdO, h, w.b, w.q_start, ragged), Shape<Int<kVoteRows>, Int<kD>>{},
                              make_coord(step.g[r], _0{}));
      Tensor sQs = make_tensor(make_smem_ptr(ss.q.data() + Traits::slot_offset(st.index(), r)),
                               typename Traits::SmemLayoutSlot{});
      Tensor sdOs = make_tensor(make_smem_ptr(ss.dout.data() + Traits::slot_offset(st.index(), r)),
                                typename Traits::SmemLayoutSlot{});
      auto [tQgQ, tQsQ] = tma_partition(kp.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQs), group_modes<0, 2>(gQ));
      auto [tdOgdO, tdOsdO] =
          tma_partition(kp.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdOs), group_modes<0, 2>(gdO));
      copy(kp.tma_q.with(*full), tQgQ, tQsQ);
      copy(kp.tma_do.with(*full), tdOgdO, tdOsdO);
      // The group's LSE and D: kVoteRows consecutive f32 of the padded workspace rows (aligned runs).
      const std::int64_t at = std::int64_t(h) * p.rows_ld + w.row_start + step.g[r] * kVoteRows;
      const int to = st.index() * kBlockM + r * kVoteRows;
      SM90_BULK_COPY_G2S::copy(p.lse_log2 + at, full, ss.lse.data() + to, Traits::kBulkBytesSlot);
      SM90_BULK_COPY_G2S::copy(p.dsum + at, full, ss.dsum.data() + to, Traits::kBulkBytesSlot);
    }
    ++st;
    step = next;
    have = more;
  }
}

// dQ of one step and warpgroup: the accumulator (its 64 x 64 tile: rows of the warpgroup's slot,
// columns dq_col0(wg)..) into the warpgroup's shared buffer in the workspace's tile order
// (dq_in_tile: the fragment's values 4 at a time, thread-minor: 8 16-byte stores a thread, a
// warp's 512 bytes consecutive), then one thread adds the buffer into the f32 workspace's tile of
// (query head h, padded_row) with a 16 KB bulk reduce-add, unless add is false (a slot that is not
// live). Rows past the sequence's end land in its padding rows of the workspace, which nothing
// reads (their dS is 0 anyway).
template <class Traits, class Acc>
__device__ void wg_store_dq(const BackwardParams& p, int h, std::int64_t padded_row, int wg, int wg_tid, bool add,
                            Acc const& acc, float* sdq_tile) {
  static_assert(decltype(size(Acc{}))::value == Traits::kDqTileFloats / 128, "one 64 x 64 tile per warpgroup");
  const std::uint32_t base = smem_u32(sdq_tile) + 16u * std::uint32_t(wg_tid);
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < size(acc) / 4; ++k)
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(base + 16u * 128u * std::uint32_t(k)),
                 "f"(acc(4 * k)), "f"(acc(4 * k + 1)), "f"(acc(4 * k + 2)), "f"(acc(4 * k + 3))
                 : "memory");
  cutlass::arch::fence_view_async_shared();  // generic-proxy stores -> the bulk copy (async proxy) read
  named_sync(kBarDqFull + wg, 128);
  if (wg_tid == 0 && add) {
    bulk_reduce_add_f32(p.dq_accum + dq_tile_offset(h, padded_row, Traits::dq_col0(wg), p.rows_ld, Traits::kHeadDim),
                        smem_u32(sdq_tile), Traits::kDqTileBytes);
    tma_store_arrive();
  }
}

// The values of a step's per-row array in shared memory (LSE or D) at this thread's rows, column
// ni of its (key, row) accumulator view, into registers: the rows of columns (ni, ni + 1), ni even,
// are adjacent and the first even (GMMA's C layout; tests/gpu_backward/test_wgmma_layouts.cu),
// so one 8-byte load each pair.
template <int kCols, class Coords>
__device__ __forceinline__ void load_row_pairs(const float* rows, Coords const& rc, float (&out)[kCols]) {
  static_assert(kCols % 2 == 0, "column pairs");
  CUTLASS_PRAGMA_UNROLL
  for (int ni = 0; ni < kCols; ni += 2) {
    const float2 v = *reinterpret_cast<const float2*>(rows + get<1>(rc(0, ni)));
    out[ni] = v.x;
    out[ni + 1] = v.y;
  }
}

template <class Traits>
__device__ void wg_consumer(WgmmaParams<Traits> const& kp, BackwardWork const& w,
                            typename Traits::SharedStorage& ss, typename Traits::Pipeline& pipe, int mma_tid) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  const BackwardParams& p = kp.p;

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaDKV mma_dkv;
  typename Traits::TiledMmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(mma_tid);
  auto thr_dkv = mma_dkv.get_thread_slice(mma_tid);
  // dQ: one tiled product of both warpgroups, split over the head dim (d = 128) or the rows (d = 64).
  const int wg = mma_tid / 128;
  auto thr_dq = mma_dq.get_thread_slice(mma_tid);

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutDO{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQt{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKt{});
  Tensor sdS = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutDS{});
  Tensor sdSt = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutDSt{});

  Tensor tSrK = thr_sdp.partition_fragment_A(sK);     // S^T:  A = K (this warpgroup's keys)
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);     //       B = Q   (.., stage)
  Tensor tPrV = thr_sdp.partition_fragment_A(sV);     // dP^T: A = V
  Tensor tPrdO = thr_sdp.partition_fragment_B(sdO);   //       B = dO  (.., stage)
  Tensor tVrdOt = thr_dkv.partition_fragment_B(sdOt); // dV:   B = dO^T (.., stage)
  Tensor tKrQt = thr_dkv.partition_fragment_B(sQt);   // dK:   B = Q^T  (.., stage)
  Tensor tQrdS = thr_dq.partition_fragment_A(sdS);  // dQ:   A = dS  (the warpgroup's rows, all keys; buffer)
  Tensor tQrKt = thr_dq.partition_fragment_B(sKt);  //       B = K^T (the warpgroup's columns, all keys)
  // dS^T stores: stmatrix.trans of the S^T-shaped fragment into the (keys, rows) view of the dS tile.
  auto r2s_ds = make_tiled_copy_C(typename Traits::SmemCopyAtomDS{}, mma_sdp);
  auto thr_r2s_ds = r2s_ds.get_thread_slice(mma_tid);
  Tensor tdSsdS = thr_r2s_ds.partition_D(as_position_independent_swizzle_tensor(sdSt));
  const int wg_tid = mma_tid % 128;
  float* sdq_tile = ss.dq.data() + wg * Traits::kDqTileFloats;

  Tensor acc_dk = partition_fragment_C(mma_dkv, select<0, 1>(typename Traits::TileShapeDKV{}));
  Tensor acc_dv = partition_fragment_C(mma_dkv, select<0, 1>(typename Traits::TileShapeDKV{}));
  clear(acc_dk);
  clear(acc_dv);

  Tensor cS = make_identity_tensor(select<0, 1>(typename Traits::TileShapeSdP{}));  // (key, row)
  Tensor tScS = thr_sdp.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  constexpr int kKeys = decltype(size<0>(tScS_rc))::value;  // key rows of the fragment
  constexpr int kCols = decltype(size<1>(tScS_rc))::value;  // query rows of the fragment
  const int n0 = w.n_block * kBlockN;
  const int diag = w.len_k - w.len_q;  // causal: row i sees key j iff j <= i + diag (SPEC §1)

  const bool ragged = p.cu_q != nullptr;
  cutlass::arch::ClusterTransactionBarrier::wait(&ss.barrier_kv, 0);
  if (ragged && n0 + kBlockN > w.len_k) {  // the same answer in every consumer thread
    zero_rows_from<Element>(sK, w.len_k - n0, mma_tid, Traits::kNumMmaThreads);
    zero_rows_from<Element>(sV, w.len_k - n0, mma_tid, Traits::kNumMmaThreads);
    cutlass::arch::fence_view_async_shared();
    named_sync(kBarTileZeroed, Traits::kNumMmaThreads);
  }
  typename Traits::PipelineState st;
  constexpr int G = Traits::kGroupsPerStep;
  constexpr int kVoteRows = Traits::kVoteRows;
  static_assert(Traits::kDsStages == 2, "dS buffers alternate by step");
  int ds_buf = 0;
  // The slot whose rows this warpgroup's dQ tile holds (d = 64: one group per warpgroup; d = 128:
  // the step's one group, half the head dim each).
  const int dq_slot = Traits::dq_row0(wg) / kVoteRows;
  static_assert(Traits::kStepRing == 2 * Traits::kStages, "step k's entry: its stage and phase");
  for (;;) {
    pipe.consumer_wait(st);
    // The step's groups (the producer's ring entry k % kStepRing, ordered by the stage's full
    // barrier): slot r is rows [64 r, 64 r + 64) of the stage, vote group e[kStepG + r] of query
    // head e[kStepHh + r] of the KV group; a slot whose live bit is clear repeats the one before
    // it and is masked. Read where used (held across the step, they spilled at d = 64).
    const int* e = ss.steps.data() + (st.index() + Traits::kStages * int(st.phase())) * Traits::kStepInts;
    const unsigned live = unsigned(e[Traits::kStepLive]);
    // LSE (log2; +inf for a row that saw no key or lies in the padding: P = 0) and D of the step's
    // rows, in the stage (read where used: nothing held across the products). A 2D TMA load of
    // the unpadded [hq, tokens] rows faulted at its UTMALDG.2D in the CTAs of every sequence but
    // the first (3e724fe); these are plain 1D bulk copies of aligned runs.
    const float* s_lse = ss.lse.data() + st.index() * kBlockM;
    const float* s_dsum = ss.dsum.data() + st.index() * kBlockM;
    // Masking only where the step can hold an invisible pair (block edges, the causal diagonal, a
    // slot that is not live); the same answer in every thread.
    bool masked = n0 + kBlockN > w.len_k || live != (1u << G) - 1;
    bool zeroed = false;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < G; ++r) {
      const int r0 = e[Traits::kStepG + r] * kVoteRows;
      // Causal: the slot's first row (the one that sees the fewest keys) must see the block's last key.
      masked |= r0 + kVoteRows > w.len_q || (p.causal && n0 + kBlockN - 1 > r0 + diag);
      if (ragged && r0 + kVoteRows > w.len_q) {
        zero_rows_from<Element>(make_tensor(make_smem_ptr(ss.q.data() + Traits::slot_offset(st.index(), r)),
                                            typename Traits::SmemLayoutSlot{}),
                                w.len_q - r0, mma_tid, Traits::kNumMmaThreads);
        zero_rows_from<Element>(make_tensor(make_smem_ptr(ss.dout.data() + Traits::slot_offset(st.index(), r)),
                                            typename Traits::SmemLayoutSlot{}),
                                w.len_q - r0, mma_tid, Traits::kNumMmaThreads);
        zeroed = true;
      }
    }
    if (zeroed) {
      cutlass::arch::fence_view_async_shared();
      named_sync(kBarTileZeroed, Traits::kNumMmaThreads);
    }
    // The LSE of this thread's rows into registers before S^T and dP^T are issued. Loaded after
    // the issue, the loads queued behind the sixteen wgmma instructions and their latency stood
    // before the first exponential (ncu, 92ff929, d128 full 8k: 10 % of the stall samples on its
    // first FFMA, short scoreboard; 2026-12-06, loaded after the wait: ~9 %). At most 16 (d = 64's
    // 32 rows a thread: 16 early ones and the rest loaded in the loop keep ptxas' spills where
    // they were; all 32 spilled 116 B).
    constexpr int kLseEarly = kCols < 16 ? kCols : 16;
    float lse_r[kLseEarly];
    load_row_pairs<kLseEarly>(s_lse, tScS_rc, lse_r);
    Tensor tSrS = partition_fragment_C(mma_sdp, select<0, 1>(typename Traits::TileShapeSdP{}));
    Tensor tSrdP = partition_fragment_C(mma_sdp, select<0, 1>(typename Traits::TileShapeSdP{}));
    wg_gemm<true, -1, false>(mma_sdp, tSrK, tSrQ(_, _, _, st.index()), tSrS);
    wg_gemm<true, -1, false>(mma_sdp, tPrV, tPrdO(_, _, _, st.index()), tSrdP);

    Tensor S = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    Tensor dP = make_tensor(tSrdP.data(), acc_rowcol(tSrdP.layout()));
    // Row ni of the thread's (key, row) view sees the keys below key_end(ni): none past the
    // sequence's rows or in a slot that is not live, else those before len_k and, causal, up to
    // its diagonal. One bound per row, used at once by its keys (a bound per pair, or per-row
    // terms held across the walk, spilled at d = 64's 32 rows a thread). The slot of column ni
    // is a constant of ni (vote_group_of_col), so its group is one shared-memory read.
    auto key_end = [&](int ni) {
      const int slot = Traits::vote_group_of_col(ni);
      const int row = e[Traits::kStepG + slot] * kVoteRows + get<1>(tScS_rc(0, ni)) - slot * kVoteRows;
      const bool vis_row = row < w.len_q && ((live >> slot) & 1u) != 0;
      return !vis_row ? 0 : p.causal ? min(w.len_k, row + diag + 1) : w.len_k;
    };
    // f(mi, ni, visible) over this thread's (key, row) pairs, row by row; the mask tested on
    // masked steps only. f computes its value for every pair and then selects it (straight-line
    // code: a conditional value compiled to a branch around each pair, ~830 instructions a step
    // where an unmasked one has ~140; cuobjdump, 2026-12-06).
    auto each_pair = [&](auto&& f) {
      if (masked) {
        CUTLASS_PRAGMA_UNROLL
        for (int ni = 0; ni < kCols; ++ni) {
          const int end = key_end(ni);
          CUTLASS_PRAGMA_UNROLL
          for (int mi = 0; mi < kKeys; ++mi) f(mi, ni, n0 + get<0>(tScS_rc(mi, ni)) < end);
        }
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int ni = 0; ni < kCols; ++ni) {
          CUTLASS_PRAGMA_UNROLL
          for (int mi = 0; mi < kKeys; ++mi) f(mi, ni, true);
        }
      }
    };
    // P^T = exp2(S^T scale_log2 - LSE_log2) on visible pairs, 0 elsewhere; computed while dP^T runs.
    warpgroup_wait<1>();
    warpgroup_fence_operand(tSrS);
    each_pair([&](int mi, int ni, bool vis) {
      const float lse = ni < kLseEarly ? lse_r[ni % kLseEarly] : s_lse[get<1>(tScS_rc(mi, ni))];
      const float v = exp2_ftz(fmaf(S(mi, ni), p.scale_log2, -lse));
      S(mi, ni) = vis ? v : 0.f;
    });
    // D of the thread's rows into registers before dV is issued (loaded after the dP^T wait, the
    // loads stood before the subtractions: ~3.5 % of the stall samples, ncu of 92ff929, d128).
    // Only where all of a thread's rows fit in 16 (d = 128): d = 64's spills grew 88 -> 272 B.
    constexpr int kDsumEarly = kCols <= 16 ? kCols : 0;
    constexpr int kDsumSlots = kDsumEarly > 0 ? kDsumEarly : 1;  // (no zero-length array)
    float dsum_r[kDsumSlots];
    if constexpr (kDsumEarly > 0) load_row_pairs<kDsumEarly>(s_dsum, tScS_rc, dsum_r);
    Tensor p_lp = convert_frag<Element>(tSrS);
    Tensor tPrP = make_tensor(p_lp.data(), acc_to_a(p_lp.layout()));  // the dV product's A operand
    // dV += P^T dO, under the dS arithmetic below.
    wg_gemm<false, -1, true>(mma_dkv, tPrP, tVrdOt(_, _, _, st.index()), acc_dv);

    // dS^T = P^T (dP^T - D) on visible pairs, 0 elsewhere.
    warpgroup_wait<1>();  // dP^T landed (dV may still run)
    warpgroup_fence_operand(tSrdP);
    each_pair([&](int mi, int ni, bool vis) {
      const float dsum = ni < kDsumEarly ? dsum_r[ni % kDsumSlots] : s_dsum[get<1>(tScS_rc(mi, ni))];
      const float v = S(mi, ni) * (dP(mi, ni) - dsum);
      dP(mi, ni) = vis ? v : 0.f;
    });
    Tensor ds_lp = convert_frag<Element>(tSrdP);
    Tensor tdSrdS = make_tensor(ds_lp.data(), acc_to_a(ds_lp.layout()));  // the dK product's A operand

    // dS^T into this step's buffer (the other one may still be read by the dQ products of the
    // step before); each dQ product reads both warpgroups' dS: a barrier of all 256 threads. The
    // same barrier holds every thread until each warpgroup's TMA thread has seen its previous dQ
    // reduce-add read the dQ tile (issued a step ago), before this step's dQ stores below.
    copy(r2s_ds, thr_r2s_ds.retile_S(ds_lp), tdSsdS(_, _, _, ds_buf));
    cutlass::arch::fence_view_async_shared();  // generic-proxy stores -> the wgmma (async proxy) reads
    if (wg_tid == 0) tma_store_wait<0>();
    named_sync(kBarDsFull, Traits::kNumMmaThreads);

    // dQ before dK, so that dQ's way out (shared memory, barrier, bulk reduce-add) runs while the
    // tensor cores do dK.
    Tensor acc_dq = partition_fragment_C(mma_dq, select<0, 1>(typename Traits::TileShapeDQ{}));
    Tensor tQrdS_buf = tQrdS(_, _, _, ds_buf);
    wg_gemm<true, -1, false>(mma_dq, tQrdS_buf, tQrKt, acc_dq);
    wg_gemm<false, -1, true>(mma_dkv, tdSrdS, tKrQt(_, _, _, st.index()), acc_dk);
    warpgroup_wait<1>();  // dV and dQ done (dK may run)
    warpgroup_fence_operand(acc_dq);
    // The warpgroup's rows: its slot's group (a slot that is not live adds nothing).
    wg_store_dq<Traits>(p, w.kh * p.group + e[Traits::kStepHh + dq_slot],
                        std::int64_t(w.row_start) + std::int64_t(e[Traits::kStepG + dq_slot]) * kVoteRows, wg,
                        wg_tid, ((live >> dq_slot) & 1u) != 0, acc_dq, sdq_tile);
    warpgroup_wait<0>();  // dK done: its A (dS^T registers) and B (Q^T of the stage) are read
    warpgroup_fence_operand(acc_dk);
    warpgroup_fence_operand(acc_dv);
    warpgroup_fence_operand(tPrP);
    warpgroup_fence_operand(tdSrdS);
    pipe.consumer_release(st);  // Q and dO of this stage (and the step's ring entry) are read
    ++st;
    ds_buf ^= 1;
    if (e[Traits::kStepLast] != 0) break;  // rewritten for step k + kStepRing only after step k + 1 is released
  }
  if (wg_tid == 0) tma_store_wait<0>();  // the last reduce-add has read the dQ tile

  // dK = scale * acc_dk, dV = acc_dv for the valid keys of the block.
  Tensor cKV = make_identity_tensor(select<0, 1>(typename Traits::TileShapeDKV{}));  // (key, col)
  Tensor tc = thr_dkv.partition_C(cKV);
  static_assert(decltype(size(tc))::value == decltype(size(acc_dk))::value, "dK fragment and coordinates");
  static_assert(decltype(size<0, 0>(acc_dk.layout()))::value == 2, "column pairs innermost");
  // A GMMA C fragment holds column pairs (c, c + 1), c even, of one key at consecutive indices:
  // one 4-byte store each where dK's / dV's pointer and strides allow (ncu: the element-wise
  // 2-byte stores made 75 % of the kernel's global sectors excess).
  // A part of a split block (w.part >= 0) writes f32 pairs to its slot (dkv_part_at: rows of
  // d floats from key 0 of the block) instead of dK / dV; one loop either way.
  const bool part = w.part >= 0;
  void* const dk = part ? static_cast<void*>(dkv_part_at(p, w, 0, 0, 0)) : p.dk;
  void* const dv = part ? static_cast<void*>(dkv_part_at(p, w, 1, 0, 0)) : p.dv;
  const bool dk_f32 = part || p.dk_f32, dv_f32 = part || p.dv_f32;
  const bool dk_pairs = part || rows_vectorizable(p.dk, p.dk_s, p.dk_f32 ? 4 : 2, 2);
  const bool dv_pairs = part || rows_vectorizable(p.dv, p.dv_s, p.dv_f32 ? 4 : 2, 2);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(acc_dk); i += 2) {
    const int key = n0 + get<0>(tc(i)), col = get<1>(tc(i));
    if (key < w.len_k) {
      const std::int64_t slot = std::int64_t(key - n0) * Traits::kHeadDim + col;
      store_pair<Element>(dk, part ? slot : key_offset(p.dk_s, w, key) + col, dk_f32, dk_pairs, acc_dk(i) * p.scale,
                          acc_dk(i + 1) * p.scale);
      store_pair<Element>(dv, part ? slot : key_offset(p.dv_s, w, key) + col, dv_f32, dv_pairs, acc_dv(i),
                          acc_dv(i + 1));
    }
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    backward_wgmma_kernel(CUTE_GRID_CONSTANT WgmmaParams<Traits> const kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Pipeline = typename Traits::Pipeline;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& ss = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  const BackwardParams& p = kp.p;

  BackwardWork w;
  // The CTA's query blocks in vote groups: the steps take kept groups wherever they lie.
  if (!BackwardScheduler::get<Traits::kVoteRows, Traits::kBlockN>(p, w)) return;  // uniform: the whole CTA
  const int tid = int(threadIdx.x);
  // SPEC §9: a key block whose vote groups the skip set removes for every query head of the CTA
  // costs no work, not even the K / V loads.
  // The CTA's kept groups into shared memory when there is a skip set and they fit (uniform).
  const std::uint32_t* kept_words =
      p.skip_bits != nullptr && BackwardScheduler::kept_words_needed(p, w) <= Traits::kKeptWords ? ss.kept.data()
                                                                                                : nullptr;
  const int kept_here = kept_words != nullptr
                            ? BackwardScheduler::load_kept_words(p, w, ss.kept.data(), tid, Traits::kNumThreads)
                            : BackwardScheduler::kept_share(p, w, tid, Traits::kNumThreads);
  if (!__syncthreads_or(kept_here)) {
    write_dkdv_zero<Traits>(p, w, tid);
    return;
  }

  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int wg_idx = cutlass::canonical_warp_group_idx();
  if (warp_idx == 0 && cute::elect_one_sync()) {
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    cutlass::arch::ClusterTransactionBarrier::init(&ss.barrier_kv, 1);
  }
  typename Pipeline::Params pp;
  pp.transaction_bytes = Traits::kStageBytes;  // Q, dO, LSE and D of one step
  pp.role = wg_idx == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = Traits::kNumMmaThreads;
  Pipeline pipe(ss.pipe_qdo, pp, Shape<_1, _1, _1>{});
  __syncthreads();  // barrier initialisation visible to every thread

  if (wg_idx == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kRegProducer>();
    if (threadIdx.x == 0) wg_producer<Traits>(kp, w, ss, pipe, kept_words);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kRegConsumer>();
    wg_consumer<Traits>(kp, w, ss, pipe, tid - 128);
  }
#endif
}

template <class Traits>
void launch_backward_wgmma(const BackwardParams& p, cudaStream_t stream) {
  using Element = typename Traits::Element;
  WgmmaParams<Traits> kp;
  kp.p = p;
  const bool ragged = p.cu_q != nullptr;
  const int nb = ragged ? 1 : p.batch;
  // (tokens, d, heads, batch); a descriptor needs one row at least (an empty query axis issues no
  // load) and a batch stride even with one sequence (any multiple of 16 bytes will do).
  auto make_layout_g = [&](int rows, int heads, const RowStrides& s) {
    rows = std::max(rows, 1);
    const std::int64_t bs = nb == 1 ? s.row * rows : s.batch;
    return typename Traits::GLayout(make_shape(int32_t(rows), Int<Traits::kHeadDim>{}, int32_t(heads), int32_t(nb)),
                                    make_stride(s.row, _1{}, s.head, bs));
  };
  const int rows_q = ragged ? p.tokens_q : p.len_q;
  const int rows_k = ragged ? p.tokens_k : p.len_k;
  kp.layout_q = make_layout_g(rows_q, p.hq, p.q_s);
  kp.layout_do = make_layout_g(rows_q, p.hq, p.dout_main_s);
  kp.layout_k = make_layout_g(rows_k, p.hk, p.k_s);
  kp.layout_v = make_layout_g(rows_k, p.hk, p.v_s);
  auto gq = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.q)), kp.layout_q);
  auto gdo = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.dout_main)), kp.layout_do);
  auto gk = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.k)), kp.layout_k);
  auto gv = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.v)), kp.layout_v);
  using TileQ = Shape<Int<Traits::kVoteRows>, Int<Traits::kHeadDim>>;  // one slot (vote group)
  using TileK = Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>;
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gq, typename Traits::SmemLayoutSlot{}, TileQ{}, _1{});
  kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, gdo, typename Traits::SmemLayoutSlot{}, TileQ{}, _1{});
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gk, typename Traits::SmemLayoutK{}, TileK{}, _1{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gv, typename Traits::SmemLayoutV{}, TileK{}, _1{});

  auto kernel = backward_wgmma_kernel<Traits>;
  ::blasst::detail::set_max_dynamic_smem<&backward_wgmma_kernel<Traits>>(Traits::kSmemBytes);
  const dim3 grid = BackwardScheduler::grid(p);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  kernel<<<grid, Traits::kNumThreads, Traits::kSmemBytes, stream>>>(kp);
  BLASST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace blasst::sm90::backward
