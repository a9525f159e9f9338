// Internal: the boundary between the host library and the CUDA kernels. Implemented in
// src/cuda/*.cu when CUDA is built, and by src/cuda/cuda_stub.cpp (throws Error) otherwise.
#pragma once

#include <string>

#include "blasst/blasst.hpp"
#include "cuda/sm90/backward/backward_kernel_kind.hpp"

namespace blasst::detail {

bool cuda_built();              // compiled with the kernels
bool cuda_device_present();     // a usable sm_90 device is visible
std::string cuda_device_name_impl();

// Tensors either on the device (p.q.device == cuda), or on the host with opt.device == cuda, in
// which case the implementation stages them through device memory and synchronises.
void cuda_attention(const AttentionProblem& p, const SkipConfig& skip, const RunOptions& opt,
                    SkipStats* stats);
void cuda_decode(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt,
                 SkipStats* stats);
// A planned decode call on device tensors (DecodePlan; decode_api.cu): made once, run with q, out
// and lse at new addresses, freed with its scratch.
struct CudaDecodePlan;
CudaDecodePlan* cuda_decode_plan(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt);
void cuda_decode_plan_run(CudaDecodePlan& plan, const void* q, void* out, void* lse, void* stream);
void cuda_decode_plan_free(CudaDecodePlan* plan) noexcept;
// SPEC §9 backward (backward_api.cu); same device rules as cuda_attention.
void cuda_attention_backward(const AttentionBackwardProblem& p, const SkipConfig& skip, const RunOptions& opt,
                             const SkipSet* skip_set);
// The same call on a named main kernel (the GPU tests and bench/backward run both: the default,
// sm90::backward::kDefaultBackwardKernel = wgmma, and mma_sync).
void cuda_attention_backward_on(const AttentionBackwardProblem& p, const SkipConfig& skip, const RunOptions& opt,
                                const SkipSet* skip_set, sm90::BackwardKernel kernel);
std::size_t cuda_attention_backward_workspace_bytes(const AttentionBackwardProblem& p, const SkipConfig& skip,
                                                    const RunOptions& opt, const SkipSet* skip_set);
// RunOptions::workspace bytes of the same calls (statistics as asked by opt and stats != nullptr).
std::size_t cuda_attention_workspace_bytes(const AttentionProblem& p, const SkipConfig& skip,
                                           const RunOptions& opt, bool stats);
std::size_t cuda_decode_workspace_bytes(const DecodeProblem& p, const SkipConfig& skip,
                                        const RunOptions& opt, bool stats);

}  // namespace blasst::detail
