// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file data_parallel.hpp
//! (Over 400 lines on purpose: one class, a third of it the contract written below, and
//! its transactional step, overlap entry points and state loading, which belong together.)
//! DataParallel<Compressor, SyncPolicy>: the piece a training loop calls after backward.
//! It asks the SyncPolicy when to synchronise and what, moves the bytes through the
//! Compressor (and the Compressor's communicator), and leaves the optimizer to the user.
//!
//! \code
//! commpact::Dense<commpact::ThreadComm> dense{comm};
//! commpact::WarmupCosineLr lr{0.1, 500, 10000};
//! commpact::DataParallel dp{std::move(dense), commpact::QSRPolicy{0.2, 2, 500}, 10000};
//! commpact::Sgd opt{params.size(), {.momentum = 0.9}};
//! for (std::int64_t t = 0; t < 10000; ++t) {
//!   compute_gradients(params, grads);          // the user's forward and backward
//!   dp.step(params, grads, lr(t), opt);        // returns true when this step synchronised
//! }
//! \endcode
//!
//! Per step, with the period the policy chose (asked at step 0 and after each period,
//! with the learning rate of the period's first step, cut at the end of the run):
//! - gradient period: `compressor.reduce(grads)`, then `update(params, grads, lr)`;
//!   one round per step. A step the compressor skips (it returned false: non-finite
//!   gradient under nonfinite::skip_step) does not call update.
//! - parameter period of H steps: `update(params, grads, lr)` locally; after the last step
//!   the ranks average their parameters as x = x0 + mean_r(x_r - x0), x0 being the
//!   parameters at the period's start (the same on every rank). The mean of the deltas
//!   goes through the communicator (dense: sum in rank order, then divided by P in float, the
//!   same arithmetic as Dense), or with `compress_deltas` through `compressor.reduce`, whose
//!   error feedback keeps what it did not send for the next round. With
//!   `average_optimizer_state` the optimizer's `state()` (momentum) is averaged too.
//!
//! A one-step parameter period is synchronised through the gradient instead (mean of the
//! gradients, the same dense arithmetic, then update) when the optimizer state is the same
//! on every rank before the step and stays so after it: the update keeps no state (none,
//! or an empty state()), or `average_optimizer_state` is on. For an update that is linear
//! in the gradient (SGD, with or without momentum and weight decay) this is the same step
//! as a local step followed by parameter averaging (and state averaging), in exact
//! arithmetic, and it sends the same bytes; in floating point it is bit for bit the step
//! EveryStep takes with Dense, so LocalSgd{1} equals EveryStep with Dense exactly there.
//! With momentum kept per rank (average_optimizer_state off, the default) a one-step
//! period is a local step and an average of deltas like any other: each rank's momentum
//! stays its own, as Local SGD defines it, and a longer period after it starts from it.
//! State is known to be the same on every rank until the first averaging of parameter
//! deltas, and after each one when `average_optimizer_state` is on. With `compress_deltas`
//! every parameter round sends deltas.
//!
//! A compressor's error-feedback residual must not hold gradients and parameter deltas
//! at once. Under `compress_deltas` with one compressor, a policy that mixes gradient and
//! parameter rounds (PostLocal) raises invalid_argument at the first round of the other
//! kind; give the deltas a compressor of their own with the constructor
//! DataParallel{for_gradients, for_deltas, policy, total_steps, options}.
//!
//! Overlap: with a Bucketed compressor (compress/compressors/bucketed.hpp), begin_backward(grads, lr)
//! before backward and grad_ready(layer) during it start each bucket's reduction while
//! backward goes on; step() then waits for them. Bit for bit the same as step() alone.
//! At a step whose buckets agree first (the first step) the buckets start at step().
//! The buckets in flight write the gradient until step() or cancel_backward(): hold the
//! step in a backward_scope declared after the gradient, so that an exception that
//! unwinds the gradient's scope ends the buckets before the gradient is freed.
//!
//! save_state / load_state checkpoint the driver (position, current period, the
//! parameters at its start, counters) and its compressors; the optimizer is the user's.
//!
//! Requirements and conventions:
//! - The compressor exposes its communicator as `comm()` (Dense does); parameter
//!   averaging uses it, so a CountingComm under the compressor counts every byte (with a
//!   second compressor for the deltas, its bytes are in delta_compressor().comm()).
//! - `update` is callable as update(std::span<float>, std::span<const float>, double).
//!   An update that keeps state (momentum) exposes it as `std::span<float> state()`;
//!   an update without state() is taken to be stateless: hidden state would diverge
//!   across ranks in local steps and could not be brought back.
//! - Parameters and optimizer state start the same on every rank (broadcast them first).
//! - Every rank passes the same learning rates; the policy's decisions are then the
//!   same on every rank. `verify_plans` checks that at each period (one small allreduce).
//! - One-time checks (an allreduce of four int64 per buffer kind: parameters, optimizer
//!   state) guard the first average (dense, or through the compressor under
//!   compress_deltas): the same length, and the same step on every rank (ranks whose
//!   policies differ in their first period raise mismatch_error there); Dense checks the
//!   gradient's length itself.

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/agree.hpp"
#include "../comm/mean_allreduce.hpp"
#include "../nonfinite.hpp"
#include "../kernels/copies.hpp"
#include "../compress/transaction.hpp"
#include "../concepts.hpp"
#include "../detail/hash.hpp"
#include "../error.hpp"
#include "../state.hpp"
#include "../sync/policies.hpp"
#include "../sync/schedule.hpp"

