// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file majority.hpp
//! signSGD with majority vote and Signum (Bernstein et al., ICML 2018 and ICLR 2019):
//! every rank sends the signs of its gradient (Signum: of its momentum), every rank
//! counts the votes and the update is the sign of their sum (a tie gives 0).
//!
//! \code
//! commpact::MajorityVote<commpact::MpiComm> vote{world};            // signSGD
//! commpact::MajorityVote<commpact::MpiComm> signum{world, {.momentum = 0.9f}};
//! vote.reduce(std::span(grad));   // grad = s * sign(sum_r sign(g_r)), the same bits on every rank
//! \endcode
//!
//! The votes move as bit vectors through Allgather<C>: each rank's block is the 48-byte
//! frame header of allgather.hpp, a float32 scale (the rank's ||m||_1 / n) and ceil(n / 8)
//! sign bytes (bit set: negative), so the bytes per rank per step are
//! (P - 1) (48 + 4 + ceil(n / 8) rounded up to 4): about (P - 1) n / 8. An allreduce of int8
//! vote counts would cost about 2 n bytes per rank (ring) whatever P, so bits win while
//! P - 1 < 16, the sizes data-parallel training of one model runs at; past that an
//! allreduce would be the better aggregation. s is the mean of the ranks' scales when
//! `scaled` (the default: the update keeps the gradient's size), else 1 (the paper's
//! sign, for a learning rate sized to it). No error feedback: the vote is the method.
//!
//! Space (v3): sign_codec (the scale and the sign bits, encoded behind the frame header
//! by the ops row codec_encode_frame) composed with the aggregation Vote<C>
//! (aggregations/vote.hpp), run in the communicator's space through the ops rows
//! signum_update and sign_vote (host_space: at once; deferred_space: queued). Two-phase:
//! `start(grad)` queues the whole step (the vote into grad included, written only when
//! every header is clean: Vote's combine); `finish()` fences once, checks every rank's
//! header alike (wire/codec_frame.hpp) and the status; `commit()` installs Signum's
//! momentum; `cancel()` drops the step; `reduce` = start + finish + commit. The first step
//! agrees on the length and the options (one small allreduce); a later length whose block
//! has another capacity runs the step idle on this rank (a rejected header in a block of
//! the agreed capacity, so every rank makes the same calls over any communicator), and
//! finish() raises mismatch_error on every rank, or, when every rank has that length,
//! agrees on it and runs the step (a second fence, that step only).

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../concepts.hpp"
#include "../../detail/check_tag.hpp"
#include "../../error.hpp"
#include "../../kernels/deferred/ops.hpp"
#include "../../kernels/host/ops.hpp"
#include "../../kernels/status.hpp"
#include "../../nonfinite.hpp"
#include "../../kernels/copies.hpp"
#include "../../state.hpp"
#include "../state_identity.hpp"
#include "../aggregations/vote.hpp"
#include "../codecs/sparse_options.hpp"
#include "../codecs/topk_sign.hpp"
#include "../../wire/codec_frame.hpp"
#include "../frame_headers.hpp"
#include "../step_phase.hpp"
#include "../step_status.hpp"
#include "codec_compressor.hpp"

namespace commpact {

struct majority_options {
  float momentum = 0.0f;  //!< Signum's beta: m = beta m + (1 - beta) g (m starts at the first g); 0 is signSGD
  bool scaled = true;     //!< the update's magnitude: the mean of ||m_r||_1 / n (true) or 1
  nonfinite on_nonfinite = nonfinite::raise;
};

//! sign_codec + Vote<C> (+ Signum's momentum) = a Compressor (see the file comment).
template <class C>
class MajorityVote {
  static_assert(diagnose_communicator<C>());

 public:
  using options = majority_options;
  using codec_type = sign_codec;
  using aggregation_type = Vote<C>;
  using space_type = comm_space_t<C>;
  template <class T>
  using span = typename space_type::template span<T>;
  template <class T>
  using buffer = typename space_type::template buffer<T>;

