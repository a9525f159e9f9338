// End-to-end tests of the `blasst` binary: inputs are written as .npy by the test, the binary is
// run as a separate process, and its outputs are compared with an independent fp64 attention
// computed here and with blasst::reference::attention/decode called in-process.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <map>
#include <set>
#include <tuple>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "blasst/blasst.hpp"
#include "blasst/half.hpp"
#include "blasst/npy.hpp"
#include "blasst/workloads.hpp"
#include "reference/spec_oracle.hpp"

#ifndef BLASST_CLI_PATH
#error "BLASST_CLI_PATH must name the built blasst binary"
#endif

namespace fs = std::filesystem;
namespace npy = blasst::npy;
using json = nlohmann::json;

namespace {

struct Result {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''"; else out += c;
  }
  return out + "'";
}

// Naive fp64 attention on [B, L, H, d] float arrays (independent of the library).
struct Naive {
  std::vector<double> o, lse;
};
Naive naive_attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                      std::int64_t B, std::int64_t Lq, std::int64_t Lk, std::int64_t Hq, std::int64_t Hk,
                      std::int64_t d, bool causal, double scale) {
  Naive r;
  r.o.assign(static_cast<std::size_t>(B * Lq * Hq * d), 0.0);
  r.lse.assign(static_cast<std::size_t>(B * Hq * Lq), 0.0);
  const std::int64_t g = Hq / Hk;
  std::vector<double> s(static_cast<std::size_t>(Lk));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < Lq; ++i) {
        const std::int64_t kh = h / g;
        const std::int64_t lim = causal ? std::min(i + Lk - Lq, Lk - 1) : Lk - 1;
        double mx = -INFINITY;
        for (std::int64_t j = 0; j <= lim; ++j) {
          double acc = 0;
          for (std::int64_t c = 0; c < d; ++c)
            acc += double(q[((b * Lq + i) * Hq + h) * d + c]) * k[((b * Lk + j) * Hk + kh) * d + c];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double l = 0;
        for (std::int64_t j = 0; j <= lim; ++j) l += std::exp(s[j] - mx);
        for (std::int64_t j = 0; j <= lim; ++j) {
          const double p = std::exp(s[j] - mx) / l;
          for (std::int64_t c = 0; c < d; ++c)
            r.o[((b * Lq + i) * Hq + h) * d + c] += p * v[((b * Lk + j) * Hk + kh) * d + c];
        }
        r.lse[(b * Hq + h) * Lq + i] = lim >= 0 ? mx + std::log(l) : -INFINITY;
      }
  return r;
}

std::vector<float> randn(std::size_t n, std::uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

std::vector<float> as_floats(const npy::Array& a, blasst::DType t) { return npy::to_f32(a, t); }

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("blasst_cli_" + std::to_string(std::random_device{}()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string p(const std::string& n) const { return (dir_ / n).string(); }

  Result blasst(const std::string& args) {
    const std::string cmd = quote(BLASST_CLI_PATH) + " " + args + " > " + quote(p("stdout.txt")) + " 2> " +
                            quote(p("stderr.txt")) + " < /dev/null";
    const int st = std::system(cmd.c_str());
    Result r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(p("stdout.txt"));
    r.err = slurp(p("stderr.txt"));
    return r;
  }
  // The same in a child with an optional file-size limit; also reports the child's peak RSS
  // (kB) and wall time.
  Result blasst_limited(const std::string& args, long* max_rss_kb = nullptr, rlim_t fsize = RLIM_INFINITY,
                        double* seconds = nullptr) {
    const std::string cmd = quote(BLASST_CLI_PATH) + " " + args + " > " + quote(p("stdout.txt")) + " 2> " +
                            quote(p("stderr.txt")) + " < /dev/null";
    const auto t0 = std::chrono::steady_clock::now();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);  // its own process group: a hang is killed whole below
      if (fsize != RLIM_INFINITY) {
        const rlimit lim{fsize, fsize};
        ::setrlimit(RLIMIT_FSIZE, &lim);
      }
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int st = 0;
    rusage ru{};
    Result r;
    if (pid < 0) return r;
    // A hang (a FIFO input used to block forever) ends as a failure after 60 s, not a stuck test.
    for (;;) {
      const pid_t w = ::wait4(pid, &st, WNOHANG, &ru);
      if (w == pid) break;
      if (w < 0) return r;
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) {
        ::kill(-pid, SIGKILL);
        ::wait4(pid, &st, 0, &ru);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (max_rss_kb) *max_rss_kb = ru.ru_maxrss;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(p("stdout.txt"));
    r.err = slurp(p("stderr.txt"));
    return r;
  }
  // Expect exit status 2 and "blasst: error: " with every needle on stderr.
  void expect_usage_error(const std::string& args, std::initializer_list<std::string> needles) {
    const Result r = blasst(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("blasst: error: "), std::string::npos) << r.err;
    for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "'" << n << "' not in: " << r.err;
  }
  void write_f32(const std::string& name, const std::vector<float>& x, const std::vector<std::int64_t>& shape) {
    npy::write(p(name), npy::from_f32(x.data(), shape));
  }

  fs::path dir_;
};

TEST_F(Cli, VersionAndHelp) {
  Result r = blasst("--version");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out.rfind("blasst ", 0), 0u) << r.out;
  r = blasst("run --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("--threshold"), std::string::npos);
  expect_usage_error("", {"subcommand"});
  expect_usage_error("frobnicate", {"frobnicate"});
}

// Dense run (no threshold): the output and LSE must match an independent fp64 attention.
TEST_F(Cli, DenseRunMatchesNaiveFp64) {
  const std::int64_t L = 200, Lk = 260, Hq = 4, Hk = 2, d = 16;
  const auto q = randn(L * Hq * d, 1), k = randn(Lk * Hk * d, 2), v = randn(Lk * Hk * d, 3);
  write_f32("q.npy", q, {L, Hq, d});
  write_f32("k.npy", k, {Lk, Hk, d});
  write_f32("v.npy", v, {Lk, Hk, d});
  for (bool causal : {false, true}) {
    const Result r = blasst("run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") +
                            (causal ? " --causal" : "") + " --scale 0.3 --out " + p("o.npy") + " --lse " +
                            p("lse.npy") + " --stats " + p("s.json"));
    ASSERT_EQ(r.rc, 0) << r.err;
    const npy::Array o = npy::read(p("o.npy")), lse = npy::read(p("lse.npy"));
    EXPECT_EQ(o.elem, npy::Elem::f32);
    EXPECT_EQ(o.shape, (std::vector<std::int64_t>{L, Hq, d}));  // rank 3 in, rank 3 out
    EXPECT_EQ(lse.shape, (std::vector<std::int64_t>{Hq, L}));
    const Naive n = naive_attention(q, k, v, 1, L, Lk, Hq, Hk, d, causal, 0.3);
    double max_err = 0;
    for (std::size_t i = 0; i < n.o.size(); ++i) max_err = std::max(max_err, std::abs(o.f32()[i] - n.o[i]));
    EXPECT_LT(max_err, 2e-5) << (causal ? "causal" : "full");
    for (std::size_t i = 0; i < n.lse.size(); ++i) ASSERT_NEAR(lse.f32()[i], n.lse[i], 2e-5) << i;
    const json s = json::parse(slurp(p("s.json")));
    EXPECT_EQ(s["skip_enabled"], false);
    EXPECT_EQ(s["total_skipped"], 0);
    EXPECT_GT(s["total_visited"].get<long>(), 0);
    EXPECT_EQ(s["mask"], causal ? "causal" : "full");
  }
}

// SPEC §3: a threshold lambda >= 1 runs dense (counted as such), as the library and Python do:
// on data where lambda = 0.05 skips, --threshold 1.5 gives the dense run's bytes and skips none.
// The dense run visits in natural order, so the byte comparison asks for natural order; in the
// default max-first order (SPEC §2a) the tiles are summed in another order (rounding differs) and
// still none is skipped.
TEST_F(Cli, ThresholdAtLeastOneRunsDense) {
  const std::int64_t L = 384, H = 2, d = 32;
  auto q = randn(L * H * d, 61), k = randn(L * H * d, 62), v = randn(L * H * d, 63);
  for (std::int64_t h = 0; h < H; ++h) {  // an attention sink: logit ~ 6 * 16 / sqrt(32) = 17
    for (std::int64_t i = 0; i < L; ++i) q[(i * H + h) * d] += 6.0f;
    k[h * d] = 16.0f;
  }
  write_f32("q.npy", q, {L, H, d});
  write_f32("k.npy", k, {L, H, d});
  write_f32("v.npy", v, {L, H, d});
  const std::string qkv = "run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy");
  auto run = [&](const std::string& extra, const std::string& out) {
    const Result r = blasst(qkv + " --out " + p(out) + " --stats " + p("s.json") + extra);
    EXPECT_EQ(r.rc, 0) << extra << ": " << r.err;
    return json::parse(slurp(p("s.json")));
  };
  const json sparse = run(" --threshold 0.05", "o_sparse.npy");
  ASSERT_GT(sparse["total_skipped"].get<long>(), 0) << "the sink must make lambda = 0.05 skip";
  run("", "o_dense.npy");
  for (const char* lam : {"1", "1.5", "1e300"}) {
    const json s = run(std::string(" --threshold ") + lam + " --order natural", "o_ge1.npy");
    EXPECT_EQ(s["total_skipped"], 0) << lam;
    const json m = run(std::string(" --threshold ") + lam, "o_ge1_mf.npy");
    EXPECT_EQ(m["total_skipped"], 0) << lam;
    EXPECT_EQ(m["granularity"]["order"], "max_first") << lam;
    EXPECT_GT(s["total_visited"].get<long>(), 0) << lam;
    EXPECT_EQ(slurp(p("o_ge1.npy")), slurp(p("o_dense.npy"))) << "--threshold " << lam << " must equal the dense run";
  }
  EXPECT_NE(slurp(p("o_sparse.npy")), slurp(p("o_dense.npy")));
}

