// Internal: the work of one decode CTA. The grid is (Hk, splits, B): CTA (h, split, b) takes KV
// head h of sequence b and the split's tiles [t_begin, t_begin + n) of that sequence's key tiles
// (p.split_tiles per split, the last one shorter; splits past the sequence's end get n = 0 and
// write an empty partial). Neighbouring CTAs read neighbouring head rows of the same keys (the
// H200 runs of f05b4c2 / 6ff5dca measured splits-fastest within run-to-run noise of this).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90/decode/decode_params.hpp"

namespace blasst::sm90::decode {

struct DecodeWork {
  int h, split, b;              // KV head, split, sequence
  std::int64_t Lk;              // keys of sequence b
  std::int64_t ntiles;          // key tiles of sequence b
  std::int64_t t_begin;         // the split's first tile
  int n;                        // the split's tiles (0: past the sequence's end)
  std::int64_t part_row0;       // the CTA's first row of o_part / lse_part

  // The seed tiles of a seeded split (SPEC §2a): the sink tile 0 and the sequence's last tile.
  __device__ __forceinline__ std::int64_t seed_tile(int j) const { return j == 0 ? 0 : ntiles - 1; }
};

// CTA (h, split, b) = (blockIdx.x, blockIdx.y, blockIdx.z).
template <int kTileKeys>
__device__ __forceinline__ DecodeWork decode_work(const Params& p, int h, int split, int b) {
  DecodeWork w;
  w.h = h;
  w.split = split;
  w.b = b;
  w.Lk = p.seqlens ? static_cast<std::int64_t>(p.seqlens[w.b]) : p.lmax;
  w.ntiles = (w.Lk + kTileKeys - 1) / kTileKeys;
  w.t_begin = static_cast<std::int64_t>(w.split) * p.split_tiles;
  const std::int64_t t_end = w.t_begin + p.split_tiles < w.ntiles ? w.t_begin + p.split_tiles : w.ntiles;
  w.n = w.t_begin < t_end ? static_cast<int>(t_end - w.t_begin) : 0;
  w.part_row0 = ((static_cast<std::int64_t>(w.b) * p.hk + w.h) * p.num_splits + w.split) * p.rows;
  return w;
}

}  // namespace blasst::sm90::decode
