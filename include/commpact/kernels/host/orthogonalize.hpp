// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file orthogonalize.hpp
//! Host kernels for low-rank compression: orthonormalisation of the columns of a
//! tall matrix, and a portable seeded Gaussian generator.
//!
//! Both are written as plain loops with a fixed order of operations (accumulation in
//! double), so that they give bit-identical results on every rank whatever the
//! alignment of the buffers, the SIMD width or the library underneath. PowerSGD and
//! PowerGossip rely on this: every rank orthonormalises the same allreduced (or
//! exchanged) factor and must get the same bits.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "../../config.hpp"
#include "../../error.hpp"
#include "../fixed_sum.hpp"
#include "simd.hpp"

namespace commpact::host {

//! The per-element formulas of orthonormalize_columns, shared with the CUDA rows
//! (kernels/cuda/rows_power.cuh) so that both compute the same bits: one IEEE operation
//! each, the product rounded before the difference (never fused into an FMA, whatever
//! the host's -march: simd::opaque; __dmul_rn / __dsub_rn on the device).
//!
//! Leaf i of a Gram-Schmidt dot product: double(a[i]) double(b[i]) (the product of two
//! floats is exact in double). A dot product is the sum of its leaves in double in
//! kernels/fixed_sum.hpp's shape, which the CUDA rows add in parallel in one block.
struct gs_dot_leaf {
  const float* a;
  const float* b;
  COMMPACT_HOST_DEVICE double operator()(std::size_t i) const {
    return fixed_sum::exact_product(static_cast<double>(a[i]), static_cast<double>(b[i]));
  }
};

//! The dot product of a[0, rows) and b[0, rows) in double (gs_dot_leaf's fixed-shape sum).
inline double gs_dot(const float* a, const float* b, std::size_t rows) {
  return fixed_sum::host_sum<double>(rows, gs_dot_leaf{a, b}, fixed_sum::add_double{});
}
//! One element of a projection: float(double(c) - dot double(k)), the product rounded first.
COMMPACT_HOST_DEVICE inline float gs_sub(float c, double dot, float k) {
#if defined(__CUDA_ARCH__)
  return __double2float_rn(__dsub_rn(static_cast<double>(c), __dmul_rn(dot, static_cast<double>(k))));
#else
  double p = dot * static_cast<double>(k);
  simd::opaque(p);
  return static_cast<float>(static_cast<double>(c) - p);
#endif
}
//! One element of a normalisation: float(double(c) inv).
COMMPACT_HOST_DEVICE inline float gs_scale(float c, double inv) {
#if defined(__CUDA_ARCH__)
  return __double2float_rn(__dmul_rn(static_cast<double>(c), inv));
#else
  return static_cast<float>(static_cast<double>(c) * inv);
#endif
}

//! The normalising factor 1 / sqrt(nrm2) (both operations correctly rounded everywhere).
COMMPACT_HOST_DEVICE inline double gs_inv_norm(double nrm2) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(1.0, __dsqrt_rn(nrm2));
#else
  return 1.0 / std::sqrt(nrm2);
#endif
}

//! True when a column whose squared norm was `nrm2_before` lies numerically in the span
//! of the j columns before it: what the two Gram-Schmidt passes left of it (`nrm2`) is at
//! most (j + 1) 2^-36 of it, a norm ratio of sqrt(j + 1) 2^-18. Rounding alone leaves a
//! ratio of about 0.6 sqrt(j) 2^-24 (measured for 16 to 4096 rows and j up to 128), so
//! the margin is about 100; a genuine direction that small is rounding-level information
//! (PowerCompressor's error feedback keeps it). Normalised, such a remainder would be a
//! unit vector that is not orthogonal to the others where P has exact zero rows (its
//! rounding stays in the same subspace), and P P^T would not be a projection.
COMMPACT_HOST_DEVICE inline bool gs_dependent(double nrm2, double nrm2_before, std::size_t j) {
  const double tol = static_cast<double>(j + 1) * 0x1p-36;  // exact
#if defined(__CUDA_ARCH__)
  return nrm2 <= __dmul_rn(nrm2_before, tol);
#else
  return nrm2 <= nrm2_before * tol;
#endif
}

