// Internal: the mainloop of one decode CTA (decode_kernel.cuh wires it and runs the tile loop; see
// docs/decode_kernel.md): the shared memory's pointers, the K/V loads into the rings, Q staging,
// scores, the vote, the statistics, the online softmax and P.V.
//
// Pipeline (8 warps, no warp specialisation; ring depths in decode_traits.hpp):
//   - K tiles stream through an NK-deep ring (tensor-map boxes or 16-byte cp.async),
//     each slot completing on its own mbarrier, so K and V slots complete independently.
//   - Tile i: S = Q K^T with mma.sync m16n8k16 (each warp 16 keys), row maxima, the vote
//     (__syncthreads_or), then, for a surviving tile only, P = exp2(S - m) into a P ring and the
//     V load of that tile into an NV-deep V ring. P.V of a survivor runs NV - 1 survivors later,
//     so each V load has NV - 1 iterations to land (the first kernel waited one iteration, and
//     that wait bounded it: bench/results/decode_log.md) and a skipped V leaves no bubble: the
//     next survivor's V is requested as soon as its vote is known while the K ring stays full.
//   - P.V, one m-tile (g * q_len <= 16, the common case): each warp multiplies its own 16 keys'
//     P (kept in registers: the score accumulators are the A operand) by those keys' V rows for
//     all D columns; the 8 partial outputs are summed once at the end. Q, P and alpha never touch
//     shared memory, which leaves room for 7 ring slots at d = 128 (K 3 + V 4).
//   - P.V, four m-tiles (up to 64 rows): P through a shared-memory ring, warp w owns D/8 output
//     columns over all 128 keys.
//   - Seeded splits (max-first order, SPEC §2a): a prologue scores the sink and last tiles and
//     starts the running maxima there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/sm90/common/ptx.hpp"
#include "cuda/sm90/common/skip_policy.hpp"
#include "cuda/sm90/decode/decode_params.hpp"
#include "cuda/sm90/decode/decode_scheduler.cuh"
#include "cuda/sm90/decode/decode_trace.cuh"
#include "cuda/sm90/decode/decode_traits.hpp"

namespace blasst::sm90::decode {

// Tiles of rows x (CH 16-byte chunks): chunk c of row r lives at chunk c ^ (r & 7), so the 8 rows
// an ldmatrix reads hit 8 different bank groups.
__device__ __forceinline__ std::uint32_t swz(int row, int chunk, int chunks_per_row) {
  return static_cast<std::uint32_t>((row * chunks_per_row + (chunk ^ (row & 7))) * 16);
}

// Byte offset of 16-byte chunk `chunk` of key row `key` in a K/V slot: the tensor-map image, i.e.
// 64-column halves of [128 keys][128 B] with the 128B swizzle (the cp.async path writes the same).
__device__ __forceinline__ std::uint32_t kv_off(int key, int chunk) {
  return static_cast<std::uint32_t>(((chunk >> 3) << 14) + key * 128 + (((chunk & 7) ^ (key & 7)) << 4));
}
// The same for a slot of kKeys keys (64-column halves of [kKeys][128 B]): kv_off is kKeys = 128.
template <int kKeys>
__device__ __forceinline__ std::uint32_t kv_off_keys(int key, int chunk) {
  if constexpr (kKeys == 128) {
    return kv_off(key, chunk);
  } else {
    return static_cast<std::uint32_t>((chunk >> 3) * (kKeys * 128) + key * 128 + (((chunk & 7) ^ (key & 7)) << 4));
  }
}

// The CTA's dynamic shared memory, DecodeTraits::SharedStorage, as the pointers the kernel uses
// (each from its member; the mbarriers' address is rounded up at run time as the one-function
// kernel did: the same SASS, where &SharedStorage::bar gave other code, 72 fewer instructions):
// K ring, V ring, [P ring, Q, alpha ring: four m-tiles only], row-max exchange, tile index per V
// slot, mbarriers. With one m-tile, Q, P and alpha live in registers and Q is staged once through
// the last V slot (sP and sAlpha then point at the row-max exchange and are not used).
template <class Traits>
struct DecodeSmem {
  using SS = typename Traits::SharedStorage;
  static constexpr int NV = Traits::NV;
  static_assert(offsetof(SS, bar) == ((offsetof(SS, v_tile) + sizeof(int) * NV + 7) & ~std::size_t{7}),
                "sBar (v_tile's end rounded up to 8 bytes) is SharedStorage::bar");

