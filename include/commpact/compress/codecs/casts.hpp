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
#include "../../kernels/formulas/bits.hpp"
#include "../../kernels/formulas/casts.hpp"

namespace commpact {

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
//! A cast codec over a 16-bit format (kernels/formulas/casts.hpp: fp16_format,
//! bf16_format): 2 bytes per value, little-endian, each Format::to_code(v), which
//! saturates finite values; codes of Inf and NaN are malformed.
template <class Format>
struct cast16_codec : Format {
  using format = Format;
  const char* who;
  explicit cast16_codec(const char* name) : who(name) {}
  std::size_t max_encoded_bytes(std::size_t n) const { return 2 * n; }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) const {
    const std::size_t n = v.size();
    require(msg.size() >= 2 * n, "commpact::", who, "::encode: the message buffer holds ", msg.size(), " bytes; ", n,
            " values need ", 2 * n, ".");
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t h = Format::to_code(v[i]);
      std::memcpy(msg.data() + 2 * i, &h, 2);
      if (!approx.empty()) approx[i] = Format::from_code(h);
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
      if (!Format::finite_code(h))
        throw wire_error(detail::cat("commpact::", who, ": value ", i, " is Inf or NaN (code ", h,
                                     "); senders flag non-finite input instead of sending it."));
    }
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, msg.data() + 2 * i, 2);
      acc[i] += Format::from_code(h);
    }
  }
};
}  // namespace detail

//! IEEE 754 binary16 cast: 2n bytes; |v| above 65504 saturates (error feedback keeps the rest).
struct fp16_codec : detail::cast16_codec<detail::fp16_format> {
  fp16_codec() : cast16_codec("fp16_codec") {}
};
//! bfloat16 cast (float32's exponent, 8 mantissa bits): 2n bytes.
struct bf16_codec : detail::cast16_codec<detail::bf16_format> {
  bf16_codec() : cast16_codec("bf16_codec") {}
};

}  // namespace commpact
