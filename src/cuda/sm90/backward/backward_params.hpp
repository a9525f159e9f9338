// Internal: the plain-old-data description of one backward launch (SPEC §9), filled by
// backward_api.cu and read by the preprocess, main and postprocess kernels. No CuTe here, so the
// host side compiles fast.
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace blasst::sm90::backward {

// Strides in elements of a [B, L, H, x] tensor (batched) or a [T, H, x] tensor (ragged, batch = 0);
// the last (head-dim) stride is 1.
struct RowStrides {
  std::int64_t row = 0, head = 0, batch = 0;
};
// Strides of an LSE-shaped [B, H, L] (batched) or [H, T] (ragged, batch = 0) tensor.
struct LseStrides {
  std::int64_t batch = 0, head = 0, row = 0;
};

// Rows of a forward vote group: one skip-set bit per (vote group, key tile) (SPEC §9).
inline constexpr int kVoteRows = 64;
// The vote groups of a sequence of len_q rows.
BLASST_HOST_DEVICE int vote_groups(int len_q) { return (len_q + kVoteRows - 1) / kVoteRows; }

// Rows of the LSE / D workspace per alignment unit (512 bytes of f32), a multiple of the vote
// group, so that every group's rows (one slot of a backward step: its LSE / D bulk copies and its
// 64-row dQ tile) are one aligned run inside its sequence's own rows.
inline constexpr int kLseRowAlign = 128;

// One CTA of a work list: key block n_block of KV head kh, all query heads of the group (part
// -1) or query head `part` of it, writing its f32 dK / dV to split block `split`'s slots.
struct WorkItem {
  int n_block, kh, part, split;
};
// A key block that ran as parts: launch_split_sum adds its group parts into dk / dv.
struct SplitBlock {
  int kh, n_block;
};

struct BackwardParams {
  // Inputs (q, k, v, dout in the element type of the instance; out and dout may be f32).
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;
  const void* dout = nullptr;
  const float* lse = nullptr;   // the forward's LSE over kept keys (natural log), required
  const float* dlse = nullptr;  // optional upstream gradient into the LSE
  RowStrides q_s, k_s, v_s, out_s, dout_s, dq_s, dk_s, dv_s;
  // dO as the main kernel reads it: p.dout itself when it is in the instance's element type, else
  // (f32 dout) a copy rounded to it by the preprocess, [tokens_q, hq, d] in the workspace.
  void* dout_conv = nullptr;
  const void* dout_main = nullptr;
  RowStrides dout_main_s;
  LseStrides lse_s, dlse_s;
  bool out_f32 = false, dout_f32 = false;
  // Outputs: q's dtype, or f32 where the flag says so.
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  bool dq_f32 = false, dk_f32 = false, dv_f32 = false;

  int batch = 0, hq = 0, hk = 0, group = 1;
  // Batched: the per-sequence lengths. Ragged: cu_q / cu_k (device offsets, batch + 1 each).
  int len_q = 0, len_k = 0;
  const int* cu_q = nullptr;
  const int* cu_k = nullptr;
  // Extent of the query token axis over the call: B * Lq (batched) or q.shape[0] (ragged). The
  // workspace arrays below are indexed by (head, token) with token = b * Lq + i or cu_q[b] + i.
  int tokens_q = 0;
  int tokens_k = 0;  // the key token axis: B * Lk or k.shape[0] (the wgmma kernel's TMA extent)
  int num_n_blocks = 0;  // key blocks of the longest sequence
  int causal_section_heads = 1;  // causal launch order: KV heads per section (BackwardScheduler)
  float scale = 0.f, scale_log2 = 0.f;
  bool causal = false;

  // SPEC §9 skip set, uploaded: one bit per (sequence, query head, vote group of 64 rows, key
  // tile of 128 keys), index ((b * hq + h) * skip_groups + g) * skip_tiles + t, little-endian
  // within a byte. nullptr: dense.
  const std::uint8_t* skip_bits = nullptr;
  std::int64_t skip_groups = 0, skip_tiles = 0;
  // With a skip set and GQA / MQA, the CTAs run from a work list (backward_work_list.hpp) instead
  // of the fixed launch order: the kept vote groups of each (key block, KV head) are counted on the
  // device; a heavy block, one that keeps >= kHeavyNum / kHeavyDen x its sequence's mean (key
  // block 0 does: SPEC 2a makes it every group's first visited tile; so do a model's heavy-hitter
  // keys), runs first, as one CTA per query head of its KV group (a part); the others follow in
  // the fixed launch order. Per sequence b:
  // work_list[b * work_items + i] for i < work_count[b] (grid x = work_items; CTAs past the count
  // exit); split block s of b is splits[b * split_cap + s] (s < split_count[b]), its parts write
  // f32 dK / dV to dkv_part (dkv_part_index) and launch_split_sum adds them in part order.
  // nullptr work_list: dense, the fixed order (launch_block_and_head).
  const WorkItem* work_list = nullptr;
  const int* work_count = nullptr;
  int work_items = 0;
  const SplitBlock* splits = nullptr;
  const int* split_count = nullptr;
  int split_cap = 0;
  float* dkv_part = nullptr;

  // Workspace (backward_api.cu): [hq, rows_ld] LSE in log2 units (+inf for a row that saw no key,
  // and in a sequence's padding: its P is 0) and D = rowsum(dO * O) - dLSE (0 in the padding);
  // the f32 dQ accumulator over the same padded rows in 64 x 64 tiles (dq_accum_index; zeroed
  // before the main kernel, scaled and converted by the postprocess). In the LSE / D rows every
  // sequence starts at a multiple of kLseRowAlign (lse_row_start) and owns its length rounded up
  // to one, so that the rows of one query block (64 or 128 rows) are one aligned run (one bulk
  // copy into shared memory in the wgmma kernel).
  float* lse_log2 = nullptr;
  float* dsum = nullptr;
  // per head: B * round_up(Lq, A) batched, round_up(tokens_q + A B, A) ragged; A = kLseRowAlign
  int rows_ld = 0;
  float* dq_accum = nullptr;
  int head_dim = 0;
};

// The f32 dQ accumulator: [hq][rows_ld / 64 row blocks][d / 64 column tiles][4096], each 64 x 64
// tile in the order a wgmma warpgroup's C fragment holds it, so that the wgmma kernel writes a
// warpgroup's tile to shared memory as 8 conflict-free 16-byte stores a thread (no swizzle, no
// reordering) and adds it into the workspace with one 16 KB bulk reduce-add. Element (r, c) of a
// tile is held by thread t = 32 (r / 16) + 4 (r % 8) + (c % 8) / 2 at fragment index
// i = c % 2 + 2 ((r % 16) / 8) + 4 (c / 8) (GMMA's 64 x N f32 C layout), and lives at float
// (i / 4 * 128 + t) * 4 + i % 4 of the tile: the 4 column pairs (c, c + 1) of one row's 8-column
// group (c % 8 = 0, 2, 4, 6: threads t .. t + 3) lie 4 floats apart. A tile's rows past its
// sequence's end are the sequence's own padding (rows_ld), which nothing reads.
// tests/gpu_backward/test_wgmma_layouts.cu checks the mapping against CuTe's partition of the dQ
// product.
inline constexpr int kDqTile = 64;
BLASST_HOST_DEVICE std::int64_t dq_tile_offset(int h, std::int64_t padded_row, int col, int rows_ld, int head_dim) {
  return ((std::int64_t(h) * (rows_ld / kDqTile) + padded_row / kDqTile) * (head_dim / kDqTile) + col / kDqTile) *
         (kDqTile * kDqTile);
}
BLASST_HOST_DEVICE int dq_in_tile(int r, int c) {
  const int t = 32 * (r / 16) + 4 * (r % 8) + (c % 8) / 2;
  const int i = c % 2 + 2 * ((r % 16) / 8) + 4 * (c / 8);
  return (i / 4 * 128 + t) * 4 + i % 4;
}
// The accumulator element of (query head h, padded row, column): padded_row = lse_row_start of
// the sequence + the row's position in it.
BLASST_HOST_DEVICE std::int64_t dq_accum_index(int h, std::int64_t padded_row, int col, int rows_ld, int head_dim) {
  return dq_tile_offset(h, padded_row, col, rows_ld, head_dim) + dq_in_tile(int(padded_row % kDqTile), col % kDqTile);
}

// Whether every row of a [B, L, H, d] / [T, H, d]-shaped tensor can be written `vec_elems`
// elements at a time from an element offset that is a multiple of vec_elems: the pointer aligned
// to vec_elems elements and every stride a multiple of vec_elems.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline bool rows_vectorizable(const void* base, const RowStrides& s, int elem_bytes, int vec_elems) {
  return reinterpret_cast<std::uintptr_t>(base) % (std::uintptr_t(elem_bytes) * vec_elems) == 0 &&
         s.row % vec_elems == 0 && s.head % vec_elems == 0 && s.batch % vec_elems == 0;
}

