// Internal: the plain-old-data description of one backward launch (SPEC §9), filled by
// backward_api.cu and read by the preprocess, main and postprocess kernels. No CuTe here, so the
// host side compiles fast.
#pragma once

#include <cstdint>

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
  int num_n_blocks = 0;  // key blocks of the longest sequence (grid x)
  float scale = 0.f, scale_log2 = 0.f;
  bool causal = false;

  // SPEC §9 skip set, uploaded: one bit per (sequence, query head, vote group of 64 rows, key
  // tile of 128 keys), index ((b * hq + h) * skip_groups + g) * skip_tiles + t, little-endian
  // within a byte. nullptr: dense.
  const std::uint8_t* skip_bits = nullptr;
  std::int64_t skip_groups = 0, skip_tiles = 0;

  // Workspace (backward_api.cu): [hq, tokens_q] LSE in log2 units (+inf for a row that saw no
  // key: its P is 0) and D = rowsum(dO * O) - dLSE; [tokens_q, hq, d] f32 dQ accumulator (zeroed
  // before the main kernel, scaled and converted by the postprocess).
  float* lse_log2 = nullptr;
  float* dsum = nullptr;
  float* dq_accum = nullptr;
  int head_dim = 0;
};

}  // namespace blasst::sm90::backward
