// Internal: the mma.sync backward main kernel (one CTA per (key block, KV head, sequence), 8 warps)
// and its host launcher. Included through backward_launch.hpp by the generated instance files
// (src/cuda/sm90/kernel_table.inc).
// The preprocess (D, LSE in log2 units) and postprocess (dQ) kernels are in backward_prepost.cu.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "blasst/blasst.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/sm90/backward/backward_epilogue.hpp"
#include "cuda/sm90/backward/backward_mainloop.hpp"
#include "cuda/sm90/backward/backward_tile_scheduler.hpp"
#include "cuda/sm90/backward/backward_traits.hpp"
#include "cuda/sm90/common/element.hpp"
#include "cuda/sm90/kernel_table.hpp"

namespace blasst::sm90::backward {

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1) backward_kernel(CUTE_GRID_CONSTANT BackwardParams const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Element = typename Traits::Element;
  using SharedStorage = typename Traits::SharedStorage;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);

  // The CTA's work lives in shared memory: read once per step, it would otherwise hold registers
  // across the step's register peak (ptxas at d = 128: a 24-byte spill).
  __shared__ BackwardWork w_shared;
  {
    BackwardWork wr;
    const bool mine = BackwardScheduler::get<kBlockM, kBlockN>(p, wr);
    if (!mine) return;  // uniform: the whole CTA
    if (threadIdx.x == 0) w_shared = wr;
    __syncthreads();
  }
  const BackwardWork& w = w_shared;
  const int tid = int(threadIdx.x);
  const int n0 = w.n_block * kBlockN;

  // SPEC §9: a key block whose steps the skip set removes for every query head of the CTA costs
  // no work, not even the K / V loads.
  if (!__syncthreads_or(BackwardScheduler::kept_share(p, w, tid, Traits::kNumThreads))) {
    write_dkdv_zero<Traits>(p, w, tid);
    return;
  }

  auto const* k = static_cast<Element const*>(p.k);
  auto const* v = static_cast<Element const*>(p.v);
  int hh = w.hh_begin, m = w.m_begin;  // the current step: query head w.kh * g + hh, query block m
  bool have = BackwardScheduler::next_kept(p, w, hh, m);  // true: `any` found one
  load_tile_async<Traits, kBlockN>(ss.k, k + key_offset(p.k_s, w, n0), p.k_s.row, w.len_k - n0, k, tid);
  load_tile_async<Traits, kBlockN>(ss.v, v + key_offset(p.v_s, w, n0), p.v_s.row, w.len_k - n0, v, tid);
  if (have) load_q_dout_async<Traits>(p, w, ss, 0, w.kh * p.group + hh, m, tid);
  cp_async_fence();

  typename Traits::TiledMmaDKV mma_dkv;
  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kD>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kD>>{});
  clear(acc_dk);
  clear(acc_dv);

  // Steps the skip set removes are never visited: no loads, no scores, no work (uniform over the
  // CTA). Q / dO of the next kept step load into the other stage while this one computes; that
  // stage was last read by the previous step, whose closing barrier every thread has passed.
  static_assert(Traits::kQStages == 2, "two Q / dO stages: the current step's and the next one's");
  int stage = 0;
  while (have) {
    const int h = w.kh * p.group + hh;
    int next_hh = hh, next_m = m + 1;
    const bool next = BackwardScheduler::next_kept(p, w, next_hh, next_m);
    if (next) load_q_dout_async<Traits>(p, w, ss, stage ^ 1, w.kh * p.group + next_hh, next_m, tid);
    cp_async_fence();  // possibly empty: the wait below counts groups
    if (tid < kBlockM) {
      const int row = m * kBlockM + tid;
      const std::int64_t at = std::int64_t(h) * p.rows_ld + w.row_start + row;
      ss.lse_log2[tid] = row < w.len_q ? p.lse_log2[at] : INFINITY;
      ss.dsum[tid] = row < w.len_q ? p.dsum[at] : 0.f;
    }
    cp_async_wait<1>();  // every group but the newest (the next step's) has landed
    __syncthreads();     // this step's Q, dO, LSE, D (and K, V on the first step) visible to all
    backward_step<Traits>(p, w, ss, stage, h, m, tid, acc_dk, acc_dv);
    __syncthreads();     // every read of this step's tiles done before they are overwritten
    stage ^= 1;
    hh = next_hh;
    m = next_m;
    have = next;
  }
  write_dkdv<Traits>(p, w, tid, acc_dk, acc_dv);
#endif
}

template <class Traits>
void launch_backward(const BackwardParams& p, cudaStream_t stream) {
  auto kernel = backward_kernel<Traits>;
  ::blasst::detail::set_max_dynamic_smem<&backward_kernel<Traits>>(Traits::kSmemBytes);
  const dim3 grid = BackwardScheduler::grid(p);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  kernel<<<grid, Traits::kNumThreads, Traits::kSmemBytes, stream>>>(p);
  BLASST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace blasst::sm90::backward
