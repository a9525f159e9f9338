// Validation of attention / decode problems (see problem.hpp). Every failure is a blasst::Error
// that names the argument; nothing here trusts a shape, stride or offset before checking it.
#include "core/problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace blasst::detail {

DeviceToHostCopy copy_to_host = nullptr;

namespace {

constexpr std::int64_t kI32Max = std::numeric_limits<std::int32_t>::max();

std::string shape_str(const Tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank && i < 4; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.shape[i]);
  }
  return s + "]";
}

std::string dev_str(DeviceKind d) { return d == DeviceKind::cpu ? "cpu" : "cuda"; }

bool valid_dtype(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64;
}

// Structural checks of one tensor: defined, rank, device, dtype value, strides, sizes that keep
// every element offset (and the per-dimension extents) inside the integer ranges kernels use.
void check_tensor(const Tensor& t, const char* name, int rank, DeviceKind device) {
  if (!t.defined() && t.rank == 0)
    throw Error(std::string(name) + ": tensor is not defined (data == nullptr)");
  if (t.rank != rank)
    throw Error(std::string(name) + ": expected rank " + std::to_string(rank) + ", got rank " +
                std::to_string(t.rank));
  if (t.device != device)
    throw Error(std::string(name) + ": tensor is on " + dev_str(t.device) + " but the call runs on " +
                dev_str(device) + " (all tensors must be on the same device)");
  if (!valid_dtype(t.dtype))
    throw Error(std::string(name) + ": invalid dtype value " + std::to_string(static_cast<int>(t.dtype)));
  std::int64_t max_off = 0, count = 1;
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] < 0)
      throw Error(std::string(name) + ": negative dimension in shape " + shape_str(t));
    if (t.shape[i] > kI32Max)
      throw Error(std::string(name) + ": dimension " + std::to_string(i) + " = " +
                  std::to_string(t.shape[i]) + " exceeds the int32 range");
    if (t.stride[i] < 0)
      throw Error(std::string(name) + ": negative stride " + std::to_string(t.stride[i]) +
                  " in dimension " + std::to_string(i));
    if (t.shape[i] > 1) {
      std::int64_t span;
      if (__builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &span) ||
          __builtin_add_overflow(max_off, span, &max_off))
        throw Error(std::string(name) + ": element offsets overflow int64 (shape " + shape_str(t) + ")");
    }
    if (__builtin_mul_overflow(count, t.shape[i], &count))
      throw Error(std::string(name) + ": element count overflows int64 (shape " + shape_str(t) + ")");
  }
  // An empty tensor (a 0-length sequence) may come without storage.
  if (!t.defined() && count != 0)
    throw Error(std::string(name) + ": tensor is not defined (data == nullptr)");
  if (t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1)
    throw Error(std::string(name) + ": the last dimension must be contiguous (stride 1), got stride " +
                std::to_string(t.stride[rank - 1]));
  std::int64_t bytes;
  if (__builtin_mul_overflow(max_off + 1, static_cast<std::int64_t>(dtype_size(t.dtype)), &bytes))
    throw Error(std::string(name) + ": byte extent overflows int64 (shape " + shape_str(t) + ")");
}

void expect_dim(const Tensor& t, const char* name, int dim, std::int64_t want, const char* what) {
  if (t.shape[dim] != want)
    throw Error(std::string(name) + ": dimension " + std::to_string(dim) + " (" + what + ") is " +
                std::to_string(t.shape[dim]) + ", expected " + std::to_string(want) + " (shape " +
                shape_str(t) + ")");
}

void check_dtypes(const Tensor& q, const Tensor& k, const Tensor& v, const char* kn, const char* vn,
                  const Tensor& out, const Tensor* lse) {
  if (k.dtype != q.dtype)
    throw Error(std::string(kn) + ": dtype " + to_string(k.dtype) + " differs from q's " + to_string(q.dtype));
  if (v.dtype != q.dtype)
    throw Error(std::string(vn) + ": dtype " + to_string(v.dtype) + " differs from q's " + to_string(q.dtype));
  if (out.dtype != DType::f32 && out.dtype != DType::f64 && out.dtype != q.dtype)
    throw Error(std::string("out: dtype ") + to_string(out.dtype) + " not allowed (f32, f64 or q's dtype " +
                to_string(q.dtype) + ")");
  if (lse && lse->dtype != DType::f32 && lse->dtype != DType::f64)
    throw Error(std::string("lse: dtype ") + to_string(lse->dtype) + " not allowed (f32 or f64)");
}

