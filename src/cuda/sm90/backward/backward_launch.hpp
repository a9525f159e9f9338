// Internal: kernel_table.inc's backward instances, one launch per (dtype, head dim, kernel):
// BackwardKernel::mma_sync runs backward_kernel.hpp, BackwardKernel::wgmma backward_wgmma_kernel.hpp
// (declared in kernel_table.hpp). Included only by the generated instance files.
#pragma once

#include "cuda/sm90/backward/backward_kernel.hpp"
#include "cuda/sm90/backward/backward_wgmma_kernel.hpp"
#include "cuda/sm90/common/element.hpp"
#include "cuda/sm90/kernel_table.hpp"

namespace blasst::sm90::backward {

template <DType E, int kHeadDim, BackwardKernel K>
void launch(const BackwardParams& p, cudaStream_t stream) {
  using Cute = typename Element<E>::cute;
  if constexpr (K == BackwardKernel::mma_sync) launch_backward<BackwardTraits<Cute, kHeadDim>>(p, stream);
  else launch_backward_wgmma<BackwardWgmmaTraits<Cute, kHeadDim>>(p, stream);
}

}  // namespace blasst::sm90::backward
