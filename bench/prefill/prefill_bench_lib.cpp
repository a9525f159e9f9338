// C ABI for the prefill benchmark: runs the kernel on torch-owned device tensors in the
// [B, L, H, d] layout, on the caller's stream, without synchronising.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "blasst/blasst.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/sm90/prefill/prefill_api.hpp"

namespace {
thread_local char g_err[1024];

// A device buffer of ours, kept and grown between calls so that the timed call allocates
// nothing: the skip-set words of the kRecordSkipSet knob (SPEC 9: the forward records its skip
// set) and the FP8 screen's workspace.
void* grown(blasst::detail::DeviceBuffer& buf, std::size_t bytes) {
  if (buf.bytes() < bytes) buf = blasst::detail::DeviceBuffer(bytes);
  return buf.get();
}
std::uint32_t* skip_set_buffer(std::int64_t words) {
  static blasst::detail::DeviceBuffer buf;
  return static_cast<std::uint32_t*>(grown(buf, static_cast<std::size_t>(words) * sizeof(std::uint32_t)));
}
void* screen_workspace(std::size_t bytes) {
  static blasst::detail::DeviceBuffer buf;
  return grown(buf, bytes);
}

// The call's problem on torch-owned device tensors, [B, L, H, d] (lse [B, Hq, Lq] f32 or null).
blasst::AttentionProblem device_problem(const void* q, const void* k, const void* v, void* o, float* lse,
                                        long long B, long long Lq, long long Lk, long long hq, long long hk,
                                        long long d, int dtype, int causal) {
  using namespace blasst;
  const DType dt = dtype == 0 ? DType::bf16 : DType::f16;
  auto dev = [](Tensor t) { t.device = DeviceKind::cuda; return t; };
  AttentionProblem p;
  p.q = dev(Tensor::contiguous(const_cast<void*>(q), dt, {B, Lq, hq, d}));
  p.k = dev(Tensor::contiguous(const_cast<void*>(k), dt, {B, Lk, hk, d}));
  p.v = dev(Tensor::contiguous(const_cast<void*>(v), dt, {B, Lk, hk, d}));
  p.out = dev(Tensor::contiguous(o, dt, {B, Lq, hq, d}));
  if (lse) p.lse = dev(Tensor::contiguous(lse, DType::f32, {B, hq, Lq}));
  p.mask = causal ? MaskKind::causal : MaskKind::full;
  return p;
}
}  // namespace

extern "C" {

const char* blasst_prefill_last_error() { return g_err; }

// dtype: 0 bf16, 1 f16. lambda <= 0: skipping off. force_skip: run the skip variant anyway
// (with lambda <= 0 it skips nothing: the cost of the variant at 0 % sparsity). Counters:
// device pointers or null (visited/skipped [Hq], hist [Hq, 1026]); zeroed by the caller.
// knobs: kOrderMaxFirst = visit order max_first; kRecordSkipSet = the call records its skip set
// (the skip_record instance, issue 14's "cost with saving on"); any other bit is an error (the measurement
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
    AttentionProblem p = device_problem(q, k, v, o, lse, B, Lq, Lk, hq, hk, d, dtype, causal);
    constexpr int kOrderMaxFirst = 1 << 30, kRecordSkipSet = 1 << 29;
    if ((knobs & ~(kOrderMaxFirst | kRecordSkipSet)) != 0)
      throw Error("blasst_prefill: retired knob bits " + std::to_string(knobs));
    SkipConfig sk;
    if (lambda > 0) sk = SkipConfig::from_threshold(lambda);
    sk.with_order((knobs & kOrderMaxFirst) ? VisitOrder::max_first : VisitOrder::natural);
    if (knobs & kRecordSkipSet) {
      RunOptions ro;
      ro.device = DeviceKind::cuda;
      p.skip_set_words = skip_set_shape(p, sk, ro).words();
      p.skip_set = skip_set_buffer(p.skip_set_words);
    }
    sm90::prefill::launch_attention(p, sk, stream, force_skip != 0, visited, skipped, hist);
    g_err[0] = 0;
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(g_err, sizeof g_err, "%s", e.what());
    return 1;
  }
}

// The SPEC §2b FP8 screen (a separate entry, so blasst_prefill's ABI stays that of older builds):
// skipping at lambda (> 0) in visit order max-first (max_first != 0) or natural, margin 1 strict /
// 2 tight(z), plus 4 for the screen ahead (5 strict ahead, 6 tight ahead; screen_wrong must be
// null there: the pass counts none); the screen's workspace is a buffer of ours (kept between calls). Counters (device,
// [Hq], zeroed by the caller, or null): visited, skipped, screened; a non-null screen_wrong runs
// the checking instance (bf16 scores of screened tiles too). Returns 0, or 1 with the message in
// blasst_prefill_last_error().
int blasst_prefill_screen(const void* q, const void* k, const void* v, void* o, float* lse, long long B,
                          long long Lq, long long Lk, long long hq, long long hk, long long d, int dtype,
                          int causal, double lambda, int max_first, int margin, double z, void* stream,
                          unsigned long long* visited, unsigned long long* skipped,
                          unsigned long long* screened, unsigned long long* screen_wrong) {
  using namespace blasst;
  try {
    AttentionProblem p = device_problem(q, k, v, o, lse, B, Lq, Lk, hq, hk, d, dtype, causal);
    if (!(lambda > 0)) throw Error("blasst_prefill_screen: lambda must be > 0");
    SkipConfig sk = SkipConfig::from_threshold(lambda);
    sk.with_order(max_first ? VisitOrder::max_first : VisitOrder::natural);
    const int base = margin & 3;
    sk.screen.margin = base == 1 ? ScreenMargin::strict : base == 2 ? ScreenMargin::tight : ScreenMargin::off;
    sk.screen.ahead = (margin & 4) != 0;
    sk.screen.z = z;
    sm90::prefill::ScreenRun run;
    run.workspace_bytes = sm90::prefill::screen_workspace_bytes(p, sk);
    run.workspace = run.workspace_bytes > 0 ? screen_workspace(run.workspace_bytes) : nullptr;
    run.screened = screened;
    run.screen_wrong = screen_wrong;
    sm90::prefill::launch_attention(p, sk, stream, false, visited, skipped, nullptr, nullptr, &run);
    g_err[0] = 0;
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(g_err, sizeof g_err, "%s", e.what());
    return 1;
  }
}
}
