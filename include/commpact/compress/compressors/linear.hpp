// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file linear.hpp
//! Linear codecs and the allreduce aggregation: when every rank compresses with the
//! same linear map (random-k with a shared seed selects the same k indices on every
//! rank), the sum of the compressed vectors is the compressed sum, so the ranks
//! allreduce m floats instead of all-gathering P messages.
//!
//! A `LinearCodec` has `size(n)` (m, the floats of the compressed form, the same on
//! every rank), `compress(v, out)` (out = A v, A depending on the step but not on the
//! rank) and `decompress_add(in, acc) const` (acc += B in); optional: `begin_step(step)`,
//! `delivered()` (the indices A keeps, when B A is a projection onto them),
//! `keeps_residual()` (false: B A is an unbiased estimate, E[B A v] = v, and the
//! compressor keeps no residual; true when absent), `agreement(n) -> int64` (a value
//! every rank must share, such as a hash of the seed: agreed with the length).
//!
//! `LinearCompressor<K, C>` per step: acc = g + residual; m floats of A acc and one flag
//! float (non-finite input) are summed by one ring allreduce; every rank
//! sees the same flags (so raises or skips alike), scales the sum by 1/P, decompresses
//! it into the zeroed gradient and keeps acc - B A acc as its residual (error feedback),
//! or, for a codec whose keeps_residual() is false, nothing: acc = g and the residual
//! stays empty (an unbiased estimate with a residual would deliver the same gradient
//! again and again: about n/k times for scaled random-k).
//! Bytes per rank per step: the ring allreduce of m + 1 floats, about 2 (P - 1)/P (m + 1) 4
//! (wire::ring_allreduce gives it exactly). n (and the codec's agreement value, when it
//! has one) is agreed by one small allreduce of int64 on the first step; every step adds
//! one allreduce of 6 floats, the step count, the length and an idle flag
//! (compress/step_check.hpp): the codec's shared randomness follows the step, so ranks out
//! of step raise mismatch_error alike in finish() instead of mixing other coordinates. A
//! rank whose length changed after the first step runs the step idle (its allreduce sums
//! a zeroed block of the agreed size; grad and residual untouched) and finish() raises
//! mismatch_error on every rank; when every rank changed to one new length, finish()
//! agrees on it and runs the step (a second fence, that step only).
//!
//! Space (v3): a LinearCodec composed with the aggregation Allreduce<C>
//! (aggregations/allreduce.hpp), run in the communicator's space through the ops rows
//! ef_accumulate, linear_encode, linear_decode and linear_feedback (host_space: at once;
//! deferred_space: queued, the codec's host code running at the fence). Two-phase:
//! `start(grad)` queues the step, `finish()` fences once and reads the status (raises
//! alike on every rank; grad untouched), `commit()` installs the residual, `cancel()`
//! drops the step; `reduce` = start + finish + commit.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../kernels/deferred/ops.hpp"
#include "../../kernels/host/ops.hpp"
#include "../../kernels/status.hpp"
#include "../../nonfinite.hpp"
#include "../../kernels/copies.hpp"
#include "../../state.hpp"
#include "../aggregations/allreduce.hpp"
#include "../codecs/randomk.hpp"
#include "../codecs/sparse_options.hpp"
#include "../error_feedback.hpp"
#include "../step_check.hpp"
#include "../step_phase.hpp"
#include "../step_status.hpp"

namespace commpact {

//! LinearCodec + Allreduce<C> + error feedback = a Compressor (see the file comment).
template <class K, class C>
class LinearCompressor {
  static_assert(LinearCodec<K>, "commpact: LinearCompressor needs a LinearCodec: size(n), compress(v, out), "
                                "decompress_add(in, acc) const.");
  static_assert(diagnose_communicator<C>());

 public:
  using codec_type = K;
  using aggregation_type = Allreduce<C>;
  using space_type = comm_space_t<C>;
  template <class T>
  using span = typename space_type::template span<T>;
  template <class T>
  using buffer = typename space_type::template buffer<T>;

  explicit LinearCompressor(C comm, K codec = K(), nonfinite on_nonfinite = nonfinite::raise,
                            std::string_view name = "LinearCompressor")
      : agg_(std::move(comm)), codec_(std::move(codec)), policy_(on_nonfinite), name_(name) {
    detail::require_nonfinite_policy(on_nonfinite, name_);
  }

  //! Replaces grad by the mean over the ranks of B A (g_r + e_r), the same bits on every
  //! rank. Returns false when the step was skipped (nonfinite::skip_step). A step that
  //! raises changes nothing, grad included.
  bool reduce(span<float> grad) { return detail::reduce_now(*this, grad); }

