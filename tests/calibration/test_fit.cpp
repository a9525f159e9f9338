// The SPEC §6 fit on synthetic curves with known answers: recovery of (a, b), R^2, observed
// range and extrapolation flags, the inverse law, validation tables and the SPEC §7 output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "blasst/calibration.hpp"
#include "blasst/config.hpp"

using namespace blasst;
using namespace blasst::calibration;

namespace {
// An exact curve whose inverse is lambda_s = a * exp(b * s) * exp(offset) / L at every
// s = k / n: deltas sit at ln(lambda) for s = (i - 0.5) / n, so the midpoint the inverse takes
// between the k-th and (k+1)-th delta is exactly the line at k / n. Deltas above cutoff are
// pushed to >= 0 (unreachable with lambda < 1).
SparsityCurve synthetic(double a, double b, std::int64_t L, double offset = 0.0, int n = 1000,
                        double cutoff = 2.0, const VoteGranularity& g = {}) {
  std::vector<float> d(n);
  for (int i = 1; i <= n; ++i) {
    const double u = (i - 0.5) / n;
    d[i - 1] = u > cutoff ? 0.5f
                          : static_cast<float>(std::log(a) + b * u + offset - std::log(double(L)));
  }
  return SparsityCurve::from_deltas(d, g);
}

CurveSample sample(std::int64_t L, SparsityCurve c, Phase ph = Phase::prefill,
                   const std::string& comp = "default", const std::string& layer = "") {
  CurveSample s;
  s.component = comp;
  s.layer = layer;
  s.phase = ph;
  s.length = L;
  s.curve = std::move(c);
  return s;
}
}  // namespace

TEST(Fit, LogLinearRecoversKnownLine) {
  std::vector<double> s, f;
  for (double t = 0.1; t < 0.95; t += 0.1) {
    s.push_back(t);
    f.push_back(12.5 * std::exp(6.25 * t));
  }
  const auto r = fit_log_linear(s, f);
  EXPECT_NEAR(r.ab.a, 12.5, 1e-9 * 12.5);
  EXPECT_NEAR(r.ab.b, 6.25, 1e-9 * 6.25);
  EXPECT_NEAR(r.r2, 1.0, 1e-12);
  // Exact exponential data from other known (a, b): returned to 1e-9 relative as well.
  for (const auto& [a, b] : {std::pair{1443.49, 4.3037}, std::pair{0.119, 9.86}, std::pair{3.0e-3, -2.5}}) {
    std::vector<double> ff;
    for (double t : s) ff.push_back(a * std::exp(b * t));
    const auto e = fit_log_linear(s, ff);
    EXPECT_NEAR(e.ab.a, a, 1e-9 * a);
    EXPECT_NEAR(e.ab.b, b, 1e-9 * std::abs(b));
    EXPECT_NEAR(e.r2, 1.0, 1e-12);
  }
  // Noise: R^2 drops below 1 and the estimate stays close.
  std::mt19937_64 rng(11);
  std::normal_distribution<double> nd(0.0, 0.2);
  for (auto& x : f) x *= std::exp(nd(rng));
  const auto n = fit_log_linear(s, f);
  EXPECT_LT(n.r2, 0.999);
  EXPECT_GT(n.r2, 0.8);
  EXPECT_NEAR(n.ab.b, 6.25, 1.0);
  EXPECT_THROW(fit_log_linear({0.5}, {1.0}), Error);
  EXPECT_THROW(fit_log_linear({0.5, 0.5}, {1.0, 2.0}), Error);
  EXPECT_THROW(fit_log_linear({0.1, 0.5}, {1.0, -2.0}), Error);
  EXPECT_THROW(fit_log_linear({0.1, 0.5}, {1.0, std::nan("")}), Error);
}

