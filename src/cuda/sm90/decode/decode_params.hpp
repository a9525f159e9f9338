// Internal: parameters and launchers of the decode kernels (host and device code).
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace blasst::detail::decode {

// Warps per CTA: 8 (the default since the H200 run of 62881c8: 1.15-1.17x the 4-warp kernel's
// dense bandwidth, skip faster in absolute time too) or 4 (BLASST_DECODE_WARPS=4). With 8, each
// warp takes half the keys of S and half the output columns of P.V, so two warps per scheduler
// overlap the per-tile latency chain that limits the 4-warp kernel (bench/results/decode_log.md).
constexpr int kDefaultWarps = 8;
constexpr int kTileKeys = 128;  // SPEC §2 tile
constexpr int kMaxRows = 64;    // g * q_len
constexpr int kStagesK = 3;     // K ring depth
constexpr int kStagesV = 2;     // V / P ring depth (P.V runs one tile behind the scores)
constexpr int kHistBins = 1024 + 2;  // DeltaHistogram::kBins + 2

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
  int batch, hk, group, q_len, rows, mtiles;  // rows = group * q_len, mtiles = ceil(rows / 16)
  int causal;
  float scale_log2;                // softmax scale * log2(e)
  // Threshold (SPEC §3), per sequence: lam_mode 0 = dense, 1 = lambda = lam_value,
  // 2 = lambda = lam_value / Lk. lambda >= 1: that sequence runs dense.
  int lam_mode;
  double lam_value;
  int split_tiles, num_splits;
  float* o_part;    // [B, Hk, splits, rows, D] normalised partial outputs
  float* lse_part;  // [B, Hk, splits, rows] natural-log LSE (-inf: nothing visible)
  unsigned long long* visited;  // [Hk] or nullptr
  unsigned long long* skipped;  // [Hk]
  unsigned long long* hist;     // [Hk, kHistBins] or nullptr
  int bulk;  // without tma: 1 = one cp.async.bulk per key row, 0 = 16-byte cp.async per thread
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

// Shared-memory bytes of the main kernel for head dim D and rows padded to mtiles * 16.
// K/V tiles are stored row-padded: rows of 2D + 16 bytes, so the 8 rows an ldmatrix reads fall on
// 8 different bank groups and each key row stays one contiguous destination for a bulk copy.
constexpr int kv_row_bytes(int D) { return 2 * D + 16; }

constexpr std::size_t smem_bytes(int D, int mtiles, int warps) {
  return std::size_t(kStagesK + kStagesV) * kTileKeys * kv_row_bytes(D)  // K, V rings
         + std::size_t(kStagesV) * mtiles * 16 * kTileKeys * 2  // P ring
         + std::size_t(mtiles) * 16 * D * 2                     // Q
         + std::size_t(kStagesV) * kMaxRows * 4                 // alpha ring
         + std::size_t(2) * warps * kMaxRows * 4                // row-max exchange (2 buffers)
         + std::size_t(kStagesK + kStagesV) * 8;                // mbarriers
}

template <class T, int D, bool kSkip, int W>
void launch_decode(const Params& p, dim3 grid, std::size_t smem, cudaStream_t stream);
// Max CTAs per SM of an instantiation at this shared-memory size (0 on error).
template <class T, int D, bool kSkip, int W>
int occupancy_decode(std::size_t smem);
// Combines the split partials into out / lse (launched with programmatic serialisation).
void launch_merge(const MergeParams& p, cudaStream_t stream);

}  // namespace blasst::detail::decode
