// A small driver for profilers (ncu) and quick timing of one decode configuration, without torch:
//   blasst_decode_profile B L Hq Hk [lambda] [reps]
// bf16, d = 128, q_len = 1, contiguous [B, L, Hk, d] caches of normal random values (random_bf16); lambda > 0 runs the
// skip kernel at that threshold. Prints the mean time per call over `reps` calls (CUDA events,
// after 3 warm-up calls) and the K+V bandwidth. scripts/device_decode.sh profile runs ncu on it.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/half.hpp"

namespace {

#define CK(x)                                                                       \
  do {                                                                              \
    const cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                 \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

// n normal bf16 values on the device: at most 2^24 drawn on the host, the rest repeats them
// (device-to-device copies), so that a B = 64, 32k cache (2 G elements) fills in a second instead
// of minutes; the dense kernel's timing does not depend on the values.
void* random_bf16(std::size_t n, std::uint64_t seed) {
  const std::size_t chunk = n < (std::size_t{1} << 24) ? n : (std::size_t{1} << 24);
  std::vector<std::uint16_t> h(chunk);
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : h) x = blasst::float_to_bf16(nd(g));
  void* d = nullptr;
  CK(cudaMalloc(&d, n * 2));
  CK(cudaMemcpy(d, h.data(), chunk * 2, cudaMemcpyHostToDevice));
  for (std::size_t done = chunk; done < n;) {
    const std::size_t c = n - done < done ? n - done : done;  // double what is there
    CK(cudaMemcpy(static_cast<char*>(d) + done * 2, d, c * 2, cudaMemcpyDeviceToDevice));
    done += c;
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s B L Hq Hk [lambda] [reps]\n", argv[0]);
    return 2;
  }
  const std::int64_t B = std::atoll(argv[1]), L = std::atoll(argv[2]), hq = std::atoll(argv[3]),
                     hk = std::atoll(argv[4]), d = 128;
  const double lambda = argc > 5 ? std::atof(argv[5]) : 0.0;
  const int reps = argc > 6 ? std::atoi(argv[6]) : 10;
  if (!blasst::cuda_available()) {
    std::fprintf(stderr, "no CUDA GPU\n");
    return 1;
  }
  const std::size_t kv = static_cast<std::size_t>(B * L * hk * d);
  void* q = random_bf16(static_cast<std::size_t>(B * hq * d), 1);
  void* k = random_bf16(kv, 2);
  void* v = random_bf16(kv, 3);
  void* o = nullptr;
  CK(cudaMalloc(&o, static_cast<std::size_t>(B * hq * d) * 2));
  const auto dev = blasst::DeviceKind::cuda;
  blasst::DecodeProblem p;
  p.q = blasst::Tensor::contiguous(q, blasst::DType::bf16, {B, 1, hq, d}, dev);
  p.k_cache = blasst::Tensor::contiguous(k, blasst::DType::bf16, {B, L, hk, d}, dev);
  p.v_cache = blasst::Tensor::contiguous(v, blasst::DType::bf16, {B, L, hk, d}, dev);
  p.out = blasst::Tensor::contiguous(o, blasst::DType::bf16, {B, 1, hq, d}, dev);
  blasst::SkipConfig skip;
  if (lambda > 0) skip = blasst::SkipConfig::from_threshold(lambda).with_order(blasst::VisitOrder::natural);
  for (int i = 0; i < 3; ++i) blasst::decode(p, skip);
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) blasst::decode(p, skip);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0.f;
  CK(cudaEventElapsedTime(&ms, a, b));
  const double us = 1e3 * ms / reps;
  std::printf("B=%lld L=%lld Hq=%lld Hk=%lld lambda=%g: %.1f us per call (eager), %.2f TB/s of K+V\n",
              static_cast<long long>(B), static_cast<long long>(L), static_cast<long long>(hq),
              static_cast<long long>(hk), lambda, us, 2.0 * kv * 2 / (us * 1e-6) / 1e12);
  for (void* x : {q, k, v, o}) cudaFree(x);
  return 0;
}