// First LSE / D row of sequence b (of length len_q when batched). Ragged, with A = kLseRowAlign:
// (cu_q[b] + A b) rounded down to a multiple of A, which is >= the previous sequence's start plus
// its length rounded up to A (so sequences never overlap) and < rows_ld - round_up(len_b, A) + 1.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline std::int64_t lse_row_start(int b, int len_q, const int* cu_q) {
  if (cu_q == nullptr) return std::int64_t(b) * ((len_q + kLseRowAlign - 1) / kLseRowAlign * kLseRowAlign);
  return (std::int64_t(cu_q[b]) + std::int64_t(b) * kLseRowAlign) / kLseRowAlign * kLseRowAlign;
}

// The inverse of lse_row_start: sequence b, position i and length len of padded row `padded`;
// false for a padding row (batched: len_q rows in round_up(len_q, A) per sequence, B of them).
BLASST_HOST_DEVICE bool padded_position(std::int64_t padded, int batch, int len_q, const int* cu_q, int& b, int& i, int& len) {
  if (cu_q == nullptr) {
    const std::int64_t per = (std::int64_t(len_q) + kLseRowAlign - 1) / kLseRowAlign * kLseRowAlign;
    if (per == 0) return false;
    b = int(padded / per);
    i = int(padded - std::int64_t(b) * per);
    len = len_q;
    return b < batch && i < len;
  }
  int lo = 0, hi = batch - 1;  // the last b whose rows start at or before `padded` (starts increase)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (lse_row_start(mid, len_q, cu_q) <= padded) lo = mid;
    else hi = mid - 1;
  }
  b = lo;
  const std::int64_t at = padded - lse_row_start(b, len_q, cu_q);
  len = cu_q[b + 1] - cu_q[b];
  i = int(at);
  return at >= 0 && at < len;
}

