// Probe (not part of the library): does compute-sanitizer racecheck accept the prefill skip_hist
// hand-off? The prefill statistics kernel reports 2 hazards between the consumers' slot stores and
// the histogram warp's read of the last tile (docs/prefill_kernel.md, Statistics) that four
// versions of the hand-off did not change. This kernel repeats the protocol alone, with the same
// warp roles and barrier ids: warpgroup 0's warps 1 and 2 read, warpgroups 1 and 2 write one slot
// per quad per tile after a bar.red over 160 threads, ping-pong barriers over the 256 consumer
// threads around each tile (kSched = true, as in the kernel) or not, and the last tile through a
// bar.sync over the same 160 threads. The sums it computes are checked on the host (so the
// protocol is right by its result); racecheck's verdict per variant is the finding:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O2 -o /tmp/probe racecheck_hist_handoff.cu
//   compute-sanitizer --tool racecheck /tmp/probe
#include <cstdio>
#include <cuda_runtime.h>

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ bool bar_red_or(int id, int n, bool p) {
  unsigned r;
  asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
               : "=r"(r) : "r"(unsigned(p)), "r"(id), "r"(n) : "memory");
  return r != 0u;
}

template <bool kSched>
__global__ void __launch_bounds__(384) handoff(int tiles, float* out) {
  __shared__ float slots[2][2][32];  // [consumer warpgroup][tile parity][quad]
  const int tid = threadIdx.x, lane = tid % 32;
  if (tid < 128) {
    const int cwg = tid / 32 - 1;  // warps 1 and 2 read for consumer warpgroups 0 and 1
    if (cwg < 0 || cwg > 1) return;
    float acc = 0.f;
    for (int n = 0; n < tiles; ++n) {
      bar_red_or(1 + cwg, 160, false);
      if (n > 0) acc += slots[cwg][(n - 1) & 1][lane];
    }
    bar_sync(5 + cwg, 160);
    acc += slots[cwg][(tiles - 1) & 1][lane];
    atomicAdd(out + blockIdx.x, acc);
    return;
  }
  const int mma_tid = tid - 128, cwg = mma_tid / 128, other = 1 - cwg;
  const int quad = (mma_tid % 128) / 4;  // 32 quads per warpgroup
  if (kSched && mma_tid >= 128) bar_arrive(3 + 0, 256);
  for (int n = 0; n < tiles; ++n) {
    if (kSched) bar_sync(3 + cwg, 256);
    if (kSched) bar_arrive(3 + other, 256);
    bar_red_or(1 + cwg, 160, true);
    if (mma_tid % 4 == 0) slots[cwg][n & 1][quad] = float(n + 1);
  }
  bar_sync(5 + cwg, 160);
}

int main() {
  const int blocks = 4;
  float* d;
  cudaMalloc(&d, blocks * sizeof(float));
  int bad = 0;
  for (int v = 0; v < 2; ++v)
    for (int tiles : {1, 2, 5}) {
      cudaMemset(d, 0, blocks * sizeof(float));
      if (v == 0) handoff<true><<<blocks, 384>>>(tiles, d);
      else handoff<false><<<blocks, 384>>>(tiles, d);
      float h[blocks];
      if (cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) { std::printf("CUDA error\n"); return 2; }
      const float want = 2.f * 32.f * tiles * (tiles + 1) / 2.f;  // 2 readers x 32 slots x (1 + ... + tiles)
      for (int b = 0; b < blocks; ++b) bad += h[b] != want;
      std::printf("sched=%d tiles=%d: block 0 sum %.0f (want %.0f)\n", v == 0, tiles, h[0], want);
    }
  std::printf("%s\n", bad ? "WRONG SUMS" : "sums right");
  return bad ? 1 : 0;
}
