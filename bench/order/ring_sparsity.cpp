// Ring context parallelism on the CPU reference (issue 20, SPEC §2a): the sparsity a ring of C
// ranks reaches at the lambda of the unsplit max-first call, with and without seeded maxima.
// The reference engine decides every (vote group, key tile) pair exactly as the sm_90a prefill
// kernel does (the GPU tests compare skip sets to the tile), so these are the kernels' counts.
//
// A ring as blasst.diffusers runs it: rank r holds rows and keys [r L/C, (r+1) L/C) and calls
// blasst attention once per key chunk (its own first), full mask, max-first order inside each
// call; seeded, every call starts each row's running max at the max of its scores over the
// sequence's sink tile (keys 0..127) and its own tile (the tile of its own chunk holding the
// first row of its 64-row vote group). The chunk results are merged by LSE (float64) and
// compared with the dense float64 oracle, beside the unsplit skip call's error.
//
// Usage: blasst_ring_sparsity [--lengths 8192,16384] [--chunks 2,4,8] [--targets 0.5,0.7,0.9]
//          [--workloads dit,llm] [--heads 2] [--threads 2] [--out DIR] [--prefix NAME]
//          [--commit HASH]
// Writes DIR/PREFIX.md and DIR/PREFIX.json; the table also goes to stdout.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/calibration.hpp"
#include "blasst/workloads.hpp"