double resolve_scale(const std::optional<double>& scale, std::int64_t d) {
  if (!scale) return 1.0 / std::sqrt(static_cast<double>(d));
  if (!std::isfinite(*scale) || *scale <= 0.0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", *scale);
    throw Error(std::string("scale must be finite and > 0, got ") + buf);
  }
  return *scale;
}

void check_mask(MaskKind m) {
  if (m != MaskKind::full && m != MaskKind::causal)
    throw Error("mask: invalid value " + std::to_string(static_cast<int>(m)));
}

// Reads n int32 values from host or device memory.
std::vector<std::int32_t> read_i32(const std::int32_t* src, std::int64_t n, DeviceKind device,
                                   const char* name) {
  std::vector<std::int32_t> h(static_cast<std::size_t>(n));
  if (n == 0) return h;
  if (device == DeviceKind::cpu) {
    for (std::int64_t i = 0; i < n; ++i) h[static_cast<std::size_t>(i)] = src[i];
  } else {
    if (!copy_to_host)
      throw Error(std::string(name) + ": device-resident offsets but no device copy is available "
                  "(built without CUDA)");
    copy_to_host(h.data(), src, static_cast<std::size_t>(n) * sizeof(std::int32_t));
  }
  return h;
}

void check_offsets(const std::vector<std::int32_t>& cu, std::int64_t total, const char* name,
                   const char* total_what) {
  if (cu[0] != 0) throw Error(std::string(name) + "[0] must be 0, got " + std::to_string(cu[0]));
  for (std::size_t i = 1; i < cu.size(); ++i)
    if (cu[i] < cu[i - 1])
      throw Error(std::string(name) + " must be non-decreasing: [" + std::to_string(i - 1) + "] = " +
                  std::to_string(cu[i - 1]) + " > [" + std::to_string(i) + "] = " + std::to_string(cu[i]));
  if (cu.back() != total)
    throw Error(std::string(name) + "[batch] = " + std::to_string(cu.back()) + " must equal " +
                total_what + " = " + std::to_string(total));
}

// A gradient tensor (or dout) must have the layout of its partner: rank, shape, the call's device, a dtype
// of f32, f64 or q's, non-negative strides with a contiguous last dimension, storage when not empty.
void check_like(const Tensor& t, const char* name, const Tensor& like, const char* like_name,
                DType qdtype, DeviceKind device) {
  if (t.rank != like.rank)
    throw Error(std::string(name) + ": expected rank " + std::to_string(like.rank) + " (as " +
                like_name + "), got rank " + std::to_string(t.rank));
  if (t.device != device)
    throw Error(std::string(name) + ": tensor is on " + dev_str(t.device) + " but the call runs on " +
                dev_str(device));
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] != like.shape[i])
      throw Error(std::string(name) + ": shape " + shape_str(t) + " differs from " + like_name + "'s " +
                  shape_str(like));
  if (t.dtype != DType::f32 && t.dtype != DType::f64 && t.dtype != qdtype)
    throw Error(std::string(name) + ": dtype " + to_string(t.dtype) + " not allowed (f32, f64 or q's dtype " +
                to_string(qdtype) + ")");
  std::int64_t max_off = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.stride[i] < 0)
      throw Error(std::string(name) + ": negative stride " + std::to_string(t.stride[i]) +
                  " in dimension " + std::to_string(i));
    std::int64_t span;
    if (t.shape[i] > 1 && (__builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &span) ||
                           __builtin_add_overflow(max_off, span, &max_off)))
      throw Error(std::string(name) + ": element offsets overflow int64 (shape " + shape_str(t) + ")");
  }
  if (t.rank > 0 && t.shape[t.rank - 1] > 1 && t.stride[t.rank - 1] != 1)
    throw Error(std::string(name) + ": the last dimension must be contiguous (stride 1), got stride " +
                std::to_string(t.stride[t.rank - 1]));
  if (!t.defined() && t.numel() != 0)
    throw Error(std::string(name) + ": tensor is not defined (data == nullptr)");
}

}  // namespace