namespace commpact {

struct data_parallel_options {
  //! Average the optimizer's state() (momentum) in each parameter-delta round.
  bool average_optimizer_state = false;
  //! Send parameter deltas through the compressor (with its error feedback) instead of
  //! averaging them densely through the communicator.
  bool compress_deltas = false;
  //! Check at each period that every rank made the same decision (costs one allreduce).
  bool verify_plans = false;
  //! On a space that queues work (the deferred space, CUDA): step() waits for the
  //! update's queued work before it keeps the step (one more host wait per step), so an
  //! error there raises (device_error) in that step, with the compressors and the driver
  //! as before it. Off, step() returns with the update queued, and such an error raises
  //! at the next fence, after the step was kept. No effect on host_space.
  bool wait_for_update = false;
};

namespace req {
template <class C>
concept has_comm_member = requires(C& c) { c.comm(); };
template <class C>
concept has_comm = has_comm_member<C> && requires(C& c) {
  requires Communicator<std::remove_cvref_t<decltype(c.comm())>>;
};
//! What comm() returns is a Communicator: diagnose_communicator names what it lacks.
template <class C>
constexpr bool diagnose_comm_of() {
  if constexpr (has_comm_member<C>) {
    return diagnose_communicator<std::remove_cvref_t<decltype(std::declval<C&>().comm())>>();
  } else {
    return true;
  }
}
template <class U, class Space = host_space>
concept has_optimizer_state = requires(U& u) {
  { u.state() } -> std::convertible_to<typename Space::template span<float>>;
};
//! A compressor that can start its reduction during backward (Bucketed).
template <class C>
concept overlappable = requires(C& c, typename space_of_t<C>::template span<float> g, std::size_t layer) {
  c.begin(g);
  c.ready(layer);
  c.cancel();
};
template <class U, class Space = host_space>
concept update_function = std::invocable<U&, typename Space::template span<float>,
                                         typename Space::template span<const float>, double>;
}  // namespace req

template <class Compressor, class Policy>
class DataParallel {
  static_assert(diagnose_compressor<Compressor>());
  static_assert(diagnose_sync_policy<Policy>());
  static_assert(req::diagnose_comm_of<Compressor>());  // what comm() returns: the missing piece, named
  static_assert(req::has_comm_member<Compressor>,
                "commpact::DataParallel: the compressor must expose its communicator as `comm()` (as Dense does); "
                "parameter averaging in Local SGD rounds goes through it.");

 public:
  using options = data_parallel_options;
  using communicator = std::remove_cvref_t<decltype(std::declval<Compressor&>().comm())>;
  //! Where parameters and gradients live: the compressor's space (host_space unless it
  //! names another, as Dense<DeferredComm<C>> does). Parameter averaging runs there too.
  using space_type = space_of_t<Compressor>;
  template <class T>
  using span = typename space_type::template span<T>;
  template <class T>
  using buffer = typename space_type::template buffer<T>;

  //! A run of `total_steps` optimizer steps; calls the policy's check_run(total_steps).
  DataParallel(Compressor compressor, Policy policy, std::int64_t total_steps, options opt = {})
      : compressor_(std::move(compressor)), policy_(std::move(policy)), total_(total_steps), opt_(opt) {
    require(total_steps >= 0, "commpact::DataParallel: total_steps = ", total_steps,
            " is negative; pass the number of optimizer steps of the run.");
    check_run(policy_, total_steps);
  }

  //! As above, with a second compressor of its own for the parameter deltas (implies
  //! compress_deltas), so that a policy that mixes gradient and parameter rounds keeps
  //! two error-feedback residuals apart. Its bytes are counted by its own communicator.
  DataParallel(Compressor for_gradients, Compressor for_deltas, Policy policy, std::int64_t total_steps,
               options opt = {})
      : DataParallel(std::move(for_gradients), std::move(policy), total_steps, opt) {
    opt_.compress_deltas = true;
    delta_compressor_.emplace(std::move(for_deltas));
  }

