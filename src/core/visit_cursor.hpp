// Internal: the key-tile visit order of a vote group (SPEC §2a) as a cursor that advances one step
// at a time. Header-only and host/device: the prefill kernel's producer and consumers walk it, and
// a CPU test checks it against the SPEC's definition for every (tile count, own tile).
#pragma once

#include "core/host_device.hpp"

namespace blasst::detail {

// Step 0 visits the sink tile 0, step 1 the own tile, then own-1, own+1, own-2, own+2, ... within
// [1, n_tiles); when one side runs out the other continues. own <= 1 gives the natural order
// 0, 1, 2, ... (own < 0 is how a kernel says "natural"). Caller: own < n_tiles.
// Why a cursor: recomputing the tile from the step index costs ~20 instructions and three
// branches per step in every consumer thread; advancing costs six branch-free integer ops.
struct VisitCursor {
  int tile = 0;            // the tile of the current step
  int lo = 0, hi = 1;      // next untaken tile on each side of own (lo < 1: left side exhausted)
  int n = 0;               // tiles in the order
  bool left_next = false;  // the left side's turn (own-1 comes before own+1)

  BLASST_HOST_DEVICE VisitCursor(int n_tiles, int own) : n(n_tiles) {
    // Step 1 takes hi = own; with own <= 1 the left side is empty from the start.
    hi = own > 1 ? own : 1;
    lo = hi - 1;
  }

  BLASST_HOST_DEVICE void advance() {
    const bool left = lo >= 1 && (left_next || hi >= n);
    tile = left ? lo : hi;
    lo -= left ? 1 : 0;
    hi += left ? 0 : 1;
    left_next = !left;
  }
};

}  // namespace blasst::detail
