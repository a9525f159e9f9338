// Internal: the host entry of the decode kernels with the choices the public path makes itself,
// for tests and the benchmark (the library reads no environment).
#pragma once

#include <cstddef>

#include "blasst/blasst.hpp"

namespace blasst::sm90::decode {

// K/V loads: tensor-map boxes through the copy engine where the cache layout allows (automatic,
// the library's choice), or 16-byte cp.async per thread (the fallback for layouts a tensor map
// cannot describe; forced here so that tests and the benchmark exercise it). Both write the same
// swizzled tile image.
enum class LoadPath { automatic, cp_async };

// detail::cuda_decode with the load path given.
void run(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt, SkipStats* stats, LoadPath loads);
// RunOptions::workspace bytes of that call (statistics counters included when `stats`).
std::size_t workspace_bytes(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt, bool stats);
// Where the merge's split flags lie in a caller's workspace of a call on device tensors (bytes from
// its start, and their size; size 0 with one split, which needs none): after every call they are all lowered (0),
// which tests read back (decode_merge.cuh).
struct FlagsRegion {
  std::size_t offset = 0, bytes = 0;
};
FlagsRegion split_flags_region(const DecodeProblem& p, const SkipConfig& skip);

}  // namespace blasst::sm90::decode
