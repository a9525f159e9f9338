// Internal: which backward main kernel runs (kernel_table.inc's third backward argument). No CUDA
// headers here: the host boundary (cuda_dispatch.hpp) names it too.
#pragma once

namespace blasst::sm90 {

// mma_sync: backward_kernel.hpp (cp.async + mma.sync); wgmma: backward_wgmma_kernel.hpp (TMA +
// wgmma, warp-specialised).
enum class BackwardKernel : int { mma_sync, wgmma };
const char* to_string(BackwardKernel k);

}  // namespace blasst::sm90
