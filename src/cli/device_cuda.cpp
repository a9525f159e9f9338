// Device memory and event timing for the CLI's CUDA paths (demo timings on device-resident
// tensors, so that host<->device staging is not what gets measured).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cli/common.hpp"

namespace blasst::cli {

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

bool have_device_buffers() { return true; }

DeviceBuffer::DeviceBuffer(std::size_t bytes) : n_(bytes) {
  if (bytes) check(cudaMalloc(&p_, bytes), "cudaMalloc");
}
DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(p_, o.p_);
  std::swap(n_, o.n_);
  return *this;
}
void DeviceBuffer::upload(const void* host, std::size_t n) {
  if (n > n_) throw Error("internal: DeviceBuffer::upload overflow");
  check(cudaMemcpy(p_, host, n, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
void DeviceBuffer::download(void* host, std::size_t n) const {
  if (n > n_) throw Error("internal: DeviceBuffer::download overflow");
  check(cudaMemcpy(host, p_, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

double time_device_ms(const std::function<void()>& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a, nullptr), "cudaEventRecord");
    fn();
    check(cudaEventRecord(b, nullptr), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0.0 : ms[ms.size() / 2];
}

}  // namespace blasst::cli
