// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file clip.hpp
//! DGC's local gradient clipping factor (ops<Space>::clip_scale), shared by the host row
//! (kernels/host/ops.hpp) and the CUDA row (kernels/cuda/vector.cuh): ||g||^2 is summed
//! in double in kernels/fixed_sum.hpp's shape on both, then one formula gives the factor,
//! so both get the same bits.

#include <cmath>
#include <cstddef>
#include <span>

#include "../config.hpp"
#include "fixed_sum.hpp"

namespace commpact::clip {

//! Leaf i of ||g||^2: double(g[i])^2.
struct square_leaf {
  const float* g;
  COMMPACT_HOST_DEVICE double operator()(std::size_t i) const {
    const auto d = static_cast<double>(g[i]);
    return fixed_sum::exact_product(d, d);
  }
};

//! The factor from ||g||^2: bound / ||g|| when ||g|| > bound = clip_norm / sqrt(P), else 1
//! (also when clip_norm <= 0 or ||g|| is not finite: the accumulate's finiteness check
//! reports that). sqrt and / are correctly rounded on the host and the device.
COMMPACT_HOST_DEVICE inline float factor(double sumsq, float clip_norm, int P) {
#if defined(__CUDA_ARCH__)
  const double norm = __dsqrt_rn(sumsq);
  const double bound = __ddiv_rn(static_cast<double>(clip_norm), __dsqrt_rn(static_cast<double>(P)));
  const bool finite = !(isnan(norm) || isinf(norm));
  return (clip_norm <= 0.0f || !finite || norm <= bound) ? 1.0f : __double2float_rn(__ddiv_rn(bound, norm));
#else
  const double norm = std::sqrt(sumsq);
  const double bound = static_cast<double>(clip_norm) / std::sqrt(static_cast<double>(P));
  return (clip_norm <= 0.0f || !std::isfinite(norm) || norm <= bound) ? 1.0f : static_cast<float>(bound / norm);
#endif
}

//! ||g||^2 in double, in the fixed shape (the device's order).
inline double host_sumsq(std::span<const float> g) {
  return fixed_sum::host_sum<double>(g.size(), square_leaf{g.data()}, fixed_sum::add_double{});
}

}  // namespace commpact::clip