  explicit MajorityVote(C comm, majority_options opt = {}) : agg_(std::move(comm), opt.scaled), opt_(opt) {
    require(opt.momentum >= 0.0f && opt.momentum < 1.0f, "commpact::MajorityVote: momentum = ", opt.momentum,
            " is outside [0, 1); Signum uses 0.9, signSGD 0.");
    detail::require_nonfinite_policy(opt.on_nonfinite, "MajorityVote");
  }
  //! The payload of a vote for n values: the scale and the sign bits.
  static std::size_t payload_bytes(std::size_t n) { return 4 + (n + 7) / 8; }
  //! One rank's block: header and payload, rounded up to 4 bytes.
  static std::size_t block_bytes(std::size_t n) { return (frame::header_bytes + payload_bytes(n) + 3) / 4 * 4; }

  //! Replaces grad by s sign(sum of the ranks' signs). Returns false when the step was
  //! skipped (NaN/Inf under nonfinite::skip_step). A step that raises changes nothing.
  bool reduce(span<float> grad) { return detail::reduce_now(*this, grad); }

  //! Queues Signum's momentum (signSGD: the gradient itself), its encoding behind the
  //! frame header, the exchange and the vote into grad, written only when every header is
  //! clean (host_space: runs them). grad must stay alive until finish().
  void start(span<float> grad) {
    phase_.require_idle("MajorityVote");
    const std::size_t n = grad.size();
    problem_.clear();
    if (n == 0) problem_ = "commpact::MajorityVote::reduce: the gradient is empty; pass at least one entry.";
    else if (opt_.momentum > 0.0f && m_n_ > 0 && m_n_ != n)
      problem_ = detail::length_problem("MajorityVote", static_cast<std::int64_t>(n), static_cast<std::int64_t>(m_n_));
    else
      problem_ = frame::payload_problem("MajorityVote", "vote", n, payload_bytes(n));
    if (!agreed_) agree_block(n);
    // A length whose block is not the agreed one (after the first step) runs the step
    // idle: a rejected header in a block of the agreed capacity, so every rank makes the
    // same calls; finish() raises on every rank, or agrees when every rank has that length.
    idle_ = block_bytes(n) != cap_;
    grad_ = grad;
    queue_vote();
    phase_ = phase::started;
  }

  //! Fences once, then checks every rank's header alike (mismatch_error, a rejected
  //! input, a non-finite input: numeric_error or, under skip_step, grad zeroed and false)
  //! and the status: a malformed vote raises wire_error on every rank. grad is untouched
  //! when it raises; else it holds the vote.
  bool finish() {
    phase_.take_started("MajorityVote");
    const auto e = exec();
    fence();
    std::uint16_t flags = headers_.check(agg_.sources(), cap_, "MajorityVote");
    if (idle_) {  // every rank's header has this rank's length, so every rank is idle: agree on it, run the step
      agree_block(grad_.size());
      idle_ = false;
      queue_vote();
      fence();
      flags = headers_.check(agg_.sources(), cap_, "MajorityVote");
    }
    if (flags & frame::rejected_input) detail::raise_rejected("MajorityVote", problem_, steps_);
    outcome_ = outcome::delivered;
    if (flags & frame::nonfinite_input) {
      if (opt_.on_nonfinite == nonfinite::raise)
        detail::raise_nonfinite("MajorityVote::reduce", "gradient (or momentum) of some rank",
                                static_cast<std::size_t>(-1), steps_);
      ops<space_type>::fill(e, grad_, 0.0f);
      fence();
      outcome_ = outcome::skipped;
      phase_ = phase::finished;
      return false;
    }
    if (status_.bits() & status_wire)
      throw wire_error(detail::cat("commpact::MajorityVote::reduce: a rank's vote at step ", steps_, " is malformed "
                                   "(a payload that is not 4 + ceil(n / 8) = ", payload_bytes(grad_.size()),
                                   " bytes, a scale that is not finite and >= 0, or sign bits set past its n values); "
                                   "every rank received the same votes and abandons the step."));
    phase_ = phase::finished;
    return true;
  }

