// Internal: compile-time shape of the prefill kernel (tiles, stages, shared-memory layouts, MMA
// atoms, TMA types) as one function of (element type, head dim, variant).
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/float8.h>
#include <type_traits>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuda/sm90/kernel_table.hpp"
#include "cuda/sm90/prefill/prefill_params.hpp"

namespace blasst::sm90::prefill {

using namespace cute;
using cute::Tensor;  // not blasst::Tensor

// One instance per (element type, head dim, variant): KernelVariant::skip and skip_hist are the
// Skip-Softmax variants of the same kernel (SPEC §2), everything else is shared. What the skip
// variants do differently (measured on the H200, bench/results/prefill_log.md runs 3-5):
//   - tree row maximum (the vote waits for every row maximum; dense interleaves the serial one);
//   - early V release: wait for P V of tile n-1 and release its V stage right after the vote
//     (before the exponentials), a skipped tile's V stage in its own step;
//   - K ahead: the producer issues K_{n+1} before V_n (V is first read one step after K);
//   - skip_hist only: the SPEC §5 delta histogram (its code costs the plain skip kernel 4-9 %),
//     binned by two warps of the producer warpgroup (one per consumer warpgroup) that join the
//     vote barrier (prefill_mainloop.hpp, hist_warp_run);
//   - skip_record (and skip_hist): the SPEC §9 skip set for the backward (AttentionProblem::
//     skip_set). Its code in the plain skip kernel, switched off at run time, cost skip50 / skip70
//     2-6 % (H200, ed3a5b3 against d55992a), so it has its own instance. There the bit is set
//     on the skipped-tile path after the V release, by one predicated red.or: the main loop's
//     SASS is the plain skip instance's plus 11 instructions on that path (cuobjdump, all four
//     dtype x head-dim pairs; before: 20 more between the vote and the V release, a
//     reconvergence region and a rescheduled softmax).
template <class Element_, int kHeadDim_, KernelVariant kVariant_>
struct PrefillTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr KernelVariant kVariant = kVariant_;
  static constexpr bool kSkip = kVariant_ != KernelVariant::dense;
  static constexpr bool kHist = kVariant_ == KernelVariant::skip_hist;
  static constexpr bool kRecordSet = kVariant_ == KernelVariant::skip_record || kHist;
  // Where the skip set's register bits are gathered (prefill_mainloop.hpp): skip_record on the
  // kept-tile path (its calls skip, and the kept path's exponentials leave issue slots free);
  // skip_hist on the skipped-tile path (its statistics-only calls skip nothing, and most of them
  // record no set).
  static constexpr bool kRecordKept = kVariant_ == KernelVariant::skip_record;
  static constexpr bool kTreeMax = kSkip;
  static constexpr bool kEarlyV = kSkip;
  static constexpr bool kKAhead = kSkip;
  // SPEC §2b FP8 screen (prefill_screen.hpp): an e4m3 copy of Q (once) and of each K tile (in
  // K's pipeline stage, on K's barrier), S8 = Q8 K8^T by FP8 wgmma before the bf16 Q K^T, which
  // runs only for tiles the screen does not skip (kScreenCheck: for every tile, to count wrong
  // screens).
  static constexpr bool kScreen =
      kVariant_ == KernelVariant::skip_screen || kVariant_ == KernelVariant::skip_screen_check;
  static constexpr bool kScreenCheck = kVariant_ == KernelVariant::skip_screen_check;
  // SPEC §2b screen ahead (prefill_screen_ahead.hpp decides; this is the pass after it): the walk
  // visits the tiles of the plan's list, and a vote group the plan skips on a listed tile (the
  // other group needs it) skips it without its vote.
  static constexpr bool kAhead = kVariant_ == KernelVariant::skip_ahead;
  static_assert(!kRecordSet || kEarlyV, "the skip set is recorded on the early-V skipped-tile path");
  // 128 query rows per CTA = two consumer warpgroups of 64 rows (the skip vote group);
  // 128 keys per tile = the SPEC tile.
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kTileKeys;
  static_assert(kBlockM / 2 == ::blasst::detail::kPrefillVoteRows, "a consumer warpgroup is the vote group");
  static constexpr int kNumMmaWG = kBlockM / 64;
  static constexpr int kNumMmaThreads = kNumMmaWG * 128;
  static constexpr int kNumThreads = kNumMmaThreads + 128;  // + one producer warpgroup
  // The screen's K8 tiles and Q8 take 3 x 16 KB + 16 KB at d = 128: two stages fit (208 KB).
  static constexpr int kStages = kHeadDim_ == 128 ? (kScreen ? 2 : 3) : 4;
  // setmaxnreg budget: 24 + 2 * 240 registers per lane-slot of a 3-warpgroup CTA <= 64K.
  static constexpr int kRegProducer = 24;
  static constexpr int kRegConsumer = 240;
  // Ping-pong the two consumer warpgroups' GEMM issue (one does softmax while the other's GEMMs run).
  static constexpr bool kPingPong = true;
  // Threads at a consumer warpgroup's vote barrier: its 128, plus its histogram warp (skip_hist:
  // producer-warpgroup warp 1 + cwg, which reads the deltas the barrier orders).
  static constexpr int kVoteThreads = 128 + (kHist ? 32 : 0);
  // Delta slots per consumer warpgroup and tile parity: one per quad (the four threads of a quad
  // hold the same two rows). 4 in the other instances: their layout as before (unused there).
  static constexpr int kHistDeltaSlots = kHist ? 32 : 4;

