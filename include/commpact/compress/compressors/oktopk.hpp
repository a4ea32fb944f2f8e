// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file oktopk.hpp
//! Ok-Topk (Li and Hoefler, PPoPP 2022): a sparse allreduce whose bytes per rank stay
//! about 2k (P - 1)/P entries whatever P, over any PointToPoint communicator.
//!
//! \code
//! commpact::OkTopK<commpact::MpiComm> ok{world, {.density = 0.01}};
//! ok.reduce(std::span(grad));   // the same sparse average on every rank, error feedback kept
//! \endcode
//!
//! Per step, every rank: acc = g + residual; its local top-k of acc (exact, the ops row
//! oktopk_local) goes to the aggregation SparseReduceScatter<C>
//! (compress/aggregations/sparse_reduce_scatter.hpp: Ok-Topk's sparse reduce-scatter, the
//! global selection, exact every `period` steps and by the threshold theta between, and
//! the allgather of the selected entries; its file comment gives the messages and the
//! bytes); the output is the selected sums / P;
//! the residual clears the local entries that were selected globally; the regions are
//! rebalanced by the selection (when it holds at least P entries). Every rank reads every
//! peer's header, so a rejected or non-finite input anywhere raises (or skips) on every
//! rank alike; a rank whose gradient length changed after a good step rejects its input,
//! and the length its header carries makes that a mismatch_error on every rank.
//! load_state restores the residual, the counters, the regions and theta: a restored
//! compressor continues with the same bits.
//!
//! Space (v3): the data plane runs in the communicator's space (host_space for ThreadComm
//! and MpiComm, deferred_space for DeferredComm<C>) through the oktopk_ rows of ops<Space>.
//! The aggregation's exchange fences twice (a message's size is known when it is posted,
//! no probe); finish() fences once. Two-phase: `start(grad)` (grad untouched), `finish()`
//! writes grad and raises the same error on every rank (grad untouched), `commit()`
//! installs the residual (a swap), the regions, theta and the counters; `cancel()` drops
//! the step, which then changed nothing. `reduce` = start + finish + commit.

#include <algorithm>
#include <cstddef>
#include <array>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../comm/known_size.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../kernels/host/ops.hpp"
#include "../../kernels/status.hpp"
#include "../../nonfinite.hpp"
#include "../../state.hpp"
#include "../aggregations/sparse_reduce_scatter.hpp"
#include "../codecs/sparse_options.hpp"
#include "../error_feedback.hpp"
#include "../step_phase.hpp"

namespace commpact {

struct oktopk_options {
  double density = 0.01;       //!< k = clamp(floor(density n), 1, n): the one rule (sparse_options.hpp)
  std::int64_t period = 32;    //!< steps between threshold re-estimations
  nonfinite on_nonfinite = nonfinite::raise;
};

template <class C>
class OkTopK {
  static_assert(diagnose_point_to_point<C>());

 public:
  using options = oktopk_options;
  using aggregation_type = SparseReduceScatter<C>;
  using space_type = comm_space_t<C>;
  template <class T>
  using span = typename space_type::template span<T>;
  template <class T>
  using buffer = typename space_type::template buffer<T>;

  explicit OkTopK(C comm, oktopk_options opt = {}) : agg_(std::move(comm), checked_period(opt)), opt_(opt) {
    require(opt.density > 0.0 && opt.density <= 1.0, "commpact::OkTopK: density = ", opt.density,
            " is outside (0, 1]; pass the fraction of entries to send, such as 0.01.");
    detail::require_nonfinite_policy(opt.on_nonfinite, "OkTopK");
  }
  //! What one region may select between estimations: ceil(2k / P), at most k.
  static std::size_t region_cap(std::size_t kk, int P) { return aggregation_type::region_cap(kk, P); }
  std::size_t k(std::size_t n) const {
    return static_cast<std::size_t>(std::max<std::int64_t>(detail::k_of_density(opt_.density, static_cast<std::int64_t>(n)), 1));
  }
  //! What the ranks agree on at length n (state_identity.hpp): k and the period.
  std::int64_t fingerprint(std::size_t n) const {
    if (n == 0) return 0;
    const std::array<std::int64_t, 3> w{static_cast<std::int64_t>(n), static_cast<std::int64_t>(k(n)), opt_.period};
    return detail::hash_words(w);
  }

