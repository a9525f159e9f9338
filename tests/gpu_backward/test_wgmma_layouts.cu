// The wgmma backward kernel's layout assumptions (src/cuda/sm90/backward/backward_wgmma_*.hpp),
// checked on the host with CuTe's own layout algebra (no GPU: these run in CI). What the kernel
// relies on and the compiler cannot check:
//   - the transposed shared-memory views (Q^T, dO^T, K^T, dS^T) address the same element as the
//     row-major tiles they view;
//   - the S^T / dP^T accumulator of a thread, regrouped by acc_to_a, holds exactly the (key, row)
//     elements that the dV / dK register-A operand expects of that thread;
//   - every output is produced once: S^T over the two consumer warpgroups, dK / dV per key and
//     column, dQ per row and column (split over the head dim at d = 128, over the rows at d = 64),
//     dS^T written to every element of its tile once;
//   - dQ pairs: consecutive accumulator entries are adjacent columns of one row, the first even
//     (the 8-byte shared store);
//   - the dQ product's operands: a warpgroup's dS partition holds its rows and all keys, its K^T
//     partition the columns it computes and all keys;
//   - the dS^T stmatrix.trans copy moves each register to the (key, row) it holds;
//   - the dQ tile of each warpgroup: the kernel's thread-minor 16-byte stores put every value where
//     the workspace's tile order (dq_in_tile, read by the postprocess) says, every element once;
//     the whole accumulator index one-to-one with adjacent column pairs;
//   - a step's slot (one vote group's 64 rows, loaded by its own TMA copy at slot_offset) is the
//     same bytes as rows [64 r, 64 r + 64) of the stage's tile;
//   - the step list (BackwardScheduler::next_step): every kept (query head, vote group) pair of a
//     CTA in exactly one live slot, in the flat order, no skipped one, the slots that are not
//     live only at the list's end and repeating a live one; from the shared-memory words and
//     from the skip set in global memory alike.
// Expected values come from the definitions (coordinates, offsets, the SPEC §9 skip-set index),
// not from the kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "cuda/sm90/backward/backward_tile_scheduler.hpp"
#include "cuda/sm90/backward/backward_wgmma_traits.hpp"
#include "cuda/sm90/common/wgmma.hpp"

