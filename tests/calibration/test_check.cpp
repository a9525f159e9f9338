// `blasst calibrate --check` on good and malformed files (library function and, when the CLI is
// built, the command itself), and one small end-to-end `blasst calibrate` run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <unistd.h>

#include "blasst/calibration.hpp"
#include "blasst/config.hpp"
#include "blasst/npy.hpp"
#include "blasst/workloads.hpp"

using namespace blasst;
namespace fs = std::filesystem;

namespace {
fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() /
                     ("blasst_calib_" + std::to_string(static_cast<long long>(::getpid())) + "_" + name);
  fs::remove_all(p);
  return p;
}
void write(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << s;
}
const char* kGood = R"J({"model_type": "x", "sparse_attention_config": {"config_groups": {"group_0": {
  "algorithm": "skip_softmax",
  "threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)",
                             "prefill": {"a": 1443.49, "b": 4.3037}, "decode": {"a": 0.119, "b": 9.86}},
  "target_sparsity": {"prefill": 0.5, "decode": 0.5}, "disabled_until_timestep": 0.86,
  "ignore": ["*cross_attn*"]}}}})J";
// The component names of a model-directory summary: the lines " component NAME:".
std::set<std::string> components(const std::string& summary) {
  std::set<std::string> names;
  std::istringstream in(summary);
  const std::string head = " component ";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(head, 0) == 0 && !line.empty() && line.back() == ':')
      names.insert(line.substr(head.size(), line.size() - head.size() - 1));
  return names;
}
}  // namespace

TEST(Check, GoodFileSummary) {
  const auto p = scratch("good") / "config.json";
  write(p, kGood);
  std::ostringstream out, err;
  EXPECT_EQ(calibration::check_config(p.string(), out, err), 0) << err.str();
  EXPECT_TRUE(err.str().empty());
  const std::string s = out.str();
  EXPECT_NE(s.find("group_0"), std::string::npos) << s;
  EXPECT_NE(s.find("1443.49"), std::string::npos) << s;
  EXPECT_NE(s.find("*cross_attn*"), std::string::npos) << s;
  // factor(0.5) = 1443.49 * exp(4.3037 * 0.5) = 12413.6..., lambda at 32768 = 0.3788...
  EXPECT_NE(s.find("0.3788"), std::string::npos) << s;
  // No block: valid, dense.
  const auto q = scratch("none") / "config.json";
  write(q, R"J({"model_type": "x"})J");
  std::ostringstream o2, e2;
  EXPECT_EQ(calibration::check_config(q.string(), o2, e2), 0);
  EXPECT_NE(o2.str().find("dense"), std::string::npos);
  // A model directory with two components, one without the block.
  const auto dir = scratch("model");
  write(dir / "transformer" / "config.json", kGood);
  write(dir / "transformer_2" / "config.json", R"J({"a": 1})J");
  std::ostringstream o3, e3;
  EXPECT_EQ(calibration::check_config(dir.string(), o3, e3), 0) << e3.str();
  // Exactly the component that carries the block is listed (a substring search for
  // "transformer" would also accept transformer_2).
  EXPECT_EQ(components(o3.str()), std::set<std::string>{"transformer"}) << o3.str();
  EXPECT_NE(o3.str().find(": 1 component(s) with sparse_attention_config"), std::string::npos) << o3.str();
  // The other way round: only transformer_2 carries it.
  const auto dir2 = scratch("model2");
  write(dir2 / "transformer" / "config.json", R"J({"a": 1})J");
  write(dir2 / "transformer_2" / "config.json", kGood);
  std::ostringstream o4, e4;
  EXPECT_EQ(calibration::check_config(dir2.string(), o4, e4), 0) << e4.str();
  EXPECT_EQ(components(o4.str()), std::set<std::string>{"transformer_2"}) << o4.str();
  fs::remove_all(dir2);
  fs::remove_all(p.parent_path());
  fs::remove_all(q.parent_path());
  fs::remove_all(dir);
}

