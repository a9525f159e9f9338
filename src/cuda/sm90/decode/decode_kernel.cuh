// Split-KV Skip-Softmax decode kernel for sm_90a (see docs/decode_kernel.md).
//
// One CTA = one (sequence b, KV head h, split s). Its rows are all g query heads x q_len tokens of
// the KV group (row r = token * g + head-in-group, R = g * q_len <= 64, padded to 16-row MMA
// tiles), so every K/V byte is read once per group. Keys are visited in 128-key tiles (the SPEC §2
// tile); the vote group for the skip is every row of the CTA.
//
// Each CTA writes a normalised fp32 partial (O, LSE) and raises its split's flag; a CTA that finds
// every flag of its (sequence, KV head) raised merges the group's splits into the outputs
// (decode_merge.cuh).
//
// Files by concern (the prefill kernel's layout): decode_traits.hpp (shapes, ring depths, the
// shared-memory struct), decode_scheduler.cuh (the CTA's work), decode_mainloop.cuh (the shared
// memory's pointers, loads, Q staging, scores, vote, online softmax, P.V; the pipeline is
// described there), decode_epilogue.cuh (the partials), decode_merge.cuh (the split flags and the merge).
// This file wires them: the order of the phases, the register arrays, the seed prologue and the
// tile loop.
//
// The SASS of every instance was main's before the split (cuobjdump listings equal) until the
// merge moved in from its own kernel (session 10: ptxas -5 to +4 registers, no spills), and each
// change here must say what it does to the code: the compiler's output depends
// on more than the statements (an earlier split, commit 9a59ea1, computed wrong outputs with two
// or more tiles per split; bench/results/decode_log.md session 5). Known sensitivities:
//   - the register arrays are separate variables of this function, passed by reference (kept in
//     one struct, a previous attempt measured 182 vs 212 registers, a cp.async load site lost);
//   - the loop's FIFO and counters are declared in the order below (in another order PTX's
//     virtual registers are numbered differently and ptxas allocates two counters the other way);
//   - the seed prologue and the tile loop stay in this body: as functions taking m and l by
//     reference they changed the code (204-208 vs 212 registers at d = 128, one m-tile);
//   - the mbarrier array's address is rounded up at run time, as the one-function kernel did
//     (DecodeSmem; taking SharedStorage::bar directly gives 72 fewer instructions).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/cuda_check.hpp"
#include "cuda/sm90/common/ptx.hpp"
#include "cuda/sm90/common/skip_policy.hpp"
#include "cuda/sm90/decode/decode_epilogue.cuh"
#include "cuda/sm90/decode/decode_mainloop.cuh"
#include "cuda/sm90/decode/decode_merge.cuh"
#include "cuda/sm90/decode/decode_params.hpp"
#include "cuda/sm90/decode/decode_scheduler.cuh"
#include "cuda/sm90/decode/decode_trace.cuh"
#include "cuda/sm90/decode/decode_traits.hpp"

namespace blasst::sm90::decode {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinCtas) decode_kernel(const __grid_constant__ Params p) {
  constexpr int D = Traits::D;
  constexpr int MT = Traits::MT;
  constexpr int W = Traits::kWarps;
  constexpr int NK = Traits::NK, NV = Traits::NV;
  constexpr int kLag = Traits::kLag;
  constexpr int kRows = Traits::kRows;
  constexpr int CH = Traits::CH;
  constexpr int kKW = Traits::kKW, kSN = Traits::kSN, kSNT = Traits::kSNT, kON = Traits::kON;
  constexpr int G = Traits::kKeyGroups;  // key groups per tile (4 warps: 2, each a half-tile K slot)
  constexpr int kKSlotBytes = Traits::kKSlotBytes;
  constexpr int kSlotBytes = Traits::kSlotBytes;
  constexpr int kPStage = Traits::kPStageBytes;
  using T = typename Traits::T;
  using Mainloop = DecodeMainloop<Traits>;