TEST(Fit, CalibrateRecoversABFromExactCurves) {
  const double a = 3.0, b = 5.5;
  std::vector<CurveSample> samples;
  for (std::int64_t L : {1024, 2048, 4096, 8192}) samples.push_back(sample(L, synthetic(a, b, L)));
  const auto r = calibrate(samples);
  ASSERT_EQ(r.fits.size(), 1u);
  const auto& f = r.fits[0];
  EXPECT_NEAR(f.fit.ab.a, a, 1e-3 * a);  // deltas are floats
  EXPECT_NEAR(f.fit.ab.b, b, 1e-3);
  EXPECT_GT(f.fit.r2, 1.0 - 1e-9);
  EXPECT_EQ(f.fit.n, 36);
  EXPECT_DOUBLE_EQ(f.range_lo, 0.1);
  EXPECT_DOUBLE_EQ(f.range_hi, 0.9);
  EXPECT_TRUE(f.extrapolated.empty());
  EXPECT_TRUE(f.warnings.empty());
  // Inverse law holds exactly here: a' = factor(s), p = 1, R^2 = 1.
  ASSERT_EQ(f.inverse.size(), 9u);
  for (const auto& inv : f.inverse) {
    EXPECT_NEAR(inv.a_prime, a * std::exp(b * inv.target), 1e-3 * inv.a_prime);
    EXPECT_NEAR(inv.exponent, 1.0, 1e-4);
    EXPECT_GT(inv.r2, 1.0 - 1e-6);
  }
  // Applied back: every target met to within one pair (1/1000).
  const auto v = validate(r, samples, r.targets);
  EXPECT_EQ(v.rows.size(), 36u);
  EXPECT_LE(v.max_error, 1.5e-3);
  EXPECT_TRUE(v.ok());
  // The fixed-lambda baseline is exact at the middle length and off elsewhere.
  for (const auto& row : v.rows)
    if (row.length == 4096) EXPECT_NEAR(row.achieved_fixed, row.target, 1.5e-3);
  EXPECT_GT(v.max_error_fixed, 0.1);
}

TEST(Fit, NoiseLowersR2AndInverseLawSeesWrongScaling) {
  // lambda ~ L^-0.5 (not the inverse law) with per-length jitter.
  std::vector<CurveSample> samples;
  std::mt19937_64 rng(3);
  std::normal_distribution<double> nd(0.0, 0.3);
  std::vector<double> xs, ys;  // ln L and ln lambda_s(L) - (ln 0.05 + 6 s): the same at every s
  for (std::int64_t L : {1024, 2048, 4096, 8192}) {
    const double off = 0.5 * std::log(double(L)) + nd(rng);  // factor grows with sqrt(L)
    samples.push_back(sample(L, synthetic(0.05, 6.0, L, off)));
    xs.push_back(std::log(double(L)));
    ys.push_back(off - std::log(double(L)));
  }
  // The free fit lambda ~ L^-p by least squares in log space, computed here from the generated
  // data: p = -slope of ys over xs (0.5 plus the slope of the jitter).
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    mx += xs[i] / xs.size();
    my += ys[i] / ys.size();
  }
  double sxy = 0, sxx = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    sxy += (xs[i] - mx) * (ys[i] - my);
    sxx += (xs[i] - mx) * (xs[i] - mx);
  }
  const double p_expected = -sxy / sxx;
  EXPECT_GT(std::abs(p_expected - 1.0), 0.2);  // the jitter does not restore the inverse law
  const auto r = calibrate(samples);
  const auto& f = r.fits[0];
  EXPECT_LT(f.fit.r2, 0.99);
  ASSERT_EQ(f.inverse.size(), 9u);
  for (const auto& inv : f.inverse) {
    // The curves' deltas are floats (~1e-6 in ln lambda over a ln L span of 2.1): 1e-5.
    EXPECT_NEAR(inv.exponent, p_expected, 1e-5) << inv.target;
    EXPECT_LT(inv.r2, 0.95);
  }
  const auto v = validate(r, samples, r.targets);
  EXPECT_FALSE(v.ok());  // a single factor cannot serve all lengths here: reported, not hidden
}

