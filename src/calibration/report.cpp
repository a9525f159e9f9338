// The calibration report: report.md (tables) and PNG plots.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "blasst/calibration.hpp"
#include "calibration/internal.hpp"
#include "calibration/plot.hpp"

namespace blasst::calibration {

bool png_supported() { return plot::png_available(); }

namespace {
std::string fmt(double v, int prec = 4) {
  if (std::isnan(v)) return "n/a";
  if (std::isinf(v)) return v > 0 ? "unreached" : "-inf";
  std::ostringstream o;
  o << std::setprecision(prec) << v;
  return o.str();
}
std::string fix(double v, int prec = 3) {
  if (std::isnan(v)) return "n/a";
  std::ostringstream o;
  o << std::fixed << std::setprecision(prec) << v;
  return o.str();
}
std::string title_of(const PhaseFit& f) {
  std::string t = std::string(to_string(f.phase)) + ", component `" + f.component + "`";
  t += f.layer.empty() ? ", all layers" : ", layer `" + f.layer + "`";
  return t;
}
std::string file_stem(const PhaseFit& f) {
  std::string s = f.component + "_" + to_string(f.phase);
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') c = '_';
  return s;
}
}  // namespace

std::string report_markdown(const CalibrationResult& r, const ValidationReport& v,
                            const std::vector<CurveSample>& samples, const ReportOptions& opt,
                            const std::vector<std::string>& images) {
  std::ostringstream md;
  md << "# " << opt.title << "\n\n";
  for (const auto& n : opt.notes) md << "- " << n << "\n";
  if (!opt.notes.empty()) md << "\n";
  md << "Method (SPEC §5-§6, docs/calibration.md): one dense pass per sample records every "
        "delta; lambda_s is where the sample's curve reaches sparsity s; factor = lambda_s * L; "
        "least squares of log(factor) = log(a) + b * s. Validation applies "
        "lambda = a * exp(b * s) / L back to each curve (exact: the curve is the sparsity every "
        "lambda gives), beside a fixed lambda calibrated at the middle length.\n\n";

  md << "## Summary\n\n| phase | component | layer | a | b | R^2 | points | lengths | observed range | "
        "max error (fit) | max error (richer form) | max error (fixed lambda) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& f : r.fits) {
    double e_fit = 0, e_fix = 0, e_curve = 0;
    for (const auto& row : v.rows)
      if (row.component == f.component && row.layer == f.layer && row.phase == f.phase &&
          row.in_range) {
        e_fit = std::max(e_fit, std::abs(row.achieved - row.target));
        e_curve = std::max(e_curve, std::abs(row.achieved_curve - row.target));
        if (!std::isnan(row.achieved_fixed))
          e_fix = std::max(e_fix, std::abs(row.achieved_fixed - row.target));
      }
    md << "| " << to_string(f.phase) << " | " << f.component << " | "
       << (f.layer.empty() ? "all" : f.layer) << " | " << fmt(f.fit.ab.a, 6) << " | "
       << fmt(f.fit.ab.b, 6) << " | " << fix(f.fit.r2, 4) << " | " << f.fit.n << " | ";
    for (std::size_t i = 0; i < f.lengths.size(); ++i) md << (i ? "," : "") << f.lengths[i];
    md << " | [" << fmt(f.range_lo) << ", " << fmt(f.range_hi) << "] | " << fix(e_fit) << " | "
       << fix(e_curve) << " | " << fix(e_fix) << " |\n";
  }
  md << "\nGoal: |achieved - target| <= " << v.tolerance << " at every calibration length for "
     << "targets inside the observed range. Overall max error: fit " << fix(v.max_error)
     << (v.ok() ? " (met)" : " (NOT met)") << ", richer form " << fix(v.max_error_curve)
     << (v.curve_ok() ? " (met)" : " (NOT met)") << ", fixed lambda " << fix(v.max_error_fixed)
     << ".\n\n";

