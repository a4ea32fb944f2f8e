// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file casts.hpp
//! Codecs that keep every value but fewer bits of it (see the table in quantizers.hpp):
//! natural compression (stochastic rounding to a power of two) and the fp16 and bf16
//! casts (round to nearest, ties to even). Included by quantizers.hpp.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

#include "../../config.hpp"
#include "../../error.hpp"
#include "../../kernels/exact.hpp"
#include "bits.hpp"

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
}  // namespace detail

//! Natural compression (Horvath et al., 2019): |v_i| in [2^a, 2^(a+1)) becomes 2^(a+1)
//! with probability |v_i| / 2^a - 1, else 2^a (unbiased); below 2^-126 the neighbours
//! are 0 and 2^-126; at or above 2^127 it is 2^127 (saturated). Field i (9 bits): the
//! exponent code e in the low 8 bits (0: zero, 1..254: 2^(e - 127), 255 malformed), the
//! sign above (0 when e = 0). detail::natural_field, on the float's bits, is shared with
//! the CUDA kernels.
class natural_codec {
 public:
  explicit natural_codec(std::uint64_t seed = 0) : seed_(seed) {}
  void begin_step(std::int64_t step) { step_ = step; }
  void bind_rank(int rank) { rank_ = rank; }
  std::size_t max_encoded_bytes(std::size_t n) const { return detail::packed_bytes(n, 9); }
  //! The magnitude of exponent code e (1..254).
  static float power(std::uint32_t e) { return std::ldexp(1.0f, static_cast<int>(e) - 127); }
  //! The random stream of the current step and rank (the CUDA kernels replay it).
  random_stream stream() const { return random_stream(seed_, step_, rank_); }

  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) const {
    const std::size_t n = v.size(), bytes = max_encoded_bytes(n);
    require(msg.size() >= bytes, "commpact::natural_codec::encode: the message buffer holds ", msg.size(),
            " bytes; ", n, " values need ", bytes, ".");
    const random_stream rng = stream();
    detail::bit_writer w(msg.data());
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t f = detail::natural_field(v[i], rng.uniform(i));
      w.put(f, 9);
      if (!approx.empty()) approx[i] = detail::natural_value(f);
    }
    w.flush();
    return bytes;
  }

  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    const std::size_t n = acc.size();
    require<wire_error>(msg.size() == max_encoded_bytes(n), "commpact::natural_codec: the message has ", msg.size(),
                        " bytes; a vector of ", n, " values needs exactly ", max_encoded_bytes(n), ".");
    detail::bit_reader check(msg.data());
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t f = check.get(9), e = f & 0xFFu;
      if (!detail::natural_field_ok(f))
        throw wire_error(detail::cat("commpact::natural_codec: field ", i, " holds exponent code ", e, " with sign bit ",
                                     f >> 8, "; codes are in [0, 254] and code 0 (zero) carries no sign."));
    }
    require<wire_error>(detail::padding_is_zero(msg, n, 9), "commpact::natural_codec: the message sets bits past its ",
                        n, " fields.");
    detail::bit_reader r(msg.data());
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t f = r.get(9);
      if (f & 0xFFu) acc[i] += detail::natural_value(f);
    }
  }

 private:
  std::uint64_t seed_;
  std::int64_t step_ = 0;
  int rank_ = 0;
};

namespace detail {
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

//! A cast codec: 2 bytes per value, little-endian; codes of Inf and NaN are malformed.
template <std::uint16_t (*To)(float), float (*From)(std::uint16_t), std::uint16_t ExpMask,
          std::uint16_t (*Round)(float)>
struct cast16_codec {
  const char* who;
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
  std::size_t max_encoded_bytes(std::size_t n) const { return 2 * n; }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) const {
    const std::size_t n = v.size();
    require(msg.size() >= 2 * n, "commpact::", who, "::encode: the message buffer holds ", msg.size(), " bytes; ", n,
            " values need ", 2 * n, ".");
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t h = To(v[i]);
      std::memcpy(msg.data() + 2 * i, &h, 2);
      if (!approx.empty()) approx[i] = From(h);
    }
    return 2 * n;
  }
  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    const std::size_t n = acc.size();
    require<wire_error>(msg.size() == 2 * n, "commpact::", who, ": the message has ", msg.size(),
                        " bytes; a vector of ", n, " values needs exactly ", 2 * n, ".");
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, msg.data() + 2 * i, 2);
      if ((h & ExpMask) == ExpMask)
        throw wire_error(detail::cat("commpact::", who, ": value ", i, " is Inf or NaN (code ", h,
                                     "); senders flag non-finite input instead of sending it."));
    }
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, msg.data() + 2 * i, 2);
      acc[i] += From(h);
    }
  }
};
}  // namespace detail

//! IEEE 754 binary16 cast: 2n bytes; |v| above 65504 saturates (error feedback keeps the rest).
struct fp16_codec : detail::cast16_codec<detail::to_half, detail::from_half, 0x7C00u, detail::to_half_ieee> {
  fp16_codec() : cast16_codec{"fp16_codec"} {}
};
//! bfloat16 cast (float32's exponent, 8 mantissa bits): 2n bytes.
struct bf16_codec : detail::cast16_codec<detail::to_bf16, detail::from_bf16, 0x7F80u, detail::to_bf16_ieee> {
  bf16_codec() : cast16_codec{"bf16_codec"} {}
};

}  // namespace commpact
