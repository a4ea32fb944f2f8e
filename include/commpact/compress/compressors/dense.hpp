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
//!
//! Space (v3): the allreduce and the mean run in the communicator's space (host_space
//! for ThreadComm and MpiComm, deferred_space for DeferredComm<C>); `start(grad)` queues
//! them, `finish()` fences once and reads the status, `commit()` counts the step,
//! `cancel()` drops it. `reduce` = start + finish + commit. The first step agrees on the
//! length with one small allreduce; every step queues one allreduce of 6 floats, the step
//! count, the length and an idle flag (compress/step_check.hpp), so ranks that disagreed
//! on commit/cancel, or one that retries a step the others kept, raise mismatch_error
//! alike on every rank in finish(). A rank whose length changed after the first step runs
//! the step idle: its allreduce sums a zeroed workspace of the agreed length (grad
//! untouched), so every rank makes the same calls even over a communicator that does not
//! check sizes (plain MpiComm), and finish() raises mismatch_error on every rank; when
//! every rank changed to one new length, finish() agrees on it and runs the step (a
//! second fence, that step only).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../comm/known_size.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../kernels/host/ops.hpp"
#include "../../kernels/status.hpp"
#include "../../state.hpp"
#include "../../nonfinite.hpp"
#include "../step_check.hpp"
#include "../step_phase.hpp"
#include "../step_status.hpp"

namespace commpact {

struct dense_options {
  nonfinite on_nonfinite = nonfinite::raise;
};

template <class Comm>
class Dense {
  static_assert(diagnose_communicator<Comm>());

 public:
  using options = dense_options;
  using space_type = comm_space_t<Comm>;
  template <class T>
  using span = typename space_type::template span<T>;

  explicit Dense(Comm comm, options opt = {}) : comm_(std::move(comm)), opt_(opt) {
    detail::require_nonfinite_policy(opt.on_nonfinite, "Dense");
  }

  //! Averages grad over the ranks in place. Returns false when the step was skipped.
  bool reduce(span<float> grad) { return detail::reduce_now(*this, grad); }

  //! Queues the sum over the ranks and the mean on grad (host_space: runs them).
  void start(span<float> grad) {
    phase_.require_idle("Dense");
    const auto n = static_cast<std::int64_t>(grad.size());
    if (checked_size_ < 0) agree_length(n);
    const auto e = comm_exec(comm_);
    idle_ = n != checked_size_;
    // An idle step's workspace is sized before the step's first collective: a failed
    // allocation raises here, as a rank that stops (the others' deadline reaches them).
    if (idle_) idle_sum_.resize(static_cast<std::size_t>(checked_size_), e);
    step_check_.queue(comm_, steps_, n, idle_);
    if (idle_) {
      ops<space_type>::fill(e, idle_sum_.view(), 0.0f);
      comm_.allreduce(idle_sum_.view(), reduce_op::sum);
    } else {
      queue_mean(grad);
    }
    grad_ = grad;
    phase_ = phase::started;
  }

  //! Fences, then raises numeric_error on every rank for a non-finite mean, or under
  //! skip_step zeroes grad and returns false. The allreduce runs in place (Dense keeps no
  //! copy of the gradient), so a raised step leaves in grad the mean over the ranks,
  //! mean_of(sum in rank order, P), which is not finite at some index; every other
  //! compressor leaves grad untouched when it raises.
  bool finish() {
    phase_.take_started("Dense");
    const auto e = comm_exec(comm_);
    comm_fence(comm_);
    if (idle_sum_.capacity() != 0) idle_sum_ = decltype(idle_sum_){};  // its allreduce has run: freed
    step_check_.require_same("Dense", comm_.rank(), steps_, static_cast<std::int64_t>(grad_.size()));
    if (idle_) {  // every rank idle, with one new length: agree on it, then run the step
      agree_length(static_cast<std::int64_t>(grad_.size()));
      idle_ = false;
      queue_mean(grad_);
      comm_fence(comm_);
    }
    skipped_step_ = (status_.bits() & status_nonfinite) != 0;
    if (skipped_step_) {
      if (opt_.on_nonfinite == nonfinite::raise)
        detail::raise_nonfinite("Dense::reduce", "summed gradient", static_cast<std::size_t>(-1), steps_);
      ops<space_type>::fill(e, grad_, 0.0f);
      comm_fence(comm_);
    }
    phase_ = phase::finished;
    return !skipped_step_;
  }

  //! Counts a finished step.
  void commit() {
    phase_.require_finished("Dense");
    ++steps_;
    if (skipped_step_) ++skipped_;
    phase_ = phase::idle;
  }

  //! Drops a started or finished step (queued work is completed first).
  void cancel() noexcept { phase_.drop([&] { comm_fence(comm_); }); }

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
  //! The tag added to the step count in this compressor's per-step check (0 alone;
  //! Bucketed sets 1 + the bucket's index, detail/check_tag.hpp).
  void set_check_tag(std::uint32_t tag) { step_check_.set_tag(tag); }
  std::uint32_t check_tag() const { return step_check_.tag(); }
  //! True when the next start() begins with this compressor's agreement (one small
  //! allreduce: the first step). Bucketed starts no bucket during backward at such a step.
  bool needs_agreement() const { return checked_size_ < 0; }
  std::int64_t skipped_steps() const { return skipped_; }
  Comm& comm() { return comm_; }

 private:
  using phase = detail::step_phase;

  void agree_length(std::int64_t n) {
    agree(comm_, "Dense", {detail::length_item(n, opt_.on_nonfinite)}, "", steps_);
    checked_size_ = n;
  }
  //! Queues grad = mean over the ranks and the step's status.
  void queue_mean(span<float> grad) {
    const auto e = comm_exec(comm_);
    status_.clear(e);
    comm_.allreduce(grad, reduce_op::sum);
    ops<space_type>::mean(e, grad, comm_.size(), status_.view());
    status_.fetch(e);
  }

  phase phase_;  // first: a move checks it before any other member has moved
  Comm comm_;
  options opt_;
  detail::status_word<space_type> status_;
  detail::step_check<space_type> step_check_;
  // An idle step's workspace: sized only then, freed after the fence that covers its use
  // (the next finish() that fences, after a cancel()).
  typename space_type::template buffer<float> idle_sum_;
  span<float> grad_{};
  bool idle_ = false;  // this step's length is not the agreed one (start())
  bool skipped_step_ = false;
  std::int64_t checked_size_ = -1;
  std::int64_t steps_ = 0, skipped_ = 0;
};

}  // namespace commpact
