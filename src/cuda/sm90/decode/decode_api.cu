// Host side of the sm_90a decode kernels: detail::cuda_decode (src/cuda/cuda_dispatch.hpp) and
// sm90::decode::run (decode_api.hpp). can_implement states the kernels' limits; plan() chooses the
// instance (kernel_table.inc) and the split layout (src/core/decode_layout.cpp) once, for the
// call and for its workspace size; scratch memory, staging and statistics come from the shared
// host layer (src/cuda/host_launch.hpp).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/decode_layout.hpp"
#include "core/kernel_geometry.hpp"
#include "core/problem.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_dispatch.hpp"
#include "cuda/host_launch.hpp"
#include "cuda/sm90/decode/decode_api.hpp"
#include "cuda/sm90/decode/decode_params.hpp"
#include "cuda/sm90/decode/decode_trace.cuh"
#include "cuda/sm90/kernel_table.hpp"

namespace blasst::sm90::decode {

namespace {

using detail::ResolvedDecode;
constexpr const char* kKernel = "the CUDA decode kernel";

// CTAs per SM of an instance, cached per device (the occupancy query is not free on the host).
int ctas_per_sm(const DecodeKernel& k, int dev) {
  static std::mutex mu;
  static std::vector<std::pair<std::pair<int (*)(), int>, int>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& e : cache)
      if (e.first.first == k.occupancy && e.first.second == dev) return e.second;
  }
  const int n = std::max(k.occupancy(), 1);
  std::lock_guard<std::mutex> lock(mu);
  cache.push_back({{k.occupancy, dev}, n});
  return n;
}

// The kernels' limits (CUTLASS can_implement), each an Error naming the argument, before any
// CUDA call (also for the staged host path), never a silent fallback.
void can_implement(const DecodeProblem& p, const ResolvedDecode& r, const SkipConfig& skip) {
  if (r.dtype != DType::bf16 && r.dtype != DType::f16)
    throw Error(std::string("q: ") + kKernel + " supports " + decode_dtypes() + ", got " + to_string(r.dtype));
  if (!decode_has(r.dtype, static_cast<int>(r.d)))
    throw Error(std::string("q: ") + kKernel + " supports head dim d = " + decode_head_dims() + ", got " +
                std::to_string(r.d));
  if (r.dv != r.d) throw Error(std::string("v_cache: ") + kKernel + " needs dv == d, got dv = " + std::to_string(r.dv));
  const std::int64_t rows = r.group * r.q_len;
  if (rows > detail::kDecodeMaxRows)
    throw Error(std::string("q: ") + kKernel + " handles g * q_len <= " + std::to_string(detail::kDecodeMaxRows) +
                " query rows per KV head, got g = " + std::to_string(r.group) + ", q_len = " + std::to_string(r.q_len));
  if (r.paged && (r.page_size & (r.page_size - 1)) != 0)
    throw Error(std::string("k_cache: ") + kKernel + " needs a power-of-two page_size, got " +
                std::to_string(r.page_size));
  for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k_cache, "k_cache"}, {&p.v_cache, "v_cache"}})
    detail::check_strides_multiple(*t, name, 8, kKernel, "16-byte rows");
  if (p.out.dtype != DType::f32 && p.out.dtype != DType::f64 && p.out.dtype != r.dtype)
    throw Error(std::string("out: dtype ") + to_string(p.out.dtype) + " is not supported by " + kKernel +
                " (q's dtype, f32 or f64)");
  if (skip.enabled) {
    validate(skip);
    if (skip.vote.tile_keys != kTileKeys)
      throw Error(std::string("skip.vote.tile_keys: ") + kKernel + " uses " + std::to_string(kTileKeys) +
                  "-key tiles, got " + std::to_string(skip.vote.tile_keys));
  }
  if (skip.screen.margin != ScreenMargin::off)  // SPEC §2b: modelled by the CPU reference only
    throw Error(std::string("skip.screen.margin: ") + kKernel + " does not implement the FP8 screen, got " +
                to_string(skip.screen.margin));
  if (skip.vote.split_tiles < 0)
    throw Error("skip.vote.split_tiles must be >= 0, got " + std::to_string(skip.vote.split_tiles));
  if (r.batch > 65535 || r.hk > 65535)
    throw Error(std::string("q: batch and KV heads must be <= 65535 for ") + kKernel);
}

