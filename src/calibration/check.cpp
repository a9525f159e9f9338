// `blasst calibrate --check FILE`: load and summarise a sparse_attention_config.
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <ostream>

#include "blasst/calibration.hpp"

namespace blasst::calibration {

namespace {
void summarise(const config::SparseAttentionConfig& cfg, std::ostream& out) {
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
    for (const P& p : {P{"prefill", f.prefill, g.target_sparsity_prefill},
                       P{"decode", f.decode, g.target_sparsity_decode}}) {
      if (!p.c) {
        out << "    " << p.name << ": no fit (that phase stays dense)\n";
        continue;
      }
      const double t = p.t.value_or(0.5);
      const double factor = p.c->a * std::exp(p.c->b * t);
      out << "    " << p.name << ": a = " << p.c->a << ", b = " << p.c->b << ", target "
          << t << (p.t ? "" : " (default)") << " -> factor " << factor << ", lambda "
          << factor / 4096.0 << " at L=4096, " << factor / 32768.0 << " at L=32768";
      if (factor / 4096.0 >= 1.0) out << " (lambda >= 1 at L=4096: dense there)";
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
        summarise(cfg, out);
      }
      return 0;
    }
    const auto cfg = config::load_file(path);
    if (!cfg) {
      out << path << ": valid JSON without a sparse_attention_config: dense\n";
      return 0;
    }
    out << path << ": valid sparse_attention_config\n";
    summarise(*cfg, out);
    return 0;
  } catch (const std::exception& e) {
    err << "blasst calibrate --check: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace blasst::calibration
