// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file thresholds.hpp
//! The threshold sparsifiers' per-element formulas: the selection test, Gaussian-k's
//! estimate and adjustment, DGC's sampled position. Written once for the host codecs
//! (compress/codecs/sparsifiers.hpp: threshold_codec, gaussiank_codec, dgc_codec) and
//! their device kernels (kernels/cuda/codecs_threshold.cuh, codecs_estimated.cuh).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "../../config.hpp"
#include "../exact.hpp"
#include "../fixed_sum.hpp"

namespace commpact {

namespace detail {
//! The selection of the threshold codecs: |x| > t (strict) or |x| >= t; a NaN never
//! passes. Shared with the CUDA kernels of threshold_codec (kernels/cuda/codecs_threshold.cuh).
COMMPACT_HOST_DEVICE inline bool passes_threshold(float x, float t, bool strict) {
  const float a = x < 0.0f ? -x : x;
  return strict ? a > t : a >= t;
}

//! Gaussian-k's moments are the fixed-shape sum (kernels/fixed_sum.hpp) of these leaves:
//! value i is (x, x^2) in double, x = v[i]. Shared with the CUDA kernels
//! (kernels/cuda/codecs_estimated.cuh), which add them in the same shape.
struct gaussiank_leaf {
  const float* v;
  COMMPACT_HOST_DEVICE fixed_sum::double2_sum operator()(std::size_t i) const {
    const auto d = static_cast<double>(v[i]);
    return {d, fixed_sum::exact_product(d, d)};
  }
};

//! Gaussian-k's first estimate from the sums of n values and z: mean + sd z, mean = s / n,
//! sd^2 = max(0, (ss - s mean) / (n - 1)) (sd = 0 for n = 1). Shared with the CUDA kernel.
COMMPACT_HOST_DEVICE inline double gaussiank_estimate(double s, double ss, std::size_t n, double z) {
  const auto nd = static_cast<double>(n);
#if defined(__CUDA_ARCH__)
  const double mean = __ddiv_rn(s, nd);
  const double var = n > 1 ? __ddiv_rn(exact::sub(ss, exact::mul(s, mean)), exact::sub(nd, 1.0)) : 0.0;
  const double sd = n > 1 ? __dsqrt_rn(0.0 < var ? var : 0.0) : 0.0;
#else
  const double mean = s / nd;
  const double var = n > 1 ? (ss - s * mean) / (nd - 1.0) : 0.0;
  const double sd = n > 1 ? std::sqrt(std::max(0.0, var)) : 0.0;
#endif
  return exact::add(mean, exact::mul(sd, z));
}

//! Gaussian-k's adjustment after a count c of passing entries, for k: 0 when c is within
//! [2k/3, 4k/3] (3c against 2k and 4k; stop), else the factor of the threshold: 0.5 below,
//! 1.5 above. Shared with the CUDA kernel.
COMMPACT_HOST_DEVICE inline double gaussiank_factor(std::uint64_t c, std::uint64_t k) {
  if (3 * c < 2 * k) return 0.5;
  return 3 * c <= 4 * k ? 0.0 : 1.5;
}

//! DGC's sampled position for length n from the uniform u: min(n - 1, floor(u n)). Shared
//! with the CUDA kernel.
COMMPACT_HOST_DEVICE inline std::size_t dgc_sample_index(double u, std::size_t n) {
  const auto i = static_cast<std::size_t>(exact::mul(u, static_cast<double>(n)));
  return i < n - 1 ? i : n - 1;
}
}  // namespace detail

}  // namespace commpact
