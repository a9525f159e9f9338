// Backward benchmark (SPEC §8, §9): TFLOP/s of blasst::attention_backward (the sm_90a kernels
// of src/cuda/sm90/backward/) on device tensors.
//   FLOPs = 2.5 x forward FLOPs (the FlashAttention convention), forward = 4 B H Lq Lk d, halved
//   for causal (Lq = Lk here). A skip run is quoted as dense-equivalent TFLOP/s (dense FLOPs /
//   skip time) and as speedup over our dense backward on the same tensors.
// Inputs: i.i.d. normal q, k, v, O, dO in the 16-bit dtype (never zeros), LSE = ln(Lk) + 1 per row
// (a plausible magnitude: P stays below 1). Skip sets: synthetic, each visited (vote group, key
// tile) pair skipped with probability s by a fixed hash, the group's first tile (tile 0) always
// kept as the forward's vote does (--set iid, the default); or, --set window, the shape of an llm
// causal set under max-first (sink and locality): a group keeps tile 0 and the W tiles before its
// own (last visible, causal; full mask: the W tiles on each side of the tile holding its rows), W
// the smallest window whose skipped fraction is at most s; the same set for every head; --set
// heavy: that set with 8 heavy-hitter tiles kept by every group that sees them. The
// achieved fraction is printed. The host set is uploaded by
// every call (its bits / 8 bytes: 0.5 MB at B = 4, H = 32, L = 16k), which the time includes.
// Timing: CUDA events around each call on one stream, 3 warm-up calls, median of --iters (20).
// Scratch from RunOptions::workspace allocated once (attention_backward_workspace_bytes).
//
//   bench_backward                  the default table (B 1, 2, 4 x H 32, 40 x L 8k, 16k x d 64,
//                                   128 x full, causal x dense, 50, 70, 90 %)
//   bench_backward --quick          B 1, H 32, L 8k only
//   bench_backward --b 2 --h 32 --l 16384 --d 128 --causal 1 --sparsity 0.7 --iters 20
//   --hk 8                          GQA: 8 KV heads (the H column then reads 32/8)
//   --set iid|window|heavy          the synthetic skip set (above; default iid)
//   --kernel mma_sync|wgmma|both    the main kernel (kernel_table.inc's backward kernels; default
//                                   both, each row naming it; the library runs mma_sync today)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_dispatch.hpp"  // detail::cuda_attention_backward_on: a named main kernel

#include "blasst/blasst.hpp"

