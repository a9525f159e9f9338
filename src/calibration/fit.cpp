// SPEC §6: log-space fit of factor = a * exp(b * s), the inverse law, validation, SPEC §7 output.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "blasst/calibration.hpp"
#include "core/text.hpp"

namespace blasst::calibration {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using detail::num;

// Pooled curves per length for one fit key; curves at the same length (layers, seeds) are pooled
// so the fit targets the sparsity of everything the group's configuration applies to.
using Key = std::tuple<std::string, std::string, Phase>;  // component, layer ("" pooled), phase
using ByLength = std::map<std::int64_t, SparsityCurve>;

std::map<Key, ByLength> pool(const std::vector<CurveSample>& samples, bool per_layer,
                             bool pooled) {
  std::map<Key, ByLength> out;
  auto add = [&](const Key& k, const CurveSample& s) {
    // Every curve of one key must share the granularity (also across lengths).
    for (const auto& [len, c] : out[k])
      if (!c.empty() && !s.curve.empty() && !same_granularity(c.granularity(), s.curve.granularity()))
        throw Error("calibration: samples of component '" + std::get<0>(k) + "', phase " +
                    to_string(std::get<2>(k)) + " mix vote granularities: " +
                    describe(c.granularity()) + " (L=" + std::to_string(len) + ") vs " +
                    describe(s.curve.granularity()) + " (L=" + std::to_string(s.length) + ")" +
                    (c.granularity().split_tiles != s.curve.granularity().split_tiles
                         ? "; the split layout differs (the decode kernel picks it per length): fix it "
                           "with a split size (blasst calibrate --split-tiles N)"
                         : ""));
    out[k][s.length].merge(s.curve);
  };
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    if (s.length < 1)
      throw Error("calibration: sample " + std::to_string(i) + ": length must be >= 1");
    if (s.curve.empty())
      throw Error("calibration: sample " + std::to_string(i) + " (L=" + std::to_string(s.length) +
                  "): empty curve (no visited pairs)");
    if (pooled) add(Key{s.component, "", s.phase}, s);
    if (per_layer && !s.layer.empty()) add(Key{s.component, s.layer, s.phase}, s);
  }
  return out;
}

void check_targets(const std::vector<double>& targets, bool any) {
  if (targets.empty()) throw Error("calibration: targets: empty list");
  for (double t : targets) {
    const bool ok = any ? (t > 0.0 && t < 1.0) : (t >= 0.1 - 1e-12 && t <= 0.9 + 1e-12);
    if (!ok || std::isnan(t))
      throw Error("calibration: targets: " + num(t) + " outside " +
                  (any ? std::string("(0, 1)") : std::string("[0.1, 0.9]")));
  }
}

InverseLawFit inverse_law(double target, const std::vector<std::int64_t>& L,
                          const std::vector<double>& lambda) {
  InverseLawFit f;
  f.target = target;
  f.n = static_cast<int>(L.size());
  if (L.empty()) {
    f.a_prime = f.r2 = f.exponent = kNaN;
    return f;
  }
  const std::size_t n = L.size();
  std::vector<double> x(n), y(n);
  double mean_af = 0, my = 0, mx = 0;
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = std::log(static_cast<double>(L[i]));
    y[i] = std::log(lambda[i]);
    mean_af += y[i] + x[i];
    my += y[i];
    mx += x[i];
  }
  mean_af /= n;
  my /= n;
  mx /= n;
  f.a_prime = std::exp(mean_af);
  double ss_tot = 0, ss_res = 0, sxy = 0, sxx = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ss_tot += (y[i] - my) * (y[i] - my);
    const double r = y[i] - (mean_af - x[i]);
    ss_res += r * r;
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
  }
  f.r2 = ss_tot > 0 ? 1.0 - ss_res / ss_tot : kNaN;  // one distinct lambda: undefined
  f.exponent = sxx > 0 ? -sxy / sxx : kNaN;
  return f;
}
// max |achieved - target| of a form over every length and the given targets (exact curves:
// achieved is what a run at that lambda skips).
double form_error(const config::PiecewiseLogFactor& form, const ByLength& bylen,
                  const std::vector<double>& targets) {
  double e = 0;
  for (const auto& [L, c] : bylen)
    for (double t : targets) e = std::max(e, std::abs(c.sparsity_at(form.factor(t, L) / static_cast<double>(L)) - t));
  return e;
}
}  // namespace

