// Host dispatch of the sm_90a prefill kernel: detail::cuda_attention (src/cuda/cuda_dispatch.hpp).
// Validates the problem, rejects what the kernel does not cover with a blasst::Error that names
// the argument, resolves the skip threshold per sequence (SPEC §3), picks one of the compiled
// variants and launches it on opt.stream. Host tensors with opt.device == cuda are staged
// through device memory and the call synchronises.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "blasst/blasst.hpp"
#include "core/problem.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_dispatch.hpp"
#include "cuda/sm90/prefill/prefill_launch.hpp"

namespace blasst::detail {

namespace {

using sm90::prefill::Elem;
using sm90::prefill::PrefillParams;
namespace pf = sm90::prefill;

static_assert(pf::kHistBins == DeltaHistogram::kBins, "histogram layout mirrors DeltaHistogram");
static_assert(pf::kHistLo == DeltaHistogram::kLo && 1.0 / pf::kHistInvWidth == DeltaHistogram::kWidth,
              "histogram layout mirrors DeltaHistogram");

constexpr int kBlockM = 128;

// Elements spanned by a strided tensor (0 when empty).
std::int64_t span_elems(const Tensor& t) {
  if (t.numel() == 0) return 0;
  std::int64_t s = 1;
  for (int i = 0; i < t.rank; ++i) s += (t.shape[i] - 1) * t.stride[i];
  return s;
}

// TMA needs a 16-byte aligned base and strides that are multiples of 16 bytes (size-1 dims are
// re-strided by the launcher, so only real dims are checked).
void check_tma_operand(const Tensor& t, const char* name) {
  const std::int64_t esz = static_cast<std::int64_t>(dtype_size(t.dtype));
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0)
    throw Error(std::string(name) + ": the CUDA prefill kernel needs a 16-byte aligned data pointer");
  for (int i = 0; i + 1 < t.rank; ++i) {
    if (t.shape[i] > 1 && (t.stride[i] * esz) % 16 != 0)
      throw Error(std::string(name) + ": stride " + std::to_string(t.stride[i]) + " of dimension " +
                  std::to_string(i) + " is not a multiple of 16 bytes (CUDA prefill kernel, TMA)");
  }
}

void check_out_operand(const Tensor& t, const char* name) {
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0)
    throw Error(std::string(name) + ": the CUDA prefill kernel needs a 16-byte aligned data pointer");
  for (int i = 0; i + 1 < t.rank; ++i) {
    if (t.shape[i] > 1 && t.stride[i] % 2 != 0)
      throw Error(std::string(name) + ": stride " + std::to_string(t.stride[i]) + " of dimension " +
                  std::to_string(i) + " must be even (CUDA prefill kernel writes column pairs)");
  }
}

// Size-1 dims may carry any stride; give TMA a legal one.
std::int64_t tma_stride(const Tensor& t, int dim, std::int64_t fallback) {
  return t.shape[dim] > 1 ? t.stride[dim] : fallback;
}

std::int64_t check_i32(std::int64_t v, const char* what) {
  if (v > std::numeric_limits<std::int32_t>::max())
    throw Error(std::string(what) + " = " + std::to_string(v) + " exceeds the CUDA kernel's int32 range");
  return v;
}