TEST(Check, ExtensionSummaryShowsBothForms) {
  const auto p = scratch("ext") / "config.json";
  write(p, R"J({"sparse_attention_config": {"config_groups": {"group_0": {
    "threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)", "prefill": {"a": 2.0, "b": 3.0}},
    "target_sparsity": 0.5,
    "blasst": {"visit_order": "max_first",
               "vote": {"prefill": {"tile_keys": 128, "rows": 64, "heads": 1, "split_tiles": 0}},
               "threshold_scale_factor": {"form": "piecewise_linear_log_factor",
                 "prefill": {"target_sparsity": [0.3, 0.7], "log_factor": [1.0, 5.0]}}}}}}})J");
  std::ostringstream out, err;
  ASSERT_EQ(calibration::check_config(p.string(), out, err), 0) << err.str();
  const std::string s = out.str();
  EXPECT_NE(s.find("prefill (richer form, used)"), std::string::npos) << s;
  EXPECT_NE(s.find("(0.3, 1), (0.7, 5)"), std::string::npos) << s;
  // Hand computation: ln factor(0.5) = 3, lambda = e^3 / 4096 = 0.004903700...
  EXPECT_NE(s.find("lambda 0.0049037 at L=4096"), std::string::npos) << s;
  // The interop fit beside it: 2 e^1.5 / 4096 = 0.002188325...
  EXPECT_NE(s.find("lambda 0.00218832 at L=4096"), std::string::npos) << s;
  EXPECT_NE(s.find("interop form"), std::string::npos) << s;
  EXPECT_NE(s.find("visit order max_first"), std::string::npos) << s;
  EXPECT_NE(s.find("decode: no fit"), std::string::npos) << s;
  // A form that cannot give a factor at the file's target, and a malformed extension: exit 2,
  // the file and the JSON path named.
  write(p, R"J({"sparse_attention_config": {"config_groups": {"group_0": {"target_sparsity": 0.9,
    "blasst": {"threshold_scale_factor": {"form": "piecewise_linear_log_factor",
      "prefill": {"target_sparsity": [0.1, 0.2], "log_factor": [0, 900]}}}}}}})J");
  std::ostringstream o2, e2;
  EXPECT_EQ(calibration::check_config(p.string(), o2, e2), 2);
  EXPECT_NE(e2.str().find("config_groups.group_0.blasst.threshold_scale_factor.prefill"), std::string::npos) << e2.str();
  EXPECT_NE(e2.str().find(p.string()), std::string::npos) << e2.str();
  write(p, R"J({"sparse_attention_config": {"config_groups": {"group_0": {"threshold_scale_factor": 3,
    "blasst": {"visit_order": "backwards"}}}}})J");
  std::ostringstream o3, e3;
  EXPECT_EQ(calibration::check_config(p.string(), o3, e3), 2);
  EXPECT_NE(e3.str().find("config_groups.group_0.blasst.visit_order: unknown visit order 'backwards'"),
            std::string::npos) << e3.str();
  fs::remove_all(p.parent_path());
}

TEST(Check, MalformedFilesExit2) {
  const auto dir = scratch("bad");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"truncated", R"J({"sparse_attention_config": {"config_groups": )J"},
      {"formula", R"J({"sparse_attention_config": {"config_groups": {"g": {"threshold_scale_factor":
          {"formula": "a * L^b", "prefill": {"a": 1, "b": 2}}}}}})J"},
      {"a_string", R"J({"sparse_attention_config": {"config_groups": {"g": {"threshold_scale_factor":
          {"formula": "a * exp(b * target_sparsity)", "prefill": {"a": "big", "b": 2}}}}}})J"},
      {"target", R"J({"sparse_attention_config": {"config_groups": {"g": {"threshold_scale_factor":
          {"formula": "a * exp(b * target_sparsity)", "prefill": {"a": 1, "b": 2}},
          "target_sparsity": {"prefill": 1.5}}}}})J"},
      {"algorithm", R"J({"sparse_attention_config": {"config_groups": {"g": {"algorithm": "topk",
          "threshold_scale_factor": 3.0}}}})J"},
  };
  for (const auto& [name, text] : bad) {
    const auto p = dir / (name + ".json");
    write(p, text);
    std::ostringstream out, err;
    EXPECT_EQ(calibration::check_config(p.string(), out, err), 2) << name << ": " << out.str();
    EXPECT_NE(err.str().find(p.filename().string()), std::string::npos)
        << name << ": the error names the file: " << err.str();
  }
  std::ostringstream out, err;
  EXPECT_EQ(calibration::check_config((dir / "missing.json").string(), out, err), 2);
  fs::remove_all(dir);
}