namespace blasst::sm90::backward {
namespace {

using namespace cute;

template <class Tr>
void check_views() {
  auto lq = typename Tr::SmemLayoutQ{};
  auto lqt = typename Tr::SmemLayoutQt{};
  int bad = 0;
  for (int s = 0; s < Tr::kStages; ++s)
    for (int r = 0; r < Tr::kBlockM; ++r)
      for (int c = 0; c < Tr::kHeadDim; ++c) bad += lq(r, c, s) != lqt(c, r, s);
  auto lk = typename Tr::SmemLayoutK{};
  auto lkt = typename Tr::SmemLayoutKt{};
  for (int r = 0; r < Tr::kBlockN; ++r)
    for (int c = 0; c < Tr::kHeadDim; ++c) bad += lk(r, c) != lkt(c, r);
  auto ls = typename Tr::SmemLayoutDS{};
  auto lst = typename Tr::SmemLayoutDSt{};
  for (int b = 0; b < Tr::kDsStages; ++b)
    for (int r = 0; r < Tr::kBlockM; ++r)
      for (int c = 0; c < Tr::kBlockN; ++c)
        bad += ls(r, c, b) != lst(c, r, b) || ls(r, c, b) != ls(r, c, 0) + b * Tr::kBlockM * Tr::kBlockN;
  EXPECT_EQ(bad, 0) << "a transposed view addresses another element";
}

template <class Tr>
void check_register_handoff() {
  typename Tr::TiledMmaSdP sdp;
  typename Tr::TiledMmaDKV dkv;
  int bad = 0;
  for (int t = 0; t < Tr::kNumMmaThreads; ++t) {
    auto ts = sdp.get_thread_slice(t);
    auto tk = dkv.get_thread_slice(t);
    Tensor tc = ts.partition_C(make_identity_tensor(select<0, 1>(typename Tr::TileShapeSdP{})));  // (key, row)
    Tensor as_a = make_tensor(tc.data(), acc_to_a(tc.layout()));
    Tensor want = tk.partition_A(make_identity_tensor(make_shape(Int<Tr::kBlockN>{}, Int<Tr::kBlockM>{})));
    ASSERT_EQ(int(size(as_a)), int(size(want))) << "thread " << t;
    for (int i = 0; i < size(want); ++i)
      bad += !(get<0>(as_a(i)) == get<0>(want(i)) && get<1>(as_a(i)) == get<1>(want(i)));
  }
  EXPECT_EQ(bad, 0) << "P^T / dS^T registers are not the dV / dK A operand's elements";
}

// The kernel masks the rows of a skipped vote group by a constant of the accumulator's column
// index (Tr::vote_group_of_col): every thread's column ni of the (key, row) view must lie in that
// vote group of the step. It also loads the LSE / D of columns (ni, ni + 1) as one 8-byte pair.
template <class Tr>
void check_vote_group_of_col() {
  typename Tr::TiledMmaSdP sdp;
  int bad = 0, groups_seen = 0;
  for (int t = 0; t < Tr::kNumMmaThreads; ++t) {
    Tensor tc = sdp.get_thread_slice(t).partition_C(make_identity_tensor(select<0, 1>(typename Tr::TileShapeSdP{})));
    Tensor rc = make_tensor(tc.data(), acc_rowcol(tc.layout()));
    int seen = 0;
    for (int mi = 0; mi < size<0>(rc); ++mi)
      for (int ni = 0; ni < size<1>(rc); ++ni) {
        const int row = int(get<1>(rc(mi, ni)));
        bad += row / Tr::kVoteRows != Tr::vote_group_of_col(ni);
        // load_row_pairs: the rows of columns (ni, ni + 1), ni even, adjacent, the first even
        if (ni % 2 == 0) bad += row % 2 != 0 || int(get<1>(rc(mi, ni + 1))) != row + 1;
        seen |= 1 << (row / Tr::kVoteRows);
      }
    groups_seen = std::max(groups_seen, __builtin_popcount(seen));
  }
  EXPECT_EQ(bad, 0) << "a column's vote group is not vote_group_of_col(ni), or a column pair not two adjacent rows";
  EXPECT_EQ(groups_seen, Tr::kGroupsPerStep) << "a thread's columns span the step's vote groups";
}

// How often each coordinate of `shape` occurs in the per-thread partitions `part(t)`.
template <class Part>
std::map<std::pair<int, int>, int> coverage(int threads, Part part) {
  std::map<std::pair<int, int>, int> n;
  for (int t = 0; t < threads; ++t) {
    auto c = part(t);
    for (int i = 0; i < size(c); ++i) ++n[{int(get<0>(c(i))), int(get<1>(c(i)))}];
  }
  return n;
}

void expect_each(const std::map<std::pair<int, int>, int>& n, int rows, int cols, int times, const char* what) {
  EXPECT_EQ(int(n.size()), rows * cols) << what << ": coordinates covered";
  int bad = 0;
  for (const auto& [rc, k] : n) bad += k != times || rc.first < 0 || rc.first >= rows || rc.second < 0 || rc.second >= cols;
  EXPECT_EQ(bad, 0) << what << ": each element " << times << " time(s)";
}

template <class Tr>
void check_coverage() {
  constexpr int M = Tr::kBlockM, N = Tr::kBlockN, D = Tr::kHeadDim;
  typename Tr::TiledMmaSdP sdp;
  typename Tr::TiledMmaDKV dkv;
  typename Tr::TiledMmaDQ dq;
  expect_each(coverage(Tr::kNumMmaThreads, [&](int t) {
                return sdp.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<N>, Int<M>>{}));
              }), N, M, 1, "S^T");
  expect_each(coverage(Tr::kNumMmaThreads, [&](int t) {
                return dkv.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<N>, Int<D>>{}));
              }), N, D, 1, "dK / dV");
  // dQ: the kernel slices with mma_tid (head-dim split at d = 128, row split at d = 64)
  auto dq_part = [&](int t) {
    return dq.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<M>, Int<D>>{}));
  };
  expect_each(coverage(Tr::kNumMmaThreads, dq_part), M, D, 1, "dQ");
  int bad_pairs = 0;
  for (int t = 0; t < Tr::kNumMmaThreads; ++t) {
    auto c = dq_part(t);
    for (int i = 0; i + 1 < size(c); i += 2)
      bad_pairs += !(get<0>(c(i)) == get<0>(c(i + 1)) && get<1>(c(i)) + 1 == get<1>(c(i + 1)) && get<1>(c(i)) % 2 == 0);
  }
  EXPECT_EQ(bad_pairs, 0) << "dQ accumulator pairs are not (row, even c), (row, c + 1)";
  // dS^T stores: every element of the dS tile once, through the transposed view
  // (partition_C of the swizzled view maps a thread's accumulator entries to the view's
  // coordinates; the view's layout maps those to element offsets)
  auto lst = typename Tr::SmemLayoutDSt{};
  std::map<long, int> hits;
  for (int t = 0; t < Tr::kNumMmaThreads; ++t) {
    Tensor p = sdp.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<N>, Int<M>>{}));
    for (int i = 0; i < size(p); ++i) ++hits[long(lst(get<0>(p(i)), get<1>(p(i)), 0))];
  }
  EXPECT_EQ(int(hits.size()), M * N) << "dS^T stores: elements covered";
  int bad_hits = 0;
  for (const auto& [off, k] : hits) bad_hits += k != 1 || off < 0 || off >= M * N;
  EXPECT_EQ(bad_hits, 0) << "dS^T stores: each element once";
}

