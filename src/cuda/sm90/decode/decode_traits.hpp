// Internal: compile-time shape of the decode kernel as one function of (element type, head dim,
// variant, m-tiles, warps): ring depths, K slot size, CTAs per SM and the shared-memory layout (one
// struct). See docs/decode_kernel.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/kernel_geometry.hpp"
#include "cuda/sm90/common/element.hpp"
#include "cuda/sm90/kernel_table.hpp"

namespace blasst::sm90::decode {

// The shared memory of one CTA. K/V slots hold the tensor-map image of a tile: 64-column halves
// of [128 keys][128 B] with the 128B swizzle (the cp.async path writes the same image), so the 8
// rows an ldmatrix reads hit 8 different bank groups; every slot is a multiple of 1 KB, so each
// stays 1 KB-aligned (the swizzled boxes need it) on the 1 KB-aligned dynamic shared memory.
// Aliases, by phase of the kernel:
//   - one m-tile: Q is staged once through the front half of the last V slot, and the seed
//     maxima (seeded splits) sit in its back half, both before the first vote; with four
//     m-tiles the seed maxima use P stage 0;
//   - the one-m-tile epilogue sums the warps' [16 x D] fp32 outputs in the K ring.
// Four warps (two CTAs per SM): K slots hold half tiles (64 keys, the same image with 64-key
// column halves), V slots whole tiles; see DecodeTraits.
template <int NK, int NV, int kSlotBytes, int kWarps, int kRows, int kPStageBytes, int kQBytes>
struct SharedStorageWithP {
  unsigned char k[NK][kSlotBytes];
  unsigned char v[NV][kSlotBytes];
  unsigned char p[NV][kPStageBytes];  // P ring (16-bit, swizzled rows)
  unsigned char q[kQBytes];           // Q (swizzled rows)
  float alpha[NV][kRows];             // rescale factor per P stage and row
  float red[2][kWarps][kRows];        // warp row maxima, double-buffered by tile parity
  int v_tile[NV];                     // tile index of the survivor in each V slot
  alignas(8) std::uint64_t bar[NK + NV + 2];  // mbarriers: K slots, V slots, the two seed tiles
};
template <int NK, int NV, int kKSlotBytes, int kSlotBytes, int kWarps, int kRows>
struct SharedStorageRegP {  // one m-tile: Q, P and alpha live in registers
  unsigned char k[NK][kKSlotBytes];
  unsigned char v[NV][kSlotBytes];
  float red[2][kWarps][kRows];
  int v_tile[NV];
  alignas(8) std::uint64_t bar[NK + NV + 2];
};

template <DType E, int kHeadDim_, KernelVariant V, int kMTiles_, int kWarps_ = 8>
struct DecodeTraits {
  using T = typename Element<E>::cuda;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int D = kHeadDim_;
  static constexpr bool kSkip = V != KernelVariant::dense;
  static_assert(V != KernelVariant::skip_hist, "decode: one skip instance, the histogram goes by pointer");
  // One CTA of kWarps warps; MT = 16-row MMA tiles of query rows (1 for g * q_len <= 16, the
  // common decode case; 4 up to 64 rows): the row state lives in registers, so MT is a template
  // parameter, never a run-time loop bound.
  static constexpr int MT = kMTiles_;
  // kWarps = 8: one CTA per SM at d = 128 (7 ring slots of 128 keys, 224 KB). kWarps = 4 (d = 128,
  // one m-tile; issue 18): two CTAs per SM, the shape of cuDNN's decode (2 x 4 warps, ~86 KB each,
  // which reaches 91 % of DRAM peak where one 8-warp CTA reaches 81-85 %: ncu, ce3a458): while
  // one CTA waits at a barrier or on a slot, the other's loads and MMAs go on. Its ring has to
  // fit ~113 KB, 3.5 tiles: the K ring takes 64-key half tiles (3 slots, 1.5 tiles of lookahead),
  // the V ring 2 whole tiles (P.V one survivor behind: a V slot is refilled only after a barrier
  // that follows the P.V which read it; 3 half-tile V slots would refill one before it).
  static constexpr int kWarps = kWarps_;
  static_assert(kWarps == 8 || (kWarps == 4 && MT == 1 && D == 128), "4 warps: d = 128, one m-tile");
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kTileKeys = sm90::kTileKeys;
  static constexpr int kRows = MT * 16;  // padded rows
  static_assert(kRows <= ::blasst::detail::kDecodeMaxRows, "at most 64 rows per KV group");
  // Keys per K slot: a whole tile, or a half tile with 4 warps. Each warp scores 16 keys of every
  // key group (kKeyGroups groups of kWarps * 16 keys per tile: 1 with 8 warps, 2 with 4); with 4
  // warps group j is half tile j, so a K slot holds one group.
  static constexpr int kKSlotKeys = kWarps == 8 ? kTileKeys : kTileKeys / 2;
  static constexpr int kKeyGroups = kTileKeys / (kWarps * 16);
  static constexpr int kKSlotsPerTile = kTileKeys / kKSlotKeys;
  static_assert(kKSlotsPerTile == kKeyGroups, "one key group per K slot");
  // K ring depth NK (slots of kKSlotKeys keys): tiles (or half tiles) whose loads are in flight
  // ahead of the scores.
  static constexpr int NK = 3;
  // V ring depth NV: P.V of a surviving tile runs NV - 1 survivors after its vote, so its V load
  // has NV - 1 iterations to land (the V of a tile can only be requested once its vote is known).
  // One m-tile keeps Q, P and alpha in registers, which leaves room for a fourth V slot at
  // d = 128 (7 slots of 32 KB); d = 64 keeps 3 so that two CTAs fit per SM; four m-tiles need a
  // P ring; four warps: 2 (see kWarps).
  static constexpr int NV = kWarps == 4 ? 2 : MT == 1 ? (D == 128 ? 4 : 3) : 2;
  // CTAs per SM the shared-memory size allows (d = 64, one m-tile: two, with 128 registers each;
  // four warps: two, up to 255 registers each).
  static constexpr int kMinCtas = (kWarps == 4 || (D == 64 && MT == 1)) ? 2 : 1;
  static constexpr int kLag = NV - 1;  // survivors between a tile's vote and its P.V
  static_assert(kLag >= 1, "P.V runs at least one survivor behind its vote");
  // Fragment shapes: warp w scores keys 16w .. 16w + 15 of each key group (S = Q K^T, mma.sync m16n8k16).
  static constexpr int CH = D / 8;                // 16-byte chunks per K/V row
  static constexpr int kKW = 16;                  // keys per warp and key group in S = Q K^T
  static constexpr int kSN = kKW / 8;             // S n8 tiles per warp and key group (2)
  static constexpr int kSNT = kSN * kKeyGroups;   // S n8 tiles per warp and tile
  static constexpr int kDN = D / 8;               // n8 tiles of a full output row
  static constexpr int kNT = D / 8 / kWarps;      // four m-tiles: n8 tiles of a warp's D/8 output columns
  // Output accumulator: one m-tile: this warp's keys x all D columns (summed over warps at the
  // end); four m-tiles: all keys x this warp's D/8 columns.
  static constexpr int kON = MT == 1 ? kDN : kNT;
  static constexpr int kQPer = (kRows * CH + kThreads - 1) / kThreads;  // Q chunks per thread
  static_assert(kTileKeys % (kWarps * kKW) == 0, "whole key groups per tile");
  static_assert(MT == 1 || kNT == 1 || kNT == 2, "four m-tiles: D must be 64 or 128 with 8 warps");
  static constexpr int kSlotBytes = kTileKeys * 2 * D;    // a V slot (and a K slot with 8 warps)
  static constexpr int kKSlotBytes = kKSlotKeys * 2 * D;  // a K slot
  static constexpr int kPStageBytes = kRows * kTileKeys * 2;
  using SharedStorage =
      std::conditional_t<MT == 1, SharedStorageRegP<NK, NV, kKSlotBytes, kSlotBytes, kWarps, kRows>,
                         SharedStorageWithP<NK, NV, kSlotBytes, kWarps, kRows, kPStageBytes, kRows * D * 2>>;
  static constexpr std::size_t kSmemBytes = sizeof(SharedStorage);
  static_assert(kKSlotBytes % 1024 == 0 && kSlotBytes % 1024 == 0 && kPStageBytes % 1024 == 0,
                "1 KB-aligned slots");
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM fits");
  // 228 KB per SM, 1 KB of it reserved per CTA.
  static_assert(kMinCtas == 1 || kMinCtas * (kSmemBytes + 1024) <= 228 * 1024, "the CTAs per SM fit");
  static_assert(MT != 1 || std::size_t(kWarps) * 16 * D * 4 <= std::size_t(NK) * kKSlotBytes,
                "the one-m-tile epilogue buffer fits the K ring");
};

}  // namespace blasst::sm90::decode
