// SPEC §7 configuration file (include/blasst/config.hpp, docs/config.md).
// Parsing is strict about what it understands (types, ranges, formula, algorithm) and names the
// JSON path of every problem; keys it does not know (checkpoint metadata such as
// "initial_disabled_steps") are ignored so that checkpoints written by other tools still load.
#include "blasst/config.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <memory>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/text.hpp"
#include "io/files.hpp"

namespace blasst::config {

namespace {

using json = nlohmann::ordered_json;  // keeps config_groups in file order (first match wins)
namespace fs = std::filesystem;

constexpr const char* kBlockKey = "sparse_attention_config";
// Limits on what a config may be (docs/config.md). Real configs are a few kB and 4-6 levels
// deep; the limits only keep hostile files from exhausting the stack, the memory or the time.
constexpr std::uint64_t kMaxConfigBytes = std::uint64_t{16} << 20;  // 16 MiB
constexpr std::size_t kMaxDepth = 64;                                // nested objects/arrays

using detail::member;
using detail::num;
using detail::single_quoted;

class Ctx {
 public:
  explicit Ctx(std::string source) : source_(std::move(source)) {}
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw Error(detail::printable(source_, 300) + ": " + path + ": " + what);
  }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

std::string type_name(const json& j) { return j.type_name(); }

double number(const Ctx& c, const json& j, const std::string& path) {
  if (!j.is_number()) c.fail(path, "expected a number, got " + type_name(j));
  const double v = j.get<double>();
  if (!std::isfinite(v)) c.fail(path, "must be finite");
  return v;
}

double positive(const Ctx& c, const json& j, const std::string& path) {
  const double v = number(c, j, path);
  if (!(v > 0)) c.fail(path, "must be > 0, got " + j.dump());
  return v;
}

double unit_interval(const Ctx& c, const json& j, const std::string& path) {
  const double v = number(c, j, path);
  if (v < 0 || v > 1) c.fail(path, "must lie in [0, 1], got " + j.dump());
  return v;
}

std::vector<std::string> string_list(const Ctx& c, const json& j, const std::string& path) {
  if (!j.is_array()) c.fail(path, "expected a list of strings, got " + type_name(j));
  std::vector<std::string> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string())
      c.fail(path + "[" + std::to_string(i) + "]", "expected a string, got " + type_name(j[i]));
    out.push_back(j[i].get<std::string>());
  }
  return out;
}

std::string strip_spaces(const std::string& s) {
  std::string out;
  for (char ch : s)
    if (!std::isspace(static_cast<unsigned char>(ch))) out.push_back(ch);
  return out;
}

Calibration calibration(const Ctx& c, const json& j, const std::string& path) {
  if (!j.is_object()) c.fail(path, "expected an object {\"a\": ..., \"b\": ...}, got " + type_name(j));
  if (!j.contains("a")) c.fail(path + ".a", "missing");
  if (!j.contains("b")) c.fail(path + ".b", "missing");
  Calibration cal;
  cal.a = positive(c, j["a"], path + ".a");
  cal.b = number(c, j["b"], path + ".b");
  return cal;
}

bool present(const json& obj, const char* key) { return obj.contains(key) && !obj[key].is_null(); }

