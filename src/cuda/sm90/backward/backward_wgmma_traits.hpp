// Internal: compile-time shape of the warp-specialised sm_90a backward kernel (TMA loads, wgmma)
// as one function of (element type, head dim). One CTA owns one 128-key block (the SPEC tile) of
// one KV head: warpgroup 0 produces (TMA of K and V once, then Q and dO per step through a
// kStages-deep pipeline), warpgroups 1 and 2 consume, each owning 64 of the 128 keys. A step is one
// (query head, 64-row query block) pair: one skip-set bit (SPEC §9).
//
// The scores are computed transposed (keys x rows), so that P^T and dS^T are already the register
// A operands of dV += P^T dO and dK += dS^T Q; dQ = dS K reads dS from shared memory, each
// consumer warpgroup computing one half of the head dim over all 128 keys (d = 128), and leaves
// through shared memory and a TMA reduce-add into the f32 workspace.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuda/sm90/backward/backward_params.hpp"
#include "cuda/sm90/common/skip_policy.hpp"

namespace blasst::sm90::backward {

using namespace cute;
using cute::Tensor;  // not blasst::Tensor

template <class Element_, int kHeadDim_>
struct BackwardWgmmaTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "the tilings below are written for d = 64 and 128");
  static_assert(sizeof(Element) == 2, "16-bit inputs");
  static constexpr int kBlockM = 64;          // query rows per step: one forward vote group
  static constexpr int kBlockN = kTileKeys;   // keys per CTA: one SPEC tile
  static_assert(kBlockN == 128, "two consumer warpgroups of 64 keys");
  static constexpr int kNumMmaWG = 2;
  static constexpr int kNumMmaThreads = kNumMmaWG * 128;
  static constexpr int kNumThreads = kNumMmaThreads + 128;  // + the producer warpgroup
  // Q / dO pipeline depth. d = 64: 4 (a step is half the tensor work of d = 128 for the same
  // loads' latency; A/B on the H200, 2026-12-04: +1.6-2.2 % over 2 stages, 3 stages +0.3-0.8 %);
  // d = 128: 2 (3 stages: no gain within noise, and 214 of 227 KB of shared memory).
  static constexpr int kStages = kHeadDim == 64 ? 4 : 2;
  // setmaxnreg: 24 + 2 * 240 registers per lane slot of the three warpgroups <= 64K.
  static constexpr int kRegProducer = 24;
  static constexpr int kRegConsumer = 240;

  // S^T = K Q^T and dP^T = V dO^T: (128 keys, 64 rows, d), both operands K-major in shared memory;
  // warpgroup w owns keys [64 w, 64 w + 64).
  using TileShapeSdP = Shape<Int<kBlockN>, Int<kBlockM>, Int<kHeadDim>>;
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDim>>>(),
      Layout<Shape<_2, _1, _1>>{}));
  // dV += P^T dO and dK += dS^T Q: (128 keys, d, 64 rows); A from registers (the S^T / dP^T
  // accumulators, converted), B = dO^T / Q^T views of the row-major tiles (MN-major).
  using TileShapeDKV = Shape<Int<kBlockN>, Int<kHeadDim>, Int<kBlockM>>;
  using TiledMmaDKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));
  // dQ = dS K: A = dS (shared, K-major), B = K^T view (MN-major). d = 128: warpgroup w computes
  // columns [64 w, 64 w + 64) over all 128 keys (tile (64 rows, d, 128 keys)). d = 64: a 32-column
  // half would start inside a 128-byte swizzle atom of K^T, which no wgmma descriptor addresses,
  // so warpgroup w computes all d columns over its own 64 keys (tile (64 rows, d, 64 keys), one
  // warpgroup) and both add their partial dQ into the workspace.
  static constexpr bool kDqSplitN = kHeadDim >= 128;
  static constexpr int kDqKeys = kDqSplitN ? kBlockN : kBlockN / kNumMmaWG;  // keys per dQ product
  using TileShapeDQ = Shape<Int<kBlockM>, Int<kHeadDim>, Int<kDqKeys>>;
  using TiledMmaDQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<_64, Int<kDqSplitN ? kHeadDim / kNumMmaWG : kHeadDim>, Int<kDqKeys>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_1, Int<kDqSplitN ? kNumMmaWG : 1>, _1>>{}));

  // dQ leaves through shared memory: each consumer warpgroup's f32 product (64 rows x kDqCols
  // columns: its head-dim half at d = 128, all d columns over its own keys at d = 64) is stored
  // to its own 128-byte-swizzled tile and added into the f32 workspace by one TMA reduce-add
  // (element-wise atomic in L2, so the two warpgroups' d = 64 partials and other CTAs' add up).
  static constexpr int kDqCols = kDqSplitN ? kHeadDim / kNumMmaWG : kHeadDim;
  static_assert(kDqCols == 64, "one 64 x 64 f32 dQ tile per consumer warpgroup");
  using SmemLayoutDQ =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<float>{}, Shape<Int<kBlockM>, Int<kDqCols>>{}));
  // A thread's dQ pairs lie whole 8-row and 8-column steps (dr, dc) from its first pair, whose
  // column is below 8 (GMMA C layout). The 128-byte swizzle XORs byte bits [4, 7) of an address
  // with bits [7, 10) and reads nothing else: 8 rows (1024 B) and a 32-float column block
  // (kBlockM rows of 128 B) add from bit 10 up, and a column step inside a block sets bits [5, 7),
  // clear before the swizzle in the first pair's address, so the swizzle passes it through as an
  // XOR. A pair's address is (first ^ x) + a (16 per-pair addresses held across the step loop
  // spilled at d = 128). tests/gpu_backward/test_wgmma_layouts.cu checks this against the
  // swizzled tensor for every pair.
  struct DqStep {
    uint32_t x, a;
  };
  CUTE_HOST_DEVICE static constexpr DqStep dq_step(int dr, int dc) {
    constexpr int kRowBytes = 32 * sizeof(float);  // one swizzle row
    return {uint32_t(dc % 32 * sizeof(float)), uint32_t(dr * kRowBytes + dc / 32 * kBlockM * kRowBytes)};
  }
  // Bank conflicts of those stores. One st.shared.v2.f32 of the whole warp writes, per half-warp,
  // four rows r..r+3 of four lanes each, each row one 32-byte chunk pair; the swizzle maps the
  // chunk pair of rows r and r ^ 1 to the same banks, so every store took 4 wavefronts where 2
  // carry its 256 bytes (ncu, 2026-12-05: 67 M conflicts at d128 8k). So a lane stores its column
  // groups in a lane-dependent order: at slot j (of 8-column groups, within each 32-column block)
  // the group j ^ g, g = dq_gray(row % 4) = 0, 1, 3, 2, which puts the four rows of a half-warp on
  // four different chunk pairs. The address of group j ^ g is the slot's XOR 32 g (a column step
  // inside the block, as in dq_step). tests/gpu_backward/test_wgmma_layouts.cu counts the
  // wavefronts of every store against the swizzle.
  CUTE_HOST_DEVICE static constexpr int dq_gray(int row) { return (row % 4) ^ (row % 4 >> 1); }
  // dS^T registers -> shared memory by stmatrix.trans: the S^T accumulator holds (key, row pairs),
  // the dS tile is row-major with keys contiguous.
  using SmemCopyAtomDS = Copy_Atom<SM90_U16x8_STSM_T, Element>;

  // 128-byte swizzle: every tile row is a multiple of 64 16-bit elements.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutDO = SmemLayoutQ;
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutV = SmemLayoutK;
  using SmemLayoutDS = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  // Transposed views of the same bytes: Q^T / dO^T (d, rows, stage), K^T (d, keys), dS^T (keys, rows).
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{},
                                 Stride<Int<kBlockM>, _1, Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));
  using SmemLayoutDSt = decltype(composition(
      SmemLayoutDS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, Stride<Int<kBlockM>, _1>{})));

  // Global tensors as (tokens, d, heads, batch) with element strides (as the prefill kernel's).
  using GShape = Shape<int32_t, Int<kHeadDim>, int32_t, int32_t>;
  using GStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GLayout = Layout<GShape, GStride>;
  static auto dummy_gtensor() { return make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GLayout{}); }
  // The f32 dQ workspace [tokens_q, hq, d] in the same (tokens, d, heads, batch) form.
  static auto dummy_gtensor_dq() { return make_tensor(make_gmem_ptr(static_cast<float*>(nullptr)), GLayout{}); }
  using TmaDQ = decltype(make_tma_copy(SM90_TMA_REDUCE_ADD{}, dummy_gtensor_dq(), SmemLayoutDQ{},
                                       Shape<Int<kBlockM>, Int<kDqCols>>{}, _1{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, dummy_gtensor(), take<0, 2>(SmemLayoutQ{}),
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, dummy_gtensor(), SmemLayoutK{},
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesK = kBlockN * kHeadDim * sizeof(Element);
  // Kept-step words in shared memory: 32768 steps (e.g. 8 query heads per KV head x 4096 query
  // blocks = 256k tokens); a CTA with more walks the skip set in global memory.
  static constexpr int kKeptWords = 1024;
  static constexpr uint32_t kBulkBytesRows = kBlockM * sizeof(float);  // one LSE or D run of a step
  static_assert(kBulkBytesRows % 16 == 0 && kBlockM == kLseRowAlign, "bulk copies of whole aligned 64-row runs");

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDO>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDS>, 1024> ds;
    cute::array_aligned<float, kNumMmaWG * cute::cosize_v<SmemLayoutDQ>, 1024> dq;  // one tile per warpgroup
    // LSE (log2) and D of each stage's 64 query rows: one bulk copy each, on the stage's barrier.
    cute::array_aligned<float, kStages * kBlockM, 128> lse;
    cute::array_aligned<float, kStages * kBlockM, 128> dsum;
    // The CTA's kept steps (BackwardScheduler::load_kept_words), when the skip set's fit.
    cute::array_aligned<std::uint32_t, kKeptWords, 16> kept;
    typename Pipeline::SharedStorage pipe_qdo;
    cutlass::arch::ClusterTransactionBarrier::ValueType barrier_kv;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "backward shared memory exceeds the sm_90 limit");
};

}  // namespace blasst::sm90::backward
