// `blasst run`: attention (or decode) on .npy inputs, with an optional skip threshold, writing the
// output, the LSE and the skip statistics. See docs/cli.md for the file layout and dtypes.
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "blasst/blasst.hpp"
#include "blasst/config.hpp"
#include "blasst/gating.hpp"
#include "blasst/npy.hpp"
#include "cli/commands.hpp"
#include "cli/common.hpp"
#include "core/text.hpp"
#include "io/files.hpp"

namespace blasst::cli {

namespace {

struct RunArgs {
  std::string q, k, v, out, lse, stats, config, layer, phase, dtype, order = "natural", device = "cpu";
  std::string screen = "off";
  bool causal = false, decode = false, screen_ahead = false;
  double threshold = 0, factor = 0, target = 0, scale = 0, timestep = 0, num_train = 0, screen_z = 6.0;
  int tile_keys = 128, vote_rows = 64, vote_heads = 1, threads = 0;
  std::int64_t split_tiles = 0;
  // Which optional options were given.
  CLI::Option *o_threshold = nullptr, *o_factor = nullptr, *o_config = nullptr, *o_target = nullptr,
              *o_scale = nullptr, *o_timestep = nullptr, *o_phase = nullptr, *o_dtype = nullptr,
              *o_lse = nullptr, *o_stats = nullptr, *o_tile_keys = nullptr, *o_vote_rows = nullptr,
              *o_vote_heads = nullptr, *o_split_tiles = nullptr, *o_order = nullptr;
};

[[noreturn]] void bad_arg(const std::string& opt, const std::string& what) { throw Error(opt + ": " + what); }

using detail::num;

struct Input {
  std::string path, opt;
  npy::Array arr;
  DType file_dtype = DType::f32;
  bool batched = false;  // rank 4 in the file
};

// A user path inside a message: printable and bounded.
std::string shown(const std::string& path) { return detail::printable(path, 300); }

Input load_input(const std::string& opt, const std::string& path, bool as_bf16) {
  Input in;
  in.path = path;
  in.opt = opt;
  try {
    in.arr = npy::read(path);
    in.file_dtype = npy::library_dtype(in.arr, as_bf16, path);
  } catch (const Error& e) {  // "<file>: ..." from the reader: add the flag
    bad_arg(opt, e.what());
  }
  const auto rank = in.arr.shape.size();
  if (rank != 3 && rank != 4)
    bad_arg(opt, shown(path) + ": expected shape [B, L, H, d] or [L, H, d], got rank " + std::to_string(rank));
  for (auto d : in.arr.shape)
    if (d == 0) bad_arg(opt, shown(path) + ": empty dimension in the shape");
  in.batched = rank == 4;
  return in;
}

// The library names its arguments (q, k_cache, skip.vote.heads, ...); the user gave flags and
// files. Library messages start with the argument's name (docs/reference.md), so the name is
// swapped for the flag and its file here, at the one place the CLI calls the library.
struct LibraryName {
  const char* prefix;  // as the library's message starts
  const char* flag;
  bool file;           // the flag names a file: show it
};
constexpr LibraryName kLibraryNames[] = {
    {"q:", "--q", true},          {"k_cache:", "--k", true},   {"v_cache:", "--v", true},
    {"k:", "--k", true},          {"v:", "--v", true},         {"out:", "--out", true},
    {"lse:", "--lse", true},      {"skip.vote.heads", "--vote-heads", false},
    {"skip.vote.tile_keys", "--tile-keys", false},           {"skip.vote.rows", "--vote-rows", false},
    {"skip.vote.split_tiles", "--split-tiles", false},       {"skip.vote.order", "--order", false},
    {"skip.threshold", "--threshold", false},                {"skip.factor", "--factor", false},
    {"scale", "--scale", false},  {"num_threads", "--threads", false},
    {"skip.screen.z", "--screen-z", false},                  {"skip.screen.ahead", "--screen-ahead", false},
    {"skip.screen", "--screen", false},
};

[[noreturn]] void rethrow_with_flag(const Error& e, const RunArgs& a, const std::string& threshold_source) {
  std::string m = e.what();
  auto file_of = [&](const std::string& flag) -> std::string {
    if (flag == "--q") return a.q;
    if (flag == "--k") return a.k;
    if (flag == "--v") return a.v;
    if (flag == "--out") return a.out;
    if (flag == "--lse") return a.lse;
    return "";
  };
  for (const LibraryName& n : kLibraryNames) {
    const std::string prefix = n.prefix;
    if (m.rfind(prefix, 0) != 0) continue;
    std::string what = m;
    if (prefix.back() == ':') what = m.substr(prefix.size() + (m.size() > prefix.size() && m[prefix.size()] == ' '));
    throw Error(std::string(n.flag) + ": " + (n.file ? shown(file_of(n.flag)) + ": " : "") + what);
  }
  // SPEC §3 lambda problems belong to whatever set the threshold.
  for (const char* prefix : {"resolve_lambda: ", "skip.calibration", "skip.piecewise", "skip.target_sparsity"})
    if (m.rfind(prefix, 0) == 0) {
      if (m.rfind("resolve_lambda: ", 0) == 0) m.erase(0, 16);
      throw Error(threshold_source + ": " + m);
    }
  throw;
}

// The input as a [B, L, H, d] buffer in the compute dtype.
HostBuffer to_compute(Input& in, DType t) {
  std::vector<std::int64_t> shape = in.arr.shape;
  if (!in.batched) shape.insert(shape.begin(), 1);
  if (in.file_dtype == t) {
    HostBuffer b;
    b.dtype = t;
    b.shape = shape;
    b.bytes = std::move(in.arr.bytes);
    return b;
  }
  return from_floats(npy::to_f32(in.arr, in.file_dtype), shape, t);
}

npy::Array to_file(const HostBuffer& b, npy::Elem e, std::vector<std::int64_t> shape) {
  if (b.dtype == DType::f64 && e == npy::Elem::f64) {
    return npy::from_f64(reinterpret_cast<const double*>(b.bytes.data()), shape);
  }
  const std::vector<float> x = to_floats(b);
  switch (e) {
    case npy::Elem::f32: return npy::from_f32(x.data(), shape);
    case npy::Elem::f64: {
      std::vector<double> d(x.begin(), x.end());
      return npy::from_f64(d.data(), shape);
    }
    case npy::Elem::f16: {
      const HostBuffer h = from_floats(x, b.shape, DType::f16);
      return npy::from_u16(reinterpret_cast<const std::uint16_t*>(h.bytes.data()), shape, e);
    }
    case npy::Elem::u16:
    case npy::Elem::bf16: {
      const HostBuffer h = from_floats(x, b.shape, DType::bf16);
      return npy::from_u16(reinterpret_cast<const std::uint16_t*>(h.bytes.data()), shape, e);
    }
  }
  throw Error("internal: unknown element type");
}

void check_args(const RunArgs& a) {
  // SPEC §3: lambda >= 1 runs dense (counted as such), as in the library and the Python package.
  if (a.o_threshold->count() && !(std::isfinite(a.threshold) && a.threshold > 0))
    bad_arg("--threshold", "lambda must be a finite number > 0 (>= 1 runs dense), got " + num(a.threshold));
  if (a.o_factor->count() && !(std::isfinite(a.factor) && a.factor > 0))
    bad_arg("--factor", "must be a finite number > 0, got " + num(a.factor));
  if (a.o_target->count() && !(a.target >= 0 && a.target <= 1))
    bad_arg("--target-sparsity", "must lie in [0, 1], got " + num(a.target));
  if (a.o_scale->count() && !(std::isfinite(a.scale) && a.scale > 0))
    bad_arg("--scale", "must be a finite number > 0, got " + num(a.scale));
  if (a.o_timestep->count()) {
    if (!std::isfinite(a.timestep)) bad_arg("--timestep", "must be finite, got " + num(a.timestep));
    if (!(std::isfinite(a.num_train) && a.num_train > 0))
      bad_arg("--num-train-timesteps", "must be a finite number > 0, got " + num(a.num_train));
    const double t = a.timestep / a.num_train;
    if (!(t >= 0 && t <= 1))
      bad_arg("--timestep", "timestep / num_train_timesteps = " + num(t) + " must lie in [0, 1]");
  }
  if (a.split_tiles < 0) bad_arg("--split-tiles", "must be >= 0");
  if (a.threads < 0 || a.threads > kMaxThreads)
    bad_arg("--threads", "must lie in [0, " + std::to_string(kMaxThreads) + "], got " + std::to_string(a.threads));
}

// The outputs, checked before any input is read: a path that cannot be written, that names an
// input, or that two outputs share fails now, before any work and before any file is replaced.
struct Outputs {
  io::OutputFile out;
  std::optional<io::OutputFile> lse, stats;

