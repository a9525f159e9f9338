// blasst: Skip-Softmax sparse attention (BLASST), public C++ API.
//
// The contract is ../shared/SPEC.md (mirrored in docs/spec.md). Layout conventions:
//   Q [B, Lq, Hq, d], K [B, Lk, Hk, d], V [B, Lk, Hk, dv], O [B, Lq, Hq, dv], LSE [B, Hq, Lq].
//   Ragged batches: Q [Tq, Hq, d], K/V [Tk, Hk, d], O [Tq, Hq, dv], LSE [Hq, Tq] with
//   cu_seqlens_q / cu_seqlens_k (batch + 1 int32 offsets).
// Every entry point validates its inputs and throws blasst::Error with a message that names the
// offending argument; nothing here is undefined behaviour on bad input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace blasst {

// Every invalid argument, malformed file or unsupported configuration is reported as an Error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType : std::uint8_t { f32, f16, bf16, f64 };
enum class DeviceKind : std::uint8_t { cpu, cuda };
enum class MaskKind : std::uint8_t { full, causal };
enum class Phase : std::uint8_t { prefill, decode };
// SPEC §2a: the order in which a vote group visits its key tiles.
enum class VisitOrder : std::uint8_t { natural, max_first };
// SPEC §2b: the margin of the FP8 screen (off: no screen, the plain skip path).
enum class ScreenMargin : std::uint8_t { off, strict, tight };

std::size_t dtype_size(DType t);
const char* to_string(DType t);
const char* to_string(MaskKind m);
const char* to_string(Phase p);
const char* to_string(VisitOrder o);
const char* to_string(ScreenMargin m);
// Parse the names above ("f32", "bf16", "causal", "prefill", "max_first", ...); throws Error.
DType parse_dtype(const std::string& s);
Phase parse_phase(const std::string& s);
VisitOrder parse_visit_order(const std::string& s);
ScreenMargin parse_screen_margin(const std::string& s);  // "off", "strict", "tight"

// A strided view (rank 1..4) of memory owned by the caller. Strides are in elements.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  DeviceKind device = DeviceKind::cpu;
  int rank = 0;
  std::int64_t shape[4] = {0, 0, 0, 0};
  std::int64_t stride[4] = {0, 0, 0, 0};

  // Row-major contiguous view.
  static Tensor contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                           DeviceKind device = DeviceKind::cpu);
  std::int64_t numel() const;
  bool defined() const { return data != nullptr; }
  bool is_contiguous() const;
};

// Prefill / full-sequence attention (SPEC §1).
struct AttentionProblem {
  Tensor q, k, v;  // see the layout conventions above
  Tensor out;      // written; dtype f32, f64, or the dtype of q
  Tensor lse;      // optional (data == nullptr: not written); f32 or f64; natural log
  // Optional input (SPEC §2a, seeded maxima for a key chunk): per query row a value, in the units
  // of lse (natural log of the scaled scores), that the row's running max starts from (l = 0,
  // O = 0) before its first visited tile; -inf = no seed. Layout and dtypes of lse. For ring
  // attention: the maxima of the seed tiles' scores, so each chunk skips as the unsplit call
  // would. O and LSE stay those of the kept keys. CPU reference only: CUDA calls refuse it.
  Tensor seed_max;
  // Ragged batch: batch + 1 offsets each, in the memory space of the tensors. Both or neither.
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;
  std::int64_t batch = 0;  // number of sequences when ragged; ignored otherwise
  // Upper bounds of the per-sequence lengths (ragged; at most the total rows of q / k, else an
  // error). With device-resident offsets, giving both keeps the call free of host
  // synchronisation (CUDA-graph capturable); 0 = read the offsets (a copy).
  std::int64_t max_seqlen_q = 0;
  std::int64_t max_seqlen_k = 0;
  MaskKind mask = MaskKind::full;
  std::optional<double> scale;  // default 1/sqrt(d)
  // Optional output (SPEC §9): the skip set of this call for its backward, as 32-bit words in
  // the memory space of q (device memory for the CUDA path), laid out as skip_set_shape(p, skip,
  // opt) says; skip_set_words is their number (at least that shape's words()). The call writes
  // every word: all zero when nothing is skipped (skipping off, or lambda >= 1).
  std::uint32_t* skip_set = nullptr;
  std::int64_t skip_set_words = 0;
};

