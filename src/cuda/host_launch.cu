// The host layer shared by every kernel launch (host_launch.hpp).
#include "cuda/host_launch.hpp"

#include <mutex>
#include <string>

#include "core/hist_bin.hpp"

namespace blasst::detail {

std::size_t span_bytes(const Tensor& t) {
  if (t.numel() == 0) return 0;
  std::int64_t last = 0;
  for (int i = 0; i < t.rank; ++i) last += (t.shape[i] - 1) * t.stride[i];
  return static_cast<std::size_t>(last + 1) * dtype_size(t.dtype);
}

void check_aligned16(const Tensor& t, const char* name, const char* kernel) {
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0)
    throw Error(std::string(name) + ": " + kernel + " needs a 16-byte aligned data pointer");
}

void check_strides_multiple(const Tensor& t, const char* name, std::int64_t elems, const char* kernel,
                            const char* why) {
  for (int i = 0; i + 1 < t.rank; ++i)
    if (t.shape[i] > 1 && t.stride[i] % elems != 0)
      throw Error(std::string(name) + ": stride " + std::to_string(t.stride[i]) + " of dimension " +
                  std::to_string(i) + " is not a multiple of " + std::to_string(elems) + " elements (" + kernel +
                  ": " + why + ")");
}

std::int64_t check_i32(std::int64_t v, const char* what) {
  if (v > 0x7fffffff)
    throw Error(std::string(what) + " = " + std::to_string(v) + " exceeds the CUDA kernel's int32 range");
  return v;
}

// ---- staging ------------------------------------------------------------------------------------

Tensor DeviceStaging::upload(const Tensor& host) {
  if (!host.defined()) return host;
  const std::size_t bytes = span_bytes(host);
  buffers_.emplace_back(bytes < 16 ? 16 : bytes);
  Tensor d = host;
  d.data = buffers_.back().get();
  d.device = DeviceKind::cuda;
  if (bytes) BLASST_CUDA_CHECK(cudaMemcpyAsync(d.data, host.data, bytes, cudaMemcpyHostToDevice, stream_));
  return d;
}

const std::int32_t* DeviceStaging::upload(const std::int32_t* host, std::size_t count) {
  if (host == nullptr) return nullptr;
  const std::size_t bytes = count * sizeof(std::int32_t);
  buffers_.emplace_back(bytes < 16 ? 16 : bytes);
  if (bytes) BLASST_CUDA_CHECK(cudaMemcpyAsync(buffers_.back().get(), host, bytes, cudaMemcpyHostToDevice, stream_));
  return buffers_.back().as<std::int32_t>();
}

void DeviceStaging::download(const Tensor& host, const Tensor& device) {
  if (!host.defined()) return;
  const std::size_t bytes = span_bytes(host);
  if (bytes) BLASST_CUDA_CHECK(cudaMemcpyAsync(host.data, device.data, bytes, cudaMemcpyDeviceToHost, stream_));
}

std::uint32_t* DeviceStaging::output_words(std::size_t count) {
  const std::size_t bytes = count * sizeof(std::uint32_t);
  buffers_.emplace_back(bytes < 16 ? 16 : bytes);
  return static_cast<std::uint32_t*>(buffers_.back().get());
}

void DeviceStaging::download(std::uint32_t* host, const std::uint32_t* device, std::size_t count) {
  if (count)
    BLASST_CUDA_CHECK(cudaMemcpyAsync(host, device, count * sizeof(std::uint32_t), cudaMemcpyDeviceToHost, stream_));
}

void DeviceStaging::synchronize() { BLASST_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

// ---- workspace ----------------------------------------------------------------------------------

namespace {

// One pool per device that keeps its memory (release threshold: never).
cudaMemPool_t workspace_pool(int dev) {
  static std::mutex mu;
  static std::vector<cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mu);
  if (pools.size() <= static_cast<std::size_t>(dev)) pools.resize(dev + 1, nullptr);
  if (!pools[dev]) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t pool;
    BLASST_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
    std::uint64_t keep = ~0ull;
    BLASST_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    pools[dev] = pool;
  }
  return pools[dev];
}

std::size_t align_up(std::size_t n) { return (n + Workspace::kAlign - 1) / Workspace::kAlign * Workspace::kAlign; }

}  // namespace

std::size_t Workspace::bytes_for(std::initializer_list<std::size_t> blocks) {
  std::size_t n = 0;
  for (std::size_t b : blocks) n += align_up(b);
  return n;
}

