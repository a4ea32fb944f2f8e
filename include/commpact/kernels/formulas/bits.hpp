// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file bits.hpp
//! Building blocks of the quantising codecs: a little-endian bit stream of fixed-width
//! fields, and a counter-based random stream that every rank can replay.
//!
//! Bit stream: field j of width w occupies bits [j w, (j + 1) w) of the byte string,
//! bit b being bit (b mod 8) of byte b / 8, low bits first; the unused bits of the last
//! byte are zero (decoders reject a message that sets them).
//!
//! Random stream: `random_stream{seed, step, rank}.uniform(i)` is a double in [0, 1)
//! that depends only on (seed, step, rank, i): splitmix64's finaliser applied to a key
//! mixed from the three, plus i times the golden ratio constant, top 53 bits. Stochastic
//! rounding with it is reproducible on any machine, any thread count, and in a
//! brute-force reference.

#include <cstddef>
#include <cstdint>
#include <span>

#include "../../config.hpp"

namespace commpact {

//! splitmix64's finaliser: a bijective 64-bit mixer.
COMMPACT_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

//! Uniform doubles in [0, 1) indexed by element, keyed by (seed, step, rank).
struct random_stream {
  std::uint64_t key = 0;
  COMMPACT_HOST_DEVICE constexpr random_stream(std::uint64_t seed, std::int64_t step, int rank)
      : key(mix64(mix64(mix64(seed) ^ static_cast<std::uint64_t>(step)) ^
                  (static_cast<std::uint64_t>(static_cast<std::uint32_t>(rank)) + 0x9E3779B97F4A7C15ull))) {}
  //! The i-th uniform of this stream.
  COMMPACT_HOST_DEVICE constexpr double uniform(std::uint64_t i) const {
    return static_cast<double>(mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull) >> 11) * 0x1.0p-53;
  }
};

namespace detail {

//! Byte j of the bits Set(v[i]) of v[0, n): bit t for v[8j + t], least significant first,
//! zero past n (the sign bytes of sign_codec and onebit_codec, host and device).
template <bool (*Set)(float)>
COMMPACT_HOST_DEVICE inline unsigned char bit_byte(const float* v, std::size_t n, std::size_t j) {
  unsigned m = 0;
  for (unsigned t = 0; t < 8; ++t) {
    const std::size_t i = 8 * j + t;
    if (i < n && Set(v[i])) m |= 1u << t;
  }
  return static_cast<unsigned char>(m);
}

//! Bytes of `count` fields of `width` bits.
constexpr std::size_t packed_bytes(std::size_t count, unsigned width) { return (count * width + 7) / 8; }

//! Writes fixed-width fields (width <= 32) low bits first.
class bit_writer {
 public:
  explicit bit_writer(std::byte* out) : p_(out) {}
  void put(std::uint32_t field, unsigned width) {
    acc_ |= static_cast<std::uint64_t>(field) << used_;
    used_ += width;
    while (used_ >= 8) {
      *p_++ = static_cast<std::byte>(acc_ & 0xFFu);
      acc_ >>= 8;
      used_ -= 8;
    }
  }
  //! Writes the last partial byte (zero-padded).
  void flush() {
    if (used_) *p_++ = static_cast<std::byte>(acc_ & 0xFFu);
    acc_ = 0, used_ = 0;
  }

 private:
  std::byte* p_;
  std::uint64_t acc_ = 0;
  unsigned used_ = 0;
};

//! Reads what bit_writer wrote; the caller checked the message length.
class bit_reader {
 public:
  explicit bit_reader(const std::byte* in) : p_(in) {}
  std::uint32_t get(unsigned width) {
    while (have_ < width) {
      acc_ |= static_cast<std::uint64_t>(static_cast<unsigned char>(*p_++)) << have_;
      have_ += 8;
    }
    const auto v = static_cast<std::uint32_t>(acc_ & ((std::uint64_t{1} << width) - 1));
    acc_ >>= width;
    have_ -= width;
    return v;
  }
  //! The bits read into the accumulator but not consumed (the padding after the last field).
  std::uint64_t rest() const { return acc_; }

 private:
  const std::byte* p_;
  std::uint64_t acc_ = 0;
  unsigned have_ = 0;
};

//! True when the bits past `count` fields of `width` bits in msg are all zero.
inline bool padding_is_zero(std::span<const std::byte> msg, std::size_t count, unsigned width) {
  const std::size_t bits = count * width;
  if (bits % 8 == 0) return true;
  return (static_cast<unsigned>(msg[bits / 8]) >> (bits % 8)) == 0u;
}

}  // namespace detail
}  // namespace commpact
