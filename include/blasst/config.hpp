// SPEC §7: the sparse_attention_config block that model checkpoints carry in config.json.
// Implemented in src/config/. Every malformed or unsupported file raises blasst::Error naming the
// file and the JSON path of the problem (e.g. "cfg.json: config_groups.group_0.threshold_scale_factor.prefill.a: expected a number").
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "blasst/blasst.hpp"

namespace blasst::config {

// The only formula understood; any other string is rejected, never guessed.
inline constexpr const char* kFormula = "a * exp(b * target_sparsity)";
// The only richer form of the "blasst" extension (blasst.threshold_scale_factor.form).
inline constexpr const char* kPiecewiseForm = "piecewise_linear_log_factor";

struct ThresholdScaleFactor {
  std::optional<double> scalar;            // raw factor; wins over target_sparsity
  std::optional<Calibration> prefill;      // factor = a * exp(b * s)
  std::optional<Calibration> decode;
};

// The SPEC §6 richer form (blasst.hpp: SkipConfig carries it).
using blasst::FiniteSizeTerm;
using blasst::PiecewiseLogFactor;
using blasst::validate;

// Project extensions of a config group (SPEC §7 revised): the one sub-object "blasst". Readers
// that do not know it still find the interop form (threshold_scale_factor) unchanged.
struct BlasstExtension {
  // Visit order the calibration used; absent in the file means natural (SPEC §2a).
  std::optional<VisitOrder> visit_order;
  // Vote granularity the calibration was counted at, per phase (its order field is visit_order).
  std::optional<VoteGranularity> vote_prefill, vote_decode;
  // The richer form per phase; when present it is what resolve() uses for that phase.
  std::optional<PiecewiseLogFactor> prefill, decode;
};

struct ConfigGroup {
  std::string name;                        // key in config_groups, e.g. "group_0"
  std::string algorithm = "skip_softmax";  // the only algorithm supported
  ThresholdScaleFactor threshold_scale_factor;
  std::optional<double> target_sparsity_prefill;
  std::optional<double> target_sparsity_decode;
  std::optional<double> disabled_until_timestep;  // SPEC §4, in [0, 1]
  std::vector<std::string> ignore;         // fnmatch patterns matched against layer names
  // blasst extension for per-layer calibration: fnmatch patterns of the layers this group applies
  // to (empty = every layer). Groups are tried in file order; the first that applies wins.
  std::vector<std::string> layers;
  // The "blasst" sub-object; absent: the group behaves exactly as an interop config.
  std::optional<BlasstExtension> blasst;
};

struct SparseAttentionConfig {
  std::vector<ConfigGroup> groups;
};

// Parse either a whole config.json (the block under "sparse_attention_config") or the bare block.
// A config.json without the key yields std::nullopt (that component stays dense).
std::optional<SparseAttentionConfig> parse(const std::string& json_text,
                                           const std::string& source_name = "<string>");
std::optional<SparseAttentionConfig> load_file(const std::string& path);
// Multi-component models: a model directory whose subfolders (transformer/, transformer_2/, ...)
// each hold a config.json. Returns (component name, config) for components that have a block.
std::vector<std::pair<std::string, SparseAttentionConfig>> load_model_dir(const std::string& dir);

// Serialise as {"sparse_attention_config": {...}}; round-trips through parse().
std::string to_json(const SparseAttentionConfig& cfg);
// Insert/replace the block in an existing config.json (other keys preserved), or create the file.
void write_into(const std::string& config_json_path, const SparseAttentionConfig& cfg);

// The skip settings for one layer and phase. target overrides the file's target_sparsity. A layer
// matched by an ignore pattern, or by no group, gets SkipConfig{} (dense). Throws Error when the
// applicable group lacks what the phase needs (no scalar factor and no fit for that phase).
// With a "blasst" extension: the visit order and the phase's vote granularity come from it, and a
// richer form for the phase gives the factor (SkipConfig::factor = exp(log_factor(target))) in
// place of a * exp(b * target). Without it: the interop fit, natural order, default granularity.
SkipConfig resolve(const SparseAttentionConfig& cfg, const std::string& layer_name, Phase phase,
                   std::optional<double> target_sparsity = std::nullopt);
// The disabled_until_timestep of the group that applies to the layer (nullopt: no gating).
std::optional<double> disabled_until_timestep(const SparseAttentionConfig& cfg,
                                              const std::string& layer_name);

}  // namespace blasst::config
