// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file density.hpp
//! The density -> k rule of the sparsifiers, below the kernels so that random-k's index
//! draw (randomk.hpp here) and the codecs (compress/codecs/sparse_options.hpp) share it.

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace commpact {
namespace detail {

//! THE density -> k rule of every sparsifier (TopK, gTopK, topk_codec, random-k, the
//! threshold codecs' caps): k = clamp(floor(d n), 1, n), as GRACE (`max(1, int(n *
//! ratio))`) and Shi et al.'s gTop-k and Gaussian-k code compute it. A product within a
//! relative 1e-14 below an integer counts as that integer (d n in double is off by at
//! most about 2.2e-16 relative), so that 0.29 x 100 (28.999999999999996 in binary
//! floating point) gives 29, not 28; the margin stays below 2.2e-5 for n < 2^31, so a
//! density with up to four significant decimals is floored exactly. n <= 0 gives 0; d is
//! checked by the caller (a NaN d gives 1).
inline std::int64_t k_of_density(double d, std::int64_t n) {
  if (n <= 0) return 0;
  const double x = d * static_cast<double>(n);
  if (!(x >= 1.0)) return 1;  // also NaN
  if (x >= static_cast<double>(n)) return n;
  const auto k = static_cast<std::int64_t>(std::floor(x + 1e-14 * x));
  return std::clamp<std::int64_t>(k, 1, n);
}

}  // namespace detail
}  // namespace commpact
