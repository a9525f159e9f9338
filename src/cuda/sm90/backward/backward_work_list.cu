// The backward's work list and the sum of its split blocks (backward_work_list.hpp).
#include "cuda/sm90/backward/backward_work_list.hpp"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>
#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/sm90/backward/backward_tile_scheduler.hpp"
#include "cuda/sm90/common/element.hpp"

namespace blasst::sm90::backward {

namespace {

constexpr int kCountThreads = 256;  // count_kept_kernel: one thread per key block (strided)
constexpr int kCountGroups = 16;    // vote groups per count CTA (short load chains)
constexpr int kBuildThreads = 1024;  // build_work_list_kernel: one CTA per sequence
constexpr int kKeyThreads = 4;  // sort keys a thread (section x cost bucket)
constexpr int kKeys = kBuildThreads * kKeyThreads;
constexpr int kMaxSections = kBuildThreads;  // sections of the heavy items' order (at least 4 keys each)
constexpr int kSumThreads = 256;

struct IntMax {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

// The sequence b's lengths.
__device__ __forceinline__ void sequence_lengths(const BackwardParams& p, int b, int& len_q, int& len_k) {
  if (p.cu_q != nullptr) {
    len_q = p.cu_q[b + 1] - p.cu_q[b];
    len_k = p.cu_k[b + 1] - p.cu_k[b];
  } else {
    len_q = p.len_q;
    len_k = p.len_k;
  }
}

// counts[(b hq + h) nb + n] += the kept vote groups of query head h among groups [g0, g0 + 16)
// that key block n's CTA walks (BackwardScheduler::locate with vote-group rows), and *total += all
// of them (one atomic a warp). Grid (hq, group chunks, batch); a thread per key block, so a warp
// reads 32 consecutive bits of a group's row.
__global__ void __launch_bounds__(kCountThreads) count_kept_kernel(const BackwardParams p, int* counts,
                                                                   unsigned long long* total) {
  const int h = int(blockIdx.x), b = int(blockIdx.z);
  int len_q, len_k;
  sequence_lengths(p, b, len_q, len_k);
  const int g0 = int(blockIdx.y) * kCountGroups;
  const int g1 = min(vote_groups(len_q), g0 + kCountGroups);
  if (g0 >= g1) return;
  const int nb = (len_k + kSplitKeys - 1) / kSplitKeys;
  unsigned mine = 0;
  // every thread of a warp takes the same number of trips (the warp sum below needs all 32)
  for (int n0 = int(threadIdx.x) & ~31; n0 < nb; n0 += kCountThreads) {
    const int n = n0 + int(threadIdx.x & 31);
    if (n >= nb) continue;
    BackwardWork w;
    w.b = b;
    w.n_block = n;
    if (!BackwardScheduler::locate<kVoteRows, kSplitKeys>(p, w)) continue;
    int kept = 0;
    for (int g = max(g0, w.m_begin); g < min(g1, w.m_end); ++g) kept += !BackwardScheduler::skipped(p, w, h, g);
    if (kept > 0) atomicAdd(&counts[(std::int64_t(b) * p.hq + h) * p.num_n_blocks + n], kept);
    mine += unsigned(kept);
  }
  mine = __reduce_add_sync(0xffffffffu, mine);
  if ((threadIdx.x & 31) == 0 && mine > 0) atomicAdd(total, static_cast<unsigned long long>(mine));
}

// One CTA per sequence: the heavy blocks and their splits, then the list (see the header).
// split_of[x] of block x = kh * nb + n: its split index (>= 0), kWhole (heavy, not split) or
// kFixed (not heavy: its place in the fixed order).
constexpr int kWhole = -2, kFixed = -1;

__global__ void __launch_bounds__(kBuildThreads) build_work_list_kernel(const BackwardParams p, WorkListScratch s,
                                                                        const unsigned long long* kept_total,
                                                                        int num_sms) {
  using Scan = cub::BlockScan<int, kBuildThreads>;
  using SumReduce = cub::BlockReduce<unsigned long long, kBuildThreads>;
  using MaxReduce = cub::BlockReduce<int, kBuildThreads>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename SumReduce::TempStorage sum;
    typename MaxReduce::TempStorage max;
  } tmp;
  __shared__ int hist[kKeys];
  __shared__ unsigned long long kept_sum;
  __shared__ int max_cost, nsplit;
  const int b = int(blockIdx.x), tid = int(threadIdx.x);
  int len_q, len_k;
  sequence_lengths(p, b, len_q, len_k);
  const int nb = (len_k + kSplitKeys - 1) / kSplitKeys, blocks = p.hk * nb;
  const int* counts = s.counts + std::int64_t(b) * p.hq * p.num_n_blocks;
  int* split_of = s.split_of + std::int64_t(b) * p.hk * p.num_n_blocks;
  auto kept = [&](int kh, int n, int hh) { return counts[std::int64_t(kh * p.group + hh) * p.num_n_blocks + n]; };
  auto total = [&](int kh, int n) {
    int t = 0;
    for (int hh = 0; hh < p.group; ++hh) t += kept(kh, n, hh);
    return t;
  };
  for (int k = tid; k < kKeys; k += kBuildThreads) hist[k] = 0;
  // 1. the mean over the sequence's blocks and the largest cost (block reductions: one shared
  //    counter for all threads' atomics cost ~60 us at 2048 blocks, H100)
  unsigned long long my_sum = 0;
  int my_max = 1;
  for (int x = tid; x < blocks; x += kBuildThreads) {
    const int t = total(x / nb, x % nb);
    my_sum += static_cast<unsigned long long>(t);
    my_max = max(my_max, kCtaFixedCost + t);
  }
  const unsigned long long sum_all = SumReduce(tmp.sum).Sum(my_sum);
  __syncthreads();
  const int max_all = MaxReduce(tmp.max).Reduce(my_max, IntMax{});
  if (tid == 0) {
    kept_sum = sum_all;
    max_cost = max_all;
    nsplit = 0;
  }
  __syncthreads();
  // 2. heavy blocks (kDen t blocks >= kNum sum: t >= kNum / kDen x the mean), split where the KV
  //    group has several query heads, the block costs more than kSplitShareNum / kSplitShareDen of
  //    an SM's share of the call (its blocks counted at the padded size: an upper bound for
  //    varlen), and a split slot is left
  //    (integers: (kCtaFixedCost + t) kDen SMs > kNum (total + kCtaFixedCost blocks))
  const unsigned long long call_cost =
      *kept_total + static_cast<unsigned long long>(kCtaFixedCost) * unsigned(p.batch) * unsigned(p.hk) * unsigned(p.num_n_blocks);
  const unsigned long long sms = static_cast<unsigned long long>(num_sms > 0 ? num_sms : 1);
  for (int x = tid; x < blocks; x += kBuildThreads) {
    const int kh = x / nb, n = x % nb, t = total(kh, n);
    int state = kFixed;
    if (t > 0 && static_cast<unsigned long long>(t) * unsigned(blocks) * kHeavyDen >= kHeavyNum * kept_sum) {
      state = kWhole;
      if (p.split_cap > 0 && static_cast<unsigned long long>(kCtaFixedCost + t) * kSplitShareDen * sms >
                                 kSplitShareNum * call_cost) {
        const int at = atomicAdd(&nsplit, 1);
        if (at < p.split_cap) {
          state = at;
          s.splits[std::int64_t(b) * p.split_cap + at] = SplitBlock{kh, n};
        }
      }
    }
    split_of[x] = state;
  }
  __syncthreads();  // split_of (global) visible to the CTA
  // The heavy items run first, ordered by the section of the fixed order they belong to (causal:
  // its sections of KV heads, causal_launch_section_heads; full mask: each KV head), then longest
  // first within it: the heavy CTAs that run side by side read few heads' Q / dO (one list sorted
  // by cost over every KV head ran the llm rows at a third of their modelled gain: suspected L2),
  // and none of them starts late (a section's heavy blocks at its start left a tail at 90 %, in the
  // list-scheduling model). More than kMaxSections sections: consecutive ones merged.
  const int fixed_sections = p.causal ? (p.hk + p.causal_section_heads - 1) / p.causal_section_heads : p.hk;
  const int merge = (fixed_sections + kMaxSections - 1) / kMaxSections;
  const int sections = (fixed_sections + merge - 1) / merge;
  const int per_section = kKeys / sections;  // cost buckets a section (>= 4)
  auto section_of = [&](int kh) { return (p.causal ? kh / p.causal_section_heads : kh) / merge; };
  // Sort key of a heavy item: its section, then its cost bucket, the longest first.
  auto key = [&](int kh, int cost) {
    const int k = int((long long)cost * (per_section - 1) / max_cost);
    return section_of(kh) * per_section + (per_section - 1) - (k < per_section - 1 ? k : per_section - 1);
  };
  // The heavy items of block x: the whole block, or its group's parts; f(cost, item).
  auto each_heavy_item = [&](int x, auto&& f) {
    const int kh = x / nb, n = x % nb, st = split_of[x];
    if (st == kWhole) {
      f(kCtaFixedCost + total(kh, n), WorkItem{n, kh, -1, -1});
    } else if (st >= 0) {
      for (int hh = 0; hh < p.group; ++hh) f(kCtaFixedCost + kept(kh, n, hh), WorkItem{n, kh, hh, st});
    }
  };
  // 3. the heavy items first: a counting sort of their keys
  for (int x = tid; x < blocks; x += kBuildThreads)
    each_heavy_item(x, [&](int cost, const WorkItem& it) { atomicAdd(&hist[key(it.kh, cost)], 1); });
  __syncthreads();
  int keys[kKeyThreads];
  for (int j = 0; j < kKeyThreads; ++j) keys[j] = hist[tid * kKeyThreads + j];
  int heavy_items = 0;
  Scan(tmp.scan).ExclusiveSum(keys, keys, heavy_items);
  __syncthreads();
  for (int j = 0; j < kKeyThreads; ++j) hist[tid * kKeyThreads + j] = keys[j];  // now the key's cursor
  __syncthreads();
  WorkItem* list = s.items + std::int64_t(b) * p.work_items;
  for (int x = tid; x < blocks; x += kBuildThreads)
    each_heavy_item(x, [&](int cost, const WorkItem& it) { list[atomicAdd(&hist[key(it.kh, cost)], 1)] = it; });
  // 4. the other blocks in the fixed launch order (launch_block_and_head over the sequence's
  //    blocks), compacted by a scan of their flags, 1024 positions at a time
  int fixed_placed = 0;
  for (int base = 0; base < blocks; base += kBuildThreads) {
    const int xf = base + tid;
    int n = 0, kh = 0;
    if (xf < blocks) launch_block_and_head(xf, nb, p.hk, p.causal, p.causal_section_heads, false, n, kh);
    const int fixed = xf < blocks && split_of[kh * nb + n] == kFixed ? 1 : 0;
    int at = 0, in_chunk = 0;
    __syncthreads();  // tmp reuse
    Scan(tmp.scan).ExclusiveSum(fixed, at, in_chunk);
    if (fixed) list[heavy_items + fixed_placed + at] = WorkItem{n, kh, -1, -1};
    fixed_placed += in_chunk;
  }
  const int placed = heavy_items + fixed_placed;
  if (tid == 0) {
    s.counters[b] = placed;  // work_count
    s.counters[p.batch + b] = nsplit < p.split_cap ? nsplit : p.split_cap;  // split_count
  }
}

// dk / dv of the split blocks: thread (split block, key, 4 columns) sums the group's parts in
// order (dK's are already scaled) and stores them element by element. Grid (split_cap x 128 x
// d / 4 threads, batch); threads past the sequence's split count exit.
template <class E>
__global__ void __launch_bounds__(kSumThreads) split_sum_kernel(const BackwardParams p) {
  const int b = int(blockIdx.y), chunks = p.head_dim / 4;
  const std::int64_t t = std::int64_t(blockIdx.x) * kSumThreads + threadIdx.x;
  const int sp = int(t / (std::int64_t(kSplitKeys) * chunks));
  if (sp >= p.split_count[b]) return;
  const int key = int((t / chunks) % kSplitKeys), col = 4 * int(t % chunks);
  const SplitBlock blk = p.splits[std::int64_t(b) * p.split_cap + sp];
  const bool ragged = p.cu_k != nullptr;
  const int k_start = ragged ? p.cu_k[b] : 0, len_k = ragged ? p.cu_k[b + 1] - k_start : p.len_k;
  const int keyg = blk.n_block * kSplitKeys + key;
  if (keyg >= len_k) return;
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int part = 0; part < p.group; ++part) {
      const float4 v = *reinterpret_cast<const float4*>(
          p.dkv_part + dkv_part_index(b, p.split_cap, sp, p.group, part, which, key, col, p.head_dim));
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    const RowStrides& st = which == 0 ? p.dk_s : p.dv_s;
    void* base = which == 0 ? p.dk : p.dv;
    const bool f32 = which == 0 ? p.dk_f32 : p.dv_f32;
    const std::int64_t off = std::int64_t(k_start + keyg) * st.row + std::int64_t(blk.kh) * st.head +
                             (ragged ? 0 : std::int64_t(b) * st.batch) + col;
    const float x[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (f32) static_cast<float*>(base)[off + e] = x[e];
      else static_cast<E*>(base)[off + e] = static_cast<E>(x[e]);
    }
  }
}

// The counts' bytes rounded up to 8: the call's total follows them.
std::size_t counts_bytes(const BackwardParams& p) {
  return (std::size_t(p.batch) * std::size_t(p.hq) * std::size_t(p.num_n_blocks) * sizeof(int) + 7) / 8 * 8;
}

}  // namespace

