// Host side of the sm_90a prefill kernels: detail::cuda_attention (src/cuda/cuda_dispatch.hpp)
// and sm90::prefill::launch_attention (prefill_api.hpp). can_implement rejects what the kernels do
// not cover with a blasst::Error that names the argument; the threshold rule comes from the skip
// policy; the instance from kernel_table.inc; scratch memory, staging and statistics from the
// shared host layer (src/cuda/host_launch.hpp).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "blasst/blasst.hpp"
#include "core/kernel_geometry.hpp"
#include "core/problem.hpp"
#include "core/skip_set.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_dispatch.hpp"
#include "cuda/host_launch.hpp"
#include "cuda/sm90/kernel_table.hpp"
#include "cuda/sm90/prefill/prefill_api.hpp"
#include "cuda/sm90/prefill/prefill_params.hpp"
#include "cuda/sm90/prefill/prefill_screen_ahead.hpp"
#include "cuda/sm90/prefill/prefill_screen_quant.hpp"

namespace blasst::sm90::prefill {

namespace {

using detail::check_i32;
constexpr int kBlockM = 128;  // query rows per CTA (PrefillTraits::kBlockM)
constexpr const char* kKernel = "the CUDA prefill kernel";

// The kernels' limits (CUTLASS can_implement): dtypes and head dims of kernel_table.inc, dv == d,
// out in q's dtype or f32, lse in f32, TMA-legal operands (16-byte aligned base, strides in
// multiples of 16 bytes), even output strides (column pairs are written), max-first with a full
// mask only where Lq == Lk (detail::prefill_supports_max_first states the same rule for the
// default's fallback; here only an explicit max-first reaches it).
void can_implement(const AttentionProblem& p, const detail::ResolvedAttention& r, const SkipConfig& skip,
                   bool skip_kernel) {
  if (r.dtype != DType::bf16 && r.dtype != DType::f16)
    throw Error(std::string("q: dtype ") + to_string(r.dtype) + " is not supported by " + kKernel + " (" +
                prefill_dtypes() + ")");
  if (!prefill_has(r.dtype, static_cast<int>(r.d)))
    throw Error("q: head dimension d = " + std::to_string(r.d) + " is not supported by " + kKernel + " (" +
                prefill_head_dims() + ")");
  if (r.dv != r.d)
    throw Error("v: head dimension dv = " + std::to_string(r.dv) + " must equal d = " + std::to_string(r.d) + " on " +
                kKernel);
  if (p.out.dtype != r.dtype && p.out.dtype != DType::f32)
    throw Error(std::string("out: dtype ") + to_string(p.out.dtype) + " is not supported by " + kKernel +
                " (q's dtype or f32)");
  if (p.lse.defined() && p.lse.dtype != DType::f32)
    throw Error(std::string("lse: dtype ") + to_string(p.lse.dtype) + " is not supported by " + kKernel + " (f32)");
  if (p.seed_max.defined()) {
    if (p.seed_max.dtype != DType::f32)
      throw Error(std::string("seed_max: dtype ") + to_string(p.seed_max.dtype) + " is not supported by " + kKernel +
                  " (f32)");
    if (reinterpret_cast<std::uintptr_t>(p.seed_max.data) % alignof(float) != 0)
      throw Error("seed_max: must be 4-byte aligned (f32)");
  }
  const std::int64_t tma_elems = 16 / static_cast<std::int64_t>(dtype_size(r.dtype));
  for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}}) {
    detail::check_aligned16(*t, name, kKernel);
    detail::check_strides_multiple(*t, name, tma_elems, kKernel, "TMA needs 16-byte strides");
  }
  detail::check_aligned16(p.out, "out", kKernel);
  detail::check_strides_multiple(p.out, "out", 2, kKernel, "it writes column pairs");
  if (skip.enabled) validate(skip);
  // SPEC §2b: the screen runs in the skip_screen instances; the delta histogram and the skip set
  // have no screen instance yet.
  if (skip.enabled && skip.screen.margin != ScreenMargin::off) {
    if (p.skip_set != nullptr)
      throw Error(std::string("skip.screen.margin: ") + kKernel +
                  " does not record the skip set (skip_set) with the FP8 screen on yet");
    // The screen ahead keeps each group's decisions in shared memory (kAheadMaxTiles tiles).
    if (skip.screen.ahead && (r.max_k_len + kTileKeys - 1) / kTileKeys > kAheadMaxTiles)
      throw Error("skip.screen.ahead: " + std::string(kKernel) + " screens ahead sequences of at most " +
                  std::to_string(static_cast<long long>(kAheadMaxTiles) * kTileKeys) + " keys, got " +
                  std::to_string(r.max_k_len));
  }
  check_i32(r.hq * r.batch * ((r.max_q_len + kBlockM - 1) / kBlockM), "CTA count (heads x batch x query blocks)");
  check_i32(r.batch, "batch");
  check_i32(r.max_q_len, "max query length");
  // Max-first (SPEC §2a): one order per 128-row CTA serves both of its 64-row vote groups exactly
  // for causal masks (any Lq, Lk) and for full masks with Lq == Lk per sequence
  // (prefill_tile_scheduler.hpp, VisitCursor).
  if (skip_kernel && skip.vote.order == VisitOrder::max_first && r.mask == MaskKind::full) {
    if (!r.ragged) {
      if (p.q.shape[1] != p.k.shape[1])
        throw Error("skip.vote.order: max_first on " + std::string(kKernel) + " with a full mask needs Lq == Lk, got " +
                    std::to_string(p.q.shape[1]) + " and " + std::to_string(p.k.shape[1]));
    } else if (r.q_len.empty() || r.k_len.empty()) {
      throw Error("skip.vote.order: max_first on " + std::string(kKernel) +
                  " with a full mask needs host-visible sequence lengths (Lq == Lk is checked per sequence); leave "
                  "max_seqlen_q/k unset or use a causal mask");
    } else {
      for (std::size_t b = 0; b < r.q_len.size(); ++b)
        if (r.q_len[b] != r.k_len[b])
          throw Error("skip.vote.order: max_first on " + std::string(kKernel) + " with a full mask needs Lq == Lk; "
                      "sequence " + std::to_string(b) + " has " + std::to_string(r.q_len[b]) + " and " +
                      std::to_string(r.k_len[b]));
    }
  }
}

