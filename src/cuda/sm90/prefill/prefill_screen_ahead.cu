// The SPEC §2b screen ahead on sm_90a. One CTA per 128 query rows (the pass's CTA, same 1-D grid
// and scheduler): the producer warp (warp 8) loads Q8 once and the K8 tiles in the CTA's visit
// order through a TMA pipeline; warpgroups 0 and 1 (the two 64-row vote groups) compute
// S8 = Q8 K8^T by FP8 wgmma per tile, each row's FP8 tile maximum over its visible keys, the upper
// bound up (times the scales, rounded upwards, plus the margin) and the lower bound low (rounded
// downwards, minus the margin), vote on up against the row's lower bound lo of its running maximum
// (the skip kernel's row test), then raise lo to low, whatever the decision. Nothing waits for the
// vote: each warp ORs "this tile is needed" into its group's bit in shared memory. At the end one
// warp walks the visit order again and writes the CTA's list of needed tiles (with both groups'
// bits), its count, and the screened pairs of the head.
// Units as in prefill_screen.hpp: raw scores (q . k) and raw margins; the vote scales.
#include "cuda/sm90/prefill/prefill_screen_ahead.hpp"

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "blasst/blasst.hpp"
#include "core/visit_cursor.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/sm90/prefill/prefill_screen.hpp"

namespace blasst::sm90::prefill {

namespace {

// The screen ahead's shape: the skip_screen instance's FP8 operands (one function of the head
// dim), four K8 stages, the two groups' decision bits.
template <int kD>
struct AheadTraits {
  using Base = PrefillTraits<cutlass::bfloat16_t, kD, KernelVariant::skip_screen>;
  using Element8 = typename Base::Element8;
  static constexpr int kBlockM = Base::kBlockM, kBlockN = Base::kBlockN;
  static constexpr int kNumMmaWG = Base::kNumMmaWG;
  static constexpr int kNumMmaThreads = Base::kNumMmaThreads;
  // Two CTAs per SM: the two consumer warpgroups (warps 0-7, warpgroup-aligned for wgmma) and one
  // producer warp (warp 8; one thread issues the TMA loads): 288 threads at <= 112 registers, two
  // CTAs in 65536. With one CTA of 384 threads per SM (114 registers) the pre-pass was neither
  // issue- nor tensor-bound (2026-12-06: ~1100-1300 cycles per step pair against ~480 issue and
  // ~512 tensor cycles; two FP8 accumulators per warpgroup did not move it): latency with two
  // consumer warpgroups per SM.
  static constexpr int kCtasPerSm = 2;
  static constexpr int kProducerWarp = kNumMmaThreads / 32;
  static constexpr int kNumThreads = kNumMmaThreads + 32;
  static constexpr int kStages = 4;
  // S8 = Q8 K8^T accumulated in f16 (the in-loop screen's is f32): half the accumulator registers,
  // and each row's maximum as packed half2 maxima (HMNMX2: two scores per instruction). The codes
  // are at most kScreenCodeMax = 16 in magnitude (SPEC §2b), so every partial sum is at most
  // 256 d <= 32768 in magnitude: no f16 overflow at d <= 128. Its rounding is in the margin
  // (ScreenArgs::gamma_fp8, prefill_api.cu).
  using ElementAcc8 = cutlass::half_t;
  using TiledMmaQK8 = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element8, Element8, ElementAcc8, Shape<_64, Int<kBlockN>, Int<kD>>>(),
      typename Base::AtomLayoutMma{}));
  static_assert(256 * kD <= 65504, "the f16 accumulator of the screen ahead overflows at this head dim");
  using SmemLayoutQ8 = typename Base::SmemLayoutQ8;
  using SmemLayoutK8 =
      decltype(tile_to_shape(typename Base::SmemAtom8{}, Shape<Int<kBlockN>, Int<kD>, Int<kStages>>{}));
  using GLayout8 = typename Base::GLayout8;
  using TmaQ8 = typename Base::TmaQ8;
  using TmaK8 = decltype(make_tma_copy(SM90_TMA_LOAD{}, Base::dummy_gtensor8(), take<0, 2>(SmemLayoutK8{}),
                                       Shape<Int<kBlockN>, Int<kD>>{}, _1{}));
  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;
  struct SharedStorage {
    cute::array_aligned<Element8, cute::cosize_v<SmemLayoutQ8>, 1024> q8;
    cute::array_aligned<Element8, cute::cosize_v<SmemLayoutK8>, 1024> k8;
    typename Pipeline::SharedStorage pipe;
    cutlass::arch::ClusterTransactionBarrier::ValueType barrier_q;
    std::uint32_t need[kNumMmaWG][kAheadMaxTiles / 32];  // bit t: the group needs tile t
  };
  static_assert(kCtasPerSm * (sizeof(SharedStorage) + 1024) <= 228 * 1024,
                "screen-ahead shared memory exceeds the sm_90 limit for its CTAs per SM");
};