// Decode: few query tokens per sequence against a KV cache (SPEC §1 with Lq = q_len <= 8).
struct DecodeProblem {
  Tensor q;  // [B, q_len, Hq, d]
  // Contiguous cache: [B, Lmax, Hk, d]. Paged cache: [num_pages, page_size, Hk, d] with a page
  // table [B, max_pages_per_seq] (int32 page indices, row stride page_table_stride).
  Tensor k_cache, v_cache;
  const std::int32_t* page_table = nullptr;
  std::int64_t page_table_stride = 0;
  // The table's columns, max_pages_per_seq (<= page_table_stride; 0: page_table_stride): a
  // sequence holds at most max_pages_per_seq * page_size keys.
  std::int64_t page_table_cols = 0;
  const std::int32_t* seqlens_k = nullptr;  // [B] cached lengths; nullptr: all Lmax (contiguous)
  // Upper bound of seqlens_k (at most the cache capacity, else an error); with device-resident
  // seqlens it avoids a synchronising copy.
  std::int64_t max_seqlen_k = 0;
  Tensor out;                               // [B, q_len, Hq, dv]
  Tensor lse;                               // optional [B, Hq, q_len]
  // With q_len > 1 (speculative decoding) query i sees key j iff j <= i + Lk - q_len.
  MaskKind mask = MaskKind::causal;
  std::optional<double> scale;
};

// factor = a * exp(b * target_sparsity) (SPEC §3, §6).
struct Calibration {
  double a = 0.0;
  double b = 0.0;
};

// SPEC §6 richer form, finite-size term: in prefill with Lq = Lk = L, vote groups of `rows`
// consecutive query rows and `tile_keys`-key tiles, the first visited tile of every vote group is
// never skipped (unseeded: natural order, and max-first, whose first tile is the sink tile), so a
// fraction f0(L) of the visited pairs is unskippable:
//   full:   f0 = 1 / ceil(L / T)
//   causal: f0 = G / sum_{g < G} (floor(min(L - 1, (g + 1) R - 1) / T) + 1),  G = ceil(L / R)
// A form with this term reads its target as a fraction of the skippable pairs and converts per
// sequence: s' = s / (1 - f0(L)), clipped below 1.
struct FiniteSizeTerm {
  MaskKind mask = MaskKind::causal;
  int rows = 64;
  int tile_keys = 128;
};
// f0(L) above (exact integer counts, then one division). Error on L < 1, rows or tile_keys < 1.
double unskippable_fraction(const FiniteSizeTerm& t, std::int64_t L);

// SPEC §6 richer form (curvature): ln(factor) as a monotone (non-decreasing) piecewise-linear
// function of the target sparsity s, with knots at the calibrated targets. Between knots: linear
// interpolation; outside [targets.front(), targets.back()]: the end segment's slope, flagged by
// extrapolates(). With a finite-size term the target is converted per sequence first (s').
// lambda = factor / Lk as for every factor.
struct PiecewiseLogFactor {
  std::vector<double> targets;      // knots s_i, strictly increasing, each in [0, 1]
  std::vector<double> log_factors;  // ln(factor) at s_i: finite, non-decreasing
  std::optional<FiniteSizeTerm> finite_size;
  static constexpr std::size_t kMaxKnots = 256;

