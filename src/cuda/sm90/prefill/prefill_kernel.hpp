// Internal: the warp-specialized sm_90a prefill kernel and its host launcher. Warpgroup 0
// produces (TMA), warpgroups 1..2 consume (wgmma + softmax), each owning 64 query rows.
// Included only by the generated instance files (src/cuda/sm90/kernel_table.inc).
#pragma once

#include <cuda_runtime.h>

#include <cutlass/arch/reg_reconfig.h>

#include "blasst/blasst.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/sm90/prefill/prefill_epilogue.hpp"
#include "cuda/sm90/prefill/prefill_screen.hpp"
#include "cuda/sm90/common/element.hpp"
#include "cuda/sm90/kernel_table.hpp"

namespace blasst::sm90::prefill {

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    prefill_kernel(CUTE_GRID_CONSTANT KernelParams<Traits> const kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using SharedStorage = typename Traits::SharedStorage;
  using Pipeline = typename Traits::Pipeline;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);

  PrefillWork w;
  if (!HeavyFirstScheduler::get<Traits::kBlockM, Traits::kBlockN>(kp.p, w)) return;
  // skip_ahead: the CTA's steps are the entries of its plan (SPEC §2b screen ahead).
  if constexpr (Traits::kAhead) w.n_max = kp.plan.count[blockIdx.x];

  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int wg_idx = cutlass::canonical_warp_group_idx();
  if (warp_idx == 0 && cute::elect_one_sync()) {
    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());
    if constexpr (Traits::kScreen) {
      cute::prefetch_tma_descriptor(kp.tma_q8.get_tma_descriptor());
      cute::prefetch_tma_descriptor(kp.tma_k8.get_tma_descriptor());
    }
    cutlass::arch::ClusterTransactionBarrier::init(&ss.barrier_q, 1);
  }

  typename Pipeline::Params pp;
  pp.transaction_bytes = Traits::kTmaBytesKV;
  pp.role = wg_idx == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = Traits::kNumMmaThreads;
  // The screen's K stage carries the K8 tile too (one barrier, both transactions).
  if constexpr (Traits::kScreen) pp.transaction_bytes = Traits::kTmaBytesKV + Traits::kTmaBytesK8;
  Pipeline pipe_k(ss.pipe_k, pp, Shape<_1, _1, _1>{});
  if constexpr (Traits::kScreen) pp.transaction_bytes = Traits::kTmaBytesKV;
  Pipeline pipe_v(ss.pipe_v, pp, Shape<_1, _1, _1>{});
  __syncthreads();  // barrier initialisation visible to every thread

  if (wg_idx == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kRegProducer>();
    // skip_hist: warps 1 and 2 bin the delta histogram of consumer warpgroups 0 and 1 (one branch
    // or the other: nothing of one stays live across the other in the 24 registers).
    const int hist_cwg = int(threadIdx.x / 32) - 1;
    if (Traits::kHist && hist_cwg >= 0 && hist_cwg < Traits::kNumMmaWG) {
      if (w.n_max > 0) hist_warp_run<Traits>(kp, w, ss, hist_cwg);
    } else if (threadIdx.x == 0 && w.n_max > 0) {
      if constexpr (Traits::kScreen) producer_run_screen<Traits>(kp, w, ss, pipe_k, pipe_v);
      else producer_run<Traits>(kp, w, ss, pipe_k, pipe_v);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kRegConsumer>();
    const int mma_tid = int(threadIdx.x) - 128;
    typename Traits::TiledMmaPV mma1;
    Tensor tOrO = partition_fragment_C(mma1, select<0, 1>(typename Traits::TileShapePV{}));
    clear(tOrO);
    constexpr int kRows = decltype(size<0>(make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()))))::value;
    OnlineSoftmax<kRows> sm;
    SkipCounters cnt;
    if constexpr (Traits::kPingPong) {
      // The first consumer warpgroup issues first.
      if (mma_tid >= 128) named_arrive(kBarSched0 + 0, Traits::kNumMmaThreads);
    }
    if constexpr (Traits::kScreen) {
      ScreenCounters scnt;
      if (w.n_max > 0) consumer_mainloop_screen<Traits>(kp, w, ss, pipe_k, pipe_v, mma_tid, tOrO, sm, cnt, scnt);
      epilogue<Traits>(kp, w, mma_tid, tOrO, sm);
      if (mma_tid % 128 == 0) {
        if (kp.p.visited != nullptr) {
          atomicAdd(kp.p.visited + w.h, cnt.visited);
          atomicAdd(kp.p.skipped + w.h, cnt.skipped);
        }
        if (kp.s.screened != nullptr) atomicAdd(kp.s.screened + w.h, scnt.screened);
        if (Traits::kScreenCheck && kp.s.screen_wrong != nullptr) atomicAdd(kp.s.screen_wrong + w.h, scnt.wrong);
      }
    } else {
    if (w.n_max > 0) consumer_mainloop<Traits>(kp, w, ss, pipe_k, pipe_v, mma_tid, tOrO, sm, cnt);
    epilogue<Traits>(kp, w, mma_tid, tOrO, sm);
    if constexpr (Traits::kSkip) {
      if (kp.p.visited != nullptr && mma_tid % 128 == 0) {
        atomicAdd(kp.p.visited + w.h, cnt.visited);
        atomicAdd(kp.p.skipped + w.h, cnt.skipped);
      }
    }
    }
  }
