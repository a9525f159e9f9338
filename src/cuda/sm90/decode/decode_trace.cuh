// Internal: a per-CTA timeline of the decode kernel for diagnosis, compiled in only with the
// CMake option BLASST_DECODE_TRACE (bench/decode/trace_decode.py): thread 0 of each CTA records
// the global timer (ns, 32 ns steps on the H200) at a few points of the kernel into
// Params::trace [CTAs][kTracePoints]. In every other build trace_point is empty.
#pragma once

#include <cstddef>

#include "cuda/sm90/decode/decode_params.hpp"

namespace blasst::sm90::decode {

// start, first loads issued, Q staged, prologue done, first vote, last P.V issued, partials written
inline constexpr int kTracePoints = 7;

__device__ __forceinline__ void trace_point([[maybe_unused]] const Params& p, [[maybe_unused]] int point) {
#ifdef BLASST_DECODE_TRACE
  if (p.trace == nullptr || threadIdx.x != 0) return;
  unsigned long long g;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
  const std::size_t cta = (static_cast<std::size_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  p.trace[cta * kTracePoints + point] = g;
#endif
}

}  // namespace blasst::sm90::decode
