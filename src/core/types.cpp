// Enums, Tensor helpers, SkipConfig / threshold resolution (SPEC §3), the delta histogram and the
// statistics (SPEC §5).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>

#include "blasst/blasst.hpp"
#include "core/hist_bin.hpp"
#include "core/text.hpp"

namespace blasst {

using detail::num;  // the one number formatter of the messages (core/text.hpp)

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f64: return 8;
  }
  throw Error("dtype: invalid value " + std::to_string(static_cast<int>(t)));
}

const char* to_string(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
  }
  return "invalid";
}

const char* to_string(MaskKind m) {
  switch (m) {
    case MaskKind::full: return "full";
    case MaskKind::causal: return "causal";
  }
  return "invalid";
}

const char* to_string(Phase p) {
  switch (p) {
    case Phase::prefill: return "prefill";
    case Phase::decode: return "decode";
  }
  return "invalid";
}

const char* to_string(VisitOrder o) {
  switch (o) {
    case VisitOrder::natural: return "natural";
    case VisitOrder::max_first: return "max_first";
  }
  return "invalid";
}

const char* to_string(ScreenMargin m) {
  switch (m) {
    case ScreenMargin::off: return "off";
    case ScreenMargin::strict: return "strict";
    case ScreenMargin::tight: return "tight";
  }
  return "invalid";
}

DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "float32" || s == "fp32") return DType::f32;
  if (s == "f16" || s == "float16" || s == "fp16" || s == "half") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f64" || s == "float64" || s == "fp64") return DType::f64;
  throw Error("dtype: unknown name '" + s + "' (expected f32, f16, bf16 or f64)");
}

Phase parse_phase(const std::string& s) {
  if (s == "prefill") return Phase::prefill;
  if (s == "decode") return Phase::decode;
  throw Error("phase: unknown name '" + s + "' (expected prefill or decode)");
}

VisitOrder parse_visit_order(const std::string& s) {
  if (s == "natural") return VisitOrder::natural;
  if (s == "max_first" || s == "max-first") return VisitOrder::max_first;
  throw Error("visit order: unknown name '" + s + "' (expected natural or max_first)");
}

ScreenMargin parse_screen_margin(const std::string& s) {
  if (s == "off") return ScreenMargin::off;
  if (s == "strict") return ScreenMargin::strict;
  if (s == "tight") return ScreenMargin::tight;
  throw Error("screen margin: unknown name '" + s + "' (expected off, strict or tight)");
}

// ---- Tensor ------------------------------------------------------------------------------------

Tensor Tensor::contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                          DeviceKind device) {
  if (shape.size() < 1 || shape.size() > 4)
    throw Error("Tensor::contiguous: rank must be 1..4, got " + std::to_string(shape.size()));
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = static_cast<int>(shape.size());
  int i = 0;
  for (std::int64_t s : shape) {
    if (s < 0) throw Error("Tensor::contiguous: negative dimension " + std::to_string(s));
    t.shape[i++] = s;
  }
  std::int64_t st = 1;
  for (int j = t.rank - 1; j >= 0; --j) {
    t.stride[j] = st;
    // Saturate instead of overflowing; validation rejects such tensors by size anyway.
    if (t.shape[j] > 0 && st > std::numeric_limits<std::int64_t>::max() / t.shape[j])
      st = std::numeric_limits<std::int64_t>::max();
    else
      st *= std::max<std::int64_t>(t.shape[j], 1);
  }
  return t;
}

std::int64_t Tensor::numel() const {
  if (rank <= 0) return 0;
  std::int64_t n = 1;
  for (int i = 0; i < rank && i < 4; ++i) {
    if (shape[i] <= 0) return 0;
    if (__builtin_mul_overflow(n, shape[i], &n))
      throw Error("Tensor::numel: element count overflows int64");
  }
  return n;
}

bool Tensor::is_contiguous() const {
  std::int64_t st = 1;
  for (int j = rank - 1; j >= 0; --j) {
    if (shape[j] != 1 && stride[j] != st) return false;
    st *= shape[j];
  }
  return true;
}

// ---- SkipConfig and the threshold (SPEC §3) ----------------------------------------------------

// ---- SPEC §6 richer form -----------------------------------------------------------------------