//! Orthonormalises, in place, the `cols` columns of the column-major matrix `a`
//! (`rows` x `cols`, leading dimension `ld` >= rows) by Gram-Schmidt (the modified
//! variant, column by column) applied twice ("twice is enough": orthogonal to working
//! precision for any cols, also when the columns are nearly dependent). Dot products
//! and updates are computed in double, the dot products in kernels/fixed_sum.hpp's shape
//! (gs_dot), which the CUDA rows reproduce in parallel.
//!
//! Defined result on degenerate input: a column that is zero, or that lies in the span of
//! the columns before it (exactly, or to rounding: gs_dependent), is set to zero and the
//! function never produces NaN from finite input. The nonzero
//! columns of the result are orthonormal and orthogonal to each other; so
//! `A A^T` is always an orthogonal projection (onto a smaller space when columns were
//! zeroed). Returns the number of nonzero (unit) columns.
//!
//! Non-finite input propagates (NaN in, NaN out); callers check before.
inline int orthonormalize_columns(float* a, std::size_t rows, std::size_t cols, std::size_t ld) {
  require(ld >= rows, "commpact::host::orthonormalize_columns: leading dimension ", ld, " is smaller than rows = ", rows,
          "; pass ld >= rows.");
  int kept = 0;
  for (std::size_t j = 0; j < cols; ++j) {
    float* cj = a + j * ld;
    const double before = j > 0 ? gs_dot(cj, cj, rows) : 0.0;
    for (int pass = 0; pass < 2; ++pass) {
      // Modified Gram-Schmidt: each coefficient from the column as updated so far.
      for (std::size_t k = 0; k < j; ++k) {
        const float* ck = a + k * ld;
        const double dot = gs_dot(ck, cj, rows);
        if (dot == 0.0) continue;
        for (std::size_t i = 0; i < rows; ++i) cj[i] = gs_sub(cj[i], dot, ck[i]);
      }
    }
    const double nrm2 = gs_dot(cj, cj, rows);
    if (!std::isfinite(nrm2)) {
      // Non-finite: leave as is (propagates to the caller's finiteness check).
    } else if (nrm2 == 0.0 || (j > 0 && gs_dependent(nrm2, before, j))) {
      for (std::size_t i = 0; i < rows; ++i) cj[i] = 0.0f;
    } else {
      const double inv = gs_inv_norm(nrm2);
      for (std::size_t i = 0; i < rows; ++i) cj[i] = gs_scale(cj[i], inv);
      ++kept;
    }
  }
  return kept;
}

//! Contiguous overload: `a` holds rows x cols column-major.
inline int orthonormalize_columns(std::span<float> a, std::size_t rows, std::size_t cols) {
  require(a.size() == rows * cols, "commpact::host::orthonormalize_columns: the span holds ", a.size(),
          " values; a ", rows, " x ", cols, " matrix needs ", rows * cols, ".");
  return orthonormalize_columns(a.data(), rows, cols, rows);
}

//! True when column j of the column-major rows x cols matrix is exactly zero.
inline bool column_is_zero(const float* a, std::size_t rows, std::size_t j, std::size_t ld) {
  const float* c = a + j * ld;
  for (std::size_t i = 0; i < rows; ++i)
    if (c[i] != 0.0f) return false;
  return true;
}

//! splitmix64: a portable 64-bit mixer (same sequence on every platform and compiler).
COMMPACT_HOST_DEVICE inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

//! Mixes several 64-bit words into one seed.
COMMPACT_HOST_DEVICE inline std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0,
                                                   std::uint64_t d = 0) {
  std::uint64_t s = a;
  std::uint64_t h = splitmix64(s);
  s = h ^ b;
  h = splitmix64(s);
  s = h ^ c;
  h = splitmix64(s);
  s = h ^ d;
  return splitmix64(s);
}

//! Pair p of the Gaussian stream of `seed` (values 2p and 2p + 1 of fill_gaussian):
//! Box-Muller over the splitmix64 outputs 2p + 1 and 2p + 2 of the state `seed` (state
//! seed + k golden after k calls), computed in double. Shared by the host loop and the
//! CUDA rows. The same bits on both sides need the same log, sqrt, cos and sin: sqrt is
//! correctly rounded everywhere, but CUDA's double log (1 ulp) and cos/sin (2 ulp) are
//! not glibc's, so a value can differ in the last bit of the float when the two double
//! results round to floats apart (about 2^-28 of the values; kernels/cuda/rows_power.cuh).
COMMPACT_HOST_DEVICE inline void gaussian_pair(std::uint64_t seed, std::uint64_t p, float& first, float& second) {
  std::uint64_t s = seed + 2 * p * 0x9E3779B97F4A7C15ull;
  const std::uint64_t a = splitmix64(s), b = splitmix64(s);
  constexpr double two_pi = 6.283185307179586476925286766559;
  // u1 in (0, 1], u2 in [0, 1); one IEEE operation per step (no fusable a + b c).
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  const double ang = two_pi * u2;
#if defined(__CUDA_ARCH__)
  const double rad = ::sqrt(-2.0 * ::log(u1));
  first = static_cast<float>(rad * ::cos(ang));
  second = static_cast<float>(rad * ::sin(ang));
#else
  const double rad = std::sqrt(-2.0 * std::log(u1));
  first = static_cast<float>(rad * std::cos(ang));
  second = static_cast<float>(rad * std::sin(ang));
#endif
}

//! Fills out with standard normal values drawn from `seed` (Box-Muller over
//! splitmix64, computed in double; gaussian_pair): the same seed gives the same bits on
//! every rank.
inline void fill_gaussian(std::span<float> out, std::uint64_t seed) {
  for (std::size_t i = 0; i < out.size(); i += 2) {
    float a, b;
    gaussian_pair(seed, i / 2, a, b);
    out[i] = a;
    if (i + 1 < out.size()) out[i + 1] = b;
  }
}

}  // namespace commpact::host
