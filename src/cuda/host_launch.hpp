// Internal: the host layer every kernel launch goes through (CUTLASS device-adapter style):
// operand checks, staging of host tensors, the call's scratch memory (the caller's workspace or
// a pool of ours), the statistics counters and their read-back into SkipStats. Kernel-specific
// limits live with each kernel's host code (can_implement in prefill_api.cu / decode_api.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "blasst/blasst.hpp"
#include "cuda/cuda_check.hpp"

namespace blasst::detail {

// Bytes from a strided tensor's first element to its last (0 when empty).
std::size_t span_bytes(const Tensor& t);

// Operand checks of a kernel ("the CUDA prefill kernel", ...), each naming the argument.
void check_aligned16(const Tensor& t, const char* name, const char* kernel);
// Every dimension of size > 1 but the last has a stride that is a multiple of `elems` elements.
void check_strides_multiple(const Tensor& t, const char* name, std::int64_t elems, const char* kernel,
                            const char* why);
std::int64_t check_i32(std::int64_t v, const char* what);

// Host tensors of a call run on the device (RunOptions::device = cuda: CLI, demo): each is copied
// to device memory with its strides, outputs too (so the gaps of strided outputs come back
// unchanged), and copied back by download; everything is ordered on one stream.
class DeviceStaging {
 public:
  explicit DeviceStaging(cudaStream_t stream) : stream_(stream) {}
  Tensor upload(const Tensor& host);
  const std::int32_t* upload(const std::int32_t* host, std::size_t count);
  void download(const Tensor& host, const Tensor& device);
  // count 32-bit words of device memory for an output that is not a Tensor (the skip set), and
  // their copy back into host memory.
  std::uint32_t* output_words(std::size_t count);
  void download(std::uint32_t* host, const std::uint32_t* device, std::size_t count);
  void synchronize();

 private:
  cudaStream_t stream_;
  std::vector<DeviceBuffer> buffers_;
};

// The scratch memory of one call, in stream order: carved from the caller's workspace
// (RunOptions::workspace) or taken from a pool of ours that keeps its memory between calls (a
// cudaMalloc per call would synchronise the device; during stream capture the allocation is a
// graph memory node). Blocks are kAlign-aligned; bytes_for() is what a call takes.
class Workspace {
 public:
  static constexpr std::size_t kAlign = 256;
  static std::size_t bytes_for(std::initializer_list<std::size_t> blocks);

  Workspace(const RunOptions& opt, cudaStream_t stream, const char* what);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  // Without a caller's workspace: takes `bytes` (bytes_for of the blocks to come) from the pool
  // in one allocation, from which the takes that follow are carved (one pool allocation per call,
  // not one per block). With the caller's workspace: nothing to do.
  void reserve(std::size_t bytes);
  void* take(std::size_t bytes);
  template <class T> T* take(std::size_t count) { return static_cast<T*>(take(count * sizeof(T))); }
  bool capturing();  // the stream is being captured into a CUDA graph (asked once)

 private:
  void* allocate(std::size_t bytes);  // from the pool (or, during capture, a graph memory node)

  cudaStream_t stream_;
  const char* what_;
  unsigned char* given_ = nullptr;
  std::size_t given_bytes_ = 0, used_ = 0;
  bool reserved_ = false;  // given_ is our reserve(), not the caller's workspace
  bool capturing_ = false, capture_known_ = false;
  std::vector<void*> owned_;
};


// Statistics counters of a skip kernel, zeroed: visited and skipped per head, and, with a
// histogram, [head][kHistSlots] delta counts (SPEC §5).
struct StatCounters {
  unsigned long long* visited = nullptr;
  unsigned long long* skipped = nullptr;
  unsigned long long* hist = nullptr;
  std::int64_t heads = 0;
  static std::size_t bytes(std::int64_t heads, bool hist);
  static StatCounters take(Workspace& ws, std::int64_t heads, bool hist, cudaStream_t stream);
  // Copies the counts into stats (visited, skipped, hist); synchronises the stream.
  void read_into(SkipStats& stats, cudaStream_t stream) const;
};

// Per-sequence lengths from device-resident int32 values: count values at `device` (seqlens) or
// count + 1 offsets (cu_seqlens, differences). Synchronises the stream.
std::vector<std::int64_t> read_lengths(const std::int32_t* device, std::int64_t count, bool offsets,
                                       cudaStream_t stream);

}  // namespace blasst::detail
