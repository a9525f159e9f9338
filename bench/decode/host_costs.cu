// Host cost of one call, without Python: how long blasst::decode and blasst::attention take to
// return on tiny problems (the GPU keeps up, so this is the host path), beside the CUDA runtime
// calls such a path is made of, each timed alone. Issue 18's host-overhead breakdown:
//   blasst_host_costs [calls]
// Prints one line per item: mean microseconds per call over `calls` calls (default 4000), the
// stream synchronised every 256 calls outside the timed region.
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "blasst/blasst.hpp"
#include "cuda/cuda_check.hpp"  // BLASST_CUDA_CHECK (throws blasst::Error)

namespace {

__global__ void empty_kernel() {}

struct BigParams {  // about the size of the decode kernel's parameters (two tensor maps and more)
  unsigned char bytes[640];
};
__global__ void empty_kernel_big(BigParams p) {
  if (p.bytes[0] == 255 && threadIdx.x == 1024) printf("never\n");
}

double time_us(int calls, cudaStream_t s, const std::function<void()>& f) {
  for (int i = 0; i < 64; ++i) f();
  BLASST_CUDA_CHECK(cudaStreamSynchronize(s));
  double total = 0;
  for (int done = 0; done < calls;) {
    const int n = std::min(256, calls - done);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    const auto t1 = std::chrono::steady_clock::now();
    total += std::chrono::duration<double, std::micro>(t1 - t0).count();
    BLASST_CUDA_CHECK(cudaStreamSynchronize(s));
    done += n;
  }
  return total / calls;
}

void* device_zeros(std::size_t bytes) {
  void* p = nullptr;
  BLASST_CUDA_CHECK(cudaMalloc(&p, bytes));
  BLASST_CUDA_CHECK(cudaMemset(p, 0, bytes));
  return p;
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 4000;
  if (!blasst::cuda_available()) {
    std::printf("no Hopper GPU: nothing measured\n");
    return 0;
  }
  cudaStream_t s = nullptr;
  BLASST_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto row = [&](const char* name, const std::function<void()>& f) {
    std::printf("%-44s %8.2f us\n", name, time_us(calls, s, f));
    std::fflush(stdout);
  };

  // ---- the runtime calls a host path is made of --------------------------------------------------
  int dev = 0;
  row("cudaGetDevice", [&] { BLASST_CUDA_CHECK(cudaGetDevice(&dev)); });
  row("cudaStreamIsCapturing", [&] {
    cudaStreamCaptureStatus c;
    BLASST_CUDA_CHECK(cudaStreamIsCapturing(s, &c));
  });
  row("cudaFuncSetAttribute (max dyn smem)",
      [&] { BLASST_CUDA_CHECK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000)); });
  row("launch empty kernel", [&] { empty_kernel<<<1, 32, 0, s>>>(); });
  BigParams bp{};
  row("launch empty kernel, 640-byte params", [&] { empty_kernel_big<<<1, 32, 0, s>>>(bp); });
  cudaMemPool_t pool;
  BLASST_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
  row("cudaMallocAsync + cudaFreeAsync (64 KiB)", [&] {
    void* p = nullptr;
    BLASST_CUDA_CHECK(cudaMallocAsync(&p, 65536, s));
    BLASST_CUDA_CHECK(cudaFreeAsync(p, s));
  });
  row("cudaMemsetAsync (64 B)", [&] {
    static void* p = device_zeros(256);
    BLASST_CUDA_CHECK(cudaMemsetAsync(p, 0, 64, s));
  });
  {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    BLASST_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    auto enc = reinterpret_cast<EncodeTiled>(f);
    void* base = device_zeros(1 << 20);
    row("cuTensorMapEncodeTiled (4-D, 128B swizzle)", [&] {
      CUtensorMap m;
      const cuuint64_t dims[4] = {128, 256, 8, 1};
      const cuuint64_t strides[3] = {8 * 128 * 2, 128 * 2, 256 * 8 * 128 * 2};
      const cuuint32_t box[4] = {64, 128, 1, 1}, es[4] = {1, 1, 1, 1};
      if (enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        std::exit(3);
    });
  }

  // ---- whole library calls on tiny problems (q_len 1, Hq 32, Hk 8, d 128, 256 keys) ------------
  const std::int64_t B = 1, L = 256, hq = 32, hk = 8, d = 128;
  const auto cuda = blasst::DeviceKind::cuda;
  const auto bf16 = blasst::DType::bf16;
  void* q = device_zeros(B * hq * d * 2);
  void* k = device_zeros(B * L * hk * d * 2);
  void* v = device_zeros(B * L * hk * d * 2);
  void* o = device_zeros(B * L * hq * d * 2);
  void* lse = device_zeros(B * hq * L * 4);
  blasst::RunOptions opt;
  opt.stream = s;
  const blasst::SkipConfig dense;
  const blasst::SkipConfig skip = blasst::SkipConfig::from_threshold(1e-3);

  blasst::DecodeProblem dp;
  dp.q = blasst::Tensor::contiguous(q, bf16, {B, 1, hq, d}, cuda);
  dp.k_cache = blasst::Tensor::contiguous(k, bf16, {B, L, hk, d}, cuda);
  dp.v_cache = blasst::Tensor::contiguous(v, bf16, {B, L, hk, d}, cuda);
  dp.out = blasst::Tensor::contiguous(o, bf16, {B, 1, hq, d}, cuda);
  row("blasst::decode dense", [&] { blasst::decode(dp, dense, opt); });
  row("blasst::decode skip (threshold 1e-3)", [&] { blasst::decode(dp, skip, opt); });
  blasst::DecodeProblem dpl = dp;
  dpl.lse = blasst::Tensor::contiguous(lse, blasst::DType::f32, {B, hq, 1}, cuda);
  row("blasst::decode dense + lse", [&] { blasst::decode(dpl, dense, opt); });
  {
    blasst::RunOptions given = opt;
    given.workspace_bytes = blasst::decode_workspace_bytes(dp, skip, opt);
    given.workspace = device_zeros(given.workspace_bytes + 256);
    row("blasst::decode skip, caller's workspace", [&] { blasst::decode(dp, skip, given); });
  }

  blasst::AttentionProblem ap;
  ap.q = blasst::Tensor::contiguous(o, bf16, {B, L, hq, d}, cuda);
  ap.k = blasst::Tensor::contiguous(k, bf16, {B, L, hk, d}, cuda);
  ap.v = blasst::Tensor::contiguous(v, bf16, {B, L, hk, d}, cuda);
  void* ao = device_zeros(B * L * hq * d * 2);
  ap.out = blasst::Tensor::contiguous(ao, bf16, {B, L, hq, d}, cuda);
  ap.mask = blasst::MaskKind::causal;
  row("blasst::attention dense (L 256, causal)", [&] { blasst::attention(ap, dense, opt); });
  row("blasst::attention skip (L 256, causal)", [&] { blasst::attention(ap, skip, opt); });
  BLASST_CUDA_CHECK(cudaStreamSynchronize(s));
  return 0;
}
