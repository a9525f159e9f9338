// Host side of the sm_90a backward kernels (SPEC §9): detail::cuda_attention_backward
// (src/cuda/cuda_dispatch.hpp) and sm90::backward::launch_attention_backward (backward_api.hpp).
// can_implement rejects what the kernels do not cover with a blasst::Error that names the
// argument; the instance comes from kernel_table.inc; scratch memory and staging from the shared
// host layer (src/cuda/host_launch.hpp). Three launches in stream order:
//   1. preprocess: D = rowsum(dO * O) - dLSE, LSE in log2 units (and dO rounded to q's dtype
//      when dout is f32);
//   2. main kernel: dK, dV written, dQ accumulated in f32 (atomics);
//   3. postprocess: dQ scaled and converted.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "blasst/blasst.hpp"
#include "core/kernel_geometry.hpp"
#include "core/problem.hpp"
#include "core/skip_set.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_dispatch.hpp"
#include "cuda/host_launch.hpp"
#include "cuda/sm90/backward/backward_api.hpp"
#include "cuda/sm90/backward/backward_params.hpp"
#include "cuda/sm90/backward/backward_prepost.hpp"
#include "cuda/sm90/backward/backward_work_list.hpp"
#include "cuda/sm90/kernel_table.hpp"

namespace blasst::sm90::backward {

namespace {

using detail::check_i32;
using i64 = std::int64_t;
using sm90::backward::kVoteRows;  // query rows of one skip-set bit (a kernel step holds 1 or 2)
constexpr int kBlockN = 128;   // BackwardTraits::kBlockN: keys per CTA = one key tile
constexpr const char* kKernel = "the CUDA backward kernel";

bool present(const Tensor& t) { return t.defined() || t.rank != 0; }

// The call, resolved once: validation, the skip set's host-visible maxima, sizes.
struct Plan {
  detail::ResolvedAttention r;
  i64 tokens_q = 0;     // query token axis: B * Lq or q.shape[0]
  i64 rows_ld = 0;      // LSE / D workspace rows per head (BackwardParams::rows_ld)
  i64 max_q = 0, max_k = 0;
  bool dout_conv = false;  // f32 dout: the preprocess rounds a copy to q's dtype
  std::size_t bytes_accum = 0, bytes_rows = 0, bytes_dout = 0, bytes_bits = 0;
  i64 set_groups = 0, set_tiles = 0;  // the skip set's dimensions (either form)
  // With a skip set: the work list (backward_work_list.hpp), its sizes and scratch arrays.
  bool work_list = false;
  int work_items = 0, split_cap = 0;
  std::size_t bytes_list[6] = {};
};

// The call's scratch memory, in the order it is taken: dQ accumulator, LSE (log2), dsum, the
// converted dout, the uploaded skip-set bits, the work list's arrays (WorkListScratch's order).
std::size_t scratch_bytes(const Plan& pl) {
  const std::size_t* l = pl.bytes_list;
  return detail::Workspace::bytes_for(
      {pl.bytes_accum, pl.bytes_rows, pl.bytes_rows, pl.bytes_dout, pl.bytes_bits, l[0], l[1], l[2], l[3], l[4], l[5]});
}

void check_dtype_in(const Tensor& t, const char* name, DType qdtype) {
  if (t.dtype != qdtype && t.dtype != DType::f32)
    throw Error(std::string(name) + ": dtype " + to_string(t.dtype) + " is not supported by " + kKernel + " (" +
                to_string(qdtype) + ", q's dtype, or f32)");
}

// The kernels' limits (CUTLASS can_implement), each an Error naming the argument.
Plan plan(const AttentionBackwardProblem& p, const SkipConfig& skip_in, const SkipSet* set,
          DeviceKind device = DeviceKind::cuda) {
  Plan pl;
  pl.r = detail::validate_attention_backward(p, device);
  const detail::ResolvedAttention& r = pl.r;
  // The order the forward used (SPEC §2a default rule): the recorded set's vote carries it.
  const SkipConfig skip = detail::with_effective_order(skip_in, r);
  if (r.dtype != DType::bf16 && r.dtype != DType::f16)
    throw Error(std::string("q: dtype ") + to_string(r.dtype) + " is not supported by " + kKernel + " (" +
                backward_dtypes() + ")");
  if (!backward_has(r.dtype, static_cast<int>(r.d)))
    throw Error("q: head dimension d = " + std::to_string(r.d) + " is not supported by " + kKernel + " (" +
                backward_head_dims() + ")");
  if (r.dv != r.d)
    throw Error("v: head dimension dv = " + std::to_string(r.dv) + " must equal d = " + std::to_string(r.d) +
                " on " + kKernel);
  check_dtype_in(p.out, "out", r.dtype);
  check_dtype_in(p.dout, "dout", r.dtype);
  check_dtype_in(p.dq, "dq", r.dtype);
  check_dtype_in(p.dk, "dk", r.dtype);
  check_dtype_in(p.dv, "dv", r.dtype);
  if (!present(p.lse))
    throw Error(std::string("lse: ") + kKernel + " needs the forward's LSE (f32); recomputing it is done only by "
                "the CPU reference");
  if (p.lse.dtype != DType::f32)
    throw Error(std::string("lse: dtype ") + to_string(p.lse.dtype) + " is not supported by " + kKernel + " (f32)");
  if (present(p.dlse) && p.dlse.dtype != DType::f32)
    throw Error(std::string("dlse: dtype ") + to_string(p.dlse.dtype) + " is not supported by " + kKernel + " (f32)");
  // cp.async reads 16-byte chunks of q, k, v (and dout unless it is converted first).
  const i64 vec = 16 / static_cast<i64>(dtype_size(r.dtype));
  pl.dout_conv = p.dout.dtype == DType::f32;
  for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.dout, "dout"}}) {
    if (t == &p.dout && pl.dout_conv) continue;
    // (Staged host tensors land in fresh, aligned device buffers: only their strides matter.)
    if (device == DeviceKind::cuda) detail::check_aligned16(*t, name, kKernel);
    detail::check_strides_multiple(*t, name, vec, kKernel, "cp.async reads 16-byte row chunks");
  }
  if (skip.enabled) validate(skip);

  pl.tokens_q = r.ragged ? p.q.shape[0] : r.batch * p.q.shape[1];
  // The skip set's dimensions come from the problem's bounds (SkipSetShape), as the forward
  // recorded them.
  pl.max_q = r.max_q_len;
  pl.max_k = r.max_k_len;
  if (p.skip_set != nullptr) {
    // The forward's words (AttentionProblem::skip_set), in q's memory: read in place (device) or
    // uploaded (staged host tensors). Same bits as a SkipSet's bytes (little-endian words).
    if (set != nullptr) throw Error("skip_set: given twice (as words in the problem and as a SkipSet)");
    const SkipSetShape shape = detail::skip_set_shape_of(r, detail::prefill_vote_granularity(skip.vote.order));
    detail::check_skip_set_words(p.skip_set_words, shape, "skip_set_words");
    if (reinterpret_cast<std::uintptr_t>(p.skip_set) % alignof(std::uint32_t) != 0)
      throw Error("skip_set: must be 4-byte aligned (32-bit words)");
    pl.set_groups = shape.groups;
    pl.set_tiles = shape.tiles;
  } else if (set != nullptr) {
    detail::validate_skip_set(*set, skip, r.batch, r.hq, pl.max_q, pl.max_k);
    if (set->vote.rows != kVoteRows || set->vote.tile_keys != kBlockN)
      throw Error("skip_set: " + std::string(kKernel) + " reads sets recorded at vote rows " +
                  std::to_string(kVoteRows) + " x tile_keys " + std::to_string(kBlockN) +
                  " (one bit per vote group and key tile), got rows " + std::to_string(set->vote.rows) +
                  " x tile_keys " + std::to_string(set->vote.tile_keys));
    pl.bytes_bits = set->bits.size();
    pl.set_groups = set->groups;
    pl.set_tiles = set->tiles;
  } else if (skip.enabled) {
    throw Error("skip_set: skipping is on but no skip set was given; " + std::string(kKernel) +
                " does not recompute it (pass the forward's skip set, recorded by reference::attention)");
  }
  check_i32(r.batch, "batch");
  if (r.batch > 65535) throw Error("batch = " + std::to_string(r.batch) + " exceeds the backward grid's 65535");
  if (r.hk > 65535) throw Error("k: KV heads = " + std::to_string(r.hk) + " exceed the backward grid's 65535");
  check_i32(pl.tokens_q, "query tokens");
  check_i32(r.max_k_len, "max key length");
  check_i32(pl.tokens_q * r.hq, "query tokens x heads");
  check_i32(pl.tokens_q * r.hq * r.d / 256 + 1, "dQ postprocess blocks");
  // LSE / D rows per head: every sequence from a multiple of kLseRowAlign, its length rounded up
  // to one (BackwardParams::rows_ld, lse_row_start).
  const i64 align = sm90::backward::kLseRowAlign;
  pl.rows_ld = r.ragged ? (pl.tokens_q + align * r.batch + align - 1) / align * align
                        : r.batch * ((p.q.shape[1] + align - 1) / align * align);
  check_i32(pl.rows_ld * r.hq, "LSE rows x heads");
  pl.bytes_rows = static_cast<std::size_t>(pl.rows_ld * r.hq) * sizeof(float);
  // the dQ accumulator over the same padded rows (dq_accum_index)
  pl.bytes_accum = static_cast<std::size_t>(pl.rows_ld * r.hq * r.d) * sizeof(float);
  pl.bytes_dout = pl.dout_conv ? static_cast<std::size_t>(pl.tokens_q * r.hq * r.d) * 2 : 0;
  // With a skip set and GQA / MQA the CTAs run from a work list: kept work counted on the device,
  // the heavy blocks first, split by query head, the rest in the fixed order
  // (backward_work_list.hpp). MHA has no split, and its list cost more than it won (H100,
  // 2026-12-07: full-mask d64 90 % +6.5 %, d128 70 % +2 %): it keeps the fixed order, key block 0
  // first (launch_block_and_head's sink_first).
  pl.work_list = (p.skip_set != nullptr || set != nullptr) && r.group > 1;
  const int nb = static_cast<int>(check_i32((r.max_k_len + kBlockN - 1) / kBlockN, "key blocks"));
  if (pl.work_list) {
    const int batch = static_cast<int>(r.batch), hk = static_cast<int>(r.hk), group = static_cast<int>(r.group);
    pl.split_cap = sm90::backward::split_capacity(batch, hk, group, nb, static_cast<int>(r.d));
    check_i32(i64(nb) * r.hk + i64(pl.split_cap) * (r.group - 1), "backward CTAs per sequence");
    check_i32(i64(nb) * r.hq, "key blocks x query heads");
    pl.work_items = sm90::backward::work_items_capacity(nb, hk, group, pl.split_cap);
    BackwardParams sizes;
    sizes.batch = batch;
    sizes.hq = static_cast<int>(r.hq);
    sizes.hk = hk;
    sizes.group = group;
    sizes.num_n_blocks = nb;
    sizes.head_dim = static_cast<int>(r.d);
    sizes.work_items = pl.work_items;
    sizes.split_cap = pl.split_cap;
    sm90::backward::work_list_bytes(sizes, pl.bytes_list);
  } else {
    check_i32(i64(nb) * r.hk, "backward CTAs per sequence");
  }
  return pl;
}