// An integer in [lo, hi] (JSON integers only: 64.0 or 6.4e1 is a float, refused).
int integer(const Ctx& c, const json& j, const std::string& path, long long lo, long long hi) {
  const auto range = [&] {
    c.fail(path, "must lie in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + j.dump());
  };
  if (j.is_number_unsigned()) {  // nlohmann: every non-negative integer
    const unsigned long long v = j.get<unsigned long long>();
    if (v > static_cast<unsigned long long>(hi) || static_cast<long long>(v) < lo) range();
    return static_cast<int>(v);
  }
  if (j.is_number_integer()) {
    const long long v = j.get<long long>();
    if (v < lo || v > hi) range();
    return static_cast<int>(v);
  }
  c.fail(path, "expected an integer, got " +
                   (j.is_number() ? "the non-integer number " + j.dump() : type_name(j)));
}

std::vector<double> number_list(const Ctx& c, const json& j, const std::string& path) {
  if (!j.is_array()) c.fail(path, "expected a list of numbers, got " + type_name(j));
  if (j.size() > PiecewiseLogFactor::kMaxKnots)
    c.fail(path, "has " + std::to_string(j.size()) + " entries; the limit is " +
                     std::to_string(PiecewiseLogFactor::kMaxKnots));
  std::vector<double> out;
  for (std::size_t i = 0; i < j.size(); ++i) out.push_back(number(c, j[i], path + "[" + std::to_string(i) + "]"));
  return out;
}

constexpr long long kIntMax = 2147483647;

VoteGranularity vote_granularity(const Ctx& c, const json& j, const std::string& path) {
  if (!j.is_object()) c.fail(path, "expected an object {\"tile_keys\", \"rows\", \"heads\", \"split_tiles\"}, got " + type_name(j));
  VoteGranularity v;
  for (const char* key : {"tile_keys", "rows", "heads", "split_tiles"})
    if (!present(j, key)) c.fail(path + "." + key, "missing");
  v.tile_keys = integer(c, j["tile_keys"], path + ".tile_keys", 1, kIntMax);
  v.rows = integer(c, j["rows"], path + ".rows", 1, kIntMax);
  v.heads = integer(c, j["heads"], path + ".heads", 1, kIntMax);
  v.split_tiles = integer(c, j["split_tiles"], path + ".split_tiles", 0, kIntMax);
  return v;
}

MaskKind mask_kind(const Ctx& c, const json& j, const std::string& path) {
  if (!j.is_string()) c.fail(path, "expected \"causal\" or \"full\", got " + type_name(j));
  const std::string m = j.get<std::string>();
  if (m == "causal") return MaskKind::causal;
  if (m == "full") return MaskKind::full;
  c.fail(path, "unknown mask " + single_quoted(m) + " (supported: causal, full)");
}

PiecewiseLogFactor piecewise(const Ctx& c, const json& j, const std::string& path, bool prefill) {
  if (!j.is_object())
    c.fail(path, "expected an object {\"target_sparsity\": [...], \"log_factor\": [...]}, got " + type_name(j));
  if (!present(j, "target_sparsity")) c.fail(path + ".target_sparsity", "missing");
  if (!present(j, "log_factor")) c.fail(path + ".log_factor", "missing");
  PiecewiseLogFactor f;
  f.targets = number_list(c, j["target_sparsity"], path + ".target_sparsity");
  f.log_factors = number_list(c, j["log_factor"], path + ".log_factor");
  if (present(j, "finite_size")) {
    const std::string p = path + ".finite_size";
    const json& t = j["finite_size"];
    if (!prefill) c.fail(p, "is defined for the prefill phase only (Lq = Lk)");
    if (!t.is_object()) c.fail(p, "expected an object {\"mask\", \"rows\", \"tile_keys\"}, got " + type_name(t));
    for (const char* key : {"mask", "rows", "tile_keys"})
      if (!present(t, key)) c.fail(p + "." + key, "missing");
    f.finite_size = FiniteSizeTerm{mask_kind(c, t["mask"], p + ".mask"), integer(c, t["rows"], p + ".rows", 1, kIntMax),
                                   integer(c, t["tile_keys"], p + ".tile_keys", 1, kIntMax)};
  }
  try {
    validate(f);  // sizes, ranges, strictly increasing targets, non-decreasing log factors
  } catch (const Error& e) {
    const std::string m = e.what();
    // validate() names the list it found wrong first ("target_sparsity[2] ..."): make it a path.
    if (m.rfind("target_sparsity", 0) == 0 || m.rfind("log_factor", 0) == 0) c.fail(path + "." + m.substr(0, m.find(' ')), m.substr(m.find(' ') + 1));
    c.fail(path, m);
  }
  return f;
}

BlasstExtension extension(const Ctx& c, const json& j, const std::string& path) {
  if (!j.is_object()) c.fail(path, "expected an object, got " + type_name(j));
  BlasstExtension ext;
  if (present(j, "visit_order")) {
    const json& o = j["visit_order"];
    if (!o.is_string()) c.fail(path + ".visit_order", "expected \"max_first\" or \"natural\", got " + type_name(o));
    const std::string v = o.get<std::string>();
    if (v == "max_first")
      ext.visit_order = VisitOrder::max_first;
    else if (v == "natural")
      ext.visit_order = VisitOrder::natural;
    else
      c.fail(path + ".visit_order", "unknown visit order " + single_quoted(v) + " (supported: max_first, natural)");
  }
  if (present(j, "vote")) {
    const std::string p = path + ".vote";
    const json& v = j["vote"];
    if (!v.is_object()) c.fail(p, "expected an object {\"prefill\": ..., \"decode\": ...}, got " + type_name(v));
    if (present(v, "prefill")) ext.vote_prefill = vote_granularity(c, v["prefill"], p + ".prefill");
    if (present(v, "decode")) ext.vote_decode = vote_granularity(c, v["decode"], p + ".decode");
    const VisitOrder order = ext.visit_order.value_or(VisitOrder::natural);
    if (ext.vote_prefill) ext.vote_prefill->order = order;
    if (ext.vote_decode) ext.vote_decode->order = order;
  }
  if (present(j, "threshold_scale_factor")) {
    const std::string p = path + ".threshold_scale_factor";
    const json& t = j["threshold_scale_factor"];
    if (!t.is_object()) c.fail(p, "expected an object (form + per-phase knots), got " + type_name(t));
    if (!present(t, "form")) c.fail(p + ".form", std::string("missing (expected \"") + kPiecewiseForm + "\")");
    if (!t["form"].is_string()) c.fail(p + ".form", "expected a string, got " + type_name(t["form"]));
    const std::string form = t["form"].get<std::string>();
    if (form != kPiecewiseForm)
      c.fail(p + ".form", "unknown form " + single_quoted(form) + " (supported: \"" + kPiecewiseForm + "\")");
    if (present(t, "prefill")) ext.prefill = piecewise(c, t["prefill"], p + ".prefill", true);
    if (present(t, "decode")) ext.decode = piecewise(c, t["decode"], p + ".decode", false);
    if (!ext.prefill && !ext.decode) c.fail(p, "needs a \"prefill\" or \"decode\" form");
  }
  return ext;
}

json vote_json(const VoteGranularity& v) {
  json j = json::object();
  j["tile_keys"] = v.tile_keys;
  j["rows"] = v.rows;
  j["heads"] = v.heads;
  j["split_tiles"] = v.split_tiles;
  return j;
}

json piecewise_json(const PiecewiseLogFactor& f) {
  json j = json::object();
  j["target_sparsity"] = f.targets;
  j["log_factor"] = f.log_factors;
  if (f.finite_size) {
    json t = json::object();
    t["mask"] = to_string(f.finite_size->mask);
    t["rows"] = f.finite_size->rows;
    t["tile_keys"] = f.finite_size->tile_keys;
    j["finite_size"] = t;
  }
  return j;
}

json extension_json(const BlasstExtension& e, const std::string& group) {
  json j = json::object();
  if (e.visit_order) j["visit_order"] = to_string(*e.visit_order);
  if (e.vote_prefill || e.vote_decode) {
    json v = json::object();
    if (e.vote_prefill) v["prefill"] = vote_json(*e.vote_prefill);
    if (e.vote_decode) v["decode"] = vote_json(*e.vote_decode);
    j["vote"] = v;
  }
  if (e.prefill || e.decode) {
    json t = json::object();
    t["form"] = kPiecewiseForm;
    for (const auto* f : {&e.prefill, &e.decode})
      if (*f) {
        try {
          validate(**f);
        } catch (const Error& err) {
          throw Error("config::to_json: group " + single_quoted(group) + ": blasst." +
                      (f == &e.prefill ? "prefill" : "decode") + " form: " + err.what());
        }
      }
    if (e.prefill) t["prefill"] = piecewise_json(*e.prefill);
    if (e.decode) t["decode"] = piecewise_json(*e.decode);
    j["threshold_scale_factor"] = t;
  }
  return j;
}

ConfigGroup parse_group(const Ctx& c, const std::string& name, const json& g, const std::string& path) {
  if (!g.is_object()) c.fail(path, "expected an object, got " + type_name(g));
  ConfigGroup out;
  out.name = name;
  if (present(g, "algorithm")) {
    if (!g["algorithm"].is_string()) c.fail(path + ".algorithm", "expected a string");
    out.algorithm = g["algorithm"].get<std::string>();
    if (out.algorithm != "skip_softmax")
      c.fail(path + ".algorithm", "unknown algorithm " + single_quoted(out.algorithm) + " (supported: skip_softmax)");
  }
  if (present(g, "threshold_scale_factor")) {
    const std::string p = path + ".threshold_scale_factor";
    const json& t = g["threshold_scale_factor"];
    if (t.is_number()) {
      out.threshold_scale_factor.scalar = positive(c, t, p);
    } else if (t.is_object()) {
      if (!present(t, "formula")) c.fail(p + ".formula", std::string("missing (expected \"") + kFormula + "\")");
      if (!t["formula"].is_string()) c.fail(p + ".formula", "expected a string");
      const std::string f = t["formula"].get<std::string>();
      // Whitespace is the only liberty taken: any other spelling is a different formula.
      if (strip_spaces(f) != strip_spaces(kFormula))
        c.fail(p + ".formula", "unknown formula " + single_quoted(f) + " (supported: \"" + kFormula + "\")");
      if (present(t, "prefill")) out.threshold_scale_factor.prefill = calibration(c, t["prefill"], p + ".prefill");
      if (present(t, "decode")) out.threshold_scale_factor.decode = calibration(c, t["decode"], p + ".decode");
      if (!out.threshold_scale_factor.prefill && !out.threshold_scale_factor.decode)
        c.fail(p, "needs a \"prefill\" or \"decode\" fit");
    } else {
      c.fail(p, "expected a number (raw factor) or an object (formula + fits), got " + type_name(t));
    }
  }
  if (present(g, "target_sparsity")) {
    const std::string p = path + ".target_sparsity";
    const json& t = g["target_sparsity"];
    if (t.is_number()) {  // one target for both phases
      out.target_sparsity_prefill = out.target_sparsity_decode = unit_interval(c, t, p);
    } else if (t.is_object()) {
      if (present(t, "prefill")) out.target_sparsity_prefill = unit_interval(c, t["prefill"], p + ".prefill");
      if (present(t, "decode")) out.target_sparsity_decode = unit_interval(c, t["decode"], p + ".decode");
    } else {
      c.fail(p, "expected a number or an object {\"prefill\": s, \"decode\": s}, got " + type_name(t));
    }
  }
  if (present(g, "disabled_until_timestep"))
    out.disabled_until_timestep =
        unit_interval(c, g["disabled_until_timestep"], path + ".disabled_until_timestep");
  if (present(g, "ignore")) out.ignore = string_list(c, g["ignore"], path + ".ignore");
  if (present(g, "layers")) out.layers = string_list(c, g["layers"], path + ".layers");
  if (present(g, "blasst")) out.blasst = extension(c, g["blasst"], path + ".blasst");
  return out;
}

SparseAttentionConfig parse_block(const Ctx& c, const json& block, const std::string& path) {
  if (!block.is_object()) c.fail(path, "expected an object, got " + type_name(block));
  if (!block.contains("config_groups")) c.fail("config_groups", "missing");
  const json& groups = block["config_groups"];
  if (!groups.is_object()) c.fail("config_groups", "expected an object, got " + type_name(groups));
  SparseAttentionConfig cfg;
  for (auto it = groups.begin(); it != groups.end(); ++it)
    cfg.groups.push_back(parse_group(c, it.key(), it.value(), member("config_groups", it.key())));
  return cfg;
}

json block_json(const SparseAttentionConfig& cfg) {
  json groups = json::object();
  // Names checked against a hash set and appended: ordered_json's own insertion searches the
  // object linearly, which made serialising many groups quadratic.
  auto& items = static_cast<json::object_t::Container&>(groups.get_ref<json::object_t&>());
  std::unordered_set<std::string> names;
  for (const ConfigGroup& g : cfg.groups) {
    if (g.name.empty()) throw Error("config::to_json: a group has an empty name");
    if (!names.insert(g.name).second)
      throw Error("config::to_json: duplicate group name " + single_quoted(g.name));
    json j = json::object();
    j["algorithm"] = g.algorithm;
    const ThresholdScaleFactor& t = g.threshold_scale_factor;
    if (t.scalar) {
      j["threshold_scale_factor"] = *t.scalar;
    } else if (t.prefill || t.decode) {
      json tj = json::object();
      tj["formula"] = kFormula;
      if (t.prefill) tj["prefill"] = {{"a", t.prefill->a}, {"b", t.prefill->b}};
      if (t.decode) tj["decode"] = {{"a", t.decode->a}, {"b", t.decode->b}};
      j["threshold_scale_factor"] = tj;
    }
    if (g.target_sparsity_prefill || g.target_sparsity_decode) {
      json tj = json::object();
      if (g.target_sparsity_prefill) tj["prefill"] = *g.target_sparsity_prefill;
      if (g.target_sparsity_decode) tj["decode"] = *g.target_sparsity_decode;
      j["target_sparsity"] = tj;
    }
    if (g.disabled_until_timestep) j["disabled_until_timestep"] = *g.disabled_until_timestep;
    if (!g.ignore.empty()) j["ignore"] = g.ignore;
    if (!g.layers.empty()) j["layers"] = g.layers;
    if (g.blasst) j["blasst"] = extension_json(*g.blasst, g.name);
    items.emplace_back(g.name, std::move(j));
  }
  json block = json::object();
  block["config_groups"] = groups;
  return block;
}

// Builds the document from nlohmann's SAX events. json::parse into an ordered_json would do the
// same but (1) inserts every key with a linear search of its object (quadratic in the number of
// config groups: 200k groups took minutes) and (2) deep-copies the members already parsed
// whenever an object's storage grows (ordered_map's pair<const string, json> cannot be moved),
// which recursed through deeply nested values until the stack overflowed. Here an object's
// members are collected in a movable buffer and moved into place once, at its closing brace;
// keys are checked for duplicates (a hash set once an object is large); and nesting stops at
// kMaxDepth. Duplicate keys are refused: JSON leaves their meaning open, a config must not be
// ambiguous.
class BoundedDom final : public nlohmann::json_sax<json> {
 public:
  BoundedDom(json& root, const std::string& source) : root_(root), source_(source) {}

  bool null() override { return put(json(nullptr)); }
  bool boolean(bool v) override { return put(json(v)); }
  bool number_integer(number_integer_t v) override { return put(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return put(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return put(json(v)); }
  bool string(string_t& v) override { return put(json(std::move(v))); }
  bool binary(binary_t&) override { fail(path(), "binary values are not JSON"); }
  bool start_object(std::size_t) override { return open(json::object()); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool key(string_t& k) override {
    Frame& f = stack_.back();
    // The member is appended now with a null value (insert() fills it in), so that the hash set
    // holds indices into the members instead of copies of the keys.
    Members& m = *f.members;
    m.emplace_back(std::move(k), json());
    const std::size_t n = m.size();
    bool duplicate = false;
    if (n <= kLinearKeys) {
      for (std::size_t i = 0; i + 1 < n; ++i) duplicate = duplicate || m[i].first == m.back().first;
    } else {
      if (f.keys.empty())
        for (std::size_t i = 0; i + 1 < n; ++i) f.keys.insert(i);
      duplicate = !f.keys.insert(n - 1).second;
    }
    if (duplicate) {
      const std::string name = m.back().first;
      m.pop_back();
      fail(path(), "duplicate key " + single_quoted(name));
    }
    return true;
  }
  bool end_object() override {
    Members& m = *stack_.back().members;
    stack_.back().value->get_ref<json::object_t&>() =
        json::object_t(std::make_move_iterator(m.begin()), std::make_move_iterator(m.end()));
    stack_.pop_back();
    return true;
  }
  bool end_array() override {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    // e.what() quotes the offending token, which may be long or hold any byte.
    throw Error(detail::printable(source_, 300) + ": invalid JSON: " + detail::printable(e.what(), 300));
  }

 private:
  static constexpr std::size_t kLinearKeys = 16;  // up to this many members: a linear check
  using Members = std::vector<std::pair<std::string, json>>;
  // Member indices hashed and compared by their keys.
  struct KeyHash {
    const Members* m;
    std::size_t operator()(std::size_t i) const { return std::hash<std::string>{}((*m)[i].first); }
  };
  struct KeyEq {
    const Members* m;
    bool operator()(std::size_t a, std::size_t b) const { return (*m)[a].first == (*m)[b].first; }
  };
  struct Frame {
    explicit Frame(json* v)
        : value(v), members(std::make_unique<Members>()), keys(0, KeyHash{members.get()}, KeyEq{members.get()}) {}
    json* value;
    std::unique_ptr<Members> members;  // objects: moved into *value at the closing brace
    std::unordered_set<std::size_t, KeyHash, KeyEq> keys;  // objects with many members
  };

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw Error(detail::printable(source_, 300) + ": " + where + ": " + what);
  }
  // The JSON path of the innermost open container, built only for a message: an open child is
  // always its parent's last member or element.
  std::string path() const {
    std::string p = "<root>";
    for (std::size_t i = 1; i < stack_.size(); ++i) {
      const Frame& parent = stack_[i - 1];
      if (parent.value->is_object())
        p += member("", parent.members->back().first);
      else
        p += "[" + std::to_string(parent.value->size() - 1) + "]";
    }
    // 64 levels of long keys would make a 5 kB line: keep both ends.
    if (p.size() > 240)
      p = detail::printable(p.substr(0, 110), 110) + " ... " + detail::printable(p.substr(p.size() - 110), 110);
    return p;
  }
  // Stores v in the current container; the pointer stays valid while v is the open container
  // (its parent does not grow until v is closed).
  json* insert(json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Frame& f = stack_.back();
    if (f.value->is_object()) {
      json& slot = f.members->back().second;  // appended by key()
      slot = std::move(v);
      return &slot;
    }
    auto& items = f.value->get_ref<json::array_t&>();
    items.push_back(std::move(v));
    return &items.back();
  }
  bool put(json&& v) {
    insert(std::move(v));
    return true;
  }
  bool open(json&& container) {
    if (stack_.size() >= kMaxDepth)
      fail(path(), "nested deeper than " + std::to_string(kMaxDepth) + " levels (the limit for a config)");
    stack_.emplace_back(insert(std::move(container)));
    return true;
  }

  json& root_;
  const std::string& source_;
  std::vector<Frame> stack_;
};

std::string read_text(const std::string& path) { return io::read_file(path, kMaxConfigBytes); }

json parse_json(const std::string& text, const std::string& source) {
  if (text.size() > kMaxConfigBytes)
    throw Error(detail::printable(source, 300) + ": too large (" + std::to_string(text.size()) +
                " bytes; the limit is " + std::to_string(kMaxConfigBytes) + " bytes)");
  json root;
  BoundedDom dom(root, source);
  try {
    json::sax_parse(text, &dom);
  } catch (const json::exception& e) {  // defensive: sax_parse reports through parse_error()
    throw Error(detail::printable(source, 300) + ": invalid JSON: " + detail::printable(e.what(), 300));
  }
  return root;
}

bool matches(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) {
    return ::fnmatch(p.c_str(), name.c_str(), 0) == 0;
  });
}

// The group that applies to a layer: the first whose `layers` patterns match (empty = all).
const ConfigGroup* group_for(const SparseAttentionConfig& cfg, const std::string& layer) {
  for (const ConfigGroup& g : cfg.groups)
    if (g.layers.empty() || matches(g.layers, layer)) return &g;
  return nullptr;
}

}  // namespace

