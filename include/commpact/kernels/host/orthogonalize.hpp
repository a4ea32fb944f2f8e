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

#include "../../error.hpp"

namespace commpact::host {

//! Orthonormalises, in place, the `cols` columns of the column-major matrix `a`
//! (`rows` x `cols`, leading dimension `ld` >= rows) by Gram-Schmidt (the modified
//! variant, column by column) applied twice ("twice is enough": orthogonal to working
//! precision for any cols, also when the columns are nearly dependent). Dot products
//! and updates are computed in double.
//!
//! Defined result on degenerate input: a column that is zero, or that lies exactly
//! in the span of the columns before it (nothing is left after the projections), is
//! set to zero and the function never produces NaN from finite input. The nonzero
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
    for (int pass = 0; pass < 2; ++pass) {
      // Modified Gram-Schmidt: each coefficient from the column as updated so far.
      for (std::size_t k = 0; k < j; ++k) {
        const float* ck = a + k * ld;
        double dot = 0.0;
        for (std::size_t i = 0; i < rows; ++i) dot += static_cast<double>(ck[i]) * static_cast<double>(cj[i]);
        if (dot == 0.0) continue;
        for (std::size_t i = 0; i < rows; ++i)
          cj[i] = static_cast<float>(static_cast<double>(cj[i]) - dot * static_cast<double>(ck[i]));
      }
    }
    double nrm2 = 0.0;
    for (std::size_t i = 0; i < rows; ++i) nrm2 += static_cast<double>(cj[i]) * static_cast<double>(cj[i]);
    if (nrm2 > 0.0 && std::isfinite(nrm2)) {
      const double inv = 1.0 / std::sqrt(nrm2);
      for (std::size_t i = 0; i < rows; ++i) cj[i] = static_cast<float>(static_cast<double>(cj[i]) * inv);
      ++kept;
    } else if (nrm2 == 0.0) {
      for (std::size_t i = 0; i < rows; ++i) cj[i] = 0.0f;
    } else {
      // Non-finite: leave as is (propagates to the caller's finiteness check).
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
inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

//! Mixes several 64-bit words into one seed.
inline std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0, std::uint64_t d = 0) {
  std::uint64_t s = a;
  std::uint64_t h = splitmix64(s);
  s = h ^ b;
  h = splitmix64(s);
  s = h ^ c;
  h = splitmix64(s);
  s = h ^ d;
  return splitmix64(s);
}

//! Fills out with standard normal values drawn from `seed` (Box-Muller over
//! splitmix64, computed in double): the same seed gives the same bits on every rank.
inline void fill_gaussian(std::span<float> out, std::uint64_t seed) {
  std::uint64_t s = seed;
  constexpr double two_pi = 6.283185307179586476925286766559;
  for (std::size_t i = 0; i < out.size(); i += 2) {
    // u1 in (0, 1], u2 in [0, 1)
    const double u1 = (static_cast<double>(splitmix64(s) >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53;
    const double rad = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(rad * std::cos(two_pi * u2));
    if (i + 1 < out.size()) out[i + 1] = static_cast<float>(rad * std::sin(two_pi * u2));
  }
}

}  // namespace commpact::host