ResolvedAttention validate_attention(const AttentionProblem& p, DeviceKind device) {
  ResolvedAttention r;
  r.device = device;
  check_mask(p.mask);
  r.mask = p.mask;
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr))
    throw Error("cu_seqlens_q / cu_seqlens_k: give both (ragged batch) or neither");
  r.ragged = p.cu_seqlens_q != nullptr;
  if (p.max_seqlen_q < 0) throw Error("max_seqlen_q must be >= 0, got " + std::to_string(p.max_seqlen_q));
  if (p.max_seqlen_k < 0) throw Error("max_seqlen_k must be >= 0, got " + std::to_string(p.max_seqlen_k));
  if (p.skip_set_words < 0) throw Error("skip_set_words must be >= 0, got " + std::to_string(p.skip_set_words));
  if (p.skip_set == nullptr && p.skip_set_words != 0)
    throw Error("skip_set_words: given without skip_set (the words to record the skip set into)");
  const int rk = r.ragged ? 3 : 4;
  check_tensor(p.q, "q", rk, device);
  check_tensor(p.k, "k", rk, device);
  check_tensor(p.v, "v", rk, device);
  check_tensor(p.out, "out", rk, device);
  // lse is optional: absent when it has no storage and no shape.
  const bool has_lse = p.lse.defined() || p.lse.rank != 0;
  if (has_lse) check_tensor(p.lse, "lse", rk - 1, device);
  check_dtypes(p.q, p.k, p.v, "k", "v", p.out, has_lse ? &p.lse : nullptr);
  // seed_max (optional input) has the layout of lse.
  const bool has_seed = p.seed_max.defined() || p.seed_max.rank != 0;
  if (has_seed) {
    check_tensor(p.seed_max, "seed_max", rk - 1, device);
    if (p.seed_max.dtype != DType::f32 && p.seed_max.dtype != DType::f64)
      throw Error(std::string("seed_max: dtype ") + to_string(p.seed_max.dtype) + " not allowed (f32 or f64)");
  }
  r.dtype = p.q.dtype;

  const int o = r.ragged ? 0 : 1;  // index of the sequence dimension
  r.hq = p.q.shape[o + 1];
  r.hk = p.k.shape[o + 1];
  r.d = p.q.shape[o + 2];
  r.dv = p.v.shape[o + 2];
  if (r.hq < 1) throw Error("q: number of query heads must be >= 1 (shape " + shape_str(p.q) + ")");
  if (r.hk < 1) throw Error("k: number of KV heads must be >= 1 (shape " + shape_str(p.k) + ")");
  if (r.hq % r.hk != 0)
    throw Error("k: query heads Hq = " + std::to_string(r.hq) + " must be a multiple of KV heads Hk = " +
                std::to_string(r.hk));
  r.group = r.hq / r.hk;
  if (r.d < 1) throw Error("q: head dimension d must be >= 1 (shape " + shape_str(p.q) + ")");
  if (r.dv < 1) throw Error("v: head dimension dv must be >= 1 (shape " + shape_str(p.v) + ")");
  expect_dim(p.k, "k", o + 2, r.d, "head dim d, as in q");
  expect_dim(p.v, "v", o + 0, p.k.shape[o], "keys, as in k");
  expect_dim(p.v, "v", o + 1, r.hk, "KV heads, as in k");
  expect_dim(p.out, "out", o + 0, p.q.shape[o], "queries, as in q");
  expect_dim(p.out, "out", o + 1, r.hq, "query heads, as in q");
  expect_dim(p.out, "out", o + 2, r.dv, "dv, as in v");
  if (has_lse) {
    expect_dim(p.lse, "lse", o + 0, r.hq, "query heads, as in q");
    expect_dim(p.lse, "lse", o + 1, p.q.shape[o], "queries, as in q");
  }
  if (has_seed) {
    expect_dim(p.seed_max, "seed_max", o + 0, r.hq, "query heads, as in q");
    expect_dim(p.seed_max, "seed_max", o + 1, p.q.shape[o], "queries, as in q");
  }
  r.scale = resolve_scale(p.scale, r.d);

  if (!r.ragged) {
    r.batch = p.q.shape[0];
    if (r.batch < 1) throw Error("q: batch B must be >= 1 (shape " + shape_str(p.q) + ")");
    expect_dim(p.k, "k", 0, r.batch, "batch, as in q");
    expect_dim(p.v, "v", 0, r.batch, "batch, as in q");
    expect_dim(p.out, "out", 0, r.batch, "batch, as in q");
    if (has_lse) expect_dim(p.lse, "lse", 0, r.batch, "batch, as in q");
    if (has_seed) expect_dim(p.seed_max, "seed_max", 0, r.batch, "batch, as in q");
    const std::int64_t lq = p.q.shape[1], lk = p.k.shape[1];
    r.q_start.assign(r.batch, 0);
    r.k_start.assign(r.batch, 0);
    r.q_len.assign(r.batch, lq);
    r.k_len.assign(r.batch, lk);
    r.max_q_len = lq;
    r.max_k_len = lk;
    return r;
  }

  // Ragged batch.
  if (p.batch < 1) throw Error("batch: number of sequences must be >= 1 with cu_seqlens, got " +
                               std::to_string(p.batch));
  if (p.batch >= kI32Max) throw Error("batch: " + std::to_string(p.batch) + " is too large");
  r.batch = p.batch;
  const std::int64_t tq = p.q.shape[0], tk = p.k.shape[0];
  // No sequence is longer than the whole token axis: a larger bound is a wrong argument (and would
  // size the kernels' grids for sequences that cannot exist).
  if (p.max_seqlen_q > tq)
    throw Error("max_seqlen_q = " + std::to_string(p.max_seqlen_q) + " exceeds the total query rows q.shape[0] (" +
                std::to_string(tq) + ")");
  if (p.max_seqlen_k > tk)
    throw Error("max_seqlen_k = " + std::to_string(p.max_seqlen_k) + " exceeds the total key rows k.shape[0] (" +
                std::to_string(tk) + ")");
  if (device != DeviceKind::cpu && p.max_seqlen_q > 0 && p.max_seqlen_k > 0) {
    // Capture-safe path: device offsets are not read; the kernels trust the bounds.
    r.max_q_len = p.max_seqlen_q;
    r.max_k_len = p.max_seqlen_k;
    return r;
  }
  const auto cq = read_i32(p.cu_seqlens_q, r.batch + 1, device, "cu_seqlens_q");
  const auto ck = read_i32(p.cu_seqlens_k, r.batch + 1, device, "cu_seqlens_k");
  check_offsets(cq, tq, "cu_seqlens_q", "total query rows q.shape[0]");
  check_offsets(ck, tk, "cu_seqlens_k", "total key rows k.shape[0]");
  r.q_start.resize(r.batch);
  r.q_len.resize(r.batch);
  r.k_start.resize(r.batch);
  r.k_len.resize(r.batch);
  for (std::int64_t b = 0; b < r.batch; ++b) {
    r.q_start[b] = cq[b];
    r.q_len[b] = static_cast<std::int64_t>(cq[b + 1]) - cq[b];
    r.k_start[b] = ck[b];
    r.k_len[b] = static_cast<std::int64_t>(ck[b + 1]) - ck[b];
    r.max_q_len = std::max(r.max_q_len, r.q_len[b]);
    r.max_k_len = std::max(r.max_k_len, r.k_len[b]);
  }
  if (p.max_seqlen_q > 0) {
    if (p.max_seqlen_q < r.max_q_len)
      throw Error("max_seqlen_q = " + std::to_string(p.max_seqlen_q) + " is below the longest query "
                  "sequence in cu_seqlens_q (" + std::to_string(r.max_q_len) + ")");
    r.max_q_len = p.max_seqlen_q;
  }
  if (p.max_seqlen_k > 0) {
    if (p.max_seqlen_k < r.max_k_len)
      throw Error("max_seqlen_k = " + std::to_string(p.max_seqlen_k) + " is below the longest key "
                  "sequence in cu_seqlens_k (" + std::to_string(r.max_k_len) + ")");
    r.max_k_len = p.max_seqlen_k;
  }
  return r;
}

