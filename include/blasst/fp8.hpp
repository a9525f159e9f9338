// Host-side e4m3 (OCP FP8 E4M3, "fn") conversions, written from the format's definition
// (SPEC §2b): bits s eeee mmm, bias 7; e = 0: (-1)^s * m/8 * 2^-6; e = 1..15: (-1)^s * (1 + m/8) *
// 2^(e-7), except e = 15, m = 7 (0x7f, 0xff): NaN. Largest finite 448, no infinities.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace blasst {

// The FP8 screen's code range (SPEC §2b): scales fp32(max|x| / 16) and codes clamped to [-16, 16]
// before encoding, so |q8 . k8| <= 256 d: every partial sum of an FP8 score fits an f16
// accumulator (65504) at d <= 128 (the screen ahead accumulates in f16).
inline constexpr float kScreenCodeMax = 16.0f;

inline float e4m3_to_float(std::uint8_t c) {
  const int e = (c >> 3) & 0xf, m = c & 0x7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  // Both cases are m' * 2^(e' - 10) with an integer significand m' < 16: exact in float.
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(static_cast<float>(8 + m), e - 10);
  return (c & 0x80) ? -v : v;
}

// fp32 -> e4m3 as Hopper's cvt.rn.satfinite.e4m3x2.f32: NaN -> NaN (0x7f, sign kept); else round
// to nearest with ties to the even code, and saturate: |x| >= 448 (inf included) -> +-448.
inline std::uint8_t float_to_e4m3(float x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | 0x7f);
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return static_cast<std::uint8_t>(sign | 0x7e);
  if (a == 0.0) return sign;
  // Binade [2^be, 2^(be+1)) with be >= -6 (below 2^-6: the subnormals share be = -6); its
  // quantum is 2^(be-3). Codes are consecutive integers in magnitude order, so the code of
  // n quanta is ((be + 7) << 3) + n - 8 (n = 16 lands on the next binade's first code).
  int fe = 0;
  std::frexp(a, &fe);  // a = f * 2^fe, f in [0.5, 1)
  const int be = fe - 1 < -6 ? -6 : fe - 1;
  const double q = std::ldexp(a, 3 - be);  // exact: a in quanta
  double n = std::floor(q);
  const double r = q - n;
  if (r > 0.5 || (r == 0.5 && std::fmod(n, 2.0) != 0.0)) n += 1.0;
  const int code = ((be + 7) << 3) + static_cast<int>(n) - 8;  // <= 0x7e since a < 448
  return static_cast<std::uint8_t>(sign | code);
}

}  // namespace blasst
