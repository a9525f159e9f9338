// Accuracy/sparsity frontier of the two visit orders (SPEC §2a, issue 7), measured with the CPU
// reference engine. Prefill: one dense pass per order records every (vote group, tile) delta,
// the exact one-pass curve (SPEC §5) gives the lambda for each target sparsity, and a skip run
// at that lambda gives the achieved sparsity and the output error against a dense fp64 oracle.
// Orders are compared at equal sparsity, never at equal lambda. Decode: the split layouts the
// GPU decode kernel picks, unseeded (natural order) and seeded (max_first), against one
// unsplit pass at the same lambda.
//
// Usage: blasst_order_frontier [--out DIR] [--prefix NAME] [--lengths 4096,16384,32768]
//          [--decode-lengths 8192,32768,131072] [--targets 0.5,0.6,0.7,0.8,0.9] [--no-prefill]
//          [--no-decode] [--threads 2] [--commit HASH] [--no-png] [--workloads llm,dit]
//          [--heads H (prefill heads at every length; default 4 at L <= 4k, 2 at <= 16k, else 1)]
// Writes DIR/PREFIX.md, DIR/PREFIX.json, DIR/PREFIX.csv and DIR/PREFIX_<workload>.png.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "blasst/blasst.hpp"
#include "blasst/calibration.hpp"
#include "blasst/workloads.hpp"
#include "calibration/plot.hpp"  // internal: the calibration report's PNG line plots
#include "core/decode_layout.hpp"  // internal: the decode kernel's split heuristic