  //! Installs a finished step: Signum's new momentum; the counters advance.
  void commit() {
    phase_.take_finished("MajorityVote");
    ++steps_;
    if (outcome_ == outcome::skipped) {
      ++skipped_;
      return;
    }
    if (opt_.momentum > 0.0f) {
      m_.swap(next_);
      m_n_ = m_.size();
    }
  }

  //! Drops a started or finished step (queued work is completed first).
  void cancel() noexcept { phase_.drop([&] { fence(); }); }

  //! Saves the counters and Signum's momentum (state.hpp, kind "commpact.MajorityVote").
  void save_state(std::vector<std::byte>& out) const {
    phase_.require_none_in_flight("MajorityVote", "save_state");
    const std::vector<float> m = copy_to_host<space_type>(exec(), momentum());
    state::writer w{out, "commpact.MajorityVote"};
    state::write_counters(w, steps_, skipped_);
    w.f32s(10, m);
    auto& c = const_cast<aggregation_type&>(agg_).comm();
    state::write_identity(w, {0, c.rank(), c.size()});  // section 20: this rank, the number of ranks
    w.finish();
  }
  //! Restores what save_state wrote; raises and changes nothing on a malformed state, and
  //! mismatch_error on a state another rank or number of ranks saved, or one with
  //! Signum's momentum into signSGD (or the reverse).
  void load_state(std::span<const std::byte> in) {
    phase_.require_none_in_flight("MajorityVote", "load_state");
    state::reader r{in, "commpact.MajorityVote", "MajorityVote"};
    const auto [s, k] = state::read_counters(r);
    auto m = r.f32s(10);
    state::check_identity(r, "MajorityVote", agg_.comm().rank(), agg_.comm().size());
    r.done();
    r.require_that<mismatch_error>(m.empty() || opt_.momentum > 0.0f, "the state holds Signum's momentum (",
                                   m.size(), " values) but this MajorityVote is signSGD (momentum 0); load it into "
                                   "one built with the same momentum.");
    // Signum's momentum exists from its first kept step on (a run whose steps were all
    // skipped has none yet).
    r.require_that<mismatch_error>(!m.empty() || s == k || opt_.momentum == 0.0f, "the state was saved by signSGD "
                                   "(no momentum) after ", s - k, " kept steps but this MajorityVote is Signum "
                                   "(momentum ", opt_.momentum, "); load it into one built with the same momentum.");
    copy_from_host<space_type>(exec(), std::span<const float>(m), m_);
    // The agreement (length, options) stays: a momentum of another length is rejected at
    // the next step on every rank alike (its frame header), and a rank that loads alone (a
    // rollback) makes the same calls as the others.
    m_n_ = m.size(), steps_ = s, skipped_ = k;
  }

  std::int64_t steps() const { return steps_; }
  //! The tag added to the step count in this compressor's frame headers (0 alone;
  //! Bucketed sets 1 + the bucket's index, detail/check_tag.hpp).
  void set_check_tag(std::uint32_t tag) { check_tag_ = detail::checked_tag(tag); }
  std::uint32_t check_tag() const { return check_tag_; }
  //! True when the next start() begins with this compressor's agreement (one small
  //! allreduce: the first step). Bucketed starts no bucket during backward at such a step.
  bool needs_agreement() const { return !agreed_; }
  std::int64_t skipped_steps() const { return skipped_; }
  //! Signum's momentum in the space's memory (empty for signSGD and before the first step).
  span<const float> momentum() const { return m_.cview().first(m_n_); }
  auto& comm() { return agg_.comm(); }
  aggregation_type& aggregation() { return agg_; }