template <class Tr>
void check_dq_operands() {
  // the operands of each warpgroup's dQ product over all N keys: A (dS: rows x keys) the
  // warpgroup's rows (all M at d = 128, [w M/2, (w + 1) M/2) at d = 64), B (K^T: d columns x keys)
  // its columns ([w d/2, (w + 1) d/2) at d = 128, all d at d = 64)
  constexpr int M = Tr::kBlockM, D = Tr::kHeadDim, N = Tr::kBlockN;
  typename Tr::TiledMmaDQ dq;
  for (int wg = 0; wg < Tr::kNumMmaWG; ++wg) {
    const int want_r0 = Tr::kDqSplitN ? 0 : wg * M / 2, want_r1 = Tr::kDqSplitN ? M - 1 : (wg + 1) * M / 2 - 1;
    const int want_c0 = Tr::kDqSplitN ? wg * D / 2 : 0, want_c1 = Tr::kDqSplitN ? (wg + 1) * D / 2 - 1 : D - 1;
    EXPECT_EQ(Tr::dq_row0(wg), want_r0);
    EXPECT_EQ(Tr::dq_col0(wg), want_c0);
    for (int t = wg * 128; t < (wg + 1) * 128; t += 32) {
      auto thr = dq.get_thread_slice(t);
      auto pa = thr.partition_A(make_identity_tensor(Shape<Int<M>, Int<N>>{}));
      auto pb = thr.partition_B(make_identity_tensor(Shape<Int<D>, Int<N>>{}));
      int lo = M, hi = -1, klo = N, khi = -1;
      for (int i = 0; i < size(pa); ++i) {
        lo = std::min(lo, int(get<0>(pa(i))));
        hi = std::max(hi, int(get<0>(pa(i))));
        klo = std::min(klo, int(get<1>(pa(i))));
        khi = std::max(khi, int(get<1>(pa(i))));
      }
      EXPECT_EQ(lo, want_r0) << "warpgroup " << wg << " thread " << t << ": dS rows";
      EXPECT_EQ(hi, want_r1) << "warpgroup " << wg << " thread " << t << ": dS rows";
      EXPECT_EQ(klo, 0) << "warpgroup " << wg << ": dS keys";
      EXPECT_EQ(khi, N - 1) << "warpgroup " << wg << ": dS keys";
      lo = D, hi = -1;
      for (int i = 0; i < size(pb); ++i) {
        lo = std::min(lo, int(get<0>(pb(i))));
        hi = std::max(hi, int(get<0>(pb(i))));
      }
      EXPECT_EQ(lo, want_c0) << "warpgroup " << wg << " thread " << t << ": K^T columns";
      EXPECT_EQ(hi, want_c1) << "warpgroup " << wg << " thread " << t << ": K^T columns";
    }
  }
}

