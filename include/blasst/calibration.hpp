// Calibration of the Skip-Softmax threshold (SPEC §5 one-pass curves, §6 calibration, §7 output).
// Implemented in src/calibration/; the method and the CLI are documented in docs/calibration.md.
//
//   curve:     one dense pass records delta for every visited (vote group, key tile) pair; then
//              sparsity(lambda) = #{delta < ln lambda} / #visited for every lambda at once.
//   fit:       per sample length L_i and target s, lambda_s from the curve, factor = lambda_s * L_i;
//              least squares of log(factor) = log(a) + b * s (log space), R^2, observed range,
//              extrapolation flags; the inverse law lambda = a' / L per target beside it.
//   validate:  apply the fit back at each length and target; achieved sparsity vs target, beside
//              a fixed-lambda baseline (lambda calibrated at the middle length, used everywhere).
//
// A curve belongs to the vote granularity and visit order it was counted at (VoteGranularity is
// kept with it); curves of different granularity are never combined (Error).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/config.hpp"

namespace blasst::calibration {

// Equal tile_keys, rows, heads, split_tiles and order.
bool same_granularity(const VoteGranularity& a, const VoteGranularity& b);
// e.g. "64 rows x 1 head, 128-key tiles, natural order, unsplit".
std::string describe(const VoteGranularity& g);

// ---- SPEC §5: one-pass curves --------------------------------------------------------------

class SparsityCurve {
 public:
  SparsityCurve() = default;
  // Exact curve from every visited pair's delta (+inf: first visited tile, never skipped).
  // NaN deltas are refused (Error).
  static SparsityCurve from_deltas(std::vector<float> deltas, const VoteGranularity& g);
  // Histogram curve: exact at the bin edges ln(lambda) = kLo + i * kWidth, linear inside a bin.
  static SparsityCurve from_histogram(const DeltaHistogram& h, const VoteGranularity& g);

  bool exact() const { return exact_; }
  bool empty() const { return visited() == 0; }
  const VoteGranularity& granularity() const { return g_; }
  std::uint64_t visited() const;

  // Fraction of visited pairs with delta < x (x = ln lambda; any real x, +-inf allowed).
  double sparsity_at_log(double x) const;
  // lambda > 0 required (Error otherwise); lambda >= 1 is "dense" in the kernels: returns 0.
  double sparsity_at(double lambda) const;
  // The largest sparsity any lambda < 1 reaches: fraction of pairs with delta < 0.
  double max_sparsity() const;

  // Pool another curve's pairs into this one (a layer from its heads, a layer set). Refuses a
  // different granularity. Exact + exact stays exact; anything with a histogram becomes one.
  void merge(const SparsityCurve& other);

  const std::vector<float>& sorted_deltas() const { return sorted_; }  // exact curves only
  const DeltaHistogram& histogram() const { return hist_; }          // histogram curves only