// SPEC §2a default (revised): --threshold / --factor visit max-first unless --order says
// otherwise; a full mask with Lq != Lk falls back to natural (the prefill kernel cannot run
// max-first there), where an explicit --order max_first still runs max-first on the reference;
// a --config keeps its own order (natural when it names none). The stats report the order used.
TEST_F(Cli, RunOrderDefaults) {
  const std::int64_t L = 384, Lx = 200, H = 2, d = 16;
  write_f32("q.npy", randn(L * H * d, 51), {L, H, d});
  write_f32("qx.npy", randn(Lx * H * d, 54), {Lx, H, d});
  write_f32("k.npy", randn(L * H * d, 52), {L, H, d});
  write_f32("v.npy", randn(L * H * d, 53), {L, H, d});
  auto order_of = [&](const std::string& q, const std::string& extra) {
    const Result r = blasst("run --q " + p(q) + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " + p("o.npy") +
                            " --stats " + p("s.json") + extra);
    EXPECT_EQ(r.rc, 0) << extra << ": " << r.err;
    return json::parse(slurp(p("s.json")))["granularity"]["order"].get<std::string>();
  };
  EXPECT_EQ(order_of("q.npy", " --threshold 0.05"), "max_first");
  EXPECT_EQ(order_of("q.npy", " --factor 20"), "max_first");
  EXPECT_EQ(order_of("q.npy", " --threshold 0.05 --causal"), "max_first");
  EXPECT_EQ(order_of("qx.npy", " --threshold 0.05 --causal"), "max_first");  // causal: any lengths
  EXPECT_EQ(order_of("q.npy", " --threshold 0.05 --order natural"), "natural");
  EXPECT_EQ(order_of("qx.npy", " --threshold 0.05"), "natural");  // the fallback: full, Lq != Lk
  EXPECT_EQ(order_of("qx.npy", " --factor 20"), "natural");
  EXPECT_EQ(order_of("qx.npy", " --threshold 0.05 --order max_first"), "max_first");  // explicit: kept
  std::ofstream(p("plain.json")) << R"J({"sparse_attention_config": {"config_groups": {"g": {
      "threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)", "prefill": {"a": 2.0, "b": 3.0}},
      "target_sparsity": 0.5}}}})J";
  std::ofstream(p("mf.json")) << R"J({"sparse_attention_config": {"config_groups": {"g": {
      "threshold_scale_factor": 20.0, "blasst": {"visit_order": "max_first"}}}}})J";
  EXPECT_EQ(order_of("q.npy", " --config " + p("plain.json")), "natural");  // names no order: natural
  EXPECT_EQ(order_of("q.npy", " --config " + p("mf.json")), "max_first");
  EXPECT_EQ(order_of("qx.npy", " --config " + p("mf.json")), "max_first");  // a config's order is explicit
}