  unsigned char* sK;         // [NK][kKSlotBytes]
  unsigned char* sV;         // [NV][kSlotBytes]
  unsigned char* sP;         // [NV][kPStageBytes], MT = 4
  unsigned char* sQ;         // MT = 4: [kRows][D]; MT = 1: staging in the last V slot
  float* sAlpha;             // [NV][kRows], MT = 4
  float* sRed;               // [2][W][kRows]
  int* sVTile;               // [NV]
  unsigned long long* sBar;  // K slots, V slots, the two seed tiles

  __device__ __forceinline__ explicit DecodeSmem(unsigned char* smem) {
    SS& ss = *reinterpret_cast<SS*>(smem);
    sK = &ss.k[0][0];
    sV = &ss.v[0][0];
    sRed = &ss.red[0][0][0];
    if constexpr (Traits::MT == 1) {
      sP = reinterpret_cast<unsigned char*>(sRed);
      // 4 warps: the last V slot holds a seed tile (NV = 2); the last K slot stages Q instead, and
      // its first load waits until Q is in registers (decode_kernel.cuh).
      sQ = Traits::kKeyGroups == 1 ? &ss.v[NV - 1][0] : &ss.k[Traits::NK - 1][0];
      sAlpha = sRed;
    } else {
      sP = &ss.p[0][0];
      sQ = &ss.q[0];
      sAlpha = &ss.alpha[0][0];
    }
    sVTile = &ss.v_tile[0];
    sBar = reinterpret_cast<unsigned long long*>((reinterpret_cast<std::uintptr_t>(sVTile + NV) + 7) &
                                                 ~std::uintptr_t{7});
  }

  // Before any load: every mbarrier, by thread 0. Tensor-map loads: one arrive (with the expected
  // bytes) per phase; cp.async: one per thread.
  __device__ __forceinline__ void init_barriers(int tid, bool tma) const {
    if (tid == 0) {
      for (int i = 0; i < Traits::NK + NV + 2; ++i) mbar_init(smem_u32(sBar + i), tma ? 1 : Traits::kThreads);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
  }
};

// The mainloop of one CTA: its work, its shared memory and the per-thread constants every phase
// reads. Every member function is inlined into the one kernel body; the register arrays are the
// kernel's own variables, passed by reference (kept apart, each is promoted to registers on its
// own) and only indexed by constants of unrolled loops (a run-time index would put them in local
// memory).
template <class Traits>
struct DecodeMainloop {
  using T = typename Traits::T;
  static constexpr int D = Traits::D;
  static constexpr bool kSkip = Traits::kSkip;
  static constexpr int MT = Traits::MT;
  static constexpr int kTileKeys = Traits::kTileKeys;
  static constexpr int W = Traits::kWarps;
  static constexpr int kThr = Traits::kThreads;
  static constexpr int NK = Traits::NK, NV = Traits::NV;
  static constexpr int kRows = Traits::kRows;
  static constexpr int CH = Traits::CH;
  static constexpr int kKW = Traits::kKW, kSN = Traits::kSN, kDN = Traits::kDN, kNT = Traits::kNT;
  static constexpr int kSNT = Traits::kSNT;
  // Key groups per tile: warp w scores (and, one m-tile, multiplies by V) keys g * W * 16 + 16 w ..
  // + 15 of each group g; 1 with 8 warps, 2 with 4 (each group then one half-tile K slot).
  static constexpr int G = Traits::kKeyGroups;
  static constexpr int kKSlotKeys = Traits::kKSlotKeys;
  static constexpr int kKSlotBytes = Traits::kKSlotBytes;
  static constexpr int kON = Traits::kON, kQPer = Traits::kQPer, kLag = Traits::kLag;
  static constexpr int kRowsPerPass = kThr / CH;    // cp.async: key rows per pass of the CTA
  static constexpr int kPasses = kTileKeys / kRowsPerPass;
  static constexpr int kSlotBytes = Traits::kSlotBytes;
  static constexpr int kPStage = Traits::kPStageBytes;

  // The per-thread register arrays, each a variable of the kernel (rows lane/4 + 8*half + 16*mt):
  using QFrags = std::uint32_t[MT == 1 ? D / 16 : 1][4];  // one m-tile: Q's A fragments for the split
  using RowVals = float[MT][2];                           // m (log2 units), l (this thread's part), ...
  using RowLims = int[MT][2];                             // keys < row_lim are visible to the row
  using Scores = float[MT][kSNT][4];                      // S, then P, of this warp's 16 keys per group
  using OutAcc = float[MT][kON][4];                       // O: one m-tile: this warp's keys' share
  using PFifo = std::uint32_t[MT == 1 ? kLag : 1][4 * G]; // one m-tile: pending survivors' P
  using AlphaFifo = float[MT == 1 ? kLag : 1][2];         // ... their alpha
  using TileFifo = int[MT == 1 ? kLag : 1];               // ... their tile index

