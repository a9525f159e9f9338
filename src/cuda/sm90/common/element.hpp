// Internal: blasst::DType, the one dtype encoding, mapped to the element types of the kernels.
// Only the types a kernel exists for are mapped: a new dtype (FP8, say) does not compile until it
// is added here and to the kernel table (src/cuda/sm90/kernel_table.inc), never as another type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cutlass/numeric_types.h>

#include "blasst/blasst.hpp"

namespace blasst::sm90 {

template <DType> struct Element;  // no definition: unsupported dtypes are compile errors
template <> struct Element<DType::bf16> {
  using cuda = __nv_bfloat16;        // CUDA intrinsics, mma.sync
  using cute = cutlass::bfloat16_t;  // CuTe / CUTLASS (layout-compatible with cuda)
};
template <> struct Element<DType::f16> {
  using cuda = __half;
  using cute = cutlass::half_t;
};

}  // namespace blasst::sm90
