// `blasst calibrate --check FILE`: load and summarise a sparse_attention_config.
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <ostream>
#include <string>

#include "blasst/calibration.hpp"

namespace blasst::calibration {

namespace {
void summarise(const config::SparseAttentionConfig& cfg, const std::string& source, std::ostream& out) {
  out << "  " << cfg.groups.size() << (cfg.groups.size() == 1 ? " group\n" : " groups\n");
  for (const auto& g : cfg.groups) {
    out << "  " << g.name << ": algorithm " << g.algorithm;
    if (!g.layers.empty()) {
      out << ", layers";
      for (const auto& l : g.layers) out << " " << l;
    }
    if (!g.ignore.empty()) {
      out << ", ignore";
      for (const auto& l : g.ignore) out << " " << l;
    }
    if (g.disabled_until_timestep) out << ", disabled until t <= " << *g.disabled_until_timestep;
    out << "\n";
    const auto& f = g.threshold_scale_factor;
    if (f.scalar) {
      out << "    raw threshold_scale_factor " << *f.scalar << " (wins over target_sparsity): "
          << "lambda = " << *f.scalar / 4096.0 << " at L=4096, " << *f.scalar / 32768.0
          << " at L=32768\n";
      continue;
    }
    struct P {
      const char* name;
      const std::optional<Calibration>& c;
      const std::optional<double>& t;
    };
    const config::BlasstExtension* ext = g.blasst ? &*g.blasst : nullptr;
    for (const P& p : {P{"prefill", f.prefill, g.target_sparsity_prefill},
                       P{"decode", f.decode, g.target_sparsity_decode}}) {
      const bool pre = std::string(p.name) == "prefill";
      const auto* form = ext ? (pre ? &ext->prefill : &ext->decode) : nullptr;
      if (form && *form) {
        // The richer form is what this config runs with for the phase; resolve it as the runtime
        // does (its errors are the file's errors) and show the factor at two lengths.
        const double t = p.t.value_or(0.5);
        const SkipConfig sc = SkipConfig::from_piecewise(**form, t);
        const PiecewiseLogFactor& pw = **form;
        out << "    " << p.name << " (richer form, used): ln factor piecewise linear, knots";
        for (std::size_t i = 0; i < pw.targets.size(); ++i)
          out << (i ? "," : "") << " (" << pw.targets[i] << ", " << pw.log_factors[i] << ")";
        if (pw.finite_size)
          out << "; finite-size term (" << to_string(pw.finite_size->mask) << ", " << pw.finite_size->rows
              << " rows x " << pw.finite_size->tile_keys << "-key tiles)";
        out << "; target " << t << (p.t ? "" : " (default)");
        if (pw.extrapolates(t)) out << " (outside the knots: extrapolated with the end slope)";
        for (std::int64_t L : {std::int64_t{4096}, std::int64_t{32768}}) {
          double lambda = 0;
          try {
            lambda = resolve_lambda(sc, L);
          } catch (const Error& e) {
            throw Error(source + ": config_groups." + g.name + ".blasst.threshold_scale_factor." + p.name +
                        ": at target " + std::to_string(t) + ", L = " + std::to_string(L) + ": " + e.what());
          }
          out << (L == 4096 ? " -> lambda " : ", ") << lambda << " at L=" << L;
        }
        out << "\n";
      }
      if (!p.c) {
        if (!(form && *form)) out << "    " << p.name << ": no fit (that phase stays dense)\n";
        continue;
      }
      if (form && *form) out << "  ";  // the interop fit, for readers without the extension
      const double t = p.t.value_or(0.5);
      const double factor = p.c->a * std::exp(p.c->b * t);
      out << "    " << p.name << ": a = " << p.c->a << ", b = " << p.c->b << ", target "
          << t << (p.t ? "" : " (default)") << " -> factor " << factor << ", lambda "
          << factor / 4096.0 << " at L=4096, " << factor / 32768.0 << " at L=32768";
      if (factor / 4096.0 >= 1.0) out << " (lambda >= 1 at L=4096: dense there)";
      if (form && *form) out << " (interop form, for readers without the blasst extension)";
      out << "\n";
    }
    if (ext) {
      out << "    blasst extension: visit order "
          << to_string(ext->visit_order.value_or(VisitOrder::natural))
          << (ext->visit_order ? "" : " (absent: natural)");
      if (ext->vote_prefill) out << "; prefill counted at " << describe(*ext->vote_prefill);
      if (ext->vote_decode) out << "; decode counted at " << describe(*ext->vote_decode);
      out << "\n";
    }
  }
}
}  // namespace

int check_config(const std::string& path, std::ostream& out, std::ostream& err) {
  try {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      const auto comps = config::load_model_dir(path);
      if (comps.empty()) {
        out << path << ": no component carries a sparse_attention_config: the model runs dense\n";
        return 0;
      }
      out << path << ": " << comps.size() << " component(s) with sparse_attention_config\n";
      for (const auto& [name, cfg] : comps) {
        out << " component " << name << ":\n";
        summarise(cfg, path + "/" + name + "/config.json", out);
      }
      return 0;
    }
    const auto cfg = config::load_file(path);
    if (!cfg) {
      out << path << ": valid JSON without a sparse_attention_config: dense\n";
      return 0;
    }
    out << path << ": valid sparse_attention_config\n";
    summarise(*cfg, path, out);
    return 0;
  } catch (const std::exception& e) {
    err << "blasst calibrate --check: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace blasst::calibration