namespace blasst::bench_order {
namespace {

using i64 = std::int64_t;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr i64 kD = 128;

struct Options {
  std::string out = "bench/results";
  std::string prefix;
  std::vector<i64> lengths = {4096, 16384, 32768};
  std::vector<i64> decode_lengths = {8192, 32768, 131072};
  std::vector<double> targets = {0.5, 0.6, 0.7, 0.8, 0.9};
  std::vector<WorkloadKind> workloads = {WorkloadKind::llm, WorkloadKind::dit};
  i64 heads = 0;  // prefill heads; 0 = by length (prefill_heads)
  bool prefill = true, decode = true, png = true;
  int threads = 2;
  std::string commit = "unknown";
  std::string command;
};

double now_s() {
  using clk = std::chrono::steady_clock;
  return std::chrono::duration<double>(clk::now().time_since_epoch()).count();
}

// Prefill heads per length: the cost grows as L^2, so fewer heads at longer L keeps the whole
// program within ~10 minutes on 2 cores (each head is an independent sample of the workload).
i64 prefill_heads(i64 L) { return L <= 4096 ? 4 : (L <= 16384 ? 2 : 1); }

struct Err {
  double rel_l2 = 0.0, max_abs = 0.0;
};
Err compare(const std::vector<float>& o, const std::vector<double>& ref) {
  double num = 0.0, den = 0.0, mx = 0.0;
  for (std::size_t i = 0; i < o.size(); ++i) {
    const double e = static_cast<double>(o[i]) - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
    mx = std::max(mx, std::abs(e));
  }
  return {den > 0 ? std::sqrt(num / den) : std::sqrt(num), mx};
}

// One target on one curve: the lambda from the exact curve and the skip run at that lambda.
struct Point {
  double target = 0.0;
  bool reachable = false;
  double lambda = kInf;
  double curve_sparsity = 0.0;  // the one-pass curve at lambda
  double achieved = 0.0;        // the skip run's SkipStats::sparsity()
  Err err;
};

struct OrderResult {
  VisitOrder order = VisitOrder::natural;
  i64 visited = 0;
  double max_sparsity = 0.0;  // with lambda < 1
  double at_lambda[3] = {0, 0, 0};  // curve at lambda 1e-3, 1e-2, 0.1
  Err dense_err;                     // the order's dense fp32 run vs the fp64 oracle (floor)
  std::vector<Point> points;
  double seconds = 0.0;
};

struct PrefillCase {
  WorkloadKind kind = WorkloadKind::llm;
  MaskKind mask = MaskKind::causal;
  i64 L = 0, H = 0;
  std::vector<OrderResult> orders;
  double seconds = 0.0;
};

const double kFixedLambdas[3] = {1e-3, 1e-2, 0.1};

// SPEC §5: the skip run's sparsity must equal the one-pass curve at the same lambda, exactly.
// Every (curve, run) pair checked and the mismatches, reported with the results.
int g_checked = 0, g_mismatch = 0;
void check_curve(double curve, double run) {
  ++g_checked;
  if (curve != run) ++g_mismatch;
}

// One skip run at lambda with the case's vote layout (the reference engine, through `run`): its
// achieved sparsity, checked against the one-pass curve's prediction, and its error vs the fp64
// reference.
template <class Run>
std::pair<double, Err> skip_run(double lambda, const VoteGranularity& vote, int threads, double curve,
                                std::vector<float>& out, const std::vector<double>& ref, Run run) {
  SkipConfig sk = SkipConfig::from_threshold(lambda);
  sk.vote = vote;
  sk.order_explicit = true;  // the case's order, never the SPEC §2a default's fallback
  RunOptions rs;
  rs.collect_stats = true;
  rs.num_threads = threads;
  SkipStats ss;
  std::fill(out.begin(), out.end(), std::nanf(""));
  run(sk, rs, ss);
  check_curve(curve, ss.sparsity());
  return {ss.sparsity(), compare(out, ref)};
}

PrefillCase run_prefill(WorkloadKind kind, i64 L, const Options& opt) {
  const double t0 = now_s();
  PrefillCase pc;
  pc.kind = kind;
  pc.mask = kind == WorkloadKind::dit ? MaskKind::full : MaskKind::causal;
  pc.L = L;
  pc.H = opt.heads > 0 ? opt.heads : prefill_heads(L);
  WorkloadSpec ws;
  ws.kind = kind;
  ws.seq_len = L;
  ws.heads_q = ws.heads_k = pc.H;
  ws.head_dim = kD;
  ws.seed = 0;
  Workload w = make_workload(ws);
  const i64 H = pc.H;

  AttentionProblem p;
  p.q = Tensor::contiguous(w.q.data(), DType::f32, {1, L, H, kD});
  p.k = Tensor::contiguous(w.k.data(), DType::f32, {1, L, H, kD});
  p.v = Tensor::contiguous(w.v.data(), DType::f32, {1, L, H, kD});
  p.mask = pc.mask;

  // Dense fp64 oracle (order-independent).
  std::vector<double> ref(static_cast<std::size_t>(L * H * kD));
  {
    AttentionProblem pr = p;
    pr.out = Tensor::contiguous(ref.data(), DType::f64, {1, L, H, kD});
    RunOptions ro;
    ro.fp64 = true;
    ro.num_threads = opt.threads;
    reference::attention(pr, SkipConfig::dense(), ro);
  }
  std::vector<float> out(static_cast<std::size_t>(L * H * kD));
  p.out = Tensor::contiguous(out.data(), DType::f32, {1, L, H, kD});

  for (VisitOrder order : {VisitOrder::natural, VisitOrder::max_first}) {
    const double t1 = now_s();
    OrderResult r;
    r.order = order;
    const VoteGranularity vote = calibration::default_prefill_granularity(order);  // 64 x 1 x 128
    RunOptions ro;
    ro.record_deltas = true;
    ro.num_threads = opt.threads;
    SkipStats st;
    std::fill(out.begin(), out.end(), std::nanf(""));
    reference::attention(p, calibration::probe_config(vote), ro, &st);
    if (st.total_skipped() != 0) throw Error("dense probe skipped tiles");
    r.dense_err = compare(out, ref);
    const calibration::SparsityCurve curve =
        calibration::SparsityCurve::from_deltas(std::move(st.deltas), vote);
    r.visited = static_cast<i64>(curve.visited());
    r.max_sparsity = curve.max_sparsity();
    for (int i = 0; i < 3; ++i) r.at_lambda[i] = curve.sparsity_at(kFixedLambdas[i]);
    for (double s : opt.targets) {
      Point pt;
      pt.target = s;
      pt.lambda = calibration::lambda_for_sparsity(curve, s);
      pt.reachable = std::isfinite(pt.lambda) && pt.lambda < 1.0;
      if (pt.reachable) {
        pt.curve_sparsity = curve.sparsity_at(pt.lambda);
        std::tie(pt.achieved, pt.err) =
            skip_run(pt.lambda, vote, opt.threads, pt.curve_sparsity, out, ref,
                     [&](const SkipConfig& sk, const RunOptions& rs, SkipStats& ss) { reference::attention(p, sk, rs, &ss); });
      }
      r.points.push_back(pt);
    }
    r.seconds = now_s() - t1;
    pc.orders.push_back(std::move(r));
  }
  pc.seconds = now_s() - t0;
  return pc;
}

// ---- decode --------------------------------------------------------------------------------

struct Layout {
  std::string name;
  VisitOrder order = VisitOrder::natural;
  i64 split = 0;
};

struct DecodeLayoutResult {
  Layout layout;
  i64 visited = 0;
  double max_sparsity = 0.0;
  std::vector<double> sparsity;  // at each lambda (exact curve), and the skip run's
  std::vector<double> achieved;
  std::vector<Err> err;
};

struct DecodeCase {
  i64 L = 0, Hq = 8, Hk = 2, steps = 16, split = 0;
  std::vector<double> targets, lambdas;  // lambda: where the natural unsplit pass reaches target
  std::vector<DecodeLayoutResult> layouts;
  double seconds = 0.0;
};

DecodeCase run_decode(i64 L, const Options& opt) {
  const double t0 = now_s();
  DecodeCase dc;
  dc.L = L;
  const i64 Hq = dc.Hq, Hk = dc.Hk, B = dc.steps, g = Hq / Hk;
  // The layout the kernel picks for one sequence of the full-size model it stands for (GQA 32/8,
  // B = 1; 132 SMs, 1 CTA per SM at d = 128, docs/decode_kernel.md); heads are scaled down here
  // for CPU time only.
  const i64 tiles = (L + 127) / 128;
  dc.split = detail::decode_split_tiles(1, 8, tiles, 132, 1);

  WorkloadSpec ws;
  ws.kind = WorkloadKind::llm;
  ws.seq_len = L;
  ws.heads_q = Hq;
  ws.heads_k = Hk;
  ws.head_dim = kD;
  ws.seed = 0;
  Workload w = make_workload(ws);

  // B decode steps from the end of the sequence; step b has the cache of its prefix
  // (Lk_b = L - B + 1 + b keys) and query row Lk_b - 1. The cache is the sequence's K/V seen as
  // 128-key pages shared by every step.
  const i64 page = 128, pages = L / page;
  if (L % page != 0) throw Error("decode length must be a multiple of 128");
  std::vector<std::int32_t> table(static_cast<std::size_t>(B * pages)), seqlens(B);
  for (i64 b = 0; b < B; ++b) {
    for (i64 i = 0; i < pages; ++i) table[b * pages + i] = static_cast<std::int32_t>(i);
    seqlens[b] = static_cast<std::int32_t>(L - B + 1 + b);
  }
  DecodeProblem p;
  p.q = Tensor::contiguous(w.q.data() + (L - B) * Hq * kD, DType::f32, {B, 1, Hq, kD});
  p.k_cache = Tensor::contiguous(w.k.data(), DType::f32, {pages, page, Hk, kD});
  p.v_cache = Tensor::contiguous(w.v.data(), DType::f32, {pages, page, Hk, kD});
  p.page_table = table.data();
  p.page_table_stride = pages;
  p.seqlens_k = seqlens.data();
  p.max_seqlen_k = L;
  p.mask = MaskKind::causal;

  std::vector<double> ref(static_cast<std::size_t>(B * Hq * kD));
  {
    DecodeProblem pr = p;
    pr.out = Tensor::contiguous(ref.data(), DType::f64, {B, 1, Hq, kD});
    RunOptions ro;
    ro.fp64 = true;
    ro.num_threads = opt.threads;
    reference::decode(pr, SkipConfig::dense(), ro);
  }
  std::vector<float> out(static_cast<std::size_t>(B * Hq * kD));
  p.out = Tensor::contiguous(out.data(), DType::f32, {B, 1, Hq, kD});

  const std::vector<Layout> layouts = {
      {"unsplit natural (a)", VisitOrder::natural, 0},
      {"unsplit max_first", VisitOrder::max_first, 0},
      {"split natural, unseeded (b)", VisitOrder::natural, dc.split},
      {"split max_first, seeded (c)", VisitOrder::max_first, dc.split},
  };
  std::vector<calibration::SparsityCurve> curves;
  for (const Layout& lay : layouts) {
    VoteGranularity vote = calibration::default_decode_granularity(g, lay.split, lay.order, 1);
    RunOptions ro;
    ro.record_deltas = true;
    ro.num_threads = opt.threads;
    SkipStats st;
    reference::decode(p, calibration::probe_config(vote), ro, &st);
    if (st.total_skipped() != 0) throw Error("dense decode probe skipped tiles");
    curves.push_back(calibration::SparsityCurve::from_deltas(std::move(st.deltas), vote));
  }
  dc.targets = opt.targets;
  for (double s : opt.targets) dc.lambdas.push_back(calibration::lambda_for_sparsity(curves[0], s));

  for (std::size_t li = 0; li < layouts.size(); ++li) {
    DecodeLayoutResult r;
    r.layout = layouts[li];
    r.visited = static_cast<i64>(curves[li].visited());
    r.max_sparsity = curves[li].max_sparsity();
    const VoteGranularity vote = curves[li].granularity();
    for (double lam : dc.lambdas) {
      if (!(lam < 1.0)) {
        r.sparsity.push_back(NAN);
        r.achieved.push_back(NAN);
        r.err.push_back({NAN, NAN});
        continue;
      }
      r.sparsity.push_back(curves[li].sparsity_at(lam));
      const auto [achieved, err] =
          skip_run(lam, vote, opt.threads, r.sparsity.back(), out, ref,
                   [&](const SkipConfig& sk, const RunOptions& rs, SkipStats& ss) { reference::decode(p, sk, rs, &ss); });
      r.achieved.push_back(achieved);
      r.err.push_back(err);
    }
    dc.layouts.push_back(std::move(r));
  }
  dc.seconds = now_s() - t0;
  return dc;
}

// ---- output --------------------------------------------------------------------------------

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string jnum(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt("%.6g", v);
}
std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) { o += ' '; continue; }
    o += c;
  }
  return o + "\"";
}
std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  return "unknown";
}
std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

