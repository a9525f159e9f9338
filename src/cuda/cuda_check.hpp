// Internal CUDA helpers shared by the kernels' host code: checked calls, a device buffer, the
// once-per-device kernel attribute and the device's SM count.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "blasst/blasst.hpp"

namespace blasst::detail {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw Error(std::string("CUDA error in ") + what + " (" + file + ":" + std::to_string(line) +
              "): " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

#define BLASST_CUDA_CHECK(expr)                                                      \
  do {                                                                               \
    cudaError_t blasst_err_ = (expr);                                                \
    if (blasst_err_ != cudaSuccess) ::blasst::detail::throw_cuda(blasst_err_, #expr, \
                                                                 __FILE__, __LINE__); \
  } while (0)

// Owning device allocation (cudaMalloc); moves, never copies.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes) BLASST_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)),
                                            bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) { reset(); ptr_ = std::exchange(o.ptr_, nullptr); bytes_ = std::exchange(o.bytes_, 0); }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
  void reset() { if (ptr_) cudaFree(ptr_); ptr_ = nullptr; bytes_ = 0; }
  void* get() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) once per device and kernel
// (it is a property of the kernel in the device's context; asking again on every launch costs host
// time). Kernel: the __global__ function itself, e.g. set_max_dynamic_smem<&my_kernel<T>>(bytes).
// max_carveout: also prefer the largest shared-memory carveout (kernels that need it to fit two
// CTAs per SM).
template <auto Kernel>
void set_max_dynamic_smem(int bytes, bool max_carveout = false) {
  static std::atomic<std::uint64_t> done{0};  // bit d: set on device d (devices 0..63)
  int dev = 0;
  BLASST_CUDA_CHECK(cudaGetDevice(&dev));
  const std::uint64_t bit = dev < 64 ? std::uint64_t{1} << dev : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return;
  if (max_carveout)
    BLASST_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           cudaSharedmemCarveoutMaxShared));
  BLASST_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(bit, std::memory_order_release);
}

// The SM count of device dev, cached per device (the attribute query is not free on the host).
inline int multiprocessor_count(int dev) {
  static std::mutex mu;
  static std::vector<int> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() <= static_cast<std::size_t>(dev)) cache.resize(dev + 1, 0);
  if (cache[dev] == 0) BLASST_CUDA_CHECK(cudaDeviceGetAttribute(&cache[dev], cudaDevAttrMultiProcessorCount, dev));
  return cache[dev];
}

}  // namespace blasst::detail