// Skip run: bit-for-bit the in-process reference with the same settings; statistics agree.
TEST_F(Cli, SkipRunMatchesInProcessReference) {
  const std::int64_t B = 2, L = 384, H = 2, d = 32;
  auto q = randn(B * L * H * d, 11), k = randn(B * L * H * d, 12), v = randn(B * L * H * d, 13);
  // An attention sink: every query leans along coordinate 0 and key 0 is large there, so the sink
  // logit (~8.5) towers over the noise and most other tiles fall below ln(lambda).
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t i = 0; i < L; ++i) q[((b * L + i) * H + h) * d] += 6.0f;
      k[((b * L + 0) * H + h) * d] = 8.0f;
    }
  write_f32("q.npy", q, {B, L, H, d});
  write_f32("k.npy", k, {B, L, H, d});
  write_f32("v.npy", v, {B, L, H, d});
  const Result r = blasst("run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") +
                          " --causal --factor 20 --tile-keys 32 --vote-rows 16 --order max_first --out " +
                          p("o.npy") + " --lse " + p("lse.npy") + " --stats " + p("s.json"));
  ASSERT_EQ(r.rc, 0) << r.err;

  std::vector<float> o_ref(q.size(), NAN), lse_ref(B * H * L, NAN);
  blasst::AttentionProblem pr;
  pr.q = blasst::Tensor::contiguous(q.data(), blasst::DType::f32, {B, L, H, d});
  pr.k = blasst::Tensor::contiguous(k.data(), blasst::DType::f32, {B, L, H, d});
  pr.v = blasst::Tensor::contiguous(v.data(), blasst::DType::f32, {B, L, H, d});
  pr.out = blasst::Tensor::contiguous(o_ref.data(), blasst::DType::f32, {B, L, H, d});
  pr.lse = blasst::Tensor::contiguous(lse_ref.data(), blasst::DType::f32, {B, H, L});
  pr.mask = blasst::MaskKind::causal;
  blasst::SkipConfig skip = blasst::SkipConfig::from_factor(20).with_order(blasst::VisitOrder::natural);
  skip.vote.tile_keys = 32;
  skip.vote.rows = 16;
  skip.vote.order = blasst::VisitOrder::max_first;
  blasst::RunOptions opt;
  opt.collect_stats = true;
  blasst::SkipStats st;
  blasst::reference::attention(pr, skip, opt, &st);
  ASSERT_GT(st.total_skipped(), 0) << "test data must make the reference skip something";

  const npy::Array o = npy::read(p("o.npy")), lse = npy::read(p("lse.npy"));
  ASSERT_EQ(o.shape, (std::vector<std::int64_t>{B, L, H, d}));
  for (std::size_t i = 0; i < o_ref.size(); ++i) ASSERT_EQ(o.f32()[i], o_ref[i]) << i;
  for (std::size_t i = 0; i < lse_ref.size(); ++i) ASSERT_EQ(lse.f32()[i], lse_ref[i]) << i;

  const json s = json::parse(slurp(p("s.json")));
  EXPECT_EQ(s["visited"].get<std::vector<std::int64_t>>(), st.visited);
  EXPECT_EQ(s["skipped"].get<std::vector<std::int64_t>>(), st.skipped);
  EXPECT_DOUBLE_EQ(s["sparsity"].get<double>(), st.sparsity());
  ASSERT_EQ(s["lambda"].size(), 2u);
  EXPECT_DOUBLE_EQ(s["lambda"][0].get<double>(), 20.0 / L);
  EXPECT_EQ(s["granularity"]["tile_keys"], 32);
  EXPECT_EQ(s["granularity"]["rows"], 16);
  EXPECT_EQ(s["granularity"]["heads"], 1);
  EXPECT_EQ(s["granularity"]["split_tiles"], 0);
  EXPECT_EQ(s["granularity"]["order"], "max_first");
  EXPECT_FALSE(s["counted_at"].get<std::string>().empty());
  EXPECT_EQ(s["threshold_source"], "factor");

  // The skipped output is still close to the dense one (each skipped tile holds < lambda * T).
  const Naive n = naive_attention(q, k, v, B, L, L, H, H, d, true, 1.0 / std::sqrt(double(d)));
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n.o.size(); ++i) {
    num += (o.f32()[i] - n.o[i]) * (o.f32()[i] - n.o[i]);
    den += n.o[i] * n.o[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.1);
}

// SPEC §2b FP8 screen through `blasst run`: --screen strict (in the loop and ahead) gives the
// in-process reference's outputs and statistics with the same settings; the strict screen skips
// exactly what the plain path skips (no wrong screen: SPEC's theorem), and screens something on
// this input (an attention sink), which the test asserts.
TEST_F(Cli, ScreenRunMatchesInProcessReference) {
  const std::int64_t L = 512, H = 2, d = 32;
  auto q = randn(L * H * d, 21), k = randn(L * H * d, 22), v = randn(L * H * d, 23);
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t i = 0; i < L; ++i) q[(i * H + h) * d] += 6.0f;
    k[(0 * H + h) * d] = 8.0f;
  }
  write_f32("q.npy", q, {1, L, H, d});
  write_f32("k.npy", k, {1, L, H, d});
  write_f32("v.npy", v, {1, L, H, d});
  const std::string base = "run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") +
                           " --threshold 0.05 --tile-keys 32 --vote-rows 16 --order natural";
  blasst::AttentionProblem pr;
  pr.q = blasst::Tensor::contiguous(q.data(), blasst::DType::f32, {1, L, H, d});
  pr.k = blasst::Tensor::contiguous(k.data(), blasst::DType::f32, {1, L, H, d});
  pr.v = blasst::Tensor::contiguous(v.data(), blasst::DType::f32, {1, L, H, d});
  pr.mask = blasst::MaskKind::full;
  blasst::SkipConfig plain = blasst::SkipConfig::from_threshold(0.05).with_order(blasst::VisitOrder::natural);
  plain.vote.tile_keys = 32;
  plain.vote.rows = 16;
  blasst::RunOptions opt;
  opt.collect_stats = true;
  std::vector<float> o_plain(q.size(), NAN);
  pr.out = blasst::Tensor::contiguous(o_plain.data(), blasst::DType::f32, {1, L, H, d});
  blasst::SkipStats sp;
  blasst::reference::attention(pr, plain, opt, &sp);
  ASSERT_GT(sp.total_skipped(), 0) << "test data must make the reference skip something";
  for (const bool ahead : {false, true}) {
    SCOPED_TRACE(ahead ? "screen ahead" : "screen in the loop");
    const Result r = blasst(base + " --screen strict" + (ahead ? " --screen-ahead" : "") + " --out " + p("o.npy") +
                            " --stats " + p("s.json"));
    ASSERT_EQ(r.rc, 0) << r.err;
    blasst::SkipConfig sc = plain;
    sc.screen.margin = blasst::ScreenMargin::strict;
    sc.screen.ahead = ahead;
    std::vector<float> o_ref(q.size(), NAN);
    pr.out = blasst::Tensor::contiguous(o_ref.data(), blasst::DType::f32, {1, L, H, d});
    blasst::SkipStats st;
    blasst::reference::attention(pr, sc, opt, &st);
    ASSERT_GT(st.total_screened(), 0) << "nothing screened: the case this test exists for did not happen";
    EXPECT_EQ(st.total_screen_wrong(), 0);
    EXPECT_EQ(st.skipped, sp.skipped) << "strict: the screen skips what the plain path skips";
    const npy::Array o = npy::read(p("o.npy"));
    for (std::size_t i = 0; i < o_ref.size(); ++i) {
      ASSERT_EQ(o.f32()[i], o_ref[i]) << i;
      ASSERT_EQ(o.f32()[i], o_plain[i]) << i;
    }
    const json s = json::parse(slurp(p("s.json")));
    EXPECT_EQ(s["screened"].get<std::vector<std::int64_t>>(), st.screened);
    EXPECT_EQ(s["screen_wrong"].get<std::vector<std::int64_t>>(), st.screen_wrong);
    EXPECT_EQ(s["total_screened"].get<std::int64_t>(), st.total_screened());
    EXPECT_EQ(s["skipped"].get<std::vector<std::int64_t>>(), st.skipped);
  }
  // Without --screen the statistics carry no screen keys.
  const Result r = blasst(base + " --out " + p("o.npy") + " --stats " + p("s.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(json::parse(slurp(p("s.json"))).contains("screened"));
}

// fp16 in -> fp16 out; bf16 as '<u2' bits with --dtype bf16 -> '<u2' out; '|V2' -> '|V2'.
TEST_F(Cli, SixteenBitInputsAndOutputs) {
  const std::int64_t L = 130, H = 2, d = 16;
  const auto qf = randn(L * H * d, 21), kf = randn(L * H * d, 22), vf = randn(L * H * d, 23);
  for (auto [elem, dtype_arg, bits_to_float, float_to_bits, tol] :
       {std::tuple{npy::Elem::f16, std::string(""), &blasst::f16_to_float, &blasst::float_to_f16, 2e-3},
        std::tuple{npy::Elem::u16, std::string(" --dtype bf16"), &blasst::bf16_to_float, &blasst::float_to_bf16, 2e-2},
        std::tuple{npy::Elem::bf16, std::string(""), &blasst::bf16_to_float, &blasst::float_to_bf16, 2e-2}}) {
    std::vector<float> q, k, v;  // the rounded values the binary sees
    auto store = [&, elem = elem, f2b = float_to_bits, b2f = bits_to_float](const char* name, const std::vector<float>& x,
                                                                             std::vector<float>& seen) {
      std::vector<std::uint16_t> bits;
      for (float f : x) {
        bits.push_back(f2b(f));
        seen.push_back(b2f(bits.back()));
      }
      npy::write(p(name), npy::from_u16(bits.data(), {L, H, d}, elem));
    };
    store("q.npy", qf, q);
    store("k.npy", kf, k);
    store("v.npy", vf, v);
    const Result r = blasst("run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + dtype_arg +
                            " --out " + p("o.npy"));
    ASSERT_EQ(r.rc, 0) << r.err;
    const npy::Array o = npy::read(p("o.npy"));
    EXPECT_EQ(o.elem, elem);
    const blasst::DType t = elem == npy::Elem::f16 ? blasst::DType::f16 : blasst::DType::bf16;
    const std::vector<float> got = as_floats(o, t);
    const Naive n = naive_attention(q, k, v, 1, L, L, H, H, d, false, 1.0 / std::sqrt(double(d)));
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], n.o[i], tol) << i;
  }
}

