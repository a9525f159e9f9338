// Public entry points: choose the reference engine or the CUDA kernels.
#include "blasst/blasst.hpp"
#include "core/kernel_geometry.hpp"
#include "core/problem.hpp"
#include "core/skip_set.hpp"
#include "cuda/cuda_dispatch.hpp"

namespace blasst {

namespace {
bool wants_cuda(const Tensor& q, const RunOptions& opt) {
  return q.device == DeviceKind::cuda || opt.device == DeviceKind::cuda;
}

bool has_length_term(const SkipConfig& skip) {
  return skip.enabled && !skip.threshold && !skip.factor && skip.piecewise && skip.piecewise->finite_size;
}

// The kernels take one factor per call (lambda = factor / Lk for every sequence). A richer form
// without the finite-size term is such a factor; with it, the factor depends on Lk, so the call
// gets the factor of its one key length (bit-identical to resolve_lambda(skip, Lk)), and a ragged
// batch, whose lengths may differ, is refused.
SkipConfig for_kernels(const AttentionProblem& p, const SkipConfig& skip) {
  if (!has_length_term(skip)) return skip;
  if (p.cu_seqlens_k != nullptr || p.cu_seqlens_q != nullptr)
    throw Error("skip.piecewise: the finite-size term needs one key length per call on the CUDA path; "
                "a ragged batch is not supported (run each length separately, or use a form without it)");
  validate(skip);
  const std::int64_t Lk = p.k.shape[1];
  if (Lk < 1) return skip;  // nothing to attend: the kernel path reports the shape
  SkipConfig out = skip;
  out.factor = skip.piecewise->factor(skip.target_sparsity, Lk);
  return out;
}

SkipConfig for_decode_kernels(const SkipConfig& skip) {
  if (has_length_term(skip))
    throw Error("skip.piecewise: the finite-size term is defined for prefill (Lq = Lk), not for decode");
  return skip;
}
}  // namespace

void attention(const AttentionProblem& p, const SkipConfig& skip, const RunOptions& opt,
               SkipStats* stats) {
  if (wants_cuda(p.q, opt)) return detail::cuda_attention(p, for_kernels(p, skip), opt, stats);
  reference::attention(p, skip, opt, stats);
}

void decode(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt,
            SkipStats* stats) {
  if (wants_cuda(p.q, opt)) return detail::cuda_decode(p, for_decode_kernels(skip), opt, stats);
  reference::decode(p, skip, opt, stats);
}

// DecodePlan: the CUDA path keeps a prepared launch (decode_api.cu); the CPU path the problem.
struct DecodePlan::Impl {
  DecodeProblem p;
  SkipConfig skip;
  RunOptions opt;
  detail::CudaDecodePlan* cuda = nullptr;
  ~Impl() { detail::cuda_decode_plan_free(cuda); }
};

DecodePlan::DecodePlan(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt)
    : impl_(std::make_unique<Impl>()) {
  impl_->p = p;
  impl_->skip = skip;
  impl_->opt = opt;
  if (wants_cuda(p.q, opt)) {
    impl_->skip = for_decode_kernels(skip);
    if (p.q.device != DeviceKind::cuda)
      throw Error("q: a DecodePlan runs device tensors on the CUDA path (host tensors are staged by decode() only)");
    if (opt.collect_stats || opt.collect_histogram || opt.record_deltas)
      throw Error("RunOptions: a DecodePlan collects no statistics (use decode() for them)");
    impl_->cuda = detail::cuda_decode_plan(p, impl_->skip, opt);
  } else {
    (void)detail::validate_decode(p, DeviceKind::cpu);  // errors now, not at the first run
    validate(skip);
  }
}

DecodePlan::~DecodePlan() = default;
DecodePlan::DecodePlan(DecodePlan&&) noexcept = default;
DecodePlan& DecodePlan::operator=(DecodePlan&&) noexcept = default;

void DecodePlan::run(const void* q, void* out, void* lse, void* stream) {
  if (!impl_) throw Error("DecodePlan: run() on a moved-from plan");
  if (q == nullptr || out == nullptr) throw Error("DecodePlan::run: q and out are required");
  if ((lse != nullptr) != impl_->p.lse.defined())
    throw Error(std::string("DecodePlan::run: lse ") + (lse ? "given but the plan has none" : "missing: the plan has one"));
  if (impl_->cuda != nullptr) return detail::cuda_decode_plan_run(*impl_->cuda, q, out, lse, stream);
  DecodeProblem p = impl_->p;
  p.q.data = const_cast<void*>(q);
  p.out.data = out;
  if (lse != nullptr) p.lse.data = lse;
  reference::decode(p, impl_->skip, impl_->opt, nullptr);
}

// Statistics are counted for the workspace whenever opt asks for them (a call may pass stats).
std::size_t attention_workspace_bytes(const AttentionProblem& p, const SkipConfig& skip, const RunOptions& opt) {
  if (!wants_cuda(p.q, opt)) return 0;
  return detail::cuda_attention_workspace_bytes(p, for_kernels(p, skip), opt,
                                                opt.collect_stats || opt.collect_histogram);
}

std::size_t decode_workspace_bytes(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt) {
  if (!wants_cuda(p.q, opt)) return 0;
  return detail::cuda_decode_workspace_bytes(p, for_decode_kernels(skip), opt,
                                             opt.collect_stats || opt.collect_histogram || opt.record_deltas);
}

SkipSetShape skip_set_shape(const AttentionProblem& p, const SkipConfig& skip, const RunOptions& opt) {
  const bool cuda = wants_cuda(p.q, opt);
  const detail::ResolvedAttention r = detail::validate_attention(p, p.q.device);
  validate(skip);
  const SkipConfig eff = detail::with_effective_order(skip, r);  // SPEC §2a, as the call
  return detail::skip_set_shape_of(r, cuda ? detail::prefill_vote_granularity(eff.vote.order) : eff.vote);
}

// SPEC §9: device tensors (or host tensors with opt.device == cuda) go to the sm_90a backward
// kernels; CPU tensors to the reference, which also names a tensor on the wrong device.
void attention_backward(const AttentionBackwardProblem& p, const SkipConfig& skip, const RunOptions& opt,
                        const SkipSet* skip_set) {
  if (wants_cuda(p.q, opt)) return detail::cuda_attention_backward(p, skip, opt, skip_set);
  reference::attention_backward(p, skip, opt, skip_set);
}

std::size_t attention_backward_workspace_bytes(const AttentionBackwardProblem& p, const SkipConfig& skip,
                                               const RunOptions& opt, const SkipSet* skip_set) {
  if (!wants_cuda(p.q, opt)) return 0;
  return detail::cuda_attention_backward_workspace_bytes(p, skip, opt, skip_set);
}

bool cuda_available() { return detail::cuda_built() && detail::cuda_device_present(); }
std::string cuda_device_name() { return cuda_available() ? detail::cuda_device_name_impl() : std::string(); }

}  // namespace blasst
