// Internal: the kernel instances of kernel_table.inc as declarations and a run-time lookup. The
// host layers (prefill_api.cu, decode_api.cu) find their kernel here; nothing else names an
// instance.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "blasst/blasst.hpp"
#include "cuda/sm90/backward/backward_kernel_kind.hpp"

namespace blasst::sm90 {

// What a kernel instance computes beyond dense attention (prefill: the statistics histogram is its
// own instance, because its code costs the plain skip kernel 4-9 % even when off; decode: one skip
// instance, histogram by pointer). skip_screen: the SPEC §2b FP8 screen before the exact test;
// skip_screen_check: the same decisions, with the bf16 scores of screened tiles computed anyway to
// count wrong screens (statistics calls). Their launch takes a PrefillScreenParams. skip_ahead: the
// pass after the SPEC §2b screen ahead, over the tiles its plan lists (launch: PrefillAheadParams).
enum class KernelVariant : int { dense, skip, skip_hist, skip_record, skip_screen, skip_screen_check, skip_ahead };
const char* to_string(KernelVariant v);

namespace prefill {
struct PrefillParams;
template <DType E, int kHeadDim, KernelVariant V>
void launch(const PrefillParams& p, cudaStream_t stream);
}  // namespace prefill

namespace decode {
struct Params;
// The instance sets its own dynamic shared memory (DecodeTraits::kSmemBytes).
template <DType E, int kHeadDim, KernelVariant V, int kMTiles, int kWarps>
void launch(const Params& p, dim3 grid, cudaStream_t stream);
// CTAs per SM of the instance (0 on error).
template <DType E, int kHeadDim, KernelVariant V, int kMTiles, int kWarps>
int occupancy();
// The most rows one tensor-map box of the instance may have (its K slot's keys).
template <DType E, int kHeadDim, KernelVariant V, int kMTiles, int kWarps>
int load_box_keys();
}  // namespace decode

namespace backward {
struct BackwardParams;
// The SPEC §9 main kernel; the instance sets its own dynamic shared memory (its traits).
template <DType E, int kHeadDim, BackwardKernel K>
void launch(const BackwardParams& p, cudaStream_t stream);
}  // namespace backward

#define BLASST_PREFILL_KERNEL(E, D, V) \
  extern template void prefill::launch<DType::E, D, KernelVariant::V>(const prefill::PrefillParams&, cudaStream_t);
#define BLASST_DECODE_KERNEL(E, D, V, MT, W)                                                                \
  extern template void decode::launch<DType::E, D, KernelVariant::V, MT, W>(const decode::Params&, dim3,     \
                                                                             cudaStream_t);                 \
  extern template int decode::occupancy<DType::E, D, KernelVariant::V, MT, W>();                             \
  extern template int decode::load_box_keys<DType::E, D, KernelVariant::V, MT, W>();
#define BLASST_BACKWARD_KERNEL(E, D, K) \
  extern template void backward::launch<DType::E, D, BackwardKernel::K>(const backward::BackwardParams&, cudaStream_t);
#include "cuda/sm90/kernel_table.inc"
#undef BLASST_PREFILL_KERNEL
#undef BLASST_DECODE_KERNEL
#undef BLASST_BACKWARD_KERNEL

using PrefillLaunchFn = void (*)(const prefill::PrefillParams&, cudaStream_t);
struct DecodeKernel {
  void (*launch)(const decode::Params&, dim3, cudaStream_t) = nullptr;
  int (*occupancy)() = nullptr;
  int (*load_box_keys)() = nullptr;
  int warps = 0;
};

// nullptr / empty when the table has no such instance.
PrefillLaunchFn find_prefill_kernel(DType dtype, int head_dim, KernelVariant v);
DecodeKernel find_decode_kernel(DType dtype, int head_dim, KernelVariant v, int m_tiles, int warps);
using BackwardLaunchFn = void (*)(const backward::BackwardParams&, cudaStream_t);
BackwardLaunchFn find_backward_kernel(DType dtype, int head_dim, BackwardKernel kernel);

// What the table holds, for the messages of unsupported calls: "64 or 128", "bf16 or f16".
std::string prefill_head_dims();
std::string prefill_dtypes();
std::string decode_head_dims();
std::string decode_dtypes();
bool prefill_has(DType dtype, int head_dim);
bool decode_has(DType dtype, int head_dim);
std::string backward_head_dims();
std::string backward_dtypes();
bool backward_has(DType dtype, int head_dim);

}  // namespace blasst::sm90