// Size-1 dims may carry any stride; give TMA a legal one.
std::int64_t tma_stride(const Tensor& t, int dim, std::int64_t fallback) {
  return t.shape[dim] > 1 ? t.stride[dim] : fallback;
}

PrefillParams make_params(const AttentionProblem& p, const detail::ResolvedAttention& r, const SkipConfig& skip,
                          bool skip_kernel) {
  PrefillParams prm;
  prm.q = p.q.data;
  prm.k = p.k.data;
  prm.v = p.v.data;
  prm.o = p.out.data;
  prm.lse = p.lse.defined() ? static_cast<float*>(p.lse.data) : nullptr;
  prm.out_f32 = p.out.dtype == DType::f32;
  const std::int64_t d = r.d;
  if (!r.ragged) {  // q [B, L, H, d]
    prm.q_batch = tma_stride(p.q, 0, d); prm.q_row = tma_stride(p.q, 1, d); prm.q_head = tma_stride(p.q, 2, d);
    prm.k_batch = tma_stride(p.k, 0, d); prm.k_row = tma_stride(p.k, 1, d); prm.k_head = tma_stride(p.k, 2, d);
    prm.v_batch = tma_stride(p.v, 0, d); prm.v_row = tma_stride(p.v, 1, d); prm.v_head = tma_stride(p.v, 2, d);
    prm.o_batch = p.out.stride[0]; prm.o_row = p.out.stride[1]; prm.o_head = p.out.stride[2];
    if (p.lse.defined()) { prm.lse_batch = p.lse.stride[0]; prm.lse_head = p.lse.stride[1]; prm.lse_row = p.lse.stride[2]; }
    if (p.seed_max.defined()) {
      prm.seed_batch = p.seed_max.stride[0]; prm.seed_head = p.seed_max.stride[1]; prm.seed_row = p.seed_max.stride[2];
    }
    prm.rows_q = static_cast<int>(check_i32(p.q.shape[1], "q length"));
    prm.rows_k = static_cast<int>(check_i32(p.k.shape[1], "k length"));
  } else {  // q [Tq, H, d]
    prm.q_row = tma_stride(p.q, 0, d); prm.q_head = tma_stride(p.q, 1, d);
    prm.k_row = tma_stride(p.k, 0, d); prm.k_head = tma_stride(p.k, 1, d);
    prm.v_row = tma_stride(p.v, 0, d); prm.v_head = tma_stride(p.v, 1, d);
    prm.o_row = p.out.stride[0]; prm.o_head = p.out.stride[1];
    if (p.lse.defined()) { prm.lse_head = p.lse.stride[0]; prm.lse_row = p.lse.stride[1]; }
    if (p.seed_max.defined()) { prm.seed_head = p.seed_max.stride[0]; prm.seed_row = p.seed_max.stride[1]; }
    prm.rows_q = static_cast<int>(check_i32(p.q.shape[0], "q total rows"));
    prm.rows_k = static_cast<int>(check_i32(p.k.shape[0], "k total rows"));
    prm.cu_q = p.cu_seqlens_q;
    prm.cu_k = p.cu_seqlens_k;
  }
  prm.batch = static_cast<int>(r.batch);
  prm.hq = static_cast<int>(r.hq);
  prm.hk = static_cast<int>(r.hk);
  prm.group = static_cast<int>(r.group);
  prm.num_m_blocks = static_cast<int>((r.max_q_len + kBlockM - 1) / kBlockM);
  prm.scale = static_cast<float>(r.scale);
  prm.scale_log2 = static_cast<float>(r.scale * 1.4426950408889634);
  prm.causal = r.mask == MaskKind::causal;
  prm.visit_order = (skip_kernel && skip.vote.order == VisitOrder::max_first) ? 1 : 0;
  prm.threshold = make_skip_threshold(skip);
  prm.seed_max = skip_kernel && p.seed_max.defined() ? static_cast<const float*>(p.seed_max.data) : nullptr;
  return prm;
}