  double log_factor(double s) const;  // the piecewise-linear function itself
  // The target the knots are read at for a sequence of L keys: s, or s / (1 - f0(L)) clipped
  // below 1 with the finite-size term.
  double effective_target(double s, std::int64_t L) const;
  // exp(log_factor(effective_target(s, L))): the factor for a sequence of L keys.
  double factor(double s, std::int64_t L) const;
  bool extrapolates(double s) const;  // s outside the knots
};
// Throws Error (message without a source: callers prefix it) unless the form is usable: 2 to
// kMaxKnots knots, equal sizes, targets finite in [0, 1] and strictly increasing, log factors
// finite and non-decreasing, finite-size rows and tile_keys >= 1.
void validate(const PiecewiseLogFactor& f);

// How tiles are grouped for the skip vote (SPEC §2). The reference takes these as parameters;
// each kernel reports the granularity it actually used in SkipStats.
struct VoteGranularity {
  int tile_keys = 128;      // keys per tile
  int rows = 64;            // consecutive query rows (positions) of one head per vote group
  int heads = 1;            // query heads of one KV group voting together (1, or g = Hq/Hk)
  std::int64_t split_tiles = 0;  // split-KV layout: key tiles per split, 0 = unsplit
  // SPEC §2a. In SkipConfig::vote: the order asked for (see SkipConfig::order_explicit); in
  // SkipStats::granularity and SkipSet::vote: the order actually used.
  VisitOrder order = VisitOrder::natural;
};

// SPEC §2b FP8 screen: a (vote group, tile) pair whose FP8 (e4m3) tile maxima, raised by the
// margin, fail the skip test is skipped without the exact test; every other pair gets the exact
// test. strict: the rigorous Cauchy-Schwarz margin (no wrong screen, a theorem); tight: z sigma
// under the stated failure model (wrong screens possible, counted in SkipStats::screen_wrong).
// The reference models it; the CUDA prefill kernel implements it with its own FP8 accumulation
// roundoff (docs/prefill_kernel.md, "FP8 screen"); the CUDA decode kernels refuse margin != off.
// ahead (SPEC §2b "Screen ahead"): the screen decides every pair before the pass, from the FP8
// scores alone, against lower bounds of the running maxima; the pass then loads and computes only
// the tiles some vote group still needs. Fewer pairs are screened than in the loop (the bounds are
// below the maxima), but a screened tile costs no bf16 Q K^T and no K / V load. Needs a margin.
struct Fp8Screen {
  ScreenMargin margin = ScreenMargin::off;
  double z = 6.0;  // tight only: finite, >= 0 (0 = the raw FP8 estimate, a diagnostic)
  bool ahead = false;
};

// Skip-Softmax settings. Default-constructed: skipping off, the exact dense path.
struct SkipConfig {
  bool enabled = false;
  // Sources of the threshold, in order of precedence (SPEC §3):
  std::optional<double> threshold;          // lambda itself
  std::optional<double> factor;             // raw threshold_scale_factor: lambda = factor / Lk
  std::optional<Calibration> calibration;   // factor = a * exp(b * target_sparsity)
  // The richer form (SPEC §6, a config's "blasst" extension): factor(target_sparsity, Lk) per
  // sequence. Wins over calibration (a config that carries both resolves to this one).
  std::optional<PiecewiseLogFactor> piecewise;
  double target_sparsity = 0.5;
  // Vote granularity for the reference; kernels use their own documented one (rows/heads) but
  // honour tile_keys, split_tiles and order where they support them.
  VoteGranularity vote;
  // SPEC §2a default (revised): whether vote.order was chosen by the caller (or by a config that
  // names it) rather than defaulted. from_threshold / from_factor default to max-first with
  // order_explicit = false; every other way of building a config (default construction,
  // from_calibration, from_piecewise, config files, with_order) is explicit. The effective order
  // of a call (one rule for the reference and the kernels, docs/reference.md "Visit order"):
  //   - explicit: vote.order as given; max-first where a kernel cannot do it stays an Error
  //     (the prefill kernel: full mask with Lq != Lk for some sequence, or a ragged full-mask
  //     batch whose lengths are not host-visible);
  //   - defaulted max-first: max-first, except exactly where the prefill kernel cannot do it
  //     (the cases above), where it falls back to natural on every path, reference included.
  //     Decode has no such limit (max-first = seeded splits).
  // SkipStats::granularity.order reports the order actually used.
  // Setting vote.order directly keeps order_explicit as it was: use with_order to ask for one.
  bool order_explicit = true;
  // SPEC §2b: off by default; off leaves every result of the plain skip path unchanged.
  Fp8Screen screen;