  for (const auto& f : r.fits) {
    md << "## " << title_of(f) << "\n\n";
    md << "Vote granularity: " << describe(f.granularity) << ".\n\n";
    md << "Fit: factor = a * exp(b * s), a = " << fmt(f.fit.ab.a, 6) << ", b = "
       << fmt(f.fit.ab.b, 6) << ", R^2 = " << fix(f.fit.r2, 5) << " (log space, " << f.fit.n
       << " points).\n\n";
    md << "Richer form (SPEC §6 curvature): ln factor piecewise linear in s, non-decreasing, knots (s, "
          "ln factor):";
    for (std::size_t i = 0; i < f.curve.targets.size(); ++i)
      md << (i ? "," : "") << " (" << fmt(f.curve.targets[i]) << ", " << fmt(f.curve.log_factors[i], 6) << ")";
    md << "; end slopes outside the knots (extrapolation).";
    if (f.curve.finite_size)
      md << " Finite-size term: targets over skippable pairs, s' = s / (1 - f0(L)) with f0 the share "
            "of never-skipped first tiles (" << to_string(f.curve.finite_size->mask) << ", "
         << f.curve.finite_size->rows << " rows x " << f.curve.finite_size->tile_keys << "-key tiles).";
    if (!std::isnan(f.curve_error_finite_size))
      md << " Fitted with and without that term: in-sample max error " << fix(f.curve_error_finite_size)
         << " / " << fix(f.curve_error_plain) << "; the smaller is used.";
    md << "\n\n";
    md << "Observed range: targets " << fmt(f.range_lo) << " .. " << fmt(f.range_hi)
       << " are reached with lambda < 1 at every length. Largest sparsity with lambda < 1:";
    for (std::size_t i = 0; i < f.lengths.size(); ++i)
      md << (i ? "," : "") << " L=" << f.lengths[i] << ": " << fix(f.max_sparsity[i]);
    md << ".\n\n";
    if (!f.extrapolated.empty()) {
      md << "**Extrapolation**: targets";
      for (double t : f.extrapolated) md << " " << t;
      md << " lie outside the observed range; the fit is not supported by data there.\n\n";
    }
    for (const auto& w : f.warnings) md << "- warning: " << w << "\n";
    if (!f.warnings.empty()) md << "\n";

    md << "### lambda_s from the curves (factor = lambda_s * L in parentheses)\n\n| target |";
    for (auto L : f.lengths) md << " L=" << L << " |";
    md << "\n|---|";
    for (std::size_t i = 0; i < f.lengths.size(); ++i) md << "---|";
    md << "\n";
    for (double t : r.targets) {
      md << "| " << t << (f.extrapolates(t) ? " (extrap.)" : "") << " |";
      for (const auto& p : f.points)
        if (p.target == t)
          md << " " << fmt(p.lambda, 4) << (std::isfinite(p.lambda) ? " (" + fmt(p.factor, 4) + ")" : "")
             << " |";
      md << "\n";
    }
    md << "\n### Inverse law lambda = a' / L per target\n\nR^2 in log-lambda space (negative: "
          "worse than a constant); p from the free fit lambda ~ L^-p (p = 1: the law holds).\n\n"
          "| target | a' | R^2 | p | lengths |\n|---|---|---|---|---|\n";
    for (const auto& inv : f.inverse)
      md << "| " << inv.target << " | " << fmt(inv.a_prime, 5) << " | " << fix(inv.r2, 4) << " | "
         << fix(inv.exponent, 3) << " | " << inv.n << " |\n";

    const std::int64_t mid = f.lengths[f.lengths.size() / 2];
    md << "\n### Validation: achieved sparsity, calibrated fit / fixed lambda (from L=" << mid
       << ")\n\nMisses of the goal in bold; a fitted lambda >= 1 runs that length dense (SPEC §3)."
       << "\n\n| target |";
    std::vector<std::int64_t> vl;
    for (const auto& row : v.rows)
      if (row.component == f.component && row.layer == f.layer && row.phase == f.phase &&
          std::find(vl.begin(), vl.end(), row.length) == vl.end())
        vl.push_back(row.length);
    for (auto L : vl) md << " L=" << L << " |";
    md << "\n|---|";
    for (std::size_t i = 0; i < vl.size(); ++i) md << "---|";
    md << "\n";
    std::vector<double> vt;
    for (const auto& row : v.rows)
      if (row.component == f.component && row.layer == f.layer && row.phase == f.phase &&
          std::find(vt.begin(), vt.end(), row.target) == vt.end())
        vt.push_back(row.target);
    for (double t : vt) {
      md << "| " << t << " |";
      for (auto L : vl)
        for (const auto& row : v.rows)
          if (row.component == f.component && row.layer == f.layer && row.phase == f.phase &&
              row.length == L && row.target == t) {
            const bool bad = row.in_range && std::abs(row.achieved - t) > v.tolerance;
            md << " " << (bad ? "**" : "") << fix(row.achieved) << (bad ? "**" : "")
               << (row.lambda >= 1.0 ? " (lambda >= 1: dense)" : "") << " / "
               << fix(row.achieved_fixed) << (row.in_range ? "" : " (out of range)") << " |";
          }
      md << "\n";
    }
    // Both forms side by side, as signed errors (achieved - target).
    md << "\n### Error achieved - target per length: exponential a * exp(b * s) / richer form "
          "(piecewise-linear ln factor, knots";
    for (double k : f.curve.targets) md << " " << k;
    md << ")\n\nIn-range misses of the goal in bold; (extrap.) marks targets outside the knots.\n\n| target |";
    for (auto L : vl) md << " L=" << L << " |";
    md << "\n|---|";
    for (std::size_t i = 0; i < vl.size(); ++i) md << "---|";
    md << "\n";
    auto signed_err = [](double e) { return e >= 0 ? std::string(1, '+').append(fix(e)) : fix(e); };
    for (double t : vt) {
      md << "| " << t << (f.curve.extrapolates(t) ? " (extrap.)" : "") << " |";
      for (auto L : vl)
        for (const auto& row : v.rows)
          if (row.component == f.component && row.layer == f.layer && row.phase == f.phase &&
              row.length == L && row.target == t) {
            const double e = row.achieved - t, ec = row.achieved_curve - t;
            const bool bad = row.in_range && std::abs(e) > v.tolerance;
            const bool bad_c = row.in_range && std::abs(ec) > v.tolerance;
            md << " " << (bad ? "**" : "") << signed_err(e) << (bad ? "**" : "") << " / "
               << (bad_c ? "**" : "") << signed_err(ec) << (bad_c ? "**" : "") << " |";
          }
      md << "\n";
    }
    // Per-head spread at the fitted lambda for the middle target.
    bool heads = false;
    for (const auto& s : samples)
      heads |= s.component == f.component && s.phase == f.phase && !s.heads.empty() &&
               (f.layer.empty() || s.layer == f.layer);
    if (heads && !vt.empty()) {
      const double t = vt[vt.size() / 2];
      md << "\n### Per-head sparsity at the fitted lambda for target " << t
         << " (layer-level calibration; heads vary)\n\n| length | layer | min | max |\n|---|---|---|---|\n";
      for (const auto& s : samples) {
        if (s.component != f.component || s.phase != f.phase || s.heads.empty()) continue;
        if (!f.layer.empty() && s.layer != f.layer) continue;
        const double lam = f.lambda(t, s.length);
        double lo = 1, hi = 0;
        for (const auto& h : s.heads) {
          if (h.empty()) continue;
          const double sp = h.sparsity_at(lam);
          lo = std::min(lo, sp);
          hi = std::max(hi, sp);
        }
        md << "| " << s.length << " | " << (s.layer.empty() ? "-" : s.layer) << " | " << fix(lo)
           << " | " << fix(hi) << " |\n";
      }
    }
    md << "\n";
    const std::string stem = file_stem(f);
    for (const auto& img : images)
      if (f.layer.empty() && img.find(stem) != std::string::npos)
        md << "![" << img << "](" << img << ")\n\n";
  }
  if (opt.plots && !png_supported())
    md << "Plots: not drawn (this build has no libpng; install libpng-dev and rebuild).\n";
  return md.str();
}

