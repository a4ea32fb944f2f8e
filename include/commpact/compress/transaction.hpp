// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file transaction.hpp
//! A compressor's step held open until the caller decides: the driver (DataParallel,
//! Bucketed) computes the result, runs the user's update, and only then keeps the
//! step; when anything raises in between, the compressor is put back as it was before
//! the step, so a retry equals a run that never saw the failure.
//!
//! - A two-phase compressor (`start(grad)`, `bool finish()`, `commit()`, `cancel()`:
//!   Dense, gTopK, every CodecCompressor, PowerCompressor) holds the step itself: nothing
//!   is copied.
//! - Any other Compressor (Ok-Topk, majority vote, ...) is snapshotted with
//!   save_state before its reduce() and restored by load_state on cancel (the v2 way,
//!   one copy of its state per step).
//!
//! <!-- snippet: using C=commpact::Dense<commpact::ThreadComm>; c=C -->
//! \code
//! commpact::pending_step<C> tx;
//! const bool ok = tx.run(c, grad);   // grad holds the result; c's step is open
//! try { update(params, grad); } catch (...) { tx.cancel(c); throw; }
//! tx.commit(c);                      // c's residual and counters advance
//! \endcode

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "../concepts.hpp"

namespace commpact {

namespace req {
//! A compressor whose step has the phases start / finish / commit / cancel.
template <class C>
concept two_phase_compressor = requires(C& c, typename space_of_t<C>::template span<float> g) {
  c.start(g);
  { c.finish() } -> std::convertible_to<bool>;
  c.commit();
  c.cancel();
};
}  // namespace req

template <class C>
class pending_step {
 public:
  //! Computes c's step on grad and leaves it open. Returns what reduce() would (false:
  //! a skipped step). Raises as reduce() does, with nothing left open.
  bool run(C& c, typename space_of_t<C>::template span<float> grad, bool keep_snapshot = true) {
    open_ = false;
    bool ok = true;
    if constexpr (req::two_phase_compressor<C>) {
      c.start(grad);
      ok = c.finish();
    } else {
      snapped_ = keep_snapshot;
      if (keep_snapshot) snapshot(c, snap_);
      if constexpr (std::same_as<decltype(c.reduce(grad)), bool>) ok = c.reduce(grad);
      else c.reduce(grad);
    }
    open_ = true;
    return ok;
  }
  //! Keeps the open step (a no-op when none is open).
  void commit(C& c) {
    if (!open_) return;
    open_ = false;
    if constexpr (req::two_phase_compressor<C>) c.commit();
  }
  //! Puts c back as before run() (a no-op when no step is open).
  void cancel(C& c) {
    if (!open_) return;
    open_ = false;
    if constexpr (req::two_phase_compressor<C>) c.cancel();
    else if (snapped_) c.load_state(snap_);
  }
  bool open() const { return open_; }

 private:
  static void snapshot(const C& c, std::vector<std::byte>& out) {
    out.clear();
    c.save_state(out);
  }

  std::vector<std::byte> snap_;
  bool open_ = false, snapped_ = false;
};

}  // namespace commpact
