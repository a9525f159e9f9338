// Internal: parameters and launchers of the decode kernels (host and device code).
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace blasst::detail::decode {

// Tile sizes and pipeline depths (see docs/decode_kernel.md). One CTA of kWarps warps; MT = 16-row
// MMA tiles of query rows (1 for g * q_len <= 16, the common decode case; 4 up to 64 rows): the
// row state lives in registers, so MT is a template parameter, never a run-time loop bound.
constexpr int kWarps = 8;
constexpr int kTileKeys = 128;  // SPEC §2 tile
constexpr int kMaxRows = 64;    // g * q_len
constexpr int kHistBins = 1024 + 2;  // DeltaHistogram::kBins + 2
constexpr int kTracePoints = 7;  // BLASST_DECODE_TRACE: start, first loads, Q staged, prologue, first vote, loop, end

// m-tiles for a row count (the instantiation that runs it).
constexpr int mtiles_for(int rows) { return rows <= 16 ? 1 : 4; }
// K ring depth: tiles whose loads are in flight ahead of the scores.
constexpr int stages_k(int, int) { return 3; }
// V ring depth NV: P.V of a surviving tile runs NV - 1 survivors after its vote, so its V load has
// NV - 1 iterations to land (the V of a tile can only be requested once its vote is known). One
// m-tile keeps Q, P and alpha in registers, which leaves room for a fourth V slot at d = 128 (7
// slots of 32 KB); d = 64 keeps 3 so that two CTAs fit per SM; four m-tiles need a P ring.
constexpr int stages_v(int D, int MT) { return MT == 1 ? (D == 128 ? 4 : 3) : 2; }
// CTAs per SM the shared-memory size allows (d = 64, one m-tile: two, with 128 registers each).
constexpr int min_ctas(int D, int MT) { return (D == 64 && MT == 1) ? 2 : 1; }

struct Params {
  // K/V caches as 3-D tensors {d, Hk, rows} for the copy engine (used when tma != 0): rows are
  // b * Lmax + key (contiguous) or page * page_size + slot (paged).
  CUtensorMap tmk, tmv;
  int tma, tma_box_rows;
  const void* q;  // [B, q_len, Hq, D]
  std::int64_t q_sb, q_st, q_sh;
  const void* k;  // contiguous [B, Lmax, Hk, D] or paged [pages, page_size, Hk, D]
  const void* v;
  std::int64_t k_s0, k_s1, k_sh;  // (batch | page), (key | slot), head strides in elements
  std::int64_t v_s0, v_s1, v_sh;
  const std::int32_t* page_table;  // nullptr: contiguous cache
  std::int64_t pt_stride;
  int log2_page;                   // page_size = 1 << log2_page
  const std::int32_t* seqlens;     // [B] device, nullptr: every sequence has lmax keys
  std::int64_t lmax;
  int batch, hk, group, q_len, rows;  // rows = group * q_len
  int causal;
  float scale_log2;                // softmax scale * log2(e)
  // Threshold (SPEC §3), per sequence: lam_mode 0 = dense, 1 = lambda = lam_value,
  // 2 = lambda = lam_value / Lk. lambda >= 1: that sequence runs dense.
  int lam_mode;
  double lam_value;
  int split_tiles, num_splits;
  // Seeded splits (SPEC §2a, max-first order in split-KV decode): each split's running maxima start
  // from the group's scores on the seed tiles (sink tile 0 and the last tile), not from -inf.
  // 2, 3: benchmark probes (BLASST_DECODE_SEED_PROBE load / score, decode_api.cu).
  int seeded;
  int splits_fastest;  // grid (Hk, splits, B) (default) or (splits, Hk, B) (BLASST_DECODE_GRID=splits)
  float* o_part;    // [B, Hk, splits, rows, D] normalised partial outputs
  float* lse_part;  // [B, Hk, splits, rows] natural-log LSE (-inf: nothing visible)
  unsigned long long* visited;  // [Hk] or nullptr
  unsigned long long* skipped;  // [Hk]
  unsigned long long* hist;     // [Hk, kHistBins] or nullptr
  unsigned long long* trace;    // diagnostic timeline [CTAs][kTracePoints] or nullptr (decode_api.cu)
};

struct MergeParams {
  const float* o_part;
  const float* lse_part;
  int batch, hk, group, q_len, rows, num_splits, dv;
  void* out;  // [B, q_len, Hq, dv]
  int out_dtype;  // 0 f32, 1 bf16, 2 f16, 3 f64
  std::int64_t o_sb, o_st, o_sh;
  void* lse;  // [B, Hq, q_len] or nullptr
  int lse_f64;
  std::int64_t l_sb, l_sh, l_st;
};

// Shared-memory bytes of the main kernel for head dim D and MT m-tiles. K/V slots hold the
// tensor-map image of a tile: 64-column halves of [128 keys][128 B], 128B swizzle (the cp.async
// fallback writes the same image), so the 8 rows an ldmatrix reads hit 8 different bank groups.
constexpr std::size_t kv_slot_bytes(int D) { return std::size_t(kTileKeys) * 2 * D; }

constexpr std::size_t smem_bytes(int D, int MT) {
  const std::size_t rings = std::size_t(stages_k(D, MT) + stages_v(D, MT)) * kv_slot_bytes(D);
  const std::size_t p_q_alpha = MT == 1 ? 0  // registers (Q staged once through a V slot)
                                        : std::size_t(stages_v(D, MT)) * MT * 16 * kTileKeys * 2  // P ring
                                              + std::size_t(MT) * 16 * D * 2                      // Q
                                              + std::size_t(stages_v(D, MT)) * MT * 16 * 4;       // alpha
  const std::size_t red = std::size_t(2) * kWarps * MT * 16 * 4 + std::size_t(stages_v(D, MT)) * 4;
  return rings + p_q_alpha + ((red + 7) & ~std::size_t(7)) + std::size_t(stages_k(D, MT) + stages_v(D, MT) + 2) * 8;
}
static_assert(smem_bytes(128, 1) <= 227 * 1024 && smem_bytes(128, 4) <= 227 * 1024, "d = 128 fits one CTA per SM");
static_assert(2 * (smem_bytes(64, 1) + 1024) <= 228 * 1024, "d = 64, one m-tile: two CTAs per SM");
// The one-m-tile epilogue sums the 8 warps' [16 x D] fp32 outputs in the K ring.
static_assert(std::size_t(8) * 16 * 128 * 4 <= 3 * kv_slot_bytes(128), "epilogue buffer fits the K ring");

template <class T, int D, bool kSkip, int MT>
void launch_decode(const Params& p, dim3 grid, std::size_t smem, cudaStream_t stream);
// Max CTAs per SM of an instantiation at this shared-memory size (0 on error).
template <class T, int D, bool kSkip, int MT>
int occupancy_decode(std::size_t smem);
// Combines the split partials into out / lse (launched with programmatic serialisation).
void launch_merge(const MergeParams& p, cudaStream_t stream);

}  // namespace blasst::detail::decode