// What one call runs: the instance, the threshold rule and the split layout.
struct Plan {
  sm90::DecodeKernel kernel;
  SkipThreshold threshold;
  bool seeded = false;
  int mtiles = 1;
  std::int64_t rows = 0, split_tiles = 1, num_splits = 1;
};

Plan plan(const ResolvedDecode& r, const SkipConfig& skip, Warps warps) {
  Plan pl;
  pl.rows = r.group * r.q_len;
  pl.threshold = make_skip_threshold(skip);
  // max-first order in split-KV decode = seeded splits (SPEC §2a): the skip instance runs even when
  // no sequence can skip (lambda >= 1), so its statistics count deltas against the seeds.
  pl.seeded = skip.enabled && skip.vote.order == VisitOrder::max_first;
  const bool use_skip = pl.threshold.can_skip(r.max_k_len) || pl.seeded;
  pl.mtiles = pl.rows <= 16 ? 1 : 4;
  const KernelVariant v = use_skip ? KernelVariant::skip : KernelVariant::dense;
  int dev = 0;
  BLASST_CUDA_CHECK(cudaGetDevice(&dev));
  const std::int64_t max_tiles = (r.max_k_len + kTileKeys - 1) / kTileKeys;
  // The instance family: the 4-warp kernel (two CTAs per SM, d = 128 and one m-tile) when the
  // table has it and the call has at least kFourWarpMinTilesPerCta tiles for each of 2 x SMs
  // CTAs (then a second resident CTA has a run of its own, long against its pipeline fill and
  // the merge); else the 8-warp one. At 132 SMs and Hk = 8: B = 8 from 8448 keys, B = 1 from 66k.
  // (The threshold is a first guess, to be set from bench_decode.py --variants.)
  const DecodeKernel four = find_decode_kernel(r.dtype, static_cast<int>(r.d), v, pl.mtiles, 4);
  bool use_four = false;
  if (four.launch != nullptr) {
    if (warps == Warps::four) use_four = true;
    else if (warps == Warps::automatic)
      use_four = r.batch * r.hk * max_tiles >= std::int64_t{2} * detail::multiprocessor_count(dev) * kFourWarpMinTilesPerCta;
  }
  pl.kernel = use_four ? four : find_decode_kernel(r.dtype, static_cast<int>(r.d), v, pl.mtiles, 8);
  if (pl.kernel.launch == nullptr)
    throw Error(std::string("no CUDA decode kernel instance for ") + to_string(r.dtype) + ", d = " +
                std::to_string(r.d) + ", " + to_string(v) + ", " + std::to_string(pl.mtiles) +
                " m-tiles (src/cuda/sm90/kernel_table.inc)");
  pl.split_tiles = skip.vote.split_tiles;
  if (pl.split_tiles == 0)
    pl.split_tiles = detail::decode_split_tiles(r.batch, r.hk, max_tiles, detail::multiprocessor_count(dev), ctas_per_sm(pl.kernel, dev));
  pl.split_tiles = std::max<std::int64_t>(pl.split_tiles, 1);
  pl.num_splits = std::max<std::int64_t>((max_tiles + pl.split_tiles - 1) / pl.split_tiles, 1);
  if (pl.num_splits > 65535)
    throw Error("skip.vote.split_tiles: too many splits (" + std::to_string(pl.num_splits) + ")");
  return pl;
}

bool wants_stats(const SkipStats* stats, const RunOptions& opt) {
  return stats != nullptr && (opt.collect_stats || opt.collect_histogram || opt.record_deltas);
}

