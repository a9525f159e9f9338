// SPEC §7 configuration: parsing, errors with JSON paths, precedence, ignore/layers patterns,
// write round trip and multi-component model directories.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "blasst/config.hpp"

namespace fs = std::filesystem;
using blasst::Error;
using blasst::Phase;
namespace config = blasst::config;

namespace {

// The example of SPEC §7, as a whole config.json with unrelated keys around it.
const char* kSpecExample = R"J({
  "architectures": ["WanTransformer3DModel"],
  "num_layers": 40,
  "sparse_attention_config": {
    "config_groups": {
      "group_0": {
        "algorithm": "skip_softmax",
        "threshold_scale_factor": {
          "formula": "a * exp(b * target_sparsity)",
          "prefill": {"a": 1443.49, "b": 4.3037},
          "decode":  {"a": 0.119,   "b": 9.86}
        },
        "target_sparsity": {"prefill": 0.5, "decode": 0.5},
        "disabled_until_timestep": 0.86,
        "ignore": ["*cross_attn*"]
      }
    }
  }
})J";

// Expect parse() to throw an Error containing every needle.
void expect_error(const std::string& text, std::initializer_list<const char*> needles) {
  try {
    config::parse(text, "cfg.json");
    FAIL() << "accepted: " << text;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("cfg.json: ", 0), 0u) << m;
    for (const char* n : needles) EXPECT_NE(m.find(n), std::string::npos) << "'" << n << "' not in: " << m;
  }
}

std::string group(const std::string& body) {
  return R"J({"sparse_attention_config": {"config_groups": {"group_0": )J" + body + "}}}";
}

TEST(Config, ParsesSpecExample) {
  const auto cfg = config::parse(kSpecExample, "cfg.json");
  ASSERT_TRUE(cfg);
  ASSERT_EQ(cfg->groups.size(), 1u);
  const config::ConfigGroup& g = cfg->groups[0];
  EXPECT_EQ(g.name, "group_0");
  EXPECT_EQ(g.algorithm, "skip_softmax");
  EXPECT_FALSE(g.threshold_scale_factor.scalar);
  ASSERT_TRUE(g.threshold_scale_factor.prefill);
  EXPECT_DOUBLE_EQ(g.threshold_scale_factor.prefill->a, 1443.49);
  EXPECT_DOUBLE_EQ(g.threshold_scale_factor.prefill->b, 4.3037);
  ASSERT_TRUE(g.threshold_scale_factor.decode);
  EXPECT_DOUBLE_EQ(g.threshold_scale_factor.decode->a, 0.119);
  EXPECT_DOUBLE_EQ(*g.target_sparsity_prefill, 0.5);
  EXPECT_DOUBLE_EQ(*g.target_sparsity_decode, 0.5);
  EXPECT_DOUBLE_EQ(*g.disabled_until_timestep, 0.86);
  EXPECT_EQ(g.ignore, std::vector<std::string>{"*cross_attn*"});
  EXPECT_TRUE(g.layers.empty());
}

TEST(Config, BareBlockAndMissingBlock) {
  auto cfg = config::parse(R"J({"config_groups": {"g": {"threshold_scale_factor": 7.5}}})J");
  ASSERT_TRUE(cfg);
  EXPECT_DOUBLE_EQ(*cfg->groups.at(0).threshold_scale_factor.scalar, 7.5);
  // A config.json without the block: that component stays dense.
  EXPECT_FALSE(config::parse(R"J({"hidden_size": 4096})J"));
  EXPECT_FALSE(config::parse(R"J({"sparse_attention_config": null})J"));
  // Unknown metadata keys from other tools are ignored.
  cfg = config::parse(group(R"J({"threshold_scale_factor": 3, "initial_disabled_steps": 5})J"));
  ASSERT_TRUE(cfg);
}

TEST(Config, ResolvePrecedence) {
  const auto cfg = *config::parse(kSpecExample);
  // Calibrated: factor = a * exp(b * s); the file's target unless one is given.
  blasst::SkipConfig s = config::resolve(cfg, "blocks.3.self_attn", Phase::prefill);
  EXPECT_TRUE(s.enabled);
  EXPECT_FALSE(s.threshold);
  EXPECT_FALSE(s.factor);
  ASSERT_TRUE(s.calibration);
  EXPECT_DOUBLE_EQ(s.calibration->a, 1443.49);
  EXPECT_DOUBLE_EQ(s.calibration->b, 4.3037);
  EXPECT_DOUBLE_EQ(s.target_sparsity, 0.5);
  s = config::resolve(cfg, "blocks.3.self_attn", Phase::decode, 0.8);
  EXPECT_DOUBLE_EQ(s.calibration->a, 0.119);
  EXPECT_DOUBLE_EQ(s.target_sparsity, 0.8);
  EXPECT_THROW(config::resolve(cfg, "x", Phase::decode, 1.5), Error);
  EXPECT_THROW(config::resolve(cfg, "x", Phase::decode, std::nan("")), Error);

  // A scalar threshold_scale_factor is a raw factor and wins over target_sparsity.
  const auto raw = *config::parse(group(R"J({"threshold_scale_factor": 1234.5,
                                             "target_sparsity": {"prefill": 0.9}})J"));
  s = config::resolve(raw, "any", Phase::prefill, 0.3);
  EXPECT_TRUE(s.enabled);
  ASSERT_TRUE(s.factor);
  EXPECT_DOUBLE_EQ(*s.factor, 1234.5);
  EXPECT_FALSE(s.calibration);
  s = config::resolve(raw, "any", Phase::decode);
  EXPECT_DOUBLE_EQ(*s.factor, 1234.5);
}