template <int kD>
struct AheadKernelParams {
  PrefillParams p;
  ScreenArgs s;
  AheadPlan plan;
  typename AheadTraits<kD>::TmaQ8 tma_q8;
  typename AheadTraits<kD>::TmaK8 tma_k8;
  typename AheadTraits<kD>::GLayout8 layout_q8;
  typename AheadTraits<kD>::GLayout8 layout_k8;
};

// NaN-propagating maximum of two packed f16 pairs (HMNMX2.NAN).
__device__ __forceinline__ std::uint32_t hmax2_nan(std::uint32_t a, std::uint32_t b) {
  std::uint32_t d;
  asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// t[i] = max(t[i], t[i + W]) for i < W, then W / 2, ..., down to W = 2 (the two rows stay apart).
template <int W>
__device__ __forceinline__ void half2_tree_max(std::uint32_t* t) {
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < W; ++i) t[i] = hmax2_nan(t[i], t[i + W]);
  if constexpr (W > 2) half2_tree_max<W / 2>(t);
}

// Each of the thread's two rows' maximum over the f16 accumulator acc (NaN propagating, as
// running_max) in float. GMMA's C fragment is ((2 cols, 2 rows, N / 8 column groups)): element
// pair i (one 32-bit register) is two columns of row i % 2, so the rows fold by HMNMX2.NAN on the
// packed registers, then the pair's halves, then the quad of lanes that shares the rows.
template <class TAcc>
__device__ __forceinline__ void half_tile_max(TAcc& acc, float (&m)[2]) {
  Tensor reg = recast<std::uint32_t>(acc);
  constexpr int kPairs = decltype(size(reg))::value;
  static_assert(kPairs % 2 == 0 && ((kPairs / 2) & (kPairs / 2 - 1)) == 0, "a power of two of pairs per row");
  std::uint32_t t[kPairs];
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < kPairs; ++i) t[i] = reg(i);
  half2_tree_max<kPairs / 2>(t);  // t[2j + r]: row r; j folded, both rows in step
  // t[0] = (row 0: col a, col b), t[1] the same for row 1: fold into (row 0, row 1)
  std::uint32_t x = hmax2_nan(__byte_perm(t[0], t[1], 0x5410), __byte_perm(t[0], t[1], 0x7632));
  x = hmax2_nan(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = hmax2_nan(x, __shfl_xor_sync(0xffffffffu, x, 2));
  m[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(x & 0xffffu)));
  m[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(x >> 16)));
}

