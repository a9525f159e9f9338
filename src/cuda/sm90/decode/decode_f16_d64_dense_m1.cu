// One instantiation per file keeps CI compile units small and parallel.
#include "cuda/cuda_check.hpp"
#include "cuda/sm90/decode/decode_kernel.cuh"

namespace blasst::detail::decode {
BLASST_DECODE_INSTANTIATE(__half, 64, false, 1)
}  // namespace blasst::detail::decode