void launch(const PrefillParams& prm, Elem e, int d, bool skip, cudaStream_t s) {
  using pf::run_prefill;
  if (prm.bench_variant != 0) {
#ifdef BLASST_PREFILL_BENCH_VARIANTS
    if (e != Elem::bf16 || d != 128)
      throw Error("bench_knobs: the bench-only variants exist for bf16, d = 128 only");
    if ((pf::kBenchVariants[prm.bench_variant].flags & pf::kVarNoHist) && prm.hist != nullptr)
      throw Error("bench_knobs: variant " + std::to_string(prm.bench_variant) + " has no histogram");
    if (pf::kBenchVariants[prm.bench_variant].skip != skip)
      throw Error("bench_knobs: variant " + std::to_string(prm.bench_variant) + " is a " +
                  (skip ? "dense" : "skip") + " kernel, this call runs the other kind");
    switch (prm.bench_variant) {
      case 1: pf::run_prefill_bench<1>(prm, s); return;
      case 2: pf::run_prefill_bench<2>(prm, s); return;
      case 3: pf::run_prefill_bench<3>(prm, s); return;
      default: break;
    }
    static_assert(pf::kNumBenchVariants == 4, "one case per bench variant");
#else
    throw Error("bench_knobs: the bench-only variants are not built (BLASST_PREFILL_BENCH_VARIANTS=OFF)");
#endif
  }
  // Kernel kind: dense, skip, or skip with the delta histogram (its own instantiation: the
  // histogram code costs the plain skip kernel 4-9 % even when off, run 5).
  const int kind = !skip ? pf::kKindDense : prm.hist != nullptr ? pf::kKindSkipHist : pf::kKindSkip;
  auto go = [&](auto e_tag, auto d_tag) {
    constexpr Elem E = decltype(e_tag)::value;
    constexpr int D = decltype(d_tag)::value;
    if (kind == pf::kKindDense) run_prefill<E, D, pf::kKindDense>(prm, s);
    else if (kind == pf::kKindSkip) run_prefill<E, D, pf::kKindSkip>(prm, s);
    else run_prefill<E, D, pf::kKindSkipHist>(prm, s);
  };
  using B16 = std::integral_constant<Elem, Elem::bf16>;
  using F16 = std::integral_constant<Elem, Elem::f16>;
  using D64 = std::integral_constant<int, 64>;
  using D128 = std::integral_constant<int, 128>;
  if (e == Elem::bf16) {
    if (d == 64) go(B16{}, D64{}); else go(B16{}, D128{});
  } else {
    if (d == 64) go(F16{}, D64{}); else go(F16{}, D128{});
  }
}

// Host tensors, opt.device == cuda: copy to the device (same strides), run, copy back, sync.
void run_staged(const AttentionProblem& hp, const SkipConfig& skip, const RunOptions& opt,
                SkipStats* stats) {
  (void)validate_attention(hp, DeviceKind::cpu);  // errors name the host arguments
  if (hp.lse.defined() && hp.lse.device != DeviceKind::cpu)
    throw Error("lse: must live with q (host) when staging through the device");
  cudaStream_t stream = static_cast<cudaStream_t>(opt.stream);
  AttentionProblem dp = hp;
  auto stage = [&](const Tensor& h, Tensor& d, DeviceBuffer& buf, bool copy_in) {
    if (!h.defined()) return;
    const std::size_t bytes = static_cast<std::size_t>(span_elems(h)) * dtype_size(h.dtype);
    buf = DeviceBuffer(bytes);
    d = h;
    d.data = buf.get();
    d.device = DeviceKind::cuda;
    if (copy_in && bytes)
      BLASST_CUDA_CHECK(cudaMemcpyAsync(buf.get(), h.data, bytes, cudaMemcpyHostToDevice, stream));
  };
  DeviceBuffer bq, bk, bv, bo, bl, bcq, bck;
  stage(hp.q, dp.q, bq, true);
  stage(hp.k, dp.k, bk, true);
  stage(hp.v, dp.v, bv, true);
  // Out and LSE are copied in too, so that gaps of strided outputs come back unchanged.
  stage(hp.out, dp.out, bo, true);
  stage(hp.lse, dp.lse, bl, true);
  if (hp.cu_seqlens_q) {
    const std::size_t n = static_cast<std::size_t>(hp.batch + 1) * sizeof(std::int32_t);
    bcq = DeviceBuffer(n);
    bck = DeviceBuffer(n);
    BLASST_CUDA_CHECK(cudaMemcpyAsync(bcq.get(), hp.cu_seqlens_q, n, cudaMemcpyHostToDevice, stream));
    BLASST_CUDA_CHECK(cudaMemcpyAsync(bck.get(), hp.cu_seqlens_k, n, cudaMemcpyHostToDevice, stream));
    dp.cu_seqlens_q = bcq.as<std::int32_t>();
    dp.cu_seqlens_k = bck.as<std::int32_t>();
  }
  BLASST_CUDA_CHECK(cudaStreamSynchronize(stream));  // offsets are read back by validation
  RunOptions dopt = opt;
  dopt.device = DeviceKind::cuda;
  cuda_attention(dp, skip, dopt, stats);
  auto back = [&](const Tensor& h, const DeviceBuffer& buf) {
    if (!h.defined() || buf.bytes() == 0) return;
    BLASST_CUDA_CHECK(cudaMemcpyAsync(h.data, buf.get(), buf.bytes(), cudaMemcpyDeviceToHost, stream));
  };
  back(hp.out, bo);
  back(hp.lse, bl);
  BLASST_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace

}  // namespace blasst::detail