TEST_F(Cli, DecodeMatchesNaive) {
  const std::int64_t B = 2, ql = 2, Hq = 4, Hk = 2, Lmax = 300, d = 16;
  const auto q = randn(B * ql * Hq * d, 31), k = randn(B * Lmax * Hk * d, 32), v = randn(B * Lmax * Hk * d, 33);
  write_f32("q.npy", q, {B, ql, Hq, d});
  write_f32("k.npy", k, {B, Lmax, Hk, d});
  write_f32("v.npy", v, {B, Lmax, Hk, d});
  const Result r = blasst("run --decode --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") +
                          " --out " + p("o.npy") + " --lse " + p("lse.npy") + " --stats " + p("s.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const npy::Array o = npy::read(p("o.npy")), lse = npy::read(p("lse.npy"));
  ASSERT_EQ(o.shape, (std::vector<std::int64_t>{B, ql, Hq, d}));
  // Speculative decode: query i sees key j iff j <= i + Lk - q_len (bottom-right causal).
  const Naive n = naive_attention(q, k, v, B, ql, Lmax, Hq, Hk, d, true, 1.0 / std::sqrt(double(d)));
  for (std::size_t i = 0; i < n.o.size(); ++i) ASSERT_NEAR(o.f32()[i], n.o[i], 2e-5) << i;
  for (std::size_t i = 0; i < n.lse.size(); ++i) ASSERT_NEAR(lse.f32()[i], n.lse[i], 2e-5) << i;
  EXPECT_EQ(json::parse(slurp(p("s.json")))["command"], "decode");
}

TEST_F(Cli, ConfigResolutionIgnoreAndGating) {
  const std::int64_t L = 256, H = 2, d = 16;
  write_f32("q.npy", randn(L * H * d, 41), {L, H, d});
  write_f32("k.npy", randn(L * H * d, 42), {L, H, d});
  write_f32("v.npy", randn(L * H * d, 43), {L, H, d});
  std::ofstream(p("config.json")) << R"J({"hidden_size": 8, "sparse_attention_config": {"config_groups": {
    "g": {"algorithm": "skip_softmax",
          "threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)",
                                     "prefill": {"a": 2.0, "b": 3.0}, "decode": {"a": 0.5, "b": 1.0}},
          "target_sparsity": {"prefill": 0.5},
          "disabled_until_timestep": 0.5,
          "ignore": ["*cross_attn*"]}}}})J";
  const std::string io = "run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " +
                         p("o.npy") + " --stats " + p("s.json") + " --config " + p("config.json");
  // t = 0.3 <= 0.5: active; lambda = a * exp(b * s) / Lk with the file's target 0.5.
  Result r = blasst(io + " --layer blocks.1.attn1 --timestep 300 --num-train-timesteps 1000");
  ASSERT_EQ(r.rc, 0) << r.err;
  json s = json::parse(slurp(p("s.json")));
  EXPECT_EQ(s["skip_enabled"], true);
  EXPECT_NEAR(s["lambda"][0].get<double>(), 2.0 * std::exp(3.0 * 0.5) / L, 1e-12);
  // --target-sparsity overrides the file's target.
  r = blasst(io + " --layer blocks.1.attn1 --timestep 300 --num-train-timesteps 1000 --target-sparsity 0.2");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NEAR(json::parse(slurp(p("s.json")))["lambda"][0].get<double>(), 2.0 * std::exp(3.0 * 0.2) / L, 1e-12);
  // An ignored layer runs dense.
  r = blasst(io + " --layer blocks.1.cross_attn --timestep 300 --num-train-timesteps 1000");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json::parse(slurp(p("s.json")))["skip_enabled"], false);
  // t = 0.8 > 0.5: gated off, dense.
  r = blasst(io + " --layer blocks.1.attn1 --timestep 800 --num-train-timesteps 1000");
  ASSERT_EQ(r.rc, 0) << r.err;
  s = json::parse(slurp(p("s.json")));
  EXPECT_EQ(s["skip_enabled"], false);
  EXPECT_EQ(s["total_skipped"], 0);
  // D set but no timestep published: dense, with a warning.
  r = blasst(io + " --layer blocks.1.attn1");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json::parse(slurp(p("s.json")))["skip_enabled"], false);
  EXPECT_FALSE(r.err.empty());
  // Decode phase uses the decode fit, but this file has no decode target: an error unless given.
  expect_usage_error(io + " --phase decode --timestep 0 --num-train-timesteps 1000", {"target_sparsity", "decode"});
  r = blasst(io + " --phase decode --target-sparsity 0.4 --timestep 0 --num-train-timesteps 1000");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NEAR(json::parse(slurp(p("s.json")))["lambda"][0].get<double>(), 0.5 * std::exp(0.4) / L, 1e-12);
  // The blasst extension: its richer form gives the factor (here with the finite-size term:
  // L = 256, 64-row groups on 128-key tiles, causal: 4 of 6 visited pairs are unskippable, so
  // s = 0.2 is read at s' = 0.2 / (1 - 4/6) = 0.6, the second knot: ln factor 2), and its order
  // is used unless --order is given.
  std::ofstream(p("ext.json")) << R"J({"sparse_attention_config": {"config_groups": {"g": {
      "threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)", "prefill": {"a": 2.0, "b": 3.0}},
      "target_sparsity": 0.2,
      "blasst": {"visit_order": "max_first",
                 "vote": {"prefill": {"tile_keys": 128, "rows": 64, "heads": 1, "split_tiles": 0}},
                 "threshold_scale_factor": {"form": "piecewise_linear_log_factor",
                   "prefill": {"target_sparsity": [0.2, 0.6], "log_factor": [1.0, 2.0],
                               "finite_size": {"mask": "causal", "rows": 64, "tile_keys": 128}}}}}}}})J";
  const std::string io_ext = "run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " +
                             p("o.npy") + " --stats " + p("s.json") + " --config " + p("ext.json");
  r = blasst(io_ext);
  ASSERT_EQ(r.rc, 0) << r.err;
  s = json::parse(slurp(p("s.json")));
  EXPECT_NEAR(s["lambda"][0].get<double>(), std::exp(2.0) / L, 1e-15);
  EXPECT_EQ(s["granularity"]["order"], "max_first");
  r = blasst(io_ext + " --order natural");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json::parse(slurp(p("s.json")))["granularity"]["order"], "natural");
  // Without the extension (the file above): natural order, as before.
  r = blasst(io + " --layer blocks.1.attn1 --timestep 300 --num-train-timesteps 1000");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json::parse(slurp(p("s.json")))["granularity"]["order"], "natural");
  // A config with an unknown formula: the file and the JSON path are named.
  std::ofstream(p("bad.json")) << R"J({"config_groups": {"g": {"threshold_scale_factor":
      {"formula": "a + b", "prefill": {"a": 1, "b": 1}}}}})J";
  expect_usage_error("run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " + p("o.npy") +
                         " --config " + p("bad.json"),
                     {"bad.json", "config_groups.g.threshold_scale_factor.formula", "unknown formula"});
}