 private:
  VoteGranularity g_{};
  bool exact_ = true;
  std::vector<float> sorted_;
  DeltaHistogram hist_;
  std::vector<std::uint64_t> cum_;  // cum_[i] = #{delta < edge i}, histogram curves
  void rebuild_cumulative();
};

// lambda at which the curve's sparsity equals s (s in [0, 1], Error otherwise).
//  exact list:  N pairs, k = ceil(s * N); ln(lambda) = midpoint of the k-th and (k+1)-th smallest
//               delta, so exactly k pairs are skipped (k/N is the first reachable value >= s);
//               s = 0 gives a lambda below every delta.
//  histogram:   the smallest bin edge e with #{delta < e} >= s * N; lambda = exp(e) is exact
//               there (the curve is known exactly only at edges).
// Returns +inf when no lambda < 1 reaches s (s > max_sparsity()).
double lambda_for_sparsity(const SparsityCurve& c, double s);

// Pool curves (Error on a granularity mismatch or an empty list).
SparsityCurve combine(const std::vector<SparsityCurve>& curves);

// Curves of one call's statistics: per head from stats.hist (when collected); the layer curve
// from stats.deltas when recorded (exact), else the pooled histograms. Granularity taken from
// stats.granularity. Error when the stats carry neither deltas nor histograms.
struct StatsCurves {
  std::vector<SparsityCurve> per_head;
  SparsityCurve layer;
};
StatsCurves curves_from_stats(const SkipStats& stats);

// ---- measuring curves -----------------------------------------------------------------------

// A dense probe: skipping on at the smallest positive lambda (nothing can be skipped), so the
// kernel/reference runs the dense trajectory at `vote` granularity and records its deltas.
SkipConfig probe_config(const VoteGranularity& vote);

struct MeasureOptions {
  DeviceKind device = DeviceKind::cpu;  // cuda: the GPU kernels (histograms only)
  bool exact = true;                    // cpu: record every delta (else histograms only)
  int num_threads = 0;
};

// Prefill/full attention of one sequence: fp32 host q [L, Hq, d], k/v [L, Hk, d], contiguous. A
// prefix of a longer sequence is passed as the same pointers with a smaller length (no copy).
struct PrefillInput {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  std::int64_t length = 0;       // L (Lq = Lk)
  std::int64_t heads_q = 0, heads_k = 0, head_dim = 0;
  MaskKind mask = MaskKind::causal;
};
// Default prefill granularity: 64 rows x 1 head (the warpgroup vote of the prefill kernel);
// the GPU kernel reports its own, which the returned curves carry.
VoteGranularity default_prefill_granularity(VisitOrder order = VisitOrder::natural);
StatsCurves measure_prefill(const PrefillInput& in, const VoteGranularity& vote,
                            const MeasureOptions& opt = {});

// Decode: `queries` decode steps taken from the end of a prefill-layout sequence; step b has the
// cache of its prefix, Lk_b = L - queries + 1 + b keys, and its last q_len tokens as queries
// (q_len > 1: speculative decoding, causal bottom-right). The cache pages are shared, nothing is
// copied. Vote groups: rows = q_len, heads = g = Hq / Hk; split layout and order from `vote`.
struct DecodeInput {
  PrefillInput seq;              // q/k/v of the whole sequence, length L
  std::int64_t queries = 16;     // decode steps sampled at the end of the sequence
  std::int64_t q_len = 1;        // query tokens per step, 1..8
};
VoteGranularity default_decode_granularity(std::int64_t group, std::int64_t split_tiles = 0,
                                           VisitOrder order = VisitOrder::natural, int q_len = 1);
StatsCurves measure_decode(const DecodeInput& in, const VoteGranularity& vote,
                           const MeasureOptions& opt = {});

// Generic path: a callback that runs a kernel/reference (or a whole model) once with the given
// probe and options and returns its statistics.
using StatsRunner = std::function<SkipStats(const SkipConfig& probe, const RunOptions& opt)>;
StatsCurves measure_with(const StatsRunner& run, const VoteGranularity& vote,
                         const MeasureOptions& opt = {});

// ---- SPEC §6: the calibration ---------------------------------------------------------------

struct CurveSample {
  std::string component = "default";  // model component (expert): transformer, transformer_2, ...
  std::string layer;                  // "" when the sample is not tied to a layer
  Phase phase = Phase::prefill;
  std::int64_t length = 0;            // L_i: factor = lambda * L_i (decode: the cache length)
  SparsityCurve curve;                // the layer curve (pooled over heads)
  std::vector<SparsityCurve> heads;   // optional per-head curves (reported, not fitted)
};

inline std::vector<double> default_targets() {
  return {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9};
}

struct FitOptions {
  std::vector<double> targets = default_targets();  // each in [0.1, 0.9] unless allow_any_target
  bool allow_any_target = false;                      // accept targets in (0, 1)
  bool per_layer = false;  // also one fit per (component, phase, layer)
  // The mask of the prefill samples (Lq = Lk). When set and finite_size is true, the prefill fits'
  // richer form is also fitted with the SPEC §6 finite-size term (FiniteSizeTerm with the samples'
  // rows and tile_keys: knots over skippable pairs, s' = s / (1 - f0(L)) per length), and the
  // variant with the smaller in-sample error is kept (PhaseFit::curve_error_*). Decode fits never
  // get it (docs/calibration.md: no finite-size offset is measured there).
  std::optional<MaskKind> prefill_mask;
  bool finite_size = true;
};

// Least squares of y = log(factor) = log(a) + b * s. r2 = 1 - SS_res / SS_tot (1 when both are
// 0). Needs >= 2 points with distinct s and positive finite factors (Error otherwise).
struct LogLinearFit {
  Calibration ab;
  double r2 = 0.0;
  int n = 0;
};
LogLinearFit fit_log_linear(const std::vector<double>& s, const std::vector<double>& factor);

// SPEC §6 richer form from per-target values: knots (s_i, y_i) with s strictly increasing, y_i the
// per-target ln(factor) (calibrate() takes the mean over lengths of ln(lambda_s * L), i.e. ln a'
// of the inverse law). Made non-decreasing by pool-adjacent-violators (equal weights: every
// in-range target has one value per length): each run of knots that decreases is replaced by its
// mean, which is the least-squares non-decreasing fit. Error on < 2 knots, unsorted s, NaN/inf.
config::PiecewiseLogFactor fit_piecewise(const std::vector<double>& s, const std::vector<double>& y);

struct FitPoint {
  std::int64_t length = 0;
  double target = 0.0;
  double lambda = 0.0;   // +inf when the sample cannot reach the target with lambda < 1
  double factor = 0.0;   // lambda * length (used in the fit when finite)
  bool used = false;
};

// The paper's inverse law at one target: lambda = a' / L, a' fitted in log space (mean of
// log(lambda * L)); r2 in log-lambda space (negative: worse than a constant). exponent is the
// free fit lambda ~ L^-p (p = 1 means the law holds); NaN with < 2 distinct lengths.
struct InverseLawFit {
  double target = 0.0;
  double a_prime = 0.0;
  double r2 = 0.0;
  double exponent = 0.0;
  int n = 0;
};

struct PhaseFit {
  std::string component;
  std::string layer;                 // "" = all layers pooled
  Phase phase = Phase::prefill;
  VoteGranularity granularity{};
  LogLinearFit fit;
  std::vector<std::int64_t> lengths; // sorted, distinct
  // Observed range: targets every length reaches with lambda < 1 (lo = smallest such target,
  // hi = largest); targets outside are extrapolation.
  double range_lo = 0.0, range_hi = 0.0;
  // Largest sparsity each length reaches with lambda < 1 (same order as lengths).
  std::vector<double> max_sparsity;
  std::vector<FitPoint> points;
  std::vector<double> extrapolated;  // requested targets outside [range_lo, range_hi]
  std::vector<InverseLawFit> inverse;
  std::vector<std::string> warnings;