TEST(Config, ResolveMissingPieces) {
  // A prefill-only fit cannot serve decode.
  const auto pre = *config::parse(group(R"J({"threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)",
      "prefill": {"a": 10, "b": 2}}, "target_sparsity": {"prefill": 0.5}})J"));
  EXPECT_NO_THROW(config::resolve(pre, "l", Phase::prefill));
  try {
    config::resolve(pre, "l", Phase::decode);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("decode"), std::string::npos) << e.what();
  }
  // No target anywhere: an error, not a guess; a given target fixes it.
  const auto notarget = *config::parse(group(R"J({"threshold_scale_factor": {"formula": "a*exp(b*target_sparsity)",
      "prefill": {"a": 10, "b": 2}}})J"));
  EXPECT_THROW(config::resolve(notarget, "l", Phase::prefill), Error);
  EXPECT_DOUBLE_EQ(config::resolve(notarget, "l", Phase::prefill, 0.7).target_sparsity, 0.7);
  // A group without any threshold source.
  const auto empty = *config::parse(group(R"J({"algorithm": "skip_softmax"})J"));
  EXPECT_THROW(config::resolve(empty, "l", Phase::prefill, 0.5), Error);
  // A single number target applies to both phases.
  const auto both = *config::parse(group(R"J({"threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)",
      "prefill": {"a": 10, "b": 2}, "decode": {"a": 1, "b": 3}}, "target_sparsity": 0.25})J"));
  EXPECT_DOUBLE_EQ(config::resolve(both, "l", Phase::decode).target_sparsity, 0.25);
  EXPECT_DOUBLE_EQ(config::resolve(both, "l", Phase::prefill).target_sparsity, 0.25);
}

TEST(Config, IgnorePatternsAndLayers) {
  const auto cfg = *config::parse(R"J({"config_groups": {
      "late": {"layers": ["blocks.3?.*", "blocks.[2-3]?.attn?"], "threshold_scale_factor": 50,
               "ignore": ["*.attn2"], "disabled_until_timestep": 0.5},
      "rest": {"threshold_scale_factor": 5, "ignore": ["*cross_attn*", "blocks.0.*"]}}})J");
  // fnmatch semantics: *, ?, [..]; the first group whose layers match wins.
  EXPECT_DOUBLE_EQ(*config::resolve(cfg, "blocks.31.attn1", Phase::prefill).factor, 50);
  EXPECT_DOUBLE_EQ(*config::resolve(cfg, "blocks.25.attn1", Phase::prefill).factor, 50);
  EXPECT_DOUBLE_EQ(*config::resolve(cfg, "blocks.15.attn1", Phase::prefill).factor, 5);
  EXPECT_DOUBLE_EQ(*config::resolve(cfg, "blocks.3.attn1", Phase::prefill).factor, 5);
  // Ignored in the group that applies: dense (SkipConfig{}), no fall-through to later groups.
  blasst::SkipConfig s = config::resolve(cfg, "blocks.31.attn2", Phase::prefill);
  EXPECT_FALSE(s.enabled);
  EXPECT_FALSE(s.factor || s.threshold || s.calibration);
  EXPECT_FALSE(config::resolve(cfg, "blocks.7.cross_attn", Phase::prefill).enabled);
  EXPECT_FALSE(config::resolve(cfg, "blocks.0.attn1", Phase::decode).enabled);
  EXPECT_TRUE(config::resolve(cfg, "blocks.10.attn1", Phase::decode).enabled);
  // Timestep gating follows the same group choice.
  EXPECT_DOUBLE_EQ(*config::disabled_until_timestep(cfg, "blocks.30.attn1"), 0.5);
  EXPECT_FALSE(config::disabled_until_timestep(cfg, "blocks.1.attn1"));
  // No group applies: dense.
  const auto only = *config::parse(R"J({"config_groups": {"g": {"layers": ["a.*"], "threshold_scale_factor": 1}}})J");
  EXPECT_FALSE(config::resolve(only, "b.1", Phase::prefill).enabled);
  EXPECT_TRUE(config::resolve(only, "a.1", Phase::prefill).enabled);
  EXPECT_FALSE(config::disabled_until_timestep(only, "b.1"));
}

TEST(Config, UnknownFormulaAndAlgorithm) {
  expect_error(group(R"J({"threshold_scale_factor": {"formula": "a / target_sparsity", "prefill": {"a": 1, "b": 1}}})J"),
               {"config_groups.group_0.threshold_scale_factor.formula", "unknown formula"});
  expect_error(group(R"J({"threshold_scale_factor": {"prefill": {"a": 1, "b": 1}}})J"),
               {"threshold_scale_factor.formula", "missing"});
  expect_error(group(R"J({"algorithm": "topk", "threshold_scale_factor": 3})J"),
               {"config_groups.group_0.algorithm", "unknown algorithm 'topk'"});
  // Whitespace differences are the same formula.
  EXPECT_NO_THROW(config::parse(group(R"J({"threshold_scale_factor": {"formula": "a*exp( b*target_sparsity )",
      "decode": {"a": 1, "b": 1}}})J")));
}