bool screen_on(const SkipConfig& skip) { return skip.enabled && skip.screen.margin != ScreenMargin::off; }

// gamma_n(u) = n u / (1 - n u) (SPEC §2b), rounded upwards to float.
float gamma_up(double n, double u) {
  const double g = n * u / (1.0 - n * u);
  float f = static_cast<float>(g);
  if (static_cast<double>(f) < g) f = std::nextafter(f, INFINITY);
  return f;
}

// The kernel's unit roundoffs (prefill_screen.hpp says why): u8 of the FP8 wgmma accumulation and
// u of the bf16 wgmma's exact scores; u16 of the screen-ahead pre-pass's f16 accumulator (each
// k32 wgmma's partial sum rounded to f16's 11-bit significand, chopped or rounded).
constexpr double kScreenU8 = 0x1p-13;
constexpr double kScreenU = 0x1p-22;
constexpr double kScreenU16 = 0x1p-10;

// The margin's FP8 accumulation term (SPEC §2b: a kernel puts its own accumulation in Rnd): the
// in-loop screen accumulates in f32, gamma_{d+3}(u8); the screen-ahead pre-pass in f16, which
// composes it with d / 32 roundings of the partial sum to f16 (plus one in reserve):
// (1 + gamma_{d+3}(u8)) (1 + gamma_{d/32+1}(u16)) - 1, rounded upwards to float.
float screen_gamma_fp8(double d, bool f16_accumulator) {
  const float g8 = gamma_up(d + 3, kScreenU8);
  if (!f16_accumulator) return g8;
  const double n = std::floor(d / 32) + 1;
  const double g = (1.0 + double(g8)) * (1.0 + n * kScreenU16 / (1.0 - n * kScreenU16)) - 1.0;
  float f = static_cast<float>(g);
  if (static_cast<double>(f) < g) f = std::nextafter(f, INFINITY);
  return f;
}

