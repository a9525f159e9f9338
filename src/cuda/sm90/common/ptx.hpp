// Internal: the PTX the sm_90a kernels issue by hand (mbarriers, cp.async, tensor-map copies,
// ldmatrix, mma.sync, named barriers), one wrapper each for every kernel. The prefill kernel's
// TMA and WGMMA go through CuTe instead.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace blasst::sm90 {

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 2^x without exp2f's denormal fix-up (FSETP + 2 FMUL per call in SASS); flushing tiny softmax
// weights to zero is harmless (prefill bf16 d128 kernel: 7025 -> 5952 SASS lines).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- global bit sets --------------------------------------------------------------------------

// Sets bit i of the 32-bit word array `words` when `pred` holds (`words` may be null when it does
// not; the address is integer arithmetic): one predicated fire-and-forget
// red.or (no branch, so no reconvergence point in the caller's schedule); no memory clobber: the
// kernel never reads the words back, the host does after the kernel.
__device__ __forceinline__ void red_or_bit(std::uint32_t* words, long long i, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n"
      " @p red.relaxed.gpu.global.or.b32 [%0], %1;\n}\n" ::"l"(reinterpret_cast<std::uintptr_t>(words) +
                                                                4u * static_cast<std::uint64_t>(i >> 5)),
      "r"(1u << (i & 31)), "r"(int(pred)));
}

// x << n for n < 32, else 0 (PTX clamps shift amounts to the register width; C++ `<<` by 32 or
// more is undefined): one SHF, so a bit can be set in a word only when n falls inside it.
__device__ __forceinline__ std::uint32_t shl_or_zero(std::uint32_t x, std::uint32_t n) {
  std::uint32_t r;
  asm("shl.b32 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(n));
  return r;
}

// ---- mbarriers -----------------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(std::uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// ---- copies --------------------------------------------------------------------------------

// 16-byte copy; src_bytes = 0 zero-fills (keys past the sequence end, never read from memory).
__device__ __forceinline__ void cp_async16(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// Arrives on the mbarrier once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void cp_async_arrive(std::uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// Tensor-map (TMA) copy of one 4-D box at coordinates (c0, c1, c2, c3), completing on `bar`.
__device__ __forceinline__ void tma_load_4d(std::uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            std::uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// dst[0, bytes / 4) += src[0, bytes / 4) (f32, element-wise atomic in L2) from shared memory by
// the bulk-copy engine, one thread issuing: 16-byte aligned addresses, bytes a multiple of 16. A
// bulk async-group: commit with cute::tma_store_arrive, wait with cute::tma_store_wait (reads).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, std::uint32_t src, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
}

// ---- ldmatrix and mma.sync (m16n8k16, 16-bit inputs, fp32 accumulators) ----------------------

__device__ __forceinline__ void ldsm_x4(std::uint32_t addr, std::uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_t(std::uint32_t addr, std::uint32_t (&r)[2]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(std::uint32_t addr, std::uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// T: __nv_bfloat16 or __half (sm90::Element<...>::cuda); anything else does not compile.
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "mma16816: bf16 or f16 inputs");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
// Two floats rounded to T and packed into one register (the A-operand layout of mma16816).
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "pack2: bf16 or f16");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&v);
  }
}

// The inverse of pack2: one register of two T values (lo in the low half) as floats.
template <class T>
__device__ __forceinline__ float2 unpack2(std::uint32_t v) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "unpack2: bf16 or f16");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
  else return __half22float2(*reinterpret_cast<__half2*>(&v));
}

// ---- named barriers (0 is __syncthreads) -----------------------------------------------------

__device__ __forceinline__ void named_sync(int id, int nthreads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
// Barrier + OR over the participating threads' predicates (one BAR.RED: no shuffles, no smem).
// Orders shared memory among the participants like bar.sync (what __syncthreads_or relies on).
__device__ __forceinline__ bool named_sync_or(int id, int nthreads, bool pred) {
  unsigned r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n"
      " selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r) : "r"(unsigned(pred)), "r"(id), "r"(nthreads) : "memory");
  return r != 0u;
}
__device__ __forceinline__ void named_arrive(int id, int nthreads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}

}  // namespace blasst::sm90
