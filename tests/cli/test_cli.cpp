// End-to-end tests of the `blasst` binary: inputs are written as .npy by the test, the binary is
// run as a separate process, and its outputs are compared with an independent fp64 attention
// computed here and with blasst::reference::attention/decode called in-process.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <map>
#include <set>
#include <tuple>
#include <sstream>
#include <string>
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
  blasst::SkipConfig skip = blasst::SkipConfig::from_factor(20);
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
  expect_usage_error(qkv + " --threshold 1.5", {"--threshold", "(0, 1)"});
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
  expect_usage_error(qkv + " --vote-heads 3", {"vote.heads"});
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
// full; vote groups 64 rows x 1 head x 128 keys, natural order) regenerated with make_workload.
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

}  // namespace