const Point* find_point(const OrderResult& r, double s) {
  for (const Point& p : r.points)
    if (std::abs(p.target - s) < 1e-12) return &p;
  return nullptr;
}

struct Verdict {
  std::string name, detail;
  bool pass = false, measured = false;
};

std::vector<Verdict> verdicts(const std::vector<PrefillCase>& pcs, const std::vector<DecodeCase>& dcs) {
  std::vector<Verdict> v;
  // 1. dit, L >= 16k: max_first reaches 70 % with lambda < 0.1.
  {
    Verdict x{"dit, L >= 16k: max_first reaches 70 % sparsity with lambda < 0.1", "", true, false};
    for (const PrefillCase& c : pcs) {
      if (c.kind != WorkloadKind::dit || c.L < 16384) continue;
      const Point* p = find_point(c.orders[1], 0.7);
      if (!p) continue;
      x.measured = true;
      const bool ok = p->reachable && p->lambda < 0.1;
      x.pass = x.pass && ok;
      x.detail += "L=" + std::to_string(c.L) + ": lambda " +
                  (p->reachable ? fmt("%.3g", p->lambda) : std::string("unreachable")) + "; ";
    }
    v.push_back(x);
  }
  // 2. dit, L >= 16k: at 50 %, max_first error <= 0.6x natural.
  {
    Verdict x{"dit, L >= 16k: at 50 % sparsity max_first rel. L2 error <= 0.6x natural", "", true, false};
    for (const PrefillCase& c : pcs) {
      if (c.kind != WorkloadKind::dit || c.L < 16384) continue;
      const Point* n = find_point(c.orders[0], 0.5);
      const Point* m = find_point(c.orders[1], 0.5);
      if (!n || !m) continue;
      x.measured = true;
      if (!m->reachable) {
        x.pass = false;
        x.detail += "L=" + std::to_string(c.L) + ": max_first cannot reach 50 %; ";
        continue;
      }
      if (!n->reachable) {  // natural cannot get there at all: max_first wins outright
        x.detail += "L=" + std::to_string(c.L) + ": natural unreachable; ";
        continue;
      }
      const double ratio = m->err.rel_l2 / n->err.rel_l2;
      x.pass = x.pass && ratio <= 0.6;
      x.detail += "L=" + std::to_string(c.L) + ": ratio " + fmt("%.3f", ratio) + "; ";
    }
    v.push_back(x);
  }
  // 3. never worse than natural by more than 5 % anywhere (error at equal sparsity, and reach).
  {
    Verdict x{"prefill: max_first never worse than natural by > 5 % (error at equal sparsity; reach)", "", true, false};
    double worst = 0.0;
    std::string where;
    for (const PrefillCase& c : pcs)
      for (std::size_t i = 0; i < c.orders[0].points.size(); ++i) {
        const Point& n = c.orders[0].points[i];
        const Point& m = c.orders[1].points[i];
        if (n.reachable && !m.reachable) {
          x.pass = false;
          x.detail += std::string(to_string(c.kind)) + " L=" + std::to_string(c.L) + " s=" +
                      fmt("%.2f", n.target) + ": natural reaches, max_first not; ";
        }
        if (!n.reachable || !m.reachable) continue;
        x.measured = true;
        const double ratio = m.err.rel_l2 / n.err.rel_l2;
        if (ratio > worst) {
          worst = ratio;
          where = std::string(to_string(c.kind)) + " L=" + std::to_string(c.L) + " s=" + fmt("%.2f", n.target);
        }
        if (ratio > 1.05) x.pass = false;
      }
    x.detail += "worst ratio max_first/natural " + fmt("%.3f", worst) + " at " + where;
    v.push_back(x);
  }
  // 4. decode: seeded splits lose <= 0.02 sparsity vs the unsplit pass at the same lambda.
  {
    Verdict x{"decode: seeded splits lose <= 0.02 sparsity vs one unsplit pass at the same lambda", "", true, false};
    double worst = -kInf, worst_u = -kInf;
    for (const DecodeCase& c : dcs)
      for (std::size_t i = 0; i < c.lambdas.size(); ++i) {
        if (!(c.lambdas[i] < 1.0)) continue;
        x.measured = true;
        const double loss = c.layouts[0].sparsity[i] - c.layouts[3].sparsity[i];
        const double loss_u = c.layouts[0].sparsity[i] - c.layouts[2].sparsity[i];
        worst = std::max(worst, loss);
        worst_u = std::max(worst_u, loss_u);
        if (loss > 0.02) x.pass = false;
      }
    if (x.measured)
      x.detail = "largest loss: seeded " + fmt("%.4f", worst) + ", unseeded " + fmt("%.4f", worst_u);
    v.push_back(x);
  }
  return v;
}