  // Sets vote.order and marks it explicit.
  SkipConfig& with_order(VisitOrder o) {
    vote.order = o;
    order_explicit = true;
    return *this;
  }

  static SkipConfig dense() { return {}; }
  // Direct paths (SPEC §3.1): max-first by default (order_explicit = false, see above).
  static SkipConfig from_threshold(double lambda);
  static SkipConfig from_factor(double factor);
  // Calibrated paths: natural order unless the caller (or a config's "blasst".visit_order) says
  // otherwise (SPEC §2a, §7: a calibration that names no order was fitted in natural order).
  static SkipConfig from_calibration(Calibration c, double target_sparsity);
  static SkipConfig from_piecewise(PiecewiseLogFactor f, double target_sparsity);
};

// Throws Error unless the configuration is usable (NaN/inf/<=0 threshold or factor, target
// outside [0, 1], tile_keys < 1, screen.z NaN, inf or < 0, ...).
void validate(const SkipConfig& cfg);
// lambda for a sequence with Lk keys (SPEC §3). A value >= 1 means "dense for this sequence".
// Throws Error on invalid configuration or Lk < 1.
double resolve_lambda(const SkipConfig& cfg, std::int64_t Lk);

// SPEC §5 delta histogram: fixed bins of width 1/16 (natural-log units) over [kLo, 0), plus an
// underflow bin (delta < kLo) and a top bin (delta >= 0). Counts of delta < e are exact at every
// bin edge e = kLo + i * kWidth, so sparsity_at(exp(e)) is exact there.
struct DeltaHistogram {
  static constexpr double kLo = -64.0;
  static constexpr double kWidth = 1.0 / 16.0;
  static constexpr int kBins = 1024;  // regular bins; counts has kBins + 2 entries
  std::vector<std::uint64_t> counts = std::vector<std::uint64_t>(kBins + 2, 0);

  // Index in counts for a delta (NaN counts as the top bin: never skipped).
  static int bin_of(double delta);
  void add(double delta) { ++counts[static_cast<std::size_t>(bin_of(delta))]; }
  void merge(const DeltaHistogram& o);
  std::uint64_t total() const;
  // #{delta < ln(lambda)} / total, exact when ln(lambda) is a bin edge, else interpolated
  // linearly inside the bin.
  double sparsity_at(double lambda) const;
  // Smallest lambda with sparsity_at(lambda) >= s (inverse of the curve); s in [0, 1].
  // +inf when no lambda reaches s (fewer deltas than needed lie below the top bin).
  double lambda_for(double s) const;
};

// Statistics of one call (SPEC §5). Counts are (vote group, key tile) pairs.
struct SkipStats {
  VoteGranularity granularity;  // what was actually used
  std::string counted_at;       // human-readable vote group, e.g. "64 rows x 1 head"
  // Per head: query heads when granularity.heads == 1, otherwise KV heads.
  std::vector<std::int64_t> visited;
  std::vector<std::int64_t> skipped;
  std::vector<double> lambda;       // per sequence (>= 1: that sequence ran dense)
  std::vector<DeltaHistogram> hist; // per head, when RunOptions::collect_histogram
  std::vector<float> deltas;        // every visited pair's delta (reference only, record_deltas)
  // SPEC §2b, per head like visited; filled by the reference when skip.screen is on (else empty).
  // Pairs decided by the exact test = visited - screened; skipped counts screened pairs too.
  std::vector<std::int64_t> screened;      // pairs skipped by the FP8 screen, wrong ones included
  // Screened pairs the exact test would have kept; empty where the path does not count them (the
  // CUDA prefill kernel's screen ahead: its pass never computes a screened tile's exact scores).
  std::vector<std::int64_t> screen_wrong;
  // With record_deltas and the screen on: each visited pair's screen delta delta8 (SPEC §2b),
  // parallel to deltas (NaN where the sequence has no screen). Screened iff < ln(lambda).
  std::vector<float> screen_deltas;