namespace {
// sum_{i=0}^{n-1} floor((a * i + b) / m) for a, b >= 0, m >= 1, in O(log m) steps: the terms
// with a >= m or b >= m are split off in closed form, and the rest is the same sum with the
// roles of a and m exchanged (counting lattice points under the line the other way).
unsigned __int128 floor_sum(unsigned __int128 n, unsigned __int128 m, unsigned __int128 a,
                            unsigned __int128 b) {
  unsigned __int128 total = 0;
  while (n > 0) {
    if (a >= m) {
      total += (n * (n - 1) / 2) * (a / m);
      a %= m;
    }
    if (b >= m) {
      total += n * (b / m);
      b %= m;
    }
    const unsigned __int128 top = a * n + b;
    if (top < m) break;
    n = top / m;
    b = top % m;
    std::swap(m, a);
  }
  return total;
}
}  // namespace

double unskippable_fraction(const FiniteSizeTerm& t, std::int64_t L) {
  if (L < 1) throw Error("unskippable_fraction: L must be >= 1, got " + std::to_string(L));
  if (t.rows < 1 || t.tile_keys < 1)
    throw Error("unskippable_fraction: rows and tile_keys must be >= 1");
  const auto T = static_cast<unsigned __int128>(t.tile_keys);
  const auto R = static_cast<unsigned __int128>(t.rows);
  const auto n = static_cast<unsigned __int128>(L);
  const unsigned __int128 tiles = (n + T - 1) / T;
  if (t.mask == MaskKind::full) return 1.0 / static_cast<double>(tiles);
  // Causal, Lq = Lk: group g (rows gR .. min(L, (g+1)R) - 1) visits the tiles up to its last row.
  const unsigned __int128 groups = (n + R - 1) / R;
  const unsigned __int128 visited =
      floor_sum(groups - 1, T, R, R - 1) + (n - 1) / T + groups;  // last group: row L - 1
  return static_cast<double>(groups) / static_cast<double>(visited);
}

void validate(const PiecewiseLogFactor& f) {
  const std::size_t n = f.targets.size();
  if (n != f.log_factors.size())
    throw Error("target_sparsity has " + std::to_string(n) + " knots but log_factor has " +
                std::to_string(f.log_factors.size()));
  if (n < 2 || n > PiecewiseLogFactor::kMaxKnots)
    throw Error("needs 2 to " + std::to_string(PiecewiseLogFactor::kMaxKnots) + " knots, got " +
                std::to_string(n));
  for (std::size_t i = 0; i < n; ++i) {
    const double s = f.targets[i], y = f.log_factors[i];
    std::string at = std::to_string(i);  // "[i]" (appended, not "[" + ...: GCC 12 -Wrestrict false positive)
    at.insert(at.begin(), '[');
    at.push_back(']');
    if (!std::isfinite(s) || s < 0.0 || s > 1.0)
      throw Error("target_sparsity" + at + " must lie in [0, 1], got " + num(s));
    if (!std::isfinite(y)) throw Error("log_factor" + at + " must be finite, got " + num(y));
    if (i > 0 && !(s > f.targets[i - 1]))
      throw Error("target_sparsity" + at + " must be greater than the knot before it (" +
                  num(f.targets[i - 1]) + "), got " + num(s));
    if (i > 0 && y < f.log_factors[i - 1])
      throw Error("log_factor" + at + " must not be below the knot before it (" +
                  num(f.log_factors[i - 1]) + "; the form is non-decreasing), got " + num(y));
  }
  if (f.finite_size) {
    const FiniteSizeTerm& t = *f.finite_size;
    if (t.mask != MaskKind::full && t.mask != MaskKind::causal)
      throw Error("finite_size.mask: invalid value " + std::to_string(static_cast<int>(t.mask)));
    if (t.rows < 1) throw Error("finite_size.rows must be >= 1, got " + std::to_string(t.rows));
    if (t.tile_keys < 1) throw Error("finite_size.tile_keys must be >= 1, got " + std::to_string(t.tile_keys));
  }
}

double PiecewiseLogFactor::log_factor(double s) const {
  const std::size_t n = targets.size();
  if (n < 2 || log_factors.size() != n) throw Error("PiecewiseLogFactor: needs 2 or more knots");
  if (std::isnan(s)) throw Error("PiecewiseLogFactor: target sparsity is NaN");
  // Segment i joins knots i and i + 1; outside the knots the end segments continue (end slopes).
  std::size_t i = 0;
  if (s >= targets[n - 1]) {
    i = n - 2;
  } else if (s > targets[0]) {
    i = static_cast<std::size_t>(std::upper_bound(targets.begin(), targets.end(), s) - targets.begin()) - 1;
  }
  if (s == targets[i]) return log_factors[i];  // exact at every knot
  if (s == targets[i + 1]) return log_factors[i + 1];
  const double slope = (log_factors[i + 1] - log_factors[i]) / (targets[i + 1] - targets[i]);
  return log_factors[i] + slope * (s - targets[i]);
}