namespace blasst::sm90::prefill {

bool bench_variants_built() {
#ifdef BLASST_PREFILL_BENCH_VARIANTS
  return true;
#else
  return false;
#endif
}

// Device tensors only. Launches on `stream` without synchronising; counters (device memory,
// zeroed by the caller) select the statistics; returns lambda per sequence (empty when the
// lengths are not known on the host and no statistics were asked for).
std::vector<double> launch_attention(const AttentionProblem& p, const SkipConfig& skip,
                                     void* stream_ptr, bool force_skip_kernel,
                                     unsigned long long* visited, unsigned long long* skipped,
                                     unsigned long long* hist, int bench_knobs) {
  using namespace blasst::detail;
  const ResolvedAttention r = validate_attention(p, DeviceKind::cuda);
  if (r.dtype != DType::bf16 && r.dtype != DType::f16)
    throw Error(std::string("q: dtype ") + to_string(r.dtype) +
                " is not supported by the CUDA prefill kernel (bf16 or f16)");
  if (r.d != 64 && r.d != 128)
    throw Error("q: head dimension d = " + std::to_string(r.d) +
                " is not supported by the CUDA prefill kernel (64 or 128)");
  if (r.dv != r.d)
    throw Error("v: head dimension dv = " + std::to_string(r.dv) + " must equal d = " +
                std::to_string(r.d) + " on the CUDA prefill kernel");
  if (p.out.dtype != r.dtype && p.out.dtype != DType::f32)
    throw Error(std::string("out: dtype ") + to_string(p.out.dtype) +
                " is not supported by the CUDA prefill kernel (q's dtype or f32)");
  if (p.lse.defined() && p.lse.dtype != DType::f32)
    throw Error(std::string("lse: dtype ") + to_string(p.lse.dtype) +
                " is not supported by the CUDA prefill kernel (f32)");
  check_tma_operand(p.q, "q");
  check_tma_operand(p.k, "k");
  check_tma_operand(p.v, "v");
  check_out_operand(p.out, "out");
  if (skip.enabled) validate(skip);

  const bool want_stats = visited != nullptr;
  const bool use_skip_kernel = skip.enabled || force_skip_kernel || want_stats;

  PrefillParams prm;
  prm.q = p.q.data;
  prm.k = p.k.data;
  prm.v = p.v.data;
  prm.o = p.out.data;
  prm.lse = p.lse.defined() ? static_cast<float*>(p.lse.data) : nullptr;
  prm.out_f32 = p.out.dtype == DType::f32 && r.dtype != DType::f32;
  const std::int64_t d = r.d;
  if (!r.ragged) {
    // q [B, L, H, d]
    prm.q_batch = tma_stride(p.q, 0, d); prm.q_row = tma_stride(p.q, 1, d); prm.q_head = tma_stride(p.q, 2, d);
    prm.k_batch = tma_stride(p.k, 0, d); prm.k_row = tma_stride(p.k, 1, d); prm.k_head = tma_stride(p.k, 2, d);
    prm.v_batch = tma_stride(p.v, 0, d); prm.v_row = tma_stride(p.v, 1, d); prm.v_head = tma_stride(p.v, 2, d);
    prm.o_batch = p.out.stride[0]; prm.o_row = p.out.stride[1]; prm.o_head = p.out.stride[2];
    if (p.lse.defined()) { prm.lse_batch = p.lse.stride[0]; prm.lse_head = p.lse.stride[1]; prm.lse_row = p.lse.stride[2]; }
    prm.rows_q = static_cast<int>(check_i32(p.q.shape[1], "q length"));
    prm.rows_k = static_cast<int>(check_i32(p.k.shape[1], "k length"));
  } else {
    // q [Tq, H, d]
    prm.q_row = tma_stride(p.q, 0, d); prm.q_head = tma_stride(p.q, 1, d);
    prm.k_row = tma_stride(p.k, 0, d); prm.k_head = tma_stride(p.k, 1, d);
    prm.v_row = tma_stride(p.v, 0, d); prm.v_head = tma_stride(p.v, 1, d);
    prm.o_row = p.out.stride[0]; prm.o_head = p.out.stride[1];
    if (p.lse.defined()) { prm.lse_head = p.lse.stride[0]; prm.lse_row = p.lse.stride[1]; }
    prm.rows_q = static_cast<int>(check_i32(p.q.shape[0], "q total rows"));
    prm.rows_k = static_cast<int>(check_i32(p.k.shape[0], "k total rows"));
    prm.cu_q = p.cu_seqlens_q;
    prm.cu_k = p.cu_seqlens_k;
  }
  prm.batch = static_cast<int>(check_i32(r.batch, "batch"));
  prm.hq = static_cast<int>(r.hq);
  prm.hk = static_cast<int>(r.hk);
  prm.group = static_cast<int>(r.group);
  check_i32(r.hq * r.batch * ((r.max_q_len + kBlockM - 1) / kBlockM), "CTA count (heads x batch x query blocks)");
  prm.max_q = static_cast<int>(check_i32(r.max_q_len, "max query length"));
  prm.num_m_blocks = static_cast<int>((r.max_q_len + kBlockM - 1) / kBlockM);
  prm.scale = static_cast<float>(r.scale);
  prm.scale_log2 = static_cast<float>(r.scale * 1.4426950408889634);
  prm.causal = r.mask == MaskKind::causal;
  // Visit order (SPEC §2a). Max-first: one order per 128-row CTA serves both of its 64-row vote
  // groups exactly for causal masks (any Lq, Lk) and for full masks with Lq == Lk per sequence
  // (prefill_tile_scheduler.hpp, VisitCursor); other full-mask shapes are an error.
  prm.visit_order = (use_skip_kernel && skip.vote.order == VisitOrder::max_first) ? 1 : 0;
  if (prm.visit_order == 1 && !prm.causal) {
    if (!r.ragged) {
      if (p.q.shape[1] != p.k.shape[1])
        throw Error("skip.vote.order: max_first on the CUDA prefill kernel with a full mask needs Lq == Lk, got " +
                    std::to_string(p.q.shape[1]) + " and " + std::to_string(p.k.shape[1]));
    } else if (r.q_len.empty() || r.k_len.empty()) {
      throw Error("skip.vote.order: max_first on the CUDA prefill kernel with a full mask needs host-visible "
                  "sequence lengths (Lq == Lk is checked per sequence); leave max_seqlen_q/k unset or use a "
                  "causal mask");
    } else {
      for (std::size_t b = 0; b < r.q_len.size(); ++b)
        if (r.q_len[b] != r.k_len[b])
          throw Error("skip.vote.order: max_first on the CUDA prefill kernel with a full mask needs Lq == Lk; "
                      "sequence " + std::to_string(b) + " has " + std::to_string(r.q_len[b]) + " and " +
                      std::to_string(r.k_len[b]));
    }
  }

  // Per-sequence key lengths on the host, when available (needed for stats and mode 0).
  std::vector<std::int64_t> k_len = r.k_len;
  if (!r.ragged) k_len.assign(static_cast<std::size_t>(r.batch), prm.rows_k);
  if (k_len.empty() && want_stats) {
    std::vector<std::int32_t> ck(static_cast<std::size_t>(r.batch + 1));
    BLASST_CUDA_CHECK(cudaMemcpy(ck.data(), p.cu_seqlens_k, ck.size() * sizeof(std::int32_t),
                                 cudaMemcpyDeviceToHost));
    k_len.resize(static_cast<std::size_t>(r.batch));
    for (std::int64_t b = 0; b < r.batch; ++b) k_len[b] = ck[b + 1] - ck[b];
  }
  std::vector<double> lambdas;
  const float ninf = -std::numeric_limits<float>::infinity();
  auto ln_of = [&](double lambda) { return lambda >= 1.0 ? ninf : static_cast<float>(std::log(lambda)); };
  if (!skip.enabled) {
    prm.lambda_mode = 1;
    prm.ln_lambda_const = ninf;  // statistics-only run: dense
  } else if (skip.threshold) {
    const double lam = resolve_lambda(skip, 1);  // lambda itself, independent of Lk
    prm.lambda_mode = 1;
    prm.ln_lambda_const = ln_of(lam);
  } else if (!k_len.empty() && r.batch <= pf::kMaxInlineSeqs) {
    prm.lambda_mode = 0;
    for (std::int64_t b = 0; b < r.batch; ++b)
      prm.ln_lambda[b] = k_len[b] > 0 ? ln_of(resolve_lambda(skip, k_len[b])) : ninf;
  } else {
    prm.lambda_mode = 2;
    prm.ln_factor = static_cast<float>(std::log(resolve_lambda(skip, 1)));  // = factor
  }
  if (skip.enabled) {
    for (std::int64_t b = 0; b < static_cast<std::int64_t>(k_len.size()); ++b)
      lambdas.push_back(k_len[b] > 0 ? resolve_lambda(skip, k_len[b]) : 1.0);
  }

  prm.visited = visited;
  prm.skipped = skipped;
  prm.hist = hist;
  prm.bench_no_v_loads = (bench_knobs & kKnobNoVLoads) != 0;
  prm.bench_legacy_grid = (bench_knobs & kKnobLegacyGrid) != 0;
  prm.bench_variant = (bench_knobs >> kKnobVariantShift) & 0xff;
  if ((bench_knobs & ~(kKnobNoVLoads | kKnobLegacyGrid | (0xff << kKnobVariantShift))) != 0 ||
      prm.bench_variant >= kNumBenchVariants)
    throw Error("bench_knobs: unknown or retired bits in " + std::to_string(bench_knobs));
  const Elem e = r.dtype == DType::bf16 ? Elem::bf16 : Elem::f16;
  if (prm.num_m_blocks > 0 && r.batch > 0)
    launch(prm, e, static_cast<int>(d), use_skip_kernel, static_cast<cudaStream_t>(stream_ptr));
  return lambdas;
}

}  // namespace blasst::sm90::prefill

