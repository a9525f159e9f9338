// Internal: compile-time shape of the backward kernel (tiles, shared-memory layouts, MMA atoms,
// shared-memory copies) as one function of (element type, head dim). FlashAttention-2 scheme on
// SM80 tensor-core instructions (mma.sync m16n8k16, ldmatrix, cp.async), which Hopper runs
// natively; WGMMA / TMA is a later step.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/mma_sm80.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

#include "cuda/sm90/common/skip_policy.hpp"

namespace blasst::sm90::backward {

using namespace cute;
using cute::Tensor;  // not blasst::Tensor

template <class Element_, int kHeadDim_>
struct BackwardTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "the tilings below are written for d = 64 and 128");
  // One CTA owns one key block of the SPEC tile (128 keys) and loops over query blocks of one
  // forward vote group (64 rows): a skip-set bit is exactly one (query block, key block) step.
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = kTileKeys;
  static_assert(kBlockN == 128, "the warp layouts below assume 128-key tiles");
  static constexpr int kNumWarps = 8;
  static constexpr int kNumThreads = kNumWarps * 32;
  // Rows of every shared tile are padded by 16 bytes: ldmatrix rows of one 8x8 matrix then fall
  // into distinct bank quads (pitch 144 or 272 bytes = 4 words mod 32), no swizzle needed, and
  // every row stays 16-byte aligned for cp.async and ldmatrix.
  static constexpr int kPad = 8;
  static constexpr int kLdD = kHeadDim + kPad;  // pitch of the Q, dO, K, V tiles (elements)
  static constexpr int kLdN = kBlockN + kPad;   // pitch of the P, dS tiles
  static_assert((kLdD * 2) % 16 == 0 && (kLdN * 2) % 16 == 0, "16-byte aligned rows");
  static_assert(sizeof(Element) == 2, "16-bit inputs");

  using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::bfloat16_t>, SM80_16x8x16_F32BF16BF16F32_TN,
                                   SM80_16x8x16_F32F16F16F32_TN>;
  using MmaAtom = MMA_Atom<MmaOp>;
  // S = Q K^T and dP = dO V^T: 64 x 128, warps 2 (rows) x 4 (keys); both with the same layout, so
  // that dS = P * (dP - D) is elementwise on the registers.
  using TiledMmaSdP = TiledMMA<MmaAtom, Layout<Shape<_2, _4, _1>>, Tile<_32, _64, _16>>;
  // dV += P^T dO and dK += dS^T Q: 128 keys x d, warps 4 (keys) x 2 (d).
  using TiledMmaDKV = TiledMMA<MmaAtom, Layout<Shape<_4, _2, _1>>, Tile<_64, _32, _16>>;
  // dQ = dS K: 64 rows x d, warps 2 (rows) x 4 (d).
  using TiledMmaDQ = TiledMMA<MmaAtom, Layout<Shape<_2, _4, _1>>, Tile<_32, _64, _16>>;
  static_assert(kHeadDim % 64 == 0, "the d tilings (32 and 64 columns) divide d");
  // S and dP are computed in kSdPSplit key slices of kBlockNSdP keys, each turned into P / dS in
  // shared memory before the next: the S, dP, dK and dV accumulators are all live there (the
  // register peak), and at d = 128 dK + dV alone take 128 registers per thread (ptxas, one
  // 128-key pass: 254 registers and a 16-28 byte spill; two slices: 255 registers, no spill).
  static constexpr int kSdPSplit = kHeadDim == 128 ? 2 : 1;
  static constexpr int kBlockNSdP = kBlockN / kSdPSplit;
  static_assert(kBlockNSdP % 64 == 0, "a key slice is a whole TiledMmaSdP tile");

  // Row-major tiles with padded rows, and their transposed views (same bytes).
  using SmemLayoutQ = Layout<Shape<Int<kBlockM>, Int<kHeadDim>>, Stride<Int<kLdD>, _1>>;   // Q, dO
  using SmemLayoutQt = Layout<Shape<Int<kHeadDim>, Int<kBlockM>>, Stride<_1, Int<kLdD>>>;  // Q^T, dO^T
  using SmemLayoutK = Layout<Shape<Int<kBlockN>, Int<kHeadDim>>, Stride<Int<kLdD>, _1>>;   // K, V
  using SmemLayoutKt = Layout<Shape<Int<kHeadDim>, Int<kBlockN>>, Stride<_1, Int<kLdD>>>;  // K^T
  using SmemLayoutP = Layout<Shape<Int<kBlockM>, Int<kBlockN>>, Stride<Int<kLdN>, _1>>;    // P, dS
  using SmemLayoutKSlice = Layout<Shape<Int<kBlockNSdP>, Int<kHeadDim>>, Stride<Int<kLdD>, _1>>;  // K, V slice
  using SmemLayoutPSlice = Layout<Shape<Int<kBlockM>, Int<kBlockNSdP>>, Stride<Int<kLdN>, _1>>;   // P, dS slice
  using SmemLayoutPt = Layout<Shape<Int<kBlockN>, Int<kBlockM>>, Stride<_1, Int<kLdN>>>;   // P^T, dS^T

  // ldmatrix: K-major operands plain, MN-major operands (the transposed views) with .trans.
  using SmemCopyN = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyT = Copy_Atom<SM75_U16x8_LDSM_T, Element>;

  static constexpr int kQStages = 2;
  struct SharedStorage {
    alignas(128) Element k[kBlockN * kLdD];
    alignas(128) Element v[kBlockN * kLdD];
    // Q and dO of the current step and of the next one (cp.async while this step computes).
    alignas(128) Element q[kQStages][kBlockM * kLdD];
    alignas(128) Element dout[kQStages][kBlockM * kLdD];
    alignas(128) Element p[kBlockM * kLdN];
    alignas(128) Element ds[kBlockM * kLdN];
    alignas(16) float lse_log2[kBlockM];
    alignas(16) float dsum[kBlockM];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one sm_90 CTA");
  // 16-byte chunks per tile row, and cp.async rounds of the whole CTA per tile.
  static constexpr int kChunksPerRow = kHeadDim / 8;
  static_assert((kBlockM * kChunksPerRow) % kNumThreads == 0, "Q / dO tiles load in whole rounds");
  static_assert((kBlockN * kChunksPerRow) % kNumThreads == 0, "K / V tiles load in whole rounds");
};

}  // namespace blasst::sm90::backward