  //! Overlap of the gradient reduction with backward (a Bucketed compressor): call
  //! begin_backward(grads, lr) before backward, grad_ready(layer) as each layer's
  //! gradient is final (last layer first), then step() with the same grads and lr; it
  //! waits for the buckets in flight. In a step that does not reduce gradients (the local
  //! steps of Local SGD and QSR, parameter rounds) both calls do nothing. The result is
  //! bit for bit that of step() alone. Between begin_backward and step the
  //! communicator belongs to the buckets in flight: do not use it.
  void begin_backward(span<float> grads, double lr)
    requires req::overlappable<Compressor>
  {
    require(!overlap_, "commpact::DataParallel::begin_backward: called twice before step(); call step() once per "
                       "begin_backward().");
    require(step_ < total_, "commpact::DataParallel::begin_backward: step ", step_, " is past the run of ", total_,
            " steps.");
    require(std::isfinite(lr), "commpact::DataParallel::begin_backward: the learning rate at step ", step_, " is ", lr,
            "; pass a finite learning rate.");
    const bool new_period = step_ == next_plan_;
    const auto what = new_period ? detail::next_period(policy_, step_, lr, total_).what : period_.what;
    if (what != sync_plan::mode::gradients) return;
    overlap_snap_ = snapshot();
    try {
      if (new_period) begin_period(grads, lr, false);  // a gradient period keeps no parameters
      compressor_.begin(grads);
    } catch (...) {
      restore(*overlap_snap_);
      throw;
    }
    overlap_ = true;
    overlap_lr_ = lr;
  }

  //! Layer `layer`'s gradient (forward index) is final; see begin_backward.
  void grad_ready(std::size_t layer)
    requires req::overlappable<Compressor>
  {
    if (overlap_) compressor_.ready(layer);
  }

  //! Orders the next step's work after `ev` (the framework's backward, recorded on its
  //! stream): no host wait. The space's event: cuda_space::event, deferred_space::event.
  void wait(const typename space_type::event& ev) { space_type::wait(exec(), ev); }
  //! An event marking the work queued so far (a step's end), for a consumer's stream.
  typename space_type::event record() const { return space_type::record(exec()); }

  //! One optimizer step after backward. `grads` may be overwritten (by the averaged
  //! gradient in gradient rounds). Returns true when this step ended with a
  //! synchronisation round, after which params are the same on every rank.
  template <class Update>
    requires req::update_function<Update, space_type>
  bool step(span<float> params, span<float> grads, double lr, Update&& update) {
    using U = std::remove_cvref_t<Update>;
    overlap_guard guard{*this, std::uncaught_exceptions()};  // a step that raises ends the buckets in flight first
    require(step_ < total_, "commpact::DataParallel::step: step ", step_, " is past the run of ", total_,
            " steps; make the DataParallel with the run's full length.");
    require(params.size() == grads.size(), "commpact::DataParallel::step: ", params.size(), " parameters but ",
            grads.size(), " gradients; pass the gradient of every parameter (one flat buffer each).");
    require(std::isfinite(lr), "commpact::DataParallel::step: the learning rate at step ", step_, " is ", lr,
            "; pass a finite learning rate.");
    require(!overlap_ || lr == overlap_lr_, "commpact::DataParallel::step: learning rate ", lr, " differs from the ",
            overlap_lr_, " passed to begin_backward; pass the same one.");
    if (n_ < 0) {
      n_ = static_cast<std::int64_t>(params.size());
    } else {
      require(static_cast<std::int64_t>(params.size()) == n_, "commpact::DataParallel::step: ", params.size(),
              " parameters at step ", step_, " but ", n_,
              " before; the parameter buffer must keep its length over the run.");
    }
    if constexpr (!req::has_optimizer_state<U, space_type>) {
      require(!opt_.average_optimizer_state,
              "commpact::DataParallel: average_optimizer_state is on, but the update function has no "
              "`std::span<float> state()` to average; expose the optimizer state (as commpact::Sgd does) or turn the "
              "option off.");
    }

    // A step that raises leaves the driver as it was (the compressors are transactional
    // themselves), so the caller may retry it. A parameter round's step writes params
    // (and the optimizer state) before its collectives, a one-step shortcut writes grads:
    // those are copied first and put back (undo_), so the retry equals a run that never
    // failed. (Gradient rounds: the compressors leave grads as they were, Dense excepted.)
    const bool overlapped = overlap_;
    const bool local_state = keeps_local_state(update);
    const driver_snapshot snap = overlapped ? *overlap_snap_ : snapshot();
    bool synced = false;
    undo_ = undo_kind::none;
    try {
      if (step_ == next_plan_ && !overlapped) begin_period(params, lr, local_state);

      if (period_.what == sync_plan::mode::gradients) {
        // Overlapped, the state average waits until the buckets are done (the communicator
        // is theirs until then); its values do not depend on the order.
        if (!overlapped) bring_state_in_sync(update);
        const bool sent = compressor_reduce(compressor_, grads, round_kind::gradients);
        overlap_ = false;
        if (overlapped) bring_state_in_sync(update);
        if (sent) {
          update(params, span<const float>(grads), lr);
        } else {
          ++skipped_;
        }
        ++gradient_rounds_;
        synced = true;
      } else if (one_step_shortcut(local_state)) {
        // A one-step period through the gradient (see the file comment): bit for bit EveryStep.
        keep_for_undo(undo_grads_, span<const float>(grads), undo_kind::grads);
        dense_mean(grads, checked_params_, "gradient");
        update(params, span<const float>(grads), lr);
        ++parameter_rounds_;
        ++gradient_shortcuts_;
        synced = true;
      } else {
        if (step_ == period_.last()) {
          keep_for_undo(undo_params_, span<const float>(params), undo_kind::params);
          if constexpr (req::has_optimizer_state<U, space_type>) {
            keep_for_undo(undo_state_, span<const float>(update.state()), undo_kind::params);
          }
        }
        update(params, span<const float>(grads), lr);
        if (step_ == period_.last()) {
          average_parameters(params);
          if constexpr (req::has_optimizer_state<U, space_type>) {
            if (opt_.average_optimizer_state && update.state().size() != 0) {  // nothing to send when empty
              dense_mean(update.state(), checked_state_, "optimizer state");
              ++state_rounds_;
            }
          }
          state_in_sync_ = opt_.average_optimizer_state;
          ++parameter_rounds_;
          synced = true;
        }
      }
      if (opt_.wait_for_update) comm_fence(compressor_.comm());  // host_space: no queued work, no wait
    } catch (...) {
      guard.end();
      tx_.cancel(compressor_);
      if (delta_compressor_) delta_tx_.cancel(*delta_compressor_);
      restore(snap);
      if (undo_ == undo_kind::grads) put_back(undo_grads_, grads);
      if (undo_ == undo_kind::params) {
        put_back(undo_params_, params);
        if constexpr (req::has_optimizer_state<U, space_type>) put_back(undo_state_, update.state());
      }
      throw;
    }
    // Everything that could raise has run: the compressors keep their steps.
    tx_.commit(compressor_);
    if (delta_compressor_) delta_tx_.commit(*delta_compressor_);
    ++step_;
    return synced;
  }