std::optional<SparseAttentionConfig> parse(const std::string& json_text, const std::string& source_name) {
  const Ctx c(source_name);
  const json root = parse_json(json_text, source_name);
  if (!root.is_object()) c.fail("<root>", "expected a JSON object, got " + type_name(root));
  if (root.contains(kBlockKey)) {
    if (root[kBlockKey].is_null()) return std::nullopt;
    return parse_block(c, root[kBlockKey], kBlockKey);
  }
  if (root.contains("config_groups")) return parse_block(c, root, "<root>");  // the bare block
  return std::nullopt;
}

std::optional<SparseAttentionConfig> load_file(const std::string& path) {
  return parse(read_text(path), path);
}

std::vector<std::pair<std::string, SparseAttentionConfig>> load_model_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(detail::printable(dir, 300) + ": not a directory");
  std::vector<std::pair<std::string, SparseAttentionConfig>> out;
  // A single-model checkpoint keeps config.json at the top: component ".".
  const fs::path top = fs::path(dir) / "config.json";
  if (fs::is_regular_file(top, ec))
    if (auto cfg = load_file(top.string())) out.emplace_back(".", std::move(*cfg));
  std::vector<fs::path> subs;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec) && fs::is_regular_file(e.path() / "config.json", ec)) subs.push_back(e.path());
  if (ec) throw Error(detail::printable(dir, 300) + ": cannot list: " + ec.message());
  std::sort(subs.begin(), subs.end());
  for (const fs::path& p : subs)
    if (auto cfg = load_file((p / "config.json").string()))
      out.emplace_back(p.filename().string(), std::move(*cfg));
  return out;
}

