// blasst._core: the thin nanobind layer between the Python package and the C++ API.
// Tensors arrive as DLPack views (any framework); outputs are allocated by the caller's framework
// in Python and passed in, so nothing here allocates device memory or synchronises by itself.
// Every blasst::Error surfaces in Python as ValueError carrying the C++ message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/calibration.hpp"
#include "blasst/config.hpp"
#include "blasst/gating.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using blasst::DeviceKind;
using blasst::DType;
using blasst::Error;
using blasst::Tensor;

using InArray = nb::ndarray<nb::ro>;  // any dtype, device, shape and strides
using OutArray = nb::ndarray<>;

std::string dtype_name(const nb::dlpack::dtype& t) {
  const char* kind = "";
  switch (t.code) {
    case static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int): kind = "int"; break;
    case static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt): kind = "uint"; break;
    case static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float): kind = "float"; break;
    case static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat): kind = "bfloat"; break;
    case 6: kind = "bool"; break;  // DLPack kDLBool
    default: return "(DLPack code " + std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits)";
  }
  return std::string(kind) + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

template <class A>
DType dtype_of(const A& a, const std::string& name) {
  const nb::dlpack::dtype t = a.dtype();
  if (t.lanes == 1) {
    if (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float)) {
      if (t.bits == 32) return DType::f32;
      if (t.bits == 16) return DType::f16;
      if (t.bits == 64) return DType::f64;
    } else if (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) && t.bits == 16) {
      return DType::bf16;
    }
  }
  throw Error(name + ": unsupported dtype " + dtype_name(t) +
              "; expected float32, float16, bfloat16 or float64");
}

template <class A>
DeviceKind device_of(const A& a, const std::string& name) {
  const int dev = a.device_type();
  if (dev == nb::device::cpu::value) return DeviceKind::cpu;
  if (dev == nb::device::cuda::value) return DeviceKind::cuda;
  throw Error(name + ": unsupported device (DLPack device type " + std::to_string(dev) +
              "); expected CPU or CUDA memory");
}

template <class A>
Tensor to_tensor(const A& a, const std::string& name) {
  Tensor t;
  const std::size_t rank = a.ndim();
  if (rank < 1 || rank > 4)
    throw Error(name + ": expected a tensor of rank 1..4, got rank " + std::to_string(rank));
  t.rank = static_cast<int>(rank);
  t.dtype = dtype_of(a, name);
  t.device = device_of(a, name);
  for (std::size_t i = 0; i < rank; ++i) {
    t.shape[i] = static_cast<std::int64_t>(a.shape(i));
    t.stride[i] = static_cast<std::int64_t>(a.stride(i));
  }
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  return t;
}

// int32 index arrays (cu_seqlens, seqlens, page tables) must live where the tensors live.
const std::int32_t* index_array(const InArray& a, const std::string& name, DeviceKind device,
                                std::size_t want_rank, std::int64_t* row_stride = nullptr) {
  const nb::dlpack::dtype t = a.dtype();
  if (t.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) || t.bits != 32 ||
      t.lanes != 1)
    throw Error(name + ": expected an int32 array, got " + dtype_name(t));
  if (a.ndim() != want_rank)
    throw Error(name + ": expected rank " + std::to_string(want_rank) + ", got rank " +
                std::to_string(a.ndim()));
  if (device_of(a, name) != device)
    throw Error(name + ": must be in the same memory (CPU or CUDA) as q");
  if (a.shape(want_rank - 1) > 1 && a.stride(want_rank - 1) != 1)
    throw Error(name + ": the last dimension must be contiguous (stride 1)");
  if (row_stride) *row_stride = want_rank == 2 ? static_cast<std::int64_t>(a.stride(0)) : 0;
  return static_cast<const std::int32_t*>(a.data());
}

// What py_attention and py_decode end with: mask, scale, skip settings and run options, then the
// call with the GIL released (the reference engine's threads and the kernel launches never touch
// Python objects).
template <class Problem>
void run_released(void (*entry)(const Problem&, const blasst::SkipConfig&,
                                const blasst::RunOptions&, blasst::SkipStats*),
                  Problem& p, bool causal, std::optional<double> scale,
                  const blasst::SkipConfig* skip, std::uintptr_t stream, blasst::SkipStats* stats,
                  bool histogram, bool record_deltas, int num_threads) {
  p.mask = causal ? blasst::MaskKind::causal : blasst::MaskKind::full;
  p.scale = scale;
  const blasst::SkipConfig cfg = skip ? *skip : blasst::SkipConfig{};
  blasst::RunOptions opt;
  opt.collect_stats = stats != nullptr;
  opt.collect_histogram = stats != nullptr && histogram;
  opt.record_deltas = stats != nullptr && record_deltas;
  opt.stream = reinterpret_cast<void*>(stream);
  opt.num_threads = num_threads;
  // float64 tensors run the reference in float64 (oracle mode): gradcheck-grade forwards, and the
  // backward's recomputed skip set votes on the same scores.
  opt.fp64 = p.q.dtype == DType::f64;
  nb::gil_scoped_release release;
  entry(p, cfg, opt, stats);
}

