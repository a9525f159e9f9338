// Host side of the sm_90a decode kernels: validation, split choice, workspace, launches, stats.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_dispatch.hpp"
#include "core/decode_layout.hpp"
#include "cuda/sm90/decode/decode_params.hpp"

namespace blasst::detail {

namespace {

using decode::Params;

// Stream-ordered workspace from a pool of our own that keeps its memory between calls (a
// cudaMalloc per call would synchronise the device).
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

class StreamBuffer {
 public:
  // During stream capture (CUDA graphs) the allocation becomes a graph memory node instead.
  StreamBuffer(std::size_t bytes, cudaStream_t s, cudaMemPool_t pool, bool capturing) : s_(s) {
    if (bytes && capturing) BLASST_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, s));
    else if (bytes) BLASST_CUDA_CHECK(cudaMallocFromPoolAsync(&ptr_, bytes, pool, s));
  }
  ~StreamBuffer() { if (ptr_) cudaFreeAsync(ptr_, s_); }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  template <class T> T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t s_;
};

// BLASST_DECODE_TRACE: the kernel's per-CTA timer stamps (device, [CTAs][kTracePoints]) appended
// to `file` as CSV lines "tag,cta,b,h,split,t0,...", tag from BLASST_DECODE_TRACE_TAG. Synchronises.
void append_trace(const char* file, const unsigned long long* dev, std::size_t n_ctas, dim3 grid,
                  bool splits_fastest, cudaStream_t stream) {
  std::vector<unsigned long long> tr(n_ctas * decode::kTracePoints);
  BLASST_CUDA_CHECK(cudaMemcpyAsync(tr.data(), dev, tr.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                    stream));
  BLASST_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::FILE* f = std::fopen(file, "a");
  if (f == nullptr) throw Error(std::string("BLASST_DECODE_TRACE: cannot open ") + file);
  const char* tag = std::getenv("BLASST_DECODE_TRACE_TAG");
  for (std::size_t c = 0; c < n_ctas; ++c) {
    // CTA index = (z * gridDim.y + y) * gridDim.x + x
    const std::size_t x = c % grid.x, y = (c / grid.x) % grid.y, z = c / (std::size_t{grid.x} * grid.y);
    std::fprintf(f, "%s,%zu,%zu,%zu,%zu", tag ? tag : "", c, z, splits_fastest ? y : x, splits_fastest ? x : y);
    for (int k = 0; k < decode::kTracePoints; ++k) std::fprintf(f, ",%llu", tr[c * decode::kTracePoints + k]);
    std::fprintf(f, "\n");
  }
  std::fclose(f);
}

struct DeviceInfo {
  int sms = 0;
};
DeviceInfo device_info(int dev) {
  static std::mutex mu;
  static std::vector<DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() <= static_cast<std::size_t>(dev)) cache.resize(dev + 1);
  if (cache[dev].sms == 0)
    BLASST_CUDA_CHECK(cudaDeviceGetAttribute(&cache[dev].sms, cudaDevAttrMultiProcessorCount, dev));
  return cache[dev];
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

void check_aligned(const Tensor& t, const char* name) {
  if (!aligned16(t.data))
    throw Error(std::string(name) + ": the CUDA decode kernel needs a 16-byte aligned base pointer");
}

void check_strides(const Tensor& t, const char* name) {
  for (int i = 0; i < t.rank - 1; ++i)
    if (t.shape[i] > 1 && t.stride[i] % 8 != 0)
      throw Error(std::string(name) + ": the CUDA decode kernel needs strides that are multiples of 8 "
                  "elements (16 bytes); dimension " + std::to_string(i) + " has stride " +
                  std::to_string(t.stride[i]));
}

// BLASST_DECODE_LOADS: "" or "tma" (default) or "cpasync"; anything else is an error.
std::string load_path() {
  const char* env = std::getenv("BLASST_DECODE_LOADS");
  const std::string v = env ? env : "";
  if (!v.empty() && v != "tma" && v != "cpasync")
    throw Error("BLASST_DECODE_LOADS: expected tma or cpasync, got '" + v + "'");
  return v;
}

