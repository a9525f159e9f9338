// Internal: which work one backward CTA owns, and which of its (query head, vote group) pairs the
// skip set removes (the kernels walk only the kept ones: one a step in the mma.sync kernel, G a
// step in the wgmma kernel, BackwardStep). Grid (key blocks of the longest sequence x KV heads, sequences): a CTA
// owns dK / dV of one 128-key block of one KV head and visits the query blocks of its g query
// heads that see the block (causal: from the first row whose diagonal reaches it).
//
// Launch order (blockIdx.x -> key block, KV head). Without a skip set: full mask head-major,
// every CTA the same work; causal: key block n sees len_q - 128 n rows, so block 0 is the longest;
// head-major order launches the last head's long blocks at the very end and leaves a tail (a
// list-scheduling model on 132 SMs: +5.8 % over the balanced time at B 1, H 32, L 8k; +0.5 % at
// 16k). So causal runs longest first: key block outer, KV head inner, over sections of
// causal_launch_section_heads KV heads (backward_params.hpp: the largest divisor of hk within
// about 32k tiles of work, a measured compromise between the L2 reuse of few heads side by side
// and the even last wave of many; the next section starts as this one's short blocks end).
// With a skip set the work per block is the set's, not the mask's. GQA / MQA: the work list
// (backward_work_list.hpp) runs the heavy blocks (key block 0, heavy-hitter keys) first, split by
// query head, and the others in this order. MHA: this order with key block 0 of every KV head
// first (sink_first: block 0 keeps every vote group, SPEC 2a).
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
  // Query heads [hh_begin, hh_end) of the KV group this CTA walks: all of them, or one for a part
  // of a split block (part >= 0: dK / dV go to the f32 slot of (split, part) in
  // BackwardParams::dkv_part).
  int hh_begin = 0, hh_end = 0, part = -1, split = -1;
};

// One step of the wgmma kernel: G kept vote groups (slot r: query head hh[r] of the KV group, vote
// group g[r]); bit r of live is clear for a slot that only repeats the one before it (masked).
template <int G>
struct BackwardStep {
  int hh[G];
  int g[G];
  unsigned live;
};

// The index of the lowest set bit of v (v != 0).
BLASST_HOST_DEVICE int first_set_bit(std::uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __ffs(int(v)) - 1;
#else
  return __builtin_ctz(v);
#endif
}

struct BackwardScheduler {
  static dim3 grid(const BackwardParams& p) {
    const int x = p.work_list != nullptr ? p.work_items : p.num_n_blocks * p.hk;
    return dim3(unsigned(x), 1u, unsigned(p.batch));
  }

  // False when the CTA has nothing to write: its key block lies past its sequence's end, or (work
  // list) its index is past the sequence's list.
  template <int kBlockM, int kBlockN>
  __device__ static bool get(const BackwardParams& p, BackwardWork& w) {
    w.b = int(blockIdx.z);
    w.part = w.split = -1;
    if (p.work_list != nullptr) {
      if (int(blockIdx.x) >= p.work_count[w.b]) return false;
      const WorkItem it = p.work_list[std::int64_t(w.b) * p.work_items + blockIdx.x];
      w.n_block = it.n_block;
      w.kh = it.kh;
      w.part = it.part;
      w.split = it.split;
    } else {
      launch_block_and_head(int(blockIdx.x), p.num_n_blocks, p.hk, p.causal, p.causal_section_heads,
                            p.skip_bits != nullptr, w.n_block, w.kh);
    }
    w.hh_begin = w.part >= 0 ? w.part : 0;
    w.hh_end = w.part >= 0 ? w.part + 1 : p.group;
    return locate<kBlockM, kBlockN>(p, w);
  }