std::string markdown(const std::vector<PrefillCase>& pcs, const std::vector<DecodeCase>& dcs,
                     const Options& opt, double total_s) {
  std::ostringstream o;
  o << "# Visit-order frontier (CPU reference)\n\n";
  o << "- date: " << utc_now() << "\n- commit: " << opt.commit << "\n- CPU: " << cpu_name()
    << ", " << opt.threads << " threads\n- command: `" << opt.command << "`\n";
  o << "- total time: " << fmt("%.0f", total_s) << " s\n";
  o << "- one-pass curve vs skip run (SPEC §5, must be equal): " << g_checked << " lambdas checked, "
    << g_mismatch << " mismatches\n\n";
  if (!pcs.empty()) {
    o << "## Prefill\n\n";
    o << "Vote group 64 rows x 1 head x 128 keys, unsplit, d = 128, seed 0, B = 1, Hq = Hk = H. "
         "For each order one dense pass records every delta (exact one-pass curve); lambda for "
         "each target is the exact quantile (calibration::lambda_for_sparsity); the skip run at "
         "that lambda gives the achieved sparsity (SkipStats) and the output error against a "
         "dense fp64 oracle (relative L2 over the whole output, max abs). `unreachable`: only "
         "lambda >= 1 would do. `dense` row: the order's fp32 dense run (rounding floor).\n\n";
    o << "| workload | L | H | order | target | lambda | factor = lambda*L | achieved | rel L2 err | max abs err | err ratio mf/nat |\n";
    o << "|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const PrefillCase& c : pcs) {
      for (std::size_t oi = 0; oi < c.orders.size(); ++oi) {
        const OrderResult& r = c.orders[oi];
        o << "| " << to_string(c.kind) << " (" << to_string(c.mask) << ") | " << c.L << " | " << c.H
          << " | " << to_string(r.order) << " | dense | - | - | 0 | " << fmt("%.2e", r.dense_err.rel_l2)
          << " | " << fmt("%.2e", r.dense_err.max_abs) << " | |\n";
        for (std::size_t i = 0; i < r.points.size(); ++i) {
          const Point& p = r.points[i];
          o << "| " << to_string(c.kind) << " (" << to_string(c.mask) << ") | " << c.L << " | "
            << c.H << " | " << to_string(r.order) << " | " << fmt("%.2f", p.target) << " | ";
          if (!p.reachable) {
            o << "unreachable (max " << fmt("%.3f", r.max_sparsity) << ") | - | - | - | - | |\n";
            continue;
          }
          o << fmt("%.3g", p.lambda) << " | " << fmt("%.3g", p.lambda * static_cast<double>(c.L))
            << " | " << fmt("%.4f", p.achieved) << " | " << fmt("%.3e", p.err.rel_l2) << " | "
            << fmt("%.3e", p.err.max_abs) << " | ";
          if (oi == 1) {
            const Point& n = c.orders[0].points[i];
            if (n.reachable) o << fmt("%.3f", p.err.rel_l2 / n.err.rel_l2);
            else o << "nat. unreachable";
          }
          o << " |\n";
        }
      }
    }
    o << "\nCurve summary (exact one-pass curves):\n\n";
    o << "| workload | L | H | order | visited pairs | s(1e-3) | s(1e-2) | s(0.1) | max s (lambda<1) | time s |\n";
    o << "|---|---|---|---|---|---|---|---|---|---|\n";
    for (const PrefillCase& c : pcs)
      for (const OrderResult& r : c.orders)
        o << "| " << to_string(c.kind) << " | " << c.L << " | " << c.H << " | " << to_string(r.order)
          << " | " << r.visited << " | " << fmt("%.3f", r.at_lambda[0]) << " | "
          << fmt("%.3f", r.at_lambda[1]) << " | " << fmt("%.3f", r.at_lambda[2]) << " | "
          << fmt("%.3f", r.max_sparsity) << " | " << fmt("%.0f", r.seconds) << " |\n";
  }
  if (!dcs.empty()) {
    o << "\n## Decode\n\n";
    o << "llm workload, GQA Hq = 8, Hk = 2 (g = 4; stands for 32/8), d = 128, q_len = 1, the last "
         "16 decode steps of the sequence (step b: cache of L - 15 + b keys), vote group = the "
         "4 query heads of a KV group x 1 row x 128 keys. Split layout: what the GPU decode "
         "kernel's heuristic picks for B = 1, Hk = 8 on 132 SMs (docs/decode_kernel.md). lambda: "
         "where the unsplit natural pass (a) reaches the target (exact curve); every layout at "
         "that same lambda. Sparsity from the exact one-pass curve (the skip run's SkipStats "
         "agreed: see JSON `achieved`); loss = (a) - layout.\n\n";
    o << "| kv len | tiles/split | target (a) | lambda | (a) unsplit natural | unsplit max_first | (b) unseeded split | (c) seeded split | loss (b) | loss (c) | rel L2 err (a) / (b) / (c) |\n";
    o << "|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const DecodeCase& c : dcs)
      for (std::size_t i = 0; i < c.lambdas.size(); ++i) {
        o << "| " << c.L << " | " << c.split << " | " << fmt("%.2f", c.targets[i]) << " | ";
        if (!(c.lambdas[i] < 1.0)) {
          o << "unreachable (max " << fmt("%.3f", c.layouts[0].max_sparsity) << ") | | | | | | | |\n";
          continue;
        }
        o << fmt("%.3g", c.lambdas[i]) << " | ";
        for (int k = 0; k < 4; ++k) o << fmt("%.4f", c.layouts[k].sparsity[i]) << " | ";
        o << fmt("%+.4f", c.layouts[0].sparsity[i] - c.layouts[2].sparsity[i]) << " | "
          << fmt("%+.4f", c.layouts[0].sparsity[i] - c.layouts[3].sparsity[i]) << " | "
          << fmt("%.2e", c.layouts[0].err[i].rel_l2) << " / " << fmt("%.2e", c.layouts[2].err[i].rel_l2)
          << " / " << fmt("%.2e", c.layouts[3].err[i].rel_l2) << " |\n";
      }
    o << "\nMax sparsity with lambda < 1 per layout:\n\n| kv len | (a) | unsplit max_first | (b) | (c) | time s |\n|---|---|---|---|---|---|\n";
    for (const DecodeCase& c : dcs)
      o << "| " << c.L << " | " << fmt("%.4f", c.layouts[0].max_sparsity) << " | "
        << fmt("%.4f", c.layouts[1].max_sparsity) << " | " << fmt("%.4f", c.layouts[2].max_sparsity)
        << " | " << fmt("%.4f", c.layouts[3].max_sparsity) << " | " << fmt("%.0f", c.seconds) << " |\n";
  }
  o << "\n## Targets (issue 7)\n\n";
  for (const Verdict& v : verdicts(pcs, dcs))
    o << "- " << v.name << ": **" << (!v.measured ? "not measured" : (v.pass ? "met" : "NOT met"))
      << "** (" << v.detail << ")\n";
  return o.str();
}