TEST(Fit, ExtrapolationIsFlagged) {
  std::vector<CurveSample> samples;
  samples.push_back(sample(1024, synthetic(2.0, 5.0, 1024, 0.0, 1000, 0.75)));  // max 0.75
  samples.push_back(sample(4096, synthetic(2.0, 5.0, 4096)));
  const auto r = calibrate(samples);
  const auto& f = r.fits[0];
  EXPECT_NEAR(f.max_sparsity[0], 0.75, 1e-9);
  EXPECT_DOUBLE_EQ(f.range_lo, 0.1);
  EXPECT_DOUBLE_EQ(f.range_hi, 0.7);
  ASSERT_EQ(f.extrapolated.size(), 2u);
  EXPECT_DOUBLE_EQ(f.extrapolated[0], 0.8);
  EXPECT_DOUBLE_EQ(f.extrapolated[1], 0.9);
  EXPECT_TRUE(f.extrapolates(0.85));
  EXPECT_FALSE(f.extrapolates(0.4));
  EXPECT_EQ(f.fit.n, 14);  // 0.8, 0.9 left out of the fit
  EXPECT_EQ(f.warnings.size(), 2u);
  for (const auto& p : f.points)
    if (p.length == 1024 && p.target > 0.75) EXPECT_TRUE(std::isinf(p.lambda));
  const auto v = validate(r, samples, r.targets);
  for (const auto& row : v.rows) EXPECT_EQ(row.in_range, row.target <= 0.7 + 1e-12);
  const auto md = report_markdown(r, v, samples);
  EXPECT_NE(md.find("**Extrapolation**"), std::string::npos);
  EXPECT_NE(md.find("unreached"), std::string::npos);
  // Nothing reachable at two targets: refused with the measured maxima.
  std::vector<CurveSample> low = {sample(1024, synthetic(2.0, 5.0, 1024, 0, 1000, 0.15)),
                                  sample(2048, synthetic(2.0, 5.0, 2048))};
  EXPECT_THROW(calibrate(low), Error);
}

