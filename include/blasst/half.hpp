// Host-side conversions between float and the 16-bit storage types (IEEE fp16, bfloat16).
// Round-to-nearest-even both ways; NaN and inf preserved.
#pragma once

#include <cstdint>
#include <cstring>

namespace blasst {

inline float bf16_to_float(std::uint16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  std::uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while ((man & 0x400u) == 0);
      u = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t float_to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u); // overflow -> inf
  if (a < 0x38800000u) {  // subnormal or zero in fp16
    if (a < 0x33000000u) return sign;  // rounds to zero
    const std::uint32_t man = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(a >> 23);  // 14..24
    std::uint32_t r = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = a - 0x38000000u;  // rebias exponent (127 -> 15)
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

}  // namespace blasst