std::string json(const std::vector<PrefillCase>& pcs, const std::vector<DecodeCase>& dcs,
                 const Options& opt, double total_s) {
  std::ostringstream o;
  auto err = [&](const Err& e) { return "{\"rel_l2\": " + jnum(e.rel_l2) + ", \"max_abs\": " + jnum(e.max_abs) + "}"; };
  o << "{\n  \"date\": " << jstr(utc_now()) << ",\n  \"commit\": " << jstr(opt.commit)
    << ",\n  \"cpu\": " << jstr(cpu_name()) << ",\n  \"threads\": " << opt.threads
    << ",\n  \"command\": " << jstr(opt.command) << ",\n  \"total_seconds\": " << jnum(total_s)
    << ",\n  \"curve_checks\": " << g_checked << ",\n  \"curve_mismatches\": " << g_mismatch
    << ",\n  \"vote_prefill\": " << jstr(calibration::describe(calibration::default_prefill_granularity()))
    << ",\n  \"reference\": \"dense fp64 oracle (RunOptions::fp64)\",\n  \"prefill\": [";
  for (std::size_t ci = 0; ci < pcs.size(); ++ci) {
    const PrefillCase& c = pcs[ci];
    o << (ci ? "," : "") << "\n    {\"workload\": " << jstr(to_string(c.kind)) << ", \"mask\": "
      << jstr(to_string(c.mask)) << ", \"L\": " << c.L << ", \"heads\": " << c.H
      << ", \"head_dim\": " << kD << ", \"seed\": 0, \"seconds\": " << jnum(c.seconds) << ", \"orders\": [";
    for (std::size_t oi = 0; oi < c.orders.size(); ++oi) {
      const OrderResult& r = c.orders[oi];
      o << (oi ? "," : "") << "\n      {\"order\": " << jstr(to_string(r.order)) << ", \"visited\": "
        << r.visited << ", \"max_sparsity\": " << jnum(r.max_sparsity)
        << ", \"sparsity_at_lambda\": {\"0.001\": " << jnum(r.at_lambda[0]) << ", \"0.01\": "
        << jnum(r.at_lambda[1]) << ", \"0.1\": " << jnum(r.at_lambda[2]) << "}, \"dense_error\": "
        << err(r.dense_err) << ", \"seconds\": " << jnum(r.seconds) << ", \"points\": [";
      for (std::size_t i = 0; i < r.points.size(); ++i) {
        const Point& p = r.points[i];
        o << (i ? "," : "") << "\n        {\"target\": " << jnum(p.target) << ", \"reachable\": "
          << (p.reachable ? "true" : "false") << ", \"lambda\": " << jnum(p.reachable ? p.lambda : kInf)
          << ", \"factor\": " << jnum(p.reachable ? p.lambda * c.L : kInf) << ", \"curve_sparsity\": "
          << jnum(p.reachable ? p.curve_sparsity : NAN) << ", \"achieved\": "
          << jnum(p.reachable ? p.achieved : NAN) << ", \"error\": " << (p.reachable ? err(p.err) : "null") << "}";
      }
      o << "]}";
    }
    o << "]}";
  }
  o << "\n  ],\n  \"decode\": [";
  for (std::size_t ci = 0; ci < dcs.size(); ++ci) {
    const DecodeCase& c = dcs[ci];
    o << (ci ? "," : "") << "\n    {\"workload\": \"llm\", \"kv_len\": " << c.L << ", \"heads_q\": " << c.Hq
      << ", \"heads_k\": " << c.Hk << ", \"steps\": " << c.steps << ", \"q_len\": 1, \"split_tiles\": "
      << c.split << ", \"seconds\": " << jnum(c.seconds) << ", \"targets\": [";
    for (std::size_t i = 0; i < c.targets.size(); ++i) o << (i ? ", " : "") << jnum(c.targets[i]);
    o << "], \"lambdas\": [";
    for (std::size_t i = 0; i < c.lambdas.size(); ++i) o << (i ? ", " : "") << jnum(c.lambdas[i] < 1 ? c.lambdas[i] : kInf);
    o << "], \"layouts\": [";
    for (std::size_t li = 0; li < c.layouts.size(); ++li) {
      const DecodeLayoutResult& r = c.layouts[li];
      o << (li ? "," : "") << "\n      {\"name\": " << jstr(r.layout.name) << ", \"order\": "
        << jstr(to_string(r.layout.order)) << ", \"split_tiles\": " << r.layout.split
        << ", \"visited\": " << r.visited << ", \"max_sparsity\": " << jnum(r.max_sparsity)
        << ", \"sparsity\": [";
      for (std::size_t i = 0; i < r.sparsity.size(); ++i) o << (i ? ", " : "") << jnum(r.sparsity[i]);
      o << "], \"achieved\": [";
      for (std::size_t i = 0; i < r.achieved.size(); ++i) o << (i ? ", " : "") << jnum(r.achieved[i]);
      o << "], \"error\": [";
      for (std::size_t i = 0; i < r.err.size(); ++i) o << (i ? ", " : "") << (std::isfinite(r.err[i].rel_l2) ? err(r.err[i]) : "null");
      o << "]}";
    }
    o << "]}";
  }
  o << "\n  ],\n  \"verdicts\": [";
  const auto vs = verdicts(pcs, dcs);
  for (std::size_t i = 0; i < vs.size(); ++i)
    o << (i ? "," : "") << "\n    {\"target\": " << jstr(vs[i].name) << ", \"measured\": "
      << (vs[i].measured ? "true" : "false") << ", \"met\": " << (vs[i].pass ? "true" : "false")
      << ", \"detail\": " << jstr(vs[i].detail) << "}";
  o << "\n  ]\n}\n";
  return o.str();
}