TEST_F(Cli, BadArgumentsExit2NamingTheArgument) {
  const std::int64_t L = 64, H = 2, d = 8;
  write_f32("q.npy", randn(L * H * d, 51), {L, H, d});
  write_f32("k.npy", randn(L * H * d, 52), {L, H, d});
  write_f32("v.npy", randn(L * H * d, 53), {L, H, d});
  write_f32("k_bad_d.npy", randn(L * H * 4, 54), {L, H, 4});
  const std::string qkv = "run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " + p("o.npy");
  expect_usage_error(qkv + " --threshold 0.1 --factor 3", {"--threshold", "--factor"});
  expect_usage_error(qkv + " --factor 3 --config " + p("q.npy"), {"--factor", "--config"});
  expect_usage_error(qkv + " --threshold inf", {"--threshold", "finite"});
  expect_usage_error(qkv + " --threshold -0.5", {"--threshold", "> 0"});
  expect_usage_error(qkv + " --threshold 0", {"--threshold"});
  expect_usage_error(qkv + " --threshold nan", {"--threshold"});
  expect_usage_error(qkv + " --threshold abc", {"--threshold"});
  expect_usage_error(qkv + " --factor -2", {"--factor"});
  expect_usage_error(qkv + " --scale inf", {"--scale"});
  expect_usage_error(qkv + " --target-sparsity 0.5", {"--target-sparsity", "--config"});
  expect_usage_error(qkv + " --tile-keys 0", {"--tile-keys"});
  expect_usage_error(qkv + " --order sideways", {"--order"});
  expect_usage_error(qkv + " --device tpu", {"--device"});
  // No GPU: refused; with a GPU: f32 files are refused by the kernels' dtype check. Either way named.
  expect_usage_error(qkv + " --device cuda", {"--device"});
  expect_usage_error(qkv + " --timestep 3", {"--timestep", "--num-train-timesteps"});
  expect_usage_error(qkv + " --timestep 3000 --num-train-timesteps 1000", {"--timestep", "[0, 1]"});
  expect_usage_error("run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy"), {"--out"});
  expect_usage_error("run --q " + p("missing.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " + p("o.npy"),
                     {"--q", "missing.npy"});
  expect_usage_error("run --q " + p("q.npy") + " --k " + p("k_bad_d.npy") + " --v " + p("v.npy") + " --out " + p("o.npy"),
                     {"--k", "k_bad_d.npy", "head dim"});
  expect_usage_error(qkv + " --vote-heads 3", {"--vote-heads", "must divide"});
  expect_usage_error(qkv + " --threshold 0.1 --screen loose", {"--screen"});
  expect_usage_error(qkv + " --threshold 0.1 --screen tight --screen-z -1", {"--screen-z", ">= 0"});
  expect_usage_error(qkv + " --threshold 0.1 --screen-ahead", {"--screen-ahead", "--screen"});
  expect_usage_error(qkv + " --threshold 0.1 --screen off --screen-ahead", {"--screen-ahead", "needs a margin"});
  // Files the reader refuses: the file is named.
  std::ofstream(p("garbage.npy")) << "definitely not numpy";
  expect_usage_error("run --q " + p("garbage.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " + p("o.npy"),
                     {"garbage.npy", "bad magic"});
  const float x[8] = {};
  std::vector<unsigned char> img = npy::serialize(npy::from_f32(x, {2, 2, 2}));
  std::string fortran(img.begin(), img.end());
  fortran.replace(fortran.find("False"), 5, "True ");
  std::ofstream(p("fortran.npy"), std::ios::binary) << fortran;
  expect_usage_error("run --q " + p("fortran.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " + p("o.npy"),
                     {"fortran.npy", "fortran_order"});
  std::vector<std::uint16_t> bits(L * H * d, 0x3f80);
  npy::write(p("u2.npy"), npy::from_u16(bits.data(), {L, H, d}, npy::Elem::u16));
  expect_usage_error("run --q " + p("u2.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " + p("o.npy"),
                     {"u2.npy", "--dtype bf16"});
  expect_usage_error("run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " +
                         p("no_such_dir/o.npy"),
                     {"no_such_dir"});
}

// The main job: `blasst demo --json --quick` prints a JSON list with the documented keys.
// The demo's rel_error (||O_skip - O_dense|| / ||O_dense|| over the whole output) recomputed in
// float64 by the independent SPEC oracle (tests/reference/spec_oracle.hpp: its own visit order,
// vote, skip decision and output over the kept tiles) on the demo's inputs: the CPU setup of
// src/cli/cmd_demo.cpp (Hq = Hk = 4, d = 128, seed 20251129 + 2 L (+1 for dit); llm causal, dit
// full; vote groups 64 rows x 1 head x 128 keys, max-first order: the demo's default, SPEC §2a)
// regenerated with make_workload.
std::vector<double> demo_oracle_errors(const std::string& workload, std::int64_t L, const std::vector<double>& lambdas) {
  const bool llm = workload == "llm";
  blasst::WorkloadSpec spec;
  spec.kind = llm ? blasst::WorkloadKind::llm : blasst::WorkloadKind::dit;
  spec.seq_len = L;
  spec.heads_q = spec.heads_k = 4;
  spec.head_dim = 128;
  spec.seed = 20251129u + static_cast<std::uint64_t>(L) * 2 + (llm ? 0 : 1);
  const blasst::Workload w = blasst::make_workload(spec);
  blasst::oracle::Attention a;
  a.q = w.q.data();
  a.k = w.k.data();
  a.v = w.v.data();
  a.Lq = a.Lk = L;
  a.Hq = a.Hk = 4;
  a.d = a.dv = 128;
  a.causal = llm;
  a.order = blasst::oracle::Order::max_first;  // the demo's default order (SPEC §2a)
  a.lambda = 1.0;  // dense
  const std::vector<double> dense = blasst::oracle::run(a).out;
  std::vector<double> errs;
  for (double lam : lambdas) {
    a.lambda = lam;
    const std::vector<double> skip = blasst::oracle::run(a).out;
    double num = 0, den = 0;
    for (std::size_t x = 0; x < dense.size(); ++x) {
      num += (skip[x] - dense[x]) * (skip[x] - dense[x]);
      den += dense[x] * dense[x];
    }
    errs.push_back(std::sqrt(num / den));
  }
  return errs;
}

TEST_F(Cli, DemoJsonQuick) {
  const Result r = blasst("demo --json --quick --device cpu");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json rows = json::parse(r.out);
  ASSERT_TRUE(rows.is_array());
  ASSERT_EQ(rows.size(), 2u * 2u * 3u);  // 2 workloads x 2 lengths x 3 targets
  std::set<std::string> workloads;
  std::map<std::pair<std::string, std::int64_t>, std::vector<json>> cases;
  for (const json& row : rows) {
    for (const char* key : {"workload", "seq_len", "target_sparsity", "sparsity", "rel_error", "ms_dense", "ms_skip",
                            "device", "lambda", "speedup"})
      ASSERT_TRUE(row.contains(key)) << key << " missing in " << row.dump();
    workloads.insert(row["workload"].get<std::string>());
    EXPECT_EQ(row["device"], "cpu");
    EXPECT_EQ(row["order"], "max_first") << "SPEC §2a: the direct threshold path defaults to max-first";
    const double s = row["sparsity"], t = row["target_sparsity"], lam = row["lambda"], err = row["rel_error"];
    EXPECT_GE(s, 0.0);
    EXPECT_LE(s, 1.0);
    EXPECT_GT(lam, 0.0);
    EXPECT_LT(lam, 1.0);
    EXPECT_TRUE(std::isfinite(err));
    EXPECT_GE(err, 0.0);
    // The one-pass curve is exact: a reachable target is hit to within one (group, tile) pair,
    // and the run reproduces the curve's prediction exactly.
    EXPECT_DOUBLE_EQ(s, row["curve_sparsity"].get<double>());
    if (row["target_reachable"].get<bool>()) EXPECT_NEAR(s, t, 2e-3) << row.dump();
    // rel_error is checked against a float64 oracle recomputation below (per case).
    cases[{row["workload"].get<std::string>(), row["seq_len"].get<std::int64_t>()}].push_back(row);
    if (s > 0.05) EXPECT_GT(err, 0.0) << row.dump();  // skipping happened and changed the output
  }
  ASSERT_EQ(cases.size(), 4u);
  for (const auto& [key, rs] : cases) {
    std::vector<double> lams;
    for (const json& row : rs) lams.push_back(row["lambda"].get<double>());
    const std::vector<double> expect = demo_oracle_errors(key.first, key.second, lams);
    for (std::size_t x = 0; x < rs.size(); ++x) {
      const double got = rs[x]["rel_error"].get<double>();
      // fp32 engine vs float64 oracle: 1e-4 relative (plus 1e-6 absolute for near-dense rows).
      EXPECT_NEAR(got, expect[x], 1e-4 * expect[x] + 1e-6) << rs[x].dump();
      std::printf("demo %s L=%lld lambda %.4g: rel_error %.6g, float64 oracle %.6g\n", key.first.c_str(),
                  static_cast<long long>(key.second), lams[x], got, expect[x]);
    }
  }
  EXPECT_EQ(workloads, (std::set<std::string>{"llm", "dit"}));
}

// ---- issue 21: hostile input ---------------------------------------------------------------

// Every error: exit status 2, exactly one line on stderr, printable, bounded, naming `needles`.
void expect_one_line_error(const Result& r, std::initializer_list<std::string> needles, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_EQ(r.err.rfind("blasst: error: ", 0), 0u) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
  for (std::size_t i = 0; i + 1 < r.err.size(); ++i)
    ASSERT_GE(static_cast<unsigned char>(r.err[i]), 0x20) << "control byte at " << i << ": " << r.err;
  EXPECT_LT(r.err.size(), 2100u);
  for (const char* leak : {"k_cache", "v_cache", "skip.vote", "resolve_lambda", "blasst calibrate"})
    EXPECT_EQ(r.err.find(leak), std::string::npos) << "library name '" << leak << "' in: " << r.err;
  for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "'" << n << "' not in: " << r.err;
}

std::string deep_config(std::size_t levels) {
  std::string s = R"J({"sparse_attention_config": {"config_groups": {"g": {"threshold_scale_factor": 3}}}, "meta": )J";
  s.append(levels, '[');
  s.append(levels, ']');
  return s + R"J(, "sibling": 1})J";
}

// Class 1 (deep nesting: SIGSEGV before) and class 3 (parse time quadratic in the groups, a FIFO
// blocking forever): refused or done within 5 s, on one line naming the flag and the file.
TEST_F(Cli, HostileConfigsFailFastAndCleanly) {
  const std::int64_t L = 64, H = 2, d = 8;
  write_f32("q.npy", randn(L * H * d, 61), {L, H, d});
  write_f32("k.npy", randn(L * H * d, 62), {L, H, d});
  write_f32("v.npy", randn(L * H * d, 63), {L, H, d});
  const std::string qkv = "run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " + p("o.npy");
  std::ofstream(p("deep.json")) << deep_config(150000);
  double t = 0;
  Result r = blasst_limited("calibrate --check " + p("deep.json"), nullptr, RLIM_INFINITY, &t);
  expect_one_line_error(r, {"--check: " + p("deep.json") + ": <root>.meta[0]", "nested deeper than 64 levels"},
                        "calibrate --check deep");
  EXPECT_LT(t, 5.0);
  r = blasst_limited(qkv + " --config " + p("deep.json"), nullptr, RLIM_INFINITY, &t);
  expect_one_line_error(r, {"--config: " + p("deep.json") + ": <root>.meta", "nested deeper"}, "run --config deep");
  EXPECT_LT(t, 5.0);

  // 200000 groups, each for one layer (7 MB; the issue's 200k groups were 8.6 MB): only the last
  // one applies to layer b199999 and carries a factor.
  std::string groups = R"J({"sparse_attention_config": {"config_groups": {)J";
  for (int i = 0; i < 200000; ++i)
    groups += (i ? ", " : "") + std::string("\"g") + std::to_string(i) + R"J(": {"layers": ["b)J" +
              std::to_string(i) + (i == 199999 ? R"J("], "threshold_scale_factor": 2})J" : R"J("]})J");
  groups += "}}}";
  std::ofstream(p("groups.json")) << groups;
  r = blasst_limited(qkv + " --config " + p("groups.json") + " --layer b199999 --stats " + p("s.json"), nullptr,
                     RLIM_INFINITY, &t);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_LT(t, 5.0) << "200000 groups";
  EXPECT_EQ(json::parse(slurp(p("s.json")))["factor"], 2.0);  // the last group matched
  std::printf("run --config with 200000 groups (%zu bytes): %.2f s\n", groups.size(), t);

  ASSERT_EQ(::mkfifo(p("fifo").c_str(), 0600), 0);
  r = blasst_limited("run --q " + p("fifo") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " + p("o.npy"),
                     nullptr, RLIM_INFINITY, &t);
  expect_one_line_error(r, {"--q: " + p("fifo") + ": is a FIFO"}, "FIFO input");
  EXPECT_LT(t, 5.0);
  r = blasst_limited(qkv + " --config " + p("fifo"), nullptr, RLIM_INFINITY, &t);
  expect_one_line_error(r, {"--config: " + p("fifo") + ": is a FIFO"}, "FIFO config");
  EXPECT_LT(t, 5.0);
  r = blasst_limited("calibrate --check " + p("fifo"), nullptr, RLIM_INFINITY, &t);
  expect_one_line_error(r, {"--check: " + p("fifo") + ": is a FIFO"}, "FIFO --check");
  EXPECT_LT(t, 5.0);
}

// Class 2: --threads is bounded (40000 aborted with "terminate called without an active
// exception"); the largest accepted value runs and equals one thread bit for bit.
TEST_F(Cli, ThreadsAreBounded) {
  const std::int64_t L = 200, H = 2, d = 8;
  write_f32("q.npy", randn(L * H * d, 71), {L, H, d});
  write_f32("k.npy", randn(L * H * d, 72), {L, H, d});
  write_f32("v.npy", randn(L * H * d, 73), {L, H, d});
  const std::string qkv = "run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --vote-rows 1";
  expect_one_line_error(blasst(qkv + " --out " + p("o.npy") + " --threads 40000"),
                        {"--threads: must lie in [0, 1024], got 40000"}, "run");
  expect_one_line_error(blasst(qkv + " --out " + p("o.npy") + " --threads -1"), {"--threads"}, "run -1");
  expect_one_line_error(blasst("demo --quick --threads 40000"), {"--threads"}, "demo");
  expect_one_line_error(blasst("calibrate --threads 40000"), {"--threads", "1024"}, "calibrate");
  ASSERT_EQ(blasst(qkv + " --out " + p("o1.npy") + " --threads 1").rc, 0);
  const Result r = blasst(qkv + " --out " + p("o1024.npy") + " --threads 1024");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(npy::read(p("o1024.npy")).bytes, npy::read(p("o1.npy")).bytes);
}

// Class 4: memory follows the input, not --tile-keys (4000000 on 64 x 96 took 1.5 GB; INT_MAX
// ended in "out of memory"). Tiles longer than the input are one tile of the input.
TEST_F(Cli, TileKeysCostOnlyTheInput) {
  const std::int64_t L = 64, H = 1, d = 96;
  write_f32("q.npy", randn(L * H * d, 81), {L, H, d});
  write_f32("k.npy", randn(L * H * d, 82), {L, H, d});
  write_f32("v.npy", randn(L * H * d, 83), {L, H, d});
  const std::string qkv = "run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy");
  ASSERT_EQ(blasst(qkv + " --tile-keys 64 --out " + p("o64.npy")).rc, 0);
  for (const char* t : {"4000000", "2147483647"}) {
    long rss = 0;
    const Result r = blasst_limited(qkv + " --tile-keys " + t + " --vote-rows 2147483647 --out " + p("o.npy"), &rss);
    ASSERT_EQ(r.rc, 0) << t << ": " << r.err;
    EXPECT_LT(rss, 300 * 1024) << t << ": peak RSS " << rss << " kB";
    EXPECT_EQ(npy::read(p("o.npy")).bytes, npy::read(p("o64.npy")).bytes) << t;
  }
  expect_one_line_error(blasst(qkv + " --tile-keys 2147483648 --out " + p("o.npy")), {"--tile-keys"}, "beyond int");
}

std::string bytes_of(const std::string& path) { return slurp(path); }

// Class 5: outputs are staged and renamed into place only when all are ready; an output may be
// neither an input nor another output.
TEST_F(Cli, OutputsAreReplacedOnlyWhenAllAreReady) {
  const std::int64_t L = 128, H = 2, d = 16;
  write_f32("q.npy", randn(L * H * d, 91), {L, H, d});
  write_f32("k.npy", randn(L * H * d, 92), {L, H, d});
  write_f32("v.npy", randn(L * H * d, 93), {L, H, d});
  const std::string qkv = "run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy");
  ASSERT_EQ(blasst(qkv + " --out " + p("o.npy")).rc, 0);
  const std::string good = bytes_of(p("o.npy")), q_bytes = bytes_of(p("q.npy"));
  auto unchanged = [&](const char* what) {
    EXPECT_EQ(bytes_of(p("o.npy")), good) << what << ": o.npy was touched";
    EXPECT_EQ(bytes_of(p("q.npy")), q_bytes) << what << ": q.npy was touched";
  };
  // An unwritable --lse or --stats fails before o.npy is replaced (it used to fail after).
  expect_one_line_error(blasst(qkv + " --causal --out " + p("o.npy") + " --lse " + p("no_dir/l.npy")),
                        {"--lse: " + p("no_dir/l.npy"), "does not exist"}, "--lse folder");
  unchanged("--lse");
  expect_one_line_error(blasst(qkv + " --causal --out " + p("o.npy") + " --stats " + dir_.string()),
                        {"--stats: " + dir_.string() + ": is a directory"}, "--stats dir");
  unchanged("--stats");
  // Outputs that collide with each other or with an input (also through a hard or soft link).
  expect_one_line_error(blasst(qkv + " --out " + p("o.npy") + " --stats " + p("o.npy")),
                        {"--stats: " + p("o.npy") + " is also the --out output"}, "stats = out");
  unchanged("stats = out");
  expect_one_line_error(blasst(qkv + " --out " + p("x.npy") + " --lse " + p("sub/../x.npy")),
                        {"--lse", "is also the --out output"}, "lse = out (not yet existing)");
  expect_one_line_error(blasst(qkv + " --out " + p("q.npy")), {"--out: " + p("q.npy") + " is also the --q input"},
                        "out = q");
  unchanged("out = q");
  fs::create_hard_link(p("q.npy"), p("hard.npy"));
  fs::create_symlink(p("k.npy"), p("soft.npy"));
  expect_one_line_error(blasst(qkv + " --out " + p("hard.npy")), {"--out", "is also the --q input"}, "hard link");
  expect_one_line_error(blasst(qkv + " --out " + p("o.npy") + " --lse " + p("soft.npy")),
                        {"--lse", "is also the --k input"}, "symlink");
  unchanged("links");
  // A failing write (file-size limit, as on a full disk) keeps the previous o.npy whole.
  const Result big = blasst_limited(qkv + " --causal --out " + p("o.npy"), nullptr, 16 * 1024);
  expect_one_line_error(big, {"--out: " + p("o.npy") + ": write error", "File too large"}, "RLIMIT_FSIZE");
  unchanged("RLIMIT_FSIZE");
  EXPECT_EQ(npy::read(p("o.npy")).shape, (std::vector<std::int64_t>{L, H, d}));  // still loads
  // Empty paths name their flag; /dev/null takes several outputs.
  expect_one_line_error(blasst(qkv + " --out ''"), {"--out: '': empty path"}, "--out ''");
  expect_one_line_error(blasst(qkv + " --out " + p("o.npy") + " --lse ''"), {"--lse: '': empty path"}, "--lse ''");
  const Result null = blasst(qkv + " --out /dev/null --lse /dev/null --stats /dev/null");
  EXPECT_EQ(null.rc, 0) << null.err;
  unchanged("/dev/null");
  // Nothing but the files this test made: no temporaries left behind.
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"q.npy", "k.npy", "v.npy", "o.npy", "hard.npy", "soft.npy", "stdout.txt",
                                          "stderr.txt"}));
}

