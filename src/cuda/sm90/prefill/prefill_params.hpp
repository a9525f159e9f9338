// Internal: the plain-old-data description of one prefill launch, filled by prefill_api.cu and
// read by the kernel. No CuTe here, so the host side compiles fast.
#pragma once

#include <cstdint>

#include "cuda/sm90/common/skip_policy.hpp"

namespace blasst::sm90::prefill {

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
  const int* cu_q = nullptr;  // device offsets, ragged only
  const int* cu_k = nullptr;
  float scale = 0.f, scale_log2 = 0.f;
  bool causal = false;
  // Tile visit order (SPEC §2a): 0 natural, 1 max-first (sink tile, the CTA's own tile, then
  // outward). The host allows max-first only where one order per CTA equals each 64-row vote
  // group's (causal masks; full masks with Lq == Lk): see prefill_tile_scheduler.hpp.
  int visit_order = 0;
  // lambda per sequence (SPEC §3; skip_policy.hpp), applied from the device-side key length.
  SkipThreshold threshold;
  // Optional statistics (skip instances only): per query head, and [hq, kHistSlots].
  unsigned long long* visited = nullptr;
  unsigned long long* skipped = nullptr;
  unsigned long long* hist = nullptr;
  // Optional skip set (SPEC §9; skip instances only; zeroed by the host): for each skipped visited
  // (sequence b, head h, 64-row vote group g, key tile t), bit i % 32 of word i / 32 is set, with
  // i = ((b * hq + h) * set_groups + g) * set_tiles + t (SkipSetShape's layout).
  std::uint32_t* skip_set = nullptr;
  int set_groups = 0, set_tiles = 0;
  // Optional seeded maxima (SPEC §2a; AttentionProblem::seed_max; skip instances only): f32 in
  // lse's layout and units (natural log of the scaled scores), strides in elements; each row's
  // running max starts at seed / scale (-inf: no seed; +inf: NaN, the row's output is NaN).
  const float* seed_max = nullptr;
  std::int64_t seed_row = 0, seed_head = 0, seed_batch = 0;
  int num_m_blocks = 0;  // query blocks of the longest sequence (grid size)
};

// SPEC §2b FP8 screen (skip_screen / skip_screen_check instances only): what the quantisation
// pre-kernel (prefill_screen_quant.cu) wrote into the call's workspace, and the margin's
// constants. Not a member of PrefillParams: that struct's size (5 x 64 bytes) fixes the TMA
// descriptors' offsets in the other instances' kernel parameters, whose SASS must not change.
struct ScreenArgs {
  // e4m3 codes, contiguous (batch or 1, tokens, heads, d): row stride heads * d bytes.
  const void* q8 = nullptr;
  const void* k8 = nullptr;
  // Per query row: {sq, |q|, |q~|, |eq|} (float4) at ((b * rows_q + token) * hq + h); ragged:
  // token = the flattened row, b = 0.
  const float* q_rows = nullptr;
  // Per (sequence, KV head, key tile): {KN, KT, EK, sk} (float4) at ((b * hk + kh) * tiles + t),
  // sk the tile's key scale (SPEC §2b: one per tile); KN, KT, EK NaN when a key of the tile has a
  // non-finite element (that tile is never screened).
  const float* k_tiles = nullptr;
  int tiles = 0;  // key tiles of the longest sequence
  // Margin (raw-score units, SPEC §2b): strict (tight = false) or tight(z); gamma_{d+1}(u) of the
  // exact scores and gamma_{d+3}(u8) of the FP8 accumulation (prefill_screen.hpp states the u's).
  bool tight = false;
  float z_over_sqrt_d = 0.f;
  float gamma_exact = 0.f, gamma_fp8 = 0.f;
  // Per query head (null: not counted): pairs the screen skipped, and those the exact test would
  // have kept (skip_screen_check only).
  unsigned long long* screened = nullptr;
  unsigned long long* screen_wrong = nullptr;
};

// The parameters of a screen instance: the launch table passes every instance a PrefillParams;
// the screen instances receive this derived object (prefill_api.cu builds it for them).
struct PrefillScreenParams : PrefillParams {
  ScreenArgs screen;
};

// SPEC §2b screen ahead: what the screen-ahead kernel (prefill_screen_ahead.cu) writes for the
// pass (the skip_ahead instances). For the CTA of launch index c (the same 1-D grid for both),
// count[c] entries list[c * stride + i] name the key tiles its pass visits, in its visit order:
// bits 0..29 the tile, bit 30 + g set when vote group g (the CTA's consumer warpgroup g) is not
// ahead-skipped there. A tile neither group needs is not listed: it is neither loaded nor
// multiplied.
inline constexpr std::uint32_t kAheadTileMask = (1u << 30) - 1u;
// The screen-ahead kernel keeps each vote group's decisions as bits in shared memory: at most
// this many key tiles per sequence (2^20 keys); the host refuses longer sequences.
inline constexpr int kAheadMaxTiles = 8192;
struct AheadPlan {
  std::uint32_t* list = nullptr;
  int* count = nullptr;
  int stride = 0;  // entries per CTA: the key tiles of the longest sequence
};
struct PrefillAheadParams : PrefillParams {
  AheadPlan plan;
};

}  // namespace blasst::sm90::prefill
