// Device discovery and the device-to-host hook used by problem validation.
#include <cuda_runtime.h>

#include "core/problem.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_dispatch.hpp"

namespace blasst::detail {

namespace {
void cuda_copy_to_host(void* dst, const void* src, std::size_t n) {
  BLASST_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
}
// Installed at load time so that validate_* can read device-resident offsets and page tables.
const bool installed = [] { copy_to_host = &cuda_copy_to_host; return true; }();
}  // namespace

bool cuda_built() { return installed; }

bool cuda_device_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) { cudaGetLastError(); return false; }
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  return major == 9;  // the kernels are sm_90a only
}

std::string cuda_device_name_impl() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return {};
  return prop.name;
}

}  // namespace blasst::detail