// Class 6: NaN in q gives NaN in that row of O and LSE (it gave zeros and -inf, exit 0); every
// other row is the naive fp64 attention.
TEST_F(Cli, NanInputGivesNanRows) {
  const std::int64_t L = 100, H = 2, d = 16;
  auto q = randn(L * H * d, 101);
  const auto k = randn(L * H * d, 102), v = randn(L * H * d, 103);
  q[(37 * H + 1) * d + 4] = NAN;
  write_f32("q.npy", q, {L, H, d});
  write_f32("k.npy", k, {L, H, d});
  write_f32("v.npy", v, {L, H, d});
  const Result r = blasst("run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --out " +
                          p("o.npy") + " --lse " + p("lse.npy"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const npy::Array o = npy::read(p("o.npy")), lse = npy::read(p("lse.npy"));
  const Naive n = naive_attention(q, k, v, 1, L, L, H, H, d, false, 1.0 / std::sqrt(double(d)));
  for (std::int64_t i = 0; i < L; ++i)
    for (std::int64_t h = 0; h < H; ++h) {
      const bool nan_row = i == 37 && h == 1;
      EXPECT_EQ(std::isnan(lse.f32()[h * L + i]), nan_row) << i << " " << h;
      if (!nan_row) EXPECT_NEAR(lse.f32()[h * L + i], n.lse[h * L + i], 2e-5);
      for (std::int64_t c = 0; c < d; ++c) {
        const float x = o.f32()[(i * H + h) * d + c];
        ASSERT_EQ(std::isnan(x), nan_row) << i << " " << h << " " << c;
        if (!nan_row) ASSERT_NEAR(x, n.o[(i * H + h) * d + c], 2e-5);
      }
    }
}

// Class 7: messages name the flag or file, on one printable line, without library names.
TEST_F(Cli, ErrorsNameTheirFlagOrFileOnOnePrintableLine) {
  const std::int64_t L = 64, H = 2, d = 8;
  write_f32("q.npy", randn(L * H * d, 111), {L, H, d});
  write_f32("k.npy", randn(L * H * d, 112), {L, H, d});
  write_f32("v.npy", randn(L * H * d, 113), {L, H, d});
  write_f32("k4.npy", randn(L * H * d, 114), {1, L, H, d});
  write_f32("q3h.npy", randn(L * 3 * d, 115), {1, L, 3, d});
  write_f32("k4d.npy", randn(L * H * d, 116), {1, L, H, d});
  write_f32("v4d.npy", randn(L * H * d, 117), {1, L, H, d});
  const std::string io = " --out " + p("o.npy");
  const std::string qkv = "run --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + io;
  expect_one_line_error(blasst(qkv + " --factor 5e-324"), {"--factor: lambda = 0"}, "factor underflow");
  std::ofstream(p("overflow.json")) << R"J({"config_groups": {"g": {"threshold_scale_factor":
      {"formula": "a * exp(b * target_sparsity)", "prefill": {"a": 1, "b": 1e300}}, "target_sparsity": 0.5}}})J";
  expect_one_line_error(blasst(qkv + " --config " + p("overflow.json")),
                        {"--config: " + p("overflow.json") + ": config_groups.g.threshold_scale_factor.prefill",
                         "= inf"},
                        "overflowing fit");
  std::ofstream(p("nodecode.json")) << R"J({"config_groups": {"g": {"threshold_scale_factor":
      {"formula": "a * exp(b * target_sparsity)", "prefill": {"a": 1, "b": 1}}}}})J";
  expect_one_line_error(blasst(qkv + " --config " + p("nodecode.json") + " --phase decode"),
                        {"--config: " + p("nodecode.json") + ": config_groups.g: no threshold_scale_factor"},
                        "missing phase");
  expect_one_line_error(
      blasst("run --q " + p("q.npy") + " --k " + p("k4.npy") + " --v " + p("v.npy") + io),
      {"--k: q, k and v must all be rank 3", "--q " + p("q.npy") + " has rank 3", "--k " + p("k4.npy") + " rank 4"},
      "ranks");
  expect_one_line_error(
      blasst("run --decode --q " + p("q3h.npy") + " --k " + p("k4d.npy") + " --v " + p("v4d.npy") + io),
      {"--k: " + p("k4d.npy") + ": 2 KV heads do not divide the 3 query heads"}, "decode heads");
  expect_one_line_error(blasst(qkv + " --vote-heads 3"), {"--vote-heads"}, "vote heads");
  // Names from a config: a newline and an escape sequence are escaped, 100k characters are cut.
  std::ofstream(p("evil.json")) << R"J({"config_groups": {"g\n\u001b[2J)J" << std::string(100000, 'x')
                                << R"J(": {"algorithm": "top\nk"}}})J";
  expect_one_line_error(blasst(qkv + " --config " + p("evil.json")),
                        {"--config: " + p("evil.json") + ": config_groups['g\\n\\x1b[2Jxxx", "(100006 bytes)",
                         "unknown algorithm 'top\\nk'"},
                        "evil group name");
  expect_one_line_error(blasst("calibrate --check " + p("evil.json")), {"--check: " + p("evil.json")}, "check");
  expect_one_line_error(blasst(quote("fro\nb\x1b[2J")), {"unknown command 'fro\\nb\\x1b[2J'"}, "command");
  // A NUL in an .npy descr no longer cuts the message.
  std::vector<unsigned char> img = npy::serialize(npy::from_f32(randn(L * H * d, 118).data(), {L, H, d}));
  std::string bad(img.begin(), img.end());
  bad.replace(bad.find("<f4"), 3, std::string("<f\0", 3));
  std::ofstream(p("nul.npy"), std::ios::binary) << bad;
  expect_one_line_error(blasst("run --q " + p("nul.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + io),
                        {"--q: " + p("nul.npy") + ": unsupported dtype '<f\\x00' (supported:"}, "NUL descr");
}

}  // namespace
