// Internal: the SPEC §2b screen ahead (prefill_screen_ahead.cu): one kernel that decides every
// (vote group, key tile) pair of a prefill call from the FP8 copies alone, before the pass, and
// writes each CTA's plan (AheadPlan, prefill_params.hpp) for the skip_ahead instances.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm90/prefill/prefill_params.hpp"

namespace blasst::sm90::prefill {

// p.screen: the quantised copies and the margin's constants (screen_quantise, prefill_api.cu);
// p.screen.screened (per query head, or null): += the pairs the plan skips. d: 64 or 128.
// plan: count[c] and list[c * stride ...] for every CTA c of HeavyFirstScheduler's grid of p (a
// CTA past its sequence's end writes nothing; the pass does not read it either).
void screen_ahead(const PrefillScreenParams& p, int d, const AheadPlan& plan, cudaStream_t stream);

}  // namespace blasst::sm90::prefill