ResolvedDecode validate_decode(const DecodeProblem& p, DeviceKind device) {
  ResolvedDecode r;
  r.device = device;
  check_mask(p.mask);
  r.mask = p.mask;
  r.paged = p.page_table != nullptr;
  if (p.max_seqlen_k < 0) throw Error("max_seqlen_k must be >= 0, got " + std::to_string(p.max_seqlen_k));
  check_tensor(p.q, "q", 4, device);
  check_tensor(p.k_cache, "k_cache", 4, device);
  check_tensor(p.v_cache, "v_cache", 4, device);
  check_tensor(p.out, "out", 4, device);
  const bool has_lse = p.lse.defined() || p.lse.rank != 0;
  if (has_lse) check_tensor(p.lse, "lse", 3, device);
  check_dtypes(p.q, p.k_cache, p.v_cache, "k_cache", "v_cache", p.out, has_lse ? &p.lse : nullptr);
  r.dtype = p.q.dtype;

  r.batch = p.q.shape[0];
  r.q_len = p.q.shape[1];
  r.hq = p.q.shape[2];
  r.d = p.q.shape[3];
  r.hk = p.k_cache.shape[2];
  r.dv = p.v_cache.shape[3];
  if (r.batch < 1) throw Error("q: batch B must be >= 1 (shape " + shape_str(p.q) + ")");
  if (r.hq < 1) throw Error("q: number of query heads must be >= 1 (shape " + shape_str(p.q) + ")");
  if (r.hk < 1) throw Error("k_cache: number of KV heads must be >= 1 (shape " + shape_str(p.k_cache) + ")");
  if (r.hq % r.hk != 0)
    throw Error("k_cache: query heads Hq = " + std::to_string(r.hq) +
                " must be a multiple of KV heads Hk = " + std::to_string(r.hk));
  r.group = r.hq / r.hk;
  if (r.d < 1) throw Error("q: head dimension d must be >= 1 (shape " + shape_str(p.q) + ")");
  if (r.dv < 1) throw Error("v_cache: head dimension dv must be >= 1 (shape " + shape_str(p.v_cache) + ")");
  expect_dim(p.k_cache, "k_cache", 3, r.d, "head dim d, as in q");
  expect_dim(p.v_cache, "v_cache", 0, p.k_cache.shape[0], "as in k_cache");
  expect_dim(p.v_cache, "v_cache", 1, p.k_cache.shape[1], "as in k_cache");
  expect_dim(p.v_cache, "v_cache", 2, r.hk, "KV heads, as in k_cache");
  expect_dim(p.out, "out", 0, r.batch, "batch, as in q");
  expect_dim(p.out, "out", 1, r.q_len, "q_len, as in q");
  expect_dim(p.out, "out", 2, r.hq, "query heads, as in q");
  expect_dim(p.out, "out", 3, r.dv, "dv, as in v_cache");
  if (has_lse) {
    expect_dim(p.lse, "lse", 0, r.batch, "batch, as in q");
    expect_dim(p.lse, "lse", 1, r.hq, "query heads, as in q");
    expect_dim(p.lse, "lse", 2, r.q_len, "q_len, as in q");
  }
  r.scale = resolve_scale(p.scale, r.d);

  std::int64_t capacity;
  if (r.paged) {
    r.num_pages = p.k_cache.shape[0];
    r.page_size = p.k_cache.shape[1];
    if (r.num_pages < 1) throw Error("k_cache: paged cache needs >= 1 page (shape " + shape_str(p.k_cache) + ")");
    if (r.page_size < 1) throw Error("k_cache: page_size must be >= 1 (shape " + shape_str(p.k_cache) + ")");
    if (p.page_table_stride < 1)
      throw Error("page_table_stride must be >= 1 (pages per sequence), got " +
                  std::to_string(p.page_table_stride));
    if (!p.seqlens_k) throw Error("seqlens_k: required with a paged cache (page_table given)");
    if (p.page_table_cols < 0 || p.page_table_cols > p.page_table_stride)
      throw Error("page_table_cols = " + std::to_string(p.page_table_cols) + " must lie in [0, page_table_stride = " +
                  std::to_string(p.page_table_stride) + "] (0: the stride)");
    r.max_pages_per_seq = p.page_table_stride;  // the row stride the table is read with
    r.pages_per_seq = p.page_table_cols > 0 ? p.page_table_cols : p.page_table_stride;
    std::int64_t cap64, entries;
    if (__builtin_mul_overflow(r.pages_per_seq, r.page_size, &cap64) || cap64 > kI32Max)
      throw Error("page_table_cols * page_size = capacity per sequence exceeds the int32 range");
    if (__builtin_mul_overflow(r.batch, r.max_pages_per_seq, &entries) || entries > kI32Max)
      throw Error("page_table: batch * page_table_stride exceeds the int32 range");
    capacity = cap64;
  } else {
    capacity = p.k_cache.shape[1];
    expect_dim(p.k_cache, "k_cache", 0, r.batch, "batch, as in q");
    if (p.page_table_stride != 0)
      throw Error("page_table_stride is set but page_table is nullptr");
  }

  // No sequence is longer than the cache holds, on either path below.
  if (p.max_seqlen_k > capacity)
    throw Error("max_seqlen_k = " + std::to_string(p.max_seqlen_k) + " exceeds the cache capacity " +
                std::to_string(capacity));
  if (device != DeviceKind::cpu && p.max_seqlen_k > 0 && p.seqlens_k) {
    // Capture-safe path: device lengths and page table are not read; kernels trust the bound.
    r.max_k_len = p.max_seqlen_k;
    return r;
  }
  r.k_len.assign(r.batch, capacity);
  if (p.seqlens_k) {
    const auto sl = read_i32(p.seqlens_k, r.batch, device, "seqlens_k");
    for (std::int64_t b = 0; b < r.batch; ++b) {
      if (sl[b] < 0 || sl[b] > capacity)
        throw Error("seqlens_k[" + std::to_string(b) + "] = " + std::to_string(sl[b]) +
                    " must lie in [0, " + std::to_string(capacity) + "] (cache capacity)");
      r.k_len[b] = sl[b];
    }
  }
  for (auto l : r.k_len) r.max_k_len = std::max(r.max_k_len, l);
  if (r.paged) {
    // Only the entries a sequence uses are read: rows may be shorter than page_table_stride.
    for (std::int64_t b = 0; b < r.batch; ++b) {
      const std::int64_t used = (r.k_len[b] + r.page_size - 1) / r.page_size;
      const auto pt = read_i32(p.page_table + b * r.max_pages_per_seq, used, device, "page_table");
      for (std::int64_t i = 0; i < used; ++i) {
        const std::int32_t pg = pt[static_cast<std::size_t>(i)];
        if (pg < 0 || pg >= r.num_pages)
          throw Error("page_table[" + std::to_string(b) + "][" + std::to_string(i) + "] = " +
                      std::to_string(pg) + " is outside [0, " + std::to_string(r.num_pages) + ") pages");
      }
    }
  }
  if (p.max_seqlen_k > 0) {
    if (p.max_seqlen_k < r.max_k_len)
      throw Error("max_seqlen_k = " + std::to_string(p.max_seqlen_k) + " is below the longest cached "
                  "sequence in seqlens_k (" + std::to_string(r.max_k_len) + ")");
    r.max_k_len = p.max_seqlen_k;
  }
  return r;
}

