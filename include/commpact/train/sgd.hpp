// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sgd.hpp
//! Sgd: a minimal SGD with momentum and weight decay over a flat float buffer, for
//! tests, examples and demos. DataParallel takes any update callable
//! `update(span<float> params, span<const float> grads, double lr)`; this is one.
//!
//! Update (PyTorch's convention, without dampening): d = g + wd x; v = mu v + d;
//! x -= lr v (x -= lr d when mu = 0). The learning rate is rounded to float once per
//! call; all arithmetic is float, element by element, so equal inputs give equal bits
//! (kernels/host/sgd.hpp, the ops row `sgd_step`).
//!
//! \code
//! commpact::Sgd opt{params.size(), {.momentum = 0.9, .weight_decay = 5e-4}};
//! opt(params, grads, 0.1);
//! \endcode
//!
//! `BasicSgd<Space>` runs the same update in an execution space (its buffers in the
//! space, the update queued on an executor: `BasicSgd<deferred_space> opt{n, {}, comm.exec()}`);
//! `Sgd` is `BasicSgd<host_space>`.
//!
//! `state()` exposes the velocity so that DataParallel can average it in Local SGD
//! rounds (data_parallel_options::average_optimizer_state).

#include <cmath>
#include <cstddef>
#include <span>
#include <utility>

#include "../error.hpp"
#include "../kernels/host/ops.hpp"
#include "../space/host.hpp"

namespace commpact {

struct sgd_options {
  double momentum = 0.0;      //!< mu in [0, 1)
  double weight_decay = 0.0;  //!< wd >= 0
};

template <class Space>
class BasicSgd {
 public:
  using space_type = Space;
  template <class T>
  using span = typename Space::template span<T>;

  explicit BasicSgd(std::size_t n, sgd_options opt = {}, typename Space::exec e = {})
      : n_(n), opt_(opt), exec_(std::move(e)) {
    require(std::isfinite(opt.momentum) && opt.momentum >= 0 && opt.momentum < 1, "commpact::Sgd: momentum = ",
            opt.momentum, " must lie in [0, 1); 0 turns momentum off, 0.9 is the common choice.");
    require(std::isfinite(opt.weight_decay) && opt.weight_decay >= 0, "commpact::Sgd: weight_decay = ",
            opt.weight_decay, " must be a finite number >= 0; 0 turns it off.");
    if (opt.momentum > 0) {
      v_.resize(n, exec_);
      ops<Space>::fill(exec_, v_.view(), 0.0f);
    }
  }

  //! params -= lr * (velocity or gradient), as the file comment says; queued on the
  //! executor outside host_space.
  void operator()(span<float> params, span<const float> grads, double lr) {
    require(params.size() == n_ && grads.size() == n_, "commpact::Sgd: got ", params.size(), " parameters and ",
            grads.size(), " gradients; this optimizer was made for ", n_, ". Make one Sgd per parameter buffer.");
    require(std::isfinite(lr) && lr >= 0, "commpact::Sgd: lr = ", lr, " must be a finite number >= 0.");
    ops<Space>::sgd_step(exec_, params, v_.view(), grads, static_cast<float>(lr), static_cast<float>(opt_.momentum),
                         static_cast<float>(opt_.weight_decay));
  }

  //! The velocity (empty without momentum).
  span<float> state() { return v_.view(); }
  span<const float> state() const { return v_.view(); }
  const sgd_options& options() const { return opt_; }

 private:
  std::size_t n_;
  sgd_options opt_;
  typename Space::exec exec_;
  typename Space::template buffer<float> v_;
};

//! SGD on host memory.
using Sgd = BasicSgd<host_space>;

}  // namespace commpact
