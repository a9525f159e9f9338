// The skip set's 32-bit word form (src/core/skip_set.hpp).
#include "core/skip_set.hpp"

#include <cstring>
#include <string>

namespace blasst::detail {

SkipSetShape skip_set_shape_of(const ResolvedAttention& r, const VoteGranularity& vote) {
  SkipSetShape s;
  s.vote = vote;
  s.batch = r.batch;
  s.heads = r.hq;
  s.groups = (r.max_q_len + vote.rows - 1) / vote.rows;
  s.tiles = (r.max_k_len + vote.tile_keys - 1) / vote.tile_keys;
  return s;
}

void check_skip_set_words(std::int64_t words, const SkipSetShape& shape, const char* name) {
  if (words < shape.words())
    throw Error(std::string(name) + ": " + std::to_string(words) + " words cannot hold the skip set [batch " +
                std::to_string(shape.batch) + ", heads " + std::to_string(shape.heads) + ", vote groups " +
                std::to_string(shape.groups) + ", tiles " + std::to_string(shape.tiles) + "]: it needs " +
                std::to_string(shape.words()) + " (skip_set_shape(...).words())");
}

void pack_skip_set_words(const SkipSet& set, std::uint32_t* words) {
  const std::int64_t pairs = set.batch * set.heads * set.groups * set.tiles;
  const std::size_t n = static_cast<std::size_t>((pairs + 31) / 32);
  std::memset(words, 0, n * sizeof(std::uint32_t));
  for (std::size_t i = 0; i < set.bits.size(); ++i)
    words[i / 4] |= static_cast<std::uint32_t>(set.bits[i]) << (8 * (i % 4));
}

SkipSet unpack_skip_set_words(const std::uint32_t* words, const SkipSetShape& shape) {
  SkipSet set;
  set.resize(shape.vote, shape.batch, shape.heads, shape.groups, shape.tiles);
  for (std::size_t i = 0; i < set.bits.size(); ++i)
    set.bits[i] = static_cast<std::uint8_t>(words[i / 4] >> (8 * (i % 4)));
  // Bits past the last pair are not part of the set.
  const std::int64_t pairs = shape.pairs();
  if (pairs % 8 != 0 && !set.bits.empty())
    set.bits.back() = static_cast<std::uint8_t>(set.bits.back() & ((1u << (pairs % 8)) - 1u));
  return set;
}

}  // namespace blasst::detail