  //! Queues acc = g + residual, its compression (with the flag) into the aggregation's
  //! block and the allreduce (host_space: runs them). grad must stay alive until
  //! finish(), which writes it. Raises alike on every rank (nothing changed) when the
  //! ranks disagree on the length or some rank's input is rejected.
  void start(span<float> grad) {
    phase_.require_idle(name_);
    const auto n = static_cast<std::int64_t>(grad.size());
    if constexpr (requires { codec_.begin_step(steps_); }) codec_.begin_step(steps_);
    if (!agreed_) agree_length(n);
    idle_ = n != n_;
    step_check_.queue(agg_.comm(), steps_, n, idle_);
    grad_ = grad;
    queue_exchange(static_cast<std::size_t>(n_));
    phase_ = phase::started;
  }

  //! Fences once and reads the status: when the ranks' step counts differ, raises
  //! mismatch_error on every rank (grad holds B); when some rank's input was not finite
  //! (every rank sees the summed flag) or the sum overflowed, raises numeric_error on
  //! every rank with grad untouched, or under skip_step zeroes grad and returns false;
  //! else grad holds B (the mean).
  bool finish() {
    phase_.take_started(name_);
    const auto e = exec();
    if (!idle_) combine();
    fence();
    step_check_.require_same(name_.c_str(), agg_.comm().rank(), steps_, static_cast<std::int64_t>(grad_.size()));
    if (idle_) {  // every rank idle, with one new length: agree on it, then run the step
      agree_length(static_cast<std::int64_t>(grad_.size()));
      idle_ = false;
      queue_exchange(grad_.size());
      combine();
      fence();
    }
    outcome_ = outcome::delivered;
    if (status_.bits() & status_nonfinite) {
      if (policy_ == nonfinite::raise)
        detail::raise_nonfinite(name_ + "::reduce",
                                "gradient (with its residual) of some rank, or the sum over the ranks,",
                                static_cast<std::size_t>(-1), steps_);
      ops<space_type>::fill(e, grad_, 0.0f);
      fence();
      outcome_ = outcome::skipped;
    }
    phase_ = phase::finished;
    return outcome_ == outcome::delivered;
  }

  //! Installs a finished step: acc - B A acc becomes the residual (a codec that keeps
  //! none: nothing), the counters advance.
  void commit() {
    phase_.take_finished(name_);
    if (outcome_ == outcome::skipped) {
      ++steps_, ++skipped_;
      return;
    }
    if (keeps_residual()) {
      const auto e = exec();
      const std::size_t N = ef_.candidate().size();
      if constexpr (!requires { codec_.delivered(); }) {
        approx_.resize(codec_.size(N), e);
        dense_.resize(N, e);
      }
      ops<space_type>::linear_feedback(e, codec_, ef_.candidate(), approx_.view(), dense_.view());
      ef_.commit();
    }
    ++steps_;
  }

  //! Drops a started or finished step: residual and counters as before start(). Queued
  //! work is completed first.
  void cancel() noexcept {
    phase_.drop([&] { fence(); });
    ef_.cancel();
  }

  //! Saves the counters and the residual (state.hpp, kind "commpact.<name>").
  void save_state(std::vector<std::byte>& out) const {
    phase_.require_none_in_flight(name_, "save_state");
    auto& c = const_cast<aggregation_type&>(agg_).comm();
    const state_identity id{detail::codec_fingerprint(codec_, static_cast<std::size_t>(ef_.size()), steps_), c.rank(),
                            c.size()};
    save_feedback_state(out, "commpact." + name_, ef_, exec(), steps_, skipped_, &id);
  }
  //! Restores what save_state wrote; raises and changes nothing on a malformed state.
  void load_state(std::span<const std::byte> in) {
    phase_.require_none_in_flight(name_, "load_state");
    const identity_check id{agg_.comm().rank(), agg_.comm().size(), [this](std::size_t n, std::int64_t step) {
                              return detail::codec_fingerprint(codec_, n, step);
                            }};
    // A residual in a compressor that keeps none is the clearer error: checked first.
    auto st = load_feedback_state(in, "commpact." + name_, name_, false, &id,
                                  [this](state::reader&, const feedback_state& f) {
                                    const std::size_t len = f.ef.residual.size();
                                    require(keeps_residual() || len == 0, "commpact::", name_,
                                            "::load_state: the state holds a residual of ", len,
                                            " values, but this codec runs without error feedback (scaled random-k "
                                            "keeps none); load it into a compressor whose codec keeps a residual "
                                            "(unscaled random-k), or start this one without a state.");
                                  });
    ef_.install(exec(), std::move(st.ef));
    steps_ = st.steps, skipped_ = st.skipped;
    // A residual of the agreed length (or none) keeps the agreement, so a rank that loads
    // alone (a rollback) makes the same calls as the others; one of another length is
    // agreed again at the next step (load it on every rank).
    agreed_ = n_ >= 0 && (ef_.size() == 0 || ef_.size() == n_);
  }

