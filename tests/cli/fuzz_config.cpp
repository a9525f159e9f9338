// libFuzzer target for the SPEC §7 config parser (built with -DBLASST_BUILD_FUZZ=ON and clang;
// see docs/config.md). Any input must either parse or raise blasst::Error: no crash, no other
// exception, no sanitizer report. What parses must also survive resolve() and a to_json round trip.
#include <cstddef>
#include <cstdint>
#include <string>

#include "blasst/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto cfg = blasst::config::parse(text, "fuzz");
    if (!cfg) return 0;
    for (const char* layer : {"blocks.0.attn1", "blocks.12.cross_attn", ""}) {
      for (auto phase : {blasst::Phase::prefill, blasst::Phase::decode}) {
        try {
          const blasst::SkipConfig skip = blasst::config::resolve(*cfg, layer, phase);
          // The factor of every form (the richer one per sequence length) must evaluate or raise.
          if (skip.enabled)
            for (std::int64_t L : {std::int64_t{1}, std::int64_t{4096}, std::int64_t{1} << 40}) {
              try {
                (void)blasst::resolve_lambda(skip, L);
              } catch (const blasst::Error&) {
              }
            }
        } catch (const blasst::Error&) {
        }
      }
      (void)blasst::config::disabled_until_timestep(*cfg, layer);
    }
    const std::string once = blasst::config::to_json(*cfg);
    const auto again = blasst::config::parse(once, "fuzz-roundtrip");
    if (!again || blasst::config::to_json(*again) != once) __builtin_trap();  // round trip broken
  } catch (const blasst::Error&) {
  }
  return 0;
}
