// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file quantizers.hpp
//! The quantisers' per-element formulas (QSGD, TernGrad, 1-bit SGD), written once for the
//! host codecs (compress/codecs/quantizers.hpp) and their device kernels
//! (kernels/cuda/codecs_qsgd.cuh, codecs.cuh, codecs_onebit.cuh): the same arithmetic,
//! each product and sum rounded on its own, on the host and on the device.

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "../../config.hpp"
#include "../exact.hpp"
#include "../fixed_sum.hpp"
#include "bits.hpp"

namespace commpact {

namespace detail {
// QSGD's per-element arithmetic, shared with its CUDA kernels (kernels/cuda/codecs_qsgd.cuh):
// every product and sum rounded on its own (the device's __dmul_rn / __dadd_rn, no FMA).
COMMPACT_HOST_DEVICE inline double qsgd_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
//! Leaf i of a bucket's sum of squares: x^2 in double, x = v[i]. A bucket's leaves are
//! added in kernels/fixed_sum.hpp's shape with the levels of a full bucket
//! (fixed_sum::levels(d)), which the device reproduces bit for bit, a block per node.
struct qsgd_sq_leaf {
  const float* v;
  COMMPACT_HOST_DEVICE double operator()(std::size_t i) const {
    const auto d = static_cast<double>(v[i]);
    return fixed_sum::exact_product(d, d);
  }
};
//! A bucket's norm from its sum of squares: sqrt, saturated at the largest float
//! (finite_scale); a NaN (a NaN in the bucket: the compressor flags that input) as
//! exact::canonical_nan's, so that host and device write the same bits.
COMMPACT_HOST_DEVICE inline float qsgd_norm(double ss) {
#if defined(__CUDA_ARCH__)
  const double r = ::sqrt(ss);
#else
  const double r = std::sqrt(ss);
#endif
  constexpr double big = 0x1.fffffep127;  // std::numeric_limits<float>::max()
  return exact::canonical_nan(static_cast<float>(big < r ? big : r));
}
//! s / norm (0 for a zero norm).
COMMPACT_HOST_DEVICE inline double qsgd_scale(float norm, std::uint32_t s) {
  return norm > 0.0f ? static_cast<double>(s) / static_cast<double>(norm) : 0.0;
}
//! The level of x: floor(r) or floor(r) + 1 with probability r - floor(r) (u uniform),
//! r = |x| scale, at most s. A NaN r (x NaN, or Inf under the zero scale of a bucket
//! whose norm is NaN) gives level 0, on the host and the device alike (converting a NaN
//! to an integer is undefined, and a GPU's min may return the other operand).
COMMPACT_HOST_DEVICE inline std::uint32_t qsgd_level(float x, double scale, std::uint32_t s, double u) {
  const double r = qsgd_mul(static_cast<double>(x < 0.0f ? -x : x), scale);
  if (!(r >= 0.0)) return 0;
#if defined(__CUDA_ARCH__)
  const double f = ::floor(r);
#else
  const double f = std::floor(r);
#endif
  auto l = static_cast<std::uint32_t>(static_cast<double>(s) < f ? static_cast<double>(s) : f);
  if (l < s && u < r - l) ++l;
  return l;
}
//! The value a receiver decodes for level l (sign apart) under norm `norm` (a NaN norm,
//! which only the sender's approximation sees, gives exact::canonical_nan's NaN).
COMMPACT_HOST_DEVICE inline float qsgd_value(float norm, std::uint32_t l, std::uint32_t s) {
  return exact::canonical_nan(
      static_cast<float>(qsgd_mul(static_cast<double>(norm), static_cast<double>(l)) / static_cast<double>(s)));
}
}  // namespace detail


namespace detail {
// TernGrad's per-element arithmetic, shared with its CUDA kernels (kernels/cuda/codecs.cuh).
//! The running maximum of |x| as std::max(m, |x|) takes it (a NaN leaves m).
COMMPACT_HOST_DEVICE inline float terngrad_max(float m, float x) {
  const float a = x < 0.0f ? -x : x;
  return m < a ? a : m;
}
//! Field of x under scale m with uniform u: 0 (zero), 1 (+m) or 2 (-m); on with
//! probability |x| / m.
COMMPACT_HOST_DEVICE inline unsigned terngrad_field(float x, float m, double u) {
  const double ax = static_cast<double>(x < 0.0f ? -x : x);
  const double p = m > 0.0f ? ax / static_cast<double>(m) : 0.0;
  const bool on = u < p;
  return on ? (x < 0.0f ? 2u : 1u) : 0u;
}
//! The value a field decodes to (0 for field 0).
COMMPACT_HOST_DEVICE inline float terngrad_value(unsigned f, float m) { return f == 0u ? 0.0f : (f == 2u ? -m : m); }
}  // namespace detail


namespace detail {
// onebit_codec's arithmetic, shared with its CUDA kernels (kernels/cuda/codecs_onebit.cuh).

//! The side of x: set for x < 0 (not for -0 or a NaN), on the bits.
COMMPACT_HOST_DEVICE inline bool onebit_negative(float x) {
  const std::uint32_t b = exact::bits(x);
  return (b >> 31) != 0u && (b & 0x7FFFFFFFu) != 0u && (b & 0x7FFFFFFFu) <= 0x7F800000u;
}
//! The sums in double of the values on one side and on the other, and the count of the
//! values on the non-negative side. onebit_codec adds them over v in kernels/fixed_sum.hpp's
//! shape (onebit_leaf, onebit_add), which the device reproduces bit for bit in parallel.
struct onebit_sums {
  double sp = 0.0, sn = 0.0;
  std::uint64_t np = 0;
};
//! Leaf i: v[i] on its side (counted on the non-negative side), 0 on the other.
struct onebit_leaf {
  const float* v;
  COMMPACT_HOST_DEVICE onebit_sums operator()(std::size_t i) const {
    const float x = v[i];
    if (onebit_negative(x)) return {0.0, static_cast<double>(x), 0};
    return {static_cast<double>(x), 0.0, 1};
  }
};
//! The addition of two onebit_sums, field by field.
struct onebit_add {
  COMMPACT_HOST_DEVICE onebit_sums operator()(const onebit_sums& a, const onebit_sums& b) const {
    return {exact::add(a.sp, b.sp), exact::add(a.sn, b.sn), a.np + b.np};
  }
};
//! min(x, the largest float) as a float (finite_scale, on the host and the device).
COMMPACT_HOST_DEVICE inline float onebit_finite(double x) {
  constexpr double big = 0x1.fffffep127;
  return static_cast<float>(big < x ? big : x);
}
//! The two reconstruction values from the sums over all n values: the mean of the
//! non-negative side (0 when empty) and of the negative side (0 when empty); a NaN (a NaN
//! among the values: the compressor flags that input, the frame is never decoded) as
//! exact::canonical_nan's, so that host and device write the same bits.
COMMPACT_HOST_DEVICE inline void onebit_means(const onebit_sums& s, std::size_t n, float* a, float* b) {
  *a = exact::canonical_nan(s.np ? onebit_finite(s.sp / static_cast<double>(s.np)) : 0.0f);
  *b = exact::canonical_nan(s.np < n ? -onebit_finite(-s.sn / static_cast<double>(n - s.np)) : 0.0f);
}
//! Received reconstruction values are finite, the first >= 0 and the second <= 0.
COMMPACT_HOST_DEVICE inline bool onebit_means_ok(float a, float b) {
  return exact::finite(a) && exact::finite(b) && a >= 0.0f && b <= 0.0f;
}
//! Byte j of the side bits of v[0, n): bit t for v[8j + t], least significant first.
COMMPACT_HOST_DEVICE inline unsigned char onebit_byte(const float* v, std::size_t n, std::size_t j) {
  return bit_byte<onebit_negative>(v, n, j);
}
}  // namespace detail

}  // namespace commpact
