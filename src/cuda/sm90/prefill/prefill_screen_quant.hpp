// Internal: the SPEC §2b FP8 screen's quantisation pre-kernel (prefill_screen_quant.cu) and the
// layout of what it writes into the call's workspace (read by the skip_screen instances through
// ScreenArgs, prefill_params.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "blasst/blasst.hpp"
#include "cuda/sm90/prefill/prefill_params.hpp"

namespace blasst::sm90::prefill {

// Where each part of the screen's workspace lies (byte offsets, 256-aligned), for the tensors of
// a PrefillParams: nb = batch (batched) or 1 (ragged, tokens flattened into rows_q / rows_k).
// ahead (SPEC §2b screen ahead): also the plan (AheadPlan: one list of `tiles` entries and one
// count per CTA of the pass's grid, ctas of them).
struct ScreenLayout {
  std::int64_t nb = 0, rows_q = 0, rows_k = 0, hq = 0, hk = 0, d = 0, batch = 0, tiles = 0, ctas = 0;
  std::size_t q8 = 0, k8 = 0, q_rows = 0, k_tiles = 0, plan_list = 0, plan_count = 0, bytes = 0;
};
// tiles: key tiles of the longest sequence.
ScreenLayout screen_layout(const PrefillParams& p, int d, std::int64_t tiles, bool ahead = false);

// Quantises Q (per query row) and K (per key tile: one scale, the norm maxima) of p into ws (at least
// L.bytes, 256-byte aligned) on `stream` and points args' buffers at it (SPEC §2b: e4m3 codes as
// cvt.rn.satfinite, scales fp32(max|x| / 16), codes within +-16, norms in double rounded upwards to float).
void screen_quantise(const PrefillParams& p, DType dtype, const ScreenLayout& L, void* ws, cudaStream_t stream,
                     ScreenArgs& args);

}  // namespace blasst::sm90::prefill