  //! Forgets the residual (every rank, at the same step), e.g. before a length change.
  void reset() {
    phase_.require_idle(name_);
    ef_.forget();
  }
  std::int64_t steps() const { return steps_; }
  //! The tag added to the step count in this compressor's per-step check (0 alone;
  //! Bucketed sets 1 + the bucket's index, detail/check_tag.hpp).
  void set_check_tag(std::uint32_t tag) { step_check_.set_tag(tag); }
  std::uint32_t check_tag() const { return step_check_.tag(); }
  //! True when the next start() begins with this compressor's agreement (one small
  //! allreduce: the first step, the first after a load_state whose residual did not fit).
  //! Bucketed starts no bucket during backward at such a step.
  bool needs_agreement() const { return !agreed_; }
  std::int64_t skipped_steps() const { return skipped_; }
  //! The residual in the space's memory (empty before the first committed step, and
  //! always for a codec that keeps none).
  span<const float> residual() const { return ef_.residual(); }
  K& codec() { return codec_; }
  //! Whether this compressor keeps error feedback (the codec's keeps_residual(), true
  //! when it has none); without it residual() stays empty.
  bool keeps_residual() const {
    if constexpr (requires(const K& k) {
                    { k.keeps_residual() } -> std::convertible_to<bool>;
                  })
      return codec_.keeps_residual();
    else
      return true;
  }
  C& comm() { return agg_.comm(); }
  aggregation_type& aggregation() { return agg_; }

  //! Address and capacity of every internal buffer, sorted (tests check that nothing is
  //! allocated after the first step).
  std::vector<std::pair<const void*, std::size_t>> workspace_signature() const {
    std::vector<std::pair<const void*, std::size_t>> s;
    agg_.add_signature(s);
    ef_.add_signature(s);
    for (const auto* b : {&approx_, &dense_}) s.emplace_back(b->data(), b->capacity());
    s.emplace_back(status_.data(), status_.capacity());
    std::sort(s.begin(), s.end());  // the residual and candidate swap roles at every commit
    return s;
  }

 private:
  using phase = detail::step_phase;
  using outcome = detail::step_outcome;

  phase phase_;  // first: a move checks it before any other member has moved
  aggregation_type agg_;
  K codec_;
  nonfinite policy_;
  std::string name_;
  basic_error_feedback<space_type> ef_;  // the residual and its candidate
  buffer<float> approx_, dense_;
  // the step in flight, the agreement, the counters
  span<float> grad_{};
  detail::status_word<space_type> status_;
  detail::step_check<space_type> step_check_;
  outcome outcome_ = outcome::delivered;
  bool agreed_ = false;
  bool idle_ = false;  // this step's length is not the agreed one (start())
  std::int64_t n_ = -1, steps_ = 0, skipped_ = 0;

  auto exec() const { return comm_exec(const_cast<aggregation_type&>(agg_).comm()); }

  //! The first step's agreement on the length and the codec's settings (or, after an idle
  //! step on every rank, the new length's); raises alike on every rank.
  void agree_length(std::int64_t n) {
    std::string problem = n == 0 ? detail::cat("commpact::", name_, "::reduce: the gradient is empty; "
                                               "pass at least one entry.")
                                 : detail::length_problem(name_.c_str(), n, ef_.size());
    if constexpr (req::codec_has_check<K>)  // random-k: n below 2^31
      if (problem.empty()) problem = std::string(codec_.check(static_cast<std::size_t>(n)));
    if constexpr (req::codec_has_agreement<K>)
      commpact::agree(agg_.comm(), name_.c_str(),
                      {detail::length_item(n, policy_),
                       {"the codec's settings (its agreement value: random-k's seed, scaling and k)",
                        codec_.agreement(static_cast<std::size_t>(n))}},
                      problem, steps_);
    else
      commpact::agree(agg_.comm(), name_.c_str(), {detail::length_item(n, policy_)}, problem, steps_);
    n_ = n, agreed_ = true;
  }

  //! Queues acc = grad_ + residual, its compression into the block of N's m + 1 floats
  //! and the block's allreduce; on an idle step (this rank's length is not the agreed N)
  //! the allreduce sums a zeroed block instead, touching neither grad nor the residual.
  void queue_exchange(std::size_t N) {
    const auto e = exec();
    const auto block = agg_.block(4 * (codec_.size(N) + 1));
    status_.clear(e);
    if (idle_) {
      ops<space_type>::fill(e, block, 0.0f);
    } else {
      ef_.begin(e, N, true);  // no residual (yet, or ever for an unbiased codec): zeros
      ef_.accumulate(e, span<const float>(grad_), 0.0f, span<const float>{}, status_.view());
      ops<space_type>::linear_encode(e, codec_, std::as_const(ef_).candidate(), block, status_.cview());
    }
    agg_.exchange();
  }

  //! Queues the decode of the summed block into grad_ and the status' copy to the host.
  void combine() {
    agg_.combine(codec_, grad_, status_.view());
    status_.fetch(exec());
  }
  //! Waits for the step's queued work under the communicator's deadline.
  void fence() const { comm_fence(const_cast<aggregation_type&>(agg_).comm()); }
};

}  // namespace commpact
