// Probe (not part of the library): does compute-sanitizer racecheck accept the prefill skip_hist
// hand-off? The prefill statistics kernel reports 2 hazards between the consumers' slot stores and
// the histogram warp's read of the last tile (docs/prefill_kernel.md, Statistics) that four
// versions of the hand-off did not change. This kernel repeats the protocol alone, with the same
// warp roles and barrier ids: warpgroup 0's warps 1 and 2 read, warpgroups 1 and 2 write one slot
// per quad per tile after a bar.red over 160 threads, ping-pong barriers over the 256 consumer
// threads around each tile (kSched = true, as in the kernel) or not, and the last tile through a
// bar.sync over the same 160 threads. The sums it computes are checked on the host (so the
// protocol is right by its result); racecheck's verdict per variant is the finding. Run of
// 2026-12-04 (9ff8910, the first two variants only): hazards only with the ping-pong
// barriers (kSched), none without. The variants below tell which part of the ping-pong the tool
// trips on: the bar.arrive half (PingPongSyncOnly replaces it by bar.sync of all 256 consumer
// threads), the barrier ids (PingPongIds78 uses 7 / 8), or the bar.red of the hand-off
// (PingPongHandoffSync hands off every tile by bar.sync instead):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O2 -o /tmp/probe racecheck_hist_handoff.cu
//   for v in 0 1 2 3 4; do compute-sanitizer --tool racecheck /tmp/probe $v; done
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ bool bar_red_or(int id, int n, bool p) {
  unsigned r;
  asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
               : "=r"(r) : "r"(unsigned(p)), "r"(id), "r"(n) : "memory");
  return r != 0u;
}

enum Variant { kNoPingPong, kPingPong, kPingPongSyncOnly, kPingPongIds78, kPingPongHandoffSync, kVariants };
static const char* const kVariantNames[kVariants] = {"no ping-pong", "ping-pong (as the kernel)",
                                                     "ping-pong by bar.sync only", "ping-pong on barriers 7/8",
                                                     "ping-pong, hand-off by bar.sync"};

template <int kVariant>
__global__ void __launch_bounds__(384) handoff(int tiles, float* out) {
  constexpr bool kSched = kVariant != kNoPingPong;
  constexpr int kPingPongBar = kVariant == kPingPongIds78 ? 7 : 3;
  __shared__ float slots[2][2][32];  // [consumer warpgroup][tile parity][quad]
  const int tid = threadIdx.x, lane = tid % 32;
  auto handoff_bar = [](int id, bool p) {
    if constexpr (kVariant == kPingPongHandoffSync) bar_sync(id, 160);
    else bar_red_or(id, 160, p);
  };
  if (tid < 128) {
    const int cwg = tid / 32 - 1;  // warps 1 and 2 read for consumer warpgroups 0 and 1
    if (cwg < 0 || cwg > 1) return;
    float acc = 0.f;
    for (int n = 0; n < tiles; ++n) {
      handoff_bar(1 + cwg, false);
      if (n > 0) acc += slots[cwg][(n - 1) & 1][lane];
    }
    bar_sync(5 + cwg, 160);
    acc += slots[cwg][(tiles - 1) & 1][lane];
    atomicAdd(out + blockIdx.x, acc);
    return;
  }
  const int mma_tid = tid - 128, cwg = mma_tid / 128, other = 1 - cwg;
  const int quad = (mma_tid % 128) / 4;  // 32 quads per warpgroup
  if constexpr (kSched && kVariant != kPingPongSyncOnly) {
    if (mma_tid >= 128) bar_arrive(kPingPongBar + 0, 256);
  }
  for (int n = 0; n < tiles; ++n) {
    if constexpr (kVariant == kPingPongSyncOnly) {
      bar_sync(kPingPongBar, 256);
    } else if constexpr (kSched) {
      bar_sync(kPingPongBar + cwg, 256);
      bar_arrive(kPingPongBar + other, 256);
    }
    handoff_bar(1 + cwg, true);
    if (mma_tid % 4 == 0) slots[cwg][n & 1][quad] = float(n + 1);
  }
  bar_sync(5 + cwg, 160);
}

template <int kVariant>
static void launch(int blocks, int tiles, float* d) { handoff<kVariant><<<blocks, 384>>>(tiles, d); }

int main(int argc, char** argv) {  // argv[1]: run only that variant (racecheck counts per process)
  const int blocks = 4;
  float* d;
  if (cudaMalloc(&d, blocks * sizeof(float)) != cudaSuccess) { std::printf("CUDA error (malloc)\n"); return 2; }
  void (*const launches[kVariants])(int, int, float*) = {launch<0>, launch<1>, launch<2>, launch<3>, launch<4>};
  int bad = 0;
  const int only = argc > 1 ? std::atoi(argv[1]) : -1;
  for (int v = 0; v < kVariants; ++v)
    if (only < 0 || v == only)
    for (int tiles : {1, 2, 5}) {
      cudaMemset(d, 0, blocks * sizeof(float));
      launches[v](blocks, tiles, d);
      float h[blocks];
      if (cudaGetLastError() != cudaSuccess || cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) {
        std::printf("CUDA error\n");
        return 2;
      }
      const float want = 2.f * 32.f * tiles * (tiles + 1) / 2.f;  // 2 readers x 32 slots x (1 + ... + tiles)
      for (int b = 0; b < blocks; ++b) bad += h[b] != want;
      std::printf("variant %d (%s) tiles=%d: block 0 sum %.0f (want %.0f)\n", v, kVariantNames[v], tiles, h[0], want);
      std::fflush(stdout);
      cudaDeviceSynchronize();
    }
  std::printf("%s\n", bad ? "WRONG SUMS" : "sums right");
  return bad ? 1 : 0;
}