  const Params& p;
  const DecodeWork& w;
  const DecodeSmem<Traits>& sm;
  const int tid, warp, lane;
  const std::uint32_t barK0, barV0, barS0;  // mbarriers: K slots, V slots, seed tiles (8 bytes each)
  const bool tma;                           // tensor-map loads (else cp.async)
  const T* const kbase;
  const T* const vbase;
  const int ld_row, ld_chunk;  // cp.async: this thread's key row and chunk of a pass
  const bool seeded;           // a seeded split (SPEC §2a)
  const bool seed_loads, seed_scores;

  __device__ __forceinline__ DecodeMainloop(const Params& prm, const DecodeWork& work, const DecodeSmem<Traits>& smem,
                                            int thread, int warp_index, int lane_index, bool tensor_maps)
      : p(prm),
        w(work),
        sm(smem),
        tid(thread),
        warp(warp_index),
        lane(lane_index),
        barK0(smem_u32(smem.sBar)),
        barV0(smem_u32(smem.sBar + NK)),
        barS0(smem_u32(smem.sBar + NK + NV)),
        tma(tensor_maps),
        kbase(static_cast<const T*>(prm.k)),
        vbase(static_cast<const T*>(prm.v)),
        ld_row(thread / CH),
        ld_chunk(thread % CH),
        seeded(kSkip && prm.seeded != 0),
        seed_loads(seeded),
        seed_scores(seeded) {}

  // ---- loads ------------------------------------------------------------------------------------

  // The tensor-map coordinates of key `key` of the sequence: c1 = the key (or its slot within its
  // page), c3 = the sequence (or its page).
  __device__ __forceinline__ void tma_coords(std::int64_t key, int& c1, int& c3) const {
    if (p.page_table) {
      c3 = __ldg(p.page_table + w.b * p.pt_stride + (key >> p.log2_page));
      c1 = static_cast<int>(key & ((1 << p.log2_page) - 1));
    } else {
      c3 = w.b;
      c1 = static_cast<int>(key);
    }
  }

  // cp.async path: this thread's 16-byte chunk of key `key` (< Lk) of the cache at base.
  __device__ __forceinline__ const T* chunk_src(const T* base, std::int64_t s0, std::int64_t s1, std::int64_t sh,
                                               std::int64_t key) const {
    std::int64_t off;
    if (p.page_table) {
      const std::int32_t page = __ldg(p.page_table + w.b * p.pt_stride + (key >> p.log2_page));
      off = page * s0 + (key & ((1 << p.log2_page) - 1)) * s1;
    } else {
      off = w.b * s0 + key * s1;
    }
    return base + off + w.h * sh + ld_chunk * 8;
  }

  // Loads of one K or V tile (tile index t of the sequence) into a ring slot.
  __device__ __forceinline__ void load_tile(const T* base, std::int64_t s0, std::int64_t s1, std::int64_t sh,
                                            unsigned char* slot, std::uint32_t bar, std::int64_t t, bool is_v) const {
    if (tma) {
      // A few large boxes per tile (rows of up to one page, 64 columns each) issued by one thread.
      if (tid == 0) {
        const int sub = p.tma_box_rows;
        const std::int64_t left = w.Lk - t * kTileKeys;
        const int valid = left < kTileKeys ? static_cast<int>(left) : kTileKeys;
        const int nreq = (valid + sub - 1) / sub;
        constexpr int kHalves = D / 64;
        mbar_arrive_expect_tx(bar, nreq * kHalves * sub * 128);
        const CUtensorMap* map = is_v ? &p.tmv : &p.tmk;
        for (int j = 0; j < nreq; ++j) {
          int c1, c3;
          tma_coords(t * kTileKeys + j * sub, c1, c3);
#pragma unroll
          for (int hf = 0; hf < kHalves; ++hf)
            tma_load_4d(smem_u32(slot + hf * kTileKeys * 128 + j * sub * 128), map, hf * 64, c1, w.h, c3, bar);
        }
      }
      return;
    }
    // 16 bytes per thread per request into the same swizzled image; keys past the end zero-filled.
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = ld_row + pass * kRowsPerPass;
      const std::int64_t key = t * kTileKeys + row;
      const T* src = base;
      int bytes = 0;
      if (key < w.Lk) {
        src = chunk_src(base, s0, s1, sh, key);
        bytes = 16;
      }
      cp_async16(smem_u32(slot + kv_off(row, ld_chunk)), src, bytes);
    }
    cp_async_arrive(bar);
  }

