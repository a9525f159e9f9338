// Device memory and event timing for the CLI's CUDA paths (demo timings on device-resident
// tensors, so that host<->device staging is not what gets measured). The memory and the error
// checks are the library's own (src/cuda/cuda_check.hpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cli/common.hpp"
#include "cuda/cuda_check.hpp"

namespace blasst::cli {

bool have_device_buffers() { return true; }

struct DeviceMirror::Memory {
  detail::DeviceBuffer buf;
};

DeviceMirror::DeviceMirror(HostBuffer& host)
    : host_(&host), mem_(std::make_unique<Memory>(Memory{detail::DeviceBuffer(host.bytes.size())})) {}
DeviceMirror::~DeviceMirror() = default;
DeviceMirror::DeviceMirror(DeviceMirror&&) noexcept = default;
DeviceMirror& DeviceMirror::operator=(DeviceMirror&&) noexcept = default;

Tensor DeviceMirror::tensor() const {
  Tensor t = host_->tensor(DeviceKind::cuda);
  t.data = mem_->buf.get();
  return t;
}
void DeviceMirror::upload() {
  BLASST_CUDA_CHECK(cudaMemcpy(mem_->buf.get(), host_->bytes.data(), host_->bytes.size(), cudaMemcpyHostToDevice));
}
void DeviceMirror::download() {
  BLASST_CUDA_CHECK(cudaMemcpy(host_->bytes.data(), mem_->buf.get(), host_->bytes.size(), cudaMemcpyDeviceToHost));
}

double time_device_ms(const std::function<void()>& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  BLASST_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  BLASST_CUDA_CHECK(cudaEventCreate(&a));
  BLASST_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    BLASST_CUDA_CHECK(cudaEventRecord(a, nullptr));
    fn();
    BLASST_CUDA_CHECK(cudaEventRecord(b, nullptr));
    BLASST_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    BLASST_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0.0 : ms[ms.size() / 2];
}

}  // namespace blasst::cli
