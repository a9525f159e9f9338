// `blasst calibrate`: SPEC §6 calibration from synthetic workloads or .npy activations, written as
// a SPEC §7 config plus a report directory (report.md, PNG plots). docs/calibration.md.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "blasst/blasst.hpp"
#include "blasst/calibration.hpp"
#include "blasst/config.hpp"
#include "blasst/npy.hpp"
#include "blasst/workloads.hpp"
#include "cli/commands.hpp"
#include "cli/common.hpp"

namespace blasst::cli {

namespace {

namespace cal = blasst::calibration;
namespace fs = std::filesystem;

struct CalibrateArgs {
  std::string workload = "llm";
  std::vector<std::int64_t> lengths;
  std::string npy_dir;
  std::string phase;  // prefill | decode | both; default depends on the source
  std::vector<double> targets = cal::default_targets();
  std::int64_t heads = 4, heads_k = 0, head_dim = 0;
  std::string device = "cpu";
  std::string out;
  std::string report;
  std::string check;
  // max_first: reference, CUDA prefill, CUDA decode (seeded splits). Natural by default (SPEC §2a,
  // §7): the interop fit (a, b) is what other tools read, and they visit in natural order; a
  // max-first calibration is ours alone, recorded in the config's "blasst".visit_order.
  std::string order = "natural";
  std::string mask;  // npy: causal | full (default causal); workloads: llm causal, dit full
  int tile_keys = 128;
  int rows = 64;
  int decode_heads = 0;  // decode vote heads: 0 = g = Hq / Hk
  std::int64_t split_tiles = 0;
  std::int64_t decode_queries = 64;
  int decode_qlen = 1;
  std::uint64_t seed = 7;
  bool per_layer = false;
  std::string layer_pattern = "{}";
  double target_prefill = 0.5, target_decode = 0.5;
  double disabled_until = -1.0;
  std::vector<std::string> ignore;
  int threads = 0;
  bool no_plots = false;
  bool histogram = false;
  bool no_finite_size = false;
};

[[noreturn]] void bad(const std::string& opt, const std::string& msg) {
  throw Error("calibrate " + opt + ": " + msg);
}

std::string join(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// One sequence's activations, fp32 [L, H, d] (the first sequence of a batch).
struct Seq {
  std::vector<float> q, k, v;
  std::int64_t L = 0, hq = 0, hk = 0, d = 0;
};

Seq load_layer(const std::string& base) {
  auto load = [](const std::string& path, std::vector<std::int64_t>& shape) {
    const npy::Array a = npy::read(path);
    const DType t = npy::library_dtype(a, false, path);
    shape = a.shape;
    if (shape.size() == 4) {
      if (shape[0] < 1) throw Error(path + ": empty batch");
      shape.erase(shape.begin());  // first sequence of the batch
    }
    if (shape.size() != 3) throw Error(path + ": expected [L, H, d] or [B, L, H, d]");
    std::vector<float> x = npy::to_f32(a, t);
    x.resize(static_cast<std::size_t>(shape[0] * shape[1] * shape[2]));
    return x;
  };
  Seq s;
  std::vector<std::int64_t> qs, ks, vs;
  s.q = load(base + "_q.npy", qs);
  s.k = load(base + "_k.npy", ks);
  s.v = load(base + "_v.npy", vs);
  if (qs[0] != ks[0] || ks != vs || qs[2] != ks[2])
    throw Error(base + "_{q,k,v}.npy: shapes disagree (need q [L, Hq, d], k and v [L, Hk, d])");
  if (qs[1] % ks[1] != 0) throw Error(base + "_q.npy: Hq must be a multiple of Hk");
  s.L = qs[0];
  s.hq = qs[1];
  s.hk = ks[1];
  s.d = qs[2];
  return s;
}

// Layers of a directory: files layer<N>_q.npy (N sorted numerically).
std::vector<std::pair<std::string, std::string>> layers_in(const fs::path& dir) {
  static const std::regex re("layer([0-9]+)_q\\.npy");
  std::vector<std::pair<long long, std::string>> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && std::regex_match(name, m, re)) found.push_back({std::stoll(m[1]), m[1]});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [n, id] : found) out.push_back({id, (dir / ("layer" + id)).string()});
  return out;
}

void check_args(CalibrateArgs& a, bool have_cuda) {
  if (a.device != "cpu" && a.device != "cuda") bad("--device", "expected cpu or cuda");
  if (a.device == "cuda" && !have_cuda)
    bad("--device", "cuda requested but no Hopper GPU / CUDA build is available");
  if (!a.phase.empty() && a.phase != "prefill" && a.phase != "decode" && a.phase != "both")
    bad("--phase", "expected prefill, decode or both");
  if (a.heads < 1) bad("--heads", "must be >= 1");
  if (a.heads_k == 0) a.heads_k = a.heads;
  if (a.heads_k < 1 || a.heads % a.heads_k != 0) bad("--heads-k", "must divide --heads");
  if (a.head_dim == 0) a.head_dim = a.device == "cuda" ? 128 : 64;
  if (a.head_dim < 1) bad("--head-dim", "must be >= 1");
  if (a.tile_keys < 1) bad("--tile-keys", "must be >= 1");
  if (a.rows < 1) bad("--rows", "must be >= 1");
  if (a.split_tiles < 0) bad("--split-tiles", "must be >= 0");
  if (a.decode_queries < 1) bad("--decode-queries", "must be >= 1");
  if (a.decode_qlen < 1 || a.decode_qlen > 8) bad("--decode-qlen", "must be in [1, 8]");
  for (auto L : a.lengths)
    if (L < 1) bad("--lengths", "every length must be >= 1");
  if (a.disabled_until != -1.0 && !(a.disabled_until >= 0.0 && a.disabled_until <= 1.0))
    bad("--disabled-until", "must lie in [0, 1]");
  if (!a.mask.empty() && a.mask != "causal" && a.mask != "full") bad("--mask", "expected causal or full");
  if (a.threads < 0 || a.threads > kMaxThreads)
    bad("--threads", "must lie in [0, " + std::to_string(kMaxThreads) + "], got " + std::to_string(a.threads));
}

void calibrate_cmd(CalibrateArgs a) {
  if (!a.check.empty()) {
    std::ostringstream err;
    const int rc = cal::check_config(a.check, std::cout, err);
    if (rc != 0) {
      // check_config writes "blasst calibrate --check: <error>" for its own report; main()
      // prefixes "blasst: error: " already, so only the flag stays.
      std::string m = err.str();
      while (!m.empty() && m.back() == '\n') m.pop_back();
      const std::string own = "blasst calibrate ";
      if (m.rfind(own, 0) == 0) m.erase(0, own.size());
      throw Error(m);
    }
    return;
  }
  const bool have_cuda = cuda_available();
  check_args(a, have_cuda);
  const bool cuda = a.device == "cuda";
  const VisitOrder order = parse_visit_order(a.order);
  const bool from_npy = !a.npy_dir.empty();
  WorkloadKind kind = WorkloadKind::llm;
  if (!from_npy) kind = parse_workload(a.workload);
  if (a.phase.empty()) a.phase = (from_npy || kind == WorkloadKind::dit) ? "prefill" : "both";
  const bool do_prefill = a.phase != "decode", do_decode = a.phase != "prefill";
  MaskKind mask = MaskKind::causal;
  if (!a.mask.empty())
    mask = a.mask == "full" ? MaskKind::full : MaskKind::causal;
  else if (!from_npy && kind != WorkloadKind::llm)
    mask = MaskKind::full;
  if (do_decode && mask == MaskKind::full)
    std::fprintf(stderr, "blasst calibrate: warning: decode calibration on a full-mask (DiT-like) "
                         "source; DiT pipelines have no decode phase\n");

  cal::MeasureOptions mo;
  mo.device = cuda ? DeviceKind::cuda : DeviceKind::cpu;
  mo.exact = !a.histogram;
  mo.num_threads = a.threads;
  VoteGranularity pg = cal::default_prefill_granularity(order);
  pg.tile_keys = a.tile_keys;
  pg.rows = a.rows;

  // Sources: (component, layer, sequence loader).
  struct Source {
    std::string component, layer, base;  // base: npy path prefix ("" = workload)
  };
  std::vector<Source> sources;
  if (from_npy) {
    const fs::path dir(a.npy_dir);
    if (!fs::is_directory(dir)) bad("--npy-dir", a.npy_dir + " is not a directory");
    for (const auto& [id, base] : layers_in(dir)) sources.push_back({"default", id, base});
    if (sources.empty()) {
      // Multi-component layout: DIR/<component>/layerN_*.npy.
      std::vector<fs::path> subs;
      for (const auto& e : fs::directory_iterator(dir))
        if (e.is_directory()) subs.push_back(e.path());
      std::sort(subs.begin(), subs.end());
      for (const auto& sub : subs)
        for (const auto& [id, base] : layers_in(sub))
          sources.push_back({sub.filename().string(), id, base});
    }
    if (sources.empty())
      bad("--npy-dir", a.npy_dir + ": no layerN_q.npy files (nor component subfolders with them)");
  } else {
    sources.push_back({"default", "", ""});
    if (a.lengths.empty())
      a.lengths = cuda ? std::vector<std::int64_t>{4096, 8192, 16384, 32768, 65536}
                       : std::vector<std::int64_t>{2048, 4096, 8192};
  }

  Progress progress;
  std::vector<cal::CurveSample> samples;
  std::vector<std::string> notes;
  const std::size_t total_steps =
      sources.size() * std::max<std::size_t>(a.lengths.empty() ? 3 : a.lengths.size(), 1) *
      ((do_prefill ? 1 : 0) + (do_decode ? 1 : 0));
  std::size_t step = 0;
  auto tick = [&](const std::string& what) {
    ++step;
    const int width = 24;
    const int done = static_cast<int>(width * std::min<std::size_t>(step, total_steps) / std::max<std::size_t>(total_steps, 1));
    progress.update("[" + std::string(done, '#') + std::string(width - done, ' ') + "] " +
                    std::to_string(step) + "/" + std::to_string(total_steps) + " " + what);
  };

  std::int64_t hq = a.heads, hk = a.heads_k, d = a.head_dim;
  for (const auto& src : sources) {
    Seq seq;
    std::vector<std::int64_t> lengths = a.lengths;
    if (!src.base.empty()) {
      seq = load_layer(src.base);
      if (lengths.empty()) {
        // The file's length and two halvings (prefixes), longest last.
        for (std::int64_t L = seq.L, i = 0; i < 3 && L >= 256; L /= 2, ++i) lengths.insert(lengths.begin(), L);
        if (lengths.empty()) lengths.push_back(seq.L);
      }
      for (auto L : lengths)
        if (L > seq.L) bad("--lengths", std::to_string(L) + " exceeds the " + std::to_string(seq.L) +
                                            " tokens of " + src.base + "_q.npy");
      hq = seq.hq;
      hk = seq.hk;
      d = seq.d;
    } else if (kind == WorkloadKind::llm) {
      // One long sequence; shorter samples are its prefixes (exactly the causal attention of the
      // first L tokens).
      WorkloadSpec ws{kind, 1, *std::max_element(lengths.begin(), lengths.end()), hq, hk, d, a.seed};
      Workload w = make_workload(ws);
      seq = Seq{std::move(w.q), std::move(w.k), std::move(w.v), ws.seq_len, hq, hk, d};
    }
    std::sort(lengths.begin(), lengths.end());
    for (auto L : lengths) {
      Seq own;
      const Seq* s = &seq;
      if (src.base.empty() && kind != WorkloadKind::llm) {
        // dit / random: one generated sequence per length (the grid depends on L), same seed.
        WorkloadSpec ws{kind, 1, L, hq, hk, d, a.seed};
        Workload w = make_workload(ws);
        own = Seq{std::move(w.q), std::move(w.k), std::move(w.v), L, hq, hk, d};
        s = &own;
      }
      // A prefix of a contiguous [L, H, d] array is a contiguous [L', H, d] array.
      cal::PrefillInput in{s->q.data(), s->k.data(), s->v.data(), L, hq, hk, d, mask};
      if (do_prefill) {
        tick("prefill " + (src.layer.empty() ? "" : "layer " + src.layer + " ") + "L=" + std::to_string(L));
        auto c = cal::measure_prefill(in, pg, mo);
        samples.push_back({src.component, src.layer, Phase::prefill, L, std::move(c.layer), std::move(c.per_head)});
      }
      if (do_decode) {
        tick("decode " + (src.layer.empty() ? "" : "layer " + src.layer + " ") + "L=" + std::to_string(L));
        const std::int64_t g = hq / hk;
        const std::int64_t vh = a.decode_heads > 0 ? a.decode_heads : g;
        if (vh < 1 || g % vh != 0) bad("--decode-heads", "must divide Hq / Hk = " + std::to_string(g));
        VoteGranularity dg = cal::default_decode_granularity(vh, a.split_tiles, order, a.decode_qlen);
        dg.tile_keys = a.tile_keys;
        auto c = cal::measure_decode(
            cal::DecodeInput{in, std::min(a.decode_queries, L - a.decode_qlen + 1), a.decode_qlen}, dg, mo);
        samples.push_back({src.component, src.layer, Phase::decode, L, std::move(c.layer), std::move(c.per_head)});
      }
    }
  }
  progress.clear();

  cal::FitOptions fo;
  fo.targets = a.targets;
  fo.per_layer = a.per_layer;
  fo.prefill_mask = mask;  // prefill samples are self-attention (Lq = Lk): finite-size term
  fo.finite_size = !a.no_finite_size;
  const auto result = cal::calibrate(samples, fo);
  const auto validation = cal::validate(result, samples, result.targets);

  // Summary on stdout.
  std::printf("blasst calibrate: %s, %s, Hq=%lld Hk=%lld d=%lld, device %s\n",
              from_npy ? ("npy " + a.npy_dir).c_str() : (std::string("workload ") + to_string(kind)).c_str(),
              to_string(mask), static_cast<long long>(hq), static_cast<long long>(hk),
              static_cast<long long>(d), a.device.c_str());
  for (const auto& f : result.fits) {
    double e = 0, ef = 0, e_live = 0, ec = 0;
    int dense = 0;
    for (const auto& r : validation.rows)
      if (r.component == f.component && r.layer == f.layer && r.phase == f.phase && r.in_range) {
        e = std::max(e, std::abs(r.achieved - r.target));
        ec = std::max(ec, std::abs(r.achieved_curve - r.target));
        if (r.lambda >= 1.0)
          ++dense;
        else
          e_live = std::max(e_live, std::abs(r.achieved - r.target));
        if (!std::isnan(r.achieved_fixed)) ef = std::max(ef, std::abs(r.achieved_fixed - r.target));
      }
    std::printf("  %-7s %s%s: a = %.6g, b = %.6g, R^2 = %.4f, range [%.2f, %.2f], lengths %s, "
                "max |achieved - target| %.3f (fixed lambda %.3f)\n",
                to_string(f.phase), f.component.c_str(),
                f.layer.empty() ? "" : (" layer " + f.layer).c_str(), f.fit.ab.a, f.fit.ab.b,
                f.fit.r2, f.range_lo, f.range_hi, join(f.lengths).c_str(), e, ef);
    std::printf("    richer form: ln factor piecewise linear over %zu knots [%.2f, %.2f]%s, "
                "max |achieved - target| %.3f\n",
                f.curve.targets.size(), f.curve.targets.front(), f.curve.targets.back(),
                f.curve.finite_size ? " with the finite-size term" : "", ec);
    if (!std::isnan(f.curve_error_finite_size))
      std::printf("      (fitted both ways: finite-size term %.3f, without %.3f; the smaller is written)\n",
                  f.curve_error_finite_size, f.curve_error_plain);
    if (dense > 0)
      std::printf("    %d in-range (length, target) pairs get lambda >= 1 from the fit and run dense; "
                  "max error elsewhere %.3f\n", dense, e_live);
    for (double t : f.extrapolated)
      std::printf("    warning: target %.2f is outside the observed range (extrapolation)\n", t);
  }
  std::printf("  goal |achieved - target| <= %.2f: exponential %s (max %.3f), richer form %s (max %.3f)\n",
              validation.tolerance, validation.ok() ? "met" : "NOT met", validation.max_error,
              validation.curve_ok() ? "met" : "NOT met", validation.max_error_curve);

  if (!a.out.empty()) {
    cal::ConfigOptions co;
    co.target_prefill = a.target_prefill;
    co.target_decode = a.target_decode;
    if (a.disabled_until >= 0.0) co.disabled_until_timestep = a.disabled_until;
    co.ignore = a.ignore;
    co.layer_pattern = a.layer_pattern;
    const auto cfgs = cal::to_configs(result, co);
    if (cfgs.size() == 1 && cfgs.begin()->first == "default") {
      if (const fs::path parent = fs::path(a.out).parent_path(); !parent.empty())
        fs::create_directories(parent);
      config::write_into(a.out, cfgs.begin()->second);
      std::printf("  wrote %s\n", a.out.c_str());
    } else {
      // Several components: OUT is a model directory, one config.json per component.
      for (const auto& [comp, cfg] : cfgs) {
        const fs::path p = fs::path(a.out) / comp / "config.json";
        fs::create_directories(p.parent_path());
        config::write_into(p.string(), cfg);
        std::printf("  wrote %s\n", p.string().c_str());
      }
    }
  }
  if (!a.report.empty()) {
    cal::ReportOptions ro;
    ro.plots = !a.no_plots;
    ro.notes.push_back(std::string("source: ") +
                       (from_npy ? "npy activations in " + a.npy_dir
                                 : std::string("synthetic workload ") + to_string(kind) + ", seed " +
                                       std::to_string(a.seed)));
    ro.notes.push_back("mask " + std::string(to_string(mask)) + ", Hq = " + std::to_string(hq) +
                       ", Hk = " + std::to_string(hk) + ", d = " + std::to_string(d) + ", device " +
                       a.device + (cuda ? " (GPU kernels, histogram curves)" : " (reference, exact curves)"));
    if (!from_npy && kind == WorkloadKind::llm)
      ro.notes.push_back("llm samples are prefixes of one sequence of length " +
                         std::to_string(*std::max_element(a.lengths.begin(), a.lengths.end())));
    if (do_decode)
      ro.notes.push_back("decode: " + std::to_string(a.decode_queries) +
                         " decode steps at the end of each sample, " + std::to_string(a.decode_qlen) +
                         " query token(s) each");
    const auto files = cal::write_report(a.report, result, validation, samples, ro);
    std::printf("  report: %s (%zu file%s)%s\n", files.front().c_str(), files.size(),
                files.size() == 1 ? "" : "s",
                cal::png_supported() || a.no_plots ? "" : " -- no PNG plots: built without libpng");
  }
}

}  // namespace