// One consumer warpgroup (vote group cwg): the FP8 scores of every tile of the CTA's visit order,
// the bounds, the vote against lo, the decision bits.
template <int kD>
__device__ __forceinline__ void ahead_consumer(AheadKernelParams<kD> const& kp, PrefillWork const& w,
                                               typename AheadTraits<kD>::SharedStorage& ss,
                                               typename AheadTraits<kD>::Pipeline& pipe, int mma_tid) {
  using T = AheadTraits<kD>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN;
  const PrefillParams& p = kp.p;
  const ScreenArgs& sa = kp.s;
  const int cwg = mma_tid / 128;

  typename T::TiledMmaQK8 mma8;
  auto thr8 = mma8.get_thread_slice(mma_tid);
  Tensor sQ8 = make_tensor(make_smem_ptr(ss.q8.data()), typename T::SmemLayoutQ8{});
  Tensor sK8 = make_tensor(make_smem_ptr(ss.k8.data()), typename T::SmemLayoutK8{});
  Tensor tSrQ8 = thr8.partition_fragment_A(sQ8);
  Tensor tSrK8 = thr8.partition_fragment_B(sK8);
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS8 = thr8.partition_C(cS);
  Tensor tScS8_rc = make_tensor(tScS8.data(), acc_rowcol(tScS8.layout()));
  constexpr int kRows = decltype(size<0>(tScS8_rc))::value;
  static_assert(kRows == 2, "half_tile_max folds two rows per thread");

  const int row0 = w.m_block * kBlockM;
  int row[kRows];
  CUTLASS_PRAGMA_UNROLL
  for (int mi = 0; mi < kRows; ++mi) row[mi] = row0 + int(get<0>(tScS8_rc(mi, 0)));

  // lo: the lower bounds of the running maxima (raw units), from the seeds as the pass's m.
  float lo[kRows];
  CUTLASS_PRAGMA_UNROLL
  for (int mi = 0; mi < kRows; ++mi) lo[mi] = -INFINITY;
  load_seed_max(p, w, row, lo);
  ScreenRow qrow[kRows];
  load_screen_rows(sa, p, w, row, qrow);
  const float4* const kt_seq = screen_key_tiles(sa, p, w);
  const float ln_lambda = p.threshold.template log_lambda<false>(w.k_len);
  const int n_vis = visible_tiles(row0 + cwg * 64, 64, w.q_len, w.k_len, p.causal, kBlockN);
  // A sequence that cannot skip (lambda >= 1) needs every tile visible to the group.
  const bool can_skip = ln_lambda > -INFINITY;
  const bool lane0 = threadIdx.x % 32 == 0;

  cutlass::arch::ClusterTransactionBarrier::wait(&ss.barrier_q, 0);
  ::blasst::detail::VisitCursor cur(w.n_max, w.own);
  typename T::PipelineState st;
  for (int n = 0; n < w.n_max; ++n) {
    const int tile = cur.tile;
    cur.advance();
    const float4 kt = __ldg(kt_seq + tile);  // {KN, KT, EK, sk}
    Tensor acc8 = partition_fragment_C(mma8, Shape<Int<kBlockM>, Int<kBlockN>>{});
    Tensor acc8_rc = make_tensor(acc8.data(), acc_rowcol(acc8.layout()));
    pipe.consumer_wait(st);
    wg_gemm<true, 0, false>(mma8, tSrQ8, tSrK8(_, _, _, st.index()), acc8);
    pipe.consumer_release(st);
    ++st;
    if (tile_needs_mask(tile, kBlockN, row0, w.q_len, w.k_len, p.causal))
      apply_mask(acc8_rc, tScS8_rc, row0, tile * kBlockN, w.q_len, w.k_len, p.causal);
    float m8[kRows], up[kRows], low[kRows];
    half_tile_max(acc8, m8);
    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < kRows; ++mi) {
      // max and a positive scale commute, and directed rounding is monotone: the FP8 tile
      // maximum's bounds (prefill_screen.hpp). No visible key: the row neither votes nor moves lo.
      const float margin = screen_margin(qrow[mi], kt, sa);
      const float hi_s = __fmul_ru(__fmul_ru(m8[mi], kt.w), qrow[mi].sq);
      const float lo_s = __fmul_rd(__fmul_rd(m8[mi], kt.w), qrow[mi].sq);
      const bool none = m8[mi] == -INFINITY;
      up[mi] = none ? -INFINITY : __fadd_ru(hi_s, margin);
      low[mi] = none ? -INFINITY : __fsub_rd(lo_s, margin);
    }
    const bool keep = can_skip ? vote_keep(up, lo, row, w.q_len, p.scale, ln_lambda) : tile < n_vis;
    CUTLASS_PRAGMA_UNROLL
    for (int mi = 0; mi < kRows; ++mi) lo[mi] = running_max(lo[mi], low[mi]);
    if (__any_sync(0xffffffffu, keep) && lane0) atomicOr(&ss.need[cwg][tile >> 5], 1u << (tile & 31));
  }
}

