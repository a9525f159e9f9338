// CPU-only builds: the CLI has no device memory; the CUDA paths are refused before they get here.
#include "cli/common.hpp"

namespace blasst::cli {

namespace {
[[noreturn]] void no_cuda() { throw Error("blasst was built without CUDA: no device memory"); }
}  // namespace

bool have_device_buffers() { return false; }

struct DeviceMirror::Memory {};

DeviceMirror::DeviceMirror(HostBuffer& host) : host_(&host) { no_cuda(); }
DeviceMirror::~DeviceMirror() = default;
DeviceMirror::DeviceMirror(DeviceMirror&&) noexcept = default;
DeviceMirror& DeviceMirror::operator=(DeviceMirror&&) noexcept = default;
Tensor DeviceMirror::tensor() const { no_cuda(); }
void DeviceMirror::upload() { no_cuda(); }
void DeviceMirror::download() { no_cuda(); }
double time_device_ms(const std::function<void()>&, int, int) { no_cuda(); }

}  // namespace blasst::cli
