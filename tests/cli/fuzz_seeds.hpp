// Generated seed inputs for the fuzz targets (issue 21): the cases a fuzzer's small mutations
// never reach on their own -- nesting far beyond the config depth limit, hundreds of thousands of
// groups, the size limits, duplicate keys, hostile names, .npy headers at their limits. Too large
// to commit; fuzz_replay.cpp runs them (ctest FuzzReplay.*) and writes them for libFuzzer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace blasst::fuzz_seeds {

struct Seed {
  std::string name;
  std::string bytes;
};

// large: the full-size cases (150k levels, 200k groups, 16 MiB + 1); otherwise sizes a fuzzer
// can still mutate quickly (tens of kB).
inline std::vector<Seed> config_seeds(bool large) {
  std::vector<Seed> out;
  const std::string block = R"J({"sparse_attention_config": {"config_groups": {"g": {"threshold_scale_factor": 3}}})J";
  auto nested = [&](std::size_t levels, bool objects) {
    std::string s = block.substr(0, block.size() - 1) + R"J(, "meta": )J";
    for (std::size_t i = 0; i < levels; ++i) s += objects ? R"J({"a": )J" : "[";
    if (objects) s += "1";
    s.append(levels, objects ? '}' : ']');
    return s + R"J(, "sibling": 1})J";
  };
  for (std::size_t levels : {std::size_t{62}, std::size_t{63}, std::size_t{64}, std::size_t{65}})
    out.push_back({"nested_" + std::to_string(levels), nested(levels, false)});
  for (std::size_t levels : large ? std::vector<std::size_t>{10000, 150000} : std::vector<std::size_t>{2000})
    for (bool objects : {false, true})
      out.push_back({std::string(objects ? "deep_objects_" : "deep_arrays_") + std::to_string(levels),
                     nested(levels, objects)});
  // Deep nesting inside the block itself (a group value, a fit, a layer list).
  std::string deep_group = R"J({"config_groups": {"g": {"threshold_scale_factor": {"formula": )J";
  deep_group.append(large ? 100000 : 1000, '[');
  out.push_back({"deep_unclosed_formula", deep_group});
  // Many groups (under the 16 MiB limit): fitted groups with every field, and compact ones.
  for (int n : large ? std::vector<int>{50000} : std::vector<int>{1000}) {
    std::string s = R"J({"sparse_attention_config": {"config_groups": {)J";
    for (int i = 0; i < n; ++i)
      s += (i ? ", " : "") + std::string("\"group_") + std::to_string(i) +
           R"J(": {"threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)", "prefill": {"a": )J" +
           std::to_string(i + 1) + R"J(, "b": 2}}, "target_sparsity": 0.5, "layers": ["blocks.)J" +
           std::to_string(i) + R"J(.*"], "ignore": ["*cross*"]})J";
    out.push_back({"groups_" + std::to_string(n), s + "}}}"});
  }
  if (large) {
    std::string s = R"J({"config_groups": {)J";
    for (int i = 0; i < 200000; ++i)
      s += (i ? ", " : "") + std::string("\"g") + std::to_string(i) + R"J(": {"threshold_scale_factor": )J" +
           std::to_string(i + 1) + R"J(, "layers": ["b.)J" + std::to_string(i) + R"J(.*"]})J";
    out.push_back({"compact_groups_200000", s + "}}"});
  }
  out.push_back({"duplicate_group", R"J({"config_groups": {"g": {"threshold_scale_factor": 1}, "g": {"threshold_scale_factor": 2}}})J"});
  out.push_back({"duplicate_root", R"J({"sparse_attention_config": null, "sparse_attention_config": {"config_groups": {}}})J"});
  out.push_back({"hostile_names", R"J({"config_groups": {"g\n\u001b[2J\u0000": {"algorithm": "top\u0007k", "layers": ["\u202e"]}}})J"});
  out.push_back({"long_name", R"J({"config_groups": {")J" + std::string(large ? 100000 : 5000, 'n') +
                                  R"J(": {"algorithm": ")J" + std::string(large ? 100000 : 5000, 'a') + R"J("}}})J"});
  out.push_back({"overflowing_fit", R"J({"config_groups": {"g": {"threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)",
      "prefill": {"a": 1e300, "b": 1e300}, "decode": {"a": 5e-324, "b": -1e300}}, "target_sparsity": 1}}})J"});
  out.push_back({"huge_number", R"J({"config_groups": {"g": {"threshold_scale_factor": 1e99999999999}}})J"});
  if (large) {
    std::string big = block;
    big.append((std::size_t{16} << 20) + 1 - big.size(), ' ');
    out.push_back({"over_size_limit", big});
    big.pop_back();
    out.push_back({"at_size_limit", big});
  }
  return out;
}

inline std::string npy_image(const std::string& dict, std::size_t payload, int major = 1) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string d = dict;
  d.append((64 - (prefix + d.size() + 1) % 64) % 64, ' ');
  d.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  const std::size_t hl = d.size();
  out.push_back(static_cast<char>(hl & 0xff));
  out.push_back(static_cast<char>((hl >> 8) & 0xff));
  if (major > 1) {
    out.push_back(static_cast<char>((hl >> 16) & 0xff));
    out.push_back(static_cast<char>((hl >> 24) & 0xff));
  }
  out += d;
  out.append(payload, '\x01');
  return out;
}

inline std::vector<Seed> npy_seeds(bool large) {
  std::vector<Seed> out;
  const std::string pre = "{'descr': '<f4', 'fortran_order': False, 'shape': ";
  std::string dims32 = "(", dims33 = "(";
  for (int i = 0; i < 32; ++i) dims32 += "1, ";
  for (int i = 0; i < 33; ++i) dims33 += "1, ";
  out.push_back({"dims_32", npy_image(pre + dims32 + ")}", 4)});
  out.push_back({"dims_33", npy_image(pre + dims33 + ")}", 4)});
  out.push_back({"shape_overflow", npy_image(pre + "(4294967296, 4294967296, 4294967296)}", 0)});
  out.push_back({"lying_size", npy_image(pre + "(1000000000,)}", 16)});
  std::string padded = pre + "(2,)}";
  padded.append(10000 - 12 - padded.size(), ' ');
  out.push_back({"header_at_limit", npy_image(padded, 8, 2)});
  padded.append(200, ' ');
  out.push_back({"header_over_limit", npy_image(padded, 8, 2)});
  std::string nul = "{'descr': '<f";
  nul += '\0';
  nul += "', 'fortran_order': False, 'shape': (1,)}";
  out.push_back({"nul_descr", npy_image(nul, 4)});
  out.push_back({"escape_key", npy_image("{'\x1b[2J': 1}", 0)});
  out.push_back({"long_string", npy_image("{'descr': '" + std::string(60, 'x') + "', 'fortran_order': False, 'shape': (1,)}", 4)});
  out.push_back({"v3_hlen_max", std::string("\x93NUMPY\x03\x00\xff\xff\xff\xff", 12)});
  if (large) out.push_back({"payload_1M", npy_image(pre + "(262144,)}", std::size_t{1} << 20)});
  return out;
}

}  // namespace blasst::fuzz_seeds