  // 4 warps: part `part` of tile t (keys part * kKeys .. + kKeys - 1) into a K slot of kKeys keys
  // (load_tile's code for a part of a tile; a part wholly past the sequence's end loads nothing
  // and completes its barrier at once). Kept apart from load_tile, whose code for whole tiles
  // stays the 8-warp kernels' (one function for both changed their PTX's register numbering).
  template <int kKeys>
  __device__ __forceinline__ void load_part(const T* base, std::int64_t s0, std::int64_t s1, std::int64_t sh,
                                            unsigned char* slot, std::uint32_t bar, std::int64_t t, bool is_v,
                                            int part) const {
    const std::int64_t key_begin = t * kTileKeys + static_cast<std::int64_t>(part) * kKeys;
    if (tma) {
      // A few large boxes per tile (rows of up to one page, 64 columns each) issued by one thread.
      if (tid == 0) {
        const int sub = p.tma_box_rows;
        const std::int64_t left = w.Lk - key_begin;
        const int valid = left < kKeys ? (left > 0 ? static_cast<int>(left) : 0) : kKeys;
        const int nreq = (valid + sub - 1) / sub;
        constexpr int kHalves = D / 64;
        mbar_arrive_expect_tx(bar, nreq * kHalves * sub * 128);
        const CUtensorMap* map = is_v ? &p.tmv : &p.tmk;
        for (int j = 0; j < nreq; ++j) {
          int c1, c3;
          tma_coords(key_begin + j * sub, c1, c3);
#pragma unroll
          for (int hf = 0; hf < kHalves; ++hf)
            tma_load_4d(smem_u32(slot + hf * kKeys * 128 + j * sub * 128), map, hf * 64, c1, w.h, c3, bar);
        }
      }
      return;
    }
    // 16 bytes per thread per request into the same swizzled image; keys past the end zero-filled.
#pragma unroll
    for (int pass = 0; pass < kKeys / kRowsPerPass; ++pass) {
      const int row = ld_row + pass * kRowsPerPass;
      const std::int64_t key = key_begin + row;
      const T* src = base;
      int bytes = 0;
      if (key < w.Lk) {
        src = chunk_src(base, s0, s1, sh, key);
        bytes = 16;
      }
      cp_async16(smem_u32(slot + kv_off_keys<kKeys>(row, ld_chunk)), src, bytes);
    }
    cp_async_arrive(bar);
  }

  // The seed tiles' K (seeded splits) and the split's first NK tiles.
  __device__ __forceinline__ void first_loads() const {
    if (seed_loads) {
      // The seed tiles' K go into V slots 0 and 1 (free until the first vote) on their own barriers.
      for (int j = 0; j < 2; ++j)
        load_tile(kbase, p.k_s0, p.k_s1, p.k_sh, sm.sV + j * kSlotBytes, barS0 + 8 * j, w.seed_tile(j), false);
    }
    if constexpr (G == 1) {
      for (int i = 0; i < NK && i < w.n; ++i)
        load_tile(kbase, p.k_s0, p.k_s1, p.k_sh, sm.sK + i * kSlotBytes, barK0 + 8 * i, w.t_begin + i, false);
    } else {
      // Part NK - 1's slot stages Q (and the seed maxima): the kernel loads it after the prologue.
      for (int h = 0; h < NK - 1 && h < w.n * G; ++h) load_k_part(h);
    }
  }
  // 4 warps: K part h of the split (tile h / G, part h % G) into slot h % NK.
  __device__ __forceinline__ void load_k_part(int h) const {
    const int slot = h % NK;
    load_part<kKSlotKeys>(kbase, p.k_s0, p.k_s1, p.k_sh, sm.sK + slot * kKSlotBytes, barK0 + 8 * slot,
                          w.t_begin + h / G, false, h % G);
  }
  // ---- Q and the row state -------------------------------------------------------------------------

