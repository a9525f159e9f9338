// Internal: validated, resolved problem descriptions shared by the reference and the kernels.
// validate_* throw blasst::Error naming the offending argument (shape, dtype, stride, device,
// cu_seqlens, page table, ...). Implemented in src/core/problem.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "blasst/blasst.hpp"

namespace blasst::detail {

struct ResolvedAttention {
  std::int64_t batch = 0;              // sequences
  std::int64_t hq = 0, hk = 0, d = 0, dv = 0;
  std::int64_t group = 1;              // hq / hk
  bool ragged = false;
  // Per sequence (host copies even when the problem's offsets live on the device). Exception:
  // device offsets with both max_seqlen_q and max_seqlen_k given (capture-safe call): the offsets
  // are not read, these vectors stay empty and max_*_len hold the given bounds.
  std::vector<std::int64_t> q_start, q_len, k_start, k_len;
  std::int64_t max_q_len = 0, max_k_len = 0;
  double scale = 0.0;
  MaskKind mask = MaskKind::full;
  DeviceKind device = DeviceKind::cpu;
  DType dtype = DType::f32;            // dtype of q/k/v (all equal)
};

struct ResolvedDecode {
  std::int64_t batch = 0, q_len = 0;
  std::int64_t hq = 0, hk = 0, d = 0, dv = 0, group = 1;
  bool paged = false;
  std::int64_t page_size = 0, num_pages = 0, max_pages_per_seq = 0, pages_per_seq = 0;
  // Per sequence (host copy); empty for device seqlens_k with max_seqlen_k given (not read).
  // Paged: max_pages_per_seq = page_table_stride (the rows' stride), pages_per_seq = the table's
  // columns (page_table_cols, or the stride), capacity = pages_per_seq * page_size.
  std::vector<std::int64_t> k_len;
  std::int64_t max_k_len = 0;
  double scale = 0.0;
  MaskKind mask = MaskKind::causal;
  DeviceKind device = DeviceKind::cpu;
  DType dtype = DType::f32;
};

// `device` says where the tensors must live; offsets/page tables on the device are copied to the
// host through copy_to_host (set by the CUDA layer; nullptr on CPU-only builds).
ResolvedAttention validate_attention(const AttentionProblem& p, DeviceKind device);
ResolvedDecode validate_decode(const DecodeProblem& p, DeviceKind device);

// SPEC §9 backward: the forward's checks of q, k, v, out, lse (on `device`), then dout like out,
// dq / dk / dv like q / k / v (dtype f32, f64 or q's; contiguous last dimension), dlse like lse
// (f32 or f64; needs lse).
ResolvedAttention validate_attention_backward(const AttentionBackwardProblem& p, DeviceKind device);
// The forward problem of a backward problem (its q, k, v, out, lse, offsets, mask, scale).
AttentionProblem forward_of(const AttentionBackwardProblem& p);
// A recorded skip set against the problem: the vote of skip.vote, dimensions [batch, hq,
// ceil(max_q / rows), ceil(max_k / tile_keys)], one bit per pair.
void validate_skip_set(const SkipSet& set, const SkipConfig& skip, std::int64_t batch, std::int64_t hq,
                       std::int64_t max_q, std::int64_t max_k);
// SPEC §2a default rule, shared by the reference and the prefill kernels' host code so that both
// visit in the same order: whether the sm_90a prefill kernel can run max-first on this problem
// (one order per 128-row CTA serves both 64-row vote groups exactly for causal masks, and for
// full masks only with Lq == Lk per sequence, checked on host-visible lengths), and the order a
// call actually uses: skip.vote.order, except that a defaulted max-first
// (skip.order_explicit == false) falls back to natural exactly where the kernel cannot do it.
// An explicit max-first is returned as is (the kernel path then refuses it).
bool prefill_supports_max_first(const ResolvedAttention& r);
VisitOrder effective_attention_order(const SkipConfig& skip, const ResolvedAttention& r);
// skip with vote.order = effective_attention_order(skip, r), marked explicit.
SkipConfig with_effective_order(const SkipConfig& skip, const ResolvedAttention& r);

// Copies n bytes from device memory to host; installed by the CUDA layer when it is built.
using DeviceToHostCopy = void (*)(void* dst, const void* src, std::size_t n);
extern DeviceToHostCopy copy_to_host;

}  // namespace blasst::detail
