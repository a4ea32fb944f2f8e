// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file step_phase.hpp
//! The phase of a two-phase compressor's step (idle -> started -> finished -> idle) and
//! the misuse checks every such compressor makes (Dense, gTopK, CodecCompressor), written
//! once so that they read alike: start() needs an idle step, finish() a started one,
//! commit() a finished one (compress/transaction.hpp drives them).

#include <string_view>

#include "../error.hpp"
#include "../space/host.hpp"

namespace commpact::detail {

//! What a finished step did: delivered its result, or was skipped (a non-finite value
//! under nonfinite::skip_step).
enum class step_outcome { delivered, skipped };

//! reduce() of a two-phase compressor: start + finish + commit. A step that raises in
//! finish() was never committed; the compressor is idle again.
template <class C, class Grad>
bool reduce_now(C& c, Grad grad) {
  c.start(grad);
  const bool ok = c.finish();
  c.commit();
  return ok;
}

class step_phase {
 public:
  enum value { idle, started, finished };

  step_phase() = default;
  //! A compressor moves (or is copied) only while no step is started: a started step's
  //! queued work refers to the object it was started on (its communicator, its buffers),
  //! so moving it then raises usage_error and leaves both objects as they were.
  step_phase(const step_phase& o) : v_(o.v_) { o.require_not_started("move or copy"); }
  step_phase& operator=(const step_phase& o) {
    o.require_not_started("move or copy");
    require_not_started("assign to");
    v_ = o.v_;
    return *this;
  }

  //! start(): the previous step must be committed or cancelled.
  void require_idle(std::string_view who) const {
    require(v_ == idle, "commpact::", who, "::start: the previous step was started and not ",
            v_ == started ? "finished" : "committed",
            "; call finish() and commit() (or cancel()) before starting another.");
  }
  //! finish(): a step must have been started.
  void require_started(std::string_view who) const {
    require(v_ == started, "commpact::", who, "::finish: no step was started; call start(grad) first.");
  }
  //! finish() takes the started step: it must have been started, and whatever finish
  //! raises from here on, no step is in flight any more.
  void take_started(std::string_view who) {
    require_started(who);
    v_ = idle;
  }
  //! commit(): a step must have finished.
  void require_finished(std::string_view who) const {
    require(v_ == finished, "commpact::", who, "::commit: no finished step to commit; call start(grad) and finish() "
                            "first.");
  }

  //! commit() takes the finished step: it must have finished; from here on none is in flight.
  void take_finished(std::string_view who) {
    require_finished(who);
    v_ = idle;
  }
  //! save_state, load_state, reset and the like: no step may be in flight.
  void require_none_in_flight(std::string_view who, std::string_view call) const {
    require(v_ == idle, "commpact::", who, "::", call, ": a step is in flight; finish and commit it first.");
  }

  //! cancel(): drops a started or finished step. A started step's queued work is
  //! completed first by `fence()` (a compressor passes its fence under the
  //! communicator's deadline; a failure is dropped with the step: the communicator
  //! reports it again at its next use).
  template <class Fence>
  void drop(Fence&& fence) noexcept {
    if (v_ == started) {
      try {
        fence();
      } catch (...) {
      }
    }
    v_ = idle;
  }


  //! usage_error when a step is started (see the copy constructor).
  void require_not_started(std::string_view what) const {
    require<usage_error>(v_ != started, "commpact: cannot ", what,
                         " a compressor whose step is started: its queued work refers to this object; call finish() "
                         "(or cancel()) first.");
  }

  step_phase& operator=(value v) {
    v_ = v;
    return *this;
  }
  bool operator==(value v) const { return v_ == v; }

 private:
  value v_ = idle;
};

}  // namespace commpact::detail