TEST(Fit, GroupsPhasesComponentsLayersAndRefusesMixedGranularity) {
  VoteGranularity dec;
  dec.rows = 1;
  dec.heads = 4;
  std::vector<CurveSample> s;
  for (std::int64_t L : {1024, 4096}) {
    s.push_back(sample(L, synthetic(2.0, 5.0, L), Phase::prefill, "transformer", "0"));
    s.push_back(sample(L, synthetic(8.0, 4.0, L), Phase::prefill, "transformer", "1"));
    s.push_back(sample(L, synthetic(0.1, 9.0, L, 0, 1000, 2.0, dec), Phase::decode, "transformer", "0"));
    s.push_back(sample(L, synthetic(1.0, 3.0, L), Phase::prefill, "transformer_2", ""));
  }
  FitOptions fo;
  fo.per_layer = true;
  const auto r = calibrate(s, fo);
  // pooled: transformer prefill, transformer decode, transformer_2 prefill; per layer: 3.
  EXPECT_EQ(r.fits.size(), 6u);
  const auto* l1 = r.find("transformer", "1", Phase::prefill);
  ASSERT_NE(l1, nullptr);
  EXPECT_NEAR(l1->fit.ab.a, 8.0, 0.01);
  EXPECT_NEAR(l1->fit.ab.b, 4.0, 0.01);
  const auto* d0 = r.find("transformer", "0", Phase::decode);
  ASSERT_NE(d0, nullptr);
  EXPECT_NEAR(d0->fit.ab.b, 9.0, 0.01);
  EXPECT_EQ(d0->granularity.heads, 4);
  const auto* t2 = r.find("transformer_2", "7", Phase::prefill);  // no layer fit: pooled
  ASSERT_NE(t2, nullptr);
  EXPECT_TRUE(t2->layer.empty());
  EXPECT_NEAR(t2->fit.ab.a, 1.0, 0.01);
  EXPECT_EQ(r.find("transformer_2", "", Phase::decode), nullptr);
  // Pooled over layers 0 and 1: between the two.
  const auto* pooled = r.find("transformer", "", Phase::prefill);
  ASSERT_NE(pooled, nullptr);
  EXPECT_TRUE(pooled->layer.empty());
  EXPECT_GT(pooled->factor(0.5), 2.0 * std::exp(2.5));
  EXPECT_LT(pooled->factor(0.5), 8.0 * std::exp(2.0));

  // SPEC §7 output: per-layer groups first, catch-all last; round trip through the config module.
  ConfigOptions co;
  co.target_prefill = 0.6;
  co.target_decode = 0.4;
  co.layer_pattern = "model.layers.{}.self_attn";
  const auto cfgs = to_configs(r, co);
  ASSERT_EQ(cfgs.size(), 2u);
  const auto& c1 = cfgs.at("transformer");
  ASSERT_EQ(c1.groups.size(), 3u);
  EXPECT_EQ(c1.groups[0].layers, std::vector<std::string>{"model.layers.0.self_attn"});
  EXPECT_TRUE(c1.groups[2].layers.empty());
  ASSERT_TRUE(c1.groups[0].threshold_scale_factor.decode.has_value());
  EXPECT_FALSE(c1.groups[1].threshold_scale_factor.decode.has_value());
  const auto back = config::parse(config::to_json(c1));
  ASSERT_TRUE(back.has_value());
  // The interop fits are written as before; beside them the blasst extension carries the
  // richer form, which is what resolve() now applies (SPEC §7 revised).
  ASSERT_TRUE(back->groups[1].threshold_scale_factor.prefill.has_value());
  EXPECT_NEAR(back->groups[1].threshold_scale_factor.prefill->a, l1->fit.ab.a, 1e-9 * l1->fit.ab.a);
  EXPECT_NEAR(back->groups[2].threshold_scale_factor.prefill->b, pooled->fit.ab.b, 1e-9);
  const SkipConfig sc = config::resolve(*back, "model.layers.1.self_attn", Phase::prefill);
  ASSERT_TRUE(sc.piecewise.has_value());
  EXPECT_EQ(sc.piecewise->log_factors, l1->curve.log_factors);
  EXPECT_DOUBLE_EQ(sc.target_sparsity, 0.6);
  const SkipConfig other = config::resolve(*back, "model.layers.9.self_attn", Phase::prefill);
  ASSERT_TRUE(other.piecewise.has_value());
  EXPECT_EQ(other.piecewise->log_factors, pooled->curve.log_factors);
  // Without the extension (a reader that does not know it) the interop fit applies, as before.
  auto plain = *back;
  for (auto& grp : plain.groups) grp.blasst.reset();
  const SkipConfig interop = config::resolve(plain, "model.layers.1.self_attn", Phase::prefill);
  ASSERT_TRUE(interop.calibration.has_value());
  EXPECT_NEAR(interop.calibration->a, l1->fit.ab.a, 1e-9 * l1->fit.ab.a);
  co.layer_pattern = "no placeholder";
  EXPECT_THROW(to_configs(r, co), Error);

  // Mixed granularity inside one (component, phase): refused.
  auto bad = s;
  VoteGranularity other_rows;
  other_rows.rows = 128;
  bad.push_back(sample(2048, synthetic(2.0, 5.0, 2048, 0, 1000, 2.0, other_rows), Phase::prefill,
                       "transformer", "0"));
  try {
    calibrate(bad);
    FAIL() << "mixed granularity accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("granularit"), std::string::npos) << e.what();
  }
}

TEST(Fit, BadInputs) {
  std::vector<CurveSample> s = {sample(1024, synthetic(2, 5, 1024)), sample(2048, synthetic(2, 5, 2048))};
  FitOptions fo;
  fo.targets = {0.05, 0.5};
  EXPECT_THROW(calibrate(s, fo), Error);  // outside [0.1, 0.9]
  fo.allow_any_target = true;
  EXPECT_NO_THROW(calibrate(s, fo));
  fo.targets = {};
  EXPECT_THROW(calibrate(s, fo), Error);
  EXPECT_THROW(calibrate({}, {}), Error);
  auto z = s;
  z[0].length = 0;
  EXPECT_THROW(calibrate(z), Error);
  auto e = s;
  e[1].curve = SparsityCurve{};
  EXPECT_THROW(calibrate(e), Error);
}

// ---- the richer form (SPEC §6 curvature): piecewise-linear ln factor -------------------------

