#include "core/kernel_geometry.hpp"

namespace blasst::detail {

VoteGranularity prefill_vote_granularity(VisitOrder order) {
  VoteGranularity g;
  g.tile_keys = kKernelTileKeys;
  g.rows = kPrefillVoteRows;
  g.heads = 1;
  g.split_tiles = 0;
  g.order = order;
  return g;
}

VoteGranularity decode_vote_granularity(std::int64_t group, std::int64_t q_len, std::int64_t split_tiles,
                                        VisitOrder order) {
  VoteGranularity g;
  g.tile_keys = kKernelTileKeys;
  g.rows = static_cast<int>(q_len);  // every query token of a step votes together
  g.heads = static_cast<int>(group);
  g.split_tiles = split_tiles;
  g.order = order;
  return g;
}

std::string prefill_counted_at(VisitOrder order) {
  return std::to_string(kPrefillVoteRows) + " query rows x 1 head (one consumer warpgroup) x " +
         std::to_string(kKernelTileKeys) + "-key tiles, " +
         (order == VisitOrder::max_first ? "max-first order" : "natural order");
}

std::string decode_counted_at(std::int64_t group, std::int64_t q_len, std::int64_t split_tiles, VisitOrder order) {
  return std::to_string(q_len) + " rows x " + std::to_string(group) + " heads (every query row of a KV group) x " +
         std::to_string(kKernelTileKeys) + " keys, split_tiles " + std::to_string(split_tiles) +
         (order == VisitOrder::max_first ? ", seeded splits (max-first)" : ", natural order");
}

}  // namespace blasst::detail