#ifdef BLASST_CLI_PATH
namespace {
int run(const std::string& args, const fs::path& log) {
  const std::string cmd = std::string("'") + BLASST_CLI_PATH + "' " + args + " >'" + log.string() +
                          "' 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}
std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
}  // namespace

TEST(Check, CommandLine) {
  const auto dir = scratch("cli");
  fs::create_directories(dir);
  write(dir / "good.json", kGood);
  write(dir / "bad.json", R"J({"sparse_attention_config": {"config_groups": {"g": {"threshold_scale_factor": -1}}}})J");
  EXPECT_EQ(run("calibrate --check '" + (dir / "good.json").string() + "'", dir / "log1"), 0)
      << slurp(dir / "log1");
  EXPECT_NE(slurp(dir / "log1").find("group_0"), std::string::npos);
  EXPECT_EQ(run("calibrate --check '" + (dir / "bad.json").string() + "'", dir / "log2"), 2);
  EXPECT_NE(slurp(dir / "log2").find("bad.json"), std::string::npos) << slurp(dir / "log2");

  // Small end-to-end calibration (dit, full mask, scaled-down vote groups).
  const auto cfg = dir / "out" / "config.json";
  const int rc = run("calibrate --workload dit --lengths 512,1024 --heads 2 --head-dim 32 "
                     "--tile-keys 32 --rows 16 --targets 0.1,0.2,0.3 --threads 2 --out '" +
                         cfg.string() + "' --report '" + (dir / "report").string() + "'",
                     dir / "log3");
  ASSERT_EQ(rc, 0) << slurp(dir / "log3");
  const auto parsed = config::load_file(cfg.string());
  ASSERT_TRUE(parsed.has_value());
  ASSERT_EQ(parsed->groups.size(), 1u);
  EXPECT_TRUE(parsed->groups[0].threshold_scale_factor.prefill.has_value());
  EXPECT_FALSE(parsed->groups[0].threshold_scale_factor.decode.has_value());
  // Both forms and the order used: the extension with natural order, the prefill vote and the
  // richer form with the finite-size term of the full mask at that vote.
  const auto& ext = parsed->groups[0].blasst;
  ASSERT_TRUE(ext.has_value());
  EXPECT_EQ(ext->visit_order, VisitOrder::natural);
  ASSERT_TRUE(ext->vote_prefill.has_value());
  EXPECT_EQ(ext->vote_prefill->rows, 16);
  EXPECT_EQ(ext->vote_prefill->tile_keys, 32);
  ASSERT_TRUE(ext->prefill.has_value());
  ASSERT_TRUE(ext->prefill->finite_size.has_value());
  EXPECT_EQ(ext->prefill->finite_size->mask, MaskKind::full);
  EXPECT_EQ(ext->prefill->targets, (std::vector<double>{0.1, 0.2, 0.3}));
  EXPECT_FALSE(ext->decode.has_value());
  EXPECT_NE(slurp(dir / "log3").find("richer form"), std::string::npos) << slurp(dir / "log3");
  const std::string md = slurp(dir / "report" / "report.md");
  EXPECT_NE(md.find("Error achieved - target per length"), std::string::npos);
  EXPECT_NE(md.find("Inverse law"), std::string::npos);
  EXPECT_NE(md.find("Validation"), std::string::npos);
  if (calibration::png_supported()) {
    EXPECT_TRUE(fs::exists(dir / "report" / "sparsity_vs_lambda_default_prefill.png"));
    EXPECT_TRUE(fs::exists(dir / "report" / "achieved_vs_target_default_prefill.png"));
  }
  EXPECT_EQ(run("calibrate --check '" + cfg.string() + "'", dir / "log4"), 0) << slurp(dir / "log4");
  EXPECT_NE(run("calibrate --workload dit --lengths 0", dir / "log5"), 0);
  EXPECT_NE(run("calibrate --npy-dir '" + (dir / "nothing").string() + "'", dir / "log6"), 0);
  fs::remove_all(dir);
}

// --npy-dir: layer files (per-layer groups) and a multi-component model directory.
TEST(Check, CommandLineNpy) {
  const auto dir = scratch("npy");
  auto dump = [](const fs::path& base, std::uint64_t seed) {
    WorkloadSpec s;
    s.kind = WorkloadKind::llm;
    s.seq_len = 1024;
    s.heads_q = 2;
    s.heads_k = 2;
    s.head_dim = 32;
    s.seed = seed;
    const Workload w = make_workload(s);
    fs::create_directories(base.parent_path());
    npy::write(base.string() + "_q.npy", npy::from_f32(w.q.data(), {1, 1024, 2, 32}));
    npy::write(base.string() + "_k.npy", npy::from_f32(w.k.data(), {1024, 2, 32}));
    npy::write(base.string() + "_v.npy", npy::from_f32(w.v.data(), {1024, 2, 32}));
  };
  dump(dir / "acts" / "layer0", 1);
  dump(dir / "acts" / "layer1", 2);
  const std::string common = " --lengths 512,1024 --tile-keys 32 --rows 16 --order max_first "
                             "--targets 0.1,0.2 --threads 2";
  const auto cfg = dir / "config.json";
  ASSERT_EQ(run("calibrate --npy-dir '" + (dir / "acts").string() + "' --per-layer --layer-pattern "
                "'model.layers.{}.attn' --out '" + cfg.string() + "'" + common, dir / "log1"), 0)
      << slurp(dir / "log1");
  const auto parsed = config::load_file(cfg.string());
  ASSERT_TRUE(parsed.has_value());
  ASSERT_EQ(parsed->groups.size(), 3u) << slurp(cfg);
  EXPECT_EQ(parsed->groups[0].layers, std::vector<std::string>{"model.layers.0.attn"});
  EXPECT_EQ(parsed->groups[1].layers, std::vector<std::string>{"model.layers.1.attn"});
  EXPECT_TRUE(parsed->groups[2].layers.empty());
  for (const auto& g : parsed->groups) {  // --order max_first is written with every group
    ASSERT_TRUE(g.blasst.has_value());
    EXPECT_EQ(g.blasst->visit_order, VisitOrder::max_first);
  }
  // Two components: one config.json per component under --out.
  dump(dir / "model" / "transformer" / "layer0", 3);
  dump(dir / "model" / "transformer_2" / "layer0", 4);
  ASSERT_EQ(run("calibrate --npy-dir '" + (dir / "model").string() + "' --out '" +
                (dir / "out").string() + "'" + common, dir / "log2"), 0)
      << slurp(dir / "log2");
  for (const char* c : {"transformer", "transformer_2"})
    EXPECT_TRUE(config::load_file((dir / "out" / c / "config.json").string()).has_value()) << c;
  EXPECT_EQ(run("calibrate --check '" + (dir / "out").string() + "'", dir / "log3"), 0);
  EXPECT_NE(slurp(dir / "log3").find("transformer_2"), std::string::npos) << slurp(dir / "log3");
  // A length beyond the files: refused.
  EXPECT_EQ(run("calibrate --npy-dir '" + (dir / "acts").string() + "' --lengths 4096", dir / "log4"), 2);
  fs::remove_all(dir);
}
#endif