  std::int64_t total_visited() const;
  std::int64_t total_skipped() const;
  std::int64_t total_screened() const;
  std::int64_t total_screen_wrong() const;
  double sparsity() const;  // total_skipped / total_visited (0 when nothing was visited)
};

struct RunOptions {
  bool collect_stats = false;      // fill SkipStats visited/skipped/lambda
  bool collect_histogram = false;  // also the per-head delta histograms (implies collect_stats)
  bool record_deltas = false;      // reference only: also every delta (implies collect_stats)
  bool fp64 = false;               // reference: accumulate in float64 (oracle mode)
  int num_threads = 0;             // reference: 0 = hardware concurrency
  void* stream = nullptr;          // cudaStream_t for the CUDA path
  // CUDA path with host tensors: stage them through device memory (CLI, demo). Device tensors
  // never need this.
  DeviceKind device = DeviceKind::cpu;
  // CUDA path: scratch memory owned by the caller (device memory, 256-byte aligned, at least
  // attention_workspace_bytes / decode_workspace_bytes of the same call), used in stream order on
  // opt.stream. nullptr: the library takes it from a memory pool of its own.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// SPEC §9: which (vote group, key tile) pairs a forward skipped, one bit per (sequence, query
// head, vote group, key tile). A vote group of vote.heads > 1 heads sets its bit for each of its
// heads. Vote group index = first row / vote.rows within the sequence; tile = key tile index.
// Dimensions: groups = ceil(max Lq / vote.rows), tiles = ceil(max Lk / vote.tile_keys) over the
// sequences of the call. Recorded by reference::attention (its skip_set argument) and read by the
// backward as a block mask (a set bit: that tile has probability exactly 0 for the group's rows).
struct SkipSet {
  VoteGranularity vote;  // the vote the set was recorded with
  std::int64_t batch = 0, heads = 0, groups = 0, tiles = 0;
  std::vector<std::uint8_t> bits;  // packed, little-endian within a byte: bit index(b, h, g, t)

