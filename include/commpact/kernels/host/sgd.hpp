// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sgd.hpp
//! The SGD update of commpact::Sgd (train/sgd.hpp) as a host kernel, the reference of the
//! ops row `sgd_step` (kernels/ops.hpp): PyTorch's convention without dampening,
//! d = g + wd x; v = mu v + d; x -= a v (x -= a d without momentum, v empty), all in
//! float, element by element (a * v rounded before the subtraction: a device twin must not
//! contract it into an FMA where the host build has none).

#include <cstddef>
#include <span>

namespace commpact::host {

inline void sgd_step(std::span<float> x, std::span<float> v, std::span<const float> g, float a, float mu,
                     float wd) noexcept {
  const std::size_t n = x.size();
  if (v.empty()) {
    for (std::size_t i = 0; i < n; ++i) {
      x[i] -= a * (g[i] + wd * x[i]);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = mu * v[i] + (g[i] + wd * x[i]);
      x[i] -= a * v[i];
    }
  }
}

}  // namespace commpact::host
