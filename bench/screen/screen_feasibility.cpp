// FP8 screen feasibility on the CPU reference (SPEC §2b, issue 19 part 2): for each built-in
// workload, visit order and target sparsity, the lambda from the exact one-pass curve (SPEC §5),
// then one skip run per screen margin at that lambda: the fraction of visited pairs the screen
// decides alone, its wrong screens, the achieved sparsity, and the cost the model gives
// (a dense tile = 1: FP8 Q.K^T 0.25, bf16 Q.K^T 0.5, exp + P.V 0.5), the aim of a GPU kernel.
//
// Usage: blasst_screen_feasibility [--length 4096] [--heads 2] [--threads 2] [--targets 0.5,0.7,0.9]
//          [--workloads llm,dit] [--orders natural,max_first] [--margins NAME;NAME] [--commit HASH]
//          [--out FILE.md]
// --margins: a ';'-separated subset of the margin names below (default: all).
// llm runs causal, dit full mask (the SPEC §8 workloads), d = 128, vote 64 rows x 1 head x 128 keys.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/calibration.hpp"
#include "blasst/workloads.hpp"

namespace {

using namespace blasst;
using i64 = std::int64_t;
constexpr i64 kD = 128;

struct Margin {
  const char* name;
  ScreenMargin margin;
  double z;
  bool ahead;  // SPEC §2b screen ahead (against lower bounds of the running maxima)
};
const Margin kMargins[] = {{"off", ScreenMargin::off, 0.0, false},
                           {"strict", ScreenMargin::strict, 0.0, false},
                           {"tight z=8", ScreenMargin::tight, 8.0, false},
                           {"tight z=6", ScreenMargin::tight, 6.0, false},
                           {"tight z=4", ScreenMargin::tight, 4.0, false},
                           {"strict ahead", ScreenMargin::strict, 0.0, true},
                           {"tight z=6 ahead", ScreenMargin::tight, 6.0, true},
                           {"tight z=4 ahead", ScreenMargin::tight, 4.0, true}};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) out.push_back(t);
  return out;
}