double PiecewiseLogFactor::effective_target(double s, std::int64_t L) const {
  if (!finite_size) return s;
  const double f0 = unskippable_fraction(*finite_size, L);
  if (!(f0 < 1.0)) return std::nextafter(1.0, 0.0);  // nothing skippable: the largest s' below 1
  return std::min(s / (1.0 - f0), std::nextafter(1.0, 0.0));
}

double PiecewiseLogFactor::factor(double s, std::int64_t L) const {
  return std::exp(log_factor(effective_target(s, L)));
}

bool PiecewiseLogFactor::extrapolates(double s) const {
  return targets.empty() || s < targets.front() || s > targets.back();
}

SkipConfig SkipConfig::from_threshold(double lambda) {
  SkipConfig c;
  c.enabled = true;
  c.threshold = lambda;
  c.vote.order = VisitOrder::max_first;  // SPEC §2a default for the direct paths
  c.order_explicit = false;
  return c;
}

SkipConfig SkipConfig::from_factor(double factor) {
  SkipConfig c;
  c.enabled = true;
  c.factor = factor;
  c.vote.order = VisitOrder::max_first;  // SPEC §2a default for the direct paths
  c.order_explicit = false;
  return c;
}

SkipConfig SkipConfig::from_piecewise(PiecewiseLogFactor f, double target_sparsity) {
  SkipConfig c;
  c.enabled = true;
  c.piecewise = std::move(f);
  c.target_sparsity = target_sparsity;
  return c;
}

SkipConfig SkipConfig::from_calibration(Calibration cal, double target_sparsity) {
  SkipConfig c;
  c.enabled = true;
  c.calibration = cal;
  c.target_sparsity = target_sparsity;
  return c;
}


void validate(const SkipConfig& cfg) {
  const VoteGranularity& v = cfg.vote;
  if (v.tile_keys < 1) throw Error("skip.vote.tile_keys must be >= 1, got " + std::to_string(v.tile_keys));
  if (v.rows < 1) throw Error("skip.vote.rows must be >= 1, got " + std::to_string(v.rows));
  if (v.heads < 1) throw Error("skip.vote.heads must be >= 1, got " + std::to_string(v.heads));
  if (v.split_tiles < 0)
    throw Error("skip.vote.split_tiles must be >= 0, got " + std::to_string(v.split_tiles));
  if (v.order != VisitOrder::natural && v.order != VisitOrder::max_first)
    throw Error("skip.vote.order: invalid value " + std::to_string(static_cast<int>(v.order)));
  if (cfg.threshold) {
    const double t = *cfg.threshold;
    if (!std::isfinite(t) || t <= 0.0)
      throw Error("skip.threshold must be finite and > 0, got " + num(t));
  }
  if (cfg.factor) {
    const double f = *cfg.factor;
    if (!std::isfinite(f) || f <= 0.0)
      throw Error("skip.factor (threshold_scale_factor) must be finite and > 0, got " + num(f));
  }
  if (cfg.calibration) {
    const Calibration& c = *cfg.calibration;
    if (!std::isfinite(c.a) || c.a <= 0.0)
      throw Error("skip.calibration.a must be finite and > 0, got " + num(c.a));
    if (!std::isfinite(c.b)) throw Error("skip.calibration.b must be finite, got " + num(c.b));
  }
  if (cfg.piecewise) {
    try {
      validate(*cfg.piecewise);
    } catch (const Error& e) {
      throw Error(std::string("skip.piecewise: ") + e.what());
    }
  }
  const ScreenMargin sm = cfg.screen.margin;
  if (sm != ScreenMargin::off && sm != ScreenMargin::strict && sm != ScreenMargin::tight)
    throw Error("skip.screen.margin: invalid value " + std::to_string(static_cast<int>(sm)));
  if (!std::isfinite(cfg.screen.z) || cfg.screen.z < 0.0)
    throw Error("skip.screen.z must be finite and >= 0, got " + num(cfg.screen.z));
  if (cfg.screen.ahead && sm == ScreenMargin::off)
    throw Error("skip.screen.ahead: the screen ahead needs a margin (strict or tight), got margin off");
  if (!std::isfinite(cfg.target_sparsity) || cfg.target_sparsity < 0.0 || cfg.target_sparsity > 1.0)
    throw Error("skip.target_sparsity must lie in [0, 1], got " + num(cfg.target_sparsity));
  if (cfg.enabled && !cfg.threshold && !cfg.factor && !cfg.calibration && !cfg.piecewise)
    throw Error("skip: enabled but no threshold, factor or calibration given");
}

