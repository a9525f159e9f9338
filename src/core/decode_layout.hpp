// Internal: the split-KV heuristic of the CUDA decode path. Plain host code, built without CUDA
// too, so that CPU tools (bench/order) reproduce the kernel's layout from the same function.
#pragma once

#include <cstdint>

namespace blasst::detail {

// Key tiles per split for `batch` sequences x `hk` KV heads whose longest sequence has max_tiles
// 128-key tiles, on a GPU with `sms` multiprocessors running ctas_per_sm CTAs each. Minimises
// waves * (tiles per split + 2): enough splits to fill the GPU at batch 1 with long contexts,
// none when batch * hk CTAs already fill it.
std::int64_t decode_split_tiles(std::int64_t batch, std::int64_t hk, std::int64_t max_tiles, int sms,
                                int ctas_per_sm);

}  // namespace blasst::detail