  // Q rows (zero padding rows past R) into shared memory: loaded into registers first, then the
  // first K tiles are requested (tensor maps: by thread 0, which initialised the barriers), then Q
  // is stored. Requested after the K tiles, the Q loads queued behind every CTA's first tiles
  // (12 MB at B = 1) and Q was staged 5 us after the start (BLASST_DECODE_TRACE, H200, 162092d).
  // Returns the threshold in log2 units of the scaled scores (-inf: dense for this sequence),
  // read after the first requests: nothing before the first vote needs it.
  __device__ __forceinline__ float stage_q_and_first_loads() const {
    uint4 qv[kQPer];
    {
      const T* q = static_cast<const T*>(p.q);
#pragma unroll
      for (int j = 0; j < kQPer; ++j) {
        const int idx = tid + j * kThr, r = idx / CH, c = idx % CH;
        qv[j] = make_uint4(0, 0, 0, 0);
        if (idx < kRows * CH && r < p.rows) {
          const int qi = r / p.group, hh = r % p.group;
          const T* src = q + w.b * p.q_sb + qi * p.q_st + (static_cast<std::int64_t>(w.h) * p.group + hh) * p.q_sh + c * 8;
          qv[j] = *reinterpret_cast<const uint4*>(src);
        }
      }
    }
    if (tma) first_loads();
    trace_point(p, 1);  // Q requested, first loads issued

    float thr = -INFINITY;
    if constexpr (kSkip) thr = p.threshold.template log_lambda<true>(w.Lk);
#pragma unroll
    for (int j = 0; j < kQPer; ++j) {
      const int idx = tid + j * kThr;
      if (idx < kRows * CH) *reinterpret_cast<uint4*>(sm.sQ + swz(idx / CH, idx % CH, CH)) = qv[j];
    }
    __syncthreads();  // mbarrier init + Q visible
    if (!tma) first_loads();
    return thr;
  }