namespace {

#define CHECK(expr)                                                                              \
  do {                                                                                           \
    cudaError_t e_ = (expr);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #expr, __FILE__, __LINE__,            \
                   cudaGetErrorString(e_));                                                      \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

using i64 = std::int64_t;

__device__ std::uint32_t hash32(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return std::uint32_t(x);
}

// Approximately normal (sum of 4 uniforms, centred, unit variance) 16-bit values.
template <class T>
__global__ void fill_normal(T* p, i64 n, std::uint64_t seed) {
  for (i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += i64(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int k = 0; k < 4; ++k) s += float(hash32(seed * 0x9E3779B97F4A7C15ull + std::uint64_t(i) * 4 + k)) * 2.3283064e-10f;
    p[i] = T((s - 2.f) * 1.7320508f);
  }
}
__global__ void fill_const(float* p, i64 n, float v) {
  for (i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += i64(gridDim.x) * blockDim.x) p[i] = v;
}

std::uint64_t host_hash(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// --set: i.i.d. pairs, the llm window shape, or that and 8 heavy-hitter tiles (the file comment).
enum class SetKind { iid, window, heavy };

struct Config {
  i64 B = 1, H = 32, L = 8192, d = 128;
  i64 Hk = 0;  // KV heads (GQA / MQA); 0: H
  bool causal = false;
  double sparsity = 0;  // 0: dense (no skip set)
  SetKind set = SetKind::iid;  // --set
};

struct Result {
  double ms = 0, tflops = 0, achieved = 0;
};

// Whether the window set of half-width w keeps tile t of group g (n_vis visible tiles); with
// SetKind::heavy also the 8 heavy-hitter tiles (tiles T (i + 1) / 9, i < 8, of T), which every group
// that sees them keeps, as the llm workload's heavy-hitter keys are kept.
bool window_keeps(const Config& c, i64 g, i64 t, i64 n_vis, i64 w) {
  if (t == 0) return true;
  if (c.set == SetKind::heavy) {
    const i64 tiles = (c.L + 127) / 128;
    for (i64 i = 0; i < 8; ++i)
      if (t == tiles * (i + 1) / 9) return true;
  }
  const i64 own = c.causal ? n_vis - 1 : (g * 64) / 128;
  return c.causal ? own - t <= w : std::llabs(own - t) <= w;
}

// Synthetic skip set over the visited pairs (see the file comment); returns the achieved fraction.
double make_set(const Config& c, blasst::SkipSet& set) {
  blasst::VoteGranularity vote;
  vote.rows = 64;
  vote.tile_keys = 128;
  const i64 groups = (c.L + 63) / 64, tiles = (c.L + 127) / 128;
  set.resize(vote, c.B, c.H, groups, tiles);
  auto visible = [&](i64 g) { return c.causal ? std::min(c.L - 1, (g + 1) * 64 - 1) / 128 + 1 : tiles; };
  // Window: the smallest w whose skipped share (one head: every head has the same set) is <= s.
  i64 w = 0;
  if (c.set != SetKind::iid) {
    auto skipped_share = [&](i64 width) {
      i64 vis = 0, skip = 0;
      for (i64 g = 0; g < groups; ++g) {
        const i64 n_vis = visible(g);
        for (i64 t = 0; t < n_vis; ++t) vis += 1, skip += window_keeps(c, g, t, n_vis, width) ? 0 : 1;
      }
      return vis ? double(skip) / double(vis) : 0.0;
    };
    i64 lo = 0, hi = tiles;  // skipped_share(tiles) == 0 <= s
    while (lo < hi) {
      const i64 mid = (lo + hi) / 2;
      if (skipped_share(mid) <= c.sparsity) hi = mid;
      else lo = mid + 1;
    }
    w = lo;
  }
  i64 visited = 0, skipped = 0;
  // s = 1 as the largest value (2^64 itself does not convert: it skipped nothing, silently).
  const std::uint64_t thresh =
      c.sparsity >= 1.0 ? ~std::uint64_t(0) : std::uint64_t(c.sparsity * 18446744073709551616.0);
  for (i64 b = 0; b < c.B; ++b)
    for (i64 h = 0; h < c.H; ++h)
      for (i64 g = 0; g < groups; ++g) {
        const i64 n_vis = visible(g);
        for (i64 t = 0; t < n_vis; ++t) {
          ++visited;
          if (t == 0) continue;
          const bool skip = c.set != SetKind::iid ? !window_keeps(c, g, t, n_vis, w)
                                     : host_hash(std::uint64_t(((b * c.H + h) * groups + g) * tiles + t) + 12345) < thresh;
          if (skip) {
            set.set(b, h, g, t);
            ++skipped;
          }
        }
      }
  return visited ? double(skipped) / double(visited) : 0.0;
}

Result run(const Config& c, blasst::DType dtype, int iters, blasst::sm90::BackwardKernel kernel) {
  const i64 hk = c.Hk > 0 ? c.Hk : c.H;
  const i64 n = c.B * c.L * c.H * c.d, n_kv = c.B * c.L * hk * c.d, nl = c.B * c.H * c.L;
  const std::size_t esz = 2;
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float* lse;
  for (void** p : {&q, &o, &dout, &dq}) CHECK(cudaMalloc(p, std::size_t(n) * esz));
  for (void** p : {&k, &v, &dk, &dv}) CHECK(cudaMalloc(p, std::size_t(n_kv) * esz));
  CHECK(cudaMalloc(&lse, std::size_t(nl) * sizeof(float)));
  int seed = 1;
  for (void* p : {q, k, v, o, dout}) {
    const i64 count = p == k || p == v ? n_kv : n;
    if (dtype == blasst::DType::bf16) fill_normal<__nv_bfloat16><<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), count, seed++);
    else fill_normal<__half><<<1024, 256>>>(static_cast<__half*>(p), count, seed++);
    CHECK(cudaGetLastError());
  }
  fill_const<<<1024, 256>>>(lse, nl, float(std::log(double(c.L)) + 1.0));
  CHECK(cudaGetLastError());