// dS^T leaves the registers by stmatrix.trans (make_tiled_copy_C of the S^T product): the
// coordinates the copy takes each source value to be (partition_S) must be the coordinates the
// S^T accumulator really holds there (partition_C, retiled); the destinations cover the tile once.
template <class Tr>
void check_ds_stmatrix() {
  constexpr int M = Tr::kBlockM, N = Tr::kBlockN;
  typename Tr::TiledMmaSdP sdp;
  auto r2s = make_tiled_copy_C(typename Tr::SmemCopyAtomDS{}, sdp);
  Tensor id = make_identity_tensor(Shape<Int<N>, Int<M>>{});  // (key, row)
  int bad = 0;
  std::map<std::pair<int, int>, int> n;
  for (int t = 0; t < Tr::kNumMmaThreads; ++t) {
    auto thr = r2s.get_thread_slice(t);
    Tensor have = thr.retile_S(sdp.get_thread_slice(t).partition_C(id));
    Tensor want = thr.partition_S(id);
    ASSERT_EQ(int(size(have)), int(size(want))) << "thread " << t;
    for (int i = 0; i < size(want); ++i)
      bad += !(get<0>(have(i)) == get<0>(want(i)) && get<1>(have(i)) == get<1>(want(i)));
    Tensor dst = thr.partition_D(id);
    for (int i = 0; i < size(dst); ++i) ++n[{int(get<0>(dst(i))), int(get<1>(dst(i)))}];
  }
  EXPECT_EQ(bad, 0) << "stmatrix.trans takes an S^T register for another (key, row)";
  expect_each(n, N, M, 1, "dS^T stmatrix destinations");
  // the kernel's destination tensor (the swizzled (keys, rows, buffer) view, partition_D, then
  // one buffer): buffer b's element addresses are buffer 0's plus b whole tiles
  using E = typename Tr::Element;
  alignas(1024) static E ds[M * N * Tr::kDsStages];
  Tensor sdst = make_tensor(make_smem_ptr(ds), typename Tr::SmemLayoutDSt{});
  int bad_buf = 0;
  for (int t = 0; t < Tr::kNumMmaThreads; ++t) {
    Tensor d = r2s.get_thread_slice(t).partition_D(as_position_independent_swizzle_tensor(sdst));
    Tensor d0 = d(_, _, _, 0);
    for (int b = 1; b < Tr::kDsStages; ++b) {
      Tensor db = d(_, _, _, b);
      ASSERT_EQ(int(size(db)), int(size(d0)));
      for (int i = 0; i < size(d0); ++i) bad_buf += &db(i) - &d0(i) != long(b) * M * N;
    }
  }
  EXPECT_EQ(bad_buf, 0) << "a dS buffer's stmatrix destinations are not buffer 0's shifted by whole tiles";
}

// dQ through shared memory and the workspace: a warpgroup's accumulator value i of thread t goes
// to float (i / 4 * 128 + t % 128) * 4 + i % 4 of its 64 x 64 tile (the kernel's 16-byte stores),
// which must be where dq_in_tile (backward_params.hpp: the workspace's order, read back by the
// postprocess) puts that value's (row, column) relative to the warpgroup's first (dq_row0 / dq_col0);
// each tile element once. The accumulator's column pairs (c, c + 1), c even, must be adjacent
// floats (the mma.sync kernel's 8-byte atomics, the postprocess' and preprocess' 8-byte accesses).
template <class Tr>
void check_dq_tile_order() {
  constexpr int M = Tr::kBlockM, D = Tr::kHeadDim, R = Tr::kDqRows, C = Tr::kDqCols;
  typename Tr::TiledMmaDQ dq;
  for (int wg = 0; wg < Tr::kNumMmaWG; ++wg) {
    std::map<int, int> hits;
    int bad = 0;
    for (int t = wg * 128; t < (wg + 1) * 128; ++t) {
      auto c = dq.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<M>, Int<D>>{}));
      ASSERT_EQ(int(size(c)), R * C / 128);
      for (int i = 0; i < size(c); ++i) {
        const int r = int(get<0>(c(i))) - Tr::dq_row0(wg), col = int(get<1>(c(i))) - Tr::dq_col0(wg);
        if (r < 0 || r >= R || col < 0 || col >= C) {
          ++bad;
          continue;
        }
        const int stored = (i / 4 * 128 + t % 128) * 4 + i % 4;
        bad += dq_in_tile(r, col) != stored;
        ++hits[stored];
      }
    }
    EXPECT_EQ(bad, 0) << "warpgroup " << wg << ": a dQ value stored where dq_in_tile does not put its (row, column)";
    EXPECT_EQ(int(hits.size()), R * C) << "warpgroup " << wg << ": tile floats covered";
    int bad_hits = 0;
    for (const auto& [f, k] : hits) bad_hits += k != 1 || f < 0 || f >= R * C;
    EXPECT_EQ(bad_hits, 0) << "warpgroup " << wg << ": each tile float once";
  }
  // whole-workspace index: pairs adjacent; distinct (head, row, column) -> distinct floats inside
  // [0, hq * rows_ld * d) for a small padded layout
  const int hq = 3, rows_ld = 256;
  std::set<long> seen;
  int bad_pairs = 0;
  for (int h = 0; h < hq; ++h)
    for (int row = 0; row < rows_ld; ++row)
      for (int col = 0; col < D; ++col) {
        const long at = long(dq_accum_index(h, row, col, rows_ld, D));
        EXPECT_TRUE(at >= 0 && at < long(hq) * rows_ld * D);
        seen.insert(at);
        if (col % 2 == 0) bad_pairs += dq_accum_index(h, row, col + 1, rows_ld, D) != at + 1;
        // the postprocess reads an 8-column group's 4 pairs 4 floats apart
        if (col % 8 == 0)
          for (int q = 1; q < 4; ++q) bad_pairs += dq_accum_index(h, row, col + 2 * q, rows_ld, D) != at + 4 * q;
      }
  EXPECT_EQ(long(seen.size()), long(hq) * rows_ld * D) << "dq_accum_index is not one-to-one";
  EXPECT_EQ(bad_pairs, 0) << "column pairs not adjacent, or an 8-column group's pairs not 4 floats apart";
}