  // One m-tile: Q's A fragments (from sQ, after the barrier that follows store_q) stay in
  // registers for the whole split.
  __device__ __forceinline__ void load_q_frags(QFrags& qa) const {
    if constexpr (MT == 1) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) ldsm_x4(smem_u32(sm.sQ + swz(lane & 15, ks * 2 + (lane >> 4), CH)), qa[ks]);
    }
  }

  // The keys row (mt, hf) of this thread sees: keys < row_limit (0 for padding rows).
  __device__ __forceinline__ int row_limit(int mt, int hf) const {
    const int r = mt * 16 + hf * 8 + (lane >> 2);
    std::int64_t lim = 0;
    if (r < p.rows) {
      const int qi = r / p.group;
      lim = p.causal ? w.Lk - p.q_len + qi + 1 : w.Lk;
      if (lim > w.Lk) lim = w.Lk;
      if (lim < 0) lim = 0;
    }
    return static_cast<int>(lim < 0x7fffffff ? lim : 0x7fffffff);
  }
  // ---- scores -----------------------------------------------------------------------------------

  // A tile's raw scores (this warp's 16 keys of tile t) to log2 units, keys a row cannot see to
  // -inf; the warp's row maxima to wmax and red[warp][row].
  __device__ __forceinline__ void mask_max(Scores& sc, RowVals& wmax, const RowLims& row_lim, std::int64_t t, float* red) const {
    const int key0 = static_cast<int>(t * kTileKeys) + warp * kKW + 2 * (lane & 3);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kSNT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            // n8 tile nt: key group nt / kSN, its n8 tile nt % kSN (G = 1: nt; spelled apart, as
            // the one expression changed the 8-warp kernels' instruction schedule).
            int key;
            if constexpr (G == 1) key = key0 + nt * 8 + e;
            else key = key0 + (nt / kSN) * (W * kKW) + (nt % kSN) * 8 + e;
            float v = sc[mt][nt][hf * 2 + e] * p.scale_log2;
            v = key < row_lim[mt][hf] ? v : -INFINITY;
            sc[mt][nt][hf * 2 + e] = v;
            mx = running_max(mx, v);
          }
        mx = running_max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = running_max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        wmax[mt][hf] = mx;
        if ((lane & 3) == 0) red[warp * kRows + mt * 16 + hf * 8 + (lane >> 2)] = mx;
      }
    }
  }
  // S of the tile in slot Ks into s, masked (mask_max). 4 warps: key group 1 (the tile's second
  // half) is in slot Ks1, and S of both groups runs in one pass (two independent MMA chains).
  __device__ __forceinline__ void score(Scores& s, RowVals& wmax, const QFrags& qa, const RowLims& row_lim,
                                        const unsigned char* Ks, std::int64_t t, float* red,
                                        const unsigned char* Ks1 = nullptr) const {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kSNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
    if constexpr (G != 1) {
      static_assert(MT == 1 && G == 2, "4 warps: one m-tile, two key groups");
      const unsigned char* slot[2] = {Ks, Ks1};
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        const int key = warp * kKW + (lane & 7) + (lane >> 4) * 8;
#pragma unroll
        for (int g = 0; g < G; ++g) {
          std::uint32_t r[4];
          ldsm_x4(smem_u32(slot[g]) + kv_off_keys<kKSlotKeys>(key, ks * 2 + ((lane >> 3) & 1)), r);
          mma16816<T>(s[0][g * kSN], qa[ks], r[0], r[1]);
          mma16816<T>(s[0][g * kSN + 1], qa[ks], r[2], r[3]);
        }
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        std::uint32_t r[4];
        {
          const int key = warp * kKW + (lane & 7) + (lane >> 4) * 8;
          ldsm_x4(smem_u32(Ks) + kv_off(key, ks * 2 + ((lane >> 3) & 1)), r);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (MT == 1) {
            mma16816<T>(s[mt][0], qa[ks], r[0], r[1]);
            mma16816<T>(s[mt][1], qa[ks], r[2], r[3]);
          } else {
            std::uint32_t a[4];
            ldsm_x4(smem_u32(sm.sQ + swz(mt * 16 + (lane & 15), ks * 2 + (lane >> 4), CH)), a);
            mma16816<T>(s[mt][0], a, r[0], r[1]);
            mma16816<T>(s[mt][1], a, r[2], r[3]);
          }
        }
      }
    }
    mask_max(s, wmax, row_lim, t, red);
  }
  // The tile maximum of row (mt, hf) over every warp's keys (after the barrier that follows score).
  __device__ __forceinline__ float tile_max(const float* red, int mt, int hf) const {
    const int r = mt * 16 + hf * 8 + (lane >> 2);
    float tm = -INFINITY;
#pragma unroll
    for (int wp = 0; wp < W; ++wp) tm = running_max(tm, red[wp * kRows + r]);
    return tm;
  }

  // ---- the vote and the online softmax -----------------------------------------------------------

  // The vote: delta of each of this thread's rows against this warp's keys; -inf when none is
  // visible, +inf on the row's first visible tile (m = -inf): that tile is never skipped. The
  // barrier (with the OR of the vote) also makes every warp's row maxima visible.
  __device__ __forceinline__ bool vote(const RowVals& wmax, const RowVals& m_run, float thr) const {
    bool keep = true;
    if constexpr (kSkip) {
      bool want = false;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float mx = wmax[mt][hf];
          const float dl = mx == -INFINITY ? -INFINITY : mx - m_run[mt][hf];
          want |= !(dl < thr);  // a NaN delta keeps (the NaN rule)
        }
      keep = __syncthreads_or(want) != 0;
    } else {
      __syncthreads();
    }
    return keep;
  }

  // Exact group delta for the statistics (warp 0, whose lanes cover every row).
  __device__ __forceinline__ void record_delta(const float* red, const RowVals& m_run) const {
    if (p.visited != nullptr && warp == 0) {
      float dmax = -INFINITY;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float tm = tile_max(red, mt, hf);
          const float dl = tm == -INFINITY ? -INFINITY : tm - m_run[mt][hf];
          dmax = running_max(dmax, dl);
        }
      for (int o = 16; o > 0; o >>= 1) dmax = running_max(dmax, __shfl_xor_sync(0xffffffffu, dmax, o));
      if (lane == 0 && p.hist != nullptr)
        atomicAdd(p.hist + static_cast<std::int64_t>(w.h) * kHistSlots +
                      hist_bin(static_cast<double>(dmax) * 0.6931471805599453),
                  1ull);
    }
  }

  // A survivor's new maxima, rescale factors alpha (to alpha_new), P = exp2(S - m) in s, row sums.
  __device__ __forceinline__ void online_softmax(Scores& s, RowVals& m_run, RowVals& l_run, const float* red, RowVals& alpha_new) const {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float m_old = m_run[mt][hf];
        const float m_new = running_max(m_old, tile_max(red, mt, hf));
        // Rows with nothing visible yet keep m = -inf; exp2 against 0 keeps their P at 0.
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = exp2f(m_old - m_use);  // 0 when m_old = -inf
        m_run[mt][hf] = m_new;
        alpha_new[mt][hf] = alpha;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kSNT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pe = exp2f(s[mt][nt][hf * 2 + e] - m_use);
            s[mt][nt][hf * 2 + e] = pe;
            sum += pe;
          }
        l_run[mt][hf] = l_run[mt][hf] * alpha + sum;
      }
    }
  }

  // Four m-tiles: P (this warp's keys, every row) and alpha into P slot `slot` of the ring.
  __device__ __forceinline__ void store_p(const Scores& s, int slot, const RowVals& alpha_new) const {
    unsigned char* Ps = sm.sP + slot * kPStage;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = mt * 16 + hf * 8 + (lane >> 2);
#pragma unroll
        for (int nt = 0; nt < kSN; ++nt) {
          const int key = warp * kKW + nt * 8 + 2 * (lane & 3);
          *reinterpret_cast<std::uint32_t*>(Ps + swz(r, key / 8, kTileKeys / 8) + (key & 7) * 2) =
              pack2<T>(s[mt][nt][hf * 2], s[mt][nt][hf * 2 + 1]);
        }
        if (warp == 0 && (lane & 3) == 0) sm.sAlpha[slot * kRows + r] = alpha_new[mt][hf];
      }
  }

  // One m-tile: the FIFO of pending survivors (P as the A operand of P.V, alpha, tile index), the
  // oldest at index kLag - 1: push this survivor (every entry moves up by one, so the indices stay
  // static). S's accumulator layout is the A-operand layout of P.V (this warp's 16 keys).
  __device__ __forceinline__ void push_survivor(PFifo& pa, AlphaFifo& pal, TileFifo& ptile, const Scores& s,
                                                const RowVals& alpha_new, std::int64_t t) const {
#pragma unroll
    for (int j = kLag - 1; j > 0; --j) {
#pragma unroll
      for (int e = 0; e < 4 * G; ++e) pa[j][e] = pa[j - 1][e];
      pal[j][0] = pal[j - 1][0];
      pal[j][1] = pal[j - 1][1];
      ptile[j] = ptile[j - 1];
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      pa[0][4 * g + 0] = pack2<T>(s[0][g * kSN][0], s[0][g * kSN][1]);
      pa[0][4 * g + 1] = pack2<T>(s[0][g * kSN][2], s[0][g * kSN][3]);
      pa[0][4 * g + 2] = pack2<T>(s[0][g * kSN + 1][0], s[0][g * kSN + 1][1]);
      pa[0][4 * g + 3] = pack2<T>(s[0][g * kSN + 1][2], s[0][g * kSN + 1][3]);
    }
    pal[0][0] = alpha_new[0][0];
    pal[0][1] = alpha_new[0][1];
    ptile[0] = static_cast<int>(t);
  }

  // ---- P.V --------------------------------------------------------------------------------------

  // Waits for survivor k's V (slot k % NV) and, for a tensor-map tile that ends past the sequence,
  // zeroes the rows past the end that this warp reads (P = 0 there, but 0 * NaN is not 0).
  __device__ __forceinline__ const unsigned char* wait_v(int k, std::int64_t tile, int key_lo, int key_hi,
                                                         int chunk_lo, int chunk_hi) const {
    const int slot = k % NV;
    mbar_wait(barV0 + 8 * slot, static_cast<std::uint32_t>((k / NV) & 1));
    unsigned char* Vs = sm.sV + slot * kSlotBytes;
    if (tma && (tile + 1) * kTileKeys > w.Lk) {
      const int valid = static_cast<int>(w.Lk - tile * kTileKeys);
      const int k0 = valid > key_lo ? valid : key_lo;
      const int nc = chunk_hi - chunk_lo;
      for (int idx = lane; idx < (key_hi - k0) * nc; idx += 32)
        *reinterpret_cast<uint4*>(Vs + kv_off(k0 + idx / nc, chunk_lo + idx % nc)) = make_uint4(0, 0, 0, 0);
      __syncwarp();
    }
    return Vs;
  }

  // P.V of survivor k for one m-tile: O (this warp's keys x all columns) = O * alpha + P V.
  __device__ __forceinline__ void pv_reg(OutAcc& o_acc, int k, const std::uint32_t (&a)[4 * G], const float (&al)[2],
                                         int tile) const {
    if constexpr (G != 1) {
      pv_reg_groups(o_acc, k, a, al, tile);
    } else {
      const unsigned char* Vs = wait_v(k, tile, warp * kKW, warp * kKW + kKW, 0, CH);
#pragma unroll
      for (int nt = 0; nt < kDN; ++nt) {
        o_acc[0][nt][0] *= al[0];
        o_acc[0][nt][1] *= al[0];
        o_acc[0][nt][2] *= al[1];
        o_acc[0][nt][3] *= al[1];
      }
      const int key = warp * kKW + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int np = 0; np < kDN / 2; ++np) {
        std::uint32_t r[4];
        ldsm_x4_t(smem_u32(Vs) + kv_off(key, np * 2 + (lane >> 4)), r);
        mma16816<T>(o_acc[0][np * 2], a, r[0], r[1]);
        mma16816<T>(o_acc[0][np * 2 + 1], a, r[2], r[3]);
      }
    }
  }

  // 4 warps: the same over this warp's keys of every key group (P of group g is a[4g .. 4g + 3]).
  __device__ __forceinline__ void pv_reg_groups(OutAcc& o_acc, int k, const std::uint32_t (&a)[4 * G],
                                                const float (&al)[2], int tile) const {
    const int slot = k % NV;
    mbar_wait(barV0 + 8 * slot, static_cast<std::uint32_t>((k / NV) & 1));
    unsigned char* Vs = sm.sV + slot * kSlotBytes;
    if (tma && (static_cast<std::int64_t>(tile) + 1) * kTileKeys > w.Lk) {
      // Rows past the sequence's end that this warp reads (P = 0 there, but 0 * NaN is not 0).
      const int valid = static_cast<int>(w.Lk - static_cast<std::int64_t>(tile) * kTileKeys);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const int key_lo = g * W * kKW + warp * kKW, key_hi = key_lo + kKW;
        const int k0 = valid > key_lo ? valid : key_lo;
        for (int idx = lane; idx < (key_hi - k0) * CH; idx += 32)
          *reinterpret_cast<uint4*>(Vs + kv_off(k0 + idx / CH, idx % CH)) = make_uint4(0, 0, 0, 0);
      }
      __syncwarp();
    }