  void commit() {
    std::vector<io::OutputFile*> all{&out};
    if (lse) all.push_back(&*lse);
    if (stats) all.push_back(&*stats);
    io::commit_all(all);
  }
};

Outputs plan_outputs(const RunArgs& a) {
  Outputs o{io::OutputFile(a.out, "--out"), std::nullopt, std::nullopt};
  if (a.o_lse->count()) o.lse.emplace(a.lse, "--lse");
  if (a.o_stats->count()) o.stats.emplace(a.stats, "--stats");
  const std::pair<const char*, const std::string*> inputs[] = {
      {"--q", &a.q}, {"--k", &a.k}, {"--v", &a.v}, {"--config", &a.config}};
  std::vector<std::pair<const char*, const io::OutputFile*>> seen;
  for (const auto& [flag, f] : {std::pair<const char*, const io::OutputFile*>{"--out", &o.out},
                                {"--lse", o.lse ? &*o.lse : nullptr}, {"--stats", o.stats ? &*o.stats : nullptr}}) {
    if (f == nullptr || f->is_device()) continue;  // /dev/null may take several outputs
    for (const auto& [in_flag, in_path] : inputs)
      if (!in_path->empty() && io::same_file(f->path(), *in_path))
        bad_arg(flag, shown(f->path()) + " is also the " + in_flag + " input; refusing to overwrite an input");
    for (const auto& [other_flag, other] : seen)
      if (io::same_file(f->path(), other->path()))
        bad_arg(flag, shown(f->path()) + " is also the " + other_flag + " output; give each output its own file");
    seen.emplace_back(flag, f);
  }
  return o;
}

void run(RunArgs& a) {
  check_args(a);
  Outputs outputs = plan_outputs(a);
  Progress progress;
  const bool as_bf16 = a.o_dtype->count() && a.dtype == "bf16";

  // ---- device ----
  DeviceKind device = DeviceKind::cpu;
  if (a.device == "cuda") {
    if (!cuda_available())
      bad_arg("--device", "cuda requested but no usable GPU (built without CUDA, or no sm_90 device)");
    device = DeviceKind::cuda;
  } else if (a.device == "auto") {
    device = cuda_available() ? DeviceKind::cuda : DeviceKind::cpu;
  }

  // ---- inputs ----
  progress.update("reading inputs");
  Input qi = load_input("--q", a.q, as_bf16);
  Input ki = load_input("--k", a.k, as_bf16);
  Input vi = load_input("--v", a.v, as_bf16);
  if (ki.arr.shape.size() != qi.arr.shape.size() || vi.arr.shape.size() != qi.arr.shape.size())
    bad_arg(ki.arr.shape.size() != qi.arr.shape.size() ? "--k" : "--v",
            "q, k and v must all be rank 3 ([L, H, d]) or all rank 4 ([B, L, H, d]); --q " + shown(a.q) +
                " has rank " + std::to_string(qi.arr.shape.size()) + ", --k " + shown(a.k) + " rank " +
                std::to_string(ki.arr.shape.size()) + ", --v " + shown(a.v) + " rank " +
                std::to_string(vi.arr.shape.size()));
  if (ki.file_dtype != qi.file_dtype || vi.file_dtype != qi.file_dtype)
    bad_arg(ki.file_dtype != qi.file_dtype ? "--k" : "--v",
            std::string("q, k and v must share one dtype; --q ") + shown(a.q) + ": " + to_string(qi.file_dtype) +
                ", --k " + shown(a.k) + ": " + to_string(ki.file_dtype) + ", --v " + shown(a.v) + ": " +
                to_string(vi.file_dtype));
  const DType compute = a.o_dtype->count() ? parse_dtype(a.dtype) : qi.file_dtype;
  const npy::Elem out_elem = qi.arr.elem;  // output in the dtype (and encoding) of the q file
  const bool batched = qi.batched;

  if (device == DeviceKind::cuda && compute != DType::f16 && compute != DType::bf16)
    bad_arg("--device", std::string("the CUDA kernels take f16 or bf16 inputs, these are ") + to_string(compute) +
                            "; add --dtype bf16 or --dtype f16 (inputs are rounded)");
  HostBuffer q = to_compute(qi, compute), k = to_compute(ki, compute), v = to_compute(vi, compute);
  const std::int64_t B = q.shape[0], Lq = q.shape[1], Hq = q.shape[2];
  const std::int64_t Lk = k.shape[1], Hk = k.shape[2], dv = v.shape[3];
  if (k.shape[0] != B || v.shape[0] != B)
    bad_arg(k.shape[0] != B ? "--k" : "--v",
            "batch sizes differ: --q " + shown(a.q) + " " + std::to_string(B) + ", --k " + shown(a.k) + " " +
                std::to_string(k.shape[0]) + ", --v " + shown(a.v) + " " + std::to_string(v.shape[0]));
  if (v.shape[1] != Lk || v.shape[2] != Hk)
    bad_arg("--v", shown(a.v) + ": [L, H] must match k's [" + std::to_string(Lk) + ", " + std::to_string(Hk) + "]");
  if (k.shape[3] != q.shape[3])
    bad_arg("--k", shown(a.k) + ": head dim " + std::to_string(k.shape[3]) + " differs from q's " +
                       std::to_string(q.shape[3]));
  if (Hq % Hk != 0)
    bad_arg("--k", shown(a.k) + ": " + std::to_string(Hk) + " KV heads do not divide the " + std::to_string(Hq) +
                       " query heads of --q " + shown(a.q));
  if ((Hq / Hk) % a.vote_heads != 0)
    bad_arg("--vote-heads", std::to_string(a.vote_heads) + " must divide the query heads per KV head Hq / Hk = " +
                                std::to_string(Hq / Hk));

  // ---- skip settings ----
  const Phase phase = a.o_phase->count() ? parse_phase(a.phase) : (a.decode ? Phase::decode : Phase::prefill);
  SkipConfig skip;
  std::string source = "none (dense)";
  std::optional<double> gate_d;
  if (a.o_threshold->count()) {
    skip = SkipConfig::from_threshold(a.threshold);  // max-first by default (SPEC §2a)
    source = "threshold";
  } else if (a.o_factor->count()) {
    skip = SkipConfig::from_factor(a.factor);
    source = "factor";
  } else if (a.o_config->count()) {
    source = "config";
    std::optional<config::SparseAttentionConfig> cfg;
    try {
      cfg = config::load_file(a.config);  // messages start with the file
    } catch (const Error& e) {
      bad_arg("--config", e.what());
    }
    if (!cfg) {
      std::fprintf(stderr, "blasst: note: %s has no sparse_attention_config: running dense\n", shown(a.config).c_str());
      source = "config (no block: dense)";
    } else {
      try {
        skip = config::resolve(*cfg, a.layer, phase,
                               a.o_target->count() ? std::optional<double>(a.target) : std::nullopt);
      } catch (const Error& e) {  // "config_groups.g: ...": add the flag and the file
        bad_arg("--config", shown(a.config) + ": " + e.what());
      }
      gate_d = config::disabled_until_timestep(*cfg, a.layer);
      source = skip.enabled ? "config" : "config (layer ignored or unmatched: dense)";
    }
  }
  if (!a.o_config->count() && a.o_timestep->count())
    std::fprintf(stderr, "blasst: note: --timestep only gates a --config with disabled_until_timestep\n");
  // SPEC §4: timestep gating (D set and no t published: dense, with one warning).
  TimestepGate gate(gate_d);
  if (a.o_timestep->count()) gate.record_timestep(a.timestep, a.num_train);
  const bool gate_active = gate.active();
  if (skip.enabled && !gate_active) {
    skip = SkipConfig{};
    source += gate.current() ? " (gated: t > disabled_until_timestep, dense)" : " (gated: no --timestep, dense)";
  }
  // A config's "blasst" extension sets the visit order and vote granularity its calibration used
  // (config::resolve); flags given explicitly override it. Without the extension resolve leaves
  // the defaults, which are the flags' defaults: the same as before. The visit order (SPEC §2a):
  // --order when given (explicit: max_first where the kernel cannot do it is an error); else a
  // config's own order (natural when it names none); else the direct paths' default, max-first,
  // which falls back to natural where the prefill kernel cannot do it (full mask, Lq != Lk).
  const bool from_config = a.o_config->count() > 0;
  if (!from_config || a.o_tile_keys->count()) skip.vote.tile_keys = a.tile_keys;
  if (!from_config || a.o_vote_rows->count()) skip.vote.rows = a.vote_rows;
  if (!from_config || a.o_vote_heads->count()) skip.vote.heads = a.vote_heads;
  if (!from_config || a.o_split_tiles->count()) skip.vote.split_tiles = a.split_tiles;
  if (a.o_order->count()) skip.with_order(parse_visit_order(a.order));
  // SPEC §2b FP8 screen: flags only (a config file does not carry it).
  skip.screen.margin = parse_screen_margin(a.screen);
  skip.screen.z = a.screen_z;
  skip.screen.ahead = a.screen_ahead;
  try {
    SkipConfig screen_only;  // the screen's own checks, before (and apart from) the threshold's
    screen_only.screen = skip.screen;
    validate(screen_only);
  } catch (const Error& e) {
    rethrow_with_flag(e, a, "");
  }
  const std::string threshold_flag = a.o_threshold->count() ? "--threshold"
                                     : a.o_factor->count()  ? "--factor"
                                                            : "--config: " + shown(a.config);
  // SPEC §3: lambda of every sequence (all have Lk keys here) before any work is done, so that
  // e.g. --factor 5e-324 (lambda = factor / Lk underflows to 0) is reported against its flag.
  if (skip.enabled) {
    try {
      (void)resolve_lambda(skip, Lk);
    } catch (const Error& e) {
      rethrow_with_flag(e, a, threshold_flag);
    }
  }

  // ---- outputs (poisoned: whatever the engine fails to write shows up as NaN) ----
  const DType out_t = compute == DType::f64 ? DType::f64 : DType::f32;
  HostBuffer out = make_buffer(out_t, {B, Lq, Hq, dv});
  poison(out);
  HostBuffer lse;
  if (outputs.lse) {
    lse = make_buffer(DType::f32, {B, Hq, Lq});
    poison(lse);
  }

  RunOptions opt;
  opt.collect_stats = true;
  opt.num_threads = a.threads;
  opt.device = device;
  SkipStats stats;
  progress.update(std::string(a.decode ? "decode" : "attention") + " on " + (device == DeviceKind::cuda ? "cuda" : "cpu") +
                  ": B=" + std::to_string(B) + " Lq=" + std::to_string(Lq) + " Lk=" + std::to_string(Lk) +
                  " Hq=" + std::to_string(Hq) + " Hk=" + std::to_string(Hk));
  const double t0 = now_ms();
  if (a.decode) {
    DecodeProblem p;
    p.q = q.tensor();
    p.k_cache = k.tensor();
    p.v_cache = v.tensor();
    p.out = out.tensor();
    if (outputs.lse) p.lse = lse.tensor();
    p.mask = MaskKind::causal;
    if (a.o_scale->count()) p.scale = a.scale;
    try {
      blasst::decode(p, skip, opt, &stats);
    } catch (const Error& e) {
      rethrow_with_flag(e, a, threshold_flag);
    }
  } else {
    AttentionProblem p;
    p.q = q.tensor();
    p.k = k.tensor();
    p.v = v.tensor();
    p.out = out.tensor();
    if (outputs.lse) p.lse = lse.tensor();
    p.mask = a.causal ? MaskKind::causal : MaskKind::full;
    if (a.o_scale->count()) p.scale = a.scale;
    try {
      blasst::attention(p, skip, opt, &stats);
    } catch (const Error& e) {
      rethrow_with_flag(e, a, threshold_flag);
    }
  }
  const double ms = now_ms() - t0;

  // ---- write: every output staged next to its target, then all renamed into place ----
  progress.update("writing " + shown(a.out));
  std::vector<std::int64_t> oshape = {B, Lq, Hq, dv};
  if (!batched) oshape.erase(oshape.begin());
  outputs.out.stage(npy::serialize(to_file(out, out_elem, oshape)));
  if (outputs.lse) {
    std::vector<std::int64_t> lshape = {B, Hq, Lq};
    if (!batched) lshape.erase(lshape.begin());
    outputs.lse->stage(npy::serialize(npy::from_f32(reinterpret_cast<const float*>(lse.bytes.data()), lshape)));
  }
  if (outputs.stats) {
    nlohmann::json j = stats_json(stats);
    j["command"] = a.decode ? "decode" : "attention";
    j["phase"] = to_string(phase);
    j["mask"] = a.decode ? "causal" : (a.causal ? "causal" : "full");
    j["device"] = device == DeviceKind::cuda ? "cuda" : "cpu";
    j["compute_dtype"] = to_string(compute);
    j["shape"] = {{"batch", B}, {"q_len", Lq}, {"k_len", Lk}, {"heads_q", Hq}, {"heads_k", Hk},
                  {"head_dim", q.shape[3]}, {"head_dim_v", dv}};
    j["threshold_source"] = source;
    j["skip_enabled"] = skip.enabled;
    if (skip.threshold) j["threshold"] = *skip.threshold;
    if (skip.factor) j["factor"] = *skip.factor;
    if (skip.calibration) {
      j["calibration"] = {{"a", skip.calibration->a}, {"b", skip.calibration->b}};
      j["target_sparsity"] = skip.target_sparsity;
    }
    if (gate_d) j["disabled_until_timestep"] = *gate_d;
    if (gate.current()) j["timestep"] = *gate.current();
    j["elapsed_ms"] = ms;
    outputs.stats->stage(j.dump(2) + "\n");
  }
  outputs.commit();
  progress.clear();
  std::printf("blasst run: wrote %s (%s); %s; skipped %lld of %lld tiles (sparsity %.4f); %.1f ms on %s\n",
              shown(a.out).c_str(), to_string(compute), source.c_str(), static_cast<long long>(stats.total_skipped()),
              static_cast<long long>(stats.total_visited()), stats.sparsity(), ms,
              device == DeviceKind::cuda ? "cuda" : "cpu");
}

}  // namespace

void register_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* s = app.add_subcommand("run", "Attention (or --decode) on .npy files with Skip-Softmax");
  s->add_option("--q", a->q, "queries .npy, [B, Lq, Hq, d] or [Lq, Hq, d]")->required()->check(CLI::ExistingFile);
  s->add_option("--k", a->k, "keys .npy, [B, Lk, Hk, d] or [Lk, Hk, d]")->required()->check(CLI::ExistingFile);
  s->add_option("--v", a->v, "values .npy, [B, Lk, Hk, dv] or [Lk, Hk, dv]")->required()->check(CLI::ExistingFile);
  s->add_option("--out", a->out, "output .npy, [B, Lq, Hq, dv], in the dtype of --q")->required();
  a->o_lse = s->add_option("--lse", a->lse, "also write the log-sum-exp, float32 [B, Hq, Lq]");
  a->o_stats = s->add_option("--stats", a->stats, "write skip statistics (JSON)");
  s->add_flag("--causal", a->causal, "causal mask (bottom-right aligned); default: full");
  s->add_flag("--decode", a->decode, "decode: q [B, q_len, Hq, d] against contiguous caches k/v [B, Lmax, Hk, d]");
  a->o_threshold = s->add_option("--threshold", a->threshold, "lambda itself, > 0 (>= 1: dense, SPEC §3)");
  a->o_factor = s->add_option("--factor", a->factor, "raw threshold_scale_factor: lambda = factor / Lk");
  a->o_config = s->add_option("--config", a->config, "config.json with a sparse_attention_config block")
                    ->check(CLI::ExistingFile);
  a->o_threshold->excludes(a->o_factor)->excludes(a->o_config);
  a->o_factor->excludes(a->o_config);
  a->o_target = s->add_option("--target-sparsity", a->target, "target sparsity for the calibrated factor")
                    ->needs(a->o_config);
  a->o_phase = s->add_option("--phase", a->phase, "calibration phase (default: prefill, decode with --decode)")
                   ->check(CLI::IsMember({"prefill", "decode"}))->needs(a->o_config);
  s->add_option("--layer", a->layer, "layer name for the config's ignore/layers patterns")->needs(a->o_config);
  a->o_scale = s->add_option("--scale", a->scale, "score scale (default 1/sqrt(d))");
  a->o_dtype = s->add_option("--dtype", a->dtype,
                             "compute dtype; bf16 also reads '<u2' inputs as bfloat16 bits (default: the files')")
                   ->check(CLI::IsMember({"f32", "f16", "bf16", "f64"}));
  // CLI::PositiveNumber would print its bound as a 300-digit double; the range of an int is 1..INT_MAX.
  const CLI::Range positive_int(1, std::numeric_limits<int>::max());
  a->o_tile_keys = s->add_option("--tile-keys", a->tile_keys, "keys per tile (SPEC: 128); beyond Lk: one tile")
                       ->check(positive_int);
  a->o_vote_rows = s->add_option("--vote-rows", a->vote_rows, "query rows per vote group (reference)")
                       ->check(positive_int);
  a->o_vote_heads = s->add_option("--vote-heads", a->vote_heads, "query heads per vote group: 1 or a divisor of Hq/Hk")
                        ->check(positive_int);
  a->o_split_tiles =
      s->add_option("--split-tiles", a->split_tiles, "split-KV layout: key tiles per split (0 = unsplit)");
  a->o_order = s->add_option("--order", a->order,
                             "tile visit order (SPEC §2a): natural or max_first. Default: max_first with "
                             "--threshold/--factor (natural where the kernel cannot do max-first: full mask "
                             "with Lq != Lk); with --config the order it names (natural if none)")
                   ->check(CLI::IsMember({"natural", "max_first", "max-first"}));
  auto* o_screen = s->add_option("--screen", a->screen,
                                 "FP8 screen (SPEC §2b): off (default), strict or tight; the reference models "
                                 "it, the CUDA prefill kernel runs it, CUDA decode refuses it")
                       ->check(CLI::IsMember({"off", "strict", "tight"}));
  s->add_option("--screen-z", a->screen_z, "z of the tight screen margin (default 6)")->needs(o_screen);
  s->add_flag("--screen-ahead", a->screen_ahead,
              "the screen decides every pair before the pass (SPEC §2b screen ahead; needs --screen strict|tight)")
      ->needs(o_screen);
  s->add_option("--device", a->device, "cpu (reference), cuda, or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  s->add_option("--threads", a->threads, "reference threads, 0..1024 (0 = all cores; the reference uses at most 4 per core)");
  a->o_timestep = s->add_option("--timestep", a->timestep, "diffusion: scheduler timestep of this step");
  auto* nt = s->add_option("--num-train-timesteps", a->num_train, "diffusion: scheduler num_train_timesteps");
  a->o_timestep->needs(nt);
  nt->needs(a->o_timestep);
  s->callback([a] { run(*a); });
}

}  // namespace blasst::cli