template <class Tr>
void check_slots() {
  auto lq = typename Tr::SmemLayoutQ{};
  auto lslot = typename Tr::SmemLayoutSlot{};
  int bad = 0;
  for (int s = 0; s < Tr::kStages; ++s)
    for (int r = 0; r < Tr::kGroupsPerStep; ++r)
      for (int row = 0; row < Tr::kVoteRows; ++row)
        for (int c = 0; c < Tr::kHeadDim; ++c)
          bad += int(lq(r * Tr::kVoteRows + row, c, s)) != Tr::slot_offset(s, r) + int(lslot(row, c));
  EXPECT_EQ(bad, 0) << "a slot's layout at slot_offset is not its rows of the stage's tile";
  EXPECT_EQ(Tr::kStageBytes, 2u * Tr::kBlockM * Tr::kHeadDim * 2u + 2u * Tr::kBlockM * 4u)
      << "the stage's transaction bytes are not its Q, dO, LSE and D";
}

template <class Tr>
void check_all() {
  check_slots<Tr>();
  check_views<Tr>();
  check_register_handoff<Tr>();
  check_vote_group_of_col<Tr>();
  check_coverage<Tr>();
  check_dq_operands<Tr>();
  check_ds_stmatrix<Tr>();
  check_dq_tile_order<Tr>();
}

TEST(WgmmaBackwardLayouts, Bf16D128) { check_all<BackwardWgmmaTraits<cutlass::bfloat16_t, 128>>(); }
TEST(WgmmaBackwardLayouts, Bf16D64) { check_all<BackwardWgmmaTraits<cutlass::bfloat16_t, 64>>(); }
TEST(WgmmaBackwardLayouts, F16D128) { check_all<BackwardWgmmaTraits<cutlass::half_t, 128>>(); }
TEST(WgmmaBackwardLayouts, F16D64) { check_all<BackwardWgmmaTraits<cutlass::half_t, 64>>(); }