  // The sequence of w.b and the query blocks of kBlockM rows that see key block w.n_block (of
  // kBlockN keys); false when the block lies past the sequence's end.
  template <int kBlockM, int kBlockN>
  BLASST_HOST_DEVICE static bool locate(const BackwardParams& p, BackwardWork& w) {
    if (p.cu_q != nullptr) {
      w.q_start = p.cu_q[w.b];
      w.k_start = p.cu_k[w.b];
      w.len_q = p.cu_q[w.b + 1] - w.q_start;
      w.len_k = p.cu_k[w.b + 1] - w.k_start;
    } else {
      w.q_start = w.k_start = 0;
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
  BLASST_HOST_DEVICE static bool skipped(const BackwardParams& p, const BackwardWork& w, int h, int g) {
    if (p.skip_bits == nullptr) return false;
    const std::int64_t i = ((std::int64_t(w.b) * p.hq + h) * p.skip_groups + g) * p.skip_tiles + w.n_block;
    return (p.skip_bits[i >> 3] >> (i & 7)) & 1u;
  }

  // The CTA's (query head, vote group) pairs are walked in one flat order: x = (hh - hh_begin) *
  // nm + (g - m_begin) for query head hh in [hh_begin, hh_end) of the KV group and vote group g in
  // [m_begin, m_end) (w from get<kVoteRows, ...>: its query blocks are the vote groups), nm =
  // m_end - m_begin.
  BLASST_HOST_DEVICE static int flat_groups(const BackwardParams&, const BackwardWork& w) {
    return (w.hh_end - w.hh_begin) * (w.m_end - w.m_begin);
  }

  // Whether the skip set keeps the pair at flat index x (< flat_groups) for this key block.
  BLASST_HOST_DEVICE static bool kept_at(const BackwardParams& p, const BackwardWork& w, int x) {
    const int nm = w.m_end - w.m_begin;
    return !skipped(p, w, w.kh * p.group + w.hh_begin + x / nm, w.m_begin + x % nm);
  }

  // 1 when some vote group of the CTA (any query head of its KV group) is kept, as seen by this
  // thread's share of them (x = tid, tid + nthreads, ...); the caller ORs it over the CTA
  // (__syncthreads_or). SPEC §9: a key block with none kept costs no work.
  __device__ static int kept_share(const BackwardParams& p, const BackwardWork& w, int tid, int nthreads) {
    for (int x = tid; x < flat_groups(p, w); x += nthreads)
      if (kept_at(p, w, x)) return 1;
    return 0;
  }

  // The CTA's kept vote groups as a bitmask in shared memory (bit x of the flat order: kept),
  // read from the skip set once by the whole CTA, so that walking to the next kept group costs no
  // global load per skipped one. Each warp fills whole 32-bit words with one ballot; bits past
  // the last group are 0. Returns this thread's share of "some group is kept" (the caller ORs it
  // over the CTA with __syncthreads_or, which also publishes the words). Only for a skip set whose
  // bits fit: kept_words_needed(p, w) <= capacity (else kept_share / the global walk).
  BLASST_HOST_DEVICE static int kept_words_needed(const BackwardParams& p, const BackwardWork& w) {
    return (flat_groups(p, w) + 31) / 32;
  }
  __device__ static int load_kept_words(const BackwardParams& p, const BackwardWork& w, std::uint32_t* words,
                                        int tid, int nthreads) {
    const int n = flat_groups(p, w), nwords = (n + 31) / 32;
    const int lane = tid % 32;
    int any = 0;
    for (int wd = tid / 32; wd < nwords; wd += nthreads / 32) {  // the same trip count in a warp
      const int x = wd * 32 + lane;
      const bool kept = x < n && kept_at(p, w, x);
      const std::uint32_t bits = __ballot_sync(0xffffffffu, kept);
      if (lane == 0) words[wd] = bits;
      any |= int(kept);
    }
    return any;
  }

  // Moves x to the first kept vote group at or after it in the flat order, from those words or
  // (words == nullptr) from the skip set in global memory; false when none is left. The same
  // answer in every thread.
  BLASST_HOST_DEVICE static bool next_kept_group(const BackwardParams& p, const BackwardWork& w,
                                                 const std::uint32_t* words, int& x) {
    const int n = flat_groups(p, w);
    if (words != nullptr) {
      while (x < n) {
        const std::uint32_t rest = words[x >> 5] >> (x & 31);
        if (rest != 0) {
          x += first_set_bit(rest);  // bits past n are 0: x < n here
          return true;
        }
        x = (x | 31) + 1;
      }
      return false;
    }
    for (; x < n; ++x)
      if (kept_at(p, w, x)) return true;
    return false;
  }

  // The next step of G kept vote groups, wherever they lie (any query head of the KV group, any
  // position), from flat index x (moved past them). A step short of G groups (the list's end)
  // repeats its last group in the remaining slots with their live bit clear: they load valid
  // rows, and the kernel masks them (no gradient). False when no kept group is left.
  template <int G>
  BLASST_HOST_DEVICE static bool next_step(const BackwardParams& p, const BackwardWork& w,
                                           const std::uint32_t* words, int& x, BackwardStep<G>& s) {
    const int nm = w.m_end - w.m_begin;
    s.live = 0;
    for (int r = 0; r < G; ++r) {
      if (next_kept_group(p, w, words, x)) {
        s.hh[r] = w.hh_begin + x / nm;
        s.g[r] = w.m_begin + x % nm;
        s.live |= 1u << r;
        ++x;
      } else if (r == 0) {
        return false;
      } else {
        s.hh[r] = s.hh[r - 1];
        s.g[r] = s.g[r - 1];
      }
    }
    return true;
  }

  // The first step at or after (query head hh of the KV group, query block m), in that order,
  // that the skip set keeps; false when none is left. The same answer in every thread. (The
  // mma.sync kernel's walk: one vote group a step.)
  __device__ static bool next_kept(const BackwardParams& p, const BackwardWork& w, int& hh, int& m) {
    int x = (hh - w.hh_begin) * (w.m_end - w.m_begin) + (m - w.m_begin);  // m == m_end: the next head's first
    if (!next_kept_group(p, w, nullptr, x)) return false;
    hh = w.hh_begin + x / (w.m_end - w.m_begin);
    m = w.m_begin + x % (w.m_end - w.m_begin);
    return true;
  }
};

}  // namespace blasst::sm90::backward