namespace blasst::bench_ring {
namespace {

using i64 = std::int64_t;
constexpr double kNinf = -std::numeric_limits<double>::infinity();
constexpr i64 kD = 128, kTile = 128, kRows = 64;

struct Options {
  std::string out = "bench/results";
  std::string prefix = "ring_sparsity";
  std::vector<i64> lengths = {8192, 16384};
  std::vector<i64> chunks = {2, 4, 8};
  std::vector<double> targets = {0.5, 0.7, 0.9};
  std::vector<WorkloadKind> workloads = {WorkloadKind::dit, WorkloadKind::llm};
  i64 heads = 2;
  int threads = 2;
  std::string commit = "unknown";
};

template <class T>
std::vector<T> parse_list(const std::string& s) {
  std::vector<T> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if constexpr (std::is_same_v<T, double>) v.push_back(std::stod(item));
    else v.push_back(static_cast<T>(std::stoll(item)));
  }
  return v;
}

double rel_l2(const std::vector<double>& o, const std::vector<double>& ref) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < o.size(); ++i) {
    num += (o[i] - ref[i]) * (o[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

struct RingRun {
  i64 visited = 0, skipped = 0;
  double err = 0.0;  // merged output vs the fp64 oracle (relative L2)
};

struct Case {
  const Workload* w;
  i64 L, H;
  std::vector<double> oracle;  // [L, H, d]
};

// Per row of rank r's chunk: max over the sink tile and the row's own tile (SPEC §2a), scaled,
// float64; layout [1, H, Lc] (lse's).
std::vector<double> ring_seeds(const Case& c, i64 r, i64 Lc) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  std::vector<double> seed(static_cast<std::size_t>(c.H * Lc), kNinf);
  const float* q = c.w->q.data();
  const float* k = c.w->k.data();
  for (i64 h = 0; h < c.H; ++h)
    for (i64 i = 0; i < Lc; ++i) {
      const i64 row = r * Lc + i, own = (i / kRows) * kRows / kTile;
      double mx = kNinf;
      for (i64 j0 : {i64(0), r * Lc + own * kTile})
        for (i64 j = j0; j < std::min(j0 + kTile, j0 == 0 ? c.L : (r + 1) * Lc); ++j) {
          double s = 0.0;
          for (i64 e = 0; e < kD; ++e)
            s += static_cast<double>(q[(row * c.H + h) * kD + e]) * k[(j * c.H + h) * kD + e];
          mx = std::max(mx, s * scale);
        }
      seed[static_cast<std::size_t>(h * Lc + i)] = mx;
    }
  return seed;
}

RingRun ring(const Case& c, i64 C, double lambda, bool seeded, int threads) {
  const i64 Lc = c.L / C, H = c.H;
  SkipConfig sk = SkipConfig::from_threshold(lambda);
  sk.vote = calibration::default_prefill_granularity(VisitOrder::max_first);
  sk.order_explicit = true;
  RunOptions ro;
  ro.collect_stats = true;
  ro.num_threads = threads;
  RingRun rr;
  std::vector<double> merged(static_cast<std::size_t>(c.L * H * kD), 0.0);
  std::vector<float> out(static_cast<std::size_t>(Lc * H * kD)), lse(static_cast<std::size_t>(H * Lc));
  for (i64 r = 0; r < C; ++r) {
    std::vector<double> seed = seeded ? ring_seeds(c, r, Lc) : std::vector<double>();
    // per row of the rank: the running LSE merge (M, sum of weights, weighted outputs)
    std::vector<double> M(static_cast<std::size_t>(H * Lc), kNinf), W(M.size(), 0.0);
    std::vector<double> O(static_cast<std::size_t>(Lc * H * kD), 0.0);
    for (i64 s = 0; s < C; ++s) {
      const i64 ch = (r + s) % C;  // the rank's own chunk first, as diffusers' ring
      AttentionProblem p;
      p.q = Tensor::contiguous(const_cast<float*>(c.w->q.data() + r * Lc * H * kD), DType::f32, {1, Lc, H, kD});
      p.k = Tensor::contiguous(const_cast<float*>(c.w->k.data() + ch * Lc * H * kD), DType::f32, {1, Lc, H, kD});
      p.v = Tensor::contiguous(const_cast<float*>(c.w->v.data() + ch * Lc * H * kD), DType::f32, {1, Lc, H, kD});
      p.out = Tensor::contiguous(out.data(), DType::f32, {1, Lc, H, kD});
      p.lse = Tensor::contiguous(lse.data(), DType::f32, {1, H, Lc});
      p.mask = MaskKind::full;
      if (seeded) p.seed_max = Tensor::contiguous(seed.data(), DType::f64, {1, H, Lc});
      SkipStats st;
      reference::attention(p, sk, ro, &st);
      rr.visited += st.total_visited();
      rr.skipped += st.total_skipped();
      for (i64 h = 0; h < H; ++h)
        for (i64 i = 0; i < Lc; ++i) {
          const std::size_t a = static_cast<std::size_t>(h * Lc + i);
          const double l = lse[a];
          if (!(l > kNinf)) continue;  // nothing kept in this chunk: weight 0
          const double m = std::max(M[a], l);
          const double f_old = std::exp(M[a] - m), f_new = std::exp(l - m);
          for (i64 e = 0; e < kD; ++e) {
            double& o = O[static_cast<std::size_t>((i * H + h) * kD + e)];
            o = o * f_old + f_new * out[static_cast<std::size_t>((i * H + h) * kD + e)];
          }
          W[a] = W[a] * f_old + f_new;
          M[a] = m;
        }
    }
    for (i64 i = 0; i < Lc; ++i)
      for (i64 h = 0; h < H; ++h)
        for (i64 e = 0; e < kD; ++e)
          merged[static_cast<std::size_t>(((r * Lc + i) * H + h) * kD + e)] =
              O[static_cast<std::size_t>((i * H + h) * kD + e)] / W[static_cast<std::size_t>(h * Lc + i)];
  }
  rr.err = rel_l2(merged, c.oracle);
  return rr;
}

struct Row {
  std::string workload;
  i64 L = 0, H = 0, C = 0;
  double target = 0.0, lambda = 0.0, unsplit = 0.0, unsplit_err = 0.0;
  RingRun seeded, unseeded;
};

int run(const Options& opt) {
  std::vector<Row> rows;
  const auto t0 = std::chrono::steady_clock::now();
  for (WorkloadKind kind : opt.workloads)
    for (i64 L : opt.lengths) {
      WorkloadSpec ws;
      ws.kind = kind;
      ws.seq_len = L;
      ws.heads_q = ws.heads_k = opt.heads;
      ws.head_dim = kD;
      const Workload w = make_workload(ws);
      Case c{&w, L, opt.heads, std::vector<double>(static_cast<std::size_t>(L * opt.heads * kD))};
      AttentionProblem p;
      p.q = Tensor::contiguous(const_cast<float*>(w.q.data()), DType::f32, {1, L, c.H, kD});
      p.k = Tensor::contiguous(const_cast<float*>(w.k.data()), DType::f32, {1, L, c.H, kD});
      p.v = Tensor::contiguous(const_cast<float*>(w.v.data()), DType::f32, {1, L, c.H, kD});
      p.mask = MaskKind::full;
      {
        AttentionProblem pr = p;
        pr.out = Tensor::contiguous(c.oracle.data(), DType::f64, {1, L, c.H, kD});
        RunOptions ro;
        ro.fp64 = true;
        ro.num_threads = opt.threads;
        reference::attention(pr, SkipConfig::dense(), ro);
      }
      // the unsplit max-first call's one-pass curve (SPEC §5) gives lambda per target
      const VoteGranularity vote = calibration::default_prefill_granularity(VisitOrder::max_first);
      std::vector<float> out(static_cast<std::size_t>(L * c.H * kD));
      p.out = Tensor::contiguous(out.data(), DType::f32, {1, L, c.H, kD});
      RunOptions rd;
      rd.record_deltas = true;
      rd.num_threads = opt.threads;
      SkipStats st;
      reference::attention(p, calibration::probe_config(vote), rd, &st);
      const calibration::SparsityCurve curve = calibration::SparsityCurve::from_deltas(std::move(st.deltas), vote);
      for (double target : opt.targets) {
        const double lambda = calibration::lambda_for_sparsity(curve, target);
        if (!(std::isfinite(lambda) && lambda < 1.0)) {
          std::fprintf(stderr, "%s L %lld: target %.2f unreachable (max %.3f)\n", to_string(kind),
                       static_cast<long long>(L), target, curve.max_sparsity());
          continue;
        }
        SkipConfig sk = SkipConfig::from_threshold(lambda);
        sk.vote = vote;
        sk.order_explicit = true;
        RunOptions rs;
        rs.collect_stats = true;
        rs.num_threads = opt.threads;
        SkipStats s0;
        reference::attention(p, sk, rs, &s0);
        std::vector<double> o64(out.begin(), out.end());
        for (i64 C : opt.chunks) {
          if (L % (C * kTile) != 0) continue;  // chunks of whole tiles
          Row row;
          row.workload = to_string(kind);
          row.L = L;
          row.H = c.H;
          row.C = C;
          row.target = target;
          row.lambda = lambda;
          row.unsplit = s0.sparsity();
          row.unsplit_err = rel_l2(o64, c.oracle);
          row.seeded = ring(c, C, lambda, true, opt.threads);
          row.unseeded = ring(c, C, lambda, false, opt.threads);
          if (row.seeded.visited != s0.total_visited() || row.unseeded.visited != s0.total_visited())
            throw Error("ring: visited pairs differ from the unsplit call's");
          rows.push_back(row);
          std::fprintf(stderr, "%s L %lld C %lld target %.2f: unsplit %.4f seeded %.4f unseeded %.4f\n",
                       row.workload.c_str(), static_cast<long long>(L), static_cast<long long>(C), target,
                       row.unsplit, double(row.seeded.skipped) / row.seeded.visited,
                       double(row.unseeded.skipped) / row.unseeded.visited);
        }
      }
    }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ostringstream md;
  md << "# Ring sparsity on the CPU reference (issue 20, SPEC §2a), commit " << opt.commit << "\n\n"
     << "Full mask, max-first, vote groups 64 rows x 128 keys, d " << kD << ", " << opt.heads
     << " heads; lambda from the unsplit call's one-pass curve at each target; a ring of C ranks as "
        "blasst.diffusers runs it (each rank: its rows against every key chunk, its own first; "
        "seeded: sink + own tile). Errors: relative L2 against the dense float64 oracle. "
     << secs << " s on " << opt.threads << " threads.\n\n"
     << "| workload | L | C | target | lambda | unsplit sparsity | seeded ring | seeded - unsplit | "
        "unseeded ring | unsplit error | seeded error | unseeded error |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::ostringstream js;
  js << "{\"commit\": \"" << opt.commit << "\", \"seconds\": " << secs << ", \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double ss = double(r.seeded.skipped) / r.seeded.visited;
    const double su = double(r.unseeded.skipped) / r.unseeded.visited;
    char line[512];
    std::snprintf(line, sizeof line,
                  "| %s | %lld | %lld | %.2f | %.3g | %.4f | %.4f | %+.4f | %.4f | %.2e | %.2e | %.2e |\n",
                  r.workload.c_str(), static_cast<long long>(r.L), static_cast<long long>(r.C), r.target,
                  r.lambda, r.unsplit, ss, ss - r.unsplit, su, r.unsplit_err, r.seeded.err, r.unseeded.err);
    md << line;
    std::snprintf(line, sizeof line,
                  "%s{\"workload\": \"%s\", \"L\": %lld, \"H\": %lld, \"C\": %lld, \"target\": %.3f, "
                  "\"lambda\": %.6g, \"unsplit\": %.6f, \"seeded\": %.6f, \"unseeded\": %.6f, "
                  "\"unsplit_err\": %.4e, \"seeded_err\": %.4e, \"unseeded_err\": %.4e}",
                  i ? ", " : "", r.workload.c_str(), static_cast<long long>(r.L), static_cast<long long>(r.H),
                  static_cast<long long>(r.C), r.target, r.lambda, r.unsplit, ss, su, r.unsplit_err,
                  r.seeded.err, r.unseeded.err);
    js << line;
  }
  js << "]}\n";
  std::cout << md.str();
  std::filesystem::create_directories(opt.out);
  std::ofstream(opt.out + "/" + opt.prefix + ".md") << md.str();
  std::ofstream(opt.out + "/" + opt.prefix + ".json") << js.str();
  return 0;
}

}  // namespace
}  // namespace blasst::bench_ring

