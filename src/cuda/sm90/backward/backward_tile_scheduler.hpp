// Internal: which work one backward CTA owns, and which of its (query head, query block) steps
// the skip set removes. Grid (key blocks of the longest sequence x KV heads, sequences): a CTA
// owns dK / dV of one 128-key block of one KV head and visits the query blocks of its g query
// heads that see the block (causal: from the first row whose diagonal reaches it).
//
// Launch order (blockIdx.x -> key block, KV head). Full mask: head-major, every CTA the same work.
// Causal: key block n sees len_q - 128 n rows, so block 0 is the longest; head-major order
// launches the last head's long blocks at the very end and leaves a tail (a list-scheduling model
// on 132 SMs: +5.8 % over the balanced time at B 1, H 32, L 8k; +0.5 % at 16k). So causal runs
// longest first: key block outer, KV head inner, over sections of causal_launch_section_heads
// KV heads (backward_params.hpp: the largest divisor of hk within about 32k tiles of work, a
// measured compromise between the L2 reuse of few heads side by side and the even last wave of
// many; the next section starts as this one's short blocks end).
#pragma once

#include <cstdint>

#include "cuda/sm90/backward/backward_params.hpp"

namespace blasst::sm90::backward {

struct BackwardWork {
  int b = 0, kh = 0, n_block = 0;
  int len_q = 0, len_k = 0;
  // Offsets of the sequence in the token axes (ragged: cu_q[b], cu_k[b]; batched: 0, and the
  // batch strides apply).
  int q_start = 0, k_start = 0;
  int row_start = 0;  // its first row in the LSE / D workspace (lse_row_start: kLseRowAlign-aligned)
  int m_begin = 0, m_end = 0;  // query blocks [m_begin, m_end) that can see the key block
};

struct BackwardScheduler {
  static dim3 grid(const BackwardParams& p) {
    return dim3(unsigned(p.num_n_blocks) * unsigned(p.hk), 1u, unsigned(p.batch));
  }

  // False when the CTA's key block lies past its sequence's end (nothing to write).
  template <int kBlockM, int kBlockN>
  __device__ static bool get(const BackwardParams& p, BackwardWork& w) {
    launch_block_and_head(int(blockIdx.x), p.num_n_blocks, p.hk, p.causal, p.causal_section_heads, w.n_block, w.kh);
    w.b = int(blockIdx.z);
    if (p.cu_q != nullptr) {
      w.q_start = p.cu_q[w.b];
      w.k_start = p.cu_k[w.b];
      w.len_q = p.cu_q[w.b + 1] - w.q_start;
      w.len_k = p.cu_k[w.b + 1] - w.k_start;
    } else {
      w.len_q = p.len_q;
      w.len_k = p.len_k;
    }
    w.row_start = int(lse_row_start(w.b, p.len_q, p.cu_q));
    const int n0 = w.n_block * kBlockN;
    if (n0 >= w.len_k) return false;
    w.m_end = (w.len_q + kBlockM - 1) / kBlockM;
    w.m_begin = 0;
    if (p.causal) {
      // SPEC §1: row i sees key j iff j <= i + Lk - Lq; the first row that sees key n0.
      const int first_row = n0 - (w.len_k - w.len_q);
      w.m_begin = first_row > 0 ? first_row / kBlockM : 0;
    }
    return true;
  }

  // The skip-set bit of (query head h, vote group g of kVoteRows rows) for this CTA's key block.
  __device__ static bool skipped(const BackwardParams& p, const BackwardWork& w, int h, int g) {
    if (p.skip_bits == nullptr) return false;
    const std::int64_t i = ((std::int64_t(w.b) * p.hq + h) * p.skip_groups + g) * p.skip_tiles + w.n_block;
    return (p.skip_bits[i >> 3] >> (i & 7)) & 1u;
  }

  // Steps of G vote groups (the kernel's query block, G x kVoteRows rows): step m holds groups
  // [G m, G m + G). Bit r of kept_groups: group G m + r exists in the sequence and the skip set
  // keeps it for this key block (SPEC §9: a skipped group's rows are masked in the step; a step
  // with no kept group does not run). The same answer in every thread.
  template <int G>
  __device__ static unsigned kept_groups(const BackwardParams& p, const BackwardWork& w, int h, int m) {
    const int groups = vote_groups(w.len_q);
    unsigned bits = 0;
    for (int r = 0; r < G; ++r) {
      const int g = G * m + r;
      if (g < groups && !skipped(p, w, h, g)) bits |= 1u << r;
    }
    return bits;
  }