  //! The same sparse average on every rank, in place: start + finish + commit. Returns
  //! false for a skipped step (grad zeroed). A step that raises changes nothing.
  bool reduce(span<float> grad) { return detail::reduce_now(*this, grad); }

  //! Runs the step up to the allgather of the selected entries (queued; fenced where a
  //! message's size depends on the data). grad is read, not written, until finish().
  void start(span<float> grad) {
    phase_.require_idle(who);
    const std::size_t n = grad.size(), kk = k(n);
    if (n == 0) problem_ = "commpact::OkTopK::reduce: the gradient is empty; pass at least one entry.";
    else if (n >= (std::size_t{1} << 31)) problem_ = detail::cat("commpact::OkTopK::reduce: n = ", n, " needs indices above int32.");
    else problem_ = detail::length_problem(who, static_cast<std::int64_t>(n), ef_.size());
    const std::uint32_t flags = problem_.empty() ? 0u : 2u;
    grad_ = grad;
    outcome_ = outcome::delivered;
    pending_ = nullptr;
    const auto e = exec();
    status_.resize(2, e);
    if (!flags) ef_.begin(e, n, true);  // no residual yet: zeros (installed at commit)
    ops<space_type>::fill(e, status_.view(), std::uint32_t{0});
    agg_.set_skips_nonfinite(opt_.on_nonfinite != nonfinite::raise);
    agg_.begin(n, kk, steps_, flags, status_.view());
    if (!flags) {
      ef_.accumulate(e, span<const float>(grad), 0.0f, span<const float>{}, status_.view());
      const auto local = agg_.local_set();
      ops<space_type>::oktopk_local(e, std::as_const(ef_).candidate(), kk, status_.cview(), local.idx, local.val,
                                    ws_);
    }
    phase_ = phase::started;
    try {
      agg_.exchange();
      decide(agg_.flags());
    } catch (...) {
      pending_ = std::current_exception();
    }
  }

  //! Writes grad (the selected sums / P; zero under a skipped step), fences once, then
  //! raises the step's error on every rank alike (grad untouched) or returns. A selected
  //! sum that overflowed (finite inputs) is a non-finite step: numeric_error on every
  //! rank, or a skipped step under skip_step.
  bool finish() {
    phase_.require_started(who);
    const auto e = exec();
    try {
      if (!pending_ && outcome_ == outcome::delivered) {
        agg_.combine(*this, grad_, status_.view());
        agg_.clear_selected(ef_.candidate(), status_.cview());
        status_host_.resize(2);
        ops<space_type>::to_host(e, status_.cview(), status_host_.view());
      }
      fence();
    } catch (...) {
      phase_ = phase::idle;
      throw;
    }
    phase_ = phase::idle;
    if (pending_) std::rethrow_exception(std::exchange(pending_, nullptr));
    const auto sh = std::span<const std::uint32_t>(status_host_.view());
    if (outcome_ == outcome::delivered) require_fenced(sh[0], "OkTopK::finish");
    if (outcome_ == outcome::delivered && (sh[0] & status_wire)) {
      const auto why = detail::cat("OkTopK: rank ", comm().rank(), " at step ", steps_, ": the allgather block of rank ",
                                   sh[1], " has entries out of order, outside its region or not finite.");
      comm().abort(why);
      throw wire_error(detail::cat("commpact::", why, " Every rank must run the same commpact; the step is abandoned."));
    }
    if (outcome_ == outcome::delivered && (sh[0] & status_nonfinite)) {
      // Finite inputs whose sum overflowed: every rank holds the same allgathered blocks,
      // so every rank sees it and decides alike.
      if (opt_.on_nonfinite == nonfinite::raise)
        detail::raise_nonfinite("OkTopK::reduce", "sum of the selected entries over the ranks",
                                static_cast<std::size_t>(-1), steps_);
      outcome_ = outcome::skipped;
    }
    if (outcome_ == outcome::skipped) {
      ops<space_type>::fill(e, grad_, 0.0f);
      fence();
    }
    phase_ = phase::finished;
    return outcome_ == outcome::delivered;
  }