LogLinearFit fit_log_linear(const std::vector<double>& s, const std::vector<double>& factor) {
  if (s.size() != factor.size())
    throw Error("calibration: fit: " + std::to_string(s.size()) + " targets but " +
                std::to_string(factor.size()) + " factors");
  const std::size_t n = s.size();
  if (n < 2) throw Error("calibration: fit: need at least 2 points, got " + std::to_string(n));
  std::vector<double> y(n);
  double ms = 0, my = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!(factor[i] > 0.0) || !std::isfinite(factor[i]))
      throw Error("calibration: fit: factor " + std::to_string(i) + " = " + num(factor[i]) +
                  " is not a positive finite number");
    if (!std::isfinite(s[i])) throw Error("calibration: fit: target " + std::to_string(i) + " is not finite");
    y[i] = std::log(factor[i]);
    ms += s[i];
    my += y[i];
  }
  ms /= n;
  my /= n;
  double sxx = 0, sxy = 0, syy = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sxx += (s[i] - ms) * (s[i] - ms);
    sxy += (s[i] - ms) * (y[i] - my);
    syy += (y[i] - my) * (y[i] - my);
  }
  if (!(sxx > 0.0)) throw Error("calibration: fit: all points share one target sparsity");
  LogLinearFit f;
  f.n = static_cast<int>(n);
  f.ab.b = sxy / sxx;
  const double loga = my - f.ab.b * ms;
  f.ab.a = std::exp(loga);
  double ss_res = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double r = y[i] - (loga + f.ab.b * s[i]);
    ss_res += r * r;
  }
  // syy = 0: every factor equal, which the line (b = 0) reproduces exactly.
  f.r2 = syy > 0.0 ? 1.0 - ss_res / syy : 1.0;
  return f;
}

config::PiecewiseLogFactor fit_piecewise(const std::vector<double>& s, const std::vector<double>& y) {
  if (s.size() != y.size())
    throw Error("calibration: piecewise form: " + std::to_string(s.size()) + " targets but " +
                std::to_string(y.size()) + " values");
  if (s.size() < 2) throw Error("calibration: piecewise form: need at least 2 knots, got " + std::to_string(s.size()));
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (!std::isfinite(s[i]) || !std::isfinite(y[i]))
      throw Error("calibration: piecewise form: knot " + std::to_string(i) + " is not finite");
    if (i > 0 && !(s[i] > s[i - 1]))
      throw Error("calibration: piecewise form: targets must be strictly increasing");
  }
  // Pool adjacent violators: blocks of (sum, count); a block whose mean falls below the one
  // before it is merged with it until the means are non-decreasing.
  struct Block {
    double sum;
    std::size_t count;
    double mean() const { return sum / static_cast<double>(count); }
  };
  std::vector<Block> blocks;
  for (double v : y) {
    blocks.push_back({v, 1});
    while (blocks.size() > 1 && blocks[blocks.size() - 2].mean() > blocks.back().mean()) {
      blocks[blocks.size() - 2].sum += blocks.back().sum;
      blocks[blocks.size() - 2].count += blocks.back().count;
      blocks.pop_back();
    }
  }
  config::PiecewiseLogFactor f;
  f.targets = s;
  for (const Block& b : blocks) f.log_factors.insert(f.log_factors.end(), b.count, b.count == 1 ? b.sum : b.mean());
  config::validate(f);
  return f;
}

double PhaseFit::curve_factor(double s, std::int64_t L) const {
  if (L < 1) throw Error("calibration: lambda: L must be >= 1");
  return curve.factor(s, L);
}
double PhaseFit::curve_lambda(double s, std::int64_t L) const {
  return curve_factor(s, L) / static_cast<double>(L);
}

