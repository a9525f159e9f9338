// Internal: the plain-old-data description of one decode launch (the split kernel, which also
// merges its splits: decode_merge.cuh), filled by decode_api.cu. Host and device code; no kernel code here.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>

#include "blasst/blasst.hpp"
#include "cuda/sm90/common/skip_policy.hpp"

namespace blasst::sm90::decode {

struct Params {
  // K/V caches as 4-D tensor maps {d, keys or slots, Hk, sequences or pages} for the copy engine
  // (tma != 0; else 16-byte cp.async per thread into the same swizzled image).
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
  SkipThreshold threshold;         // lambda per sequence (SPEC §3; skip_policy.hpp)
  int split_tiles, num_splits;
  // Seeded splits (SPEC §2a, max-first order in split-KV decode): each split's running maxima start
  // from the group's scores on the seed tiles (sink tile 0 and the last tile), not from -inf.
  int seeded;
  float* o_part;    // [B, Hk, splits, rows, D] normalised partial outputs
  float* lse_part;  // [B, Hk, splits, rows] natural-log LSE (-inf: nothing visible)
  // The merge (decode_merge.cuh): one flag per split and this call's epoch (a raised flag's value).
  unsigned long long* split_flags;  // [B, Hk, splits]
  unsigned long long split_epoch;   // fresh per call, never 0
  void* out;  // [B, q_len, Hq, D]
  DType out_dtype;  // f32, f64, bf16 or f16
  std::int64_t o_sb, o_st, o_sh;
  void* lse;  // [B, Hq, q_len] or nullptr
  DType lse_dtype;  // f32 or f64
  std::int64_t l_sb, l_sh, l_st;
  unsigned long long* visited;  // [Hk] or nullptr
  unsigned long long* skipped;  // [Hk]
  unsigned long long* hist;     // [Hk, kHistSlots] or nullptr
#ifdef BLASST_DECODE_TRACE
  unsigned long long* trace;    // diagnostic timeline [CTAs][kTracePoints] (decode_trace.cuh)
#endif
};

}  // namespace blasst::sm90::decode