  //! Installs a finished step: the residual (a swap), the rebalanced regions, theta and
  //! the counters.
  void commit() {
    phase_.require_finished(who);
    const bool delivered = outcome_ == outcome::delivered;
    agg_.commit(delivered);
    if (delivered) {
      ef_.commit();
    } else {
      ++skipped_;
    }
    ++steps_;
    phase_ = phase::idle;
  }

  //! Drops a started or finished step (queued work is completed first): the residual,
  //! the regions, theta and the counters stay as before it.
  void cancel() noexcept {
    phase_.drop([&] { fence(); });
    ef_.cancel();
    pending_ = nullptr;
  }

  //! Saves the counters, the residual, the regions and the threshold (sections 12 and
  //! 13: theta's validity and the P + 1 bounds; theta), then who saved it (section 20:
  //! k and the period at the residual's length, this rank, the number of ranks). So a
  //! restored compressor continues with the same bits.
  void save_state(std::vector<std::byte>& out) const {
    phase_.require_none_in_flight("OkTopK", "save_state");
    auto& c = const_cast<aggregation_type&>(agg_).comm();
    const state_identity id{fingerprint(static_cast<std::size_t>(ef_.size())), c.rank(), c.size()};
    save_feedback_state(out, kind, ef_, exec(), steps_, skipped_, &id, [&](state::writer& w) {
      std::vector<std::int64_t> b{agg_.theta_valid() ? 1 : 0};
      b.insert(b.end(), agg_.bounds().begin(), agg_.bounds().end());
      w.i64s(12, b);
      w.f32s(13, std::vector<float>{agg_.theta()});
    });
  }
  //! Restores what save_state wrote; raises and changes nothing on a malformed state
  //! (wire_error) or one another rank, number of ranks, density or period saved
  //! (mismatch_error). A state without the regions (saved before they were) restarts
  //! them: an even split and a new estimate at the next step.
  void load_state(std::span<const std::byte> in) {
    phase_.require_none_in_flight("OkTopK", "load_state");
    const int P = agg_.sources();
    std::vector<std::int64_t> bounds;
    float theta = 0.0f;
    bool theta_valid = false;
    const identity_check id{agg_.comm().rank(), P, [this](std::size_t n, std::int64_t) { return fingerprint(n); }};
    auto st = load_feedback_state(in, kind, who, false, &id, [&](state::reader& r, const feedback_state& f) {
      if (!r.next_is(12)) return;
      auto b = r.i64s(12);
      const auto t = r.f32s(13, 1);
      const auto n = static_cast<std::int64_t>(f.ef.residual.size());
      r.fail_unless(!b.empty() && (b[0] == 0 || b[0] == 1), "section 12 does not start with theta's validity (0 or "
                    "1); the state is corrupted.");
      bounds.assign(b.begin() + 1, b.end());
      const bool ok = bounds.empty() || (bounds.size() == static_cast<std::size_t>(P) + 1 && bounds.front() == 0 &&
                                         bounds.back() == n && std::is_sorted(bounds.begin(), bounds.end()));
      r.fail_unless(ok, "the ", bounds.size(), " region bounds are not P + 1 = ", P + 1, " non-decreasing values "
                    "from 0 to the residual's length ", n, "; the state is corrupted or from another number of ranks.");
      r.fail_unless(t[0] >= 0.0f, "the threshold ", t[0], " is negative; the state is corrupted.");
      theta = t[0];
      theta_valid = b[0] == 1;
    });
    ef_.install(exec(), std::move(st.ef));
    steps_ = st.steps;
    skipped_ = st.skipped;
    agg_.restore(std::move(bounds), theta, theta_valid);
  }
  std::int64_t steps() const { return steps_; }
  //! The tag added to the step count in this compressor's headers (0 alone; Bucketed sets
  //! 1 + the bucket's index, detail/check_tag.hpp).
  void set_check_tag(std::uint32_t tag) { agg_.set_check_tag(tag); }
  std::uint32_t check_tag() const { return agg_.check_tag(); }
  //! False: OkTopK has no first-step agreement (its reduce-scatter headers carry the
  //! length and the step at every step), so Bucketed never holds its buckets back.
  bool needs_agreement() const { return false; }
  std::int64_t skipped_steps() const { return skipped_; }
  //! The residual, in the space's memory (empty before the first step).
  span<const float> residual() const { return ef_.residual(); }
  //! The region boundaries for the next step (P + 1 values) and the current threshold.
  std::span<const std::int64_t> bounds() const { return agg_.bounds(); }
  float theta() const { return agg_.theta(); }
  C& comm() { return agg_.comm(); }
  //! The aggregation (Ok-Topk's sparse reduce-scatter and selection).
  aggregation_type& aggregation() { return agg_; }