std::size_t partial_rows(const ResolvedDecode& r, const Plan& pl) {
  return static_cast<std::size_t>(r.batch * r.hk * pl.num_splits * pl.rows);
}

// The merge's flags, one per split of every (sequence, KV head) (decode_merge.cuh).
std::size_t split_flags(const ResolvedDecode& r, const Plan& pl) {
  return static_cast<std::size_t>(r.batch * r.hk * pl.num_splits);
}

// A fresh epoch per call, the value of a raised flag (decode_merge.cuh): never 0, a lowered flag
// (in 2^64 - 1 calls).
unsigned long long next_epoch() {
  static std::atomic<unsigned long long> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

// The call's scratch memory blocks, in the order run() takes them: partial O, partial LSE, the
// merge's flags, then the statistics counters (stats: counted; hist: with the delta histograms).
std::array<std::size_t, 4> workspace_blocks(const ResolvedDecode& r, const Plan& pl, bool stats, bool hist) {
  const std::size_t part_rows = partial_rows(r, pl);
  return {part_rows * static_cast<std::size_t>(r.d) * sizeof(float), part_rows * sizeof(float),
          split_flags(r, pl) * sizeof(unsigned long long), stats ? detail::StatCounters::bytes(r.hk, hist) : 0};
}

std::size_t workspace_need(const ResolvedDecode& r, const Plan& pl, bool stats, bool hist) {
  const auto b = workspace_blocks(r, pl, stats, hist);
  return detail::Workspace::bytes_for({b[0], b[1], b[2], b[3]});
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

CUtensorMapDataType tensor_map_type(DType t) {
  switch (t) {
    case DType::bf16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case DType::f16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    default: throw Error(std::string("k_cache: no tensor-map type for dtype ") + to_string(t));
  }
}

// K or V cache [S0, S1, Hk, d] (S0 = sequences or pages, S1 = keys or page slots, any 16-byte
// multiple strides, e.g. [B, L, Hk, d] or a head-major [B, Hk, L, d] view) as a 4-D tensor map
// {d, S1, Hk, S0} with {64, box_rows, 1, 1} boxes and the 128B swizzle. Rows past S1 read as zeros.
// L2 promotion 128 B, the box row: 256 B (each first half-row fetching the second half that the
// next box requests anyway) ran the L2 at 91 % for 81 % of DRAM (ncu, B = 8, 32k) and cost 6-7 %:
// 270.7 -> 252.4-253.1 us at B = 8, 32k; 2053 -> 1928 us at B = 64; 41.1 -> 40.0 us at B = 1
// (bench/RESULTS.md 2026-12-04; none and 64 B measured the same as 128 B).
bool make_kv_map(CUtensorMap* map, const Tensor& t, int box_rows) {
  EncodeTiled enc = encode_tiled();
  if (!enc) return false;
  if (t.shape[3] % 64 != 0) return false;
  for (int i = 0; i < 3; ++i)
    if (t.stride[i] <= 0 || t.shape[i] >= (std::int64_t{1} << 31)) return false;
  const std::int64_t esz = static_cast<std::int64_t>(dtype_size(t.dtype));
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(t.shape[3]), static_cast<cuuint64_t>(t.shape[1]),
                              static_cast<cuuint64_t>(t.shape[2]), static_cast<cuuint64_t>(t.shape[0])};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(t.stride[1] * esz), static_cast<cuuint64_t>(t.stride[2] * esz),
                                 static_cast<cuuint64_t>(t.stride[0] * esz)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  return enc(map, tensor_map_type(t.dtype), 4, t.data, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The K and V tensor maps of a call, with boxes of at most the instance's K slot (4 warps: 64-key
// half tiles; its V tiles take two boxes) and at most a page: false when a map cannot describe the
// cache (the call then loads by cp.async). run() and tensor_map_loads() both ask here.
bool make_kv_maps(const DecodeProblem& p, const ResolvedDecode& r, const Plan& pl, CUtensorMap* k_map,
                  CUtensorMap* v_map, int* box_rows_out) {
  const int box_rows = static_cast<int>(std::min<std::int64_t>(
      r.paged ? std::min<std::int64_t>(r.page_size, kTileKeys) : kTileKeys, pl.kernel.load_box_keys()));
  if (box_rows < 8 || !make_kv_map(k_map, p.k_cache, box_rows) || !make_kv_map(v_map, p.v_cache, box_rows))
    return false;
  *box_rows_out = box_rows;
  return true;
}

#ifdef BLASST_DECODE_TRACE
// Trace builds only: the kernel's per-CTA timer stamps appended to the file named by
// BLASST_DECODE_TRACE as CSV lines "tag,cta,b,h,split,t0,..." (tag from BLASST_DECODE_TRACE_TAG).
// Synchronises.
void append_trace(const char* file, const unsigned long long* dev, std::size_t n_ctas, dim3 grid,
                  cudaStream_t stream) {
  std::vector<unsigned long long> tr(n_ctas * kTracePoints);
  BLASST_CUDA_CHECK(cudaMemcpyAsync(tr.data(), dev, tr.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                    stream));
  BLASST_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::FILE* f = std::fopen(file, "a");
  if (f == nullptr) throw Error(std::string("BLASST_DECODE_TRACE: cannot open ") + file);
  const char* tag = std::getenv("BLASST_DECODE_TRACE_TAG");
  for (std::size_t c = 0; c < n_ctas; ++c) {
    // CTA index = (z * gridDim.y + y) * gridDim.x + x; grid (Hk, splits, B)
    const std::size_t x = c % grid.x, y = (c / grid.x) % grid.y, z = c / (std::size_t{grid.x} * grid.y);
    std::fprintf(f, "%s,%zu,%zu,%zu,%zu", tag ? tag : "", c, z, x, y);
    for (int k = 0; k < kTracePoints; ++k) std::fprintf(f, ",%llu", tr[c * kTracePoints + k]);
    std::fprintf(f, "\n");
  }
  std::fclose(f);
}
#endif

// Host tensors with opt.device == cuda: every input's span copied to the device (strides kept),
// run, out/lse copied back, synchronised.
void run_staged(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt, SkipStats* stats,
                LoadPath loads, Warps warps) {
  const ResolvedDecode r = detail::validate_decode(p, DeviceKind::cpu);  // checks the host problem itself
  can_implement(p, r, skip);
  detail::DeviceStaging staging(static_cast<cudaStream_t>(opt.stream));
  DecodeProblem d = p;
  d.q = staging.upload(p.q);
  d.k_cache = staging.upload(p.k_cache);
  d.v_cache = staging.upload(p.v_cache);
  d.out = staging.upload(p.out);
  d.lse = staging.upload(p.lse);
  if (p.page_table)  // rows of page_table_stride entries; the last row's columns end the table
    d.page_table = staging.upload(p.page_table,
                                  static_cast<std::size_t>((r.batch - 1) * p.page_table_stride + r.pages_per_seq));
  if (p.seqlens_k) {
    d.seqlens_k = staging.upload(p.seqlens_k, static_cast<std::size_t>(r.batch));
    d.max_seqlen_k = r.max_k_len;
  }
  RunOptions o = opt;
  o.device = DeviceKind::cuda;
  run(d, skip, o, stats, loads, warps);
  staging.download(p.out, d.out);
  staging.download(p.lse, d.lse);
  staging.synchronize();
}

// The checks of a call on device tensors (run() and a DecodePlan): the problem, the kernels'
// limits, 16-byte aligned q / k / v.
ResolvedDecode check_device_call(const DecodeProblem& p, const SkipConfig& skip) {
  const ResolvedDecode r = detail::validate_decode(p, DeviceKind::cuda);
  can_implement(p, r, skip);
  detail::check_aligned16(p.q, "q", kKernel);
  detail::check_aligned16(p.k_cache, "k_cache", kKernel);
  detail::check_aligned16(p.v_cache, "v_cache", kKernel);
  return r;
}

// The split-KV scratch blocks carved from ws in workspace_blocks' order: partial O, partial LSE,
// the merge's flags.
struct SplitScratch {
  float* o_part;
  float* lse_part;
  unsigned long long* flags;
};
SplitScratch take_split_scratch(detail::Workspace& ws, const ResolvedDecode& r, const Plan& pl) {
  const std::size_t part_rows = partial_rows(r, pl);
  SplitScratch sc;
  sc.o_part = ws.take<float>(part_rows * static_cast<std::size_t>(r.d));
  sc.lse_part = ws.take<float>(part_rows);
  sc.flags = ws.take<unsigned long long>(split_flags(r, pl));
  return sc;
}

// The kernel's parameters of a call: the problem's addresses and strides, the plan's layout and
// threshold, the scratch blocks, the caches' tensor maps (LoadPath::automatic where a map
// describes the cache).
Params launch_params(const DecodeProblem& p, const ResolvedDecode& r, const Plan& pl, const SplitScratch& sc,
                     const detail::StatCounters& cnt, LoadPath loads) {
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
  kp.q_len = static_cast<int>(r.q_len); kp.rows = static_cast<int>(pl.rows);
  kp.causal = r.mask == MaskKind::causal ? 1 : 0;
  kp.scale_log2 = static_cast<float>(r.scale * 1.4426950408889634);
  kp.threshold = pl.threshold;
  kp.split_tiles = static_cast<int>(pl.split_tiles); kp.num_splits = static_cast<int>(pl.num_splits);
  kp.seeded = pl.seeded ? 1 : 0;
  kp.o_part = sc.o_part; kp.lse_part = sc.lse_part;
  kp.split_flags = sc.flags;
  kp.split_epoch = next_epoch();
  kp.out = p.out.data;
  kp.out_dtype = p.out.dtype;
  kp.o_sb = p.out.stride[0]; kp.o_st = p.out.stride[1]; kp.o_sh = p.out.stride[2];
  if (p.lse.defined()) {
    kp.lse = p.lse.data;
    kp.lse_dtype = p.lse.dtype;
    kp.l_sb = p.lse.stride[0]; kp.l_sh = p.lse.stride[1]; kp.l_st = p.lse.stride[2];
  }
  kp.visited = cnt.visited;
  kp.skipped = cnt.skipped;
  kp.hist = cnt.hist;
  // Loads: tensor-map boxes through the copy engine where a map describes the cache, else (or
  // when asked) 16-byte cp.async per thread.
  kp.tma = 0;
  if (loads == LoadPath::automatic && make_kv_maps(p, r, pl, &kp.tmk, &kp.tmv, &kp.tma_box_rows)) kp.tma = 1;
  return kp;
}

}  // namespace

void run(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt, SkipStats* stats, LoadPath loads,
         Warps warps) {
  if (p.q.device == DeviceKind::cpu && opt.device == DeviceKind::cuda)
    return run_staged(p, skip, opt, stats, loads, warps);
  const ResolvedDecode r = check_device_call(p, skip);
  auto stream = static_cast<cudaStream_t>(opt.stream);
  const Plan pl = plan(r, skip, warps);

  const bool want_stats = wants_stats(stats, opt);
  const bool want_hist = stats != nullptr && opt.collect_histogram;
  detail::Workspace ws(opt, stream, "decode");
  if (stats != nullptr && ws.capturing())
    throw Error("decode: statistics need a synchronisation and cannot be collected during stream capture");
  const dim3 grid(static_cast<unsigned>(r.hk), static_cast<unsigned>(pl.num_splits), static_cast<unsigned>(r.batch));
  std::size_t need = workspace_need(r, pl, want_stats, want_hist);
#ifdef BLASST_DECODE_TRACE
  // Diagnostic timeline (trace builds, BLASST_DECODE_TRACE=<file>, bench/decode/trace_decode.py).
  const char* trace_file = std::getenv("BLASST_DECODE_TRACE");
  if (trace_file != nullptr && *trace_file == '\0') trace_file = nullptr;
  if (trace_file != nullptr && ws.capturing()) throw Error("BLASST_DECODE_TRACE: cannot trace during stream capture");
  const std::size_t n_ctas = static_cast<std::size_t>(grid.x) * grid.y * grid.z;
  if (trace_file) need += detail::Workspace::bytes_for({n_ctas * kTracePoints * sizeof(unsigned long long)});
#endif
  ws.reserve(need);  // one pool allocation for the blocks below
  const SplitScratch sc = take_split_scratch(ws, r, pl);
  detail::StatCounters cnt;
  if (want_stats) cnt = detail::StatCounters::take(ws, r.hk, want_hist, stream);

  Params kp = launch_params(p, r, pl, sc, cnt, loads);
#ifdef BLASST_DECODE_TRACE
  kp.trace = trace_file ? ws.take<unsigned long long>(n_ctas * kTracePoints) : nullptr;
  if (kp.trace) BLASST_CUDA_CHECK(cudaMemsetAsync(kp.trace, 0, n_ctas * kTracePoints * sizeof(unsigned long long), stream));
#endif
  pl.kernel.launch(kp, grid, stream);

#ifdef BLASST_DECODE_TRACE
  if (trace_file) append_trace(trace_file, kp.trace, n_ctas, grid, stream);
#endif

  if (stats) {
    SkipStats& st = *stats;
    st = SkipStats{};
    const VisitOrder order = pl.seeded ? VisitOrder::max_first : VisitOrder::natural;
    // A seeded layout is reported even with one split: the reference then seeds that split too.
    st.granularity = detail::decode_vote_granularity(r.group, r.q_len,
                                                     (pl.num_splits > 1 || pl.seeded) ? pl.split_tiles : 0, order);
    st.counted_at = detail::decode_counted_at(r.group, r.q_len, pl.split_tiles, order);
    // Per-sequence lambda (host lengths; read them when the capture-safe path skipped that).
    const std::vector<std::int64_t> k_len =
        r.k_len.empty() ? detail::read_lengths(p.seqlens_k, r.batch, false, stream) : r.k_len;
    for (auto L : k_len)  // as the reference: no keys -> infinite lambda, skipping off -> 1
      st.lambda.push_back(!skip.enabled ? 1.0 : L >= 1 ? resolve_lambda(skip, L) : HUGE_VAL);
    if (want_stats) cnt.read_into(st, stream);
  }
}

std::size_t workspace_bytes(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt, bool stats,
                            Warps warps) {
  const bool host = p.q.device == DeviceKind::cpu;
  if (host && opt.device != DeviceKind::cuda)
    throw Error("q: host tensor on the CUDA path; set RunOptions::device = cuda to stage it");
  const ResolvedDecode r = detail::validate_decode(p, host ? DeviceKind::cpu : DeviceKind::cuda);
  can_implement(p, r, skip);
  return workspace_need(r, plan(r, skip, warps), stats, opt.collect_histogram);
}

FlagsRegion split_flags_region(const DecodeProblem& p, const SkipConfig& skip, Warps warps) {
  const ResolvedDecode r = detail::validate_decode(p, p.q.device);
  can_implement(p, r, skip);
  const Plan pl = plan(r, skip, warps);
  if (pl.num_splits == 1) return {};
  const auto b = workspace_blocks(r, pl, false, false);
  return {detail::Workspace::bytes_for({b[0], b[1]}), b[2]};
}

bool tensor_map_loads(const DecodeProblem& p, const SkipConfig& skip, Warps warps) {
  const ResolvedDecode r = detail::validate_decode(p, p.q.device);
  can_implement(p, r, skip);
  CUtensorMap k_map, v_map;
  int box_rows = 0;
  return make_kv_maps(p, r, plan(r, skip, warps), &k_map, &v_map, &box_rows);
}

int planned_warps(const DecodeProblem& p, const SkipConfig& skip, Warps warps) {
  const ResolvedDecode r = detail::validate_decode(p, p.q.device);
  can_implement(p, r, skip);
  return plan(r, skip, warps).kernel.warps;
}

}  // namespace blasst::sm90::decode

namespace blasst::detail {

// A planned call (DecodePlan): the parameters run() would build, kept with their grid, instance
// and scratch; a run changes q, out, lse and the merge's epoch only.
struct CudaDecodePlan {
  sm90::decode::Params kp{};
  dim3 grid;
  sm90::DecodeKernel kernel;
  void* owned = nullptr;  // scratch the plan allocated (not the caller's RunOptions::workspace)
  int device = 0;
  bool lse = false;
  ~CudaDecodePlan() {
    if (owned != nullptr) cudaFree(owned);  // no throw from a destructor; a failure here is the driver's
  }
};

CudaDecodePlan* cuda_decode_plan(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt) {
  using namespace sm90::decode;
  const ResolvedDecode r = check_device_call(p, skip);
  const Plan pl = plan(r, skip, Warps::automatic);
  const std::size_t need = workspace_need(r, pl, false, false);
  auto out = std::make_unique<CudaDecodePlan>();
  BLASST_CUDA_CHECK(cudaGetDevice(&out->device));
  RunOptions scratch;
  scratch.workspace = opt.workspace;
  scratch.workspace_bytes = opt.workspace_bytes;
  if (opt.workspace != nullptr && opt.workspace_bytes < need)
    throw Error("RunOptions::workspace: " + std::to_string(opt.workspace_bytes) + " bytes given, the decode plan needs " +
                std::to_string(need) + " (decode_workspace_bytes)");
  if (opt.workspace == nullptr && need > 0) {
    BLASST_CUDA_CHECK(cudaMalloc(&out->owned, need));
    scratch.workspace = out->owned;
    scratch.workspace_bytes = need;
  }
  Workspace ws(scratch, nullptr, "decode plan");  // carved as run() carves the pool's block
  out->kp = launch_params(p, r, pl, take_split_scratch(ws, r, pl), StatCounters{}, LoadPath::automatic);
  out->grid = dim3(static_cast<unsigned>(r.hk), static_cast<unsigned>(pl.num_splits), static_cast<unsigned>(r.batch));
  out->kernel = pl.kernel;
  out->lse = p.lse.defined();
  return out.release();
}

void cuda_decode_plan_run(CudaDecodePlan& plan, const void* q, void* out, void* lse, void* stream) {
  int dev = 0;
  BLASST_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev != plan.device)
    throw Error("DecodePlan::run: the current device is " + std::to_string(dev) + ", the plan's " +
                std::to_string(plan.device));
  if (reinterpret_cast<std::uintptr_t>(q) % 16 != 0) throw Error("DecodePlan::run: q must be 16-byte aligned");
  plan.kp.q = q;
  plan.kp.out = out;
  if (plan.lse) plan.kp.lse = lse;
  plan.kp.split_epoch = sm90::decode::next_epoch();
  plan.kernel.launch(plan.kp, plan.grid, static_cast<cudaStream_t>(stream));
}

void cuda_decode_plan_free(CudaDecodePlan* plan) noexcept { delete plan; }

void cuda_decode(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt, SkipStats* stats) {
  sm90::decode::run(p, skip, opt, stats, sm90::decode::LoadPath::automatic);
}

std::size_t cuda_decode_workspace_bytes(const DecodeProblem& p, const SkipConfig& skip, const RunOptions& opt,
                                        bool stats) {
  return sm90::decode::workspace_bytes(p, skip, opt, stats);
}

}  // namespace blasst::detail
