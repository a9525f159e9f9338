// Public entry points: choose the reference engine or the CUDA kernels.
#include "blasst/blasst.hpp"
#include "cuda/cuda_dispatch.hpp"

namespace blasst {

namespace {
bool wants_cuda(const Tensor& q, const RunOptions& opt) {
  return q.device == DeviceKind::cuda || opt.device == DeviceKind::cuda;
}
}  // namespace

void attention(const AttentionProblem& p, const SkipConfig& skip, const RunOptions& opt,
               SkipStats* stats) {
  if (wants_cuda(p.q, opt)) return detail::cuda_attention(p, skip, opt, stats);
  reference::attention(p, skip, opt, stats);
}

void decode(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt,
            SkipStats* stats) {
  if (wants_cuda(p.q, opt)) return detail::cuda_decode(p, skip, opt, stats);
  reference::decode(p, skip, opt, stats);
}

// Statistics are counted for the workspace whenever opt asks for them (a call may pass stats).
std::size_t attention_workspace_bytes(const AttentionProblem& p, const SkipConfig& skip, const RunOptions& opt) {
  if (!wants_cuda(p.q, opt)) return 0;
  return detail::cuda_attention_workspace_bytes(p, skip, opt, opt.collect_stats || opt.collect_histogram);
}

std::size_t decode_workspace_bytes(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt) {
  if (!wants_cuda(p.q, opt)) return 0;
  return detail::cuda_decode_workspace_bytes(p, skip, opt,
                                             opt.collect_stats || opt.collect_histogram || opt.record_deltas);
}

bool cuda_available() { return detail::cuda_built() && detail::cuda_device_present(); }
std::string cuda_device_name() { return cuda_available() ? detail::cuda_device_name_impl() : std::string(); }

}  // namespace blasst
