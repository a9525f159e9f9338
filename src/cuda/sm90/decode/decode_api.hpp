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

// The instance family (kernel_table.inc's warps column): the library's rule (automatic: the
// 4-warp instance, two CTAs per SM, where the table has one and the call has work for at least
// kFourWarpMinTilesPerCta tiles in each of 2 x SMs CTAs; see plan() in decode_api.cu), or one
// forced, so that tests and the benchmark run both on the same inputs. four: the 4-warp instance
// where the table has one (d = 128, g * q_len <= 16), else the 8-warp one.
enum class Warps { automatic, eight, four };
inline constexpr int kFourWarpMinTilesPerCta = 16;

// detail::cuda_decode with the load path (and instance family) given.
void run(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt, SkipStats* stats, LoadPath loads,
         Warps warps = Warps::automatic);
// Whether that call, with LoadPath::automatic, loads K and V through tensor maps (false: its
// cache layout falls back to cp.async; a slower path that gives the same results, so only this
// says which one ran): for tests.
bool tensor_map_loads(const DecodeProblem& p, const SkipConfig& skip, Warps warps = Warps::automatic);
// The warps per CTA of the instance that call would run (8 or 4): for tests and the benchmark.
int planned_warps(const DecodeProblem& p, const SkipConfig& skip, Warps warps = Warps::automatic);
// RunOptions::workspace bytes of that call (statistics counters included when `stats`).
std::size_t workspace_bytes(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt, bool stats,
                            Warps warps = Warps::automatic);
// Where the merge's split flags lie in a caller's workspace of a call on device tensors (bytes from
// its start, and their size; size 0 with one split, which needs none): after every call they are all lowered (0),
// which tests read back (decode_merge.cuh).
struct FlagsRegion {
  std::size_t offset = 0, bytes = 0;
};
FlagsRegion split_flags_region(const DecodeProblem& p, const SkipConfig& skip, Warps warps = Warps::automatic);

}  // namespace blasst::sm90::decode