  using blasst::Tensor;
  const auto dev = blasst::DeviceKind::cuda;
  blasst::AttentionBackwardProblem p;
  p.q = Tensor::contiguous(q, dtype, {c.B, c.L, c.H, c.d}, dev);
  p.k = Tensor::contiguous(k, dtype, {c.B, c.L, hk, c.d}, dev);
  p.v = Tensor::contiguous(v, dtype, {c.B, c.L, hk, c.d}, dev);
  p.out = Tensor::contiguous(o, dtype, {c.B, c.L, c.H, c.d}, dev);
  p.dout = Tensor::contiguous(dout, dtype, {c.B, c.L, c.H, c.d}, dev);
  p.lse = Tensor::contiguous(lse, blasst::DType::f32, {c.B, c.H, c.L}, dev);
  p.dq = Tensor::contiguous(dq, dtype, {c.B, c.L, c.H, c.d}, dev);
  p.dk = Tensor::contiguous(dk, dtype, {c.B, c.L, hk, c.d}, dev);
  p.dv = Tensor::contiguous(dv, dtype, {c.B, c.L, hk, c.d}, dev);
  p.mask = c.causal ? blasst::MaskKind::causal : blasst::MaskKind::full;

  blasst::SkipSet set;
  blasst::SkipConfig skip;  // off: the set (if any) is the block mask
  Result r;
  const blasst::SkipSet* setp = nullptr;
  if (c.sparsity > 0) {
    r.achieved = make_set(c, set);
    skip.vote = set.vote;
    setp = &set;
  }
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  blasst::RunOptions opt;
  opt.stream = stream;
  opt.workspace_bytes = blasst::attention_backward_workspace_bytes(p, skip, opt, setp);
  void* ws = nullptr;
  if (opt.workspace_bytes) CHECK(cudaMalloc(&ws, opt.workspace_bytes));
  opt.workspace = ws;

  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  auto call = [&] { blasst::detail::cuda_attention_backward_on(p, skip, opt, setp, kernel); };
  for (int i = 0; i < 3; ++i) call();
  CHECK(cudaStreamSynchronize(stream));
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaEventRecord(e0, stream));
    call();
    CHECK(cudaEventRecord(e1, stream));
    CHECK(cudaEventSynchronize(e1));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  r.ms = ms[ms.size() / 2];
  const double fwd = 4.0 * double(c.B) * double(c.H) * double(c.L) * double(c.L) * double(c.d) * (c.causal ? 0.5 : 1.0);
  r.tflops = 2.5 * fwd / (r.ms * 1e-3) / 1e12;

  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  CHECK(cudaStreamDestroy(stream));
  if (ws) CHECK(cudaFree(ws));
  for (void* ptr : {q, k, v, o, dout, dq, dk, dv}) CHECK(cudaFree(ptr));
  CHECK(cudaFree(lse));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<i64> Bs = {1, 2, 4}, Hs = {32, 40}, Ls = {8192, 16384}, ds = {64, 128};
  i64 hk_arg = 0;  // --hk: KV heads (0: as many as query heads)
  SetKind set_kind = SetKind::iid;
  std::vector<int> causals = {0, 1};
  std::vector<double> sps = {0, 0.5, 0.7, 0.9};
  blasst::DType dtype = blasst::DType::bf16;
  int iters = 20;
  using blasst::sm90::BackwardKernel;
  std::vector<BackwardKernel> kernels = {BackwardKernel::mma_sync, BackwardKernel::wgmma};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--quick") { Bs = {1}; Hs = {32}; Ls = {8192}; }
    else if (a == "--b") Bs = {std::atoll(next())};
    else if (a == "--h") Hs = {std::atoll(next())};
    else if (a == "--hk") hk_arg = std::atoll(next());
    else if (a == "--l") Ls = {std::atoll(next())};
    else if (a == "--d") ds = {std::atoll(next())};
    else if (a == "--causal") causals = {std::atoi(next())};
    else if (a == "--sparsity") {
      sps = {std::atof(next())};
      if (!(sps[0] >= 0.0 && sps[0] <= 1.0)) { std::fprintf(stderr, "--sparsity: in [0, 1], got %s\n", argv[i]); return 2; }
    }
    else if (a == "--set") {
      const std::string k = next();
      if (k == "iid") set_kind = SetKind::iid;
      else if (k == "window") set_kind = SetKind::window;
      else if (k == "heavy") set_kind = SetKind::heavy;
      else { std::fprintf(stderr, "--set: iid, window or heavy, got %s\n", k.c_str()); return 2; }
    }
    else if (a == "--iters") iters = std::max(1, std::atoi(next()));
    else if (a == "--dtype") dtype = blasst::parse_dtype(next());
    else if (a == "--kernel") {
      const std::string k = next();
      if (k == "mma_sync") kernels = {BackwardKernel::mma_sync};
      else if (k == "wgmma") kernels = {BackwardKernel::wgmma};
      else if (k != "both") { std::fprintf(stderr, "--kernel: mma_sync, wgmma or both, got %s\n", k.c_str()); return 2; }
    }
    else {
      std::printf("usage: bench_backward [--quick] [--b B] [--h H] [--hk Hk] [--l L] [--d 64|128] [--causal 0|1] "
                  "[--sparsity s] [--set iid|window|heavy] [--iters n] [--dtype bf16|f16] [--kernel mma_sync|wgmma|both]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (!blasst::cuda_available()) {
    std::fprintf(stderr, "no usable Hopper GPU\n");
    return 1;
  }
  std::printf("# blasst backward on %s, %s, median of %d (3 warm-up); FLOPs = 2.5 x 4 B H L^2 d (x 0.5 causal)\n",
              blasst::cuda_device_name().c_str(), blasst::to_string(dtype), iters);
  std::printf("%-8s %2s %5s %6s %4s %-6s %8s %8s %9s %10s %8s\n", "kernel", "B", "H", "L", "d", "mask", "target",
              "skipped", "ms", "TFLOP/s", "speedup");
  for (i64 d : ds)
    for (int causal : causals)
      for (i64 L : Ls)
        for (i64 H : Hs)
          for (i64 B : Bs)
            for (BackwardKernel kernel : kernels) {
              const char* kname = kernel == BackwardKernel::wgmma ? "wgmma" : "mma_sync";
              double dense_ms = 0;
              for (double s : sps) {
                Config c;
                c.B = B;
                c.H = H;
                c.Hk = hk_arg;
                const std::string heads = std::to_string(H) + (hk_arg > 0 ? "/" + std::to_string(hk_arg) : "");
                c.L = L;
                c.d = d;
                c.causal = causal != 0;
                c.sparsity = s;
                c.set = set_kind;
                try {
                  const Result r = run(c, dtype, iters, kernel);
                  if (s == 0) dense_ms = r.ms;
                  const std::string sp = dense_ms > 0 ? std::to_string(dense_ms / r.ms).substr(0, 5) + "x" : "-";
                  std::printf("%-8s %2lld %5s %6lld %4lld %-6s %7.0f%% %7.1f%% %9.3f %10.1f %8s\n", kname, (long long)B, heads.c_str(),
                              (long long)L, (long long)d, causal ? "causal" : "full", 100 * s, 100 * r.achieved, r.ms,
                              r.tflops, sp.c_str());
                  std::fflush(stdout);
                } catch (const blasst::Error& e) {
                  std::printf("%-8s %2lld %5s %6lld %4lld %-6s %7.0f%%  error: %s\n", kname, (long long)B, heads.c_str(),
                              (long long)L, (long long)d, causal ? "causal" : "full", 100 * s, e.what());
                }
              }
            }
  return 0;
}