// What the kernels support; anything else is a clear error before any CUDA call (also for the
// staged host path), never a silent fallback.
void check_supported(const DecodeProblem& p, const ResolvedDecode& r, const SkipConfig& skip) {
  if (r.dtype != DType::bf16 && r.dtype != DType::f16)
    throw Error(std::string("q: the CUDA decode kernel supports bf16 and f16, got ") + to_string(r.dtype));
  if (r.d != 64 && r.d != 128) throw Error("q: the CUDA decode kernel supports head dim d = 64 or 128, got " + std::to_string(r.d));
  if (r.dv != r.d) throw Error("v_cache: the CUDA decode kernel needs dv == d, got dv = " + std::to_string(r.dv));
  const std::int64_t rows = r.group * r.q_len;
  if (rows > decode::kMaxRows)
    throw Error("q: the CUDA decode kernel handles g * q_len <= 64 query rows per KV head, got g = " +
                std::to_string(r.group) + ", q_len = " + std::to_string(r.q_len));
  if (r.paged && (r.page_size & (r.page_size - 1)) != 0)
    throw Error("k_cache: the CUDA decode kernel needs a power-of-two page_size, got " + std::to_string(r.page_size));
  (void)load_path();
  check_strides(p.q, "q");
  check_strides(p.k_cache, "k_cache");
  check_strides(p.v_cache, "v_cache");
  if (p.out.dtype != DType::f32 && p.out.dtype != DType::f64 && p.out.dtype != r.dtype)
    throw Error("out: unsupported dtype for the CUDA decode kernel");

  if (skip.enabled) {
    validate(skip);
    if (skip.vote.tile_keys != decode::kTileKeys)
      throw Error("skip.vote.tile_keys: the CUDA decode kernel uses 128-key tiles, got " + std::to_string(skip.vote.tile_keys));
  }
  if (skip.vote.split_tiles < 0) throw Error("skip.vote.split_tiles must be >= 0, got " + std::to_string(skip.vote.split_tiles));
}

int ctas_per_sm_uncached(DType dt, int d, bool skip, int mt, std::size_t smem);

// Cached per device and configuration: the occupancy query is not free on the host.
int ctas_per_sm(DType dt, int d, bool skip, int mt, std::size_t smem) {
  static std::mutex mu;
  static std::vector<std::pair<std::uint64_t, int>> cache;
  int dev = 0;
  BLASST_CUDA_CHECK(cudaGetDevice(&dev));
  const std::uint64_t key = (static_cast<std::uint64_t>(dev) << 48) ^ (static_cast<std::uint64_t>(dt) << 40) ^
                            (static_cast<std::uint64_t>(d) << 32) ^ (static_cast<std::uint64_t>(skip) << 31) ^
                            (static_cast<std::uint64_t>(mt) << 24) ^ smem;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& e : cache)
      if (e.first == key) return e.second;
  }
  const int n = ctas_per_sm_uncached(dt, d, skip, mt, smem);
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace_back(key, n);
  return n;
}

template <int MT>
int occupancy_mt(DType dt, int d, bool skip, std::size_t smem) {
  using decode::occupancy_decode;
  if (dt == DType::bf16) {
    if (d == 128) return skip ? occupancy_decode<__nv_bfloat16, 128, true, MT>(smem) : occupancy_decode<__nv_bfloat16, 128, false, MT>(smem);
    return skip ? occupancy_decode<__nv_bfloat16, 64, true, MT>(smem) : occupancy_decode<__nv_bfloat16, 64, false, MT>(smem);
  }
  if (d == 128) return skip ? occupancy_decode<__half, 128, true, MT>(smem) : occupancy_decode<__half, 128, false, MT>(smem);
  return skip ? occupancy_decode<__half, 64, true, MT>(smem) : occupancy_decode<__half, 64, false, MT>(smem);
}

