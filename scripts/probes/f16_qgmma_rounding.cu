// Probe (not part of the library): how far Hopper's FP8 wgmma with an f16 accumulator
// (QGMMA.64x128x32.F16.E4M3.E4M3, the screen-ahead pre-pass of screen-ahead-f16.patch) lands from
// the exact dot product, against the margin term that patch puts in the screen's Rnd:
//   |c16 - exact| <= g |a||b| with g = (1 + gamma_{d+3}(2^-13)) (1 + gamma_{d/32+1}(2^-10)) - 1,
// and, because the proof uses it, the sharper |c16 - exact| <= g sum_k |a_k b_k|.
// One warpgroup computes C[64 x 128] = A[64 x d] B[128 x d]^T (d = 128: four k32 instructions)
// from e4m3 codes within +-16 (the screen's range), many times with fresh inputs of several
// kinds; the host decodes the codes, sums in double, and reports per kind the largest
// |c16 - exact| / sum|a_k b_k| (in units of 2^-13 and as a share of g) and whether every output
// kept within g sum|a_k b_k|. Kinds: uniform random codes; one dominant product then many small
// ones in the same k32 block (tests the width of the aligned in-instruction sum); the dominant
// product in the first block and the small ones spread over the later blocks (tests the rounding
// of the partial sum to f16 between instructions); cancelling pairs (large +x, -x) beside small ones.
// Build: nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr
//        -I .deps/cutlass/include -I $CUDA/include/cccl scripts/probes/f16_qgmma_rounding.cu
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "blasst/fp8.hpp"
#include "blasst/half.hpp"

namespace f16probe {

using namespace cute;

constexpr int kM = 64, kN = 128, kD = 128;
using E8 = cutlass::float_e4m3_t;
using Acc = cutlass::half_t;
using Mma = decltype(make_tiled_mma(GMMA::ss_op_selector<E8, E8, Acc, Shape<Int<kM>, Int<kN>, Int<kD>>>()));
using SmemA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E8>{}, Shape<Int<kM>, Int<kD>>{}));
using SmemB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E8>{}, Shape<Int<kN>, Int<kD>>{}));

struct Smem {
  cute::array_aligned<E8, cosize_v<SmemA>, 1024> a;
  cute::array_aligned<E8, cosize_v<SmemB>, 1024> b;
};

