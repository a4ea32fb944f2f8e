// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cast_allreduce.hpp
//! The fp16 and bf16 casts reduced by an allreduce in the 16-bit type, as PyTorch's
//! `fp16_compress_hook` and `bf16_compress_hook` do: 2 bytes per value on the wire, so
//! half of what Dense sends, where the same codecs under the allgather
//! (`CodecCompressor<fp16_codec, Allgather<C>>`) send (P - 1)(48 + 2n) bytes per rank.
//!
//! \code
//! commpact::Fp16Allreduce<commpact::ThreadComm> half{comm};
//! half.reduce(std::span(grad));   // grad = mean over ranks, summed in binary16, same bits on every rank
//! \endcode
//!
//! Per step on every rank (the codec's error feedback, as its allgather form keeps):
//! acc = g + residual; h_i = codec.to_code(acc_i) (saturating: |acc_i| above the
//! format's largest finite value sends that value) and, for a non-finite acc_i, a NaN
//! code, so that every rank's sum shows it; residual candidate = acc - from_code(h).
//! The codes are summed by ring_allreduce_spans (comm/ring.hpp) with the codec's `add`: IEEE
//! addition in the 16-bit type (round to nearest even, overflow to Inf), chunk c in the
//! ring order c, c + 1, ..., c - 1. Every rank then holds the same sums; a non-finite
//! sum (NaN input anywhere, or an overflow of the 16-bit sum) takes the non-finite
//! policy on every rank alike (numeric_error, or skip_step: grad zeroed, residual kept);
//! otherwise grad_i = mean_of(from_code(sum_i), P), the one mean of kernels/mean.hpp.
//! PyTorch's hooks divide by P before the cast instead (fewer overflows, more
//! underflow); with `error_feedback = false` and P a power of two the results differ
//! only where a partial sum overflows or rounds differently.
//!
//! Bytes per rank per step: wire::ring_allreduce(rank, P, n, 2), exactly half of
//! Dense's ring allreduce of n floats; 2 (P - 1) messages. The first step agrees on n and
//! the format with one small allreduce of int64; every step adds one allreduce of 6
//! floats, the step count, the length and an idle flag (compress/step_check.hpp), so
//! ranks out of step raise mismatch_error alike in finish(). A rank whose length changed
//! after the first step runs the step idle (its ring sums zero codes of the agreed length,
//! grad and residual untouched) and finish() raises mismatch_error on every rank; when
//! every rank changed to one new length, finish() agrees on it and runs the step (after
//! reset(), when error feedback holds a residual of the old length).
//!
//! Space (v3): every step runs in the communicator's space (host_space for ThreadComm
//! and MpiComm, deferred_space for DeferredComm<C>) through rows of ops<Space>: the cast
//! with error feedback (cast_encode), the ring's per-chunk add (cast_add, after each
//! known-size transfer of comm/ring.hpp's ring_allreduce_spans) and the decode into the
//! mean (cast_decode_mean, which reports a non-finite sum in the step status). Two-phase
//! like Dense: `start(grad)` queues the encode and the ring (grad untouched),
//! `finish()` queues the decode into grad, fences once and reads the status (grad
//! untouched on a raise), `commit()` keeps the residual (a swap) and counts the step,
//! `cancel()` drops it. `reduce` = start + finish + commit.

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <string_view>
#include <utility>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../comm/known_size.hpp"
#include "../../comm/ring.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../kernels/host/ops.hpp"
#include "../../kernels/status.hpp"
#include "../../state.hpp"
#include "../codecs/casts.hpp"
#include "../codecs/sparse_options.hpp"
#include "../error_feedback.hpp"
#include "../../nonfinite.hpp"
#include "../step_check.hpp"
#include "../step_phase.hpp"
#include "../state_identity.hpp"
#include "../step_status.hpp"

namespace commpact {

//! Options of CastAllreduce.
struct cast_allreduce_options {
  //! Keep what the cast rounds away (and what saturation clips) for the next step.
  bool error_feedback = true;
  nonfinite on_nonfinite = nonfinite::raise;
};

namespace req {
//! A 16-bit cast codec: per-value codes, their finiteness and their IEEE sum.
template <class K>
concept cast_codec = requires(float v, std::uint16_t h) {
  { K::to_code(v) } -> std::same_as<std::uint16_t>;
  { K::from_code(h) } -> std::same_as<float>;
  { K::finite_code(h) } -> std::same_as<bool>;
  { K::add(h, h) } -> std::same_as<std::uint16_t>;
};
}  // namespace req

template <class Cast, class Comm>
class CastAllreduce {
  static_assert(diagnose_communicator<Comm>());
  static_assert(req::cast_codec<Cast>, "commpact::CastAllreduce: the codec must be a 16-bit cast (fp16_codec or "
                                       "bf16_codec): static to_code, from_code, finite_code and add.");