// The step list of random CTAs: skip sets of several densities, GQA groups, causal starts, odd
// lengths, CTAs with every group skipped, CTAs of one query head (parts of a split block). The expected kept pairs come from the SPEC §9 bit index
// (((b hq + h) skip_groups + g) skip_tiles + t), the shared-memory words are built here from
// them (bit hh nm + g - m_begin), and both walks (words, global skip set) must give the same list.
template <int G>
void check_step_list(int ctas, std::uint32_t seed) {
  std::mt19937 rng(seed);
  int bad_cover = 0, bad_order = 0, bad_dead = 0, bad_count = 0, partial_steps = 0, empty_ctas = 0, parts = 0;
  for (int c = 0; c < ctas; ++c) {
    BackwardParams p;
    p.batch = 1 + int(rng() % 3);
    p.hk = 1 + int(rng() % 3);
    p.group = 1 << (rng() % 4);
    p.hq = p.hk * p.group;
    const int len_q = 1 + int(rng() % 3000);
    p.skip_groups = vote_groups(len_q) + int(rng() % 3);  // the set may be wider than the sequence
    p.skip_tiles = 1 + int(rng() % 20);
    const double keep = std::array<double, 5>{0.0, 0.05, 0.3, 0.7, 1.0}[rng() % 5];
    const std::int64_t nbits = std::int64_t(p.batch) * p.hq * p.skip_groups * p.skip_tiles;
    std::vector<std::uint8_t> bits((nbits + 7) / 8, 0);
    std::bernoulli_distribution kept_bit(keep);
    for (std::int64_t i = 0; i < nbits; ++i)
      if (!kept_bit(rng)) bits[i >> 3] |= std::uint8_t(1u << (i & 7));
    p.skip_bits = bits.data();
    BackwardWork w;
    w.b = int(rng() % p.batch);
    w.kh = int(rng() % p.hk);
    w.n_block = int(rng() % p.skip_tiles);
    w.len_q = len_q;
    w.m_end = vote_groups(len_q);
    w.m_begin = int(rng() % w.m_end);
    const int nm = w.m_end - w.m_begin;
    // Every query head of the group, or (a third of the CTAs) one: a part of a split block.
    w.part = rng() % 3 == 0 ? int(rng() % p.group) : -1;
    w.hh_begin = w.part >= 0 ? w.part : 0;
    w.hh_end = w.part >= 0 ? w.part + 1 : p.group;
    parts += w.part >= 0;

    std::vector<std::pair<int, int>> want;  // (hh, g) kept, in the flat order
    std::vector<std::uint32_t> words(((w.hh_end - w.hh_begin) * nm + 31) / 32, 0u);
    for (int hh = w.hh_begin; hh < w.hh_end; ++hh)
      for (int g = w.m_begin; g < w.m_end; ++g) {
        const std::int64_t i =
            ((std::int64_t(w.b) * p.hq + w.kh * p.group + hh) * p.skip_groups + g) * p.skip_tiles + w.n_block;
        if ((bits[i >> 3] >> (i & 7)) & 1u) continue;
        want.emplace_back(hh, g);
        const int x = (hh - w.hh_begin) * nm + g - w.m_begin;
        words[x >> 5] |= 1u << (x & 31);
      }
    empty_ctas += want.empty();
    for (const std::uint32_t* wd : {static_cast<const std::uint32_t*>(words.data()),
                                    static_cast<const std::uint32_t*>(nullptr)}) {
      std::vector<std::pair<int, int>> got;
      int x = 0, steps = 0;
      BackwardStep<G> st;
      bool ended_partial = false;
      while (BackwardScheduler::next_step<G>(p, w, wd, x, st)) {
        ++steps;
        bad_dead += ended_partial;  // a step after a partial one
        int live_slots = 0;
        for (int r = 0; r < G; ++r) {
          if ((st.live >> r) & 1u) {
            bad_dead += live_slots != r;  // live slots first
            ++live_slots;
            got.emplace_back(st.hh[r], st.g[r]);
          } else {
            bad_dead += r == 0 || st.hh[r] != st.hh[r - 1] || st.g[r] != st.g[r - 1];
          }
        }
        bad_dead += (st.live >> G) != 0u;
        if (live_slots < G) {
          ended_partial = true;
          ++partial_steps;
        }
        if (steps > p.group * nm + 1) break;  // a walk that does not end
      }
      bad_cover += got.size() != want.size() ? 1 : 0;
      bad_order += got != want;
      bad_count += steps != (int(want.size()) + G - 1) / G;
    }
  }
  EXPECT_EQ(bad_cover, 0) << "a kept (query head, vote group) pair missed, or a skipped one visited";
  EXPECT_EQ(bad_order, 0) << "the live slots are not the kept pairs in the flat order, once each";
  EXPECT_EQ(bad_dead, 0) << "a slot that is not live does not repeat the live one before it, or is not at the end";
  EXPECT_EQ(bad_count, 0) << "the step count is not ceil(kept / G)";
  EXPECT_GT(empty_ctas, 0) << "no CTA with every group skipped was drawn";
  EXPECT_GT(parts, 0) << "no CTA of one query head (a part of a split block) was drawn";
  if (G > 1) EXPECT_GT(partial_steps, 0) << "no list ended in a partial step";
}

TEST(WgmmaBackwardSteps, OneGroupPerStep) { check_step_list<1>(10000, 11u); }
TEST(WgmmaBackwardSteps, TwoGroupsPerStep) { check_step_list<2>(10000, 12u); }

}  // namespace
}  // namespace blasst::sm90::backward
