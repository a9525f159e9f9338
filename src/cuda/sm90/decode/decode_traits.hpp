// Internal: compile-time shape of the decode kernel as one function of (element type, head dim,
// variant, m-tiles): warps, ring depths, CTAs per SM and the shared-memory layout (one struct).
// See docs/decode_kernel.md.
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
template <int NK, int NV, int kSlotBytes, int kWarps, int kRows>
struct SharedStorageRegP {  // one m-tile: Q, P and alpha live in registers
  unsigned char k[NK][kSlotBytes];
  unsigned char v[NV][kSlotBytes];
  float red[2][kWarps][kRows];
  int v_tile[NV];
  alignas(8) std::uint64_t bar[NK + NV + 2];
};

template <DType E, int kHeadDim_, KernelVariant V, int kMTiles_>
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
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kTileKeys = sm90::kTileKeys;
  static constexpr int kRows = MT * 16;  // padded rows
  static_assert(kRows <= ::blasst::detail::kDecodeMaxRows, "at most 64 rows per KV group");
  // K ring depth NK: tiles whose loads are in flight ahead of the scores.
  static constexpr int NK = 3;
  // V ring depth NV: P.V of a surviving tile runs NV - 1 survivors after its vote, so its V load
  // has NV - 1 iterations to land (the V of a tile can only be requested once its vote is known).
  // One m-tile keeps Q, P and alpha in registers, which leaves room for a fourth V slot at
  // d = 128 (7 slots of 32 KB); d = 64 keeps 3 so that two CTAs fit per SM; four m-tiles need a
  // P ring.
  static constexpr int NV = MT == 1 ? (D == 128 ? 4 : 3) : 2;
  // CTAs per SM the shared-memory size allows (d = 64, one m-tile: two, with 128 registers each).
  static constexpr int kMinCtas = (D == 64 && MT == 1) ? 2 : 1;
  static constexpr int kLag = NV - 1;  // survivors between a tile's vote and its P.V
  static_assert(kLag >= 1, "P.V runs at least one survivor behind its vote");
  // Fragment shapes: warp w scores keys 16w .. 16w + 15 of a tile (S = Q K^T, mma.sync m16n8k16).
  static constexpr int CH = D / 8;                // 16-byte chunks per K/V row
  static constexpr int kKW = kTileKeys / kWarps;  // keys per warp in S = Q K^T (16)
  static constexpr int kSN = kKW / 8;             // S n8 tiles per warp (2)
  static constexpr int kDN = D / 8;               // n8 tiles of a full output row
  static constexpr int kNT = D / 8 / kWarps;      // four m-tiles: n8 tiles of a warp's D/8 output columns
  // Output accumulator: one m-tile: this warp's 16 keys x all D columns (summed over warps at the
  // end); four m-tiles: all keys x this warp's D/8 columns.
  static constexpr int kON = MT == 1 ? kDN : kNT;
  static constexpr int kQPer = (kRows * CH + kThreads - 1) / kThreads;  // Q chunks per thread
  static_assert(kKW == 16 && kSN == 2, "8 warps x 16 keys");
  static_assert(kNT == 1 || kNT == 2, "D must be 64 or 128 with 8 warps");
  static constexpr int kSlotBytes = kTileKeys * 2 * D;
  static constexpr int kPStageBytes = kRows * kTileKeys * 2;
  using SharedStorage =
      std::conditional_t<MT == 1, SharedStorageRegP<NK, NV, kSlotBytes, kWarps, kRows>,
                         SharedStorageWithP<NK, NV, kSlotBytes, kWarps, kRows, kPStageBytes, kRows * D * 2>>;
  static constexpr std::size_t kSmemBytes = sizeof(SharedStorage);
  static_assert(kSlotBytes % 1024 == 0 && kPStageBytes % 1024 == 0, "1 KB-aligned slots");
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM fits");
  static_assert(kMinCtas == 1 || kMinCtas * (kSmemBytes + 1024) <= 228 * 1024, "the CTAs per SM fit");
  static_assert(MT != 1 || std::size_t(kWarps) * 16 * D * 4 <= std::size_t(NK) * kSlotBytes,
                "the one-m-tile epilogue buffer fits the K ring");
};

}  // namespace blasst::sm90::decode