RowStrides rows_of(const Tensor& t, bool ragged) {
  RowStrides s;
  if (ragged) {
    s.row = t.stride[0];
    s.head = t.stride[1];
  } else {
    s.batch = t.stride[0];
    s.row = t.stride[1];
    s.head = t.stride[2];
  }
  return s;
}

LseStrides lse_of(const Tensor& t, bool ragged) {
  LseStrides s;
  if (ragged) {
    s.head = t.stride[0];
    s.row = t.stride[1];
  } else {
    s.batch = t.stride[0];
    s.head = t.stride[1];
    s.row = t.stride[2];
  }
  return s;
}

BackwardParams make_params(const AttentionBackwardProblem& p, const Plan& pl) {
  const detail::ResolvedAttention& r = pl.r;
  BackwardParams prm;
  prm.q = p.q.data;
  prm.k = p.k.data;
  prm.v = p.v.data;
  prm.out = p.out.data;
  prm.dout = p.dout.data;
  prm.lse = static_cast<const float*>(p.lse.data);
  prm.dlse = present(p.dlse) ? static_cast<const float*>(p.dlse.data) : nullptr;
  prm.q_s = rows_of(p.q, r.ragged);
  prm.k_s = rows_of(p.k, r.ragged);
  prm.v_s = rows_of(p.v, r.ragged);
  prm.out_s = rows_of(p.out, r.ragged);
  prm.dout_s = rows_of(p.dout, r.ragged);
  prm.dq_s = rows_of(p.dq, r.ragged);
  prm.dk_s = rows_of(p.dk, r.ragged);
  prm.dv_s = rows_of(p.dv, r.ragged);
  prm.lse_s = lse_of(p.lse, r.ragged);
  if (prm.dlse) prm.dlse_s = lse_of(p.dlse, r.ragged);
  prm.out_f32 = p.out.dtype == DType::f32;
  prm.dout_f32 = p.dout.dtype == DType::f32;
  prm.dq = p.dq.data;
  prm.dk = p.dk.data;
  prm.dv = p.dv.data;
  prm.dq_f32 = p.dq.dtype == DType::f32;
  prm.dk_f32 = p.dk.dtype == DType::f32;
  prm.dv_f32 = p.dv.dtype == DType::f32;
  prm.batch = static_cast<int>(r.batch);
  prm.hq = static_cast<int>(r.hq);
  prm.hk = static_cast<int>(r.hk);
  prm.group = static_cast<int>(r.group);
  if (r.ragged) {
    prm.cu_q = p.cu_seqlens_q;
    prm.cu_k = p.cu_seqlens_k;
  } else {
    prm.len_q = static_cast<int>(check_i32(p.q.shape[1], "q length"));
    prm.len_k = static_cast<int>(check_i32(p.k.shape[1], "k length"));
  }
  prm.tokens_q = static_cast<int>(pl.tokens_q);
  prm.rows_ld = static_cast<int>(pl.rows_ld);
  prm.tokens_k = static_cast<int>(check_i32(r.ragged ? p.k.shape[0] : r.batch * p.k.shape[1], "key tokens"));
  prm.num_n_blocks = static_cast<int>((r.max_k_len + kBlockN - 1) / kBlockN);
  prm.scale = static_cast<float>(r.scale);
  prm.scale_log2 = static_cast<float>(r.scale * 1.4426950408889634);
  prm.causal = r.mask == MaskKind::causal;
  prm.head_dim = static_cast<int>(r.d);
  prm.causal_section_heads = causal_launch_section_heads(prm.hk, prm.group, prm.num_n_blocks);
  prm.dout_main = p.dout.data;
  prm.dout_main_s = prm.dout_s;
  return prm;
}

}  // namespace