template <int kD>
__global__ void __launch_bounds__(AheadTraits<kD>::kNumThreads, AheadTraits<kD>::kCtasPerSm)
    screen_ahead_kernel(CUTE_GRID_CONSTANT AheadKernelParams<kD> const kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using T = AheadTraits<kD>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& ss = *reinterpret_cast<typename T::SharedStorage*>(smem_raw);
  const PrefillParams& p = kp.p;

  PrefillWork w;
  if (!HeavyFirstScheduler::get<kBlockM, kBlockN>(p, w)) return;
  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const bool producer = warp_idx == T::kProducerWarp;
  const int lane = int(threadIdx.x % 32);
  if (warp_idx == 0 && cute::elect_one_sync()) {
    cute::prefetch_tma_descriptor(kp.tma_q8.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k8.get_tma_descriptor());
    cutlass::arch::ClusterTransactionBarrier::init(&ss.barrier_q, 1);
  }
  const int words = (w.n_max + 31) / 32;
  for (int i = int(threadIdx.x); i < T::kNumMmaWG * words; i += T::kNumThreads) ss.need[i / words][i % words] = 0u;

  typename T::Pipeline::Params pp;
  pp.transaction_bytes = T::Base::kTmaBytesK8;
  pp.role = producer ? T::Pipeline::ThreadCategory::Producer : T::Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == T::kNumMmaThreads;
  pp.num_consumers = T::kNumMmaThreads;
  typename T::Pipeline pipe(ss.pipe, pp, Shape<_1, _1, _1>{});
  __syncthreads();  // barriers and zeroed bits visible to every thread

  if (w.n_max > 0) {
    if (producer) {
      if (threadIdx.x == T::kNumMmaThreads) {
        const bool ragged = p.cu_q != nullptr;
        const int hk = w.h / p.group;
        Tensor mQ8 = kp.tma_q8.get_tma_tensor(shape(kp.layout_q8));
        Tensor mK8 = kp.tma_k8.get_tma_tensor(shape(kp.layout_k8));
        Tensor gQ8 = local_tile(seq_view(mQ8, w.h, w.b, w.q_start, ragged), Shape<Int<kBlockM>, Int<kD>>{},
                                make_coord(w.m_block, _0{}));
        Tensor gK8 = local_tile(seq_view(mK8, hk, w.b, w.k_start, ragged), Shape<Int<kBlockN>, Int<kD>>{},
                                make_coord(_, _0{}));
        Tensor sQ8 = make_tensor(make_smem_ptr(ss.q8.data()), typename T::SmemLayoutQ8{});
        Tensor sK8 = make_tensor(make_smem_ptr(ss.k8.data()), typename T::SmemLayoutK8{});
        auto [tQgQ8, tQsQ8] =
            tma_partition(kp.tma_q8, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ8), group_modes<0, 2>(gQ8));
        auto [tKgK8, tKsK8] =
            tma_partition(kp.tma_k8, _0{}, Layout<_1>{}, group_modes<0, 2>(sK8), group_modes<0, 2>(gK8));
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.barrier_q, T::Base::kTmaBytesQ8);
        copy(kp.tma_q8.with(ss.barrier_q), tQgQ8, tQsQ8);
        auto st = cutlass::make_producer_start_state<typename T::Pipeline>();
        ::blasst::detail::VisitCursor cur(w.n_max, w.own);
        for (int n = 0; n < w.n_max; ++n) {
          pipe.producer_acquire(st);
          copy(kp.tma_k8.with(*pipe.producer_get_barrier(st)), tKgK8(_, cur.tile), tKsK8(_, st.index()));
          cur.advance();
          ++st;
        }
      }
    } else {
      ahead_consumer<kD>(kp, w, ss, pipe, int(threadIdx.x));
    }
  }
  __syncthreads();  // every group's bits

  // The plan: warp 0 walks the visit order 32 steps at a time and lists the needed tiles.
  if (warp_idx == 0) {
    std::uint32_t* const list = kp.plan.list + std::size_t(blockIdx.x) * std::size_t(kp.plan.stride);
    ::blasst::detail::VisitCursor cur(w.n_max, w.own);
    int count = 0;
    for (int base = 0; base < w.n_max; base += 32) {
      int my_tile = -1;
      for (int i = 0; i < 32 && base + i < w.n_max; ++i) {
        if (i == lane) my_tile = cur.tile;
        cur.advance();
      }
      std::uint32_t e = 0u;
      if (my_tile >= 0) {
        const std::uint32_t b0 = (ss.need[0][my_tile >> 5] >> (my_tile & 31)) & 1u;
        const std::uint32_t b1 = (ss.need[1][my_tile >> 5] >> (my_tile & 31)) & 1u;
        e = (b0 | b1) != 0u ? std::uint32_t(my_tile) | (b0 << 30) | (b1 << 31) : 0u;
      }
      const bool listed = e != 0u;  // a listed entry has a group bit
      const std::uint32_t ball = __ballot_sync(0xffffffffu, listed);
      if (listed) list[count + __popc(ball & ((1u << lane) - 1u))] = e;
      count += __popc(ball);
    }
    // Screened pairs (SPEC §2b statistics): a group's visible tiles it does not need. Its bits
    // lie on visible tiles only (a row without a visible key does not vote; lambda >= 1 needs
    // exactly the visible ones).
    int kept = 0;
    for (int i = lane; i < words; i += 32) kept += __popc(ss.need[0][i]) + __popc(ss.need[1][i]);
    for (int o = 16; o > 0; o >>= 1) kept += __shfl_xor_sync(0xffffffffu, kept, o);
    if (lane == 0) {
      kp.plan.count[blockIdx.x] = count;
      if (kp.s.screened != nullptr) {
        const int row0 = w.m_block * kBlockM;
        const int vis = visible_tiles(row0, 64, w.q_len, w.k_len, p.causal, kBlockN) +
                        visible_tiles(row0 + 64, 64, w.q_len, w.k_len, p.causal, kBlockN);
        atomicAdd(kp.s.screened + w.h, static_cast<unsigned long long>(vis - kept));
      }
    }
  }