std::string to_json(const SparseAttentionConfig& cfg) {
  json root = json::object();
  root[kBlockKey] = block_json(cfg);
  return root.dump(2) + "\n";
}

void write_into(const std::string& config_json_path, const SparseAttentionConfig& cfg) {
  json root = json::object();
  std::error_code ec;
  if (fs::exists(config_json_path, ec)) {
    root = parse_json(read_text(config_json_path), config_json_path);
    if (!root.is_object())
      throw Error(detail::printable(config_json_path, 300) + ": expected a JSON object at the top level");
  }
  root[kBlockKey] = block_json(cfg);
  // Written next to the target and renamed: a failure never leaves a half-written config.json.
  io::OutputFile f(config_json_path);
  f.stage(root.dump(2) + "\n");
  f.commit();
}

SkipConfig resolve(const SparseAttentionConfig& cfg, const std::string& layer_name, Phase phase,
                   std::optional<double> target_sparsity) {
  if (target_sparsity && !(*target_sparsity >= 0.0 && *target_sparsity <= 1.0))
    throw Error("target_sparsity must lie in [0, 1], got " + num(*target_sparsity));
  const ConfigGroup* g = group_for(cfg, layer_name);
  if (g == nullptr || matches(g->ignore, layer_name)) return SkipConfig{};
  const std::string where = member("config_groups", g->name);
  SkipConfig out;
  out.enabled = true;
  const bool pre = phase == Phase::prefill;
  const BlasstExtension* ext = g->blasst ? &*g->blasst : nullptr;
  if (ext) {
    // The calibration's visit order (absent: natural, SPEC §2a) and the phase's vote granularity.
    const auto& vote = pre ? ext->vote_prefill : ext->vote_decode;
    if (vote) out.vote = *vote;
    out.vote.order = ext->visit_order.value_or(VisitOrder::natural);
  }
  if (g->threshold_scale_factor.scalar) {  // a raw factor wins over any target (SPEC §7)
    out.factor = *g->threshold_scale_factor.scalar;
    return out;
  }
  const std::string phase_name = pre ? "prefill" : "decode";
  const auto& fit = pre ? g->threshold_scale_factor.prefill : g->threshold_scale_factor.decode;
  const auto* form = ext ? (pre ? &ext->prefill : &ext->decode) : nullptr;
  if (form && *form) {  // the richer form of the extension wins over the interop fit
    const auto& file_target = pre ? g->target_sparsity_prefill : g->target_sparsity_decode;
    if (!target_sparsity && !file_target)
      throw Error(where + ": no target_sparsity for the " + phase_name + " phase; give one (--target-sparsity)");
    out.piecewise = **form;
    out.target_sparsity = target_sparsity ? *target_sparsity : *file_target;
    // Checked here, where the group is known, for the knots' own target (the per-sequence
    // finite-size conversion is checked by resolve_lambda).
    const double factor = std::exp((*form)->log_factor(out.target_sparsity));
    if (!std::isfinite(factor) || !(factor > 0.0))
      throw Error(where + ".blasst.threshold_scale_factor." + phase_name + ": exp(log_factor(" +
                  num(out.target_sparsity) + ")) = " + num(factor) + " is not a finite positive factor");
    return out;
  }
  if (!fit)
    throw Error(where + ": no threshold_scale_factor for the " + phase_name + " phase (layer " +
                single_quoted(layer_name) + ")");
  const auto& file_target = pre ? g->target_sparsity_prefill : g->target_sparsity_decode;
  if (!target_sparsity && !file_target)
    throw Error(where + ": no target_sparsity for the " + phase_name + " phase; give one (--target-sparsity)");
  out.calibration = *fit;
  out.target_sparsity = target_sparsity ? *target_sparsity : *file_target;
  // Checked here, where the group is known: a fit such as b = 1e300 overflows for any target > 0.
  const double factor = fit->a * std::exp(fit->b * out.target_sparsity);
  if (!std::isfinite(factor) || !(factor > 0.0))
    throw Error(where + ".threshold_scale_factor." + phase_name + ": a * exp(b * target_sparsity) = " +
                num(factor) + " (a = " + num(fit->a) + ", b = " + num(fit->b) + ", target_sparsity = " +
                num(out.target_sparsity) + ") is not a finite positive factor");
  return out;
}

std::optional<double> disabled_until_timestep(const SparseAttentionConfig& cfg, const std::string& layer_name) {
  const ConfigGroup* g = group_for(cfg, layer_name);
  if (g == nullptr) return std::nullopt;
  return g->disabled_until_timestep;
}

}  // namespace blasst::config