TEST(Config, WrongTypesAndRangesNameTheJsonPath) {
  const std::string f = R"J("formula": "a * exp(b * target_sparsity)")J";
  expect_error(group(R"J({"threshold_scale_factor": {)J" + f + R"J(, "prefill": {"a": "1", "b": 2}}})J"),
               {"config_groups.group_0.threshold_scale_factor.prefill.a", "expected a number"});
  expect_error(group(R"J({"threshold_scale_factor": {)J" + f + R"J(, "prefill": {"a": 0, "b": 2}}})J"),
               {"threshold_scale_factor.prefill.a", "> 0"});
  expect_error(group(R"J({"threshold_scale_factor": {)J" + f + R"J(, "prefill": {"a": -3, "b": 2}}})J"),
               {"threshold_scale_factor.prefill.a"});
  expect_error(group(R"J({"threshold_scale_factor": {)J" + f + R"J(, "decode": {"a": 1}}})J"),
               {"threshold_scale_factor.decode.b", "missing"});
  expect_error(group(R"J({"threshold_scale_factor": {)J" + f + R"J(, "decode": [1, 2]}})J"),
               {"threshold_scale_factor.decode", "expected an object"});
  expect_error(group(R"J({"threshold_scale_factor": {)J" + f + R"J(}})J"), {"prefill", "decode"});
  expect_error(group(R"J({"threshold_scale_factor": 1e999})J"), {"invalid JSON", "1e999"});
  expect_error(group(R"J({"threshold_scale_factor": -2})J"), {"threshold_scale_factor", "> 0"});
  expect_error(group(R"J({"threshold_scale_factor": true})J"), {"threshold_scale_factor"});
  expect_error(group(R"J({"threshold_scale_factor": 1, "target_sparsity": {"prefill": 1.5}})J"),
               {"config_groups.group_0.target_sparsity.prefill", "[0, 1]"});
  expect_error(group(R"J({"threshold_scale_factor": 1, "target_sparsity": -0.1})J"), {"target_sparsity", "[0, 1]"});
  expect_error(group(R"J({"threshold_scale_factor": 1, "target_sparsity": "half"})J"), {"target_sparsity"});
  expect_error(group(R"J({"disabled_until_timestep": 1.2})J"), {"disabled_until_timestep", "[0, 1]"});
  expect_error(group(R"J({"ignore": "*cross*"})J"), {"config_groups.group_0.ignore", "list of strings"});
  expect_error(group(R"J({"ignore": ["a", 3]})J"), {"config_groups.group_0.ignore[1]"});
  expect_error(group(R"J({"layers": [null]})J"), {"config_groups.group_0.layers[0]"});
  expect_error(group(R"J([1])J"), {"config_groups.group_0", "expected an object"});
  expect_error(R"J({"sparse_attention_config": {"groups": {}}})J", {"config_groups", "missing"});
  expect_error(R"J({"sparse_attention_config": {"config_groups": []}})J", {"config_groups", "expected an object"});
  expect_error(R"J({"sparse_attention_config": 5})J", {"sparse_attention_config"});
}

TEST(Config, MalformedJson) {
  expect_error(R"J({"sparse_attention_config": {)J", {"invalid JSON"});
  expect_error("", {"invalid JSON"});
  expect_error(R"J({"a": NaN})J", {"invalid JSON"});
  expect_error("[1, 2]", {"expected a JSON object"});
  EXPECT_THROW(config::load_file("/nonexistent/dir/config.json"), Error);
}

// ---- issue 21: hostile configs ------------------------------------------------------------------

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A valid block, then an unrelated key holding `levels` nested arrays, then a sibling key (the
// sibling is what made the old parser copy the deep value recursively and overflow the stack).
std::string deep_config(std::size_t levels, char open = '[') {
  const char close = open == '[' ? ']' : '}';
  std::string s = R"J({"sparse_attention_config": {"config_groups": {"g": {"threshold_scale_factor": 3}}}, "meta": )J";
  for (std::size_t i = 0; i < levels; ++i) s += open == '[' ? "[" : R"J({"a": )J";
  if (open == '{') s += "1";
  s.append(levels, close);
  return s + R"J(, "sibling": 1})J";
}

TEST(ConfigLimits, DeepNestingIsRefusedCleanly) {
  for (const char open : {'[', '{'})
    for (const std::size_t levels : {std::size_t{70}, std::size_t{10000}, std::size_t{150000}}) {
      const auto t0 = std::chrono::steady_clock::now();
      expect_error(deep_config(levels, open), {"nested deeper than 64 levels"});
      EXPECT_LT(seconds_since(t0), 5.0) << levels;
    }
  // At the limit: 64 levels (the root object and 63 arrays under "meta") parse, 65 do not.
  EXPECT_NO_THROW(config::parse(deep_config(63), "cfg.json"));
  expect_error(deep_config(64), {"cfg.json: <root>.meta[0]", "nested deeper than 64 levels"});
}

// 200k groups: linear time (the old parser took minutes: a linear key search per insertion).
TEST(ConfigLimits, ManyGroupsParseInLinearTime) {
  std::string s = R"J({"sparse_attention_config": {"config_groups": {)J";
  const int n = 200000;
  for (int i = 0; i < n; ++i)
    s += (i ? ", " : "") + std::string("\"group_") + std::to_string(i) + R"J(": {"threshold_scale_factor": )J" +
         std::to_string(i + 1) + "}";
  s += "}}}";
  const auto t0 = std::chrono::steady_clock::now();
  const auto cfg = config::parse(s, "cfg.json");
  const double t = seconds_since(t0);
  ASSERT_TRUE(cfg);
  ASSERT_EQ(cfg->groups.size(), std::size_t(n));
  EXPECT_EQ(cfg->groups.front().name, "group_0");  // file order kept
  EXPECT_EQ(cfg->groups.back().name, "group_199999");
  EXPECT_EQ(*cfg->groups[12345].threshold_scale_factor.scalar, 12346.0);
  EXPECT_LT(t, 5.0) << s.size() << " bytes";
  // Writing them back is linear too (to_json searched the object for every name).
  const auto t1 = std::chrono::steady_clock::now();
  const std::string again = config::to_json(*cfg);
  const double t_write = seconds_since(t1);
  EXPECT_LT(t_write, 5.0);
  EXPECT_NE(again.find("\"group_199999\""), std::string::npos);  // (22 MB pretty-printed: over the parse limit)
  std::printf("200000 groups (%zu bytes) parsed in %.2f s, written in %.2f s\n", s.size(), t, t_write);
}

TEST(ConfigLimits, DuplicateKeysAreRefused) {
  expect_error(R"J({"config_groups": {"g": {"threshold_scale_factor": 1}, "g": {"threshold_scale_factor": 2}}})J",
               {"<root>.config_groups", "duplicate key 'g'"});
  expect_error(group(R"J({"threshold_scale_factor": 1, "threshold_scale_factor": 1e9})J"),
               {"config_groups.group_0", "duplicate key 'threshold_scale_factor'"});
}

TEST(ConfigLimits, OversizedTextIsRefused) {
  std::string s = group(R"J({"threshold_scale_factor": 1})J");
  s.append((std::size_t{16} << 20) + 1 - s.size(), ' ');  // 16 MiB + 1 byte
  expect_error(s, {"too large", "16777217 bytes", "limit is 16777216"});
  s.pop_back();
  EXPECT_NO_THROW(config::parse(s, "cfg.json"));
}

// Names and strings from the file are echoed on one printable line of bounded length.
TEST(ConfigLimits, HostileNamesAreEchoedPrintably) {
  const std::string evil = R"(g\n\u001b[2J)" + std::string(100000, 'x');  // JSON escapes: newline, ESC
  try {
    config::parse(R"J({"config_groups": {")J" + evil + R"J(": {"algorithm": "top\nk\u0000!"}}})J", "cfg.json");
    FAIL() << "accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_LT(m.size(), 400u) << m.size();
    for (unsigned char c : m) ASSERT_GE(c, 0x20) << m;
    EXPECT_NE(m.find("config_groups['g\\n\\x1b[2Jxxx"), std::string::npos) << m;
    EXPECT_NE(m.find("(100006 bytes)"), std::string::npos) << m;
    EXPECT_NE(m.find("unknown algorithm 'top\\nk\\x00!'"), std::string::npos) << m;
  }
}

// An overflowing fit is reported against its group, phase and numbers (b = 1e300).
TEST(ConfigLimits, OverflowingCalibrationNamesTheGroup) {
  const auto cfg = config::parse(group(R"J({"threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)",
      "prefill": {"a": 1, "b": 1e300}}, "target_sparsity": 0.5})J"));
  ASSERT_TRUE(cfg);
  try {
    config::resolve(*cfg, "blocks.0", Phase::prefill);
    FAIL() << "resolved";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("config_groups.group_0.threshold_scale_factor.prefill"), std::string::npos) << m;
    EXPECT_NE(m.find("a * exp(b * target_sparsity) = inf (a = 1, b = 1e+300, target_sparsity = 0.5)"), std::string::npos)
        << m;
  }
}

class ConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("blasst_cfg_" + std::to_string(std::random_device{}()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static void write(const fs::path& p, const std::string& s) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << s;
  }
  fs::path dir_;
};

TEST_F(ConfigFiles, WriteRoundTripPreservesOtherKeys) {
  config::SparseAttentionConfig cfg;
  config::ConfigGroup a;
  a.name = "zeta_first";  // not alphabetical: file order must survive
  a.threshold_scale_factor.prefill = blasst::Calibration{1443.4853294366435, 4.303654042880227};
  a.threshold_scale_factor.decode = blasst::Calibration{0.119, 9.86};
  a.target_sparsity_prefill = 0.5;
  a.target_sparsity_decode = 0.7;
  a.disabled_until_timestep = 0.86;
  a.ignore = {"*cross_attn*", "blocks.0.*"};
  a.layers = {"blocks.1*"};
  config::ConfigGroup b;
  b.name = "alpha_second";
  b.threshold_scale_factor.scalar = 321.125;
  cfg.groups = {a, b};

  const fs::path p = dir_ / "config.json";
  write(p, R"J({"hidden_size": 3072, "sparse_attention_config": {"config_groups": {}}, "zz": [1, 2]})J");
  config::write_into(p.string(), cfg);
  const nlohmann::json whole = nlohmann::json::parse(std::ifstream(p));
  EXPECT_EQ(whole["hidden_size"], 3072);
  EXPECT_EQ(whole["zz"], nlohmann::json::array({1, 2}));

  const auto back = config::load_file(p.string());
  ASSERT_TRUE(back);
  ASSERT_EQ(back->groups.size(), 2u);
  const auto& g = back->groups[0];
  EXPECT_EQ(g.name, "zeta_first");
  EXPECT_EQ(g.threshold_scale_factor.prefill->a, 1443.4853294366435);  // exact: doubles round-trip
  EXPECT_EQ(g.threshold_scale_factor.prefill->b, 4.303654042880227);
  EXPECT_EQ(g.threshold_scale_factor.decode->b, 9.86);
  EXPECT_EQ(*g.target_sparsity_decode, 0.7);
  EXPECT_EQ(*g.disabled_until_timestep, 0.86);
  EXPECT_EQ(g.ignore, a.ignore);
  EXPECT_EQ(g.layers, a.layers);
  EXPECT_EQ(back->groups[1].name, "alpha_second");
  EXPECT_EQ(*back->groups[1].threshold_scale_factor.scalar, 321.125);
  // to_json -> parse -> to_json is a fixed point.
  EXPECT_EQ(config::to_json(*config::parse(config::to_json(cfg))), config::to_json(cfg));
  // write_into also creates a fresh file.
  config::write_into((dir_ / "new.json").string(), cfg);
  EXPECT_EQ(config::to_json(*config::load_file((dir_ / "new.json").string())), config::to_json(cfg));
  // Duplicate names cannot be written.
  cfg.groups[1].name = "zeta_first";
  EXPECT_THROW(config::to_json(cfg), Error);
}

// A FIFO, a device or a directory given as a config is refused at once (a FIFO used to block).
TEST_F(ConfigFiles, NonRegularFilesAreRefused) {
  const std::string fifo = (dir_ / "config.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& [path, what] : {std::pair<std::string, std::string>{fifo, "is a FIFO"},
                                   {"/dev/zero", "is a character device"},
                                   {dir_.string(), "is a directory"}}) {
    try {
      config::load_file(path);
      FAIL() << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": " + what), std::string::npos) << e.what();
    }
  }
  EXPECT_LT(seconds_since(t0), 5.0);
  // write_into refuses to read it too, and leaves it alone.
  EXPECT_THROW(config::write_into(fifo, config::SparseAttentionConfig{}), Error);
  EXPECT_TRUE(fs::is_fifo(fifo));
}