  void resize(const VoteGranularity& vote, std::int64_t batch, std::int64_t heads,
              std::int64_t groups, std::int64_t tiles);  // all pairs kept
  std::int64_t index(std::int64_t b, std::int64_t h, std::int64_t g, std::int64_t t) const {
    return ((b * heads + h) * groups + g) * tiles + t;
  }
  bool skipped(std::int64_t b, std::int64_t h, std::int64_t g, std::int64_t t) const {
    const std::int64_t i = index(b, h, g, t);
    return (bits[static_cast<std::size_t>(i >> 3)] >> (i & 7)) & 1u;
  }
  void set(std::int64_t b, std::int64_t h, std::int64_t g, std::int64_t t, bool skip = true) {
    const std::int64_t i = index(b, h, g, t);
    const auto m = static_cast<std::uint8_t>(1u << (i & 7));
    auto& byte = bits[static_cast<std::size_t>(i >> 3)];
    byte = skip ? static_cast<std::uint8_t>(byte | m) : static_cast<std::uint8_t>(byte & ~m);
  }
  std::int64_t count() const;  // skipped pairs
};

// The layout of a skip set written to (AttentionProblem::skip_set) or read from
// (AttentionBackwardProblem::skip_set) 32-bit words: bit i % 32 of word i / 32 is the pair
// i = SkipSet::index(b, h, g, t), i.e. SkipSet::bits read as little-endian words. groups =
// ceil(max_q / vote.rows), tiles = ceil(max_k / vote.tile_keys), where max_q, max_k are the
// problem's max_seqlen_q / max_seqlen_k when given, else the longest sequences.
struct SkipSetShape {
  VoteGranularity vote;  // the vote of the path the call takes (the kernel's, or skip.vote)
  std::int64_t batch = 0, heads = 0, groups = 0, tiles = 0;
  std::int64_t pairs() const { return batch * heads * groups * tiles; }
  std::int64_t words() const { return (pairs() + 31) / 32; }
};

// SPEC §9 backward of attention: given the forward's inputs, its output O, the upstream gradient
// dO and (optionally) the LSE over kept keys, write dQ, dK, dV. Layouts as AttentionProblem (ragged or not);
// dq like q, dk like k, dv like v (dtype f32, f64 or q's dtype), dout like out. GQA/MQA: dk, dv
// sum over the g query heads of each KV head.
struct AttentionBackwardProblem {
  Tensor q, k, v;
  Tensor out;   // the forward's O
  Tensor dout;  // dL/dO, shape of out
  // The forward's LSE over kept keys, f32 or f64. Optional: absent (no storage, rank 0), the
  // backward computes it in float64 from the kept tiles (one more pass over their scores), for
  // callers whose saved LSE is coarser than the gradient they want (a float32 LSE of float64 data).
  Tensor lse;
  Tensor dlse;  // optional dL/dLSE (shape of lse; f32 or f64): adds dlse_i * P_ij to dS_ij
  Tensor dq, dk, dv;  // written
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;
  std::int64_t batch = 0;
  std::int64_t max_seqlen_q = 0;
  std::int64_t max_seqlen_k = 0;
  MaskKind mask = MaskKind::full;
  std::optional<double> scale;
  // Optional: the forward's skip set as 32-bit words (AttentionProblem::skip_set, same shape),
  // in the memory space of q; an alternative to the SkipSet argument of attention_backward.
  const std::uint32_t* skip_set = nullptr;
  std::int64_t skip_set_words = 0;
};

// One entry point per phase. Dispatch: tensors on the GPU (or options.device == cuda with host
// tensors) go to the sm_90a kernels, CPU tensors to the reference engine.
void attention(const AttentionProblem& p, const SkipConfig& skip = {}, const RunOptions& opt = {},
               SkipStats* stats = nullptr);
void decode(const DecodeProblem& p, const SkipConfig& skip = {}, const RunOptions& opt = {},
            SkipStats* stats = nullptr);

// A decode call planned once for a batch shape (FlashInfer's plan / run; issue 18, the host cost of
// an eager call). The constructor validates p as decode() would and prepares the launch (kernel,
// split layout at p.max_seqlen_k or the cache's length, the caches' tensor maps, scratch memory:
// opt.workspace, which must outlive the plan, or the plan's own). run() launches the planned call
// with q, out and lse at new addresses; everything else is the planned buffers, whose contents may
// change between runs (tokens appended to the caches, seqlens raised up to max_seqlen_k). The q,
// out and lse given to run() must have the planned shapes, dtypes, strides and device (the Python
// wrapper checks them; a C++ caller promises), q 16-byte aligned, and lse present exactly when
// it was planned. No statistics. Runs of one plan share its scratch: order them on one stream (a
// plan per stream otherwise); a run may be captured into a CUDA graph. CPU tensors: each run is
// the reference's decode() of the same problem.
class DecodePlan {
 public:
  explicit DecodePlan(const DecodeProblem& p, const SkipConfig& skip = {}, const RunOptions& opt = {});
  ~DecodePlan();
  DecodePlan(DecodePlan&&) noexcept;
  DecodePlan& operator=(DecodePlan&&) noexcept;
  DecodePlan(const DecodePlan&) = delete;
  DecodePlan& operator=(const DecodePlan&) = delete;
  // stream: a cudaStream_t (nullptr: the default stream); ignored on the CPU.
  void run(const void* q, void* out, void* lse = nullptr, void* stream = nullptr);
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// SPEC §9: the gradient of the kept-tiles function with the skip set held fixed. skip_set (or the
// problem's skip_set words, not both): the set the forward recorded (must match the problem and
// skip.vote); neither: dense when skipping is off, else (CPU only) the set is recomputed exactly by the reference forward's own vote (same
// inputs, same settings: the running maxima do not depend on lambda).
// CUDA path (device tensors, or host tensors with opt.device == cuda, staged): the sm_90a kernels
// (docs/architecture.md, Backward). Limits, each an Error naming the argument: q/k/v bf16 or f16,
// d = dv = 64 or 128, out/dout in q's dtype or f32, lse required (f32), dlse f32, dq/dk/dv in
// q's dtype or f32, 16-byte aligned rows; a skip set recorded at vote rows 64 x tile_keys 128
// (heads 1 or more: its per-head bits are read); skipping on with skip_set == nullptr is refused
// (pass the forward's skip set). The host skip set is uploaded on every call (bits / 8 bytes,
// one host-to-device copy in stream order; a device-resident set written by the forward comes
// later). Scratch (dQ accumulator, D, LSE) from opt.workspace or the library's pool: see
// attention_backward_workspace_bytes.
void attention_backward(const AttentionBackwardProblem& p, const SkipConfig& skip = {},
                        const RunOptions& opt = {}, const SkipSet* skip_set = nullptr);
// Scratch bytes of the same backward call on the CUDA path (0 for the reference): f32 dQ
// accumulator [tokens_q, Hq, d], D and LSE [Hq, tokens_q], the uploaded skip set, and with a skip
// set the work list (kept counts, items; with Hq > Hk the f32 dK / dV parts of the heavy blocks it
// splits by query head, at most 64 MiB over the call).
std::size_t attention_backward_workspace_bytes(const AttentionBackwardProblem& p, const SkipConfig& skip = {},
                                               const RunOptions& opt = {}, const SkipSet* skip_set = nullptr);

// SPEC §9: the shape of the skip set an attention call with these arguments records
// (AttentionProblem::skip_set): the vote granularity of the path it takes (the prefill kernel's
// 64 rows x 1 head x 128 keys for CUDA tensors, skip.vote for the reference) and its dimensions.
// Validates like the call.
SkipSetShape skip_set_shape(const AttentionProblem& p, const SkipConfig& skip = {},
                            const RunOptions& opt = {});

// Scratch bytes the same call would take on the CUDA path (split-KV partials, statistics
// counters), for RunOptions::workspace; 0 for the CPU reference. Validates like the call.
std::size_t attention_workspace_bytes(const AttentionProblem& p, const SkipConfig& skip = {},
                                      const RunOptions& opt = {});
std::size_t decode_workspace_bytes(const DecodeProblem& p, const SkipConfig& skip = {},
                                   const RunOptions& opt = {});

// True when the library was built with the CUDA kernels and a Hopper GPU is visible.
bool cuda_available();
std::string cuda_device_name();  // "" when none

namespace reference {
// The CPU oracle (SPEC §1-§5), always available.
void attention(const AttentionProblem& p, const SkipConfig& skip = {}, const RunOptions& opt = {},
               SkipStats* stats = nullptr);
// The same, also recording the skip set (SPEC §9) into *skip_set (resized; all kept when dense).
void attention(const AttentionProblem& p, const SkipConfig& skip, const RunOptions& opt,
               SkipStats* stats, SkipSet* skip_set);
void decode(const DecodeProblem& p, const SkipConfig& skip = {}, const RunOptions& opt = {},
            SkipStats* stats = nullptr);
// SPEC §9 backward (float64 accumulation, whatever opt.fp64 says), as blasst::attention_backward.
void attention_backward(const AttentionBackwardProblem& p, const SkipConfig& skip = {},
                        const RunOptions& opt = {}, const SkipSet* skip_set = nullptr);
}  // namespace reference

}  // namespace blasst