int ctas_per_sm_uncached(DType dt, int d, bool skip, int mt, std::size_t smem) {
  const int n = mt == 1 ? occupancy_mt<1>(dt, d, skip, smem) : occupancy_mt<4>(dt, d, skip, smem);
  return std::max(n, 1);
}

template <int MT>
void launch_mt(DType dt, int d, bool skip, const Params& p, dim3 grid, std::size_t smem, cudaStream_t s) {
  using decode::launch_decode;
  if (dt == DType::bf16) {
    if (d == 128) skip ? launch_decode<__nv_bfloat16, 128, true, MT>(p, grid, smem, s) : launch_decode<__nv_bfloat16, 128, false, MT>(p, grid, smem, s);
    else skip ? launch_decode<__nv_bfloat16, 64, true, MT>(p, grid, smem, s) : launch_decode<__nv_bfloat16, 64, false, MT>(p, grid, smem, s);
  } else {
    if (d == 128) skip ? launch_decode<__half, 128, true, MT>(p, grid, smem, s) : launch_decode<__half, 128, false, MT>(p, grid, smem, s);
    else skip ? launch_decode<__half, 64, true, MT>(p, grid, smem, s) : launch_decode<__half, 64, false, MT>(p, grid, smem, s);
  }
}

void launch(DType dt, int d, bool skip, int mt, const Params& p, dim3 grid, std::size_t smem, cudaStream_t s) {
  if (mt == 1) launch_mt<1>(dt, d, skip, p, grid, smem, s);
  else launch_mt<4>(dt, d, skip, p, grid, smem, s);
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<EncodeTiled>(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// K or V cache [S0, S1, Hk, d] (S0 = sequences or pages, S1 = keys or page slots, any 16-byte
// multiple strides, e.g. [B, L, Hk, d] or a head-major [B, Hk, L, d] view) as a 4-D tensor map
// {d, S1, Hk, S0} with {64, box_rows, 1, 1} boxes and the 128B swizzle. Rows past S1 read as zeros.
bool make_kv_map(CUtensorMap* map, const Tensor& t, int box_rows) {
  EncodeTiled enc = encode_tiled();
  if (!enc) return false;
  if (t.shape[3] % 64 != 0) return false;
  for (int i = 0; i < 3; ++i)
    if (t.stride[i] <= 0 || t.shape[i] >= (std::int64_t{1} << 31)) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(t.shape[3]), static_cast<cuuint64_t>(t.shape[1]),
                              static_cast<cuuint64_t>(t.shape[2]), static_cast<cuuint64_t>(t.shape[0])};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(t.stride[1]) * 2, static_cast<cuuint64_t>(t.stride[2]) * 2,
                                 static_cast<cuuint64_t>(t.stride[0]) * 2};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dt = t.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return enc(map, dt, 4, t.data, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

std::size_t span_bytes(const Tensor& t) {
  if (t.numel() == 0) return 0;
  std::int64_t off = 0;
  for (int i = 0; i < t.rank; ++i) off += (t.shape[i] - 1) * t.stride[i];
  return static_cast<std::size_t>(off + 1) * dtype_size(t.dtype);
}

// Host tensors with opt.device == cuda: copy every input's span to the device (strides kept),
// run, copy out/lse back, synchronise.
void staged_decode(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt, SkipStats* stats) {
  const ResolvedDecode r = validate_decode(p, DeviceKind::cpu);  // checks the host problem itself
  check_supported(p, r, skip);
  auto up = [&](const Tensor& t, DeviceBuffer& buf, bool copy) {
    Tensor d = t;
    buf = DeviceBuffer(std::max<std::size_t>(span_bytes(t), 16));
    if (copy && span_bytes(t)) BLASST_CUDA_CHECK(cudaMemcpy(buf.get(), t.data, span_bytes(t), cudaMemcpyHostToDevice));
    d.data = buf.get();
    d.device = DeviceKind::cuda;
    return d;
  };
  DeviceBuffer bq, bk, bv, bo, bl, bpt, bsl;
  DecodeProblem d = p;
  d.q = up(p.q, bq, true);
  d.k_cache = up(p.k_cache, bk, true);
  d.v_cache = up(p.v_cache, bv, true);
  d.out = up(p.out, bo, false);
  if (p.lse.defined()) d.lse = up(p.lse, bl, false);
  if (p.page_table) {
    const std::size_t n = static_cast<std::size_t>(r.batch * p.page_table_stride) * sizeof(std::int32_t);
    bpt = DeviceBuffer(n);
    BLASST_CUDA_CHECK(cudaMemcpy(bpt.get(), p.page_table, n, cudaMemcpyHostToDevice));
    d.page_table = bpt.as<std::int32_t>();
  }
  if (p.seqlens_k) {
    const std::size_t n = static_cast<std::size_t>(r.batch) * sizeof(std::int32_t);
    bsl = DeviceBuffer(n);
    BLASST_CUDA_CHECK(cudaMemcpy(bsl.get(), p.seqlens_k, n, cudaMemcpyHostToDevice));
    d.seqlens_k = bsl.as<std::int32_t>();
    d.max_seqlen_k = r.max_k_len;
  }
  RunOptions o = opt;
  o.device = DeviceKind::cuda;
  cuda_decode(d, skip, o, stats);
  auto stream = static_cast<cudaStream_t>(opt.stream);
  BLASST_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (span_bytes(p.out)) BLASST_CUDA_CHECK(cudaMemcpy(p.out.data, bo.get(), span_bytes(p.out), cudaMemcpyDeviceToHost));
  if (p.lse.defined() && span_bytes(p.lse))
    BLASST_CUDA_CHECK(cudaMemcpy(p.lse.data, bl.get(), span_bytes(p.lse), cudaMemcpyDeviceToHost));
}

}  // namespace

void cuda_decode(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt, SkipStats* stats) {
  if (p.q.device == DeviceKind::cpu && opt.device == DeviceKind::cuda) return staged_decode(p, skip, opt, stats);
  const ResolvedDecode r = validate_decode(p, DeviceKind::cuda);
  auto stream = static_cast<cudaStream_t>(opt.stream);

  check_supported(p, r, skip);
  check_aligned(p.q, "q");
  check_aligned(p.k_cache, "k_cache");
  check_aligned(p.v_cache, "v_cache");
  const std::int64_t rows = r.group * r.q_len;

  // Threshold (SPEC §3) and vote layout.
  int lam_mode = 0;
  double lam_value = 0.0;
  if (skip.enabled) {
    validate(skip);
    (void)resolve_lambda(skip, std::max<std::int64_t>(r.max_k_len, 1));  // surfaces config errors
    if (skip.threshold) {
      lam_mode = *skip.threshold < 1.0 ? 1 : 0;
      lam_value = *skip.threshold;
    } else {
      lam_value = skip.factor ? *skip.factor
                              : skip.calibration->a * std::exp(skip.calibration->b * skip.target_sparsity);
      // lambda = factor / Lk < 1 only for sequences longer than factor.
      lam_mode = lam_value < static_cast<double>(r.max_k_len) ? 2 : 0;
    }
  }
  // max-first order in split-KV decode = seeded splits (SPEC §2a): the skip instantiation runs even
  // when no sequence can skip (lambda >= 1), so its statistics count deltas against the seeds.
  const bool seeded = skip.enabled && skip.vote.order == VisitOrder::max_first;
  const bool use_skip = lam_mode != 0 || seeded;

  const int mtiles = decode::mtiles_for(static_cast<int>(rows));
  const std::size_t smem = decode::smem_bytes(static_cast<int>(r.d), mtiles);
  int dev = 0;
  BLASST_CUDA_CHECK(cudaGetDevice(&dev));
  const std::int64_t max_tiles = (r.max_k_len + decode::kTileKeys - 1) / decode::kTileKeys;
  std::int64_t split_tiles = skip.vote.split_tiles;
  if (split_tiles == 0)
    split_tiles = decode_split_tiles(r.batch, r.hk, max_tiles, device_info(dev).sms,
                                     ctas_per_sm(r.dtype, static_cast<int>(r.d), use_skip, mtiles, smem));
  split_tiles = std::max<std::int64_t>(split_tiles, 1);
  const std::int64_t num_splits = std::max<std::int64_t>((max_tiles + split_tiles - 1) / split_tiles, 1);
  if (num_splits > 65535) throw Error("skip.vote.split_tiles: too many splits (" + std::to_string(num_splits) + ")");

  const bool want_stats = stats != nullptr && (opt.collect_stats || opt.collect_histogram || opt.record_deltas);
  const bool want_hist = stats != nullptr && opt.collect_histogram;

  cudaMemPool_t pool = workspace_pool(dev);
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  BLASST_CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
  const bool capturing = cap != cudaStreamCaptureStatusNone;
  if (capturing && stats) throw Error("decode: statistics need a synchronisation and cannot be collected during stream capture");
  const std::size_t part_rows = static_cast<std::size_t>(r.batch * r.hk * num_splits * rows);
  StreamBuffer o_part(part_rows * r.d * sizeof(float), stream, pool, capturing);
  StreamBuffer lse_part(part_rows * sizeof(float), stream, pool, capturing);
  const std::size_t n_counts = static_cast<std::size_t>(r.hk) * 2 + (want_hist ? static_cast<std::size_t>(r.hk) * decode::kHistBins : 0);
  StreamBuffer counts(want_stats ? n_counts * sizeof(unsigned long long) : 0, stream, pool, capturing);
  if (want_stats) BLASST_CUDA_CHECK(cudaMemsetAsync(counts.as<unsigned long long>(), 0, n_counts * sizeof(unsigned long long), stream));
  // Diagnostic timeline (BLASST_DECODE_TRACE=<file>, bench/decode/trace_decode.py): each CTA's
  // timer stamps appended to <file> as CSV; synchronises, so never during stream capture.
  const char* trace_file = std::getenv("BLASST_DECODE_TRACE");
  if (trace_file != nullptr && *trace_file == '\0') trace_file = nullptr;
  if (trace_file != nullptr && capturing) throw Error("BLASST_DECODE_TRACE: cannot trace during stream capture");
  const std::size_t n_ctas = static_cast<std::size_t>(r.batch * r.hk * num_splits);
  const std::size_t n_trace = trace_file ? n_ctas * decode::kTracePoints : 0;
  StreamBuffer trace(n_trace * sizeof(unsigned long long), stream, pool, capturing);
  if (trace_file) BLASST_CUDA_CHECK(cudaMemsetAsync(trace.as<unsigned long long>(), 0, n_trace * sizeof(unsigned long long), stream));

  Params kp{};
  kp.q = p.q.data;
  kp.q_sb = p.q.stride[0]; kp.q_st = p.q.stride[1]; kp.q_sh = p.q.stride[2];
  kp.k = p.k_cache.data; kp.v = p.v_cache.data;
  kp.k_s0 = p.k_cache.stride[0]; kp.k_s1 = p.k_cache.stride[1]; kp.k_sh = p.k_cache.stride[2];
  kp.v_s0 = p.v_cache.stride[0]; kp.v_s1 = p.v_cache.stride[1]; kp.v_sh = p.v_cache.stride[2];
  kp.page_table = r.paged ? p.page_table : nullptr;
  kp.pt_stride = p.page_table_stride;
  kp.log2_page = 0;
  if (r.paged) while ((std::int64_t{1} << kp.log2_page) < r.page_size) ++kp.log2_page;
  kp.seqlens = p.seqlens_k;
  kp.lmax = r.paged ? r.max_k_len : p.k_cache.shape[1];
  kp.batch = static_cast<int>(r.batch); kp.hk = static_cast<int>(r.hk); kp.group = static_cast<int>(r.group);
  kp.q_len = static_cast<int>(r.q_len); kp.rows = static_cast<int>(rows);
  kp.causal = r.mask == MaskKind::causal ? 1 : 0;
  kp.scale_log2 = static_cast<float>(r.scale * 1.4426950408889634);
  kp.lam_mode = lam_mode; kp.lam_value = lam_value;
  kp.split_tiles = static_cast<int>(split_tiles); kp.num_splits = static_cast<int>(num_splits);
  kp.seeded = seeded ? 1 : 0;
  // Benchmark probe of the seed prologue's cost (bench/decode/bench_decode.py): "load" = the seed
  // tiles are loaded and waited for but not scored, "score" = the split's first tile is scored in
  // their place (no extra loads). Both leave the running maxima wrong for skipping: timing only.
  if (const char* probe = std::getenv("BLASST_DECODE_SEED_PROBE"); probe != nullptr && *probe != '\0' && seeded) {
    const std::string v = probe;
    if (v != "load" && v != "score") throw Error("BLASST_DECODE_SEED_PROBE: expected load or score, got '" + v + "'");
    kp.seeded = v == "load" ? 2 : 3;
  }
  kp.o_part = o_part.as<float>(); kp.lse_part = lse_part.as<float>();
  kp.trace = trace_file ? trace.as<unsigned long long>() : nullptr;
  if (want_stats) {
    kp.visited = counts.as<unsigned long long>();
    kp.skipped = kp.visited + r.hk;
    kp.hist = want_hist ? kp.skipped + r.hk : nullptr;
  }
  if (r.batch > 65535 || r.hk > 65535) throw Error("q: batch and KV heads must be <= 65535 for the CUDA decode kernel");
  // Loads: tensor-map boxes through the copy engine (default), or 16-byte cp.async per thread: the
  // fallback for layouts a tensor map cannot describe, and BLASST_DECODE_LOADS=cpasync (tests and
  // the benchmark exercise it). Both write the same swizzled tile image.
  const std::string loads = load_path();
  kp.tma = 0;
  if (loads.empty() || loads == "tma") {
    const int box_rows = static_cast<int>(r.paged ? std::min<std::int64_t>(r.page_size, decode::kTileKeys) : decode::kTileKeys);
    if (box_rows >= 8 && make_kv_map(&kp.tmk, p.k_cache, box_rows) && make_kv_map(&kp.tmv, p.v_cache, box_rows)) {
      kp.tma = 1;
      kp.tma_box_rows = box_rows;
    }
  }
  // Grid order: heads fastest (default) or BLASST_DECODE_GRID=splits (the splits of one head next
  // to each other), a benchmark probe: at B = 8, 32k on the H200 one run measured splits-first
  // 6 % faster (f05b4c2), the next 4 % slower (6ff5dca): noise. Anything else is an error.
  const char* grid_env = std::getenv("BLASST_DECODE_GRID");
  const std::string grid_order = grid_env ? grid_env : "";
  if (!grid_order.empty() && grid_order != "heads" && grid_order != "splits")
    throw Error("BLASST_DECODE_GRID: expected heads or splits, got '" + grid_order + "'");
  kp.splits_fastest = grid_order == "splits" ? 1 : 0;
  const dim3 grid = kp.splits_fastest
                        ? dim3(static_cast<unsigned>(num_splits), static_cast<unsigned>(r.hk), static_cast<unsigned>(r.batch))
                        : dim3(static_cast<unsigned>(r.hk), static_cast<unsigned>(num_splits), static_cast<unsigned>(r.batch));
  launch(r.dtype, static_cast<int>(r.d), use_skip, mtiles, kp, grid, smem, stream);

  decode::MergeParams mp{};
  mp.o_part = kp.o_part; mp.lse_part = kp.lse_part;
  mp.batch = kp.batch; mp.hk = kp.hk; mp.group = kp.group; mp.q_len = kp.q_len; mp.rows = kp.rows;
  mp.num_splits = kp.num_splits; mp.dv = static_cast<int>(r.dv);
  mp.out = p.out.data;
  mp.out_dtype = p.out.dtype == DType::f32 ? 0 : p.out.dtype == DType::bf16 ? 1 : p.out.dtype == DType::f16 ? 2 : 3;
  mp.o_sb = p.out.stride[0]; mp.o_st = p.out.stride[1]; mp.o_sh = p.out.stride[2];
  if (p.lse.defined()) {
    mp.lse = p.lse.data;
    mp.lse_f64 = p.lse.dtype == DType::f64 ? 1 : 0;
    mp.l_sb = p.lse.stride[0]; mp.l_sh = p.lse.stride[1]; mp.l_st = p.lse.stride[2];
  }
  decode::launch_merge(mp, stream);
  if (trace_file) append_trace(trace_file, trace.as<unsigned long long>(), n_ctas, grid, kp.splits_fastest != 0, stream);

  if (stats) {
    SkipStats& st = *stats;
    st = SkipStats{};
    st.granularity.tile_keys = decode::kTileKeys;
    st.granularity.rows = static_cast<int>(r.q_len);
    st.granularity.heads = static_cast<int>(r.group);
    // A seeded layout is reported even with one split: the reference then seeds that split too.
    st.granularity.split_tiles = (num_splits > 1 || seeded) ? split_tiles : 0;
    st.granularity.order = seeded ? VisitOrder::max_first : VisitOrder::natural;
    st.counted_at = std::to_string(r.q_len) + " rows x " + std::to_string(r.group) +
                    " heads (every query row of a KV group) x 128 keys, split_tiles " + std::to_string(split_tiles) +
                    (seeded ? ", seeded splits (max-first)" : ", natural order");
    // Per-sequence lambda (host lengths; read them when the capture-safe path skipped that).
    std::vector<std::int64_t> k_len = r.k_len;
    if (k_len.empty()) {
      std::vector<std::int32_t> sl(static_cast<std::size_t>(r.batch));
      BLASST_CUDA_CHECK(cudaMemcpyAsync(sl.data(), p.seqlens_k, sl.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream));
      BLASST_CUDA_CHECK(cudaStreamSynchronize(stream));
      k_len.assign(sl.begin(), sl.end());
    }
    for (auto L : k_len)  // as the reference: no keys -> infinite lambda, skipping off -> 1
      st.lambda.push_back(!skip.enabled ? 1.0 : L >= 1 ? resolve_lambda(skip, L) : HUGE_VAL);
    if (want_stats) {
      std::vector<unsigned long long> h(n_counts);
      BLASST_CUDA_CHECK(cudaMemcpyAsync(h.data(), counts.as<unsigned long long>(), n_counts * sizeof(unsigned long long),
                                        cudaMemcpyDeviceToHost, stream));
      BLASST_CUDA_CHECK(cudaStreamSynchronize(stream));
      for (std::int64_t k = 0; k < r.hk; ++k) {
        st.visited.push_back(static_cast<std::int64_t>(h[k]));
        st.skipped.push_back(static_cast<std::int64_t>(h[r.hk + k]));
      }
      if (want_hist) {
        st.hist.resize(static_cast<std::size_t>(r.hk));
        for (std::int64_t k = 0; k < r.hk; ++k)
          for (int i = 0; i < decode::kHistBins; ++i)
            st.hist[k].counts[i] = h[2 * r.hk + k * decode::kHistBins + i];
      }
    }
  }
}

}  // namespace blasst::detail
