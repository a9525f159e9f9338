// CPU-only builds: the CLI has no device memory; the CUDA paths are refused before they get here.
#include "cli/common.hpp"

namespace blasst::cli {

namespace {
[[noreturn]] void no_cuda() { throw Error("blasst was built without CUDA: no device memory"); }
}  // namespace

bool have_device_buffers() { return false; }
DeviceBuffer::DeviceBuffer(std::size_t) { no_cuda(); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(p_, o.p_);
  std::swap(n_, o.n_);
  return *this;
}
void DeviceBuffer::upload(const void*, std::size_t) { no_cuda(); }
void DeviceBuffer::download(void*, std::size_t) const { no_cuda(); }
double time_device_ms(const std::function<void()>&, int, int) { no_cuda(); }

}  // namespace blasst::cli
