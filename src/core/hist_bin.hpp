// Internal: the SPEC §5 delta histogram's bin rule, the one definition used by the host
// (DeltaHistogram::bin_of) and by every kernel (through SkipPolicy, src/cuda/sm90/common).
#pragma once

#include <cmath>
#include <type_traits>

#include "blasst/blasst.hpp"
#include "core/host_device.hpp"

namespace blasst::detail {

// Layout: underflow bin 0, regular bins 1..kHistBins of width 1/kHistInvWidth over
// [kHistLo, 0), top bin kHistBins + 1 for delta >= 0 and NaN (never skipped).
inline constexpr int kHistBins = 1024;
inline constexpr int kHistSlots = kHistBins + 2;  // entries per head in a histogram buffer
inline constexpr float kHistLo = -64.0f;
inline constexpr float kHistInvWidth = 16.0f;
static_assert(kHistBins == DeltaHistogram::kBins && kHistLo == DeltaHistogram::kLo &&
                  1.0 / kHistInvWidth == DeltaHistogram::kWidth,
              "the kernels' histogram layout is DeltaHistogram's");
static_assert(kHistInvWidth == 16.0f && kHistLo == -64.0f && -kHistLo * kHistInvWidth == kHistBins,
              "hist_bin relies on a power-of-two width and kLo = -kBins * width");

// Bin of a delta in natural-log units, in float (kernels) or double (host, decode statistics).
// floor(delta * 16) is exact in either precision (a power of two), and floor commutes with adding
// the integer kHistBins, so this is floor((delta - kLo) / width) without the rounding of
// delta - kLo. (Float: the prefill histogram warp's path; the double version of the old decode
// kernel cost 4 dependent FP64 operations.)
template <class Real>
BLASST_HOST_DEVICE int hist_bin(Real delta) {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>, "float or double deltas");
  if (!(delta < Real(0))) return kHistBins + 1;
  if (delta < Real(kHistLo)) return 0;
  Real f;
  if constexpr (std::is_same_v<Real, float>) f = floorf(delta * kHistInvWidth);
  else f = floor(delta * double(kHistInvWidth));
  const int i = int(f) + kHistBins;
  return 1 + (i < 0 ? 0 : (i > kHistBins - 1 ? kHistBins - 1 : i));
}

}  // namespace blasst::detail
