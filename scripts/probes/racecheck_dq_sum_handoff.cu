// Probe (not part of the library): does compute-sanitizer racecheck accept the d = 64 backward's
// dQ partial hand-off (backward_wgmma_kernel.hpp, kBarDqPartials / kBarDqTile1Free, until ab66790
// replaced the hand-off by 128-row steps; kept as the record of what the tool reports)? Two
// warpgroups, one tile of floats each. Per step, warpgroup 1 stores its tile and arrives on
// barrier 10 (256 threads); warpgroup 0 waits there, adds tile 1 into its tile 0 and arrives on
// barrier 11; warpgroup 1 waits on 11 before its next store (and once after the loop). As in the
// kernel, each warpgroup also synchronises its own 128 threads on a barrier of its own every step
// (kOwnBarriers; ids 6 / 7 like kBarDsFreeOwn + wg) - or not. Warpgroup 0 accumulates its tile 0
// over the steps; the host checks every element against the closed form, so the protocol is
// right by its result. Racecheck's verdict per variant is the finding:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O2 -o /tmp/probe_dq racecheck_dq_sum_handoff.cu
//   for v in 0 1; do compute-sanitizer --tool racecheck /tmp/probe_dq $v; done
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }

constexpr int kTile = 1024;  // floats per warpgroup tile (8 per thread)

template <bool kOwnBarriers>
__global__ void __launch_bounds__(256) dq_sum(int steps, float* out) {
  __shared__ float tile[2][kTile];
  const int tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  for (int i = t; i < kTile; i += 128) tile[0][i] = 0.f;  // warpgroup 0's running sum (own tile)
  for (int s = 0; s < steps; ++s) {
    if constexpr (kOwnBarriers) bar_sync(6 + wg, 128);
    if (wg == 1) {
      if (s > 0) bar_sync(11, 256);  // tile 1 of the step before has been read
      for (int i = t; i < kTile; i += 128) tile[1][i] = float(s + 1) * float(i % 7 + 1);
      bar_arrive(10, 256);
    } else {
      bar_sync(10, 256);  // tile 1 of this step is stored
      for (int i = t; i < kTile; i += 128) tile[0][i] += tile[1][i] + 1.f;
      bar_arrive(11, 256);
    }
  }
  if (wg == 1) {
    if (steps > 0) bar_sync(11, 256);
    return;
  }
  for (int i = t; i < kTile; i += 128) out[blockIdx.x * kTile + i] = tile[0][i];
}

int main(int argc, char** argv) {
  const int v = argc > 1 ? std::atoi(argv[1]) : 1, steps = 37, blocks = 64;
  float* d = nullptr;
  if (cudaMalloc(&d, sizeof(float) * kTile * blocks) != cudaSuccess) return 2;
  if (v == 0) dq_sum<false><<<blocks, 256>>>(steps, d);
  else dq_sum<true><<<blocks, 256>>>(steps, d);
  if (cudaDeviceSynchronize() != cudaSuccess) { std::printf("kernel failed\n"); return 2; }
  std::vector<float> h(std::size_t(kTile) * blocks);
  cudaMemcpy(h.data(), d, sizeof(float) * h.size(), cudaMemcpyDeviceToHost);
  long bad = 0;
  const double tri = double(steps) * (steps + 1) / 2;
  for (int b = 0; b < blocks; ++b)
    for (int i = 0; i < kTile; ++i)
      if (double(h[std::size_t(b) * kTile + i]) != tri * (i % 7 + 1) + steps) ++bad;
  std::printf("variant %d (%s own-warpgroup barriers): %ld wrong sums of %d\n", v, v ? "with" : "without", bad,
              kTile * blocks);
  cudaFree(d);
  return bad ? 1 : 0;
}