 public:
  using options = cast_allreduce_options;
  using space_type = comm_space_t<Comm>;
  template <class T>
  using span = typename space_type::template span<T>;
  template <class T>
  using buffer = typename space_type::template buffer<T>;

  explicit CastAllreduce(Comm comm, options opt = {}) : comm_(std::move(comm)), opt_(opt) {
    detail::require_nonfinite_policy(opt.on_nonfinite, who);
  }

  //! Averages grad over the ranks in place. Returns false when the step was skipped.
  bool reduce(span<float> grad) { return detail::reduce_now(*this, grad); }

  //! Queues the encode of grad (plus the residual) and the sum of the codes over the
  //! ranks (host_space: runs them); grad is untouched until finish().
  void start(span<float> grad) {
    phase_.require_idle(who);
    const auto n = static_cast<std::int64_t>(grad.size());
    if (!agreed_) agree_length(n);
    idle_ = n != checked_size_;
    step_check_.queue(comm_, steps_, n, idle_);
    grad_ = grad;
    queue_ring(static_cast<std::size_t>(checked_size_));
  }

  //! Queues the decode of the sums into grad, fences once, then raises mismatch_error on
  //! every rank when the ranks' step counts differ (grad holds the decoded mean), or
  //! numeric_error for a non-finite sum (grad untouched), or under skip_step zeroes grad
  //! and returns false.
  bool finish() {
    phase_.require_started(who);
    const auto e = exec();
    decode_and_fence();
    step_check_.require_same(who, comm_.rank(), steps_, static_cast<std::int64_t>(grad_.size()));
    if (idle_) {  // every rank idle, with one new length: agree on it, then run the step
      agree_length(static_cast<std::int64_t>(grad_.size()));
      idle_ = false;
      queue_ring(grad_.size());
      decode_and_fence();
    }
    skipped_step_ = (status_.bits() & status_nonfinite) != 0;
    if (skipped_step_) {
      if (opt_.on_nonfinite == nonfinite::raise)
        detail::raise_nonfinite(who, "summed gradient", static_cast<std::size_t>(-1), steps_);
      ops<space_type>::fill(e, grad_, 0.0f);
      fence();
    }
    phase_ = phase::finished;
    return !skipped_step_;
  }

  //! Keeps the residual of a delivered step and counts the step.
  void commit() {
    phase_.require_finished(who);
    if (!skipped_step_ && opt_.error_feedback) ef_.commit();
    ++steps_;
    if (skipped_step_) ++skipped_;
    phase_ = phase::idle;
  }

  //! Drops a started or finished step: the residual and counters stay as before it
  //! (queued work is completed first).
  void cancel() noexcept {
    phase_.drop([&] { fence(); });
    ef_.cancel();
  }

  //! Saves the counters and the residual, then who saved it (section 20,
  //! state_identity.hpp: the 16-bit format at the residual's length, this rank, the
  //! number of ranks).
  void save_state(std::vector<std::byte>& out) const {
    phase_.require_none_in_flight("CastAllreduce", "save_state");
    state::writer w{out, kind};
    state::write_counters(w, steps_, skipped_);
    ef_.save_residual(w, exec(), 2);
    auto& c = const_cast<Comm&>(comm_);
    state::write_identity(w, {fingerprint(static_cast<std::size_t>(ef_.size())), c.rank(), c.size()});
    w.finish();
  }

  //! Restores what save_state wrote; raises and changes nothing on a malformed state (a
  //! residual of another length than the next gradient is rejected at that step).
  void load_state(std::span<const std::byte> in) {
    phase_.require_none_in_flight("CastAllreduce", "load_state");
    state::reader r{in, kind, who};
    const auto [s, k] = state::read_counters(r);
    auto res = r.f32s(2);
    r.fail_unless(opt_.error_feedback || res.empty(), "a residual of ", res.size(),
                  " values for a compressor without error feedback");
    // Another rank's residual, or an fp16 residual in bf16, would load and train on silently.
    state::check_identity(r, who, comm_.rank(), comm_.size(), res.size(), s,
                          [](std::size_t n, std::int64_t) { return fingerprint(n); });
    r.done();
    steps_ = s;
    skipped_ = k;
    // A residual of the agreed length (or none) keeps the agreement, so a rank that loads
    // alone (a rollback) makes the same calls as the others; one of another length is
    // agreed again at the next step (load it on every rank).
    agreed_ = checked_size_ >= 0 && (res.empty() || static_cast<std::int64_t>(res.size()) == checked_size_);
    ef_.install(exec(), {std::move(res), {}});
  }

  //! Forgets the residual (every rank, at the same step), e.g. before a length change.
  void reset() {
    phase_.require_idle(who);
    ef_.forget();
  }

  //! The residual, in the space's memory.
  span<const float> residual() const { return ef_.residual(); }
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
  Comm& comm() { return comm_; }