// The postprocess's read of a 64 x 64 dQ accumulator tile by one warpgroup: thread t's float4
// number blk (of 8) is the tile's floats [4 (128 blk + t), + 4), which dq_in_tile gives as columns
// c, c + 1 of row r (x, y) and of row r + 8 (z, w), c = 8 blk + 2 (t % 4) (tests/gpu_backward:
// PostprocessTileRead). So each load instruction of a warp reads 512 contiguous bytes.
BLASST_HOST_DEVICE void dq_tile_read(int t, int blk, int& r, int& c) {
  r = 16 * (t / 32) + (t % 32) / 4;
  c = 8 * blk + 2 * (t % 4);
}

// KV heads per section of the causal launch order (BackwardScheduler): the largest divisor of hk
// that makes at most about kCausalSectionTiles (128 x 128) tiles of work, at least 1. A section
// is launched longest key block first across its heads. Few heads per section keep the CTAs that
// run side by side on the same query rows (L2 reuse of Q, dO and the dQ accumulator); many give
// the longest-first order enough CTAs to even out the last wave; a divisor, because a short last
// section leaves an uneven tail. Measured on the H200 (d 128, B 1, H 32, TFLOP/s, bench/RESULTS.md
// 2026-12-04): GQA 32/8 at 8k, 1 / 2 / 3 / 4 / 8 heads: 401-404 / 476-484 / 422 / 480 / 477; at
// 16k: 478-480 / 470 / - / 469 / 469; MHA at 8k, 1 / 3 / 8 / 15 / 32 heads: 445 / 448-452 /
// 463-468 / 441 / 442-467; at 16k: 480-484 / 481 / 473 / 479 (15) / 452. A list-scheduling model
// of the 132 SMs (tail over the balanced time) gives the same ranking: GQA 8k 1.23 / 1.01 / 1.18 /
// 1.00 / 1.00, MHA 8k 1.06 / 1.05 / 1.00 / 1.06 / 1.00. The rule picks 2 / 1 / 8 / 2 heads for
// GQA 8k, 16k and MHA 8k, 16k. A prime hk falls back to one head a section (the launch order
// before this rule).
inline constexpr std::int64_t kCausalSectionTiles = 32768;
inline int causal_launch_section_heads(int hk, int group, int num_n_blocks) {
  const std::int64_t nb = num_n_blocks;
  const std::int64_t per_head = std::int64_t(group) * nb * (nb + 1) / 2;  // tiles of one KV head (Lq = Lk)
  const std::int64_t fit = per_head > 0 ? kCausalSectionTiles / per_head : hk;
  for (int s = static_cast<int>(fit < hk ? fit : hk); s > 1; --s)
    if (hk % s == 0) return s;
  return 1;
}

