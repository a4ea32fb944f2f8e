// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file dense.hpp
//! Dense: the uncompressed S-SGD baseline, the identity codec aggregated by allreduce.
//! reduce(grad) replaces grad by the average over the ranks (sum in the communicator's
//! fixed order, then times 1/P). Nothing is dropped, so there is no residual.
//!
//! \code
//! commpact::Dense<commpact::ThreadComm> avg{comm};
//! avg.reduce(std::span(grad));      // grad = (1/P) sum_r grad_r, identical on every rank
//! \endcode
//!
//! Non-finite values are detected after the reduction, where every rank sees the same
//! numbers, so every rank takes the same decision (nonfinite.hpp): raise numeric_error
//! (the default) or, with `nonfinite::skip_step`, zero the gradient and count the step.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../comm/agree.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../state.hpp"
#include "nonfinite.hpp"

namespace commpact {

struct dense_options {
  nonfinite on_nonfinite = nonfinite::raise;
};

template <class Comm>
class Dense {
  static_assert(diagnose_communicator<Comm>());

 public:
  using options = dense_options;

  explicit Dense(Comm comm, options opt = {}) : comm_(std::move(comm)), opt_(opt) {}

  //! Averages grad over the ranks in place. Returns false when the step was skipped.
  bool reduce(std::span<float> grad) {
    if (static_cast<std::int64_t>(grad.size()) != checked_size_) {
      require_same(comm_, static_cast<std::int64_t>(grad.size()), "gradient length (Dense::reduce)");
      checked_size_ = static_cast<std::int64_t>(grad.size());
    }
    const bool ok = mean_allreduce(comm_, grad, opt_.on_nonfinite, "Dense::reduce", "summed gradient", steps_);
    ++steps_;
    if (!ok) ++skipped_;
    return ok;
  }

  void save_state(std::vector<std::byte>& out) const {
    state::writer w{out, "commpact.Dense"};
    state::write_counters(w, steps_, skipped_);
    w.finish();
  }

  //! Restores what save_state wrote; raises and changes nothing on a malformed state.
  void load_state(std::span<const std::byte> in) {
    state::reader r{in, "commpact.Dense", "Dense"};
    const auto [s, k] = state::read_counters(r);
    r.done();
    steps_ = s;
    skipped_ = k;
  }

  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_; }
  Comm& comm() { return comm_; }

 private:
  Comm comm_;
  options opt_;
  std::int64_t checked_size_ = -1;
  std::int64_t steps_ = 0, skipped_ = 0;
};

}  // namespace commpact