void check_attention_backward(const AttentionBackwardProblem& p, const SkipConfig& skip, const SkipSet* skip_set,
                              DeviceKind device) {
  (void)plan(p, skip, skip_set, device);
}

std::size_t attention_backward_workspace_bytes(const AttentionBackwardProblem& p, const SkipConfig& skip,
                                               const RunOptions& opt, const SkipSet* skip_set) {
  // Host tensors (staged): the device copies have the host layouts, so the host problem sizes it.
  const DeviceKind where = p.q.device == DeviceKind::cpu && opt.device == DeviceKind::cuda ? DeviceKind::cpu
                                                                                           : DeviceKind::cuda;
  const Plan pl = plan(p, skip, skip_set, where);
  return scratch_bytes(pl);
}

void launch_attention_backward(const AttentionBackwardProblem& p, const SkipConfig& skip, const RunOptions& opt,
                               const SkipSet* skip_set, BackwardKernel kernel) {
  const Plan pl = plan(p, skip, skip_set);
  const detail::ResolvedAttention& r = pl.r;
  const BackwardLaunchFn run = find_backward_kernel(r.dtype, static_cast<int>(r.d), kernel);
  if (run == nullptr)
    throw Error(std::string("no CUDA backward kernel instance for ") + to_string(r.dtype) + ", d = " +
                std::to_string(r.d) + ", " + to_string(kernel) + " (src/cuda/sm90/kernel_table.inc)");
  BackwardParams prm = make_params(p, pl);
  cudaStream_t stream = static_cast<cudaStream_t>(opt.stream);
  // Same order as attention_backward_workspace_bytes.
  detail::Workspace ws(opt, stream, "attention_backward");
  ws.reserve(scratch_bytes(pl));  // one pool allocation for the blocks below
  prm.dq_accum = static_cast<float*>(ws.take(pl.bytes_accum));
  prm.lse_log2 = static_cast<float*>(ws.take(pl.bytes_rows));
  prm.dsum = static_cast<float*>(ws.take(pl.bytes_rows));
  if (pl.dout_conv) {
    prm.dout_conv = ws.take(pl.bytes_dout);
    prm.dout_main = prm.dout_conv;
    const i64 d = r.d, hq = r.hq;
    prm.dout_main_s.row = hq * d;  // [tokens_q, hq, d]
    prm.dout_main_s.head = d;
    prm.dout_main_s.batch = r.ragged ? 0 : p.q.shape[1] * hq * d;
  }
  if (skip_set != nullptr && pl.bytes_bits > 0) {
    // The host set is uploaded on every call (bits / 8 bytes; pageable memory is staged by the
    // driver before cudaMemcpyAsync returns, so the set may change afterwards).
    void* bits = ws.take(pl.bytes_bits);
    BLASST_CUDA_CHECK(cudaMemcpyAsync(bits, skip_set->bits.data(), pl.bytes_bits, cudaMemcpyHostToDevice, stream));
    prm.skip_bits = static_cast<const std::uint8_t*>(bits);
  } else if (p.skip_set != nullptr) {
    prm.skip_bits = reinterpret_cast<const std::uint8_t*>(p.skip_set);
  }
  prm.skip_groups = pl.set_groups;
  prm.skip_tiles = pl.set_tiles;
  sm90::backward::WorkListScratch list;
  if (pl.work_list) {
    list.counts = static_cast<int*>(ws.take(pl.bytes_list[0]));
    list.split_of = static_cast<int*>(ws.take(pl.bytes_list[1]));
    list.items = static_cast<WorkItem*>(ws.take(pl.bytes_list[2]));
    list.splits = static_cast<SplitBlock*>(ws.take(pl.bytes_list[3]));
    list.counters = static_cast<int*>(ws.take(pl.bytes_list[4]));
    list.parts = static_cast<float*>(ws.take(pl.bytes_list[5]));
    prm.work_items = pl.work_items;
    prm.split_cap = pl.split_cap;
  }
  launch_preprocess(prm, r.dtype, stream);  // also zeroes dq_accum
  if (prm.num_n_blocks > 0) {
    if (pl.work_list) {
      int dev = 0;
      BLASST_CUDA_CHECK(cudaGetDevice(&dev));
      launch_work_list(prm, list, static_cast<int>(pl.max_q), detail::multiprocessor_count(dev), stream);
    }
    run(prm, stream);
    if (pl.work_list) launch_split_sum(prm, r.dtype, stream);
  }
  launch_postprocess(prm, r.dtype, stream);
}

}  // namespace blasst::sm90::backward

