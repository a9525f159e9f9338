// Internal helpers shared by the `blasst` subcommands (progress, host buffers, stats as JSON,
// the exact-quantile lambda, device buffers for the CUDA path).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "blasst/blasst.hpp"

namespace blasst::cli {

// Largest --threads the commands accept (docs/cli.md); the reference itself uses at most
// 4 x the hardware threads (docs/reference.md).
inline constexpr int kMaxThreads = 1024;

// Progress lines on stderr, only when stderr is a terminal (pipes and logs stay clean).
class Progress {
 public:
  Progress();
  ~Progress();
  bool enabled() const { return enabled_; }
  void update(const std::string& msg);  // replaces the current line
  void clear();

 private:
  bool enabled_ = false;
  bool dirty_ = false;
};

// A host array in one of the library dtypes, row-major.
struct HostBuffer {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;

  std::int64_t numel() const;
  Tensor tensor(DeviceKind dev = DeviceKind::cpu);  // contiguous view (rank 1..4)
  void* data() { return bytes.data(); }
};
HostBuffer make_buffer(DType t, const std::vector<std::int64_t>& shape);  // zero-filled
// Round float values to dtype t (round to nearest even for f16/bf16).
HostBuffer from_floats(const std::vector<float>& x, const std::vector<std::int64_t>& shape, DType t);
std::vector<float> to_floats(const HostBuffer& b);
// Poison a buffer (NaN bit patterns) so that elements a kernel forgot to write are noticed.
void poison(HostBuffer& b);

// ||a - ref||_2 / ||ref||_2 (0 when both are zero; inf when only ref is zero).
double rel_l2(const std::vector<float>& a, const std::vector<float>& ref);

// SPEC §5: lambda whose one-pass sparsity equals `target` on the recorded deltas (the exact
// quantile). Returns ln(lambda) and the sparsity it gives, clamped to lambda < 1 (a target the
// deltas cannot reach returns the largest sparsity reachable with lambda < 1).
struct CurvePoint {
  double ln_lambda = 0;
  double sparsity = 0;
  bool reachable = true;
};
CurvePoint lambda_for_target(std::vector<float> deltas, double target);
// The same from a delta histogram (kernels): DeltaHistogram::lambda_for.
CurvePoint lambda_for_target(const DeltaHistogram& h, double target);

nlohmann::json granularity_json(const VoteGranularity& g);
nlohmann::json stats_json(const SkipStats& s);

inline double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// ---- device memory for the CUDA path (src/cli/device_cuda.cpp or device_stub.cpp) ----------
bool have_device_buffers();  // built with the CUDA runtime
// A device copy of a host buffer, for timing kernels on device-resident tensors. The memory is
// the library's blasst::detail::DeviceBuffer (src/cuda/cuda_check.hpp) in CUDA builds; CPU-only
// builds refuse to construct one.
class DeviceMirror {
 public:
  explicit DeviceMirror(HostBuffer& host);  // allocates host.bytes.size() bytes on the device
  ~DeviceMirror();
  DeviceMirror(DeviceMirror&&) noexcept;
  DeviceMirror& operator=(DeviceMirror&&) noexcept;
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;
  Tensor tensor() const;  // the host buffer's shape and dtype over the device memory
  void upload();          // host -> device
  void download();        // device -> host

 private:
  struct Memory;
  HostBuffer* host_;
  std::unique_ptr<Memory> mem_;
};
// Median time (ms) of `reps` calls of fn after `warmup` calls, measured with CUDA events on the
// default stream. Only with have_device_buffers().
double time_device_ms(const std::function<void()>& fn, int warmup, int reps);

}  // namespace blasst::cli
