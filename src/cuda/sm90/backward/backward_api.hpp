// Internal: the host entry of the backward kernels on device tensors, for the library's CUDA path
// (backward_api.cu: detail::cuda_attention_backward) and the benchmark's direct calls.
#pragma once

#include <cstddef>

#include "blasst/blasst.hpp"
#include "cuda/sm90/kernel_table.hpp"

namespace blasst::sm90::backward {

// The main kernel the library runs: the wgmma kernel (backward_wgmma_kernel.hpp), which passed the
// GPU suites and compute-sanitizer (2026-12-03, 7e5a8db) and runs 1.4-1.7x faster than the
// mma.sync kernel (bench/results/backward_2026-12-03_7e5a8db_quick.txt). mma_sync stays as the
// second implementation the GPU suites compare and the benchmark names.
inline constexpr BackwardKernel kDefaultBackwardKernel = BackwardKernel::wgmma;

// Device tensors only: checks what the kernels cover (an Error naming the argument otherwise),
// takes its scratch from `workspace` semantics of opt (caller's buffer or the library's pool),
// uploads the host skip set, and runs preprocess, main kernel and postprocess on opt.stream
// without synchronising.
void launch_attention_backward(const AttentionBackwardProblem& p, const SkipConfig& skip, const RunOptions& opt,
                               const SkipSet* skip_set, BackwardKernel kernel = kDefaultBackwardKernel);
// The checks of that call alone (no CUDA work), on tensors that live on `device` (cpu: a host
// problem about to be staged).
void check_attention_backward(const AttentionBackwardProblem& p, const SkipConfig& skip, const SkipSet* skip_set,
                              DeviceKind device);
// The scratch bytes of that call.
std::size_t attention_backward_workspace_bytes(const AttentionBackwardProblem& p, const SkipConfig& skip,
                                               const RunOptions& opt, const SkipSet* skip_set);

}  // namespace blasst::sm90::backward