double resolve_lambda(const SkipConfig& cfg, std::int64_t Lk) {
  validate(cfg);
  if (Lk < 1) throw Error("resolve_lambda: Lk must be >= 1, got " + std::to_string(Lk));
  double lambda;
  if (cfg.threshold) {
    lambda = *cfg.threshold;
  } else if (cfg.factor) {
    lambda = *cfg.factor / static_cast<double>(Lk);
  } else if (cfg.piecewise) {
    const double factor = cfg.piecewise->factor(cfg.target_sparsity, Lk);
    if (!std::isfinite(factor) || factor <= 0.0)
      throw Error("skip.piecewise: factor exp(log_factor(target_sparsity)) = " + num(factor) +
                  " is not a finite positive number");
    lambda = factor / static_cast<double>(Lk);
  } else if (cfg.calibration) {
    const double factor = cfg.calibration->a * std::exp(cfg.calibration->b * cfg.target_sparsity);
    if (!std::isfinite(factor) || factor <= 0.0)
      throw Error("skip.calibration: factor a*exp(b*target_sparsity) = " + num(factor) +
                  " is not a finite positive number");
    lambda = factor / static_cast<double>(Lk);
  } else {
    throw Error("resolve_lambda: no threshold, factor or calibration in the skip configuration");
  }
  if (!std::isfinite(lambda) || lambda <= 0.0)
    throw Error("resolve_lambda: lambda = " + num(lambda) + " is not a finite positive number");
  return lambda;  // >= 1: dense for this sequence (SPEC §3)
}

// ---- DeltaHistogram (SPEC §5) ------------------------------------------------------------------

int DeltaHistogram::bin_of(double delta) { return detail::hist_bin(delta); }

void DeltaHistogram::merge(const DeltaHistogram& o) {
  if (counts.size() != static_cast<std::size_t>(kBins + 2)) counts.assign(kBins + 2, 0);
  if (o.counts.size() != counts.size()) throw Error("DeltaHistogram::merge: malformed histogram");
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] += o.counts[i];
}

std::uint64_t DeltaHistogram::total() const {
  std::uint64_t t = 0;
  for (auto c : counts) t += c;
  return t;
}

double DeltaHistogram::sparsity_at(double lambda) const {
  if (std::isnan(lambda)) throw Error("DeltaHistogram::sparsity_at: lambda is NaN");
  const std::uint64_t tot = total();
  if (tot == 0 || lambda <= 0.0) return 0.0;
  const double x = std::log(lambda);
  double pos = (x - kLo) / kWidth;  // in bins above kLo
  const double r = std::round(pos);
  if (std::abs(pos - r) < 1e-9) pos = r;  // lambda = exp(edge) lands exactly on the edge
  if (pos < 0.0) return 0.0;              // below the histogram's range: nothing resolvable
  if (pos >= kBins)                       // ln(lambda) >= 0: everything below 0
    return static_cast<double>(tot - counts[kBins + 1]) / static_cast<double>(tot);
  const int k = static_cast<int>(std::floor(pos));
  double below = static_cast<double>(counts[0]);
  for (int i = 0; i < k; ++i) below += static_cast<double>(counts[1 + i]);
  below += (pos - k) * static_cast<double>(counts[1 + k]);
  return below / static_cast<double>(tot);
}

double DeltaHistogram::lambda_for(double s) const {
  if (std::isnan(s) || s < 0.0 || s > 1.0)
    throw Error("DeltaHistogram::lambda_for: sparsity must lie in [0, 1], got " + num(s));
  const std::uint64_t tot = total();
  if (tot == 0) return std::numeric_limits<double>::infinity();
  const double need = s * static_cast<double>(tot);
  double below = static_cast<double>(counts[0]);
  if (below >= need) return std::exp(kLo);  // reached at (or below) the histogram's lower end
  for (int k = 0; k < kBins; ++k) {
    const double c = static_cast<double>(counts[1 + k]);
    if (below + c >= need && c > 0) {
      const double frac = (need - below) / c;
      return std::exp(kLo + (k + frac) * kWidth);
    }
    below += c;
  }
  return std::numeric_limits<double>::infinity();  // unreachable with lambda < 1
}

// ---- SkipStats ---------------------------------------------------------------------------------

namespace {
std::int64_t sum(const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); }
}  // namespace

std::int64_t SkipStats::total_visited() const { return sum(visited); }
std::int64_t SkipStats::total_skipped() const { return sum(skipped); }
std::int64_t SkipStats::total_screened() const { return sum(screened); }
std::int64_t SkipStats::total_screen_wrong() const { return sum(screen_wrong); }

double SkipStats::sparsity() const {
  const std::int64_t v = total_visited();
  return v == 0 ? 0.0 : static_cast<double>(total_skipped()) / static_cast<double>(v);
}

}  // namespace blasst