template <class Out>
blasst::AttentionProblem attention_problem(const InArray& q, const InArray& k, const InArray& v,
                                           const Out& out, const std::optional<InArray>& cu_seqlens_q,
                                           const std::optional<InArray>& cu_seqlens_k,
                                           std::int64_t max_seqlen_q, std::int64_t max_seqlen_k) {
  blasst::AttentionProblem p;
  p.q = to_tensor(q, "q");
  p.k = to_tensor(k, "k");
  p.v = to_tensor(v, "v");
  p.out = to_tensor(out, "out");
  if (cu_seqlens_q.has_value() != cu_seqlens_k.has_value())
    throw Error("cu_seqlens_q, cu_seqlens_k: give both offsets for a ragged batch, or neither");
  if (cu_seqlens_q) {
    p.cu_seqlens_q = index_array(*cu_seqlens_q, "cu_seqlens_q", p.q.device, 1);
    p.cu_seqlens_k = index_array(*cu_seqlens_k, "cu_seqlens_k", p.q.device, 1);
    if (cu_seqlens_q->shape(0) != cu_seqlens_k->shape(0))
      throw Error("cu_seqlens_q, cu_seqlens_k: must have the same length (batch + 1), got " +
                  std::to_string(cu_seqlens_q->shape(0)) + " and " +
                  std::to_string(cu_seqlens_k->shape(0)));
    if (cu_seqlens_q->shape(0) < 2)
      throw Error("cu_seqlens_q: needs batch + 1 >= 2 offsets");
    p.batch = static_cast<std::int64_t>(cu_seqlens_q->shape(0)) - 1;
  }
  p.max_seqlen_q = max_seqlen_q;
  p.max_seqlen_k = max_seqlen_k;
  return p;
}

// SPEC §9 skip-set words: a 1-D int32 array on q's device (recorded by the forward, read by the
// backward), as index_array checks it.
std::uint32_t* skip_set_words(const InArray& a, DeviceKind device, std::int64_t* count) {
  const std::int32_t* w = index_array(a, "skip_set", device, 1);
  *count = static_cast<std::int64_t>(a.shape(0));
  return reinterpret_cast<std::uint32_t*>(const_cast<std::int32_t*>(w));
}

