// Split-KV Skip-Softmax decode kernel for sm_90a (see docs/decode_kernel.md): the phases of one
// CTA (decode_mainloop.cuh, decode_epilogue.cuh) and the host-side launch and occupancy of one
// instance of kernel_table.inc. Included only by the generated instance files.
#pragma once

#include <cuda_runtime.h>

#include "cuda/cuda_check.hpp"
#include "cuda/sm90/decode/decode_epilogue.cuh"

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
    prefetch_tensormap(&p.tmk);
    prefetch_tensormap(&p.tmv);
  }
  // Grid (Hk, splits, B): neighbouring CTAs read neighbouring head rows of the same keys (the
  // H200 runs of f05b4c2 / 6ff5dca measured splits-fastest within run-to-run noise of this).
  extern __shared__ __align__(1024) unsigned char smem[];  // 128B-swizzled TMA boxes need 1 KB
  DecodeCta<Traits> c(p, *reinterpret_cast<typename Traits::SharedStorage*>(smem));
  if (c.n == 0) {
    c.write_empty_partial();
    return;
  }
  c.init_barriers();
  c.stage_q_and_start_loads();
  c.init_rows();
  trace_point(p, 2);  // Q staged
  if (c.seeded) c.seed_prologue();
  trace_point(p, 3);  // prologue done
  const int skipped = c.run_tiles();
  trace_point(p, 5);  // last P.V issued
  write_partial(c);
  trace_point(p, 6);  // partials written
  if (p.visited != nullptr && c.tid == 0) {
    atomicAdd(p.visited + c.h, static_cast<unsigned long long>(c.n));
    atomicAdd(p.skipped + c.h, static_cast<unsigned long long>(skipped));
  }
}

// One instance of kernel_table.inc (declared in kernel_table.hpp).
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