#pragma unroll
    for (int nt = 0; nt < kDN; ++nt) {
      o_acc[0][nt][0] *= al[0];
      o_acc[0][nt][1] *= al[0];
      o_acc[0][nt][2] *= al[1];
      o_acc[0][nt][3] *= al[1];
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int key = g * W * kKW + warp * kKW + (lane & 7) + ((lane >> 3) & 1) * 8;
      const std::uint32_t ag[4] = {a[4 * g], a[4 * g + 1], a[4 * g + 2], a[4 * g + 3]};
#pragma unroll
      for (int np = 0; np < kDN / 2; ++np) {
        std::uint32_t r[4];
        ldsm_x4_t(smem_u32(Vs) + kv_off(key, np * 2 + (lane >> 4)), r);
        mma16816<T>(o_acc[0][np * 2], ag, r[0], r[1]);
        mma16816<T>(o_acc[0][np * 2 + 1], ag, r[2], r[3]);
      }
    }
  }

  // P.V of survivor k for four m-tiles: P from P slot k % NV, this warp's D/8 columns.
  __device__ __forceinline__ void pv_smem(OutAcc& o_acc, int k) const {
    const int slot = k % NV;
    const unsigned char* Vs = wait_v(k, sm.sVTile[slot], 0, kTileKeys, warp * kNT, warp * kNT + kNT);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float a0 = sm.sAlpha[slot * kRows + mt * 16 + (lane >> 2)];
      const float a1 = sm.sAlpha[slot * kRows + mt * 16 + 8 + (lane >> 2)];
#pragma unroll
      for (int nt = 0; nt < kON; ++nt) {
        o_acc[mt][nt][0] *= a0;
        o_acc[mt][nt][1] *= a0;
        o_acc[mt][nt][2] *= a1;
        o_acc[mt][nt][3] *= a1;
      }
    }
    const unsigned char* Ps = sm.sP + slot * kPStage;
#pragma unroll
    for (int ks = 0; ks < kTileKeys / 16; ++ks) {
      // B fragments of V (keys ks*16.., this warp's columns) via ldmatrix.trans.
      std::uint32_t bv[kNT][2];
      const int key = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      if constexpr (kNT == 1) {  // 8 columns per warp (d = 64): keys 0-7 and 8-15
        ldsm_x2_t(smem_u32(Vs) + kv_off(key, warp), bv[0]);
      } else {
        std::uint32_t r[4];
        ldsm_x4_t(smem_u32(Vs) + kv_off(key, warp * 2 + (lane >> 4)), r);
        bv[0][0] = r[0];
        bv[0][1] = r[1];
        bv[1][0] = r[2];
        bv[1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        std::uint32_t a[4];
        ldsm_x4(smem_u32(Ps + swz(mt * 16 + (lane & 15), ks * 2 + (lane >> 4), kTileKeys / 8)), a);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mma16816<T>(o_acc[mt][nt], a, bv[nt][0], bv[nt][1]);
      }
    }
  }
};

}  // namespace blasst::sm90::decode