  //! Address and capacity of every internal buffer, sorted, to check that steps after the
  //! first allocate nothing (tests compare it across steps).
  std::vector<std::pair<const void*, std::size_t>> workspace_signature() const {
    std::vector<std::pair<const void*, std::size_t>> s;
    auto add = [&](const auto& b) { s.emplace_back(static_cast<const void*>(b.data()), b.capacity()); };
    add(status_);
    ef_.add_signature(s);
    agg_.add_signature(s);
    s.emplace_back(ws_.data(), ws_.capacity_bytes());
    std::sort(s.begin(), s.end());  // the residual and candidate swap roles at every commit
    return s;
  }

 private:
  using phase = detail::step_phase;
  using outcome = detail::step_outcome;
  static constexpr const char* who = "OkTopK";
  static constexpr std::string_view kind = "commpact.OkTopK";

  static std::int64_t checked_period(const oktopk_options& opt) {
    require(opt.period >= 1, "commpact::OkTopK: period = ", opt.period, " must be >= 1 (steps between re-estimations).");
    return opt.period;
  }
  auto exec() const { return comm_exec(const_cast<C&>(agg_.comm())); }
  //! Waits for the step's queued work under the communicator's deadline.
  void fence() const { comm_fence(const_cast<C&>(agg_.comm())); }

  //! After the exchange, from every rank's flags: raises alike on every rank for a
  //! rejected input or (unless skip_step) a non-finite one; a skipped step otherwise.
  void decide(std::uint32_t all) {
    if (all & 2u) detail::raise_rejected(who, problem_, steps_);
    if (all & 1u) {
      if (opt_.on_nonfinite == nonfinite::raise)
        detail::raise_nonfinite("OkTopK::reduce", "gradient (with its residual) of some rank",
                                static_cast<std::size_t>(-1), steps_);
      outcome_ = outcome::skipped;
    }
  }

  phase phase_;  // first: a move checks it before any other member has moved
  aggregation_type agg_;
  oktopk_options opt_;
  typename ops<space_type>::topk_workspace ws_;
  basic_error_feedback<space_type> ef_;  // the residual and its candidate
  buffer<std::uint32_t> status_;
  pinned_t<space_type, std::uint32_t> status_host_;  // 2 words, read after the fence
  span<float> grad_{};
  std::string problem_;
  std::exception_ptr pending_;
  outcome outcome_ = outcome::delivered;
  std::int64_t steps_ = 0, skipped_ = 0;
};

}  // namespace commpact