Workspace::Workspace(const RunOptions& opt, cudaStream_t stream, const char* what) : stream_(stream), what_(what) {
  if (opt.workspace != nullptr) {
    if (reinterpret_cast<std::uintptr_t>(opt.workspace) % kAlign != 0)
      throw Error("RunOptions::workspace: must be " + std::to_string(kAlign) + "-byte aligned");
    given_ = static_cast<unsigned char*>(opt.workspace);
    given_bytes_ = opt.workspace_bytes;
  }
}

bool Workspace::capturing() {
  if (capture_known_) return capturing_;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  BLASST_CUDA_CHECK(cudaStreamIsCapturing(stream_, &cap));
  capturing_ = cap != cudaStreamCaptureStatusNone;
  capture_known_ = true;
  return capturing_;
}

Workspace::~Workspace() {
  for (void* p : owned_) cudaFreeAsync(p, stream_);
}

void* Workspace::allocate(std::size_t bytes) {
  void* p = nullptr;
  if (capturing()) {
    BLASST_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream_));
  } else {
    int dev = 0;
    BLASST_CUDA_CHECK(cudaGetDevice(&dev));
    BLASST_CUDA_CHECK(cudaMallocFromPoolAsync(&p, bytes, workspace_pool(dev), stream_));
  }
  owned_.push_back(p);
  return p;
}

void Workspace::reserve(std::size_t bytes) {
  if (given_ != nullptr || bytes == 0) return;
  given_ = static_cast<unsigned char*>(allocate(bytes));
  given_bytes_ = bytes;
  used_ = 0;
  reserved_ = true;
}

void* Workspace::take(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  if (given_ == nullptr) return allocate(bytes);
  const std::size_t need = used_ + align_up(bytes);
  if (need > given_bytes_) {
    if (reserved_)  // a bug of ours: the call's reserve() did not cover what it takes
      throw Error(std::string("internal: ") + what_ + " reserved " + std::to_string(given_bytes_) +
                  " workspace bytes and takes " + std::to_string(need));
    throw Error(std::string("RunOptions::workspace: ") + std::to_string(given_bytes_) + " bytes given, " + what_ +
                " needs at least " + std::to_string(need) + " (ask *_workspace_bytes for the size)");
  }
  void* p = given_ + used_;
  used_ = need;
  return p;
}

// ---- statistics ---------------------------------------------------------------------------------

std::size_t StatCounters::bytes(std::int64_t heads, bool hist) {
  return static_cast<std::size_t>(heads) * (2 + (hist ? kHistSlots : 0)) * sizeof(unsigned long long);
}

StatCounters StatCounters::take(Workspace& ws, std::int64_t heads, bool hist, cudaStream_t stream) {
  StatCounters c;
  c.heads = heads;
  const std::size_t n = bytes(heads, hist);
  if (n == 0) return c;
  c.visited = static_cast<unsigned long long*>(ws.take(n));
  c.skipped = c.visited + heads;
  c.hist = hist ? c.skipped + heads : nullptr;
  BLASST_CUDA_CHECK(cudaMemsetAsync(c.visited, 0, n, stream));
  return c;
}

void StatCounters::read_into(SkipStats& stats, cudaStream_t stream) const {
  const std::size_t n = bytes(heads, hist != nullptr) / sizeof(unsigned long long);
  std::vector<unsigned long long> h(n);
  if (n) BLASST_CUDA_CHECK(cudaMemcpyAsync(h.data(), visited, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream));
  BLASST_CUDA_CHECK(cudaStreamSynchronize(stream));
  stats.visited.assign(h.begin(), h.begin() + heads);
  stats.skipped.assign(h.begin() + heads, h.begin() + 2 * heads);
  stats.hist.clear();
  if (hist != nullptr) {
    stats.hist.assign(static_cast<std::size_t>(heads), DeltaHistogram{});
    for (std::int64_t k = 0; k < heads; ++k)
      for (int i = 0; i < kHistSlots; ++i)
        stats.hist[std::size_t(k)].counts[std::size_t(i)] = h[std::size_t(2 * heads + k * kHistSlots + i)];
  }
}

std::vector<std::int64_t> read_lengths(const std::int32_t* device, std::int64_t count, bool offsets,
                                       cudaStream_t stream) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(count + (offsets ? 1 : 0)));
  if (!v.empty())
    BLASST_CUDA_CHECK(cudaMemcpyAsync(v.data(), device, v.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream));
  BLASST_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<std::int64_t> len(static_cast<std::size_t>(count));
  for (std::int64_t b = 0; b < count; ++b) len[std::size_t(b)] = offsets ? v[b + 1] - v[b] : v[b];
  return len;
}

}  // namespace blasst::detail
