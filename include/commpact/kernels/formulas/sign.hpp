// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sign.hpp
//! The sign codec's per-element formulas and the sparse entry checks, written once for
//! the host codecs (compress/codecs/topk_sign.hpp: topk_codec, sign_codec) and their
//! device kernels (kernels/cuda/codecs.cuh, codecs_onebit.cuh, CHOCO's rows).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../../config.hpp"
#include "../exact.hpp"
#include "bits.hpp"

namespace commpact {

namespace detail {
//! topk_codec's check of one decoded entry: index j strictly above the previous one
//! (prev = -1 for the first) and in [0, n). Shared with the CUDA decoder (codecs.cuh).
COMMPACT_HOST_DEVICE inline bool sparse_index_ok(std::int32_t j, std::int64_t prev, std::uint64_t n) {
  return j > prev && static_cast<std::uint64_t>(j) < n;
}
//! True when v is neither NaN nor +-Inf (exponent bits not all set): std::isfinite,
//! written on the bits so that host and device test the same thing.
COMMPACT_HOST_DEVICE inline bool finite_bits(float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, 4);
  return (b & 0x7F800000u) != 0x7F800000u;
}

// sign_codec's per-element arithmetic, shared with its CUDA kernels (codecs.cuh).

//! |x| as a double (exact).
COMMPACT_HOST_DEVICE inline double abs_as_double(float x) { return static_cast<double>(x < 0.0f ? -x : x); }
//! Leaf i of ||v||_1: |v[i]| in double. sign_codec sums the leaves in kernels/fixed_sum.hpp's
//! shape (fixed_sum::add_double), which the device reproduces bit for bit in parallel.
struct sign_l1_leaf {
  const float* v;
  COMMPACT_HOST_DEVICE double operator()(std::size_t i) const { return abs_as_double(v[i]); }
};
//! The scale ||v||_1 / n, rounded to float (0 for n = 0; a NaN, from a NaN among the
//! values, which the compressor flags, as exact::canonical_nan's on host and device).
COMMPACT_HOST_DEVICE inline float sign_scale(double l1, std::size_t n) {
  return n ? exact::canonical_nan(static_cast<float>(l1 / static_cast<double>(n))) : 0.0f;
}
//! The sign bit sent for x: set for x < 0 and for a NaN with its sign bit, not for -0.
COMMPACT_HOST_DEVICE inline bool sign_negative(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  return (b >> 31) != 0u && (b & 0x7FFFFFFFu) != 0u;
}
//! Byte b of the sign bits of v[0, n): bit t for v[8b + t], least significant first.
COMMPACT_HOST_DEVICE inline unsigned char sign_byte(const float* v, std::size_t n, std::size_t b) {
  return bit_byte<sign_negative>(v, n, b);
}
//! The value a sign bit decodes to: scale with the sign bit flipped when set (a NaN scale
//! keeps its payload on the host and the device).
COMMPACT_HOST_DEVICE inline float sign_value(bool neg, float scale) { return exact::negate_if(neg, scale); }
//! A received scale is finite and >= 0.
COMMPACT_HOST_DEVICE inline bool sign_scale_ok(float s) { return finite_bits(s) && s >= 0.0f; }
//! The last byte of a message for n values sets no bit past the n-th.
COMMPACT_HOST_DEVICE inline bool sign_tail_ok(unsigned last, std::size_t n) {
  return n % 8 == 0 || (last >> (n % 8)) == 0u;
}
}  // namespace detail

}  // namespace commpact