std::int64_t max_k_tiles(const detail::ResolvedAttention& r) {
  return (r.max_k_len + kTileKeys - 1) / kTileKeys;
}

}  // namespace

std::size_t screen_workspace_bytes(const AttentionProblem& p, const SkipConfig& skip) {
  if (!screen_on(skip)) return 0;
  const detail::ResolvedAttention r = detail::validate_attention(p, p.q.device);
  PrefillParams prm = make_params(p, r, skip, true);
  return screen_layout(prm, static_cast<int>(r.d), max_k_tiles(r), skip.screen.ahead).bytes;
}

std::vector<double> launch_attention(const AttentionProblem& p, const SkipConfig& skip_in, void* stream,
                                     bool force_skip_kernel, unsigned long long* visited,
                                     unsigned long long* skipped, unsigned long long* hist,
                                     VisitOrder* order_used, const ScreenRun* screen_ptr) {
  const detail::ResolvedAttention r = detail::validate_attention(p, DeviceKind::cuda);
  // SPEC §2a: the one rule the reference applies too (src/core/problem.hpp).
  const SkipConfig skip = detail::with_effective_order(skip_in, r);
  if (order_used != nullptr) *order_used = skip.vote.order;
  const bool want_stats = visited != nullptr;
  // Seeded maxima run on the skip kernel (its running maxima take them), skipping off or on.
  const bool skip_kernel = skip.enabled || force_skip_kernel || want_stats || p.seed_max.defined();
  can_implement(p, r, skip, skip_kernel);
  PrefillParams prm = make_params(p, r, skip, skip_kernel);
  prm.visited = visited;
  prm.skipped = skipped;
  prm.hist = hist;
  if (p.skip_set != nullptr) {
    // SPEC §9: every word zeroed here, the skip kernel sets the bits of the pairs it skips (the
    // dense kernel skips nothing).
    const SkipSetShape shape = detail::skip_set_shape_of(r, detail::prefill_vote_granularity(skip.vote.order));
    detail::check_skip_set_words(p.skip_set_words, shape, "skip_set_words");
    if (reinterpret_cast<std::uintptr_t>(p.skip_set) % alignof(std::uint32_t) != 0)
      throw Error("skip_set: must be 4-byte aligned (32-bit words)");
    BLASST_CUDA_CHECK(cudaMemsetAsync(p.skip_set, 0, static_cast<std::size_t>(shape.words()) * sizeof(std::uint32_t),
                                      static_cast<cudaStream_t>(stream)));
    prm.skip_set = skip_kernel ? p.skip_set : nullptr;
    prm.set_groups = static_cast<int>(check_i32(shape.groups, "skip set vote groups"));
    prm.set_tiles = static_cast<int>(check_i32(shape.tiles, "skip set tiles"));
  }

  // lambda per sequence (statistics), from the host-visible lengths.
  std::vector<double> lambdas;
  if (skip.enabled) {
    std::vector<std::int64_t> k_len = r.k_len;
    if (!r.ragged) k_len.assign(static_cast<std::size_t>(r.batch), p.k.shape[1]);
    if (k_len.empty() && want_stats)
      k_len = detail::read_lengths(p.cu_seqlens_k, r.batch, true, static_cast<cudaStream_t>(stream));
    for (const std::int64_t L : k_len) lambdas.push_back(L > 0 ? resolve_lambda(skip, L) : 1.0);
  }

  // The skip set is recorded by the skip_record instance (and by skip_hist, which also bins).
  // The FP8 screen (SPEC §2b) runs skip_screen, or skip_screen_check when wrong screens are counted;
  // the screen ahead runs its own kernel, then skip_ahead (it counts no wrong screens: the caller
  // passes no counter); a histogram call runs skip_hist without the screen (its deltas are the exact
  // ones anyway, and the decisions equal the screen's while there is no wrong screen).
  const bool screen = screen_on(skip) && hist == nullptr;
  const bool ahead = screen && skip.screen.ahead;
  const bool count_wrong = screen_ptr != nullptr && screen_ptr->screen_wrong != nullptr;
  if (ahead && count_wrong)
    throw Error(std::string("skip.screen.ahead: ") + kKernel + " does not count wrong screens of the screen ahead");
  const KernelVariant v = !skip_kernel        ? KernelVariant::dense
                          : hist != nullptr   ? KernelVariant::skip_hist
                          : prm.skip_set      ? KernelVariant::skip_record
                          : ahead             ? KernelVariant::skip_ahead
                          : screen            ? (count_wrong ? KernelVariant::skip_screen_check : KernelVariant::skip_screen)
                                              : KernelVariant::skip;
  const PrefillLaunchFn run = find_prefill_kernel(r.dtype, static_cast<int>(r.d), v);
  if (run == nullptr)
    throw Error(std::string("no CUDA prefill kernel instance for ") + to_string(r.dtype) + ", d = " +
                std::to_string(r.d) + ", " + to_string(v) + " (src/cuda/sm90/kernel_table.inc)");
  if (prm.num_m_blocks <= 0 || r.batch <= 0) return lambdas;
  if (!screen) {
    run(prm, static_cast<cudaStream_t>(stream));
    return lambdas;
  }
  // SPEC §2b: quantise Q and K into the screen's workspace, then the screen instance (ahead: the
  // screen-ahead kernel, then the skip_ahead instance over its plan).
  const ScreenLayout L = screen_layout(prm, static_cast<int>(r.d), max_k_tiles(r), ahead);
  if (screen_ptr == nullptr || screen_ptr->workspace == nullptr || screen_ptr->workspace_bytes < L.bytes)
    throw Error("skip.screen: the FP8 screen needs " + std::to_string(L.bytes) +
                " bytes of workspace (screen_workspace_bytes), got " +
                std::to_string(screen_ptr != nullptr ? screen_ptr->workspace_bytes : 0));
  if (reinterpret_cast<std::uintptr_t>(screen_ptr->workspace) % 256 != 0)
    throw Error("skip.screen: the FP8 screen's workspace must be 256-byte aligned");
  PrefillScreenParams sp;
  static_cast<PrefillParams&>(sp) = prm;
  screen_quantise(prm, r.dtype, L, screen_ptr->workspace, static_cast<cudaStream_t>(stream), sp.screen);
  const double d = static_cast<double>(r.d);
  sp.screen.tight = skip.screen.margin == ScreenMargin::tight;
  sp.screen.z_over_sqrt_d = static_cast<float>(skip.screen.z / std::sqrt(d) * (1.0 + 0x1p-20));
  sp.screen.gamma_exact = gamma_up(d + 1, kScreenU);
  sp.screen.gamma_fp8 = screen_gamma_fp8(d, ahead);
  sp.screen.screened = screen_ptr->screened;
  sp.screen.screen_wrong = screen_ptr->screen_wrong;
  if (ahead) {
    PrefillAheadParams ap;
    static_cast<PrefillParams&>(ap) = prm;
    auto* base = static_cast<unsigned char*>(screen_ptr->workspace);
    ap.plan.list = reinterpret_cast<std::uint32_t*>(base + L.plan_list);
    ap.plan.count = reinterpret_cast<int*>(base + L.plan_count);
    ap.plan.stride = static_cast<int>(check_i32(L.tiles, "key tiles"));
    screen_ahead(sp, static_cast<int>(r.d), ap.plan, static_cast<cudaStream_t>(stream));
    run(ap, static_cast<cudaStream_t>(stream));
    return lambdas;
  }
  run(sp, static_cast<cudaStream_t>(stream));
  return lambdas;
}

}  // namespace blasst::sm90::prefill