double PhaseFit::factor(double s) const { return fit.ab.a * std::exp(fit.ab.b * s); }
double PhaseFit::lambda(double s, std::int64_t L) const {
  if (L < 1) throw Error("calibration: lambda: L must be >= 1");
  return factor(s) / static_cast<double>(L);
}

const PhaseFit* CalibrationResult::find(const std::string& component, const std::string& layer,
                                        Phase phase) const {
  const PhaseFit* pooled = nullptr;
  for (const auto& f : fits) {
    if (f.component != component || f.phase != phase) continue;
    if (!layer.empty() && f.layer == layer) return &f;
    if (f.layer.empty()) pooled = &f;
  }
  return pooled;
}

CalibrationResult calibrate(const std::vector<CurveSample>& samples, const FitOptions& opt) {
  check_targets(opt.targets, opt.allow_any_target);
  if (samples.empty()) throw Error("calibration: no samples");
  CalibrationResult res;
  res.targets = opt.targets;
  std::sort(res.targets.begin(), res.targets.end());
  res.targets.erase(std::unique(res.targets.begin(), res.targets.end()), res.targets.end());

  auto pooled = pool(samples, false, true);
  auto layered = opt.per_layer ? pool(samples, true, false) : std::map<Key, ByLength>{};
  for (auto* groups : {&pooled, &layered}) {
    for (const auto& [key, bylen] : *groups) {
      PhaseFit f;
      std::tie(f.component, f.layer, f.phase) = key;
      f.granularity = bylen.begin()->second.granularity();
      for (const auto& [L, c] : bylen) {
        f.lengths.push_back(L);
        f.max_sparsity.push_back(c.max_sparsity());
      }
      std::vector<double> xs, ys;
      std::vector<double> knot_s, knot_y;  // the richer form: mean ln factor per in-range target
      std::optional<FiniteSizeTerm> fs;
      if (f.phase == Phase::prefill && opt.prefill_mask && opt.finite_size)
        fs = FiniteSizeTerm{*opt.prefill_mask, f.granularity.rows, f.granularity.tile_keys};
      std::vector<double> knot_y_fs;  // the same knots over skippable pairs (finite-size term)
      double lo = kNaN, hi = kNaN;
      for (double t : res.targets) {
        std::vector<FitPoint> pts;
        bool all = true;
        for (const auto& [L, c] : bylen) {
          FitPoint p;
          p.length = L;
          p.target = t;
          p.lambda = lambda_for_sparsity(c, t);
          p.factor = p.lambda * static_cast<double>(L);
          if (!std::isfinite(p.lambda) || !(p.lambda > 0.0)) all = false;
          pts.push_back(p);
        }
        std::vector<std::int64_t> inv_l;
        std::vector<double> inv_lambda;
        for (auto& p : pts) {
          if (all) {
            p.used = true;
            xs.push_back(t);
            ys.push_back(p.factor);
          }
          if (std::isfinite(p.lambda) && p.lambda > 0.0) {
            inv_l.push_back(p.length);
            inv_lambda.push_back(p.lambda);
          }
          f.points.push_back(p);
        }
        if (all) {
          if (std::isnan(lo)) lo = t;
          hi = t;
          double sum = 0, sum_fs = 0;
          for (const auto& p : pts) {
            sum += std::log(p.factor);
            if (!fs) continue;
            // Target t over skippable pairs: this length's curve at t * (1 - f0(L)).
            const double s_all = t * (1.0 - unskippable_fraction(*fs, p.length));
            const double lam = lambda_for_sparsity(bylen.at(p.length), s_all);
            sum_fs += std::log(lam * static_cast<double>(p.length));
          }
          knot_s.push_back(t);
          knot_y.push_back(sum / static_cast<double>(pts.size()));
          knot_y_fs.push_back(sum_fs / static_cast<double>(pts.size()));
        } else {
          std::string miss;
          for (const auto& p : pts)
            if (!std::isfinite(p.lambda)) miss += (miss.empty() ? "" : ", ") + std::to_string(p.length);
          f.warnings.push_back("target " + num(t) + " is not reached with lambda < 1 at L = " +
                               miss + ": left out of the fit (extrapolation)");
        }
        f.inverse.push_back(inverse_law(t, inv_l, inv_lambda));
      }
      f.range_lo = lo;
      f.range_hi = hi;
      for (double t : res.targets)
        if (std::isnan(lo) || f.extrapolates(t)) f.extrapolated.push_back(t);
      std::set<double> distinct(xs.begin(), xs.end());
      if (distinct.size() < 2) {
        // std::string, not an ostringstream (describe() in curve.cpp says why).
        std::string msg = "calibration: component '" + f.component + "'" +
                          (f.layer.empty() ? "" : ", layer '" + f.layer + "'") + ", phase " +
                          to_string(f.phase) +
                          ": fewer than 2 targets are reached at every length (max sparsity with "
                          "lambda < 1 per length:";
        for (std::size_t i = 0; i < f.lengths.size(); ++i)
          msg += " L=" + std::to_string(f.lengths[i]) + ": " + num(f.max_sparsity[i]);
        msg += "); lower the targets or use longer sequences";
        throw Error(msg);
      }
      f.fit = fit_log_linear(xs, ys);
      f.curve = fit_piecewise(knot_s, knot_y);
      f.curve_error = form_error(f.curve, bylen, knot_s);
      if (fs) {
        // Both variants are fitted; the one whose in-sample error (max |achieved - target| over
        // the lengths and in-range targets) is smaller is kept, the plain one on a tie. Measured:
        // the term helps causal prefill (the never-skipped first tile is 6 % of the pairs at 4k)
        // and can hurt full attention, whose short lengths err the other way (docs/calibration.md).
        config::PiecewiseLogFactor with = fit_piecewise(knot_s, knot_y_fs);
        with.finite_size = fs;
        f.curve_error_plain = f.curve_error;
        f.curve_error_finite_size = form_error(with, bylen, knot_s);
        if (f.curve_error_finite_size < f.curve_error) {
          f.curve = std::move(with);
          f.curve_error = f.curve_error_finite_size;
        }
      }
      if (f.lengths.size() < 2)
        f.warnings.push_back("only one length (L = " + std::to_string(f.lengths.front()) +
                             "): the length scaling lambda = factor / L is assumed, not measured");
      res.fits.push_back(std::move(f));
    }
  }
  return res;
}