void py_attention(const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
                  const std::optional<OutArray>& lse, const std::optional<InArray>& cu_seqlens_q,
                  const std::optional<InArray>& cu_seqlens_k, std::int64_t max_seqlen_q,
                  std::int64_t max_seqlen_k, bool causal, std::optional<double> scale,
                  const blasst::SkipConfig* skip, std::uintptr_t stream, blasst::SkipStats* stats,
                  bool histogram, bool record_deltas, int num_threads,
                  const std::optional<InArray>& skip_set, const std::optional<InArray>& seed_max) {
  blasst::AttentionProblem p =
      attention_problem(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  if (lse) p.lse = to_tensor(*lse, "lse");
  if (seed_max) p.seed_max = to_tensor(*seed_max, "seed_max");
  if (skip_set) p.skip_set = skip_set_words(*skip_set, p.q.device, &p.skip_set_words);
  run_released(&blasst::attention, p, causal, scale, skip, stream, stats, histogram, record_deltas,
               num_threads);
}

// The number of skip-set words the same attention call records (blasst::skip_set_shape).
std::int64_t py_skip_set_words(const InArray& q, const InArray& k, const InArray& v,
                               const OutArray& out, const std::optional<InArray>& cu_seqlens_q,
                               const std::optional<InArray>& cu_seqlens_k,
                               std::int64_t max_seqlen_q, std::int64_t max_seqlen_k, bool causal,
                               const blasst::SkipConfig* skip) {
  blasst::AttentionProblem p =
      attention_problem(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  p.mask = causal ? blasst::MaskKind::causal : blasst::MaskKind::full;
  return blasst::skip_set_shape(p, skip ? *skip : blasst::SkipConfig{}).words();
}

// SPEC §9 backward. skip_set: the forward's recorded words (None: dense when skip is None, else
// recomputed by the reference forward's own vote); lse None: the backward computes the LSE over
// kept keys in float64; dlse: gradient into the LSE.
void py_attention_backward(const InArray& q, const InArray& k, const InArray& v, const InArray& out,
                           const InArray& dout, const std::optional<InArray>& lse,
                           const std::optional<InArray>& dlse, const OutArray& dq,
                           const OutArray& dk, const OutArray& dv,
                           const std::optional<InArray>& cu_seqlens_q,
                           const std::optional<InArray>& cu_seqlens_k, std::int64_t max_seqlen_q,
                           std::int64_t max_seqlen_k, bool causal, std::optional<double> scale,
                           const blasst::SkipConfig* skip, const std::optional<InArray>& skip_set,
                           std::uintptr_t stream, int num_threads) {
  // The forward's arguments, checked as the forward checks them.
  const blasst::AttentionProblem f =
      attention_problem(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  blasst::AttentionBackwardProblem p;
  p.q = f.q;
  p.k = f.k;
  p.v = f.v;
  p.out = f.out;
  p.cu_seqlens_q = f.cu_seqlens_q;
  p.cu_seqlens_k = f.cu_seqlens_k;
  p.batch = f.batch;
  p.max_seqlen_q = f.max_seqlen_q;
  p.max_seqlen_k = f.max_seqlen_k;
  p.dout = to_tensor(dout, "dout");
  if (lse) p.lse = to_tensor(*lse, "lse");
  if (dlse) p.dlse = to_tensor(*dlse, "dlse");
  p.dq = to_tensor(dq, "dq");
  p.dk = to_tensor(dk, "dk");
  p.dv = to_tensor(dv, "dv");
  p.mask = causal ? blasst::MaskKind::causal : blasst::MaskKind::full;
  p.scale = scale;
  if (skip_set) p.skip_set = skip_set_words(*skip_set, p.q.device, &p.skip_set_words);
  const blasst::SkipConfig cfg = skip ? *skip : blasst::SkipConfig{};
  blasst::RunOptions opt;
  opt.num_threads = num_threads;
  opt.stream = reinterpret_cast<void*>(stream);
  opt.fp64 = p.q.dtype == DType::f64;  // as the forward (run_released): the same skip set
  nb::gil_scoped_release release;
  blasst::attention_backward(p, cfg, opt);
}

// The decode problem of blasst.decode's / blasst.DecodePlan's arrays (mask and scale are the
// caller's: run_released sets them for decode, the plan sets them itself).
blasst::DecodeProblem decode_problem(const InArray& q, const InArray& k_cache, const InArray& v_cache,
                                     const OutArray& out, const std::optional<OutArray>& lse,
                                     const std::optional<InArray>& page_table,
                                     const std::optional<InArray>& seqlens, std::int64_t max_seqlen_k) {
  blasst::DecodeProblem p;
  p.q = to_tensor(q, "q");
  p.k_cache = to_tensor(k_cache, "k_cache");
  p.v_cache = to_tensor(v_cache, "v_cache");
  p.out = to_tensor(out, "out");
  if (lse) p.lse = to_tensor(*lse, "lse");
  // One row of the page table and one length per sequence (q's batch); the table's columns bound
  // what a sequence may hold (a column slice of a wider table keeps its parent's row stride).
  const std::int64_t batch = p.q.rank > 0 ? p.q.shape[0] : 0;
  if (page_table) {
    p.page_table = index_array(*page_table, "page_table", p.q.device, 2, &p.page_table_stride);
    if (static_cast<std::int64_t>(page_table->shape(0)) != batch)
      throw Error("page_table: expected one row per sequence (" + std::to_string(batch) + "), got " +
                  std::to_string(page_table->shape(0)) + " rows");
    p.page_table_cols = static_cast<std::int64_t>(page_table->shape(1));
    if (p.page_table_cols < 1) throw Error("page_table: needs >= 1 column (pages per sequence)");
    if (p.page_table_stride < p.page_table_cols) {  // one row (stride unused) or overlapping rows
      if (page_table->shape(0) > 1)
        throw Error("page_table: rows overlap (row stride " + std::to_string(p.page_table_stride) + " < " +
                    std::to_string(p.page_table_cols) + " columns)");
      p.page_table_stride = p.page_table_cols;
    }
  }
  if (seqlens) {
    p.seqlens_k = index_array(*seqlens, "seqlens", p.q.device, 1);
    if (static_cast<std::int64_t>(seqlens->shape(0)) != batch)
      throw Error("seqlens: expected one length per sequence (" + std::to_string(batch) + "), got " +
                  std::to_string(seqlens->shape(0)));
  }
  p.max_seqlen_k = max_seqlen_k;
  return p;
}

void py_decode(const InArray& q, const InArray& k_cache, const InArray& v_cache,
               const OutArray& out, const std::optional<OutArray>& lse,
               const std::optional<InArray>& page_table, const std::optional<InArray>& seqlens,
               std::int64_t max_seqlen_k, bool causal, std::optional<double> scale,
               const blasst::SkipConfig* skip, std::uintptr_t stream, blasst::SkipStats* stats,
               bool histogram, bool record_deltas, int num_threads) {
  blasst::DecodeProblem p = decode_problem(q, k_cache, v_cache, out, lse, page_table, seqlens, max_seqlen_k);
  run_released(&blasst::decode, p, causal, scale, skip, stream, stats, histogram, record_deltas,
               num_threads);
}

// blasst.DecodePlan's core (python/blasst/_plan.py): the problem from the plan's example tensors,
// once; run() with raw addresses, which the wrapper has checked against the plan's shapes, dtypes,
// strides and device.
void py_decode_plan_init(blasst::DecodePlan* self, const InArray& q, const InArray& k_cache,
                         const InArray& v_cache, const OutArray& out, const std::optional<OutArray>& lse,
                         const std::optional<InArray>& page_table, const std::optional<InArray>& seqlens,
                         std::int64_t max_seqlen_k, bool causal, std::optional<double> scale,
                         const blasst::SkipConfig* skip, int num_threads) {
  blasst::DecodeProblem p = decode_problem(q, k_cache, v_cache, out, lse, page_table, seqlens, max_seqlen_k);
  p.mask = causal ? blasst::MaskKind::causal : blasst::MaskKind::full;
  p.scale = scale;
  blasst::RunOptions opt;
  opt.num_threads = num_threads;
  new (self) blasst::DecodePlan(p, skip ? *skip : blasst::SkipConfig{}, opt);
}

nb::dict granularity_dict(const blasst::VoteGranularity& g) {
  nb::dict d;
  d["tile_keys"] = g.tile_keys;
  d["rows"] = g.rows;
  d["heads"] = g.heads;
  d["split_tiles"] = g.split_tiles;
  d["order"] = std::string(blasst::to_string(g.order));
  return d;
}

template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> numpy_copy(const std::vector<T>& v) {
  auto* buf = new std::vector<T>(v);
  nb::capsule owner(buf, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(buf->data(), {buf->size()}, owner);
}

}  // namespace

namespace {
using FiniteSizeTuple = std::tuple<std::string, int, int>;
using PiecewiseTuple = std::tuple<std::vector<double>, std::vector<double>, std::optional<FiniteSizeTuple>>;

PiecewiseTuple piecewise_tuple(const blasst::PiecewiseLogFactor& f) {
  std::optional<FiniteSizeTuple> fs;
  if (f.finite_size)
    fs = FiniteSizeTuple{blasst::to_string(f.finite_size->mask), f.finite_size->rows, f.finite_size->tile_keys};
  return {f.targets, f.log_factors, fs};
}

blasst::PiecewiseLogFactor piecewise_from(const PiecewiseTuple& t) {
  blasst::PiecewiseLogFactor f;
  f.targets = std::get<0>(t);
  f.log_factors = std::get<1>(t);
  if (const auto& fs = std::get<2>(t)) {
    const std::string& mask = std::get<0>(*fs);
    if (mask != "causal" && mask != "full")
      throw blasst::Error("piecewise: finite_size mask must be 'causal' or 'full', got '" + mask + "'");
    f.finite_size = blasst::FiniteSizeTerm{mask == "full" ? blasst::MaskKind::full : blasst::MaskKind::causal,
                                           std::get<1>(*fs), std::get<2>(*fs)};
  }
  blasst::validate(f);
  return f;
}
}  // namespace

// ---- SPEC §6 calibration (blasst.calibration): curves from recorded statistics/histograms ----
namespace {
namespace cal = blasst::calibration;
using GranTuple = std::tuple<int, int, int, std::int64_t, std::string>;  // tile_keys, rows, heads, split, order
using HistArray = nb::ndarray<nb::ro, std::uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// One sample as the Python layer passes it: (component, layer, phase, length, stats, histograms,
// granularity of the histograms or None). stats: SkipStats (each pooled, their own granularity);
// histograms: per-head DeltaHistogram counts (kBins + 2 entries each).
using SampleTuple = std::tuple<std::string, std::string, std::string, std::int64_t,
                               nb::list, std::vector<HistArray>,
                               std::optional<GranTuple>>;

blasst::VoteGranularity granularity_from(const GranTuple& t) {
  blasst::VoteGranularity g;
  g.tile_keys = std::get<0>(t);
  g.rows = std::get<1>(t);
  g.heads = std::get<2>(t);
  g.split_tiles = std::get<3>(t);
  g.order = blasst::parse_visit_order(std::get<4>(t));
  return g;
}

cal::CurveSample sample_from(const SampleTuple& t, std::size_t index) {
  cal::CurveSample s;
  s.component = std::get<0>(t);
  s.layer = std::get<1>(t);
  s.phase = blasst::parse_phase(std::get<2>(t));
  s.length = std::get<3>(t);
  const std::string where = "calibration: sample " + std::to_string(index) +
                            (s.layer.empty() ? "" : " (layer '" + s.layer + "')");
  if (s.length <= 0) throw Error(where + ": key length must be > 0, got " + std::to_string(s.length));
  bool any = false;
  auto add = [&](const cal::SparsityCurve& c) {
    if (!any) s.curve = c;
    else if (!cal::same_granularity(s.curve.granularity(), c.granularity()))
      throw Error(where + ": statistics of different vote granularity in one sample: " +
                  cal::describe(s.curve.granularity()) + " vs " + cal::describe(c.granularity()));
    else s.curve.merge(c);
    any = true;
  };
  for (nb::handle h : std::get<4>(t)) {
    const blasst::SkipStats* st = nullptr;
    if (!nb::try_cast<const blasst::SkipStats*>(h, st) || st == nullptr)
      throw Error(where + ": expected blasst SkipStats in the statistics");
    if (st->hist.empty() && st->deltas.empty())
      throw Error(where + ": the SkipStats holds no delta histogram (record with "
                          "SkipStats(histogram=True)) or the call it was passed to ran no attention");
    cal::StatsCurves sc = cal::curves_from_stats(*st);
    add(sc.layer);
    for (auto& h : sc.per_head) s.heads.push_back(std::move(h));
  }
  const auto& hists = std::get<5>(t);
  if (!hists.empty() && !std::get<6>(t))
    throw Error(where + ": histograms without a granularity (pass the vote granularity the "
                        "statistics report, e.g. SkipStats.granularity)");
  for (const HistArray& a : hists) {
    blasst::DeltaHistogram h;
    if (a.shape(0) != h.counts.size())
      throw Error(where + ": a delta histogram has " + std::to_string(a.shape(0)) +
                  " bins, expected " + std::to_string(h.counts.size()));
    for (std::size_t i = 0; i < h.counts.size(); ++i) h.counts[i] = a.data()[i];
    cal::SparsityCurve c = cal::SparsityCurve::from_histogram(h, granularity_from(*std::get<6>(t)));
    s.heads.push_back(c);
    add(c);
  }
  if (!any || s.curve.empty())
    throw Error(where + ": no visited (vote group, key tile) pair recorded (empty curve)");
  return s;
}

nb::dict fit_dict(const cal::PhaseFit& f) {
  nb::dict d;
  d["component"] = f.component;
  d["layer"] = f.layer;
  d["phase"] = std::string(blasst::to_string(f.phase));
  d["granularity"] = granularity_dict(f.granularity);
  d["a"] = f.fit.ab.a;
  d["b"] = f.fit.ab.b;
  d["r2"] = f.fit.r2;
  d["n"] = f.fit.n;
  d["lengths"] = f.lengths;
  d["range"] = std::make_pair(f.range_lo, f.range_hi);
  d["max_sparsity"] = f.max_sparsity;
  nb::list pts;
  for (const auto& p : f.points) {
    nb::dict q;
    q["length"] = p.length;
    q["target"] = p.target;
    q["lambda"] = p.lambda;
    q["factor"] = p.factor;
    q["used"] = p.used;
    pts.append(q);
  }
  d["points"] = pts;
  d["extrapolated"] = f.extrapolated;
  nb::list inv;
  for (const auto& i : f.inverse) {
    nb::dict q;
    q["target"] = i.target;
    q["a_prime"] = i.a_prime;
    q["r2"] = i.r2;
    q["exponent"] = i.exponent;
    q["n"] = i.n;
    inv.append(q);
  }
  d["inverse_law"] = inv;
  d["warnings"] = f.warnings;
  d["piecewise"] = piecewise_tuple(f.curve);
  d["curve_error"] = f.curve_error;
  d["curve_error_plain"] = f.curve_error_plain;
  d["curve_error_finite_size"] = f.curve_error_finite_size;
  return d;
}

nb::dict validation_dict(const cal::ValidationReport& v) {
  nb::dict d;
  d["tolerance"] = v.tolerance;
  d["max_error"] = v.max_error;
  d["max_error_fixed"] = v.max_error_fixed;
  d["max_error_curve"] = v.max_error_curve;
  d["ok"] = v.ok();
  d["curve_ok"] = v.curve_ok();
  nb::list rows;
  for (const auto& r : v.rows) {
    nb::dict q;
    q["component"] = r.component;
    q["layer"] = r.layer;
    q["phase"] = std::string(blasst::to_string(r.phase));
    q["length"] = r.length;
    q["target"] = r.target;
    q["lambda"] = r.lambda;
    q["achieved"] = r.achieved;
    q["lambda_fixed"] = r.lambda_fixed;
    q["achieved_fixed"] = r.achieved_fixed;
    q["lambda_curve"] = r.lambda_curve;
    q["achieved_curve"] = r.achieved_curve;
    q["in_range"] = r.in_range;
    rows.append(q);
  }
  d["rows"] = rows;
  return d;
}

// The fitted calibration with the samples it came from (validation and configs need both).
struct PyCalibration {
  std::vector<cal::CurveSample> samples;
  cal::CalibrationResult result;
};
}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "blasst C++ core (Skip-Softmax sparse attention)";
  m.attr("__version__") = BLASST_VERSION;
  m.attr("built_with_cuda") = static_cast<bool>(BLASST_WITH_CUDA);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const blasst::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  nb::class_<blasst::SkipConfig>(m, "SkipConfig")
      .def(nb::init<>())
      .def_rw("enabled", &blasst::SkipConfig::enabled)
      .def_rw("threshold", &blasst::SkipConfig::threshold)
      .def_rw("factor", &blasst::SkipConfig::factor)
      .def_prop_rw(
          "calibration",
          [](const blasst::SkipConfig& c) -> std::optional<std::pair<double, double>> {
            if (!c.calibration) return std::nullopt;
            return std::make_pair(c.calibration->a, c.calibration->b);
          },
          [](blasst::SkipConfig& c, std::optional<std::pair<double, double>> ab) {
            if (ab) c.calibration = blasst::Calibration{ab->first, ab->second};
            else c.calibration.reset();
          })
      // The richer calibration form (SPEC §6, a config's "blasst" extension) as
      // (targets, log_factors, finite_size or None), finite_size = (mask, rows, tile_keys).
      .def_prop_rw(
          "piecewise",
          [](const blasst::SkipConfig& c) -> std::optional<PiecewiseTuple> {
            if (!c.piecewise) return std::nullopt;
            return piecewise_tuple(*c.piecewise);
          },
          [](blasst::SkipConfig& c, std::optional<PiecewiseTuple> t) {
            if (t) c.piecewise = piecewise_from(*t);
            else c.piecewise.reset();
          },
          nb::arg("value").none())
      .def_rw("target_sparsity", &blasst::SkipConfig::target_sparsity)
      .def_prop_rw(
          "tile_keys", [](const blasst::SkipConfig& c) { return c.vote.tile_keys; },
          [](blasst::SkipConfig& c, int v) { c.vote.tile_keys = v; })
      .def_prop_rw(
          "vote_rows", [](const blasst::SkipConfig& c) { return c.vote.rows; },
          [](blasst::SkipConfig& c, int v) { c.vote.rows = v; })
      .def_prop_rw(
          "vote_heads", [](const blasst::SkipConfig& c) { return c.vote.heads; },
          [](blasst::SkipConfig& c, int v) { c.vote.heads = v; })
      .def_prop_rw(
          "split_tiles", [](const blasst::SkipConfig& c) { return c.vote.split_tiles; },
          [](blasst::SkipConfig& c, std::int64_t v) { c.vote.split_tiles = v; })
      .def_prop_rw(
          "order",
          [](const blasst::SkipConfig& c) { return std::string(blasst::to_string(c.vote.order)); },
          [](blasst::SkipConfig& c, const std::string& s) {
            c.with_order(blasst::parse_visit_order(s));  // an order asked for (SPEC §2a)
          })
      .def_prop_rw(
          "order_explicit", [](const blasst::SkipConfig& c) { return c.order_explicit; },
          [](blasst::SkipConfig& c, bool v) { c.order_explicit = v; })
      // SPEC §2b FP8 screen: "off" | "strict" | "tight", and the tight margin's z.
      .def_prop_rw(
          "screen",
          [](const blasst::SkipConfig& c) { return std::string(blasst::to_string(c.screen.margin)); },
          [](blasst::SkipConfig& c, const std::string& s) { c.screen.margin = blasst::parse_screen_margin(s); })
      .def_prop_rw(
          "screen_z", [](const blasst::SkipConfig& c) { return c.screen.z; },
          [](blasst::SkipConfig& c, double z) { c.screen.z = z; })
      .def_prop_rw(
          "screen_ahead", [](const blasst::SkipConfig& c) { return c.screen.ahead; },
          [](blasst::SkipConfig& c, bool a) { c.screen.ahead = a; })
      .def_static("from_threshold", &blasst::SkipConfig::from_threshold, "lam"_a)
      .def_static("from_factor", &blasst::SkipConfig::from_factor, "factor"_a)
      .def_static(
          "from_piecewise",
          [](const PiecewiseTuple& form, double target) {
            return blasst::SkipConfig::from_piecewise(piecewise_from(form), target);
          },
          "form"_a, "target_sparsity"_a)
      .def_static(
          "from_calibration",
          [](double a, double b, double target) {
            return blasst::SkipConfig::from_calibration(blasst::Calibration{a, b}, target);
          },
          "a"_a, "b"_a, "target_sparsity"_a)
      .def("validate", [](const blasst::SkipConfig& c) { blasst::validate(c); })
      .def("resolve_lambda",
           [](const blasst::SkipConfig& c, std::int64_t seq_len_k) {
             return blasst::resolve_lambda(c, seq_len_k);
           },
           "seq_len_k"_a);

  nb::class_<blasst::SkipStats>(m, "SkipStats")
      .def(nb::init<>())
      .def_prop_ro("granularity",
                   [](const blasst::SkipStats& s) { return granularity_dict(s.granularity); })
      .def_ro("counted_at", &blasst::SkipStats::counted_at)
      .def_ro("visited", &blasst::SkipStats::visited)
      .def_ro("skipped", &blasst::SkipStats::skipped)
      .def_ro("lambdas", &blasst::SkipStats::lambda)
      .def_prop_ro("histograms",
                   [](const blasst::SkipStats& s) {
                     nb::list out;
                     for (const auto& h : s.hist) out.append(numpy_copy(h.counts));
                     return out;
                   })
      .def_prop_ro(
          "deltas", [](const blasst::SkipStats& s) { return numpy_copy(s.deltas); },
          nb::rv_policy::move)
      .def_ro("screened", &blasst::SkipStats::screened)
      .def_ro("screen_wrong", &blasst::SkipStats::screen_wrong)
      .def_prop_ro(
          "screen_deltas", [](const blasst::SkipStats& s) { return numpy_copy(s.screen_deltas); },
          nb::rv_policy::move)
      .def("total_visited", &blasst::SkipStats::total_visited)
      .def("total_skipped", &blasst::SkipStats::total_skipped)
      .def("total_screened", &blasst::SkipStats::total_screened)
      .def("total_screen_wrong", &blasst::SkipStats::total_screen_wrong)
      .def("sparsity", &blasst::SkipStats::sparsity)
      .def(
          "sparsity_at",
          [](const blasst::SkipStats& s, double lambda) {
            if (s.hist.empty())
              throw Error("sparsity_at: no delta histogram was collected "
                          "(pass SkipStats(histogram=True))");
            blasst::DeltaHistogram all;
            for (const auto& h : s.hist) all.merge(h);
            return all.sparsity_at(lambda);
          },
          "lam"_a)
      .def("reset", [](blasst::SkipStats& s) { s = blasst::SkipStats{}; });

  m.def("attention", &py_attention, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(),
        "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "max_seqlen_q"_a, "max_seqlen_k"_a,
        "causal"_a, "scale"_a.none(), "skip"_a.none(), "stream"_a, "stats"_a.none(),
        "histogram"_a = false, "record_deltas"_a = false, "num_threads"_a = 0,
        "skip_set"_a.none() = nb::none(), "seed_max"_a.none() = nb::none());
  m.def("skip_set_words", &py_skip_set_words, "q"_a, "k"_a, "v"_a, "out"_a,
        "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "max_seqlen_q"_a, "max_seqlen_k"_a,
        "causal"_a, "skip"_a.none());
  m.def("attention_backward", &py_attention_backward, "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a,
        "lse"_a.none(), "dlse"_a.none(), "dq"_a, "dk"_a, "dv"_a, "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(),
        "max_seqlen_q"_a, "max_seqlen_k"_a, "causal"_a, "scale"_a.none(), "skip"_a.none(),
        "skip_set"_a.none(), "stream"_a = 0, "num_threads"_a = 0);
  m.def("decode", &py_decode, "q"_a, "k_cache"_a, "v_cache"_a, "out"_a, "lse"_a.none(),
        "page_table"_a.none(), "seqlens"_a.none(), "max_seqlen_k"_a, "causal"_a,
        "scale"_a.none(), "skip"_a.none(), "stream"_a, "stats"_a.none(), "histogram"_a = false,
        "record_deltas"_a = false, "num_threads"_a = 0);

  nb::class_<blasst::DecodePlan>(m, "DecodePlan")
      .def("__init__", &py_decode_plan_init, "q"_a, "k_cache"_a, "v_cache"_a, "out"_a, "lse"_a.none(),
           "page_table"_a.none(), "seqlens"_a.none(), "max_seqlen_k"_a, "causal"_a, "scale"_a.none(),
           "skip"_a.none(), "num_threads"_a = 0)
      .def(
          "run",
          [](blasst::DecodePlan& self, std::uintptr_t q, std::uintptr_t out, std::uintptr_t lse,
             std::uintptr_t stream) {
            nb::gil_scoped_release release;
            self.run(reinterpret_cast<const void*>(q), reinterpret_cast<void*>(out),
                     reinterpret_cast<void*>(lse), reinterpret_cast<void*>(stream));
          },
          "q"_a, "out"_a, "lse"_a, "stream"_a);

  // SPEC §4 timestep gating: the one rule, for blasst.diffusion (which keeps a gate holding the
  // published t and asks a gate with each call's D whether skipping may run).
  nb::class_<blasst::TimestepGate>(m, "TimestepGate")
      .def(nb::init<std::optional<double>>(), "disabled_until"_a.none() = nb::none())
      .def("record_timestep", &blasst::TimestepGate::record_timestep, "timestep"_a,
           "num_train_timesteps"_a)
      .def("record_sigma", &blasst::TimestepGate::record_sigma, "sigma"_a)
      .def("reset", &blasst::TimestepGate::reset)
      .def("active", &blasst::TimestepGate::active)
      .def_prop_ro("current", &blasst::TimestepGate::current)
      .def_prop_ro("disabled_until", &blasst::TimestepGate::disabled_until);

  m.def("cuda_available", &blasst::cuda_available);
  m.def("cuda_device_name", &blasst::cuda_device_name);

  // SPEC §7 configuration, parsed by the C++ config module (src/config/).
  nb::class_<blasst::config::SparseAttentionConfig>(m, "SparseAttentionConfig")
      .def_static(
          "parse",
          [](const std::string& text, const std::string& source) {
            return blasst::config::parse(text, source);
          },
          "text"_a, "source"_a = "<string>")
      .def_static("load_file", &blasst::config::load_file, "path"_a)
      .def_static("load_model_dir", &blasst::config::load_model_dir, "path"_a)
      .def(
          "resolve",
          [](const blasst::config::SparseAttentionConfig& c, const std::string& layer,
             const std::string& phase, std::optional<double> target) {
            return blasst::config::resolve(c, layer, blasst::parse_phase(phase), target);
          },
          "layer"_a, "phase"_a, "target_sparsity"_a.none() = nb::none())
      .def(
          "disabled_until_timestep",
          [](const blasst::config::SparseAttentionConfig& c, const std::string& layer) {
            return blasst::config::disabled_until_timestep(c, layer);
          },
          "layer"_a)
      .def("to_json",
           [](const blasst::config::SparseAttentionConfig& c) { return blasst::config::to_json(c); })
      .def("write_into",
           [](const blasst::config::SparseAttentionConfig& c, const std::string& path) {
             blasst::config::write_into(path, c);
           },
           "path"_a)
      .def_prop_ro("group_names", [](const blasst::config::SparseAttentionConfig& c) {
        std::vector<std::string> names;
        for (const auto& g : c.groups) names.push_back(g.name);
        return names;
      });

  // SPEC §6 calibration of recorded curves (blasst.calibration; docs/python.md "Calibration").
  nb::class_<PyCalibration>(m, "Calibration")
      .def_static(
          "fit",
          [](const std::vector<SampleTuple>& samples, const std::vector<double>& targets,
             bool allow_any_target, bool per_layer, std::optional<std::string> prefill_mask,
             bool finite_size) {
            if (samples.empty()) throw Error("calibration: no samples");
            PyCalibration out;
            for (std::size_t i = 0; i < samples.size(); ++i)
              out.samples.push_back(sample_from(samples[i], i));
            cal::FitOptions fo;
            fo.targets = targets;
            fo.allow_any_target = allow_any_target;
            fo.per_layer = per_layer;
            fo.finite_size = finite_size;
            if (prefill_mask) {
              if (*prefill_mask != "causal" && *prefill_mask != "full")
                throw Error("calibration: mask must be 'causal', 'full' or None, got '" + *prefill_mask + "'");
              fo.prefill_mask = *prefill_mask == "full" ? blasst::MaskKind::full : blasst::MaskKind::causal;
            }
            {
              nb::gil_scoped_release release;
              out.result = cal::calibrate(out.samples, fo);
            }
            return out;
          },
          "samples"_a, "targets"_a, "allow_any_target"_a, "per_layer"_a, "prefill_mask"_a.none(),
          "finite_size"_a)
      .def_prop_ro("targets", [](const PyCalibration& c) { return c.result.targets; })
      .def_prop_ro("fits",
                   [](const PyCalibration& c) {
                     nb::list l;
                     for (const auto& f : c.result.fits) l.append(fit_dict(f));
                     return l;
                   })
      .def(
          "validate",
          [](const PyCalibration& c, std::optional<std::vector<double>> targets, double tolerance) {
            return validation_dict(
                cal::validate(c.result, c.samples, targets ? *targets : c.result.targets, tolerance));
          },
          "targets"_a.none(), "tolerance"_a)
      .def(
          "sparsity_at",
          [](const PyCalibration& c, std::size_t i, double lambda) {
            if (i >= c.samples.size()) throw Error("calibration: sample index out of range");
            return c.samples[i].curve.sparsity_at(lambda);
          },
          "sample"_a, "lam"_a)
      .def(
          "to_configs",
          [](const PyCalibration& c, double target_prefill, double target_decode,
             std::optional<double> disabled_until, const std::vector<std::string>& ignore,
             const std::string& layer_pattern) {
            cal::ConfigOptions co;
            co.target_prefill = target_prefill;
            co.target_decode = target_decode;
            co.disabled_until_timestep = disabled_until;
            co.ignore = ignore;
            co.layer_pattern = layer_pattern;
            auto cfgs = cal::to_configs(c.result, co);
            return std::vector<std::pair<std::string, blasst::config::SparseAttentionConfig>>(
                cfgs.begin(), cfgs.end());
          },
          "target_prefill"_a, "target_decode"_a, "disabled_until_timestep"_a.none(), "ignore"_a,
          "layer_pattern"_a);

}