#endif
}

template <class Traits>
void launch_prefill(const PrefillParams& p, cudaStream_t stream) {
  using Element = typename Traits::Element;
  KernelParams<Traits> kp;
  kp.p = p;
  const bool ragged = p.cu_q != nullptr;
  const int nb = ragged ? 1 : p.batch;
  auto make_layout_g = [&](int rows, int heads, std::int64_t rs, std::int64_t hs, std::int64_t bs) {
    // A batch stride is needed even with one sequence; any multiple of 16 bytes will do.
    if (nb == 1) bs = rs * rows;
    return typename Traits::GLayout(
        make_shape(int32_t(rows), Int<Traits::kHeadDim>{}, int32_t(heads), int32_t(nb)),
        make_stride(rs, _1{}, hs, bs));
  };
  kp.layout_q = make_layout_g(p.rows_q, p.hq, p.q_row, p.q_head, p.q_batch);
  kp.layout_k = make_layout_g(p.rows_k, p.hk, p.k_row, p.k_head, p.k_batch);
  kp.layout_v = make_layout_g(p.rows_k, p.hk, p.v_row, p.v_head, p.v_batch);
  auto gq = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.q)), kp.layout_q);
  auto gk = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.k)), kp.layout_k);
  auto gv = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.v)), kp.layout_v);
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gq, typename Traits::SmemLayoutQ{},
                           Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{}, _1{});
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gk, take<0, 2>(typename Traits::SmemLayoutK{}),
                           Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{}, _1{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gv, take<0, 2>(typename Traits::SmemLayoutV{}),
                           Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{}, _1{});

  if constexpr (Traits::kAhead) kp.plan = static_cast<const PrefillAheadParams&>(p).plan;
  if constexpr (Traits::kScreen) {
    // The screen instances are called with a PrefillScreenParams (prefill_api.cu).
    const ScreenArgs& s = static_cast<const PrefillScreenParams&>(p).screen;
    kp.s = s;
    auto layout8 = [&](int rows, int heads) {  // contiguous (nb, rows, heads, d) e4m3
      const std::int64_t rs = std::int64_t(heads) * Traits::kHeadDim;
      return typename Traits::GLayout8(
          make_shape(int32_t(rows), Int<Traits::kHeadDim>{}, int32_t(heads), int32_t(nb)),
          make_stride(rs, _1{}, std::int64_t(Traits::kHeadDim), rs * rows));
    };
    kp.layout_q8 = layout8(p.rows_q, p.hq);
    kp.layout_k8 = layout8(p.rows_k, p.hk);
    using E8 = typename Traits::Element8;
    auto gq8 = make_tensor(make_gmem_ptr(static_cast<E8 const*>(s.q8)), kp.layout_q8);
    auto gk8 = make_tensor(make_gmem_ptr(static_cast<E8 const*>(s.k8)), kp.layout_k8);
    kp.tma_q8 = make_tma_copy(SM90_TMA_LOAD{}, gq8, typename Traits::SmemLayoutQ8{},
                              Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{}, _1{});
    kp.tma_k8 = make_tma_copy(SM90_TMA_LOAD{}, gk8, take<0, 2>(typename Traits::SmemLayoutK8{}),
                              Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{}, _1{});
  }
  const int smem = int(sizeof(typename Traits::SharedStorage));
  auto kernel = prefill_kernel<Traits>;
  ::blasst::detail::set_max_dynamic_smem<&prefill_kernel<Traits>>(smem);
  const dim3 grid = HeavyFirstScheduler::grid(p);
  if (grid.x == 0 || grid.y == 0) return;
  kernel<<<grid, Traits::kNumThreads, smem, stream>>>(kp);
  BLASST_CUDA_CHECK(cudaGetLastError());
}

// One instance of kernel_table.inc (declared in kernel_table.hpp).
template <DType E, int kHeadDim, KernelVariant V>
void launch(const PrefillParams& p, cudaStream_t stream) {
  launch_prefill<PrefillTraits<typename Element<E>::cute, kHeadDim, V>>(p, stream);
}

}  // namespace blasst::sm90::prefill