std::string csv(const std::vector<PrefillCase>& pcs) {
  std::ostringstream o;
  o << "workload,L,heads,order,target,reachable,lambda,achieved,rel_l2,max_abs\n";
  for (const PrefillCase& c : pcs)
    for (const OrderResult& r : c.orders)
      for (const Point& p : r.points)
        o << to_string(c.kind) << "," << c.L << "," << c.H << "," << to_string(r.order) << ","
          << p.target << "," << (p.reachable ? 1 : 0) << "," << (p.reachable ? jnum(p.lambda) : "inf")
          << "," << (p.reachable ? jnum(p.achieved) : "") << "," << (p.reachable ? jnum(p.err.rel_l2) : "")
          << "," << (p.reachable ? jnum(p.err.max_abs) : "") << "\n";
  return o.str();
}

// One PNG per workload: log10(rel L2 error) vs achieved sparsity; colour = L, dashed = natural,
// solid = max_first.
std::vector<std::string> plots(const std::vector<PrefillCase>& pcs, const std::string& base) {
  std::vector<std::string> files;
  if (!calibration::plot::png_available()) return files;
  for (WorkloadKind kind : {WorkloadKind::llm, WorkloadKind::dit}) {
    calibration::plot::Figure f;
    f.title = std::string(to_string(kind)) + ": error vs sparsity (dashed natural, solid max_first)";
    f.xlabel = "achieved sparsity";
    f.ylabel = "log10 rel L2 error";
    f.xmin = 0.4;
    f.xmax = 1.0;
    std::size_t ci = 0;
    for (const PrefillCase& c : pcs) {
      if (c.kind != kind) continue;
      for (const OrderResult& r : c.orders) {
        calibration::plot::Series s;
        s.color = calibration::plot::palette(ci);
        s.dashed = r.order == VisitOrder::natural;
        s.label = "L=" + std::to_string(c.L) + (r.order == VisitOrder::natural ? " NAT" : " MF");
        for (const Point& p : r.points)
          if (p.reachable && p.err.rel_l2 > 0) {
            s.x.push_back(p.achieved);
            s.y.push_back(std::log10(p.err.rel_l2));
          }
        if (!s.x.empty()) f.series.push_back(s);
      }
      ++ci;
    }
    if (f.series.empty()) continue;
    const std::string path = base + "_" + to_string(kind) + ".png";
    calibration::plot::write_png(path, calibration::plot::render(f, 900, 600));
    files.push_back(path);
  }
  return files;
}

