#pragma once
//! \file dense.hpp
//! Dense: the uncompressed S-SGD baseline. reduce(grad) replaces grad by the average
//! over the ranks through the communicator's allreduce. Nothing is dropped, so there
//! is no residual.
//!
//! \code
//! commpact::Dense<commpact::ThreadComm> avg{comm};
//! avg.reduce(std::span(grad));      // grad = (1/P) sum_r grad_r, identical on every rank
//! \endcode
//!
//! Non-finite values are detected after the reduction, where every rank sees the same
//! numbers, so every rank takes the same decision: raise numeric_error (the default) or,
//! with `nonfinite::skip_step`, zero the gradient and count the skipped step.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../comm/agree.hpp"
#include "../concepts.hpp"
#include "../error.hpp"

namespace commpact {

//! What a compressor does when a gradient holds NaN or Inf.
enum class nonfinite { raise, skip_step };

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
    comm_.allreduce(grad, reduce_op::sum);
    const float inv = 1.0f / static_cast<float>(comm_.size());
    std::size_t bad = grad.size();
    for (std::size_t i = 0; i < grad.size(); ++i) {
      if (!std::isfinite(grad[i]) && bad == grad.size()) bad = i;
      grad[i] *= inv;
    }
    ++steps_;
    if (bad != grad.size()) {
      if (opt_.on_nonfinite == nonfinite::raise)
        throw numeric_error(detail::cat("commpact::Dense::reduce: the summed gradient is not finite at index ", bad,
                                        " (some rank passed NaN or Inf; every rank raises this error). Fix the "
                                        "gradient, or set on_nonfinite = nonfinite::skip_step to drop such steps."));
      std::fill(grad.begin(), grad.end(), 0.0f);
      ++skipped_;
      return false;
    }
    return true;
  }

  void save_state(std::vector<std::byte>& out) const {
    const std::int64_t s[2] = {steps_, skipped_};
    const auto* p = reinterpret_cast<const std::byte*>(s);
    out.insert(out.end(), p, p + sizeof(s));
  }

  void load_state(std::span<const std::byte> in) {
    require<wire_error>(in.size() == 2 * sizeof(std::int64_t), "commpact::Dense::load_state: expected ",
                        2 * sizeof(std::int64_t), " bytes, got ", in.size(), ".");
    std::int64_t s[2];
    std::memcpy(s, in.data(), sizeof(s));
    steps_ = s[0];
    skipped_ = s[1];
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