  // The richer form (SPEC §6): knots at the in-range targets, fit_piecewise of the mean over the
  // lengths of ln(lambda * L), lambda where each length's curve reaches the knot's target (with
  // the finite-size term: reaches u * (1 - f0(L)), u the knot's target over skippable pairs).
  // Outside [range_lo, range_hi] it extrapolates with the end slopes (flagged: extrapolates(s)).
  config::PiecewiseLogFactor curve;
  // In-sample max |achieved - target| of curve over the lengths and in-range targets. For prefill
  // fits with FitOptions::prefill_mask both variants are fitted and the one with the smaller error
  // kept (curve.finite_size tells which); their errors are kept here too (NaN when not fitted).
  double curve_error = 0.0;
  double curve_error_plain = std::numeric_limits<double>::quiet_NaN();
  double curve_error_finite_size = std::numeric_limits<double>::quiet_NaN();

  bool extrapolates(double s) const { return s < range_lo - 1e-12 || s > range_hi + 1e-12; }
  double factor(double s) const;                  // a * exp(b * s)
  double lambda(double s, std::int64_t L) const;  // factor(s) / L
  double curve_factor(double s, std::int64_t L) const;  // curve.factor(s, L)
  double curve_lambda(double s, std::int64_t L) const;  // curve_factor(s, L) / L
};

struct CalibrationResult {
  std::vector<PhaseFit> fits;  // pooled fits first (layer ""), then per-layer ones
  std::vector<double> targets;
  // The fit for a sample: its own layer's when per-layer fits exist, else the pooled one.
  const PhaseFit* find(const std::string& component, const std::string& layer, Phase phase) const;
};

// Groups samples by (component, phase) (and layer with per_layer); all samples of a group must
// share one granularity (Error naming both) and have length > 0.
CalibrationResult calibrate(const std::vector<CurveSample>& samples, const FitOptions& opt = {});

// ---- validation -----------------------------------------------------------------------------

struct ValidationRow {
  std::string component, layer;
  Phase phase = Phase::prefill;
  std::int64_t length = 0;
  double target = 0.0;
  double lambda = 0.0;          // from the fit
  double achieved = 0.0;        // sparsity of the sample's curve at that lambda
  double lambda_fixed = 0.0;    // fixed-lambda baseline (calibrated at the middle length)
  double achieved_fixed = 0.0;
  double lambda_curve = 0.0;    // from the richer (piecewise-linear) form
  double achieved_curve = 0.0;
  bool in_range = true;         // target inside the fit's observed range
};

struct ValidationReport {
  double tolerance = 0.03;
  std::vector<ValidationRow> rows;
  double max_error = 0.0;        // max |achieved - target| over in-range rows
  double max_error_fixed = 0.0;  // the same for the fixed-lambda baseline
  double max_error_curve = 0.0;  // the same for the richer form (PhaseFit::curve)
  bool ok() const { return max_error <= tolerance; }  // the exponential (interop) form
  bool curve_ok() const { return max_error_curve <= tolerance; }
};

// Apply the fits back to the samples (their curves are exact one-pass measurements, so
// "achieved" is the sparsity a run at that lambda has). Samples may include lengths not used in
// the fit (held-out). The fixed-lambda baseline uses, per (component, layer, phase), the sample
// at the middle calibration length (index n/2 of the sorted lengths).
ValidationReport validate(const CalibrationResult& result, const std::vector<CurveSample>& samples,
                          const std::vector<double>& targets, double tolerance = 0.03);

// ---- SPEC §7 output --------------------------------------------------------------------------

struct ConfigOptions {
  double target_prefill = 0.5;
  double target_decode = 0.5;
  std::optional<double> disabled_until_timestep;
  std::vector<std::string> ignore;
  // Per-layer groups apply to the layer names made from this template ("{}" = the sample's
  // layer string), e.g. "model.layers.{}.self_attn*".
  std::string layer_pattern = "{}";
};

// One SparseAttentionConfig per component: per-layer groups first (layers = {pattern}), then a
// catch-all group with the pooled fits. Phases without a fit are left out of the group.
std::map<std::string, config::SparseAttentionConfig> to_configs(const CalibrationResult& r,
                                                                const ConfigOptions& opt = {});

// ---- report ---------------------------------------------------------------------------------

struct ReportOptions {
  std::string title = "blasst calibration";
  std::vector<std::string> notes;  // free lines at the top (workload, device, ...)
  bool plots = true;               // PNGs when built with libpng
};
// True when the library was built with libpng (PNG plots).
bool png_supported();
// Writes dir/report.md (+ PNGs: sparsity_vs_lambda_<component>_<phase>.png,
// achieved_vs_target_<component>_<phase>.png). Creates dir. Returns the files written.
std::vector<std::string> write_report(const std::string& dir, const CalibrationResult& r,
                                      const ValidationReport& v,
                                      const std::vector<CurveSample>& samples,
                                      const ReportOptions& opt = {});
// The markdown alone (what write_report puts in report.md, without plot links).
std::string report_markdown(const CalibrationResult& r, const ValidationReport& v,
                            const std::vector<CurveSample>& samples, const ReportOptions& opt = {},
                            const std::vector<std::string>& images = {});

// `blasst calibrate --check FILE`: load a config.json (or a model directory of components),
// print a summary to out and return 0 (a file without the block is valid: dense); on error
// print it to err and return 2.
int check_config(const std::string& path, std::ostream& out, std::ostream& err);

}  // namespace blasst::calibration