// write_into replaces config.json only once the new file is complete: a failure keeps the old.
TEST_F(ConfigFiles, FailedWriteKeepsTheOldFile) {
  const fs::path p = dir_ / "config.json";
  write(p, R"J({"hidden_size": 1})J");
  config::SparseAttentionConfig cfg;
  cfg.groups.push_back(config::ConfigGroup{});  // an empty name cannot be written
  EXPECT_THROW(config::write_into(p.string(), cfg), Error);
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(p)), nlohmann::json::parse(R"J({"hidden_size": 1})J"));
  EXPECT_THROW(config::write_into((dir_ / "missing" / "config.json").string(), cfg), Error);
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1u) << "no temporary left behind";
}

TEST_F(ConfigFiles, ModelDirWithTwoComponents) {
  write(dir_ / "model_index.json", R"J({"_class_name": "WanPipeline"})J");
  write(dir_ / "transformer" / "config.json", kSpecExample);
  write(dir_ / "transformer_2" / "config.json",
        R"J({"num_layers": 40, "sparse_attention_config": {"config_groups": {"g": {"threshold_scale_factor": 99}}}})J");
  write(dir_ / "vae" / "config.json", R"J({"latent_channels": 16})J");  // no block: stays dense
  write(dir_ / "text_encoder" / "weights.bin", "x");                  // no config.json
  const auto comps = config::load_model_dir(dir_.string());
  ASSERT_EQ(comps.size(), 2u);
  EXPECT_EQ(comps[0].first, "transformer");
  EXPECT_EQ(comps[1].first, "transformer_2");
  EXPECT_TRUE(comps[0].second.groups[0].threshold_scale_factor.prefill);
  EXPECT_DOUBLE_EQ(*config::resolve(comps[1].second, "blocks.1.attn1", Phase::prefill).factor, 99);
  // A broken component is an error naming its file.
  write(dir_ / "transformer_2" / "config.json", R"J({"sparse_attention_config": {"config_groups": {"g": {"algorithm": 1}}}})J");
  try {
    config::load_model_dir(dir_.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("transformer_2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(config::load_model_dir((dir_ / "missing").string()), Error);
}

}  // namespace

// ---- the "blasst" extension (SPEC §7 revised) --------------------------------------------------

namespace {
// A group with the interop fit and an extension body.
std::string with_ext(const std::string& ext) {
  return group(R"J({"threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)",
                    "prefill": {"a": 4.0, "b": 5.0}, "decode": {"a": 0.1, "b": 6.0}},
                    "target_sparsity": 0.5, "blasst": )J" + ext + "}");
}
const char* kGoodExt = R"J({
  "visit_order": "max_first",
  "vote": {"prefill": {"tile_keys": 128, "rows": 64, "heads": 1, "split_tiles": 0},
           "decode":  {"tile_keys": 128, "rows": 1, "heads": 4, "split_tiles": 16}},
  "threshold_scale_factor": {
    "form": "piecewise_linear_log_factor",
    "prefill": {"target_sparsity": [0.3, 0.5, 0.8], "log_factor": [3.0, 4.25, 6.0],
                "finite_size": {"mask": "causal", "rows": 64, "tile_keys": 128}},
    "decode": {"target_sparsity": [0.3, 0.9], "log_factor": [0.0, 4.0]}
  }
})J";
}  // namespace

TEST(ConfigExtension, ParsesEveryField) {
  const auto cfg = config::parse(with_ext(kGoodExt), "cfg.json");
  ASSERT_TRUE(cfg);
  const auto& g = cfg->groups.at(0);
  ASSERT_TRUE(g.blasst);
  const auto& e = *g.blasst;
  EXPECT_EQ(e.visit_order, blasst::VisitOrder::max_first);
  ASSERT_TRUE(e.vote_prefill && e.vote_decode);
  EXPECT_EQ(e.vote_prefill->rows, 64);
  EXPECT_EQ(e.vote_decode->heads, 4);
  EXPECT_EQ(e.vote_decode->split_tiles, 16);
  EXPECT_EQ(e.vote_decode->order, blasst::VisitOrder::max_first);
  ASSERT_TRUE(e.prefill && e.decode);
  EXPECT_EQ(e.prefill->targets, (std::vector<double>{0.3, 0.5, 0.8}));
  EXPECT_EQ(e.prefill->log_factors, (std::vector<double>{3.0, 4.25, 6.0}));
  ASSERT_TRUE(e.prefill->finite_size);
  EXPECT_EQ(e.prefill->finite_size->mask, blasst::MaskKind::causal);
  EXPECT_FALSE(e.decode->finite_size);
  // The interop form is read as before, beside it.
  EXPECT_EQ(g.threshold_scale_factor.prefill->a, 4.0);
  // Absent or null: no extension; an empty one is valid (natural order, nothing else).
  EXPECT_FALSE(config::parse(kSpecExample)->groups[0].blasst);
  EXPECT_FALSE(config::parse(with_ext("null"))->groups[0].blasst);
  const auto empty = config::parse(with_ext("{}"));
  ASSERT_TRUE(empty->groups[0].blasst);
  EXPECT_FALSE(empty->groups[0].blasst->visit_order);
  EXPECT_EQ(config::parse(with_ext(R"J({"visit_order": "natural"})J"))->groups[0].blasst->visit_order,
            blasst::VisitOrder::natural);
}

