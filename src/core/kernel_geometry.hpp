// Internal: what the sm_90a kernels vote over (SPEC §2) and how they visit tiles, stated once for
// the kernels (which static_assert their tile shapes against it), their host code (the
// granularity SkipStats reports) and calibration (the granularity a curve is counted at). Plain
// host code, in every build: CPU-only tools calibrate for the kernels' layout too.
#pragma once

#include <cstdint>
#include <string>

#include "blasst/blasst.hpp"

namespace blasst::detail {

inline constexpr int kKernelTileKeys = 128;    // SPEC §2 tile, every kernel
inline constexpr int kPrefillVoteRows = 64;    // prefill: one consumer warpgroup x 1 head
inline constexpr int kDecodeMaxRows = 64;      // decode: g * q_len rows of a KV group per CTA

// Prefill kernels: 64 query rows of one head per vote group, 128-key tiles, unsplit.
VoteGranularity prefill_vote_granularity(VisitOrder order);
// Decode kernels: every query row of a KV group (q_len tokens x g heads); split_tiles as laid
// out (0 = unsplit); max-first means seeded splits (SPEC §2a).
VoteGranularity decode_vote_granularity(std::int64_t group, std::int64_t q_len, std::int64_t split_tiles,
                                        VisitOrder order);
// SkipStats::counted_at of each kernel.
std::string prefill_counted_at(VisitOrder order);
std::string decode_counted_at(std::int64_t group, std::int64_t q_len, std::int64_t split_tiles, VisitOrder order);

}  // namespace blasst::detail
