// Internal: the skip set (SPEC §9) as 32-bit words (AttentionProblem::skip_set,
// AttentionBackwardProblem::skip_set) and its conversions to and from the host SkipSet.
#pragma once

#include <cstdint>

#include "blasst/blasst.hpp"
#include "core/problem.hpp"

namespace blasst::detail {

// The shape of a resolved problem's skip set under a vote granularity (SkipSetShape's rule).
SkipSetShape skip_set_shape_of(const ResolvedAttention& r, const VoteGranularity& vote);

// Throws Error naming `name` unless `words` can hold the shape's words (and is not negative).
void check_skip_set_words(std::int64_t words, const SkipSetShape& shape, const char* name);

// Host memory: every word of the shape written from the set (the set's dimensions must match).
void pack_skip_set_words(const SkipSet& set, std::uint32_t* words);
SkipSet unpack_skip_set_words(const std::uint32_t* words, const SkipSetShape& shape);

}  // namespace blasst::detail
