// C ABI for the prefill benchmark: runs the kernel on torch-owned device tensors in the
// [B, L, H, d] layout, on the caller's stream, without synchronising.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "blasst/blasst.hpp"
#include "cuda/sm90/prefill/prefill_api.hpp"

namespace {
thread_local char g_err[1024];
}

extern "C" {

const char* blasst_prefill_last_error() { return g_err; }

// dtype: 0 bf16, 1 f16. lambda <= 0: skipping off. force_skip: run the skip variant anyway
// (with lambda <= 0 it skips nothing: the cost of the variant at 0 % sparsity). Counters:
// device pointers or null (visited/skipped [Hq], hist [Hq, 1026]); zeroed by the caller.
// knobs: kOrderMaxFirst = visit order max_first; any other bit is an error (the measurement
// switches and bench-only variants were retired with the kernel table; the ABI is kept so that
// bench/ab_compare.py loads builds from before and after).
// Returns 0 on success, 1 on error (message in blasst_prefill_last_error()).
int blasst_prefill(const void* q, const void* k, const void* v, void* o, float* lse, long long B,
                   long long Lq, long long Lk, long long hq, long long hk, long long d, int dtype,
                   int causal, double lambda, int force_skip, void* stream,
                   unsigned long long* visited, unsigned long long* skipped,
                   unsigned long long* hist, int knobs) {
  using namespace blasst;
  try {
    const DType dt = dtype == 0 ? DType::bf16 : DType::f16;
    auto dev = [](Tensor t) { t.device = DeviceKind::cuda; return t; };
    AttentionProblem p;
    p.q = dev(Tensor::contiguous(const_cast<void*>(q), dt, {B, Lq, hq, d}));
    p.k = dev(Tensor::contiguous(const_cast<void*>(k), dt, {B, Lk, hk, d}));
    p.v = dev(Tensor::contiguous(const_cast<void*>(v), dt, {B, Lk, hk, d}));
    p.out = dev(Tensor::contiguous(o, dt, {B, Lq, hq, d}));
    if (lse) p.lse = dev(Tensor::contiguous(lse, DType::f32, {B, hq, Lq}));
    p.mask = causal ? MaskKind::causal : MaskKind::full;
    constexpr int kOrderMaxFirst = 1 << 30;
    if ((knobs & ~kOrderMaxFirst) != 0) throw Error("blasst_prefill: retired knob bits " + std::to_string(knobs));
    SkipConfig sk;
    if (lambda > 0) sk = SkipConfig::from_threshold(lambda);
    sk.with_order((knobs & kOrderMaxFirst) ? VisitOrder::max_first : VisitOrder::natural);
    sm90::prefill::launch_attention(p, sk, stream, force_skip != 0, visited, skipped, hist);
    g_err[0] = 0;
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(g_err, sizeof g_err, "%s", e.what());
    return 1;
  }
}
}