// a: [batch][kM][kD] codes, b: [batch][kN][kD] codes, c: [batch][kM][kN] f16 bits
__global__ void __launch_bounds__(128) probe(const std::uint8_t* a, const std::uint8_t* b, std::uint16_t* c) {
  extern __shared__ __align__(1024) unsigned char raw[];
  Smem& s = *reinterpret_cast<Smem*>(raw);
  const int bi = blockIdx.x;
  Tensor sA = make_tensor(make_smem_ptr(s.a.data()), SmemA{});
  Tensor sB = make_tensor(make_smem_ptr(s.b.data()), SmemB{});
  for (int i = threadIdx.x; i < kM * kD; i += 128) {
    std::uint8_t v = a[std::size_t(bi) * kM * kD + i];
    sA(i / kD, i % kD) = reinterpret_cast<E8&>(v);
  }
  for (int i = threadIdx.x; i < kN * kD; i += 128) {
    std::uint8_t v = b[std::size_t(bi) * kN * kD + i];
    sB(i / kD, i % kD) = reinterpret_cast<E8&>(v);
  }
  __syncthreads();
  cutlass::arch::fence_view_async_shared();
  Mma mma;
  auto thr = mma.get_thread_slice(threadIdx.x);
  Tensor tA = thr.partition_fragment_A(sA);
  Tensor tB = thr.partition_fragment_B(sB);
  Tensor acc = partition_fragment_C(mma, Shape<Int<kM>, Int<kN>>{});
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  for (int kb = 0; kb < size<2>(tA); ++kb) {
    cute::gemm(mma, tA(_, _, kb), tB(_, _, kb), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
  Tensor gC = make_tensor(make_gmem_ptr(reinterpret_cast<Acc*>(c) + std::size_t(bi) * kM * kN),
                          make_layout(Shape<Int<kM>, Int<kN>>{}, LayoutRight{}));
  Tensor tC = thr.partition_C(gC);
  copy(acc, tC);
}

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

std::uint8_t code_of(double x) { return blasst::float_to_e4m3(static_cast<float>(x)); }

}  // namespace f16probe

int main() {
  using namespace f16probe;
  constexpr int kBatch = 64;
  const double g8 = 131 * 0x1p-13 / (1 - 131 * 0x1p-13), g16 = 5 * 0x1p-10 / (1 - 5 * 0x1p-10);
  const double g = (1 + g8) * (1 + g16) - 1;
  std::printf("f16-accumulated e4m3 wgmma, d = %d, %d x %d outputs per launch; model g = %.5f (%.1f x 2^-13)\n", kD, kM,
              kN, g, g / 0x1p-13);
  std::uint8_t *da, *db;
  std::uint16_t* dc;
  CK(cudaMalloc(&da, std::size_t(kBatch) * kM * kD));
  CK(cudaMalloc(&db, std::size_t(kBatch) * kN * kD));
  CK(cudaMalloc(&dc, std::size_t(kBatch) * kM * kN * 2));
  CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Smem))));
  std::mt19937_64 rng(20261206);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  const char* kinds[] = {"uniform random codes", "dominant + small, one k32 block", "dominant first block, small later",
                         "cancelling pairs + small"};
  bool all_within = true;
  for (int kind = 0; kind < 4; ++kind) {
    std::vector<std::uint8_t> a(std::size_t(kBatch) * kM * kD), b(std::size_t(kBatch) * kN * kD);
    std::vector<std::uint16_t> c(std::size_t(kBatch) * kM * kN);
    auto rnd_code = [&](double lo_exp, double hi_exp) {  // magnitude 2^[lo, hi), random sign
      const double x = std::exp2(lo_exp + (hi_exp - lo_exp) * U(rng));
      return code_of(U(rng) < 0.5 ? -x : x);
    };
    for (int bi = 0; bi < kBatch; ++bi) {
      for (int i = 0; i < kM * kD; ++i) {
        const int k = i % kD;
        std::uint8_t v = rnd_code(-9, 4);
        if (kind == 1) v = k == 0 ? code_of(16.0 - 2 * U(rng)) : (k < 32 ? rnd_code(-4, -1) : code_of(0));
        if (kind == 2) v = k == 0 ? code_of(16.0 - 2 * U(rng)) : rnd_code(-4, -1);
        if (kind == 3) v = k < 2 ? code_of(16.0) : rnd_code(-5, -1);
        a[std::size_t(bi) * kM * kD + i] = v;
      }
      for (int i = 0; i < kN * kD; ++i) {
        const int k = i % kD;
        std::uint8_t v = rnd_code(-9, 4);
        if (kind == 1) v = k == 0 ? code_of(16.0 - 4 * U(rng)) : (k < 32 ? rnd_code(-4, 0) : code_of(0));
        if (kind == 2) v = k == 0 ? code_of(16.0 - 4 * U(rng)) : rnd_code(-4, 0);
        if (kind == 3) v = k == 0 ? code_of(16.0 - 2 * U(rng)) : (k == 1 ? code_of(-(16.0 - 2 * U(rng))) : rnd_code(-5, 0));
        b[std::size_t(bi) * kN * kD + i] = v;
      }
      if (kind == 3)  // make the pair cancel exactly in a few rows: b[k=1] = -b[k=0]
        for (int n = 0; n < kN; n += 4) b[(std::size_t(bi) * kN + n) * kD + 1] = b[(std::size_t(bi) * kN + n) * kD] ^ 0x80;
    }
    CK(cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice));
    CK(cudaMemset(dc, 0xff, c.size() * 2));  // poison (NaN)
    probe<<<kBatch, 128, sizeof(Smem)>>>(da, db, dc);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(c.data(), dc, c.size() * 2, cudaMemcpyDeviceToHost));
    double worst = 0, worst_norm = 0, worst_ulp = 0;
    long long outside = 0, nonfinite = 0;
    for (int bi = 0; bi < kBatch; ++bi)
      for (int m = 0; m < kM; ++m)
        for (int n = 0; n < kN; ++n) {
          double exact = 0, sabs = 0, na = 0, nb = 0;
          for (int k = 0; k < kD; ++k) {
            const double x = blasst::e4m3_to_float(a[(std::size_t(bi) * kM + m) * kD + k]);
            const double y = blasst::e4m3_to_float(b[(std::size_t(bi) * kN + n) * kD + k]);
            exact += x * y;
            sabs += std::fabs(x * y);
            na += x * x;
            nb += y * y;
          }
          const double got = double(blasst::f16_to_float(c[(std::size_t(bi) * kM + m) * kN + n]));
          if (!std::isfinite(got)) {
            ++nonfinite;
            continue;
          }
          const double err = std::fabs(got - exact);
          if (sabs > 0) worst = std::max(worst, err / sabs);
          worst_norm = std::max(worst_norm, err / std::sqrt(na * nb));
          // one f16 ulp at |exact| (normal range): 2^(floor(log2|exact|) - 10)
          if (std::fabs(exact) >= 0x1p-14) worst_ulp = std::max(worst_ulp, err / std::exp2(std::floor(std::log2(std::fabs(exact))) - 10));
          if (err > g * sabs) ++outside;
        }
    all_within = all_within && outside == 0 && nonfinite == 0;
    std::printf("| %-34s | max err / sum|ab| %.3e (%.2f x 2^-13, %.3f of g) | max err / |a||b| %.3e | max err %.2f f16 ulp of |exact| | outside g: %lld | non-finite: %lld |\n",
                kinds[kind], worst, worst / 0x1p-13, worst / g, worst_norm, worst_ulp, outside, nonfinite);
  }
  std::printf("%s\n", all_within ? "every output within the model's bound" : "SOME OUTPUT OUTSIDE THE MODEL'S BOUND");
  return all_within ? 0 : 1;
}