// Screen ahead: how the pass's work splits (a CTA of the kernel holds two 64-row vote groups and
// walks one visit order for both; max-first gives both groups of a 128-row block the same own tile,
// the causal diagonal gives them the same visible tiles). From each visited pair's delta8a (the
// reference's screen_deltas: tasks by (head, 64-row group) in order, pairs in visit order), per
// 128-row block and step: listed when a group needs the tile (delta8a >= ln(lambda)), and of
// those, the ones only one group needs (the other group's S product in the pass is wasted).
// Needs lengths that are multiples of 128 (every block two whole groups).
struct AheadSplit {
  double listed = 0, one_group = 0, steps = 0;
};
AheadSplit ahead_split(const std::vector<float>& sd, i64 L, i64 H, bool causal, double ln_lambda) {
  AheadSplit a;
  std::size_t at = 0;
  for (i64 h = 0; h < H; ++h) {
    for (i64 c = 0; c < L / 128; ++c) {
      const i64 n = causal ? c + 1 : L / 128;  // visible tiles of both groups of block c
      if (at + 2 * std::size_t(n) > sd.size()) throw Error("ahead_split: fewer screen deltas than the blocks need");
      for (i64 i = 0; i < n; ++i) {
        const bool need0 = !(double(sd[at + std::size_t(i)]) < ln_lambda);
        const bool need1 = !(double(sd[at + std::size_t(n + i)]) < ln_lambda);
        a.steps += 1;
        a.listed += need0 || need1;
        a.one_group += need0 != need1;
      }
      at += 2 * std::size_t(n);
    }
  }
  if (at != sd.size()) throw Error("ahead_split: the screen deltas do not match the blocks");
  return a;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    i64 L = 4096, H = 2;
    int threads = 2;
    std::vector<double> targets = {0.5, 0.7, 0.9};
    std::vector<std::string> workloads = {"llm", "dit"};
    std::vector<VisitOrder> orders = {VisitOrder::natural, VisitOrder::max_first};
    std::vector<std::string> margins;
    std::string commit = "unknown", out_path;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto val = [&]() -> std::string {
        if (i + 1 >= argc) throw Error(a + ": needs a value");
        return argv[++i];
      };
      if (a == "--length") L = std::stoll(val());
      else if (a == "--heads") H = std::stoll(val());
      else if (a == "--threads") threads = std::stoi(val());
      else if (a == "--targets") {
        targets.clear();
        for (auto& t : split(val())) targets.push_back(std::stod(t));
      } else if (a == "--workloads") workloads = split(val());
      else if (a == "--orders") {
        orders.clear();
        for (auto& o : split(val())) orders.push_back(parse_visit_order(o));
      } else if (a == "--margins") {
        std::stringstream ms(val());
        for (std::string t; std::getline(ms, t, ';');) margins.push_back(t);
      } else if (a == "--commit") commit = val();
      else if (a == "--out") out_path = val();
      else throw Error("unknown argument " + a);
    }
    std::ostringstream md;
    md << "# FP8 screen feasibility (CPU reference, SPEC §2b)\n\n"
       << "commit " << commit << "; L = " << L << ", H = " << H << ", d = " << kD
       << ", vote 64 rows x 1 head x 128 keys; lambda per target from the exact one-pass curve.\n"
       << "screened = pairs the screen skipped alone / visited; wrong = wrong screens; cost model "
          "per visited pair (dense tile = 1): screen 0.25 + unscreened bf16 Q.K^T 0.5 + kept "
          "exp/P.V 0.5 (off: 0.5 + kept 0.5); speedup = 1 / cost.\n\n"
       << "ahead rows: listed = 128-row blocks x steps the pass walks (a group needs the tile) / "
          "all visible ones; one group = of the listed, those only one group needs.\n\n"
       << "| workload | mask | order | target | lambda | margin | sparsity | screened | "
          "screened / skipped | wrong | cost | model speedup | listed | one group |\n"
       << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const std::string& wname : workloads) {
      WorkloadSpec ws;
      ws.kind = parse_workload(wname);
      ws.seq_len = L;
      ws.heads_q = ws.heads_k = H;
      ws.head_dim = kD;
      Workload w = make_workload(ws);
      const MaskKind mask = ws.kind == WorkloadKind::dit ? MaskKind::full : MaskKind::causal;
      std::vector<float> out(static_cast<std::size_t>(L * H * kD));
      AttentionProblem p;
      p.q = Tensor::contiguous(w.q.data(), DType::f32, {1, L, H, kD});
      p.k = Tensor::contiguous(w.k.data(), DType::f32, {1, L, H, kD});
      p.v = Tensor::contiguous(w.v.data(), DType::f32, {1, L, H, kD});
      p.out = Tensor::contiguous(out.data(), DType::f32, {1, L, H, kD});
      p.mask = mask;
      for (const VisitOrder order : orders) {
        const VoteGranularity vote = calibration::default_prefill_granularity(order);
        RunOptions ro;
        ro.record_deltas = true;
        ro.num_threads = threads;
        SkipStats st;
        reference::attention(p, calibration::probe_config(vote), ro, &st);
        const calibration::SparsityCurve curve = calibration::SparsityCurve::from_deltas(std::move(st.deltas), vote);
        for (const double target : targets) {
          const double lambda = calibration::lambda_for_sparsity(curve, target);
          if (!(lambda < 1.0)) {
            md << "| " << wname << " | " << to_string(mask) << " | " << to_string(order) << " | " << target
               << " | unreachable | | | | | | | | | |\n";
            continue;
          }
          for (const Margin& m : kMargins) {
            if (!margins.empty() && std::find(margins.begin(), margins.end(), std::string(m.name)) == margins.end())
              continue;
            const double t0 = now_s();
            SkipConfig sk = SkipConfig::from_threshold(lambda);
            sk.vote = vote;
            sk.order_explicit = true;
            sk.screen.margin = m.margin;
            sk.screen.z = m.z;
            sk.screen.ahead = m.ahead;
            RunOptions rs;
            rs.collect_stats = true;
            rs.record_deltas = m.ahead && L % 128 == 0;  // the screen deltas, for the split below
            rs.num_threads = threads;
            SkipStats ss;
            reference::attention(p, sk, rs, &ss);
            std::string split_cols = " - | - |";
            if (rs.record_deltas) {
              const AheadSplit a = ahead_split(ss.screen_deltas, L, H, mask == MaskKind::causal, std::log(lambda));
              char c2[64];
              std::snprintf(c2, sizeof c2, " %.4f | %.4f |", a.listed / a.steps, a.listed ? a.one_group / a.listed : 0.0);
              split_cols = c2;
            }
            const double vis = static_cast<double>(ss.total_visited());
            const double scr = static_cast<double>(ss.total_screened());
            const double kept = vis - static_cast<double>(ss.total_skipped());
            const bool on = m.margin != ScreenMargin::off;
            const double cost = ((on ? 0.25 * vis : 0.0) + 0.5 * (vis - scr) + 0.5 * kept) / vis;
            char row[512];
            std::snprintf(row, sizeof row,
                          "| %s | %s | %s | %.2f | %.3g | %s | %.4f | %.4f | %.4f | %lld | %.3f | %.2fx |%s\n",
                          wname.c_str(), to_string(mask), to_string(order), target, lambda, m.name,
                          ss.sparsity(), scr / vis, ss.total_skipped() ? scr / ss.total_skipped() : 0.0,
                          static_cast<long long>(ss.total_screen_wrong()), cost, 1.0 / cost, split_cols.c_str());
            md << row;
            std::fprintf(stderr, "%s %s %.2f %s: %.1f s\n", wname.c_str(), to_string(order), target, m.name,
                         now_s() - t0);
          }
        }
      }
    }
    std::cout << md.str();
    if (!out_path.empty()) {
      std::ofstream f(out_path);
      if (!f) throw Error("--out: cannot open " + out_path);
      f << md.str();
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "blasst_screen_feasibility: %s\n", e.what());
    return 1;
  }
}