// ---- SPEC §2a: the effective visit order of an attention call --------------------------------

bool prefill_supports_max_first(const ResolvedAttention& r) {
  if (r.mask != MaskKind::full) return true;
  if (!r.ragged) return r.max_q_len == r.max_k_len;
  if (r.q_len.size() != static_cast<std::size_t>(r.batch) || r.k_len.size() != r.q_len.size())
    return false;  // lengths not host-visible (device offsets with both bounds given)
  for (std::size_t b = 0; b < r.q_len.size(); ++b)
    if (r.q_len[b] != r.k_len[b]) return false;
  return true;
}

VisitOrder effective_attention_order(const SkipConfig& skip, const ResolvedAttention& r) {
  if (skip.vote.order == VisitOrder::max_first && !skip.order_explicit && !prefill_supports_max_first(r))
    return VisitOrder::natural;
  return skip.vote.order;
}

SkipConfig with_effective_order(const SkipConfig& skip, const ResolvedAttention& r) {
  SkipConfig out = skip;
  out.vote.order = effective_attention_order(skip, r);
  out.order_explicit = true;
  return out;
}

}  // namespace blasst::detail

namespace blasst::detail {

AttentionProblem forward_of(const AttentionBackwardProblem& p) {
  AttentionProblem f;
  f.q = p.q;
  f.k = p.k;
  f.v = p.v;
  f.out = p.out;
  f.lse = p.lse;
  f.cu_seqlens_q = p.cu_seqlens_q;
  f.cu_seqlens_k = p.cu_seqlens_k;
  f.batch = p.batch;
  f.max_seqlen_q = p.max_seqlen_q;
  f.max_seqlen_k = p.max_seqlen_k;
  f.mask = p.mask;
  f.scale = p.scale;
  return f;
}

ResolvedAttention validate_attention_backward(const AttentionBackwardProblem& p, DeviceKind device) {
  const ResolvedAttention r = validate_attention(forward_of(p), device);
  check_like(p.dout, "dout", p.out, "out", r.dtype, device);
  check_like(p.dq, "dq", p.q, "q", r.dtype, device);
  check_like(p.dk, "dk", p.k, "k", r.dtype, device);
  check_like(p.dv, "dv", p.v, "v", r.dtype, device);
  if (p.dlse.defined() || p.dlse.rank != 0) {
    Tensor lse_like;  // the layout of lse, from q: [B, Hq, Lq] or ragged [Hq, Tq]
    lse_like.rank = p.q.rank - 1;
    if (r.ragged) {
      lse_like.shape[0] = p.q.shape[1];
      lse_like.shape[1] = p.q.shape[0];
    } else {
      lse_like.shape[0] = p.q.shape[0];
      lse_like.shape[1] = p.q.shape[2];
      lse_like.shape[2] = p.q.shape[1];
    }
    check_like(p.dlse, "dlse", lse_like, "lse", DType::f32, device);
    if (p.dlse.dtype != DType::f32 && p.dlse.dtype != DType::f64)
      throw Error(std::string("dlse: dtype ") + to_string(p.dlse.dtype) + " not allowed (f32 or f64)");
  }
  return r;
}

void validate_skip_set(const SkipSet& set, const SkipConfig& skip, std::int64_t batch, std::int64_t hq,
                       std::int64_t max_q, std::int64_t max_k) {
  const VoteGranularity& vt = skip.vote;
  const VoteGranularity& a = set.vote;
  if (!(a.tile_keys == vt.tile_keys && a.rows == vt.rows && a.heads == vt.heads && a.split_tiles == vt.split_tiles &&
        a.order == vt.order))
    throw Error("skip_set: recorded with another vote granularity than skip.vote");
  if (vt.rows < 1 || vt.tile_keys < 1)
    throw Error("skip_set: vote rows and tile_keys must be >= 1");
  const std::int64_t groups = (max_q + vt.rows - 1) / vt.rows, tiles = (max_k + vt.tile_keys - 1) / vt.tile_keys;
  if (set.batch != batch || set.heads != hq || set.groups != groups || set.tiles != tiles)
    throw Error("skip_set: dimensions [" + std::to_string(set.batch) + ", " + std::to_string(set.heads) + ", " +
                std::to_string(set.groups) + ", " + std::to_string(set.tiles) +
                "] do not match the problem's [batch, Hq, vote groups, tiles] = [" + std::to_string(batch) + ", " +
                std::to_string(hq) + ", " + std::to_string(groups) + ", " + std::to_string(tiles) + "]");
  if (static_cast<std::int64_t>(set.bits.size()) != (batch * hq * groups * tiles + 7) / 8)
    throw Error("skip_set: bits holds " + std::to_string(set.bits.size()) + " bytes, expected one bit per pair (" +
                std::to_string((batch * hq * groups * tiles + 7) / 8) + " bytes)");
}

}  // namespace blasst::detail