  //! Abandons a step begun with begin_backward (backward raised after some grad_ready
  //! calls, say): waits for the buckets in flight, puts every bucket's compressor and
  //! the driver back as before begin_backward, so the step can begin again. A no-op when
  //! no step is in flight.
  void cancel_backward() noexcept
    requires req::overlappable<Compressor>
  {
    if (!overlap_) return;
    compressor_.cancel();
    overlap_ = false;
    restore(*overlap_snap_);
  }

  //! Appends the driver's state (state.hpp format, kind "commpact.DataParallel"): position
  //! in the run, the current period, the parameters at its start, counters, then the
  //! compressor's state (and the delta compressor's) as nested blobs. The optimizer's
  //! state is the user's to save. Restore into a DataParallel made with the same policy,
  //! run length and compressors.
  void save_state(std::vector<std::byte>& out) const {
    state::writer w{out, "commpact.DataParallel"};
    const std::int64_t head[] = {total_,
                                 n_,
                                 step_,
                                 next_plan_,
                                 period_.start,
                                 period_.length,
                                 static_cast<std::int64_t>(period_.what),
                                 state_in_sync_ ? 1 : 0,
                                 (checked_params_ ? 1 : 0) | (checked_state_ ? 2 : 0),
                                 gradient_rounds_,
                                 parameter_rounds_,
                                 gradient_shortcuts_,
                                 state_rounds_,
                                 skipped_,
                                 static_cast<std::int64_t>(shared_kind_),
                                 delta_compressor_ ? 1 : 0};
    w.i64s(1, head);
    w.f32s(2, to_host(x0_));
    w.nested(3, [&](std::vector<std::byte>& o) { compressor_.save_state(o); });
    if (delta_compressor_) w.nested(4, [&](std::vector<std::byte>& o) { delta_compressor_->save_state(o); });
    w.i64s(5, std::array<std::int64_t, 1>{setup_fingerprint(step_, next_plan_, period_.start)});
    w.finish();
  }