std::vector<std::string> write_report(const std::string& dir, const CalibrationResult& r,
                                      const ValidationReport& v,
                                      const std::vector<CurveSample>& samples,
                                      const ReportOptions& opt) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("calibration: report: cannot create directory " + dir + ": " + ec.message());
  std::vector<std::string> images, written;
  if (opt.plots && png_supported()) {
    for (const auto& f : r.fits) {
      if (!f.layer.empty()) continue;  // plots for the pooled fits only
      const auto curves = detail::pooled_by_length(samples, f.component, "", f.phase);
      const std::string stem = file_stem(f);
      {
        plot::Figure fig;
        fig.title = "SPARSITY VS LAMBDA: " + std::string(to_string(f.phase)) + " " + f.component;
        fig.xlabel = "LAMBDA";
        fig.ylabel = "SPARSITY";
        fig.log_x = true;
        fig.ymin = 0;
        fig.ymax = 1;
        fig.xmin = 1e-8;
        fig.xmax = 1;
        std::size_t ci = 0;
        for (const auto& [L, c] : curves) {
          plot::Series s;
          s.color = plot::palette(ci++);
          s.label = "L=" + std::to_string(L);
          for (int i = 0; i <= 400; ++i) {
            const double x = std::pow(10.0, -8.0 + 8.0 * i / 400.0);
            s.x.push_back(x);
            s.y.push_back(x >= 1.0 ? c.max_sparsity() : c.sparsity_at(x));
          }
          fig.series.push_back(std::move(s));
        }
        const std::string name = "sparsity_vs_lambda_" + stem + ".png";
        plot::write_png((fs::path(dir) / name).string(), plot::render(fig));
        images.push_back(name);
      }
      {
        plot::Figure fig;
        fig.title = "ACHIEVED VS TARGET: " + std::string(to_string(f.phase)) + " " + f.component;
        fig.xlabel = "TARGET SPARSITY (SOLID: FIT, DASHED: FIXED LAMBDA)";
        fig.ylabel = "ACHIEVED SPARSITY";
        fig.xmin = 0;
        fig.xmax = 1;
        fig.ymin = 0;
        fig.ymax = 1;
        plot::Series diag;
        diag.x = {0, 1};
        diag.y = {0, 1};
        diag.color = {160, 160, 160};
        diag.label = "IDEAL";
        fig.series.push_back(diag);
        std::size_t ci = 0;
        for (const auto& [L, c] : curves) {
          (void)c;
          plot::Series fit_s, fix_s;
          fit_s.color = fix_s.color = plot::palette(ci++);
          fit_s.label = "L=" + std::to_string(L);
          fix_s.dashed = true;
          for (const auto& row : v.rows)
            if (row.component == f.component && row.layer.empty() && row.phase == f.phase &&
                row.length == L) {
              fit_s.x.push_back(row.target);
              fit_s.y.push_back(row.achieved);
              fix_s.x.push_back(row.target);
              fix_s.y.push_back(row.achieved_fixed);
            }
          fig.series.push_back(std::move(fit_s));
          fig.series.push_back(std::move(fix_s));
        }
        const std::string name = "achieved_vs_target_" + stem + ".png";
        plot::write_png((fs::path(dir) / name).string(), plot::render(fig));
        images.push_back(name);
      }
    }
  }
  const std::string md_path = (fs::path(dir) / "report.md").string();
  std::ofstream out(md_path);
  if (!out) throw Error("calibration: report: cannot write " + md_path);
  out << report_markdown(r, v, samples, opt, images);
  out.close();
  if (!out) throw Error("calibration: report: error writing " + md_path);
  written.push_back(md_path);
  for (const auto& i : images) written.push_back((fs::path(dir) / i).string());
  return written;
}

}  // namespace blasst::calibration
