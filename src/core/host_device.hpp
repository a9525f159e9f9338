// Internal: BLASST_HOST_DEVICE marks a small function that host code and kernels both call (the
// host's tests check what the kernels compute); plain inline outside nvcc.
#pragma once

#if defined(__CUDACC__)
#define BLASST_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define BLASST_HOST_DEVICE inline
#endif