  // Grid (Hk, splits, B): neighbouring CTAs read neighbouring head rows of the same keys (the
  // H200 runs of f05b4c2 / 6ff5dca measured splits-fastest within run-to-run noise of this).
  trace_point(p, 0);  // start
  // The tensor maps' descriptors are fetched during the start code (the start is on the critical
  // path at B = 1: the first tiles were requested 2.1 us after it in the trace of 3ef23cb).
  if (threadIdx.x == 0 && p.tma != 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(&p.tmk)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(&p.tmv)) : "memory");
  }
  const int h = blockIdx.x, split = blockIdx.y, b = blockIdx.z;  // grid (Hk, splits, B)
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const DecodeWork w = decode_work<Traits::kTileKeys>(p, h, split, b);
  if (w.n == 0) {  // a split past this sequence's end
    write_empty_partial<Traits>(p, w);
    finish_split<D, W>(p, b, h, split);
    return;
  }

  extern __shared__ __align__(1024) unsigned char smem[];  // 128B-swizzled TMA boxes need 1 KB
  const DecodeSmem<Traits> sm(smem);
  const bool tma = p.tma != 0;
  sm.init_barriers(tid, tma);
  const Mainloop ml(p, w, sm, tid, warp, lane, tma);
  const float thr = ml.stage_q_and_first_loads();

  typename Mainloop::QFrags qa;
  ml.load_q_frags(qa);
  typename Mainloop::RowVals m_run, l_run;
  typename Mainloop::RowLims row_lim;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      m_run[mt][hf] = -INFINITY;
      l_run[mt][hf] = 0.f;
      row_lim[mt][hf] = ml.row_limit(mt, hf);
    }
  typename Mainloop::OutAcc o_acc;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kON; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[mt][nt][e] = 0.f;

  // The current tile's S (then P) for this warp's 16 keys and the warp's row maxima (score).
  typename Mainloop::Scores s;
  typename Mainloop::RowVals wmax;

  trace_point(p, 2);  // Q staged
  if (ml.seeded) {
    // Seeded split (SPEC §2a): m starts at the row's maximum over the seed tiles (computed by every
    // split of the group; the seed tiles mostly come from L2 after the first split reads them).
    // Both tiles in one pass: two independent MMA chains, so their latencies overlap. Their warp
    // maxima go where nothing is written before the first vote (MT = 1: the back half of the
    // last V slot, whose front half staged Q; MT = 4: P stage 0), so one barrier suffices: the
    // first vote's barrier orders these reads before any reuse of that memory or the seed slots.
    // (4 warps: the back half of the last K slot, whose front half staged Q; it is loaded after
    // the prologue.)
    float* seed_red = MT != 1  ? reinterpret_cast<float*>(sm.sP)  // [2][W][kRows]
                      : G == 1 ? reinterpret_cast<float*>(sm.sV + (NV - 1) * kSlotBytes + kSlotBytes / 2)
                               : reinterpret_cast<float*>(sm.sK + (NK - 1) * kKSlotBytes + kKSlotBytes / 2);
    static_assert(MT != 1 || kRows * D * 2 <= (G == 1 ? kSlotBytes : kKSlotBytes) / 2,
                  "Q staging and the seed maxima share a slot");
    static_assert(2 * W * kRows * 4 <= (MT == 1 ? (G == 1 ? kSlotBytes : kKSlotBytes) / 2 : kPStage), "seed maxima fit");
    // Probe 3 scores the split's first ring tile twice instead of the seed tiles (8 warps only:
    // 4 warps' K slots hold half tiles).
    const unsigned char* seed_slot[2] = {sm.sV, sm.sV + kSlotBytes};
    if (G != 1 || ml.seed_loads) {
      mbar_wait(ml.barS0, 0);
      mbar_wait(ml.barS0 + 8, 0);
    } else {
      mbar_wait(ml.barK0, 0);
      seed_slot[0] = seed_slot[1] = sm.sK;
    }
    if (ml.seed_scores) {
      float acc[2][MT][kSNT][4];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < kSNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][mt][nt][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        // The seed tiles are whole tiles in V slots: key group g at keys g * W * kKW (G = 1: 0).
#pragma unroll
        for (int g = 0; g < G; ++g) {
          std::uint32_t r[2][4];
          const int key = g * W * kKW + warp * kKW + (lane & 7) + (lane >> 4) * 8;
#pragma unroll
          for (int j = 0; j < 2; ++j) ldsm_x4(smem_u32(seed_slot[j]) + kv_off(key, ks * 2 + ((lane >> 3) & 1)), r[j]);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            std::uint32_t a[4];
            if constexpr (MT == 1) {
#pragma unroll
              for (int e = 0; e < 4; ++e) a[e] = qa[ks][e];
            } else {
              ldsm_x4(smem_u32(sm.sQ + swz(mt * 16 + (lane & 15), ks * 2 + (lane >> 4), CH)), a);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              mma16816<T>(acc[j][mt][g * kSN], a, r[j][0], r[j][1]);
              mma16816<T>(acc[j][mt][g * kSN + 1], a, r[j][2], r[j][3]);
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) ml.mask_max(acc[j], wmax, row_lim, w.seed_tile(j), seed_red + j * W * kRows);
    }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        if (ml.seed_scores) m_run[mt][hf] = running_max(ml.tile_max(seed_red, mt, hf), ml.tile_max(seed_red + W * kRows, mt, hf));
  }

  if constexpr (G != 1) {
    // 4 warps: the last K slot staged Q (and the seed maxima); every warp has read them.
    __syncthreads();
    if (NK - 1 < w.n * G) ml.load_k_part(NK - 1);
  }
  trace_point(p, 3);  // prologue done
  // One m-tile: P and alpha of the pending survivors in registers, a FIFO whose oldest entry sits at
  // index pending - 1 (a push shifts every entry up by one, so the indices stay static). The tile
  // index rides along (no shared-memory handoff: the drain has no barrier). (Declared before the
  // counters: see the top of this file.)
  typename Mainloop::PFifo pa;
  typename Mainloop::AlphaFifo pal;
  typename Mainloop::TileFifo ptile;
  int pending = 0;
  int done = 0;  // survivors whose P.V is done
  int kept = 0;  // survivors whose V load was issued
  int skipped_count = 0;

  for (int i = 0; i < w.n; ++i) {
    const int kslot = i % NK;
    const std::int64_t t = w.t_begin + i;
    // 4 warps: the tile's two halves are K parts 2i and 2i + 1 of the split, in slots h % NK.
    // (The order of the statements for G = 1 is the 8-warp kernels': see the top of this file.)
    const int h0 = i * G, h1 = i * G + 1;
    if constexpr (G == 1) {
      mbar_wait(ml.barK0 + 8 * kslot, static_cast<std::uint32_t>((i / NK) & 1));
    } else {
      mbar_wait(ml.barK0 + 8 * (h0 % NK), static_cast<std::uint32_t>((h0 / NK) & 1));
      mbar_wait(ml.barK0 + 8 * (h1 % NK), static_cast<std::uint32_t>((h1 / NK) & 1));
    }
    float* red = sm.sRed + (i & 1) * W * kRows;
    if constexpr (G == 1) ml.score(s, wmax, qa, row_lim, sm.sK + kslot * kSlotBytes, t, red);
    else ml.score(s, wmax, qa, row_lim, sm.sK + (h0 % NK) * kKSlotBytes, t, red, sm.sK + (h1 % NK) * kKSlotBytes);

    const bool keep = ml.vote(wmax, m_run, thr);
    if (i == 0) trace_point(p, 4);  // first vote

    ml.record_delta(red, m_run);

    // The K slot of tile i is free (every warp passed the vote): refill it first, so that no P.V
    // wait below delays the request.
    if constexpr (G == 1) {
      if (i + NK < w.n) ml.load_tile(ml.kbase, p.k_s0, p.k_s1, p.k_sh, sm.sK + kslot * kSlotBytes, ml.barK0 + 8 * kslot, t + NK, false);
    } else {
      // The slots of parts 2i and 2i + 1 take parts 2i + NK and 2i + 1 + NK (half of tile i + 1
      // and of tile i + 2 with NK = 3).
#pragma unroll
      for (int j = 0; j < G; ++j)
        if (i * G + j + NK < w.n * G) ml.load_k_part(i * G + j + NK);
    }

    if (keep) {
      // The tile's V load into V slot kept % NV (free: that slot's previous survivor had its P.V
      // before this barrier), then new maxima, rescale factors, P = exp2(S - m), row sums.
      const int slot = kept % NV;
      if (MT != 1 && tid == 0) sm.sVTile[slot] = static_cast<int>(t);  // read after a later barrier
      ml.load_tile(ml.vbase, p.v_s0, p.v_s1, p.v_sh, sm.sV + slot * kSlotBytes, ml.barV0 + 8 * slot, t, true);
      float alpha_new[MT][2];
      ml.online_softmax(s, m_run, l_run, red, alpha_new);
      if constexpr (MT == 1) {
        // The oldest pending survivor first (P.V order is the visit order), then push this one:
        // S's accumulator layout is the A-operand layout of P.V (this warp's 16 keys).
        if (pending == kLag) {
          ml.pv_reg(o_acc, done++, pa[kLag - 1], pal[kLag - 1], ptile[kLag - 1]);
          --pending;
        }
        ml.push_survivor(pa, pal, ptile, s, alpha_new, t);
        ++pending;
      } else {
        ml.store_p(s, slot, alpha_new);
      }
      ++kept;
    } else {
      ++skipped_count;
    }
    if constexpr (MT != 1) {
      // P.V of the survivors more than kLag behind (their P was written before this iteration's
      // barrier), so each V load has had kLag iterations to land.
      while (kept - done > kLag) ml.pv_smem(o_acc, done++);
    }
  }
  if constexpr (MT == 1) {
    // Drain the FIFO, oldest first (no barrier needed: each warp's P is its own).
#pragma unroll
    for (int j = kLag - 1; j >= 0; --j)
      if (j < pending) ml.pv_reg(o_acc, done++, pa[j], pal[j], ptile[j]);
  } else {
    __syncthreads();  // P of the last survivors written by every warp
    while (done < kept) ml.pv_smem(o_acc, done++);
  }

  trace_point(p, 5);  // last P.V issued
  write_partial<Traits>(p, w, sm, m_run, l_run, o_acc);
  trace_point(p, 6);  // partials written
  if (p.visited != nullptr && tid == 0) {
    atomicAdd(p.visited + w.h, static_cast<unsigned long long>(w.n));
    atomicAdd(p.skipped + w.h, static_cast<unsigned long long>(skipped_count));
  }
  finish_split<D, W>(p, b, h, split);
}

