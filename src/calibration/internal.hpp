// Internal helpers shared by the calibration sources.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "blasst/calibration.hpp"

namespace blasst::calibration::detail {

// The samples of (component, phase) pooled per length; layer "" pools every layer, otherwise
// only that layer's samples.
std::map<std::int64_t, SparsityCurve> pooled_by_length(const std::vector<CurveSample>& samples,
                                                       const std::string& component,
                                                       const std::string& layer, Phase phase);

}  // namespace blasst::calibration::detail
