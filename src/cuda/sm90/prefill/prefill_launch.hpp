// Internal: the compiled kernel variants. Each is explicitly instantiated in its own .cu
// (inst_*.cu) so the builds run in parallel; the API picks one at run time.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "blasst/blasst.hpp"

#include "cuda/sm90/prefill/prefill_params.hpp"

namespace blasst::sm90::prefill {

enum class Elem { bf16, f16 };

// Device tensors only (prefill_api.cu): validates, resolves lambda, launches on `stream` without
// synchronising. Non-null counters (device memory, zeroed by the caller: visited/skipped [hq],
// hist [hq, kHistSlots]) turn the statistics on. force_skip_kernel runs the skip variant even
// when skipping is off (measures its dense-path cost). Returns lambda per sequence when known.
std::vector<double> launch_attention(const AttentionProblem& p, const SkipConfig& skip,
                                     void* stream, bool force_skip_kernel,
                                     unsigned long long* visited, unsigned long long* skipped,
                                     unsigned long long* hist, int bench_knobs = 0);
// bench_knobs (bench/prefill only): bit 1 = no V loads (wrong output, upper bound of V-load
// skipping), bit 2 = legacy grid order (heads fastest); bits 8-15 = id k of a bench-only
// instantiation kBenchVariants[k] (prefill_params.hpp; bf16, d = 128, only in builds with
// BLASST_PREFILL_BENCH_VARIANTS, and only for the kind of call it was built for - a skip
// variant for calls that run the skip kernel; otherwise an Error). Bits 4-64 (run-3 vote and
// gate knobs, run 4's two-copy bit) are retired: an Error.
inline constexpr int kKnobNoVLoads = 1;
inline constexpr int kKnobLegacyGrid = 2;
inline constexpr int kKnobVariantShift = 8;
// Whether this build holds the bench-only instantiations (BLASST_PREFILL_BENCH_VARIANTS).
bool bench_variants_built();

template <int kId>
void run_prefill_bench(const PrefillParams& p, cudaStream_t stream);

// Kernel kinds: dense, skip (no histogram code), skip with the SPEC §5 delta histogram.
inline constexpr int kKindDense = 0, kKindSkip = 1, kKindSkipHist = 2;

// Launches the kernel for one (dtype, head dim, kind) combination on `stream`.
// Throws blasst::Error on a CUDA error (launch included).
template <Elem E, int kHeadDim, int kKind>
void run_prefill(const PrefillParams& p, cudaStream_t stream);

#define BLASST_PREFILL_DECLARE(E, D, K) \
  extern template void run_prefill<E, D, K>(const PrefillParams&, cudaStream_t);
BLASST_PREFILL_DECLARE(Elem::bf16, 64, kKindDense)
BLASST_PREFILL_DECLARE(Elem::bf16, 64, kKindSkip)
BLASST_PREFILL_DECLARE(Elem::bf16, 64, kKindSkipHist)
BLASST_PREFILL_DECLARE(Elem::bf16, 128, kKindDense)
BLASST_PREFILL_DECLARE(Elem::bf16, 128, kKindSkip)
BLASST_PREFILL_DECLARE(Elem::bf16, 128, kKindSkipHist)
BLASST_PREFILL_DECLARE(Elem::f16, 64, kKindDense)
BLASST_PREFILL_DECLARE(Elem::f16, 64, kKindSkip)
BLASST_PREFILL_DECLARE(Elem::f16, 64, kKindSkipHist)
BLASST_PREFILL_DECLARE(Elem::f16, 128, kKindDense)
BLASST_PREFILL_DECLARE(Elem::f16, 128, kKindSkip)
BLASST_PREFILL_DECLARE(Elem::f16, 128, kKindSkipHist)
#undef BLASST_PREFILL_DECLARE

}  // namespace blasst::sm90::prefill