// (key block, KV head) of launch index x in [0, num_n_blocks * hk) (BackwardScheduler's grid x).
// Full mask: head-major. Causal: sections of section_heads KV heads (the last one may hold fewer),
// each walked key block outer, KV head inner, so a section's longest blocks launch first.
// sink_first (calls with a skip set and no work list: MHA, backward_api.cu): key block 0 of every
// KV head first, then the order above over blocks 1.. . SPEC §2 / §2a: a vote group's first
// visited tile is never skipped, and both orders visit tile 0 first (natural: 0, 1, ...; max-first: the sink tile 0, then the own tile),
// so block 0 keeps every vote group of every query head: dense work, where the other blocks keep
// 1 - s of theirs. Head-major, the last head's block 0 starts near the end and runs alone (a tail
// of about one dense CTA: ~0.2 ms at d 64, 8k); first, it runs beside the light blocks.
BLASST_HOST_DEVICE void launch_block_and_head(int x, int num_n_blocks, int hk, bool causal, int section_heads,
                                              bool sink_first, int& n_block, int& kh) {
  int first_block = 0;
  if (sink_first && num_n_blocks > 1) {
    if (x < hk) {
      n_block = 0;
      kh = x;
      return;
    }
    x -= hk;
    first_block = 1;
  }
  const int nb = num_n_blocks - first_block;
  if (!causal) {
    kh = x / nb;
    n_block = first_block + (x - kh * nb);
    return;
  }
  const int per_section = section_heads * nb;
  const int section = x / per_section, r = x - section * per_section;
  const int first = section * section_heads;
  const int heads = hk - first < section_heads ? hk - first : section_heads;
  const int block = r / heads;
  n_block = first_block + block;
  kh = first + (r - block * heads);
}

// The work list's rules. A block is heavy when it keeps >= kHeavyNum / kHeavyDen x the mean kept
// vote groups of its sequence's blocks (and more than none): heavy blocks run first (by the fixed
// order's section, longest first within one), each split into one CTA per query head when the
// KV group has several (within split_capacity); every other block keeps its place in the fixed launch order (its L2 reuse: a
// list sorted by kept work throughout ran the full-mask MHA rows 1.37-1.55x slower, H100,
// 2026-12-07). A CTA's cost for that order is kCtaFixedCost + its kept vote groups (the fixed
// part: loading K / V, writing dK / dV, ~2 steps). The split blocks' f32 parts take at most
// kSplitPartBudget bytes over the call. A heavy block is split only when its cost is above
// kSplitShareNum / kSplitShareDen of an SM's share of the call (every sequence's kept vote groups
// plus kCtaFixedCost a block, over the device's SMs): below that, longest first keeps it within
// the list's bound whole, and a part costs more SM time per kept group than a whole block (H100 /
// H200, 2026-12-07: +12.6 % SM cycles, long-scoreboard stalls on the Q / dO stages; the heavy set
// at 50 % ran 10 % slower split than whole).
inline constexpr int kHeavyNum = 3, kHeavyDen = 2;
inline constexpr int kSplitShareNum = 1, kSplitShareDen = 1;
inline constexpr int kCtaFixedCost = 2;
inline constexpr std::int64_t kSplitPartBudget = std::int64_t(64) << 20;
inline constexpr int kSplitKeys = 128;  // the key block (BackwardTraits::kBlockN)

// Split blocks per sequence: 0 without GQA (a part would be the whole block), else as many as
// the budget allows (at least one: key block 0 is always heavy), at most every block.
BLASST_HOST_DEVICE int split_capacity(int batch, int hk, int group, int num_n_blocks, int head_dim) {
  if (group <= 1 || num_n_blocks <= 0 || batch <= 0) return 0;
  const std::int64_t per_block = std::int64_t(group) * 2 * kSplitKeys * head_dim * 4;
  std::int64_t cap = kSplitPartBudget / (per_block * batch);
  if (cap < 1) cap = 1;
  const std::int64_t all = std::int64_t(num_n_blocks) * hk;
  return int(cap < all ? cap : all);
}
// Work items per sequence (grid x): every block once, plus group - 1 more for each split one.
BLASST_HOST_DEVICE int work_items_capacity(int num_n_blocks, int hk, int group, int split_cap) {
  return num_n_blocks * hk + split_cap * (group - 1);
}

// Element offset of (sequence b, split block s, part, 0 = dK / 1 = dV, key of the block, column)
// in BackwardParams::dkv_part: [batch][split_cap][group][2][kSplitKeys][d].
BLASST_HOST_DEVICE std::int64_t dkv_part_index(int b, int split_cap, int s, int group, int part, int which, int key,
                                               int col, int head_dim) {
  return (((((std::int64_t(b) * split_cap + s) * group + part) * 2 + which) * kSplitKeys + key) * head_dim) + col;
}

}  // namespace blasst::sm90::backward
