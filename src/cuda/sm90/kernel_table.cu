// The run-time lookup of kernel_table.inc (declarations in kernel_table.hpp).
#include "cuda/sm90/kernel_table.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace blasst::sm90 {

const char* to_string(KernelVariant v) {
  switch (v) {
    case KernelVariant::dense: return "dense";
    case KernelVariant::skip: return "skip";
    case KernelVariant::skip_hist: return "skip_hist";
    case KernelVariant::skip_record: return "skip_record";
    case KernelVariant::skip_screen: return "skip_screen";
    case KernelVariant::skip_screen_check: return "skip_screen_check";
    case KernelVariant::skip_ahead: return "skip_ahead";
  }
  return "?";
}

PrefillLaunchFn find_prefill_kernel(DType dtype, int head_dim, KernelVariant v) {
#define BLASST_PREFILL_KERNEL(E, D, V)                                          \
  if (dtype == DType::E && head_dim == D && v == KernelVariant::V)              \
    return &prefill::launch<DType::E, D, KernelVariant::V>;
#define BLASST_DECODE_KERNEL(E, D, V, MT, W)
#define BLASST_BACKWARD_KERNEL(E, D, K)
#include "cuda/sm90/kernel_table.inc"
#undef BLASST_PREFILL_KERNEL
#undef BLASST_DECODE_KERNEL
#undef BLASST_BACKWARD_KERNEL
  return nullptr;
}

DecodeKernel find_decode_kernel(DType dtype, int head_dim, KernelVariant v, int m_tiles, int warps) {
#define BLASST_PREFILL_KERNEL(E, D, V)
#define BLASST_BACKWARD_KERNEL(E, D, K)
#define BLASST_DECODE_KERNEL(E, D, V, MT, W)                                                            \
  if (dtype == DType::E && head_dim == D && v == KernelVariant::V && m_tiles == MT && warps == W)       \
    return DecodeKernel{&decode::launch<DType::E, D, KernelVariant::V, MT, W>,                          \
                        &decode::occupancy<DType::E, D, KernelVariant::V, MT, W>,                       \
                        &decode::load_box_keys<DType::E, D, KernelVariant::V, MT, W>, W};
#include "cuda/sm90/kernel_table.inc"
#undef BLASST_PREFILL_KERNEL
#undef BLASST_DECODE_KERNEL
#undef BLASST_BACKWARD_KERNEL
  return {};
}

const char* to_string(BackwardKernel k) {
  switch (k) {
    case BackwardKernel::mma_sync: return "mma_sync";
    case BackwardKernel::wgmma: return "wgmma";
  }
  return "?";
}

BackwardLaunchFn find_backward_kernel(DType dtype, int head_dim, BackwardKernel kernel) {
#define BLASST_PREFILL_KERNEL(E, D, V)
#define BLASST_DECODE_KERNEL(E, D, V, MT, W)
#define BLASST_BACKWARD_KERNEL(E, D, K)                                                 \
  if (dtype == DType::E && head_dim == D && kernel == BackwardKernel::K)                \
    return &backward::launch<DType::E, D, BackwardKernel::K>;
#include "cuda/sm90/kernel_table.inc"
#undef BLASST_PREFILL_KERNEL
#undef BLASST_DECODE_KERNEL
#undef BLASST_BACKWARD_KERNEL
  return nullptr;
}

namespace {

enum class Kind { prefill, decode, backward };
struct Entry {
  Kind kind;
  DType dtype;
  int head_dim;
};
const std::vector<Entry>& entries() {
  static const std::vector<Entry> e = {
#define BLASST_PREFILL_KERNEL(E, D, V) {Kind::prefill, DType::E, D},
#define BLASST_DECODE_KERNEL(E, D, V, MT, W) {Kind::decode, DType::E, D},
#define BLASST_BACKWARD_KERNEL(E, D, K) {Kind::backward, DType::E, D},
#include "cuda/sm90/kernel_table.inc"
#undef BLASST_PREFILL_KERNEL
#undef BLASST_DECODE_KERNEL
#undef BLASST_BACKWARD_KERNEL
  };
  return e;
}

// "a", "a or b", "a, b or c" over the distinct values in table order.
template <class Get>
std::string list_of(Kind kind, Get get) {
  std::vector<std::string> v;
  for (const Entry& e : entries())
    if (e.kind == kind && std::find(v.begin(), v.end(), get(e)) == v.end()) v.push_back(get(e));
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i == 0 ? "" : i + 1 == v.size() ? " or " : ", ") + v[i];
  return s;
}

bool has(Kind kind, DType dtype, int head_dim) {
  for (const Entry& e : entries())
    if (e.kind == kind && e.dtype == dtype && e.head_dim == head_dim) return true;
  return false;
}

}  // namespace

std::string prefill_head_dims() { return list_of(Kind::prefill, [](const Entry& e) { return std::to_string(e.head_dim); }); }
std::string prefill_dtypes() { return list_of(Kind::prefill, [](const Entry& e) { return std::string(blasst::to_string(e.dtype)); }); }
std::string decode_head_dims() { return list_of(Kind::decode, [](const Entry& e) { return std::to_string(e.head_dim); }); }
std::string decode_dtypes() { return list_of(Kind::decode, [](const Entry& e) { return std::string(blasst::to_string(e.dtype)); }); }
bool prefill_has(DType dtype, int head_dim) { return has(Kind::prefill, dtype, head_dim); }
bool decode_has(DType dtype, int head_dim) { return has(Kind::decode, dtype, head_dim); }
std::string backward_head_dims() { return list_of(Kind::backward, [](const Entry& e) { return std::to_string(e.head_dim); }); }
std::string backward_dtypes() { return list_of(Kind::backward, [](const Entry& e) { return std::string(blasst::to_string(e.dtype)); }); }
bool backward_has(DType dtype, int head_dim) { return has(Kind::backward, dtype, head_dim); }

}  // namespace blasst::sm90
