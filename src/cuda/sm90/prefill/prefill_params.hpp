// Internal: the plain-old-data description of one prefill launch, filled by prefill_api.cu and
// read by the kernel. No CuTe here, so the host side compiles fast.
#pragma once

#include <cstdint>

namespace blasst::sm90::prefill {

// Per-sequence ln(lambda) values travel inside the kernel parameters up to this many sequences
// (no allocation, capture-safe); larger ragged batches pass a device array instead.
inline constexpr int kMaxInlineSeqs = 256;
// SPEC §5 histogram layout (mirrors blasst::DeltaHistogram; checked by static_assert in the API).
inline constexpr int kHistBins = 1024;
inline constexpr int kHistSlots = kHistBins + 2;
inline constexpr float kHistLo = -64.0f;
inline constexpr float kHistInvWidth = 16.0f;

// Kernel structure flags (PrefillTraits::kVariant; see prefill_traits.hpp).
inline constexpr int kVarTwoCopy = 1, kVarSerialMax = 2, kVarEarlyV = 4, kVarKAhead = 8,
                     kVarNoHist = 16;
inline constexpr int kLibraryVariant = 0;
// The library's skip kernels. Plain skip calls: run 5's best variant (v9: early V release -3 to
// -8 points at 0 %, histogram code out of the loop -4 to -9 points, K-ahead neutral). Calls that
// ask for the delta histogram: the same structure with the histogram code (its binning sits in
// the S wgmma's wait, off the softmax's path; session 3).
inline constexpr int kLibrarySkipFlags = kVarEarlyV | kVarKAhead | kVarNoHist;
inline constexpr int kLibraryHistFlags = kVarEarlyV | kVarKAhead;

// Bench-only instantiations (bf16, d = 128; BLASST_PREFILL_BENCH_VARIANTS builds), by id
// (bench_knobs >> 8): whether it is a skip kernel, and its structure flags.
struct BenchVariant {
  bool skip;
  int flags;
};
// (Run 5 measured nine; these are the ones kept for the next A/B.)
inline constexpr BenchVariant kBenchVariants[] = {
    {false, 0},                                                  // 0: none (library kernels)
    {true, kVarTwoCopy | kVarSerialMax},                         // 1: run 3's skip structure
    {true, kVarTwoCopy | kVarSerialMax | kVarEarlyV | kVarNoHist},  // 2: two copies, lean
    {true, kVarEarlyV | kVarNoHist},                             // 3: library without K-ahead
};
inline constexpr int kNumBenchVariants = int(sizeof(kBenchVariants) / sizeof(kBenchVariants[0]));

struct PrefillParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // optional
  // Strides in elements along (token, head, batch); the head-dim stride is 1.
  std::int64_t q_row = 0, q_head = 0, q_batch = 0;
  std::int64_t k_row = 0, k_head = 0, k_batch = 0;
  std::int64_t v_row = 0, v_head = 0, v_batch = 0;
  std::int64_t o_row = 0, o_head = 0, o_batch = 0;
  std::int64_t lse_row = 0, lse_head = 0, lse_batch = 0;
  bool out_f32 = false;  // O in f32 instead of the input dtype
  int batch = 0, hq = 0, hk = 0, group = 1;
  // Extent of the token axis of the tensors: L (batched) or the total token count (ragged).
  int rows_q = 0, rows_k = 0;
  int max_q = 0;         // longest query sequence (grid size)
  const int* cu_q = nullptr;  // device offsets, ragged only
  const int* cu_k = nullptr;
  float scale = 0.f, scale_log2 = 0.f;
  bool causal = false;
  // Tile visit order (SPEC §2a): 0 natural, 1 max-first (sink tile, the CTA's own tile, then
  // outward). The host allows max-first only where one order per CTA equals each 64-row vote
  // group's (causal masks; full masks with Lq == Lk): see prefill_tile_scheduler.hpp.
  int visit_order = 0;
  // Skip threshold ln(lambda) per sequence; -inf = dense for that sequence (lambda >= 1).
  //   lambda_mode 0: ln_lambda[b] (batch <= kMaxInlineSeqs, lengths known on the host)
  //   lambda_mode 1: ln_lambda_const for every sequence (a direct threshold)
  //   lambda_mode 2: ln(factor / Lk) from the device-side length (capture-safe ragged calls,
  //                  large batches)
  int lambda_mode = 1;
  float ln_lambda_const = -__builtin_inff();
  float ln_factor = 0.f;
  float ln_lambda[kMaxInlineSeqs] = {};
  // Optional statistics (skip instantiation only): per query head, and [hq, kHistSlots].
  unsigned long long* visited = nullptr;
  unsigned long long* skipped = nullptr;
  unsigned long long* hist = nullptr;
  int num_m_blocks = 0;
  // Measurement knobs for bench/prefill only (never set by the library):
  //   bench_no_v_loads: the producer loads no V tile and the consumers do not wait for one (the
  //     output is wrong): the upper bound of what skipping V loads could save.
  //   bench_legacy_grid: the previous grid order (heads fastest) for an A/B of the scheduler.
  //   bench_variant: 0 = the library's kernel; k > 0 = bench-only instantiation
  //     kBenchVariants[k] (bf16, d = 128; built with BLASST_PREFILL_BENCH_VARIANTS only).
  bool bench_no_v_loads = false;
  bool bench_legacy_grid = false;
  int bench_variant = 0;
};

}  // namespace blasst::sm90::prefill
