// Internal: compile-time shape of the warp-specialised sm_90a backward kernel (TMA loads, wgmma)
// as one function of (element type, head dim). One CTA owns one 128-key block (the SPEC tile) of
// one KV head: warpgroup 0 produces (TMA of K and V once, then Q and dO per step through a
// kStages-deep pipeline), warpgroups 1 and 2 consume, each owning 64 of the 128 keys. A step is
// kBlockM query rows: one forward vote group of 64 rows at d = 128, two at d = 64, each the next
// kept (query head, vote group) of the CTA wherever it lies (BackwardScheduler::next_step; SPEC
// §9: a skipped group costs nothing; a slot past the list's end repeats one and is masked).
//
// The scores are computed transposed (keys x rows), so that P^T and dS^T are already the register
// A operands of dV += P^T dO and dK += dS^T Q; dQ = dS K reads dS from shared memory (both
// warpgroups' keys): at d = 128 each consumer warpgroup computes one half of the head dim, at
// d = 64 one half of the step's 128 rows; each leaves through shared memory and a bulk reduce-add
// into the f32 workspace.
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
  // Query rows per step. d = 64: 128 (two kept vote groups), so that the S^T / dP^T products are
  // 64 x 128 (N = 128: the wgmma shape whose shared-memory operand reads keep up with the tensor
  // cores; N = 64 reads one byte per FMA more) and a step's fixed costs (barriers, pipeline, LSE /
  // D, the dQ way out) are paid once per 128 rows; the accumulators (S^T, dP^T 64 each, dK, dV 32
  // each) fit 240 registers. d = 128: 64 (dK and dV alone hold 128 registers).
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;
  static constexpr int kVoteRows = ::blasst::sm90::backward::kVoteRows;  // one skip-set bit (backward_params.hpp)
  static constexpr int kGroupsPerStep = kBlockM / kVoteRows;
  static constexpr int kBlockN = kTileKeys;   // keys per CTA: one SPEC tile
  // The vote group (within the step) of column ni of a thread's S^T accumulator in its (key, row)
  // view (acc_rowcol): column ni is row (lane % 4) * 2 + ni % 2 + 8 (ni / 2) of the step (GMMA's
  // C layout), so its group is a constant of ni and the skip mask's test folds away in the
  // unrolled loops (a thread-dependent row / 64 held 32 shifted masks: 660 bytes of spills).
  // tests/gpu_backward/test_wgmma_layouts.cu checks it for every thread.
  CUTE_HOST_DEVICE static constexpr int vote_group_of_col(int ni) { return 8 * (ni / 2) / kVoteRows; }
  static_assert(kBlockN == 128, "two consumer warpgroups of 64 keys");
  static constexpr int kNumMmaWG = 2;
  static constexpr int kNumMmaThreads = kNumMmaWG * 128;
  static constexpr int kNumThreads = kNumMmaThreads + 128;  // + the producer warpgroup
  // Q / dO pipeline depth: 2 (d = 128: 3 stages gained nothing within noise and took 214 of
  // 227 KB of shared memory; d = 64 with 64-row steps had gained 1.6-2.2 % from 4 stages, which
  // are the same bytes as 2 stages of 128 rows).
  static constexpr int kStages = 2;
  // setmaxnreg: 24 + 2 * 240 registers per lane slot of the three warpgroups <= 64K.
  static constexpr int kRegProducer = 24;
  static constexpr int kRegConsumer = 240;

  // S^T = K Q^T and dP^T = V dO^T: (128 keys, kBlockM rows, d), both operands K-major in shared
  // memory; warpgroup w owns keys [64 w, 64 w + 64).
  using TileShapeSdP = Shape<Int<kBlockN>, Int<kBlockM>, Int<kHeadDim>>;
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDim>>>(),
      Layout<Shape<_2, _1, _1>>{}));
  // dV += P^T dO and dK += dS^T Q: (128 keys, d, kBlockM rows); A from registers (the S^T / dP^T
  // accumulators, converted), B = dO^T / Q^T views of the row-major tiles (MN-major).
  using TileShapeDKV = Shape<Int<kBlockN>, Int<kHeadDim>, Int<kBlockM>>;
  using TiledMmaDKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));
  // dQ = dS K: A = dS (shared, K-major), B = K^T view (MN-major), over all 128 keys. d = 128:
  // warpgroup w computes columns [64 w, 64 w + 64) of the 64 rows (kDqSplitN); d = 64: rows
  // [64 w, 64 w + 64) of the 128, every column (a 32-column half would start inside a 128-byte
  // swizzle atom of K^T, which no wgmma descriptor addresses). Either way a 64 x 64 tile per
  // warpgroup, and every dQ element is produced once.
  static constexpr bool kDqSplitN = kBlockM == 64;
  static constexpr int kDqCols = kDqSplitN ? kHeadDim / kNumMmaWG : kHeadDim;
  static constexpr int kDqRows = kDqSplitN ? kBlockM : kBlockM / kNumMmaWG;
  static_assert(kDqCols == 64 && kDqRows == 64, "one 64 x 64 f32 dQ tile per consumer warpgroup");
  using TileShapeDQ = Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;
  using TiledMmaDQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kDqCols>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<Int<kBlockM / 64>, Int<kHeadDim / kDqCols>, _1>>{}));
  // The first row and column of warpgroup wg's dQ tile within the step's (kBlockM, d) block.
  CUTE_HOST_DEVICE static constexpr int dq_row0(int wg) { return kDqSplitN ? 0 : wg * kDqRows; }
  CUTE_HOST_DEVICE static constexpr int dq_col0(int wg) { return kDqSplitN ? wg * kDqCols : 0; }

  // dQ leaves through shared memory: each consumer warpgroup's f32 tile (kDqRows x kDqCols) is
  // stored to its own 16 KB buffer in the accumulator's tile order (dq_in_tile, backward_params.hpp:
  // the fragment's values 4 at a time, thread-minor, so a warp's 16-byte stores are 512
  // consecutive bytes, no bank conflict, no swizzle), then added into the f32 workspace by one bulk
  // reduce-add (element-wise atomic in L2, where other CTAs' add up). The swizzled TMA tile it
  // replaced took two value swaps a pair to avoid bank conflicts, and the stores were the step's
  // critical path (ncu, 2026-12-06, d128 full 8k: ~20 % of the loop's stall samples, dK done
  // before them).
  static_assert(kDqRows == kDqTile && kDqCols == kDqTile, "the accumulator's 64 x 64 tiles");
  static constexpr int kDqTileFloats = kDqRows * kDqCols;
  static constexpr int kDqTileBytes = kDqTileFloats * int(sizeof(float));

  // dS^T registers -> shared memory by stmatrix.trans: the S^T accumulator holds (key, row pairs),
  // the dS tile is row-major with keys contiguous.
  using SmemCopyAtomDS = Copy_Atom<SM90_U16x8_STSM_T, Element>;

  // 128-byte swizzle: every tile row is a multiple of 64 16-bit elements.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutDO = SmemLayoutQ;
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutV = SmemLayoutK;
  // dS: two buffers, the step's and the one before, so that writing this step's dS waits for no
  // dQ product of the step before (it reads the other buffer; the one two steps back was read
  // before either warpgroup passed the last dS-full barrier). One buffer needed a dS-free barrier
  // of both warpgroups every step (ncu, 2026-12-06, d128 full 8k: ~2 % of the stall samples).
  static constexpr int kDsStages = 2;
  using SmemLayoutDS =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kBlockN>, Int<kDsStages>>{}));
  // Transposed views of the same bytes: Q^T / dO^T (d, rows, stage), K^T (d, keys), dS^T (keys, rows, buffer).
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{},
                                 Stride<Int<kBlockM>, _1, Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));
  using SmemLayoutDSt = decltype(composition(
      SmemLayoutDS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>, Int<kDsStages>>{},
                                  Stride<Int<kBlockM>, _1, Int<kBlockM * kBlockN>>{})));

  // Global tensors as (tokens, d, heads, batch) with element strides (as the prefill kernel's).
  using GShape = Shape<int32_t, Int<kHeadDim>, int32_t, int32_t>;
  using GStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GLayout = Layout<GShape, GStride>;
  static auto dummy_gtensor() { return make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GLayout{}); }
  // A step's G vote groups lie anywhere (BackwardScheduler::next_step), so Q and dO arrive one
  // group (slot) at a time: slot r of a stage is rows [64 r, 64 r + 64) of its tile, a whole
  // number of swizzle atoms (tests/gpu_backward/test_wgmma_layouts.cu checks that the slot layout
  // at slot_offset addresses the same element as the stage's tile).
  using SmemLayoutSlot = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kVoteRows>, Int<kHeadDim>>{}));
  CUTE_HOST_DEVICE static constexpr int slot_offset(int stage, int r) {
    return (stage * kGroupsPerStep + r) * kVoteRows * kHeadDim;
  }
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, dummy_gtensor(), SmemLayoutSlot{},
                                      Shape<Int<kVoteRows>, Int<kHeadDim>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, dummy_gtensor(), SmemLayoutK{},
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  static constexpr uint32_t kTmaBytesSlot = kVoteRows * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesK = kBlockN * kHeadDim * sizeof(Element);
  // Kept-group words in shared memory: 32768 (query head, vote group) pairs (e.g. 8 query heads
  // per KV head x 4096 vote groups = 256k tokens); a CTA with more walks the skip set in global
  // memory.
  static constexpr int kKeptWords = 1024;
  static constexpr uint32_t kBulkBytesSlot = kVoteRows * sizeof(float);  // one LSE or D run of a slot
  // A group's rows lie inside its sequence's own rows (each sequence starts at a multiple of
  // kLseRowAlign and owns its length rounded up to one).
  static_assert(kBulkBytesSlot % 16 == 0 && kLseRowAlign % kVoteRows == 0, "bulk copies of whole aligned runs");
  // Q, dO, LSE and D of one step: the transaction bytes of a stage.
  static constexpr uint32_t kStageBytes = kGroupsPerStep * (2 * kTmaBytesSlot + 2 * kBulkBytesSlot);

  // The producer publishes each step's groups (BackwardStep) in a shared ring, written before
  // the stage's producer_acquire and read by the consumers after their consumer_wait (the
  // stage's full barrier orders the two). kStepRing = 2 kStages entries: when the producer
  // writes step k's entry it has acquired step k - 1's stage, so the consumers have released
  // step k - 1 - kStages and moved past entry k - kStepRing. Entry: hh[G], g[G], live, last.
  static constexpr int kStepRing = 2 * kStages;
  static constexpr int kStepHh = 0, kStepG = kGroupsPerStep, kStepLive = 2 * kGroupsPerStep,
                       kStepLast = 2 * kGroupsPerStep + 1, kStepInts = 2 * kGroupsPerStep + 2;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDO>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDS>, 1024> ds;
    cute::array_aligned<float, kNumMmaWG * kDqTileFloats, 128> dq;  // one tile per warpgroup
    // LSE (log2) and D of each stage's kBlockM query rows: one bulk copy each, on the stage's barrier.
    cute::array_aligned<float, kStages * kBlockM, 128> lse;
    cute::array_aligned<float, kStages * kBlockM, 128> dsum;
    // The CTA's kept vote groups (BackwardScheduler::load_kept_words), when the skip set's fit.
    cute::array_aligned<std::uint32_t, kKeptWords, 16> kept;
    cute::array_aligned<int, kStepRing * kStepInts, 16> steps;  // the step ring (above)
    typename Pipeline::SharedStorage pipe_qdo;
    cutlass::arch::ClusterTransactionBarrier::ValueType barrier_kv;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "backward shared memory exceeds the sm_90 limit");
};

}  // namespace blasst::sm90::backward