namespace blasst::detail {

namespace {

bool wants_stats(const SkipStats* stats, const RunOptions& opt) {
  return stats != nullptr && (opt.collect_stats || opt.collect_histogram);
}

std::int64_t query_heads(const AttentionProblem& p) { return p.q.rank >= 2 ? p.q.shape[p.q.rank - 2] : 0; }

// The screen's scratch memory of a call (SPEC §2b); 0 when the screen does not run (off, skipping
// off, or a histogram call: skip_hist).
std::size_t screen_bytes(const AttentionProblem& p, const SkipConfig& skip, const RunOptions& opt, bool stats) {
  if (stats && opt.collect_histogram) return 0;
  return sm90::prefill::screen_workspace_bytes(p, skip);
}

// Host tensors, opt.device == cuda: staged through device memory, run, copied back, synchronised.
void run_staged(const AttentionProblem& hp, const SkipConfig& skip_in, const RunOptions& opt, SkipStats* stats) {
  const ResolvedAttention r = validate_attention(hp, DeviceKind::cpu);  // errors name the host arguments
  // SPEC §2a on the host lengths (as the reference sees them), then explicit for the device call.
  const SkipConfig skip = with_effective_order(skip_in, r);
  if (hp.lse.defined() && hp.lse.device != DeviceKind::cpu)
    throw Error("lse: must live with q (host) when staging through the device");
  DeviceStaging staging(static_cast<cudaStream_t>(opt.stream));
  AttentionProblem dp = hp;
  dp.q = staging.upload(hp.q);
  dp.k = staging.upload(hp.k);
  dp.v = staging.upload(hp.v);
  dp.out = staging.upload(hp.out);
  dp.lse = staging.upload(hp.lse);
  dp.seed_max = staging.upload(hp.seed_max);
  // The skip set's words (SPEC §9): checked here, written on the device, copied back below.
  std::size_t set_words = 0;
  if (hp.skip_set != nullptr) {
    const SkipSetShape shape = skip_set_shape_of(r, prefill_vote_granularity(skip.vote.order));
    check_skip_set_words(hp.skip_set_words, shape, "skip_set_words");
    set_words = static_cast<std::size_t>(shape.words());
    dp.skip_set = staging.output_words(static_cast<std::size_t>(hp.skip_set_words));
  }
  if (hp.cu_seqlens_q) {
    dp.cu_seqlens_q = staging.upload(hp.cu_seqlens_q, static_cast<std::size_t>(r.batch + 1));
    dp.cu_seqlens_k = staging.upload(hp.cu_seqlens_k, static_cast<std::size_t>(r.batch + 1));
  }
  staging.synchronize();  // offsets are read back by validation
  RunOptions dopt = opt;
  dopt.device = DeviceKind::cuda;
  cuda_attention(dp, skip, dopt, stats);
  staging.download(hp.out, dp.out);
  staging.download(hp.lse, dp.lse);
  if (hp.skip_set != nullptr) staging.download(hp.skip_set, dp.skip_set, set_words);
  staging.synchronize();
}

}  // namespace

std::size_t cuda_attention_workspace_bytes(const AttentionProblem& p, const SkipConfig& skip, const RunOptions& opt,
                                           bool stats) {
  if (p.q.device == DeviceKind::cpu && opt.device != DeviceKind::cuda)
    throw Error("q: host tensor on the CUDA path; set RunOptions::device = cuda to stage it");
  const std::size_t counters = stats ? StatCounters::bytes(query_heads(p), opt.collect_histogram) : 0;
  const std::size_t screen = screen_bytes(p, skip, opt, stats);
  const std::size_t screen_counters = screen > 0 && stats ? static_cast<std::size_t>(query_heads(p)) * 8 : 0;
  return Workspace::bytes_for({counters, screen, screen_counters, screen_counters});
}

void cuda_attention(const AttentionProblem& p, const SkipConfig& skip, const RunOptions& opt, SkipStats* stats) {
  if (p.q.device == DeviceKind::cpu) {
    if (opt.device != DeviceKind::cuda)
      throw Error("q: host tensor on the CUDA path; set RunOptions::device = cuda to stage it");
    return run_staged(p, skip, opt, stats);
  }
  const bool want_stats = wants_stats(stats, opt);
  cudaStream_t stream = static_cast<cudaStream_t>(opt.stream);
  const std::int64_t hq = query_heads(p);
  Workspace ws(opt, stream, "attention");
  StatCounters cnt;
  if (want_stats && hq > 0) cnt = StatCounters::take(ws, hq, opt.collect_histogram, stream);
  // SPEC §2b: the screen's scratch memory and, with statistics, its two per-head counters.
  sm90::prefill::ScreenRun screen;
  const bool screen_on = skip.enabled && skip.screen.margin != ScreenMargin::off;
  const std::size_t sbytes = screen_bytes(p, skip, opt, want_stats);
  if (sbytes > 0) {
    screen.workspace_bytes = sbytes;
    screen.workspace = ws.take(sbytes);
    if (want_stats && hq > 0) {
      screen.screened = ws.take<unsigned long long>(static_cast<std::size_t>(hq));
      BLASST_CUDA_CHECK(cudaMemsetAsync(screen.screened, 0, static_cast<std::size_t>(hq) * 8, stream));
      // The screen ahead counts no wrong screens on the GPU: SkipStats::screen_wrong stays empty.
      if (!skip.screen.ahead) {
        screen.screen_wrong = ws.take<unsigned long long>(static_cast<std::size_t>(hq));
        BLASST_CUDA_CHECK(cudaMemsetAsync(screen.screen_wrong, 0, static_cast<std::size_t>(hq) * 8, stream));
      }
    }
  }
  VisitOrder order = VisitOrder::natural;  // the order used (SPEC §2a), from the launch
  const std::vector<double> lambdas = sm90::prefill::launch_attention(
      p, skip, opt.stream, false, cnt.visited, cnt.skipped, cnt.hist, &order, sbytes > 0 ? &screen : nullptr);

  if (stats) {
    *stats = SkipStats{};
    stats->granularity = prefill_vote_granularity(order);
    stats->counted_at = prefill_counted_at(order);
    stats->lambda = lambdas;
    if (want_stats && hq > 0) cnt.read_into(*stats, stream);
    if (want_stats && hq > 0 && screen_on) {  // SPEC §2b statistics, per head like visited
      std::vector<unsigned long long> a(static_cast<std::size_t>(hq)), b(a.size());
      if (screen.screened != nullptr) {
        BLASST_CUDA_CHECK(cudaMemcpyAsync(a.data(), screen.screened, a.size() * 8, cudaMemcpyDeviceToHost, stream));
        if (screen.screen_wrong != nullptr)
          BLASST_CUDA_CHECK(cudaMemcpyAsync(b.data(), screen.screen_wrong, b.size() * 8, cudaMemcpyDeviceToHost, stream));
        BLASST_CUDA_CHECK(cudaStreamSynchronize(stream));
      }
      stats->screened.assign(a.begin(), a.end());
      if (!skip.screen.ahead) stats->screen_wrong.assign(b.begin(), b.end());
    }
  }
}

}  // namespace blasst::detail