  //! Restores what save_state wrote. All or nothing: a malformed, corrupted or foreign
  //! state raises (wire_error, invalid_argument) and leaves the driver and its
  //! compressors as they were.
  void load_state(std::span<const std::byte> in) {
    state::reader r{in, "commpact.DataParallel", "DataParallel"};
    const auto h = r.i64s(1, 16);
    r.require_that<invalid_argument>(h[0] == total_, "the state is of a run of ", h[0],
                                     " steps, this DataParallel was made for ", total_,
                                     "; make it with the saved run's length.");
    const std::int64_t n = h[1], step = h[2], next = h[3], start = h[4], length = h[5], what = h[6];
    const bool ranges_ok = n >= -1 && step >= 0 && step <= total_ && next >= step && next <= total_ && start >= 0 &&
                           start <= next && length >= 0 && length <= total_ &&
                           (start + length == next || (step == 0 && next == 0)) && (what == 0 || what == 1) &&
                           (h[7] == 0 || h[7] == 1) && h[8] >= 0 && h[8] <= 3 && h[14] >= 0 && h[14] <= 2 &&
                           h[15] == (delta_compressor_ ? 1 : 0);
    bool counters_ok = true;
    for (int i = 9; i <= 13; ++i) counters_ok = counters_ok && h[i] >= 0 && h[i] <= step;
    r.require_that<wire_error>(ranges_ok && counters_ok, "inconsistent state (step ", step, ", next period at ", next,
                               ", ", n, " parameters); the state is corrupted or from another setup.");
    auto x0 = r.f32s(2);
    r.require_that<wire_error>(x0.empty() || static_cast<std::int64_t>(x0.size()) == n, "the state holds ", x0.size(),
                               " saved parameters for a model of ", n, "; the state is corrupted.");
    // Consistent with itself: a run that has stepped knows its model size; inside a
    // parameter period (not a one-step shortcut) the parameters at the period's start are
    // there. And with this object: a model size it already knows.
    const bool in_param_period = what == 1 && step > start && step < next;
    r.require_that<wire_error>((step == 0 || n >= 0) && (n != -1 || x0.empty()) &&
                                   (!in_param_period || (n > 0 && static_cast<std::int64_t>(x0.size()) == n)),
                               "inconsistent state: step ", step, " of a parameter period [", start, ", ", next,
                               ") with ", x0.size(), " saved parameters for a model of ", n,
                               "; the state is corrupted.");
    r.require_that<invalid_argument>(n_ < 0 || n < 0 || n == n_, "the state is of a model of ", n,
                                     " parameters; this DataParallel has stepped with ", n_,
                                     ". Load it into a driver of the same model.");
    const auto main = r.bytes(3);
    const auto delta = delta_compressor_ ? r.bytes(4) : std::span<const std::byte>{};
    if (r.next_is(5)) {  // states saved before the policy was recorded have none
      const auto f = r.i64s(5, 1);
      r.require_that<invalid_argument>(f[0] == setup_fingerprint(step, next, start),
                                       "the state was saved by a DataParallel with another policy (or another "
                                       "average_optimizer_state or compress_deltas); make it with the saved run's "
                                       "policy and options.");
    }
    r.done();
    // Compressors load all or nothing each; keep the first one's state to put back if the second fails.
    std::vector<std::byte> backup;
    if (delta_compressor_) compressor_.save_state(backup);
    compressor_.load_state(main);
    if (delta_compressor_) {
      try {
        delta_compressor_->load_state(delta);
      } catch (...) {
        compressor_.load_state(backup);
        throw;
      }
    }
    n_ = n;
    step_ = step;
    next_plan_ = next;
    period_ = {start, length, what == 0 ? sync_plan::mode::gradients : sync_plan::mode::parameters};
    state_in_sync_ = h[7] != 0;
    checked_params_ = (h[8] & 1) != 0;
    checked_state_ = (h[8] & 2) != 0;
    gradient_rounds_ = h[9];
    parameter_rounds_ = h[10];
    gradient_shortcuts_ = h[11];
    state_rounds_ = h[12];
    skipped_ = h[13];
    shared_kind_ = static_cast<round_kind>(h[14]);
    from_host(x0, x0_);
  }

  //! Steps taken so far (the index of the next step).
  std::int64_t steps() const { return step_; }
  std::int64_t total_steps() const { return total_; }
  //! Synchronisation rounds so far: gradient rounds plus parameter rounds.
  std::int64_t rounds() const { return gradient_rounds_ + parameter_rounds_; }
  std::int64_t gradient_rounds() const { return gradient_rounds_; }
  //! Rounds that closed a parameter period (including one-step periods sent as a gradient).
  std::int64_t parameter_rounds() const { return parameter_rounds_; }
  //! One-step parameter periods synchronised through the gradient.
  std::int64_t gradient_shortcuts() const { return gradient_shortcuts_; }
  //! Averages of the optimizer state (in parameter rounds, or before a gradient round).
  std::int64_t state_rounds() const { return state_rounds_; }
  //! Gradient rounds whose update was skipped because the compressor dropped the step.
  std::int64_t skipped_steps() const { return skipped_; }
  //! The current period (valid after the first step).
  const sync_period& period() const { return period_; }

  Compressor& compressor() { return compressor_; }
  const Compressor& compressor() const { return compressor_; }
  //! The compressor of the parameter deltas: the second one passed, else compressor().
  Compressor& delta_compressor() { return delta_compressor_ ? *delta_compressor_ : compressor_; }
  const Policy& policy() const { return policy_; }
  //! The compressor's communicator: `dp.comm().stats()` under a CountingComm.
  decltype(auto) comm() { return compressor_.comm(); }
  const options& opts() const { return opt_; }

