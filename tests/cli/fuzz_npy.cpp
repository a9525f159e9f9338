// libFuzzer target for the .npy header/payload parser (-DBLASST_BUILD_FUZZ=ON with clang).
// Any input must parse or raise blasst::Error; what parses must serialise back byte-consistently.
#include <cstddef>
#include <cstdint>

#include "blasst/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    // A small payload limit keeps the fuzzer from spending its memory on legitimate big arrays.
    const blasst::npy::Array a = blasst::npy::parse(data, size, "fuzz", 1 << 20);
    if (a.bytes.size() != static_cast<std::size_t>(a.numel()) * blasst::npy::elem_size(a.elem)) __builtin_trap();
    const auto img = blasst::npy::serialize(a);
    const blasst::npy::Array b = blasst::npy::parse(img.data(), img.size(), "fuzz-roundtrip", 1 << 20);
    if (b.shape != a.shape || b.bytes != a.bytes || b.elem != a.elem) __builtin_trap();
  } catch (const blasst::Error&) {
  }
  return 0;
}