TEST(ConfigExtension, MalformedFieldsNameTheirPath) {
  const std::string p = "config_groups.group_0.blasst";
  auto ext = [](const std::string& tsf_prefill) {
    return with_ext(R"J({"threshold_scale_factor": {"form": "piecewise_linear_log_factor", "prefill": )J" +
                    tsf_prefill + "}}");
  };
  expect_error(with_ext("[]"), {"config_groups.group_0.blasst: expected an object, got array"});
  expect_error(with_ext(R"J({"visit_order": "random"})J"), {".blasst.visit_order: unknown visit order 'random'"});
  expect_error(with_ext(R"J({"visit_order": 1})J"), {".blasst.visit_order: expected"});
  expect_error(with_ext(R"J({"visit_order": "max-first"})J"), {"unknown visit order 'max-first'"});
  expect_error(with_ext(R"J({"vote": 3})J"), {".blasst.vote: expected an object"});
  expect_error(with_ext(R"J({"vote": {"prefill": {"tile_keys": 128, "rows": 64, "heads": 1}}})J"),
               {".blasst.vote.prefill.split_tiles: missing"});
  expect_error(with_ext(R"J({"vote": {"prefill": {"tile_keys": 0, "rows": 64, "heads": 1, "split_tiles": 0}}})J"),
               {".blasst.vote.prefill.tile_keys: must lie in [1, 2147483647], got 0"});
  expect_error(with_ext(R"J({"vote": {"decode": {"tile_keys": 128, "rows": 64.5, "heads": 1, "split_tiles": 0}}})J"),
               {".blasst.vote.decode.rows: expected an integer, got the non-integer number 64.5"});
  expect_error(with_ext(R"J({"vote": {"decode": {"tile_keys": 128, "rows": 1, "heads": -2, "split_tiles": 0}}})J"),
               {".blasst.vote.decode.heads: must lie in [1, 2147483647], got -2"});
  expect_error(with_ext(R"J({"vote": {"decode": {"tile_keys": 128, "rows": 1, "heads": 1, "split_tiles": 2147483648}}})J"),
               {".blasst.vote.decode.split_tiles: must lie in [0, 2147483647]"});
  expect_error(with_ext(R"J({"vote": {"decode": {"tile_keys": "128", "rows": 1, "heads": 1, "split_tiles": 0}}})J"),
               {".blasst.vote.decode.tile_keys: expected an integer, got string"});
  expect_error(with_ext(R"J({"threshold_scale_factor": []})J"), {".blasst.threshold_scale_factor: expected an object"});
  expect_error(with_ext(R"J({"threshold_scale_factor": {"prefill": {}}})J"), {".blasst.threshold_scale_factor.form: missing"});
  expect_error(with_ext(R"J({"threshold_scale_factor": {"form": "spline"}})J"),
               {".blasst.threshold_scale_factor.form: unknown form 'spline'"});
  expect_error(with_ext(R"J({"threshold_scale_factor": {"form": "piecewise_linear_log_factor"}})J"),
               {".blasst.threshold_scale_factor: needs a \"prefill\" or \"decode\" form"});
  const std::string f = p + ".threshold_scale_factor.prefill";
  expect_error(ext("[1]"), {(f + ": expected an object").c_str()});
  expect_error(ext(R"J({"log_factor": [1, 2]})J"), {(f + ".target_sparsity: missing").c_str()});
  expect_error(ext(R"J({"target_sparsity": [0.1, 0.2]})J"), {(f + ".log_factor: missing").c_str()});
  expect_error(ext(R"J({"target_sparsity": 0.1, "log_factor": [1, 2]})J"), {(f + ".target_sparsity: expected a list of numbers, got number").c_str()});
  expect_error(ext(R"J({"target_sparsity": [0.1, "x"], "log_factor": [1, 2]})J"), {(f + ".target_sparsity[1]: expected a number, got string").c_str()});
  expect_error(ext(R"J({"target_sparsity": [0.1, 0.2], "log_factor": [1, 1e999]})J"), {"invalid JSON"});
  expect_error(ext(R"J({"target_sparsity": [0.1, 0.2, 0.3], "log_factor": [1, 2]})J"),
               {(f + ".target_sparsity: has 3 knots but log_factor has 2").c_str()});
  expect_error(ext(R"J({"target_sparsity": [0.1], "log_factor": [1]})J"), {(f + ": needs 2 to 256 knots, got 1").c_str()});
  expect_error(ext(R"J({"target_sparsity": [], "log_factor": []})J"), {(f + ": needs 2 to 256 knots, got 0").c_str()});
  expect_error(ext(R"J({"target_sparsity": [0.2, 0.1], "log_factor": [1, 2]})J"),
               {(f + ".target_sparsity[1]: must be greater than the knot before it (0.2), got 0.1").c_str()});
  expect_error(ext(R"J({"target_sparsity": [0.1, 1.5], "log_factor": [1, 2]})J"),
               {(f + ".target_sparsity[1]: must lie in [0, 1], got 1.5").c_str()});
  expect_error(ext(R"J({"target_sparsity": [0.1, 0.2], "log_factor": [2, 1]})J"),
               {(f + ".log_factor[1]: must not be below the knot before it (2; the form is non-decreasing), got 1").c_str()});
  std::string many = "[";
  for (int i = 0; i < 300; ++i) many += (i ? "," : "") + std::to_string(i);
  many += "]";
  expect_error(ext(R"J({"target_sparsity": )J" + many + R"J(, "log_factor": [1, 2]})J"),
               {(f + ".target_sparsity: has 300 entries; the limit is 256").c_str()});
  const std::string fs = f + ".finite_size";
  const std::string knots = R"J("target_sparsity": [0.1, 0.2], "log_factor": [1, 2], )J";
  expect_error(ext("{" + knots + R"J("finite_size": true})J"), {(fs + ": expected an object").c_str()});
  expect_error(ext("{" + knots + R"J("finite_size": {"mask": "causal", "rows": 64}})J"), {(fs + ".tile_keys: missing").c_str()});
  expect_error(ext("{" + knots + R"J("finite_size": {"mask": "sliding", "rows": 64, "tile_keys": 128}})J"),
               {(fs + ".mask: unknown mask 'sliding'").c_str()});
  expect_error(ext("{" + knots + R"J("finite_size": {"mask": "full", "rows": 0, "tile_keys": 128}})J"),
               {(fs + ".rows: must lie in [1, 2147483647], got 0").c_str()});
  // The finite-size term is defined for prefill (Lq = Lk) only.
  expect_error(with_ext(R"J({"threshold_scale_factor": {"form": "piecewise_linear_log_factor", "decode": {)J" + knots +
                        R"J("finite_size": {"mask": "causal", "rows": 1, "tile_keys": 128}}}})J"),
               {".blasst.threshold_scale_factor.decode.finite_size: is defined for the prefill phase only"});
  // Hostile strings are echoed escaped, cut, on one line.
  try {
    config::parse(with_ext(R"J({"visit_order": "a\u001b[31m\n)J" + std::string(500, 'x') + R"J("})J"), "cfg.json");
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos);
    EXPECT_EQ(m.find('\x1b'), std::string::npos);
    EXPECT_LT(m.size(), 400u);
  }
}