 private:
  enum class round_kind : std::int64_t { none, gradients, deltas };
  enum class undo_kind { none, grads, params };

  //! Ends an overlapped step that raises: the buckets in flight are waited for and rolled
  //! back; raised before step()'s own snapshot, it also puts the driver back to where
  //! begin_backward found it.
  struct overlap_guard {
    DataParallel& dp;
    int uncaught = std::uncaught_exceptions();
    //! Cancels the buckets in flight; true when there were some.
    bool end() noexcept {
      if constexpr (req::overlappable<Compressor>) {
        if (dp.overlap_) {
          dp.compressor_.cancel();
          dp.overlap_ = false;
          return true;
        }
      }
      return false;
    }
    ~overlap_guard() {
      if (std::uncaught_exceptions() > uncaught && end()) dp.restore(*dp.overlap_snap_);
    }
  };

  struct driver_snapshot {
    std::int64_t step, next_plan;
    sync_period period;
    bool state_in_sync, checked_params, checked_state;
    round_kind shared_kind;
    std::int64_t gradient_rounds, parameter_rounds, gradient_shortcuts, state_rounds, skipped;
  };
  driver_snapshot snapshot() {
    x0_swapped_ = false;
    return {step_, next_plan_, period_, state_in_sync_, checked_params_, checked_state_, shared_kind_,
            gradient_rounds_, parameter_rounds_, gradient_shortcuts_, state_rounds_, skipped_};
  }
  void restore(const driver_snapshot& s) {
    step_ = s.step, next_plan_ = s.next_plan, period_ = s.period, state_in_sync_ = s.state_in_sync;
    checked_params_ = s.checked_params, checked_state_ = s.checked_state, shared_kind_ = s.shared_kind;
    gradient_rounds_ = s.gradient_rounds, parameter_rounds_ = s.parameter_rounds;
    gradient_shortcuts_ = s.gradient_shortcuts, state_rounds_ = s.state_rounds, skipped_ = s.skipped;
    if (x0_swapped_) x0_.swap(x0_prev_);
    x0_swapped_ = false;
  }

  //! True when a local step would leave each rank its own optimizer state: the update
  //! has a non-empty state() and average_optimizer_state is off.
  template <class U>
  bool keeps_local_state(U& update) const {
    if constexpr (req::has_optimizer_state<std::remove_cvref_t<U>, space_type>) {
      return !opt_.average_optimizer_state && update.state().size() != 0;
    } else {
      return false;
    }
  }
  //! Whether this period (one step, parameters) is synchronised through the gradient:
  //! only where that is the local step + average exactly, state included (file comment).
  bool one_step_shortcut(bool local_state) const {
    return period_.length == 1 && !opt_.compress_deltas && state_in_sync_ && !local_state;
  }

  void begin_period(span<const float> params, double lr, bool local_state) {
    period_ = detail::next_period(policy_, step_, lr, total_);
    next_plan_ = step_ + period_.length;
    if (opt_.verify_plans) {
      auto& c = compressor_.comm();
      require_same(c, period_.length, "sync period length (DataParallel verify_plans)");
      require_same(c, static_cast<std::int64_t>(period_.what), "sync mode (DataParallel verify_plans)");
    }
    if (period_.what == sync_plan::mode::parameters && !one_step_shortcut(local_state)) {
      x0_prev_.swap(x0_);  // kept until the step completes, for restore()
      x0_swapped_ = true;
      const auto e = exec();
      x0_.resize(params.size(), e);  // grows in the first two periods only
      ops<space_type>::copy(e, params, x0_.view());
    }
  }

  //! Copies what this step is about to write (undo_: what step() puts back if it raises).
  void keep_for_undo(buffer<float>& b, span<const float> v, undo_kind kind) {
    const auto e = exec();
    b.resize(v.size(), e);
    ops<space_type>::copy(e, v, b.view());
    undo_ = kind;
  }
  void put_back(buffer<float>& b, span<float> v) noexcept {
    try {
      ops<space_type>::copy(exec(), b.cview().first(v.size()), v);
    } catch (...) {  // a device fault: the error in flight says more
    }
  }

  //! Before a gradient round: state that diverged in local steps is averaged first.
  template <class U>
  void bring_state_in_sync(U& update) {
    if (state_in_sync_) return;
    if constexpr (req::has_optimizer_state<U, space_type>) {
      if (update.state().size() != 0) {
        dense_mean(update.state(), checked_state_, "optimizer state");
        ++state_rounds_;
      }
    }
    state_in_sync_ = true;  // an update without state() is stateless by contract
  }

