// Internal: what the backward CTA writes: dK / dV of its key block (scaled, converted to the
// output dtype), zeros for a key block the skip set removes entirely, and the dQ contributions of
// one step added into the f32 workspace (red.global.add.f32; the postprocess scales and converts).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sm90/backward/backward_tile_scheduler.hpp"
#include "cuda/sm90/backward/backward_traits.hpp"

namespace blasst::sm90::backward {

template <class Element>
__device__ __forceinline__ void store_out(void* base, std::int64_t off, bool f32, float x) {
  if (f32) static_cast<float*>(base)[off] = x;
  else static_cast<Element*>(base)[off] = Element(x);
}

// Elements off and off + 1 (off even), as one store where `paired` (rows_vectorizable(.., 2):
// the same answer in every thread), else one by one.
template <class Element>
__device__ __forceinline__ void store_pair(void* base, std::int64_t off, bool f32, bool paired, float x0, float x1) {
  if (!paired) {
    store_out<Element>(base, off, f32, x0);
    store_out<Element>(base, off + 1, f32, x1);
  } else if (f32) {
    *reinterpret_cast<float2*>(static_cast<float*>(base) + off) = make_float2(x0, x1);
  } else {
    union {
      Element e[2];
      std::uint32_t u;
    } pack;
    pack.e[0] = Element(x0);
    pack.e[1] = Element(x1);
    *reinterpret_cast<std::uint32_t*>(static_cast<Element*>(base) + off) = pack.u;
  }
}

// Element offset of key `key` of KV head kh in a dK / dV-shaped tensor.
__device__ __forceinline__ std::int64_t key_offset(const RowStrides& s, const BackwardWork& w, int key) {
  const std::int64_t row = std::int64_t(w.k_start) + key;
  return row * s.row + std::int64_t(w.kh) * s.head + std::int64_t(w.b) * s.batch;
}

// A part of a split block (w.part >= 0): its f32 dK / dV slot in BackwardParams::dkv_part,
// element (key of the block, col); launch_split_sum adds the parts into dk / dv.
__device__ __forceinline__ float* dkv_part_at(const BackwardParams& p, const BackwardWork& w, int which, int key,
                                              int col) {
  return p.dkv_part + dkv_part_index(w.b, p.split_cap, w.split, p.group, w.part, which, key, col, p.head_dim);
}

// dK = scale * acc_dk, dV = acc_dv for the valid keys of the block (C fragments of TiledMmaDKV);
// a part of a split block writes them, in f32, to its slot instead.
template <class Traits, class AccDK, class AccDV>
__device__ void write_dkdv(const BackwardParams& p, const BackwardWork& w, int tid, AccDK const& acc_dk,
                           AccDV const& acc_dv) {
  using Element = typename Traits::Element;
  typename Traits::TiledMmaDKV mma;
  auto thr = mma.get_slice(tid);
  Tensor c = make_identity_tensor(Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{});
  Tensor tc = thr.partition_C(c);
  static_assert(decltype(size(tc))::value == decltype(size(acc_dk))::value, "dK fragment and coordinates");
  static_assert(decltype(size(tc))::value == decltype(size(acc_dv))::value, "dV fragment and coordinates");
  const int n0 = w.n_block * Traits::kBlockN;
#pragma unroll
  for (int i = 0; i < size(acc_dk); ++i) {
    const int key = n0 + get<0>(tc(i));
    const int col = get<1>(tc(i));
    if (key >= w.len_k) continue;
    if (w.part >= 0) {
      *dkv_part_at(p, w, 0, key - n0, col) = acc_dk(i) * p.scale;
      *dkv_part_at(p, w, 1, key - n0, col) = acc_dv(i);
    } else {
      store_out<Element>(p.dk, key_offset(p.dk_s, w, key) + col, p.dk_f32, acc_dk(i) * p.scale);
      store_out<Element>(p.dv, key_offset(p.dv_s, w, key) + col, p.dv_f32, acc_dv(i));
    }
  }
}

// A key block with every step skipped: dK = dV = 0 (a part of a split block: its slot), K and V
// never loaded.
template <class Traits>
__device__ void write_dkdv_zero(const BackwardParams& p, const BackwardWork& w, int tid) {
  using Element = typename Traits::Element;
  const int n0 = w.n_block * Traits::kBlockN;
  const int keys = min(Traits::kBlockN, w.len_k - n0);
  for (int e = tid; e < keys * Traits::kHeadDim; e += Traits::kNumThreads) {
    const int key = n0 + e / Traits::kHeadDim, col = e % Traits::kHeadDim;
    if (w.part >= 0) {
      *dkv_part_at(p, w, 0, key - n0, col) = 0.f;
      *dkv_part_at(p, w, 1, key - n0, col) = 0.f;
    } else {
      store_out<Element>(p.dk, key_offset(p.dk_s, w, key) + col, p.dk_f32, 0.f);
      store_out<Element>(p.dv, key_offset(p.dv_s, w, key) + col, p.dv_f32, 0.f);
    }
  }
}

// dQ accumulator (dq_accum_index) += acc_dq for the valid rows of query block m0 of head h.
// The C fragment holds column pairs (c, c + 1) of one row at consecutive indices, adjacent in the
// accumulator too: those go as one 8-byte vector atomic (sm_90 atom.global.add.v2.f32, result
// unused), anything else element by element (the check is per pair; the compiler folds it where
// the layout makes it constant: at d = 128 every pair takes the vector path).
template <class Traits, class AccDQ>
__device__ void add_dq(const BackwardParams& p, const BackwardWork& w, int h, int m0, int tid, AccDQ const& acc_dq) {
  typename Traits::TiledMmaDQ mma;
  auto thr = mma.get_slice(tid);
  Tensor c = make_identity_tensor(Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{});
  Tensor tc = thr.partition_C(c);
  static_assert(decltype(size(tc))::value == decltype(size(acc_dq))::value, "dQ fragment and coordinates");
  static_assert(decltype(size(acc_dq))::value % 2 == 0, "whole pairs");
  auto offset = [&](int row, int col) {
    return dq_accum_index(h, std::int64_t(w.row_start) + row, col, p.rows_ld, Traits::kHeadDim);
  };
#pragma unroll
  for (int i = 0; i < size(acc_dq); i += 2) {
    const int r0 = get<0>(tc(i)), c0 = get<1>(tc(i));
    const int r1 = get<0>(tc(i + 1)), c1 = get<1>(tc(i + 1));
    const int row0 = m0 + r0, row1 = m0 + r1;
    if (r1 == r0 && c1 == c0 + 1 && (c0 & 1) == 0) {
      if (row0 < w.len_q)  // 8-byte aligned: the workspace is 256-byte aligned, c0 and d even
        atomicAdd(reinterpret_cast<float2*>(p.dq_accum + offset(row0, c0)), make_float2(acc_dq(i), acc_dq(i + 1)));
    } else {
      if (row0 < w.len_q) atomicAdd(p.dq_accum + offset(row0, c0), acc_dq(i));
      if (row1 < w.len_q) atomicAdd(p.dq_accum + offset(row1, c1), acc_dq(i + 1));
    }
  }
}

}  // namespace blasst::sm90::backward