int main(int argc, char** argv) {
  using namespace blasst::bench_ring;
  Options opt;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw blasst::Error(a + ": missing value");
        return argv[++i];
      };
      if (a == "--lengths") opt.lengths = parse_list<i64>(next());
      else if (a == "--chunks") opt.chunks = parse_list<i64>(next());
      else if (a == "--targets") opt.targets = parse_list<double>(next());
      else if (a == "--heads") opt.heads = std::stoll(next());
      else if (a == "--threads") opt.threads = std::stoi(next());
      else if (a == "--out") opt.out = next();
      else if (a == "--prefix") opt.prefix = next();
      else if (a == "--commit") opt.commit = next();
      else if (a == "--workloads") {
        opt.workloads.clear();
        std::stringstream ss(next());
        std::string w;
        while (std::getline(ss, w, ',')) opt.workloads.push_back(blasst::parse_workload(w));
      } else {
        std::fprintf(stderr, "usage: blasst_ring_sparsity [--lengths 8192,16384] [--chunks 2,4,8] "
                             "[--targets 0.5,0.7,0.9] [--workloads dit,llm] [--heads 2] [--threads 2] "
                             "[--out DIR] [--prefix NAME] [--commit HASH]\n");
        return 2;
      }
    }
    return run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "blasst_ring_sparsity: %s\n", e.what());
    return 1;
  }
}
