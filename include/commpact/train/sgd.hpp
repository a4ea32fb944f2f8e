// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sgd.hpp
//! Sgd: a minimal SGD with momentum and weight decay over a flat float buffer, for
//! tests, examples and demos. DataParallel takes any update callable
//! `update(std::span<float> params, std::span<const float> grads, double lr)`; this is one.
//!
//! Update (PyTorch's convention, without dampening): d = g + wd x; v = mu v + d;
//! x -= lr v (x -= lr d when mu = 0). The learning rate is rounded to float once per
//! call; all arithmetic is float, element by element, so equal inputs give equal bits.
//!
//! \code
//! commpact::Sgd opt{params.size(), {.momentum = 0.9, .weight_decay = 5e-4}};
//! opt(params, grads, 0.1);
//! \endcode
//!
//! `state()` exposes the velocity so that DataParallel can average it in Local SGD
//! rounds (data_parallel_options::average_optimizer_state).

#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "../error.hpp"

namespace commpact {

struct sgd_options {
  double momentum = 0.0;      //!< mu in [0, 1)
  double weight_decay = 0.0;  //!< wd >= 0
};

class Sgd {
 public:
  explicit Sgd(std::size_t n, sgd_options opt = {}) : n_(n), opt_(opt) {
    require(std::isfinite(opt.momentum) && opt.momentum >= 0 && opt.momentum < 1, "commpact::Sgd: momentum = ",
            opt.momentum, " must lie in [0, 1); 0 turns momentum off, 0.9 is the common choice.");
    require(std::isfinite(opt.weight_decay) && opt.weight_decay >= 0, "commpact::Sgd: weight_decay = ",
            opt.weight_decay, " must be a finite number >= 0; 0 turns it off.");
    if (opt.momentum > 0) v_.assign(n, 0.0f);
  }

  void operator()(std::span<float> params, std::span<const float> grads, double lr) {
    require(params.size() == n_ && grads.size() == n_, "commpact::Sgd: got ", params.size(), " parameters and ",
            grads.size(), " gradients; this optimizer was made for ", n_, ". Make one Sgd per parameter buffer.");
    require(std::isfinite(lr) && lr >= 0, "commpact::Sgd: lr = ", lr, " must be a finite number >= 0.");
    const float a = static_cast<float>(lr);
    const float mu = static_cast<float>(opt_.momentum);
    const float wd = static_cast<float>(opt_.weight_decay);
    if (v_.empty()) {
      for (std::size_t i = 0; i < n_; ++i) params[i] -= a * (grads[i] + wd * params[i]);
    } else {
      for (std::size_t i = 0; i < n_; ++i) {
        v_[i] = mu * v_[i] + (grads[i] + wd * params[i]);
        params[i] -= a * v_[i];
      }
    }
  }

  //! The velocity (empty without momentum).
  std::span<float> state() { return v_; }
  std::span<const float> state() const { return v_; }
  const sgd_options& options() const { return opt_; }

 private:
  std::size_t n_;
  sgd_options opt_;
  std::vector<float> v_;
};

}  // namespace commpact
