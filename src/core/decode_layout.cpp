// The split-KV heuristic of the CUDA decode path (declared in decode_layout.hpp).
#include "core/decode_layout.hpp"

#include <algorithm>

namespace blasst::detail {

std::int64_t decode_split_tiles(std::int64_t batch, std::int64_t hk, std::int64_t max_tiles, int sms,
                                int ctas_per_sm) {
  if (max_tiles <= 1) return 1;
  const std::int64_t slots = static_cast<std::int64_t>(sms) * std::max(ctas_per_sm, 1);
  const std::int64_t base = batch * hk;
  // Model: time ~ waves * (tiles per split + 2), the 2 standing for the pipeline fill and the
  // partial write/merge of each split. Fewest splits wins ties (less merge traffic).
  std::int64_t best_st = max_tiles;
  double best_cost = 0.0;
  const std::int64_t max_splits = std::min<std::int64_t>(max_tiles, 4 * ((slots + base - 1) / base));
  for (std::int64_t s = 1; s <= max_splits; ++s) {
    const std::int64_t st = (max_tiles + s - 1) / s;
    const std::int64_t splits = (max_tiles + st - 1) / st;
    const std::int64_t waves = (base * splits + slots - 1) / slots;
    const double cost = static_cast<double>(waves) * static_cast<double>(st + 2);
    if (s == 1 || cost < best_cost - 1e-9) {
      best_cost = cost;
      best_st = st;
    }
  }
  return best_st;
}

}  // namespace blasst::detail
