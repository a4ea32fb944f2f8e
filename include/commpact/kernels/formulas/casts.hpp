// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file casts.hpp
//! The 16-bit casts and natural compression's field, written once for the host codecs
//! (compress/codecs/casts.hpp: natural_codec, fp16_codec, bf16_codec), the host kernels
//! (kernels/host/half.hpp, bf16.hpp, cast.hpp) and the device kernels
//! (kernels/cuda/codecs.cuh, codecs_natural.cuh, rows_cast_vote.cuh). COMMPACT_HOST_DEVICE
//! and written in kernels/exact.hpp's operations, so host and device give the same bits.

#include <cstdint>

#include "../../config.hpp"
#include "../exact.hpp"

namespace commpact {

namespace detail {
// natural_codec's per-element arithmetic on the float's bits, shared with its CUDA kernels
// (kernels/cuda/codecs_natural.cuh): the same field on the host and on the device.

//! Field of x (sign << 8 | exponent code) with uniform u: for |x| = (1 + f) 2^(E - 127),
//! E in [1, 253], code E + 1 with probability f, else E; below 2^-126 (E = 0) code 1 with
//! probability |x| 2^126, else 0; E = 254 and +-Inf saturate to 254; zero and NaN give 0.
COMMPACT_HOST_DEVICE inline std::uint32_t natural_field(float x, double u) {
  const std::uint32_t b = exact::bits(x), ax = b & 0x7FFFFFFFu, ex = ax >> 23;
  std::uint32_t lo = 0;
  double p = 0.0;  // probability of rounding up to code lo + 1 (exact: the 23 bits below the exponent)
  if (ax > 0x7F800000u || ax == 0) {
    // NaN, +-0: code 0
  } else if (ex == 0) {
    p = static_cast<double>(ax) * 0x1.0p-23;  // |x| 2^126
  } else if (ex >= 254) {
    lo = 254;  // at or above 2^127 (Inf included): saturated
  } else {
    lo = ex;
    p = static_cast<double>(ax & 0x7FFFFFu) * 0x1.0p-23;  // |x| / 2^(E - 127) - 1
  }
  const std::uint32_t e = (p > 0.0 && u < p) ? lo + 1 : lo;
  return e | ((e != 0 && (b >> 31) != 0) ? 0x100u : 0u);
}
//! The value field f decodes to: 0 for code 0, else +-2^(code - 127).
COMMPACT_HOST_DEVICE inline float natural_value(std::uint32_t f) {
  const std::uint32_t e = f & 0xFFu;
  return e ? exact::from_bits(((f >> 8) << 31) | (e << 23)) : 0.0f;
}
//! A received field is well formed: code at most 254, no sign on code 0.
COMMPACT_HOST_DEVICE inline bool natural_field_ok(std::uint32_t f) {
  const std::uint32_t e = f & 0xFFu;
  return e != 255u && (e != 0 || f == 0);
}

// The casts below are COMMPACT_HOST_DEVICE and written in kernels/exact.hpp's operations,
// so CastAllreduce's device rows (kernels/cuda/rows_cast_vote.cuh) run this very code.

//! float -> IEEE half, round to nearest even, finite values saturated at +-65504.
COMMPACT_HOST_DEVICE inline std::uint16_t to_half(float f) {
  const std::uint32_t x = exact::bits(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0u));
  if (ax < 0x38800000u) {  // below 2^-14: a half subnormal m 2^-24 (m = 1024 is the smallest normal)
    // Adding 0.5 puts m in the low mantissa bits (float's unit there is 2^-24), rounded
    // to nearest even by the addition itself: the same m as nearbyint(|f| 2^24), without
    // a library call (the demo's gradients are mostly half subnormals).
    const float t = exact::add(exact::from_bits(ax), 0.5f);
    return static_cast<std::uint16_t>(sign | (exact::bits(t) - 0x3F000000u));
  }
  const std::uint32_t mant = ax & 0x7FFFFFu;
  std::uint32_t h = ((((ax >> 23) - 127 + 15)) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | (h < 0x7BFFu ? h : 0x7BFFu));
}
COMMPACT_HOST_DEVICE inline float from_half(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {
    const float v = exact::mul(static_cast<float>(m), 0x1.0p-24f);  // exact
    return sign ? -v : v;
  }
  if (e == 0x1Fu) return exact::from_bits(sign | 0x7F800000u | (m << 13));  // Inf, NaN
  return exact::from_bits(sign | ((e - 15 + 127) << 23) | (m << 13));
}
//! float -> bfloat16 (the top half), round to nearest even, finite values saturated.
COMMPACT_HOST_DEVICE inline std::uint16_t to_bf16(float f) {
  const std::uint32_t x = exact::bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // NaN stays NaN
  if ((x & 0x7FFFFFFFu) == 0x7F800000u) return static_cast<std::uint16_t>(x >> 16);
  const std::uint32_t r = x + 0x7FFFu + ((x >> 16) & 1u);
  auto b = static_cast<std::uint16_t>(r >> 16);
  if ((b & 0x7FFFu) == 0x7F80u) b = static_cast<std::uint16_t>((b & 0x8000u) | 0x7F7Fu);
  return b;
}
COMMPACT_HOST_DEVICE inline float from_bf16(std::uint16_t b) {
  return exact::from_bits(static_cast<std::uint32_t>(b) << 16);
}

//! float -> binary16 as IEEE arithmetic rounds a result: to nearest even, overflowing to
//! Inf (to_half saturates finite values instead: a codec's choice, not arithmetic's).
COMMPACT_HOST_DEVICE inline std::uint16_t to_half_ieee(float f) {
  const std::uint32_t ax = exact::bits(f) & 0x7FFFFFFFu;
  // |f| >= 65520 (0x477FF000) and finite (<= FLT_MAX, 0x7F7FFFFF): rounds past 65504 (0x7BFF).
  if (ax >= 0x477FF000u && ax <= 0x7F7FFFFFu)
    return static_cast<std::uint16_t>((exact::bits(f) >> 16 & 0x8000u) | 0x7C00u);
  return to_half(f);
}
//! float -> bfloat16 as IEEE arithmetic rounds: to nearest even, overflowing to Inf.
COMMPACT_HOST_DEVICE inline std::uint16_t to_bf16_ieee(float f) {
  const std::uint32_t x = exact::bits(f);
  if ((x & 0x7FFFFFFFu) >= 0x7F800000u) return to_bf16(f);
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

//! A 16-bit float format as the cast codecs and CastAllreduce use it: To makes a value's
//! code (saturating finite values), From decodes it, ExpMask is the exponent field (all
//! set: Inf or NaN, malformed on the wire) and Round rounds as IEEE arithmetic does.
template <std::uint16_t (*To)(float), float (*From)(std::uint16_t), std::uint16_t ExpMask,
          std::uint16_t (*Round)(float)>
struct cast16_format {
  //! One value's code (what encode writes): To, which saturates finite values.
  COMMPACT_HOST_DEVICE static std::uint16_t to_code(float v) { return To(v); }
  COMMPACT_HOST_DEVICE static float from_code(std::uint16_t h) { return From(h); }
  //! False for the codes of Inf and NaN.
  COMMPACT_HOST_DEVICE static bool finite_code(std::uint16_t h) { return (h & ExpMask) != ExpMask; }
  //! a + b in the 16-bit format: the float sum (exact, or off by less than a quarter of
  //! the format's unit in the last place, so never a double rounding) rounded once to
  //! nearest even, overflowing to Inf: IEEE 754 addition in the 16-bit type.
  COMMPACT_HOST_DEVICE static std::uint16_t add(std::uint16_t a, std::uint16_t b) {
    return Round(exact::add(From(a), From(b)));
  }
};
//! IEEE 754 binary16 (fp16_codec's format).
using fp16_format = cast16_format<to_half, from_half, 0x7C00u, to_half_ieee>;
//! bfloat16 (bf16_codec's format).
using bf16_format = cast16_format<to_bf16, from_bf16, 0x7F80u, to_bf16_ieee>;
}  // namespace detail

}  // namespace commpact
