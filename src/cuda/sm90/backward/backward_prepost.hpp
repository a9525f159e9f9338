// Internal: the backward's preprocess and postprocess kernels (backward_prepost.cu), around the
// main kernel of kernel_table.inc.
#pragma once

#include <cuda_runtime.h>

#include "blasst/blasst.hpp"
#include "cuda/sm90/backward/backward_params.hpp"

namespace blasst::sm90::backward {

// D = rowsum(dO * O) - dLSE and LSE * log2(e) (+inf where LSE = -inf) into p.dsum / p.lse_log2,
// one warp per (query token, query head); with p.dout_conv, also dO rounded to q's dtype there.
// Zeroes p.dq_accum (the main kernels add into it). Head dim 64 or 128.
// dtype: q's (bf16 or f16).
void launch_preprocess(const BackwardParams& p, DType dtype, cudaStream_t stream);
// dq = scale * dq_accum, converted to dq's dtype (q's or f32), one thread per 8 elements.
void launch_postprocess(const BackwardParams& p, DType dtype, cudaStream_t stream);

}  // namespace blasst::sm90::backward