TEST(PiecewiseForm, EvaluatesKnotsSegmentsAndEndSlopes) {
  // Hand-computed: knots (0.3, 1), (0.5, 2), (0.9, 5); slopes 5 and 7.5.
  config::PiecewiseLogFactor f;
  f.targets = {0.3, 0.5, 0.9};
  f.log_factors = {1.0, 2.0, 5.0};
  EXPECT_NO_THROW(config::validate(f));
  EXPECT_EQ(f.log_factor(0.3), 1.0);  // exact at the knots
  EXPECT_EQ(f.log_factor(0.5), 2.0);
  EXPECT_EQ(f.log_factor(0.9), 5.0);
  EXPECT_NEAR(f.log_factor(0.4), 1.5, 1e-15);
  EXPECT_NEAR(f.log_factor(0.7), 3.5, 1e-15);
  EXPECT_NEAR(f.log_factor(0.2), 0.5, 1e-15);   // first slope continued below
  EXPECT_NEAR(f.log_factor(1.0), 5.75, 1e-15);  // last slope continued above
  EXPECT_NEAR(f.factor(0.4, 1000), std::exp(1.5), 1e-15 * std::exp(1.5));  // no length term
  EXPECT_EQ(f.effective_target(0.4, 1000), 0.4);
  EXPECT_TRUE(f.extrapolates(0.2));
  EXPECT_TRUE(f.extrapolates(0.95));
  EXPECT_FALSE(f.extrapolates(0.3));
  EXPECT_FALSE(f.extrapolates(0.9));
  EXPECT_FALSE(f.extrapolates(0.6));
  EXPECT_THROW(f.log_factor(std::nan("")), Error);
  EXPECT_THROW(config::PiecewiseLogFactor{}.log_factor(0.5), Error);
}