TEST(ConfigExtension, WriteReadRoundTripIsBitExact) {
  // Awkward doubles (seeded random values over many magnitudes, thirds, neighbours of 1, the
  // smallest subnormal): to_json must print them so that parse gives back the same bits.
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> expo(-300, 300);
  config::PiecewiseLogFactor pre;
  double s = 0.0;
  double y = -1e300;
  for (int i = 0; i < 40; ++i) {
    s = std::nextafter(s + 0.02 * mant(rng) / 2.0, 1.0);
    y += std::ldexp(mant(rng), expo(rng)) + (i % 7 == 0 ? 1.0 / 3.0 : 0.0);
    pre.targets.push_back(s);
    pre.log_factors.push_back(y);
  }
  pre.log_factors[0] = std::nextafter(pre.log_factors[1], -HUGE_VAL);  // one ulp below knot 1
  pre.finite_size = blasst::FiniteSizeTerm{blasst::MaskKind::full, 16, 32};
  config::PiecewiseLogFactor dec;
  dec.targets = {0.1, std::nextafter(0.1, 1.0), 1.0 / 3.0, 0.9};
  dec.log_factors = {-5e-324, 0.1 + 0.2, std::nextafter(0.1 + 0.2, 1.0), 1e308};  // smallest subnormal
  config::SparseAttentionConfig cfg;
  config::ConfigGroup g;
  g.name = "group_0";
  g.threshold_scale_factor.prefill = blasst::Calibration{4.1522017, 5.746661};
  g.target_sparsity_prefill = 0.5;
  g.blasst = config::BlasstExtension{};
  g.blasst->visit_order = blasst::VisitOrder::max_first;
  g.blasst->vote_prefill = blasst::VoteGranularity{128, 64, 1, 0, blasst::VisitOrder::max_first};
  g.blasst->prefill = pre;
  g.blasst->decode = dec;
  cfg.groups = {g};
  const std::string text = config::to_json(cfg);
  const auto back = config::parse(text, "roundtrip");
  ASSERT_TRUE(back && back->groups.size() == 1 && back->groups[0].blasst);
  const auto& e = *back->groups[0].blasst;
  auto same_bits = [](const std::vector<double>& a, const std::vector<double>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
  };
  EXPECT_TRUE(same_bits(e.prefill->targets, pre.targets));
  EXPECT_TRUE(same_bits(e.prefill->log_factors, pre.log_factors));
  EXPECT_TRUE(same_bits(e.decode->targets, dec.targets));
  EXPECT_TRUE(same_bits(e.decode->log_factors, dec.log_factors));
  EXPECT_EQ(e.prefill->finite_size->mask, blasst::MaskKind::full);
  EXPECT_EQ(e.prefill->finite_size->rows, 16);
  EXPECT_EQ(e.prefill->finite_size->tile_keys, 32);
  EXPECT_FALSE(e.decode->finite_size);
  EXPECT_EQ(e.visit_order, blasst::VisitOrder::max_first);
  EXPECT_FALSE(e.vote_decode);
  EXPECT_EQ(e.vote_prefill->tile_keys, 128);
  EXPECT_EQ(config::to_json(*back), text);  // a fixed point
  // A reader that does not know the extension finds the interop block unchanged: the same JSON
  // as the group without it, plus one key "blasst".
  auto plain = cfg;
  plain.groups[0].blasst.reset();
  nlohmann::json with = nlohmann::json::parse(text), without = nlohmann::json::parse(config::to_json(plain));
  with["sparse_attention_config"]["config_groups"]["group_0"].erase("blasst");
  EXPECT_EQ(with, without);
  // An unusable form is not written.
  cfg.groups[0].blasst->decode->log_factors[1] = -1.0;
  EXPECT_THROW(config::to_json(cfg), Error);
}