// One instance of kernel_table.inc (declared in kernel_table.hpp); its dynamic shared memory is
// DecodeTraits::kSmemBytes. Four warps: the largest shared-memory carveout is asked for, so that
// two CTAs fit (the driver otherwise may configure an SM for one).
template <DType E, int kHeadDim, KernelVariant V, int kMTiles, int kWarps>
void launch(const Params& p, dim3 grid, cudaStream_t stream) {
  using Traits = DecodeTraits<E, kHeadDim, V, kMTiles, kWarps>;
  auto* fn = &decode_kernel<Traits>;
  constexpr int smem = static_cast<int>(Traits::kSmemBytes);
  if constexpr (kWarps == 4) {
    // Once per process: the attribute holds for every device's context of the function, and a
    // repeat only costs host time.
    static const bool carveout = [fn] {
      BLASST_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             cudaSharedmemCarveoutMaxShared));
      return true;
    }();
    (void)carveout;
  }
  ::blasst::detail::set_max_dynamic_smem<&decode_kernel<Traits>>(smem);
  fn<<<grid, Traits::kThreads, smem, stream>>>(p);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) ::blasst::detail::throw_cuda(e, "decode_kernel launch", __FILE__, __LINE__);
}

template <DType E, int kHeadDim, KernelVariant V, int kMTiles, int kWarps>
int occupancy() {
  using Traits = DecodeTraits<E, kHeadDim, V, kMTiles, kWarps>;
  auto* fn = &decode_kernel<Traits>;
  constexpr int smem = static_cast<int>(Traits::kSmemBytes);
  int n = 0;
  if ((kWarps == 4 && cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           cudaSharedmemCarveoutMaxShared) != cudaSuccess) ||
      cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, Traits::kThreads, smem) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// Rows of the instance's largest load box: its K slot's keys (the host's tensor-map boxes hold at
// most this many rows).
template <DType E, int kHeadDim, KernelVariant V, int kMTiles, int kWarps>
int load_box_keys() {
  return DecodeTraits<E, kHeadDim, V, kMTiles, kWarps>::kKSlotKeys;
}

}  // namespace blasst::sm90::decode