TEST(PiecewiseForm, ValidateRefusesUnusableForms) {
  auto bad = [](std::vector<double> s, std::vector<double> y, const char* needle) {
    config::PiecewiseLogFactor f;
    f.targets = std::move(s);
    f.log_factors = std::move(y);
    try {
      config::validate(f);
      ADD_FAILURE() << "accepted; expected '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  bad({0.3}, {1.0}, "2 to 256 knots");
  bad({0.3, 0.5}, {1.0}, "knots but log_factor has 1");
  bad({0.5, 0.3}, {1.0, 2.0}, "target_sparsity[1]");
  bad({0.3, 0.3}, {1.0, 2.0}, "greater than the knot before");
  bad({0.3, 1.5}, {1.0, 2.0}, "[0, 1]");
  bad({-0.1, 0.5}, {1.0, 2.0}, "[0, 1]");
  bad({0.3, std::nan("")}, {1.0, 2.0}, "[0, 1]");
  bad({0.3, 0.5}, {2.0, 1.0}, "log_factor[1] must not be below the knot before it (2; the form is non-decreasing)");
  bad({0.3, 0.5}, {1.0, HUGE_VAL}, "finite");
  bad(std::vector<double>(257, 0.5), std::vector<double>(257, 1.0), "2 to 256 knots");
}

TEST(PiecewiseForm, PoolAdjacentViolators) {
  // Hand-computed isotonic (least-squares non-decreasing) fits.
  auto y = [](const std::vector<double>& v) {
    std::vector<double> s;
    for (std::size_t i = 0; i < v.size(); ++i) s.push_back(0.1 * static_cast<double>(i + 1));
    return fit_piecewise(s, v).log_factors;
  };
  EXPECT_EQ(y({1, 3, 2, 4}), (std::vector<double>{1, 2.5, 2.5, 4}));
  EXPECT_EQ(y({1, 2, 3, 4}), (std::vector<double>{1, 2, 3, 4}));  // already monotone: unchanged
  EXPECT_EQ(y({4, 3, 2, 1}), (std::vector<double>{2.5, 2.5, 2.5, 2.5}));
  const auto five = y({0, 5, 1, 1, 6});
  ASSERT_EQ(five.size(), 5u);
  EXPECT_EQ(five[0], 0.0);
  for (int i = 1; i <= 3; ++i) EXPECT_NEAR(five[i], 7.0 / 3.0, 1e-15);
  EXPECT_EQ(five[4], 6.0);
  EXPECT_THROW(fit_piecewise({0.1}, {1.0}), Error);
  EXPECT_THROW(fit_piecewise({0.2, 0.1}, {1.0, 2.0}), Error);
  EXPECT_THROW(fit_piecewise({0.1, 0.2}, {1.0, std::nan("")}), Error);
  EXPECT_THROW(fit_piecewise({0.1, 0.2}, {1.0}), Error);
}

namespace {
// Exact curve of the power-law regime docs/calibration.md §6 derives: at x = lambda * L the
// skipped share is s = 1 - c / x, i.e. ln factor_s = ln c - ln(1 - s), convex in s.
SparsityCurve power_law(double c, std::int64_t L, int n = 2000) {
  std::vector<float> d(n);
  for (int i = 1; i <= n; ++i) {
    const double u = (i - 0.5) / n;
    d[i - 1] = static_cast<float>(std::log(c) - std::log(1.0 - u) - std::log(double(L)));
  }
  return SparsityCurve::from_deltas(d, {});
}
}  // namespace

TEST(PiecewiseForm, FollowsConvexCurvesTheExponentialMisses) {
  const double c = 20.0;
  std::vector<CurveSample> samples;
  for (std::int64_t L : {1024, 4096, 16384}) samples.push_back(sample(L, power_law(c, L)));
  FitOptions fo;
  fo.targets = {0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9};
  const auto r = calibrate(samples, fo);
  const auto& f = r.fits[0];
  // Knots: ln c - ln(1 - s) (float64 formula), up to the float deltas and the midpoint rule.
  ASSERT_EQ(f.curve.targets, fo.targets);
  for (std::size_t i = 0; i < fo.targets.size(); ++i)
    EXPECT_NEAR(f.curve.log_factors[i], std::log(c) - std::log(1.0 - fo.targets[i]), 2e-5) << i;
  // Expected achieved sparsities from the closed form s = 1 - c / factor (clipped at 0), for the
  // exponential the test's own float64 least-squares line, for the richer form the linear
  // interpolation of the exact knots; both within one pair of 2000 of the curve.
  double ms = 0, my = 0;
  for (double t : fo.targets) {
    ms += t / fo.targets.size();
    my += (std::log(c) - std::log(1.0 - t)) / fo.targets.size();
  }
  double sxy = 0, sxx = 0;
  for (double t : fo.targets) {
    sxy += (t - ms) * (std::log(c) - std::log(1.0 - t) - my);
    sxx += (t - ms) * (t - ms);
  }
  const double b = sxy / sxx, loga = my - b * ms;
  auto closed = [&](double log_factor) { return std::max(0.0, 1.0 - c / std::exp(log_factor)); };
  auto interp = [&](double t) {
    for (std::size_t i = 0; i + 1 < fo.targets.size(); ++i)
      if (t >= fo.targets[i] && t <= fo.targets[i + 1]) {
        const double y0 = std::log(c) - std::log(1.0 - fo.targets[i]);
        const double y1 = std::log(c) - std::log(1.0 - fo.targets[i + 1]);
        return y0 + (y1 - y0) * (t - fo.targets[i]) / (fo.targets[i + 1] - fo.targets[i]);
      }
    return std::nan("");
  };
  const std::vector<double> check = {0.3, 0.35, 0.5, 0.55, 0.7, 0.85, 0.9};
  const auto v = validate(r, samples, check);
  double worst_exp = 0, worst_curve = 0;
  for (const auto& row : v.rows) {
    EXPECT_NEAR(row.achieved, closed(loga + b * row.target), 1.5e-3) << row.target;
    EXPECT_NEAR(row.achieved_curve, closed(interp(row.target)), 1.5e-3) << row.target;
    worst_exp = std::max(worst_exp, std::abs(closed(loga + b * row.target) - row.target));
    worst_curve = std::max(worst_curve, std::abs(closed(interp(row.target)) - row.target));
  }
  EXPECT_NEAR(v.max_error, worst_exp, 1.5e-3);
  EXPECT_NEAR(v.max_error_curve, worst_curve, 1.5e-3);
  // What the closed forms give (printed for the docs): the exponential misses, the form holds.
  std::printf("power law c = %g: max error exponential %.4f, richer form %.4f\n", c, worst_exp, worst_curve);
  EXPECT_GT(worst_exp, 0.03);
  EXPECT_LT(worst_curve, 0.01);
  // Report: both fits' signed errors per length and target.
  const auto md = report_markdown(r, v, samples);
  EXPECT_NE(md.find("Error achieved - target per length"), std::string::npos);
  EXPECT_NE(md.find("max error (richer form)"), std::string::npos);
}

namespace {
// A causal-prefill curve at the default vote (64 rows x 128-key tiles) with the geometry's true
// first-tile share: G of the V visited pairs never skipped (+inf; G and V counted here by a loop
// over the vote groups) and the other V - G following the power law over skippable pairs,
// u = 1 - c / (lambda L). Over all pairs the target at L is u (1 - G / V): a finite-size offset.
SparsityCurve causal_power_law(double c, std::int64_t L) {
  const std::int64_t G = (L + 63) / 64;
  std::int64_t V = 0;
  for (std::int64_t g = 0; g < G; ++g) V += std::min(L - 1, (g + 1) * 64 - 1) / 128 + 1;
  std::vector<float> d(static_cast<std::size_t>(V), HUGE_VALF);
  const std::int64_t n = V - G;
  for (std::int64_t i = 1; i <= n; ++i) {
    const double u = (i - 0.5) / n;
    d[i - 1] = static_cast<float>(std::log(c) - std::log(1.0 - u) - std::log(double(L)));
  }
  return SparsityCurve::from_deltas(d, {});
}
}  // namespace

// The finite-size variant is kept where it fits better. Expected errors of both variants from
// the closed form of causal_power_law (float64, here): over skippable pairs u = 1 - c / factor,
// over all pairs u (V - G) / V; the plain knots are the mean over lengths of ln c - ln(1 - s V/(V-G)),
// the finite-size knots ln c - ln(1 - u); both read by linear interpolation with end slopes.
TEST(PiecewiseForm, FiniteSizeVariantChosenByItsError) {
  const double c = 7.0;
  const std::vector<std::int64_t> lengths = {2048, 4096, 16384};
  const std::vector<double> targets = {0.3, 0.4, 0.5, 0.6, 0.7};
  std::vector<CurveSample> samples;
  std::vector<double> share;  // (V - G) / V per length
  for (std::int64_t L : lengths) {
    samples.push_back(sample(L, causal_power_law(c, L)));
    const std::int64_t G = (L + 63) / 64;
    std::int64_t V = 0;
    for (std::int64_t g = 0; g < G; ++g) V += std::min(L - 1, (g + 1) * 64 - 1) / 128 + 1;
    share.push_back(static_cast<double>(V - G) / static_cast<double>(V));
  }
  auto interp = [&](const std::vector<double>& y, double t) {
    std::size_t i = 0;
    while (i + 2 < targets.size() && t > targets[i + 1]) ++i;
    return y[i] + (y[i + 1] - y[i]) / (targets[i + 1] - targets[i]) * (t - targets[i]);
  };
  auto all_pairs = [&](double log_factor, std::size_t li) {
    return std::clamp(1.0 - c / std::exp(log_factor), 0.0, 1.0) * share[li];
  };
  std::vector<double> y_fs, y_plain;
  for (double t : targets) {
    y_fs.push_back(std::log(c) - std::log(1.0 - t));
    double m = 0;
    for (double sh : share) m += (std::log(c) - std::log(1.0 - t / sh)) / share.size();
    y_plain.push_back(m);
  }
  double e_fs = 0, e_plain = 0;
  for (std::size_t li = 0; li < lengths.size(); ++li)
    for (double t : targets) {
      e_fs = std::max(e_fs, std::abs(all_pairs(interp(y_fs, std::min(t / share[li], 1.0)), li) - t));
      e_plain = std::max(e_plain, std::abs(all_pairs(interp(y_plain, t), li) - t));
    }
  std::printf("finite-size variant: expected max error %.4f, plain %.4f\n", e_fs, e_plain);
  ASSERT_LT(e_fs, e_plain);  // the premise of the case

  FitOptions fo;
  fo.targets = targets;
  fo.prefill_mask = MaskKind::causal;
  const auto r = calibrate(samples, fo);
  const auto& f = r.fits[0];
  const double pair = 2.0 / 240;  // two pairs of the 240 skippable ones at 2k (float deltas, midpoints)
  EXPECT_NEAR(f.curve_error_finite_size, e_fs, pair);
  EXPECT_NEAR(f.curve_error_plain, e_plain, pair);
  ASSERT_TRUE(f.curve.finite_size.has_value());
  EXPECT_EQ(f.curve.finite_size->mask, MaskKind::causal);
  EXPECT_EQ(f.curve_error, f.curve_error_finite_size);
  for (std::size_t i = 0; i < targets.size(); ++i) EXPECT_NEAR(f.curve.log_factors[i], y_fs[i], 0.02) << i;
  // finite_size off: only the plain form is fitted.
  fo.finite_size = false;
  const auto plain = calibrate(samples, fo);
  EXPECT_FALSE(plain.fits[0].curve.finite_size.has_value());
  EXPECT_TRUE(std::isnan(plain.fits[0].curve_error_finite_size));
  EXPECT_EQ(plain.fits[0].curve_error, f.curve_error_plain);
  // Curves without an unskippable share (power_law): the plain form wins.
  std::vector<CurveSample> flat;
  for (std::int64_t L : lengths) flat.push_back(sample(L, power_law(c, L)));
  fo.finite_size = true;
  EXPECT_FALSE(calibrate(flat, fo).fits[0].curve.finite_size.has_value());
}

// What calibrate writes is what the runtime applies: to_configs -> to_json -> parse -> resolve ->
// resolve_lambda gives, for every calibration length and target, the lambda the validation used
// for the richer form (here with its finite-size term), to the last bit; the interop fit beside
// it is the exponential's.
TEST(PiecewiseForm, WrittenConfigAppliesTheValidatedLambdas) {
  std::vector<CurveSample> samples;
  for (std::int64_t L : {1000, 3000, 9000}) samples.push_back(sample(L, causal_power_law(7.0, L)));
  FitOptions fo;
  fo.targets = {0.3, 0.5, 0.7, 0.9};
  fo.prefill_mask = MaskKind::causal;
  const auto r = calibrate(samples, fo);
  const auto& f = r.fits[0];
  ASSERT_TRUE(f.curve.finite_size.has_value());
  EXPECT_EQ(f.curve.finite_size->rows, VoteGranularity{}.rows);
  const auto cfgs = to_configs(r);
  const auto back = config::parse(config::to_json(cfgs.at("default")), "written");
  ASSERT_TRUE(back.has_value());
  const auto v = validate(r, samples, {0.3, 0.4, 0.5, 0.6, 0.7, 0.9});
  int compared = 0;
  for (const auto& row : v.rows) {
    const SkipConfig sc = config::resolve(*back, "any", Phase::prefill, row.target);
    ASSERT_TRUE(sc.piecewise.has_value());
    const double lam = resolve_lambda(sc, row.length);
    EXPECT_EQ(std::memcmp(&lam, &row.lambda_curve, sizeof lam), 0) << row.length << " " << row.target;
    ++compared;
  }
  EXPECT_EQ(compared, 18);
  auto plain = *back;
  plain.groups[0].blasst.reset();  // a reader without the extension
  const SkipConfig ex = config::resolve(plain, "any", Phase::prefill, 0.5);
  ASSERT_TRUE(ex.calibration.has_value());
  EXPECT_EQ(ex.calibration->a, f.fit.ab.a);
  EXPECT_EQ(ex.calibration->b, f.fit.ab.b);
  EXPECT_EQ(resolve_lambda(ex, 3000), f.lambda(0.5, 3000));
}
