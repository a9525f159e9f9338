// Split-KV Skip-Softmax decode kernel for sm_90a (see docs/decode_kernel.md): the kernel wires
// the parts of one CTA, and each instance's host-side launch and occupancy live here. Included only
// by the generated instance files (kernel_table.inc).
//
// One CTA = one (sequence b, KV head h, split s) (decode_scheduler.cuh). Its rows are all g query
// heads x q_len tokens of the KV group (row r = token * g + head-in-group, R = g * q_len <= 64,
// padded to 16-row MMA tiles), so every K/V byte is read once per group. Keys are visited in
// 128-key tiles (the SPEC §2 tile); the vote group for the skip is every row of the CTA.
//   - decode_traits.hpp: warps, ring depths, fragment shapes, the shared-memory layout;
//   - decode_mainloop.cuh: K/V rings, Q staging, seed prologue, scores and vote, online softmax,
//     P.V (the pipeline is described there);
//   - decode_epilogue.cuh: the normalised fp32 partial (O, LSE) that decode_merge.cu combines.
#pragma once

#include <cuda_runtime.h>

#include "cuda/cuda_check.hpp"
#include "cuda/sm90/decode/decode_epilogue.cuh"
#include "cuda/sm90/decode/decode_mainloop.cuh"
#include "cuda/sm90/decode/decode_params.hpp"
#include "cuda/sm90/decode/decode_scheduler.cuh"
#include "cuda/sm90/decode/decode_trace.cuh"
#include "cuda/sm90/decode/decode_traits.hpp"

namespace blasst::sm90::decode {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinCtas) decode_kernel(const __grid_constant__ Params p) {
  // Let the merge kernel (launched with programmatic serialisation) get scheduled early; it waits
  // for this grid's completion with griddepcontrol.wait before reading anything.
  asm volatile("griddepcontrol.launch_dependents;");

  trace_point(p, 0);  // start
  // The tensor maps' descriptors are fetched during the start code (the start is on the critical
  // path at B = 1: the first tiles were requested 2.1 us after it in the trace of 3ef23cb).
  if (threadIdx.x == 0 && p.tma != 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(&p.tmk)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(&p.tmv)) : "memory");
  }
  const int h = blockIdx.x, split = blockIdx.y, b = blockIdx.z;  // grid (Hk, splits, B)
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const DecodeWork w = decode_work<Traits::kTileKeys>(p, h, split, b);
  if (w.n == 0) {  // a split past this sequence's end
    write_empty_partial<Traits>(p, w);
    return;
  }

  extern __shared__ __align__(1024) unsigned char smem[];  // 128B-swizzled TMA boxes need 1 KB
  const DecodeSmem<Traits> sm(smem);
  using Regs = DecodeRegs<Traits>;
  const bool tma = p.tma != 0;
  sm.init_barriers(tid, tma);
  DecodeMainloop<Traits> mainloop(p, w, sm, tid, warp, lane, tma);
  typename Regs::QFrags qa;
  mainloop.stage_q_and_first_loads(qa);
  typename Regs::RowVals m_run, l_run;
  typename Regs::RowLims row_lim;
  typename Regs::OutAcc o_acc;
  mainloop.init_rows(m_run, l_run, row_lim, o_acc);
  typename Regs::Scores s;
  typename Regs::RowVals wmax;

  trace_point(p, 2);  // Q staged
  if (mainloop.seeded) mainloop.seed_prologue(m_run, wmax, qa, row_lim);
  trace_point(p, 3);  // prologue done

  const int skipped_count = mainloop.run_tiles(s, wmax, m_run, l_run, o_acc, qa, row_lim);
  trace_point(p, 5);  // last P.V issued

  write_partial<Traits>(p, w, sm, m_run, l_run, o_acc, tid, warp, lane);
  trace_point(p, 6);  // partials written
  if (p.visited != nullptr && tid == 0) {
    atomicAdd(p.visited + w.h, static_cast<unsigned long long>(w.n));
    atomicAdd(p.skipped + w.h, static_cast<unsigned long long>(skipped_count));
  }
}


// One instance of kernel_table.inc (declared in kernel_table.hpp); its dynamic shared memory is
// DecodeTraits::kSmemBytes.
template <DType E, int kHeadDim, KernelVariant V, int kMTiles>
void launch(const Params& p, dim3 grid, cudaStream_t stream) {
  using Traits = DecodeTraits<E, kHeadDim, V, kMTiles>;
  auto* fn = &decode_kernel<Traits>;
  constexpr int smem = static_cast<int>(Traits::kSmemBytes);
  cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess) {
    fn<<<grid, Traits::kThreads, smem, stream>>>(p);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess) ::blasst::detail::throw_cuda(e, "decode_kernel launch", __FILE__, __LINE__);
}

template <DType E, int kHeadDim, KernelVariant V, int kMTiles>
int occupancy() {
  using Traits = DecodeTraits<E, kHeadDim, V, kMTiles>;
  auto* fn = &decode_kernel<Traits>;
  constexpr int smem = static_cast<int>(Traits::kSmemBytes);
  int n = 0;
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, Traits::kThreads, smem) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace blasst::sm90::decode
