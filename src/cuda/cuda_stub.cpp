// CPU-only builds: the CUDA entry points exist and say clearly that no kernels were built.
#include "cuda/cuda_dispatch.hpp"

namespace blasst::detail {

namespace {
[[noreturn]] void no_cuda() {
  throw Error("blasst was built without CUDA: device tensors and --device cuda are unavailable");
}
}  // namespace

bool cuda_built() { return false; }
bool cuda_device_present() { return false; }
std::string cuda_device_name_impl() { return {}; }

void cuda_attention(const AttentionProblem&, const SkipConfig&, const RunOptions&, SkipStats*) { no_cuda(); }
void cuda_decode(const DecodeProblem&, const SkipConfig&, const RunOptions&, SkipStats*) { no_cuda(); }
CudaDecodePlan* cuda_decode_plan(const DecodeProblem&, const SkipConfig&, const RunOptions&) { no_cuda(); }
void cuda_decode_plan_run(CudaDecodePlan&, const void*, void*, void*, void*) { no_cuda(); }
void cuda_decode_plan_free(CudaDecodePlan*) noexcept {}
void cuda_attention_backward(const AttentionBackwardProblem&, const SkipConfig&, const RunOptions&, const SkipSet*) {
  no_cuda();
}
void cuda_attention_backward_on(const AttentionBackwardProblem&, const SkipConfig&, const RunOptions&, const SkipSet*,
                                sm90::BackwardKernel) {
  no_cuda();
}
std::size_t cuda_attention_backward_workspace_bytes(const AttentionBackwardProblem&, const SkipConfig&,
                                                    const RunOptions&, const SkipSet*) {
  no_cuda();
}
std::size_t cuda_attention_workspace_bytes(const AttentionProblem&, const SkipConfig&, const RunOptions&, bool) {
  no_cuda();
}
std::size_t cuda_decode_workspace_bytes(const DecodeProblem&, const SkipConfig&, const RunOptions&, bool) {
  no_cuda();
}

}  // namespace blasst::detail