ValidationReport validate(const CalibrationResult& result, const std::vector<CurveSample>& samples,
                          const std::vector<double>& targets, double tolerance) {
  if (!(tolerance > 0.0)) throw Error("calibration: validate: tolerance must be > 0");
  check_targets(targets, true);
  ValidationReport rep;
  rep.tolerance = tolerance;
  bool any_layer_fit = false;
  for (const auto& f : result.fits) any_layer_fit |= !f.layer.empty();
  auto pooled = pool(samples, false, true);
  auto layered = any_layer_fit ? pool(samples, true, false) : std::map<Key, ByLength>{};
  for (const auto& f : result.fits) {
    const auto& groups = f.layer.empty() ? pooled : layered;
    auto it = groups.find(Key{f.component, f.layer, f.phase});
    if (it == groups.end()) continue;
    const ByLength& bylen = it->second;
    if (!same_granularity(bylen.begin()->second.granularity(), f.granularity))
      throw Error("calibration: validate: samples of component '" + f.component +
                  "' were counted at " + describe(bylen.begin()->second.granularity()) +
                  " but the fit at " + describe(f.granularity));
    const std::int64_t mid = f.lengths[f.lengths.size() / 2];
    auto mid_it = bylen.find(mid);
    for (const auto& [L, c] : bylen) {
      for (double t : targets) {
        ValidationRow r;
        r.component = f.component;
        r.layer = f.layer;
        r.phase = f.phase;
        r.length = L;
        r.target = t;
        r.lambda = f.lambda(t, L);
        r.achieved = c.sparsity_at(r.lambda);
        r.lambda_curve = f.curve_lambda(t, L);
        r.achieved_curve = c.sparsity_at(r.lambda_curve);
        if (mid_it != bylen.end()) {
          r.lambda_fixed = lambda_for_sparsity(mid_it->second, t);
          r.achieved_fixed =
              std::isfinite(r.lambda_fixed) ? c.sparsity_at(r.lambda_fixed) : 0.0;
        } else {
          r.lambda_fixed = r.achieved_fixed = kNaN;
        }
        r.in_range = !f.extrapolates(t) && L >= f.lengths.front() && L <= f.lengths.back();
        if (r.in_range) {
          rep.max_error = std::max(rep.max_error, std::abs(r.achieved - t));
          rep.max_error_curve = std::max(rep.max_error_curve, std::abs(r.achieved_curve - t));
          if (!std::isnan(r.achieved_fixed))
            rep.max_error_fixed = std::max(rep.max_error_fixed, std::abs(r.achieved_fixed - t));
        }
        rep.rows.push_back(r);
      }
    }
  }
  return rep;
}