void register_calibrate(CLI::App& app) {
  auto a = std::make_shared<CalibrateArgs>();
  CLI::App* s = app.add_subcommand(
      "calibrate", "Fit the Skip-Softmax threshold (factor = a * exp(b * s)) and write a config");
  s->add_option("--workload", a->workload, "synthetic source: llm (causal) or dit (full mask), random")
      ->check(CLI::IsMember({"llm", "dit", "random"}));
  s->add_option("--lengths", a->lengths, "sample lengths L_i (comma separated); default cpu 2048,4096,8192, "
                                         "cuda 4096..65536; npy: the file's length and two halvings")
      ->delimiter(',');
  s->add_option("--npy-dir", a->npy_dir, "activations: DIR/layerN_{q,k,v}.npy (or DIR/<component>/layerN_*)");
  s->add_option("--phase", a->phase, "prefill, decode or both (default: llm both, dit and npy prefill)");
  s->add_option("--targets", a->targets, "target sparsities in [0.1, 0.9] (comma separated)")->delimiter(',');
  s->add_option("--heads", a->heads, "query heads of the synthetic workload (default 4)");
  s->add_option("--heads-k", a->heads_k, "KV heads (default = --heads)");
  s->add_option("--head-dim", a->head_dim, "head dimension (default cpu 64, cuda 128)");
  s->add_option("--device", a->device, "cpu (reference, exact curves) or cuda (GPU kernels)");
  s->add_option("--out", a->out, "write the sparse_attention_config into this config.json "
                                 "(several components: a model directory)");
  s->add_option("--report", a->report, "report directory (report.md, PNG plots)");
  s->add_option("--check", a->check, "validate a config.json (or model directory) and print a summary");
  s->add_option("--order", a->order, "tile visit order: natural (default) or max_first (SPEC §2a: the reference and the CUDA prefill kernel; the CUDA decode kernel as seeded splits)")
      ->check(CLI::IsMember({"natural", "max_first", "max-first"}));
  s->add_option("--mask", a->mask, "causal or full (default: llm/npy causal, dit full)");
  s->add_option("--tile-keys", a->tile_keys, "keys per tile (default 128, the kernels')");
  s->add_option("--rows", a->rows, "prefill vote group rows (default 64: the prefill kernel's warpgroup)");
  s->add_option("--decode-heads", a->decode_heads, "decode vote group heads (default g = Hq / Hk)");
  s->add_option("--split-tiles", a->split_tiles, "decode split-KV layout: key tiles per split (0 = unsplit)");
  s->add_option("--decode-queries", a->decode_queries, "decode steps sampled per length (default 64)");
  s->add_option("--decode-qlen", a->decode_qlen, "query tokens per decode step, 1..8 (speculative decoding)");
  s->add_option("--seed", a->seed, "workload seed (default 7)");
  s->add_flag("--per-layer", a->per_layer, "also fit every layer separately (npy sources)");
  s->add_option("--layer-pattern", a->layer_pattern,
                "layer-name pattern of per-layer groups, {} = layer number (default {})");
  s->add_option("--target-prefill", a->target_prefill, "target_sparsity.prefill written (default 0.5)");
  s->add_option("--target-decode", a->target_decode, "target_sparsity.decode written (default 0.5)");
  s->add_option("--disabled-until", a->disabled_until, "disabled_until_timestep written (diffusion)");
  s->add_option("--ignore", a->ignore, "ignore patterns written (comma separated)")->delimiter(',');
  s->add_option("--threads", a->threads, "reference threads, 0..1024 (0 = all cores)");
  s->add_flag("--no-plots", a->no_plots, "report.md only");
  s->add_flag("--histogram", a->histogram, "cpu: use delta histograms instead of exact delta lists");
  s->add_flag("--no-finite-size", a->no_finite_size,
              "richer prefill form without the finite-size term (targets over all pairs)");
  s->callback([a] { calibrate_cmd(*a); });
}

}  // namespace blasst::cli
