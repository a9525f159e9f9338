// C ABI over blasst::decode for the Python benchmark (bench_decode.py loads it with ctypes and
// hands it torch's device pointers and stream). Contiguous caches [B, L, Hk, d], q_len = 1.
#include <cstdint>
#include <cstring>
#include <string>

#include "blasst/blasst.hpp"
#include "cuda/sm90/decode/decode_api.hpp"

namespace {
thread_local std::string g_err;
// bdb_set_load_path: the K/V load path of the following bdb_decode calls (a benchmark probe of the
// cp.async fallback; the library chooses tensor maps).
blasst::sm90::decode::LoadPath g_loads = blasst::sm90::decode::LoadPath::automatic;
// bdb_set_warps: the instance family of the following bdb_decode / bdb_lambdas calls (8-warp or
// 4-warp kernels, or the library's rule), so that bench_decode.py --variants times both.
blasst::sm90::decode::Warps g_warps = blasst::sm90::decode::Warps::automatic;

// head_major: the caches are [B, Hk, L, d] in memory (each head's keys contiguous), viewed as
// [B, L, Hk, d] through strides (a layout probe for the benchmark).
blasst::DecodeProblem make(void* q, void* k, void* v, void* out, int B, int L, int hq, int hk, int d, int dtype,
                           int head_major = 0) {
  const blasst::DType dt = dtype == 0 ? blasst::DType::bf16 : blasst::DType::f16;
  const auto dev = blasst::DeviceKind::cuda;
  blasst::DecodeProblem p;
  p.q = blasst::Tensor::contiguous(q, dt, {B, 1, hq, d}, dev);
  p.k_cache = blasst::Tensor::contiguous(k, dt, {B, L, hk, d}, dev);
  p.v_cache = blasst::Tensor::contiguous(v, dt, {B, L, hk, d}, dev);
  p.out = blasst::Tensor::contiguous(out, dt, {B, 1, hq, d}, dev);
  if (head_major) {
    const std::int64_t st[4] = {std::int64_t(hk) * L * d, d, std::int64_t(L) * d, 1};
    for (int i = 0; i < 4; ++i) p.k_cache.stride[i] = p.v_cache.stride[i] = st[i];
  }
  return p;
}
}  // namespace

extern "C" {

const char* bdb_last_error() { return g_err.c_str(); }

// 0: the library's choice (tensor maps), 1: cp.async for every load.
void bdb_set_load_path(int cp_async) {
  g_loads = cp_async ? blasst::sm90::decode::LoadPath::cp_async : blasst::sm90::decode::LoadPath::automatic;
}

// 0: the library's rule, 8: the 8-warp instances, 4: the 4-warp ones (two CTAs per SM; where the
// table has none, the 8-warp ones).
void bdb_set_warps(int warps) {
  using blasst::sm90::decode::Warps;
  g_warps = warps == 8 ? Warps::eight : warps == 4 ? Warps::four : Warps::automatic;
}

// The warps per CTA of the instance a bdb_decode call with these arguments runs (8 or 4; -1 on error).
int bdb_planned_warps(void* q, void* k, void* v, void* out, int B, int L, int hq, int hk, int d, int dtype,
                      double lambda) {
  try {
    auto p = make(q, k, v, out, B, L, hq, hk, d, dtype);
    blasst::SkipConfig skip;
    if (lambda > 0) skip = blasst::SkipConfig::from_threshold(lambda);
    return blasst::sm90::decode::planned_warps(p, skip, g_warps);
  } catch (const std::exception& e) {
    g_err = e.what();
    return -1;
  }
}

// lambda <= 0: dense. stats (optional, 3 values): skipped, visited, split_tiles (synchronises).
// order: 0 natural, 1 max-first (seeded splits).
int bdb_decode(void* q, void* k, void* v, void* out, int B, int L, int hq, int hk, int d, int dtype, double lambda,
               void* stream, std::int64_t* stats, int head_major, int order) {
  try {
    auto p = make(q, k, v, out, B, L, hq, hk, d, dtype, head_major);
    blasst::SkipConfig skip;
    if (lambda > 0) skip = blasst::SkipConfig::from_threshold(lambda);
    if (lambda > 0) skip.with_order(order == 1 ? blasst::VisitOrder::max_first : blasst::VisitOrder::natural);
    blasst::RunOptions opt;
    opt.stream = stream;
    opt.collect_stats = stats != nullptr;
    blasst::SkipStats st;
    blasst::sm90::decode::run(p, skip, opt, stats ? &st : nullptr, g_loads, g_warps);
    if (stats) {
      stats[0] = st.total_skipped();
      stats[1] = st.total_visited();
      stats[2] = st.granularity.split_tiles;
    }
    return 0;
  } catch (const std::exception& e) {
    g_err = e.what();
    return 1;
  }
}

// One dense pass with the delta histogram (SPEC §5) merged over heads; for each target sparsity
// the lambda of the one-pass curve (DeltaHistogram::lambda_for). order 1: the deltas of seeded
// splits (max-first), from the skip kernel with lambda >= 1 (it skips nothing, but counts against
// the seeds).
int bdb_lambdas(void* q, void* k, void* v, void* out, int B, int L, int hq, int hk, int d, int dtype, void* stream,
                const double* targets, int n, double* lambdas, int order) {
  try {
    auto p = make(q, k, v, out, B, L, hq, hk, d, dtype);
    blasst::RunOptions opt;
    opt.stream = stream;
    opt.collect_histogram = true;
    blasst::SkipStats st;
    blasst::SkipConfig skip;
    if (order == 1) {
      skip = blasst::SkipConfig::from_factor(1e30);
      skip.with_order(blasst::VisitOrder::max_first);
    }
    blasst::sm90::decode::run(p, skip, opt, &st, g_loads, g_warps);  // blasst::decode with the family set
    blasst::DeltaHistogram h;
    for (const auto& x : st.hist) h.merge(x);
    for (int i = 0; i < n; ++i) lambdas[i] = h.lambda_for(targets[i]);
    return 0;
  } catch (const std::exception& e) {
    g_err = e.what();
    return 1;
  }
}

}  // extern "C"