  using TileShapeQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
  using TileShapePV = Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;
  using AtomLayoutMma = Layout<Shape<Int<kNumMmaWG>, _1, _1>>;
  // S = Q K^T: both operands from shared memory, K-major.
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(),
      AtomLayoutMma{}));
  // O += P V: P from registers (the softmax output), V from shared memory, MN-major.
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomLayoutMma{}));

  // Head dims 64 and 128 are multiples of 64 16-bit elements: the 128-byte swizzle fits.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = SmemLayoutK;
  // V^T view (dv, keys, stage) of the same bytes, for the MN-major B operand of P V.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{},
      make_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{},
                  Stride<Int<kBlockN>, _1, Int<kBlockN * kHeadDim>>{})));

  // Global tensors as (tokens, d, heads, batch) with element strides.
  using GShape = Shape<int32_t, Int<kHeadDim>, int32_t, int32_t>;
  using GStride = Stride<int64_t, _1, int64_t, int64_t>;
  using GLayout = Layout<GShape, GStride>;
  static auto dummy_gtensor() {
    return make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GLayout{});
  }
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, dummy_gtensor(), SmemLayoutQ{},
                                      Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, dummy_gtensor(),
                                       take<0, 2>(SmemLayoutK{}),
                                       Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  static constexpr uint32_t kTmaBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTmaBytesKV = kBlockN * kHeadDim * sizeof(Element);

  // FP8 screen: S8 = Q8 K8^T, e4m3 x e4m3 -> f32, both operands K-major from shared memory; the
  // accumulator has tSrS's layout (GMMA's 64 x N f32 C layout does not depend on the inputs).
  using Element8 = cutlass::float_e4m3_t;
  using TiledMmaQK8 = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element8, Element8, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(),
      AtomLayoutMma{}));
  // d e4m3 bytes per row: the 128-byte swizzle at d = 128, the 64-byte one at d = 64.
  using SmemAtom8 = std::conditional_t<kHeadDim == 128, GMMA::Layout_K_SW128_Atom<Element8>,
                                       GMMA::Layout_K_SW64_Atom<Element8>>;
  using SmemLayoutQ8 = decltype(tile_to_shape(SmemAtom8{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK8 =
      decltype(tile_to_shape(SmemAtom8{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using GLayout8 = Layout<GShape, GStride>;  // e4m3 copies: same (tokens, d, heads, batch) form
  static auto dummy_gtensor8() {
    return make_tensor(make_gmem_ptr(static_cast<Element8 const*>(nullptr)), GLayout8{});
  }
  using TmaQ8 = decltype(make_tma_copy(SM90_TMA_LOAD{}, dummy_gtensor8(), SmemLayoutQ8{},
                                       Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaK8 = decltype(make_tma_copy(SM90_TMA_LOAD{}, dummy_gtensor8(), take<0, 2>(SmemLayoutK8{}),
                                       Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  static constexpr uint32_t kTmaBytesQ8 = kBlockM * kHeadDim;
  static constexpr uint32_t kTmaBytesK8 = kBlockN * kHeadDim;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;

  struct SharedStorageBase {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> v;
    typename Pipeline::SharedStorage pipe_k;
    typename Pipeline::SharedStorage pipe_v;
    cutlass::arch::ClusterTransactionBarrier::ValueType barrier_q;
    // Delta histogram: per consumer warpgroup, double-buffered by tile parity, each quad's
    // maximum delta of a tile (written by the consumers after the vote, binned by the
    // warpgroup's histogram warp after the next one).
    alignas(16) float hist_delta[kNumMmaWG][2][kHistDeltaSlots];
  };
  // The screen instances add the e4m3 copies (the other instances' layout stays as it was).
  struct SharedStorageScreen : SharedStorageBase {
    cute::array_aligned<Element8, cute::cosize_v<SmemLayoutQ8>, 1024> q8;
    cute::array_aligned<Element8, cute::cosize_v<SmemLayoutK8>, 1024> k8;
  };
  using SharedStorage = std::conditional_t<kScreen, SharedStorageScreen, SharedStorageBase>;
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "prefill shared memory exceeds the sm_90 limit: fewer stages");
};

}  // namespace blasst::sm90::prefill