namespace blasst::detail {

void cuda_attention(const AttentionProblem& p, const SkipConfig& skip, const RunOptions& opt,
                    SkipStats* stats) {
  if (p.q.device == DeviceKind::cpu) {
    if (opt.device != DeviceKind::cuda)
      throw Error("q: host tensor on the CUDA path; set RunOptions::device = cuda to stage it");
    return run_staged(p, skip, opt, stats);
  }
  const bool want_hist = opt.collect_histogram;
  const bool want_stats = stats != nullptr && (opt.collect_stats || opt.collect_histogram);
  cudaStream_t stream = static_cast<cudaStream_t>(opt.stream);
  const std::int64_t hq = p.q.rank >= 2 ? p.q.shape[p.q.rank - 2] : 0;
  const std::size_t slots = static_cast<std::size_t>(hq) * pf::kHistSlots;
  DeviceBuffer counters;
  unsigned long long *vis = nullptr, *skp = nullptr, *hst = nullptr;
  if (want_stats && hq > 0) {
    const std::size_t n = 2 * static_cast<std::size_t>(hq) + (want_hist ? slots : 0);
    counters = DeviceBuffer(n * sizeof(unsigned long long));
    BLASST_CUDA_CHECK(cudaMemsetAsync(counters.get(), 0, counters.bytes(), stream));
    vis = counters.as<unsigned long long>();
    skp = vis + hq;
    hst = want_hist ? vis + 2 * hq : nullptr;
  }
  const std::vector<double> lambdas = pf::launch_attention(p, skip, opt.stream, false, vis, skp, hst);

  if (stats) {
    *stats = SkipStats{};
    stats->granularity.tile_keys = 128;
    stats->granularity.rows = 64;
    stats->granularity.heads = 1;
    stats->granularity.split_tiles = 0;
    const bool max_first = skip.vote.order == VisitOrder::max_first;
    stats->granularity.order = max_first ? VisitOrder::max_first : VisitOrder::natural;
    stats->counted_at = std::string("64 query rows x 1 head (one consumer warpgroup) x 128-key tiles, ") +
                        (max_first ? "max-first order" : "natural order");
    stats->lambda = lambdas;
    if (want_stats) {
      std::vector<unsigned long long> host(counters.bytes() / sizeof(unsigned long long));
      BLASST_CUDA_CHECK(cudaMemcpyAsync(host.data(), counters.get(), counters.bytes(),
                                        cudaMemcpyDeviceToHost, stream));
      BLASST_CUDA_CHECK(cudaStreamSynchronize(stream));
      stats->visited.assign(host.begin(), host.begin() + hq);
      stats->skipped.assign(host.begin() + hq, host.begin() + 2 * hq);
      if (want_hist) {
        stats->hist.assign(static_cast<std::size_t>(hq), DeltaHistogram{});
        for (std::int64_t h = 0; h < hq; ++h)
          for (int i = 0; i < pf::kHistSlots; ++i)
            stats->hist[h].counts[i] = host[2 * hq + h * pf::kHistSlots + i];
      }
    }
  }
  // Counters are freed on return: the kernel must be done with them.
  if (want_stats) BLASST_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace blasst::detail