  //! Address and capacity of every internal buffer, sorted (tests check that nothing is
  //! allocated after the first step).
  std::vector<std::pair<const void*, std::size_t>> workspace_signature() const {
    std::vector<std::pair<const void*, std::size_t>> s;
    agg_.add_signature(s);
    for (const auto* b : {&m_, &next_}) s.emplace_back(b->data(), b->capacity());
    s.emplace_back(status_.data(), status_.capacity());
    s.emplace_back(headers_.data(), headers_.capacity());
    std::sort(s.begin(), s.end());  // the momentum and its candidate swap roles at every commit
    return s;
  }

 private:
  using phase = detail::step_phase;
  using outcome = detail::step_outcome;

  auto exec() const { return comm_exec(const_cast<aggregation_type&>(agg_).comm()); }
  //! Waits for the step's queued work under the communicator's deadline.
  void fence() const { comm_fence(const_cast<aggregation_type&>(agg_).comm()); }

  //! The first step's agreement (or, after an idle step on every rank, the new length's):
  //! the length, Signum's momentum, `scaled` and the policy; raises alike on every rank.
  void agree_block(std::size_t n) {
    commpact::agree(agg_.comm(), "MajorityVote",
                    {detail::length_item(static_cast<std::int64_t>(n), opt_.on_nonfinite),
                     {"Signum's momentum (the bits of the float)", std::bit_cast<std::int32_t>(opt_.momentum)},
                     {"`scaled` (1: the update has the mean |m|, 0: unit votes)", opt_.scaled ? 1 : 0}},
                    problem_, steps_);
    const std::size_t cap = block_bytes(n);
    agg_.reserve(cap);
    cap_ = cap, agreed_ = true;
  }

  //! Queues the step on grad_: Signum's update, the frame (a rejected header when the
  //! input has a problem or the step is idle), the exchange, the headers' copy to the
  //! host and the vote into grad_ (written only from clean headers).
  void queue_vote() {
    const auto e = exec();
    const std::size_t n = grad_.size();
    const bool momentum = opt_.momentum > 0.0f;
    const bool send = problem_.empty() && !idle_;
    const frame::header h{.flags = send ? std::uint16_t{0} : std::uint16_t{frame::rejected_input},
                          .n = static_cast<std::int64_t>(n),
                          .step = detail::tagged_step(steps_, check_tag_),
                          .capacity = static_cast<std::int64_t>(cap_)};
    const auto block = agg_.block(cap_);
    status_.clear(e);
    if (send) {
      next_.resize(n, e);
      if (momentum) m_.reserve(n, e);  // the other half of the swap: nothing allocated after step one
      const auto m = momentum && m_n_ > 0 ? m_.cview().first(m_n_) : span<const float>{};
      ops<space_type>::signum_update(e, next_.view(), m, span<const float>(grad_), opt_.momentum, status_.view());
    }
    ops<space_type>::template codec_encode_frame<sign_codec>(e, sign_ws_, codec_, next_.cview(), block, h,
                                                             span<float>{}, status_.cview());
    agg_.exchange();
    headers_.queue(e, agg_);  // 48 bytes per rank to the host; the payloads stay in the space
    agg_.combine(codec_, grad_, status_.view());  // grad written only from clean headers and payloads
    status_.fetch(e);
  }

  phase phase_;  // first: a move checks it before any other member has moved
  aggregation_type agg_;
  majority_options opt_;
  sign_codec codec_;
  [[no_unique_address]] typename ops<space_type>::template codec_workspace<sign_codec> sign_ws_;  // empty in every space
  buffer<float> m_, next_;
  std::size_t m_n_ = 0;
  // the frame protocol: the agreed block capacity, every rank's header, this rank's rejection
  std::size_t cap_ = 0;
  bool agreed_ = false;
  bool idle_ = false;  // this step's block is not the agreed one (start())
  frame::host_headers<space_type> headers_;
  std::string problem_;
  // the step in flight and the counters
  span<float> grad_{};
  detail::status_word<space_type> status_;
  outcome outcome_ = outcome::delivered;
  std::int64_t steps_ = 0, skipped_ = 0;
  std::uint32_t check_tag_ = 0;  // detail/check_tag.hpp
};

}  // namespace commpact