#endif
}

template <int kD>
void launch_ahead(const PrefillScreenParams& sp, const AheadPlan& plan, cudaStream_t stream) {
  using T = AheadTraits<kD>;
  AheadKernelParams<kD> kp;
  kp.p = sp;
  kp.s = sp.screen;
  kp.plan = plan;
  const int nb = sp.cu_q != nullptr ? 1 : sp.batch;
  auto layout8 = [&](int rows, int heads) {  // contiguous (nb, rows, heads, d) e4m3, as launch_prefill's
    const std::int64_t rs = std::int64_t(heads) * kD;
    return typename T::GLayout8(make_shape(int32_t(rows), Int<kD>{}, int32_t(heads), int32_t(nb)),
                                make_stride(rs, _1{}, std::int64_t(kD), rs * rows));
  };
  kp.layout_q8 = layout8(sp.rows_q, sp.hq);
  kp.layout_k8 = layout8(sp.rows_k, sp.hk);
  using E8 = typename T::Element8;
  auto gq8 = make_tensor(make_gmem_ptr(static_cast<E8 const*>(sp.screen.q8)), kp.layout_q8);
  auto gk8 = make_tensor(make_gmem_ptr(static_cast<E8 const*>(sp.screen.k8)), kp.layout_k8);
  kp.tma_q8 = make_tma_copy(SM90_TMA_LOAD{}, gq8, typename T::SmemLayoutQ8{}, Shape<Int<T::kBlockM>, Int<kD>>{}, _1{});
  kp.tma_k8 = make_tma_copy(SM90_TMA_LOAD{}, gk8, take<0, 2>(typename T::SmemLayoutK8{}),
                            Shape<Int<T::kBlockN>, Int<kD>>{}, _1{});
  const int smem = int(sizeof(typename T::SharedStorage));
  ::blasst::detail::set_max_dynamic_smem<&screen_ahead_kernel<kD>>(smem);
  const dim3 grid = HeavyFirstScheduler::grid(sp);
  if (grid.x == 0) return;
  screen_ahead_kernel<kD><<<grid, T::kNumThreads, smem, stream>>>(kp);
  BLASST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void screen_ahead(const PrefillScreenParams& p, int d, const AheadPlan& plan, cudaStream_t stream) {
  if (d == 128) return launch_ahead<128>(p, plan, stream);
  if (d == 64) return launch_ahead<64>(p, plan, stream);
  throw Error("the FP8 screen ahead has no instance for d = " + std::to_string(d) + " (64 or 128)");
}

}  // namespace blasst::sm90::prefill