namespace blasst::detail {

namespace {

// Host tensors, opt.device == cuda: staged through device memory, run, copied back, synchronised.
void run_staged(const AttentionBackwardProblem& hp, const SkipConfig& skip, const RunOptions& opt,
                const SkipSet* skip_set, sm90::BackwardKernel kernel) {
  const ResolvedAttention r = validate_attention_backward(hp, DeviceKind::cpu);  // errors name the host arguments
  sm90::backward::check_attention_backward(hp, skip, skip_set, DeviceKind::cpu);  // before any CUDA work
  DeviceStaging staging(static_cast<cudaStream_t>(opt.stream));
  AttentionBackwardProblem dp = hp;
  for (auto [h, d] : {std::pair{&hp.q, &dp.q}, {&hp.k, &dp.k}, {&hp.v, &dp.v}, {&hp.out, &dp.out},
                      {&hp.dout, &dp.dout}, {&hp.lse, &dp.lse}, {&hp.dlse, &dp.dlse}, {&hp.dq, &dp.dq},
                      {&hp.dk, &dp.dk}, {&hp.dv, &dp.dv}})
    *d = staging.upload(*h);
  if (hp.cu_seqlens_q) {
    dp.cu_seqlens_q = staging.upload(hp.cu_seqlens_q, static_cast<std::size_t>(r.batch + 1));
    dp.cu_seqlens_k = staging.upload(hp.cu_seqlens_k, static_cast<std::size_t>(r.batch + 1));
  }
  if (hp.skip_set != nullptr)  // the forward's words (checked above), as 32-bit values
    dp.skip_set = reinterpret_cast<const std::uint32_t*>(staging.upload(
        reinterpret_cast<const std::int32_t*>(hp.skip_set), static_cast<std::size_t>(hp.skip_set_words)));
  staging.synchronize();  // offsets are read back by validation
  RunOptions dopt = opt;
  dopt.device = DeviceKind::cuda;
  sm90::backward::launch_attention_backward(dp, skip, dopt, skip_set, kernel);
  staging.download(hp.dq, dp.dq);
  staging.download(hp.dk, dp.dk);
  staging.download(hp.dv, dp.dv);
  staging.synchronize();
}

void check_host_or_device(const AttentionBackwardProblem& p, const RunOptions& opt) {
  if (p.q.device == DeviceKind::cpu && opt.device != DeviceKind::cuda)
    throw Error("q: host tensor on the CUDA path; set RunOptions::device = cuda to stage it");
}

}  // namespace

std::size_t cuda_attention_backward_workspace_bytes(const AttentionBackwardProblem& p, const SkipConfig& skip,
                                                    const RunOptions& opt, const SkipSet* skip_set) {
  check_host_or_device(p, opt);
  return sm90::backward::attention_backward_workspace_bytes(p, skip, opt, skip_set);
}

void cuda_attention_backward_on(const AttentionBackwardProblem& p, const SkipConfig& skip, const RunOptions& opt,
                                const SkipSet* skip_set, sm90::BackwardKernel kernel) {
  check_host_or_device(p, opt);
  if (p.q.device == DeviceKind::cpu) return run_staged(p, skip, opt, skip_set, kernel);
  sm90::backward::launch_attention_backward(p, skip, opt, skip_set, kernel);
}

void cuda_attention_backward(const AttentionBackwardProblem& p, const SkipConfig& skip, const RunOptions& opt,
                             const SkipSet* skip_set) {
  cuda_attention_backward_on(p, skip, opt, skip_set, sm90::backward::kDefaultBackwardKernel);
}

}  // namespace blasst::detail