std::vector<double> parse_list(const std::string& s) {
  std::vector<double> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t pos = 0;
    const double x = std::stod(item, &pos);
    if (pos != item.size() || !std::isfinite(x)) throw Error("bad list element '" + item + "'");
    v.push_back(x);
  }
  if (v.empty()) throw Error("empty list");
  return v;
}
std::vector<i64> to_lengths(const std::vector<double>& v, const char* what) {
  std::vector<i64> r;
  for (double x : v) {
    if (!(x >= 128 && x == std::floor(x)))
      throw Error(std::string(what) + ": lengths must be integers >= 128");
    r.push_back(static_cast<i64>(x));
  }
  return r;
}

int run(int argc, char** argv) {
  Options opt;
  for (int i = 0; i < argc; ++i) opt.command += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(a + ": missing value");
      return argv[++i];
    };
    if (a == "--out") opt.out = next();
    else if (a == "--prefix") opt.prefix = next();
    else if (a == "--lengths") opt.lengths = to_lengths(parse_list(next()), "--lengths");
    else if (a == "--decode-lengths") opt.decode_lengths = to_lengths(parse_list(next()), "--decode-lengths");
    else if (a == "--targets") {
      opt.targets = parse_list(next());
      for (double t : opt.targets)
        if (!(t > 0 && t < 1)) throw Error("--targets: each must be in (0, 1)");
    } else if (a == "--workloads") {
      opt.workloads.clear();
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) {
        const WorkloadKind k = parse_workload(item);
        if (k == WorkloadKind::random) throw Error("--workloads: llm and/or dit");
        opt.workloads.push_back(k);
      }
    } else if (a == "--heads") {
      opt.heads = std::stoll(next());
      if (opt.heads < 1) throw Error("--heads must be >= 1");
    } else if (a == "--no-prefill") opt.prefill = false;
    else if (a == "--no-decode") opt.decode = false;
    else if (a == "--no-png") opt.png = false;
    else if (a == "--threads") opt.threads = std::stoi(next());
    else if (a == "--commit") opt.commit = next();
    else throw Error("unknown argument '" + a + "' (see the comment at the top of order_frontier.cpp)");
  }
  if (opt.threads < 1) throw Error("--threads must be >= 1");
  if (opt.prefix.empty()) opt.prefix = "order_frontier";
  std::filesystem::create_directories(opt.out);
  const std::string base = opt.out + "/" + opt.prefix;

  const double t0 = now_s();
  std::vector<PrefillCase> pcs;
  std::vector<DecodeCase> dcs;
  if (opt.prefill)
    for (WorkloadKind kind : opt.workloads)
      for (i64 L : opt.lengths) {
        pcs.push_back(run_prefill(kind, L, opt));
        const PrefillCase& c = pcs.back();
        std::cerr << "prefill " << to_string(kind) << " L=" << L << " H=" << c.H << ": "
                  << fmt("%.1f", c.seconds) << " s\n";
      }
  if (opt.decode)
    for (i64 L : opt.decode_lengths) {
      dcs.push_back(run_decode(L, opt));
      std::cerr << "decode L=" << L << " split " << dcs.back().split << ": "
                << fmt("%.1f", dcs.back().seconds) << " s\n";
    }
  const double total = now_s() - t0;

  std::string md = markdown(pcs, dcs, opt, total);
  if (opt.png) {
    const auto files = plots(pcs, base);
    if (!files.empty()) {
      md += "\n## Plots\n\n";
      for (const auto& f : files) {
        const std::string name = std::filesystem::path(f).filename().string();
        md += "![" + name + "](" + name + ")\n";
      }
    }
  }
  std::ofstream(base + ".md") << md;
  std::ofstream(base + ".json") << json(pcs, dcs, opt, total);
  std::ofstream(base + ".csv") << csv(pcs);
  std::cout << md;
  return 0;
}

}  // namespace
}  // namespace blasst::bench_order

int main(int argc, char** argv) {
  try {
    return blasst::bench_order::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "blasst_order_frontier: " << e.what() << "\n";
    return 2;
  }
}