  //! x = x0 + mean_r(x_r - x0): delta = x - x0 (a copy, then a subtraction), its mean,
  //! then x = delta + x0 (float addition commutes: the bits of x0 + delta).
  void average_parameters(span<float> params) {
    const auto e = exec();
    delta_.resize(params.size(), e);
    const auto delta = delta_.view();
    ops<space_type>::copy(e, span<const float>(params), delta);
    ops<space_type>::sub(e, delta, x0_.cview());
    if (opt_.compress_deltas) {
      if (!checked_params_) {  // the same one-time check as the dense average's (dense_mean)
        first_average_check(delta_compressor_ ? delta_compressor_->comm() : compressor_.comm(),
                            static_cast<std::int64_t>(delta.size()), "parameter delta");
        checked_params_ = true;
      }
      const bool sent = delta_compressor_ ? reduce_deltas_apart(delta)
                                          : compressor_reduce(compressor_, delta, round_kind::deltas);
      if (!sent) ops<space_type>::fill(e, delta, 0.0f);  // the round is dropped
    } else {
      dense_mean(delta, checked_params_, "parameter delta");
    }
    ops<space_type>::add(e, delta, x0_.cview());
    ops<space_type>::copy(e, span<const float>(delta), params);
  }


  //! The delta round through the second compressor, whose communicator may queue on an
  //! executor of its own (its own stream): it first waits for the delta queued here, and
  //! this executor then waits for its result, with no host wait (events; nothing on the
  //! host).
  bool reduce_deltas_apart(span<float> delta) {
    auto& d = *delta_compressor_;
    constexpr bool events = requires { comm_wait(d.comm(), comm_record(compressor_.comm())); };
    if constexpr (events) comm_wait(d.comm(), comm_record(compressor_.comm()));
    const bool sent = compressor_reduce(d, delta, round_kind::none);
    if constexpr (events) comm_wait(compressor_.comm(), comm_record(d.comm()));
    return sent;
  }

  //! Reduces through c; `kind` (none for the separate delta compressor) guards the shared
  //! compressor's residual against holding gradients and parameter deltas at once.
  bool compressor_reduce(Compressor& c, span<float> v, round_kind kind) {
    if (kind != round_kind::none) {
      require(shared_kind_ == round_kind::none || shared_kind_ == kind, "commpact::DataParallel: at step ", step_,
              " the compressor would send ", kind == round_kind::deltas ? "parameter deltas" : "gradients",
              " after sending ", kind == round_kind::deltas ? "gradients" : "parameter deltas",
              " under compress_deltas; its error-feedback residual would mix the two. Pass a second compressor for "
              "the deltas (DataParallel{for_gradients, for_deltas, policy, steps}), or average deltas densely "
              "(compress_deltas = false).");
      shared_kind_ = kind;
    }
    // The step stays open until step() has run everything that could raise (the user's
    // update included): then it is committed, else cancelled (compress/transaction.hpp).
    return (&c == &compressor_ ? tx_ : delta_tx_).run(c, v);
  }

  //! v = mean_of(sum over ranks in rank order, P): Dense's arithmetic (mean_allreduce,
  //! in the compressor's space). Every rank sees the same sum, so every rank raises alike on a
  //! non-finite value.
  void dense_mean(span<float> v, bool& checked, const char* what) {
    auto& c = compressor_.comm();
    if (!checked) {
      first_average_check(c, static_cast<std::int64_t>(v.size()), what);
      checked = true;
    }
    // A gradient's NaN or Inf is this step's input: the step changes nothing and may be
    // called again. Parameters and optimizer state averaged after local steps carry this
    // step's update (put back when the round raises) and those of the period's earlier
    // local steps (no check runs between rounds), which a retry cannot clear.
    const bool gradient = std::string_view(what) == "gradient";
    mean_allreduce(c, v, status_, nonfinite::raise, "DataParallel", detail::cat("summed ", what), step_,
                   gradient ? "Fix the gradient (lower the learning rate, clip) and call step() again: a step that "
                              "raises changes nothing (parameters, optimizer state and gradients are put back)."
                            : "Some rank's parameters or optimizer state are not finite, from this step's update (a "
                              "NaN or Inf in its gradient, or an update that diverged: fix the gradient and call "
                              "step() again; a step that raises changes nothing) or from a local step earlier in the "
                              "period, which a retry cannot clear: then reload a checkpoint (load_state, with the "
                              "parameters and optimizer state saved beside it) and lower the learning rate or clip.");
  }