TEST(ConfigExtension, ResolveUsesTheFormOrderAndVote) {
  const auto cfg = *config::parse(with_ext(kGoodExt), "cfg.json");
  // Prefill: the piecewise form with its finite-size term, max-first, the prefill vote.
  const blasst::SkipConfig s = config::resolve(cfg, "any", Phase::prefill);
  ASSERT_TRUE(s.piecewise);
  EXPECT_FALSE(s.factor);
  EXPECT_EQ(s.vote.order, blasst::VisitOrder::max_first);
  EXPECT_EQ(s.vote.rows, 64);
  EXPECT_EQ(s.vote.heads, 1);
  EXPECT_EQ(s.target_sparsity, 0.5);
  // Hand computation (float64, formulas of SPEC §6): L = 4096, 64 x 128 causal: f0 = 64 / 1056,
  // s' = 0.5 / (1 - f0), on the segment (0.5, 4.25) - (0.8, 6.0).
  for (std::int64_t L : {4096, 8192}) {
    const double G = L / 64.0, visited = (L / 128.0) * (L / 128.0 + 1.0);  // 2 * (1 + ... + L/128)
    const double s1 = 0.5 / (1.0 - G / visited);
    const double expect = std::exp(4.25 + (6.0 - 4.25) / 0.3 * (s1 - 0.5)) / static_cast<double>(L);
    EXPECT_NEAR(blasst::resolve_lambda(s, L), expect, 1e-14 * expect) << L;
  }
  // A target on a knot, and a target below the knots (end slope 6.25, flagged by the form).
  auto t = config::resolve(cfg, "any", Phase::decode, 0.3);
  EXPECT_EQ(t.vote.heads, 4);
  EXPECT_EQ(t.vote.rows, 1);
  EXPECT_EQ(t.vote.split_tiles, 16);
  EXPECT_EQ(t.vote.order, blasst::VisitOrder::max_first);
  EXPECT_DOUBLE_EQ(blasst::resolve_lambda(t, 1000), std::exp(0.0) / 1000.0);  // decode: no length term
  t = config::resolve(cfg, "any", Phase::decode, 0.1);
  EXPECT_TRUE(t.piecewise->extrapolates(0.1));
  EXPECT_NEAR(blasst::resolve_lambda(t, 1000), std::exp(-0.2 * 4.0 / 0.6) / 1000.0, 1e-15);
  // A raw factor still wins; the extension's order and vote still apply.
  auto raw = config::parse(group(R"J({"threshold_scale_factor": 9.5, "blasst": {"visit_order": "max_first"}})J"));
  const auto r = config::resolve(*raw, "x", Phase::prefill);
  EXPECT_EQ(*r.factor, 9.5);
  EXPECT_FALSE(r.piecewise);
  EXPECT_EQ(r.vote.order, blasst::VisitOrder::max_first);
  // An extension with an order only: the interop fit, in that order.
  auto order_only = config::parse(with_ext(R"J({"visit_order": "max_first"})J"));
  const auto o = config::resolve(*order_only, "x", Phase::prefill);
  ASSERT_TRUE(o.calibration);
  EXPECT_FALSE(o.piecewise);
  EXPECT_EQ(o.vote.order, blasst::VisitOrder::max_first);
  EXPECT_DOUBLE_EQ(blasst::resolve_lambda(o, 4096), 4.0 * std::exp(5.0 * 0.5) / 4096.0);
  // A form without the interop fit resolves (our writer always writes both).
  auto form_only = config::parse(group(R"J({"target_sparsity": 0.4, "blasst": {"threshold_scale_factor":
      {"form": "piecewise_linear_log_factor", "prefill": {"target_sparsity": [0.2, 0.6], "log_factor": [1, 3]}}}})J"));
  EXPECT_NEAR(blasst::resolve_lambda(config::resolve(*form_only, "x", Phase::prefill), 100), std::exp(2.0) / 100, 1e-15);
  EXPECT_THROW(config::resolve(*form_only, "x", Phase::decode), Error);  // no decode fit or form
  // A form whose factor overflows at the target: the group and the form are named.
  auto huge = config::parse(group(R"J({"target_sparsity": 1.0, "blasst": {"threshold_scale_factor":
      {"form": "piecewise_linear_log_factor", "prefill": {"target_sparsity": [0.0, 0.5], "log_factor": [0, 800]}}}})J"));
  try {
    config::resolve(*huge, "x", Phase::prefill);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config_groups.group_0.blasst.threshold_scale_factor.prefill"), std::string::npos)
        << e.what();
  }
}

TEST(ConfigExtension, WithoutTheExtensionResolveIsUnchanged) {
  // The interop config: no piecewise form, the default granularity in natural order, and
  // lambda = a * exp(b * s) / L exactly as before (float64 formula here).
  const auto cfg = *config::parse(kSpecExample);
  for (Phase ph : {Phase::prefill, Phase::decode}) {
    const blasst::SkipConfig s = config::resolve(cfg, "blocks.1.attn1", ph);
    EXPECT_FALSE(s.piecewise);
    const blasst::VoteGranularity def;
    EXPECT_EQ(s.vote.order, blasst::VisitOrder::natural);
    EXPECT_EQ(s.vote.tile_keys, def.tile_keys);
    EXPECT_EQ(s.vote.rows, def.rows);
    EXPECT_EQ(s.vote.heads, def.heads);
    EXPECT_EQ(s.vote.split_tiles, def.split_tiles);
    const double a = ph == Phase::prefill ? 1443.49 : 0.119, b = ph == Phase::prefill ? 4.3037 : 9.86;
    for (std::int64_t L : {4096, 32768}) EXPECT_EQ(blasst::resolve_lambda(s, L), a * std::exp(b * 0.5) / L);
  }
}

TEST(ConfigExtension, WriteReadApplyGivesTheSameLambdasToTheLastBit) {
  // Knots with full-precision values (seeded), written, read back and applied: every lambda of
  // the re-read config equals the in-memory one bit for bit.
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  config::ConfigGroup g;
  g.name = "group_0";
  g.threshold_scale_factor.prefill = blasst::Calibration{u(rng) * 10, u(rng) * 8};
  g.threshold_scale_factor.decode = blasst::Calibration{u(rng), u(rng) * 8};
  g.target_sparsity_prefill = u(rng);
  g.target_sparsity_decode = u(rng);
  g.blasst = config::BlasstExtension{};
  g.blasst->visit_order = blasst::VisitOrder::natural;
  for (auto* form : {&g.blasst->prefill, &g.blasst->decode}) {
    config::PiecewiseLogFactor f;
    double y = std::log(u(rng));
    for (double s = 0.3; s < 0.95; s += 0.1) {
      f.targets.push_back(s + u(rng) * 1e-3);
      f.log_factors.push_back(y += u(rng));
    }
    *form = f;
  }
  g.blasst->prefill->finite_size = blasst::FiniteSizeTerm{blasst::MaskKind::causal, 64, 128};
  config::SparseAttentionConfig cfg;
  cfg.groups = {g};
  const auto back = config::parse(config::to_json(cfg), "back");
  ASSERT_TRUE(back);
  int compared = 0;
  for (Phase ph : {Phase::prefill, Phase::decode})
    for (double t : {0.05, 0.3, 0.5, 0.77, 0.9, 0.99}) {
      const auto a = config::resolve(cfg, "l", ph, t), b = config::resolve(*back, "l", ph, t);
      for (std::int64_t L : {1, 128, 1000, 4096, 12345, 65536, 1 << 20}) {
        const double la = blasst::resolve_lambda(a, L), lb = blasst::resolve_lambda(b, L);
        EXPECT_EQ(std::memcmp(&la, &lb, sizeof la), 0) << to_string(ph) << " s=" << t << " L=" << L;
        ++compared;
      }
    }
  EXPECT_EQ(compared, 84);
}