  // 1 when some step of the CTA (any query head of its KV group, any of its query blocks) is
  // kept, as seen by this thread's share of the steps (x = tid, tid + nthreads, ...); the caller
  // ORs it over the CTA (__syncthreads_or). SPEC §9: a key block with none kept costs no work.
  template <int G = 1>
  __device__ static int kept_share(const BackwardParams& p, const BackwardWork& w, int tid, int nthreads) {
    const int nm = w.m_end - w.m_begin;
    for (int x = tid; x < p.group * nm; x += nthreads)
      if (kept_groups<G>(p, w, w.kh * p.group + x / nm, w.m_begin + x % nm) != 0) return 1;
    return 0;
  }

  // The CTA's vote groups as a bitmask in shared memory, read from the skip set once by the whole
  // CTA (bit x = hh * G nm + j: group G m_begin + j of query head hh of the KV group is kept, with
  // nm steps per head, so that a step's G bits are consecutive), so that walking to the next kept
  // step costs no global load per skipped step. Each warp fills whole 32-bit words with one ballot.
  // Returns this thread's share of "some step is kept" (the caller ORs it over the CTA with
  // __syncthreads_or, which also publishes the words). Only for a skip set whose bits fit:
  // kept_words_needed(p, w) <= capacity (else kept_share / the global walk).
  template <int G = 1>
  __device__ static int kept_words_needed(const BackwardParams& p, const BackwardWork& w) {
    return (p.group * G * (w.m_end - w.m_begin) + 31) / 32;
  }
  template <int G = 1>
  __device__ static int load_kept_words(const BackwardParams& p, const BackwardWork& w, std::uint32_t* words,
                                        int tid, int nthreads) {
    const int ng = G * (w.m_end - w.m_begin), n = p.group * ng, nwords = (n + 31) / 32;
    const int groups = vote_groups(w.len_q), lane = tid % 32;
    int any = 0;
    for (int wd = tid / 32; wd < nwords; wd += nthreads / 32) {  // the same trip count in a warp
      const int x = wd * 32 + lane;
      const int g = G * w.m_begin + x % ng;
      const bool kept = x < n && g < groups && !skipped(p, w, w.kh * p.group + x / ng, g);
      const std::uint32_t bits = __ballot_sync(0xffffffffu, kept);
      if (lane == 0) words[wd] = bits;
      any |= int(kept);
    }
    return any;
  }
  // next_kept over those words (nullptr: the skip set in global memory, below).
  template <int G = 1>
  __device__ static bool next_kept(const BackwardParams& p, const BackwardWork& w, const std::uint32_t* words,
                                   int& hh, int& m) {
    if (words == nullptr) return next_kept<G>(p, w, hh, m);
    const int ng = G * (w.m_end - w.m_begin), n = p.group * ng;
    int x = hh * ng + G * (m - w.m_begin);  // m == m_end reads as the next head's first block
    while (x < n) {
      const std::uint32_t rest = words[x >> 5] >> (x & 31);
      if (rest != 0) {
        x += __ffs(int(rest)) - 1;  // bits past n are 0: x < n here
        hh = x / ng;
        m = w.m_begin + x % ng / G;
        return true;
      }
      x = (x | 31) + 1;
    }
    return false;
  }
  // The kept groups of step (hh, m) (kept_groups' bits) from those words, or from the skip set in
  // global memory (nullptr).
  template <int G>
  __device__ static unsigned kept_groups(const BackwardParams& p, const BackwardWork& w, const std::uint32_t* words,
                                         int hh, int m) {
    if (words == nullptr) return kept_groups<G>(p, w, w.kh * p.group + hh, m);
    const int x = hh * G * (w.m_end - w.m_begin) + G * (m - w.m_begin);
    unsigned bits = 0;
    for (int r = 0; r < G; ++r) bits |= ((words[(x + r) >> 5] >> ((x + r) & 31)) & 1u) << r;
    return bits;
  }

  // The first step at or after (query head hh of the KV group, query block m), in that order,
  // that the skip set keeps; false when none is left. The same answer in every thread.
  template <int G = 1>
  __device__ static bool next_kept(const BackwardParams& p, const BackwardWork& w, int& hh, int& m) {
    while (hh < p.group) {
      if (m >= w.m_end) {
        ++hh;
        m = w.m_begin;
        continue;
      }
      if (kept_groups<G>(p, w, w.kh * p.group + hh, m) != 0) return true;
      ++m;
    }
    return false;
  }
};

}  // namespace blasst::sm90::backward