  //! Address and capacity of every internal buffer, sorted, to check that steps after the
  //! first allocate nothing (tests compare it across steps).
  std::vector<std::pair<const void*, std::size_t>> workspace_signature() const {
    std::vector<std::pair<const void*, std::size_t>> s;
    auto add = [&](const auto& b) { s.emplace_back(b.data(), b.capacity()); };
    add(codes_), add(scratch_), add(status_);
    ef_.add_signature(s);
    std::sort(s.begin(), s.end());  // the residual and candidate swap roles at every commit
    return s;
  }

 private:
  using phase = detail::step_phase;
  static constexpr const char* who = "CastAllreduce";
  static constexpr std::string_view kind = "commpact.CastAllreduce";
  static std::int64_t format_id() {
    if constexpr (std::is_same_v<Cast, fp16_codec>) return 1;
    else if constexpr (std::is_same_v<Cast, bf16_codec>) return 2;
    else return 3;
  }
  //! What a saved residual of n values must be loaded with (state_identity.hpp): the format.
  static std::int64_t fingerprint(std::size_t n) {
    if (n == 0) return 0;
    const std::array<std::int64_t, 2> w{static_cast<std::int64_t>(n), format_id()};
    return detail::hash_words(w);
  }
  auto exec() const { return comm_exec(const_cast<Comm&>(comm_)); }
  //! Waits for the step's queued work under the communicator's deadline.
  void fence() const { comm_fence(const_cast<Comm&>(comm_)); }

  //! The first step's agreement (or, after an idle step on every rank, the new length's).
  void agree_length(std::int64_t n) {
    const auto problem = detail::length_problem(who, n, ef_.size());
    agree(comm_, who, {detail::length_item(n, opt_.on_nonfinite), {"the 16-bit format (fp16 1, bf16 2)", format_id()}},
          problem, steps_);
    checked_size_ = n, agreed_ = true;
    if (opt_.error_feedback && ef_.size() == 0) ef_.install_zeros(exec(), static_cast<std::size_t>(n));
  }

  //! Queues the encode of grad_ (plus the residual) into N codes and their ring sum; an
  //! idle step (this rank's length is not the agreed N) sums N zero codes instead,
  //! touching neither grad_ nor the residual. Sets phase started.
  void queue_ring(std::size_t N) {
    const auto e = exec();
    codes_.resize(N, e);
    if (opt_.error_feedback && !idle_) ef_.begin(e, N, false);
    scratch_.resize(wire::ring_chunk(N, comm_.size(), 0), e);
    status_.clear(e);
    if (idle_)
      ops<space_type>::fill(e, codes_.view(), std::uint16_t{0});
    else
      ops<space_type>::template cast_encode<Cast>(e, span<const float>(grad_), ef_.residual(), codes_.view(),
                                                  ef_.candidate());
    phase_ = phase::started;
    try {
      ring_allreduce_spans(comm_, codes_.view(), scratch_.view(), [&](span<std::uint16_t> in, span<std::uint16_t> mine) {
        ops<space_type>::template cast_add<Cast>(e, span<const std::uint16_t>(in), mine);
      });
    } catch (...) {
      cancel();
      throw;
    }
  }

  //! Queues the decode of the sums into grad (not on an idle step), fences, and leaves
  //! the phase idle (a raise too).
  void decode_and_fence() {
    const auto e = exec();
    try {
      if (!idle_) {
        ops<space_type>::template cast_decode_mean<Cast>(e, codes_.cview(), grad_, comm_.size(), status_.view());
        status_.fetch(e);
      }
      fence();
    } catch (...) {
      phase_ = phase::idle;
      throw;
    }
    phase_ = phase::idle;
  }

  phase phase_;  // first: a move checks it before any other member has moved
  Comm comm_;
  options opt_;
  basic_error_feedback<space_type> ef_;  // the residual (empty without error feedback) and its candidate
  buffer<std::uint16_t> codes_, scratch_;
  // the step in flight, the length the ranks agreed on, the counters
  span<float> grad_{};
  detail::status_word<space_type> status_;
  detail::step_check<space_type> step_check_;
  bool idle_ = false;  // this step's length is not the agreed one (start())
  bool skipped_step_ = false;
  bool agreed_ = false;              // false: agree at the next step (first step, a load that does not fit)
  std::int64_t checked_size_ = -1;  // the last agreed length
  std::int64_t steps_ = 0, skipped_ = 0;
};

//! IEEE binary16 allreduce (PyTorch's fp16_compress_hook).
template <class Comm>
using Fp16Allreduce = CastAllreduce<fp16_codec, Comm>;
//! bfloat16 allreduce (PyTorch's bf16_compress_hook).
template <class Comm>
using Bf16Allreduce = CastAllreduce<bf16_codec, Comm>;

}  // namespace commpact