std::map<std::string, config::SparseAttentionConfig> to_configs(const CalibrationResult& r,
                                                                const ConfigOptions& opt) {
  for (double t : {opt.target_prefill, opt.target_decode})
    if (!(t >= 0.0 && t <= 1.0))
      throw Error("calibration: config: target sparsity " + num(t) + " outside [0, 1]");
  std::map<std::string, config::SparseAttentionConfig> out;
  // component -> layer -> group (pooled under "")
  std::map<std::string, std::map<std::string, config::ConfigGroup>> groups;
  for (const auto& f : r.fits) {
    auto& g = groups[f.component][f.layer];
    // SPEC §7 revised: the interop fit always, and beside it the blasst extension with the order
    // and vote granularity the curves were counted at and the richer form.
    if (!g.blasst) {
      g.blasst = config::BlasstExtension{};
      g.blasst->visit_order = f.granularity.order;
    } else if (g.blasst->visit_order != f.granularity.order) {
      throw Error("calibration: config: component '" + f.component + "'" +
                  (f.layer.empty() ? "" : ", layer '" + f.layer + "'") +
                  ": prefill and decode were calibrated in different visit orders; a config group "
                  "holds one (calibrate both phases with the same --order)");
    }
    if (f.phase == Phase::prefill) {
      g.threshold_scale_factor.prefill = f.fit.ab;
      g.target_sparsity_prefill = opt.target_prefill;
      g.blasst->vote_prefill = f.granularity;
      g.blasst->prefill = f.curve;
    } else {
      g.threshold_scale_factor.decode = f.fit.ab;
      g.target_sparsity_decode = opt.target_decode;
      g.blasst->vote_decode = f.granularity;
      g.blasst->decode = f.curve;
    }
    g.disabled_until_timestep = opt.disabled_until_timestep;
    g.ignore = opt.ignore;
    if (!f.layer.empty()) {
      std::string pat = opt.layer_pattern;
      const auto pos = pat.find("{}");
      if (pos == std::string::npos)
        throw Error("calibration: config: layer_pattern '" + pat + "' has no {} placeholder");
      pat.replace(pos, 2, f.layer);
      g.layers = {pat};
    }
  }
  for (auto& [comp, bylayer] : groups) {
    auto& cfg = out[comp];
    int i = 0;
    for (auto& [layer, g] : bylayer)
      if (!layer.empty()) {
        g.name = "group_" + std::to_string(i++);
        cfg.groups.push_back(g);
      }
    if (auto it = bylayer.find(""); it != bylayer.end()) {
      it->second.name = "group_" + std::to_string(i++);
      cfg.groups.push_back(it->second);
    }
  }
  return out;
}

}  // namespace blasst::calibration

namespace blasst::calibration::detail {
std::map<std::int64_t, SparsityCurve> pooled_by_length(const std::vector<CurveSample>& samples,
                                                       const std::string& component,
                                                       const std::string& layer, Phase phase) {
  std::map<std::int64_t, SparsityCurve> out;
  for (const auto& s : samples)
    if (s.component == component && s.phase == phase && (layer.empty() || s.layer == layer))
      out[s.length].merge(s.curve);
  return out;
}
}  // namespace blasst::calibration::detail