  //! What a saved state must be loaded with (section 5): the policy's plans at a fixed
  //! set of steps (every step below 1024, then a geometric grid, and the state's own
  //! step, period start and next plan) and learning rates (1 to 1e-6 by 1, 2, 5 per
  //! decade, and 0), and the options that change what a round does. A policy that raises for an
  //! input counts that as its answer. Policies that differ only where it does not probe
  //! are not told apart.
  std::int64_t setup_fingerprint(std::int64_t step, std::int64_t next, std::int64_t start) const {
    std::vector<std::int64_t> w{opt_.average_optimizer_state ? 1 : 0, opt_.compress_deltas ? 1 : 0};
    std::vector<std::int64_t> steps{step, next, start};
    for (std::int64_t s = 0; s < 1024; ++s) steps.push_back(s);
    for (std::int64_t s = 1024; s < total_;) {
      steps.push_back(s);
      if (s > std::numeric_limits<std::int64_t>::max() - s / 4) break;
      s += s / 4;
    }
    // Decimal literals, the same bits on every machine (a state may be loaded elsewhere).
    constexpr std::array<double, 20> lrs{1.0,  0.5,  0.2,  0.1,  0.05, 0.02, 0.01, 5e-3, 2e-3, 1e-3,
                                         5e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5, 5e-6, 2e-6, 1e-6, 0.0};
    for (const std::int64_t s : steps) {
      if (s < 0 || s >= total_) continue;
      for (const double lr : lrs) {
        try {
          const sync_plan p = policy_.plan(s, lr);
          w.push_back(static_cast<std::int64_t>(p.what));
          w.push_back(p.period);
        } catch (const std::exception&) {
          w.push_back(-1);
          w.push_back(-1);
        }
      }
    }
    return detail::hash_words(w);
  }

  //! Before the first dense average of a buffer kind, one allreduce (require_same, four
  //! int64) checks that every rank has the same length and is at the same step: ranks
  //! whose sync policies (or learning rates) differ reach their first round at different
  //! steps, and would otherwise pair one rank's round with another's without an error.
  //! Raises mismatch_error on every rank. verify_plans checks every period, not only the first.
  template <class C>
  void first_average_check(C& c, std::int64_t n, const char* what) const {
    const std::string length = detail::cat(what, " length (DataParallel)");
    const std::string step = detail::cat("the step of the first average of the ", what, " (DataParallel)");
    const std::string hint =
        detail::cat("ranks that average their ", what, " for the first time at different steps use different sync ",
                    "policies or learning rates; every rank must use the same (verify_plans checks that at every "
                    "period).");
    require_same(c, {{length.c_str(), n}, {step.c_str(), step_, hint.c_str()}});
  }

  auto exec() const { return comm_exec(const_cast<Compressor&>(compressor_).comm()); }
  //! The saved parameters as host floats (state blobs are host bytes), and back.
  std::vector<float> to_host(const buffer<float>& b) const { return copy_to_host<space_type>(exec(), b.cview()); }
  void from_host(const std::vector<float>& h, buffer<float>& b) {
    copy_from_host<space_type>(exec(), std::span<const float>(h), b);
  }

  Compressor compressor_;
  std::optional<Compressor> delta_compressor_;
  pending_step<Compressor> tx_, delta_tx_;
  round_kind shared_kind_ = round_kind::none;
  Policy policy_;
  std::int64_t total_;
  options opt_;
  std::int64_t n_ = -1;
  std::int64_t step_ = 0, next_plan_ = 0;
  sync_period period_{};
  bool state_in_sync_ = true;
  bool checked_params_ = false, checked_state_ = false;
  std::int64_t gradient_rounds_ = 0, parameter_rounds_ = 0, gradient_shortcuts_ = 0, state_rounds_ = 0, skipped_ = 0;
  buffer<float> x0_, x0_prev_, delta_;
  buffer<float> undo_params_, undo_state_, undo_grads_;  // what a raising step puts back
  undo_kind undo_ = undo_kind::none;
  buffer<std::uint32_t> status_;  // the non-finite flag of a dense mean, in the space
  bool x0_swapped_ = false;
  bool overlap_ = false;  // begin_backward started buckets that step() has not waited for
  double overlap_lr_ = 0;
  std::optional<driver_snapshot> overlap_snap_;
};

//! An overlapped step held by the scope of its gradient: the constructor calls
//! begin_backward(grads, lr); when the scope ends before step() has taken the step (an
//! exception unwinds it: backward raised, say), the destructor waits for the buckets in
//! flight and abandons the step (cancel_backward), so no bucket writes a gradient that is
//! destroyed. Declare it after the gradient, so that it ends first:
//!
//! <!-- snippet: dp=commpact::DataParallel<commpact::Bucketed<commpact::Dense<commpact::ThreadComm>>, commpact::EveryStep>; sgd=commpact::Sgd -->
//! \code
//! std::vector<float> grads(n);
//! commpact::backward_scope scope{dp, std::span<float>(grads), lr};
//! // backward, last layer first: dp.grad_ready(layer) as each layer's gradient is final
//! dp.step(params, grads, lr, sgd);  // takes the step; the scope's end is then a no-op
//! \endcode
template <class Driver>
class backward_scope {
 public:
  backward_scope(Driver& dp, typename Driver::template span<float> grads, double lr) : dp_(dp) {
    dp.begin_backward(grads, lr);
  }
  backward_scope(const backward_scope&) = delete;
  backward_scope& operator=(const backward_scope&) = delete;
  ~backward_scope() { dp_.cancel_backward(); }

 private:
  Driver& dp_;
};

}  // namespace commpact