void work_list_bytes(const BackwardParams& p, std::size_t (&bytes)[6]) {
  const std::size_t B = std::size_t(p.batch), nb = std::size_t(p.num_n_blocks);
  bytes[0] = counts_bytes(p) + sizeof(unsigned long long);
  bytes[1] = B * std::size_t(p.hk) * nb * sizeof(int);
  bytes[2] = B * std::size_t(p.work_items) * sizeof(WorkItem);
  bytes[3] = B * std::size_t(p.split_cap) * sizeof(SplitBlock);
  bytes[4] = 2 * B * sizeof(int);
  bytes[5] = B * std::size_t(p.split_cap) * std::size_t(p.group) * 2 * kSplitKeys * std::size_t(p.head_dim) * sizeof(float);
}

void launch_work_list(BackwardParams& p, const WorkListScratch& s, int max_len_q, int num_sms, cudaStream_t stream) {
  std::size_t bytes[6];
  work_list_bytes(p, bytes);
  BLASST_CUDA_CHECK(cudaMemsetAsync(s.counts, 0, bytes[0], stream));  // the counts and the total
  auto* kept_total = reinterpret_cast<unsigned long long*>(reinterpret_cast<char*>(s.counts) + counts_bytes(p));
  const int max_groups = vote_groups(max_len_q);
  const dim3 count_grid(unsigned(p.hq), unsigned((max_groups + kCountGroups - 1) / kCountGroups), unsigned(p.batch));
  if (count_grid.y > 0) count_kept_kernel<<<count_grid, kCountThreads, 0, stream>>>(p, s.counts, kept_total);
  BLASST_CUDA_CHECK(cudaGetLastError());
  build_work_list_kernel<<<dim3(unsigned(p.batch)), kBuildThreads, 0, stream>>>(p, s, kept_total, num_sms);
  BLASST_CUDA_CHECK(cudaGetLastError());
  p.work_list = s.items;
  p.work_count = s.counters;
  p.splits = s.splits;
  p.split_count = s.counters + p.batch;
  p.dkv_part = s.parts;
}

void launch_split_sum(const BackwardParams& p, DType dtype, cudaStream_t stream) {
  if (p.split_cap <= 0 || p.batch <= 0) return;
  const std::int64_t threads = std::int64_t(p.split_cap) * kSplitKeys * (p.head_dim / 4);
  const dim3 grid(unsigned((threads + kSumThreads - 1) / kSumThreads), unsigned(p.batch));
  switch (dtype) {
    case DType::bf16: split_sum_kernel<typename Element<DType::bf16>::cuda><<<grid, kSumThreads, 0, stream>>>(p); break;
    case DType::f16: split_sum_kernel<typename Element<DType::f16>::cuda><<<grid, kSumThreads, 0, stream>>>(p); break;
    default: throw Error(std::string("q: dtype ") + to_string(dtype) + " has no backward split sum (bf16 or f16)");
  }
  BLASST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace blasst::sm90::backward
