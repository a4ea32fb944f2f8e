// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codec_compressor.hpp
//! The compressor that composes any Codec with an aggregation and with error feedback.
//! `CodecCompressor<Codec, Allgather<C>>` is a Compressor:
//!
//! \code
//! commpact::CodecCompressor<commpact::sign_codec, commpact::Allgather<commpact::ThreadComm>> ef_sign{comm};
//! ef_sign.reduce(std::span(grad));   // grad = (1/P) sum_r decode(encode(grad_r + residual_r)), same bits everywhere
//! \endcode
//!
//! Per step on every rank: acc = g + residual (DGC momentum and clipping as in
//! sparse_options); the codec encodes acc into this rank's block behind a 48-byte frame
//! header; the blocks are all-gathered; every rank checks every header and decodes the
//! blocks in rank order into a zeroed sum (the same float additions on every rank), then
//! divides by P; what this rank's codec did not deliver stays in its residual.
//!
//! Frame header (48 bytes): u32 magic 0x47415043 ("CPAG"), u16 version 1, u16 flags
//! (bit 0 non-finite input, bit 1 input rejected), u32 payload bytes, u32 0, then i64
//! n, i64 the codec's agreement value (k for top-k), i64 step, i64 block capacity.
//! Every rank sees every header, so disagreement on n, k, the step or the capacity, a
//! rejected input or NaN/Inf on any rank is seen by every rank, and every rank raises
//! the same error (or skips the step) without an extra message. A block capacity that
//! changes (first step, a warm-up boundary) is agreed first with one small allreduce; a
//! later length of another capacity on some ranks runs the step idle there (a rejected
//! header in a block of the agreed capacity, so every rank makes the same calls) and
//! every rank raises mismatch_error, or, with that length on every rank, finish() agrees
//! on it and runs the step (a second fence, that step only).
//!
//! Bytes per rank per step over Allgather: (P - 1) * capacity, capacity = 48 +
//! max_encoded_bytes(n) rounded up to 4. For top-k: (P - 1) * (48 + 8k).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../concepts.hpp"
#include "../../detail/check_tag.hpp"
#include "../../error.hpp"
#include "../../kernels/copies.hpp"
#include "../../state.hpp"
#include "../../kernels/deferred/ops.hpp"
#include "../../kernels/host/ops.hpp"
#include "../../kernels/status.hpp"
#include "../error_feedback.hpp"
#include "../../wire/codec_frame.hpp"
#include "../frame_headers.hpp"
#include "../aggregations/allgather.hpp"
#include "../../nonfinite.hpp"
#include "../codecs/sparse_options.hpp"
#include "../step_phase.hpp"
#include "../step_status.hpp"

namespace commpact {

//! Options of CodecCompressor: error feedback (DGC momentum and clipping) and the
//! non-finite policy. (TopK takes sparse_options, which hold these and top-k's own.)
struct codec_options {
  float momentum = 0.0f;
  float clip_norm = 0.0f;
  nonfinite on_nonfinite = nonfinite::raise;
};

//! Codec + aggregation + error feedback = a Compressor. `Codec` is any type modelling
//! the Codec concept; `Aggregation` any type modelling BlockAggregation (Allgather<C>:
//! every rank's frame header is read through received(); combine decodes, and leaves
//! its output untouched unless every header is clean). The step runs in the
//! aggregation's space (that of its communicator): host_space runs it at once; other
//! spaces queue all of it in start() (the decode and the write of grad included) until the
//! one fence of finish(), after which the host reads the headers and the status.
template <class Codec, class Aggregation>
class CodecCompressor {
  static_assert(diagnose_codec<Codec>());
  static_assert(diagnose_block_aggregation<Aggregation>());

 public:
  using options = codec_options;
  using codec_type = Codec;
  using space_type = typename Aggregation::space_type;
  template <class T>
  using span = typename space_type::template span<T>;
  template <class T>
  using buffer = typename space_type::template buffer<T>;

  explicit CodecCompressor(typename Aggregation::comm_type comm, Codec codec = Codec(), options opt = {},
                           std::string_view name = "CodecCompressor")
      : agg_(std::move(comm)), codec_(std::move(codec)), opt_(opt), name_(name), ef_(opt.momentum > 0.0f) {
    sparse_options o;
    o.momentum = opt_.momentum;
    o.clip_norm = opt_.clip_norm;
    o.on_nonfinite = opt_.on_nonfinite;
    detail::validate_sparse_options(o, name_.c_str());
    if constexpr (req::codec_has_bind_rank<Codec>) codec_.bind_rank(agg_.comm().rank());
  }

  //! Replaces grad by the mean over the ranks of what their codecs delivered, the same
  //! bits on every rank: start + finish + commit. Returns false when the step was
  //! skipped (NaN/Inf in an input or in the mean under nonfinite::skip_step: grad zeroed,
  //! state kept). A step that raises changes nothing, grad included.
  bool reduce(span<float> grad) { return detail::reduce_now(*this, grad); }

  //! Queues the whole step (host_space: runs it): the encoding of this rank's gradient
  //! (with its residual), the exchange of the blocks, and the decode of every rank's block
  //! into the mean, written into grad only when every header is clean and the sum finite.
  //! grad must stay alive until finish().
  void start(span<float> grad) {
    phase_.require_idle(name_);
    const auto n = static_cast<std::int64_t>(grad.size());
    if constexpr (req::codec_has_begin_step<Codec>) codec_.begin_step(steps_);
    const std::string bad_n = check(grad.size());
    problem_ = bad_n.empty() ? detail::length_problem(name_.c_str(), n, ef_.size()) : bad_n;
    const std::size_t cap = bad_n.empty() ? capacity(grad.size()) : cap_;
    // The first step agrees, and so does every rank at a step where the agreed length's
    // capacity changes (a warm-up boundary: the same step on every rank, whatever its n).
    if (!agreed_ || capacity(static_cast<std::size_t>(n_)) != cap_) agree(n, cap, problem_);
    // Otherwise a length whose message has another capacity than the agreed one runs the
    // step idle: a rejected header in a block of the agreed capacity, so every rank makes
    // the same calls over any communicator. Ranks with one length have one capacity, so
    // finish() either raises on every rank (the headers' lengths differ) or finds every
    // rank idle with one length, agrees on it and runs the step.
    idle_ = cap != cap_;
    grad_ = grad;
    queue_step();
    phase_ = phase::started;
  }

  //! Fences (once), then reads every rank's header (the same on every rank, so every
  //! rank takes the same decision) and the step's status. Raises alike on every rank, in
  //! this order: ranks that disagree (mismatch_error), a rejected input (invalid_argument
  //! on its rank, peer_failure on the others), a malformed block (wire_error), a
  //! non-finite input or mean (numeric_error; under skip_step grad is zeroed and false
  //! returned). grad is untouched when it raises; else it holds the mean.
  bool finish() {
    phase_.take_started(name_);
    fence();
    // A rank that rejected its input sends agreement -1: the lengths are compared first,
    // the rest only among ranks that did not reject.
    std::uint16_t flags = headers_.check(agg_.sources(), cap_, name_);
    if (idle_) {  // every rank idle, with one new length: agree on it, then run the step
      agree(static_cast<std::int64_t>(grad_.size()), capacity(grad_.size()), problem_);
      idle_ = false;
      queue_step();
      fence();
      flags = headers_.check(agg_.sources(), cap_, name_);
    }
    if (flags & frame::rejected_input) detail::raise_rejected(name_.c_str(), problem_, steps_);
    if (flags & frame::nonfinite_input) return skip("gradient (with its residual) of some rank");
    // Clean headers: every rank decoded the same blocks into the same sum, so every rank
    // decides alike; a sum of finite values that overflowed was caught before grad was
    // written (dividing by P keeps the rest finite).
    if (status_.bits() & status_wire)  // a space whose decode cannot raise (CUDA) reports it here
      throw wire_error(detail::cat("commpact::", name_, "::reduce: a rank's payload at step ", steps_,
                                   " is malformed (the codec's decoder rejects it); every rank received the same "
                                   "blocks and abandons the step."));
    if (status_.bits() & status_nonfinite) return skip("sum of the delivered gradients (it overflowed)");
    phase_ = phase::finished;
    outcome_ = outcome::delivered;
    return true;
  }

  //! Installs a finished step: the candidate residual (what the codec did not deliver)
  //! becomes the residual, the counters advance.
  void commit() {
    phase_.take_finished(name_);
    if (outcome_ == outcome::skipped) {
      ++steps_, ++skipped_;
      return;
    }
    const auto e = exec();
    if constexpr (!req::codec_has_delivered<Codec>) ef_.subtract(e, approx_.cview());
    ef_.commit();
    ops<space_type>::template codec_clear_delivered<Codec>(e, codec_ws_, codec_, ef_.installed_residual(),
                                                           ef_.installed_velocity());
    ++steps_;
  }

  //! Drops a started or finished step: residual, velocity and counters as before start().
  //! Queued work is completed first.
  void cancel() noexcept {
    phase_.drop([&] { fence(); });
    ef_.cancel();
  }

  //! Saves the counters, the residual and the velocity (state.hpp, kind "commpact.<name>"),
  //! then who saved it (section 20, state_identity.hpp: the codec's fingerprint at the
  //! residual's length and this step, this rank, the number of ranks).
  void save_state(std::vector<std::byte>& out) const {
    phase_.require_none_in_flight(name_, "save_state");
    const auto& c = const_cast<Aggregation&>(agg_).comm();
    const state_identity id{detail::codec_fingerprint(codec_, static_cast<std::size_t>(ef_.size()), steps_), c.rank(),
                            c.size()};
    save_feedback_state(out, kind(), ef_, exec(), steps_, skipped_, &id);
  }
  //! Restores what save_state wrote; raises and changes nothing on a malformed state, and
  //! mismatch_error on a state another codec (or the same codec with other options: k,
  //! density, levels, bucket size), another rank or another number of ranks saved.
  //! An agreed compressor stays agreed when the state's residual has the agreed length (or
  //! there is none):
  //! the headers' step counts then tell a rank restored alone (mismatch_error on every
  //! rank), where a re-agreement only it called would not. Otherwise the next step agrees.
  void load_state(std::span<const std::byte> in) {
    phase_.require_none_in_flight(name_, "load_state");
    const identity_check id{agg_.comm().rank(), agg_.comm().size(), [this](std::size_t n, std::int64_t step) {
                              return detail::codec_fingerprint(codec_, n, step);
                            }};
    auto st = load_feedback_state(in, kind(), name_, opt_.momentum > 0.0f, &id);
    ef_.install(exec(), std::move(st.ef));
    steps_ = st.steps;
    skipped_ = st.skipped;
    // The agreement stays through a state that fits it (a residual of the agreed length, or
    // none), so a rank that loads alone (a rollback) makes the same calls as the others; a
    // residual of another length clears it, and the next step agrees (load it on every rank).
    agreed_ = n_ >= 0 && (ef_.size() == 0 || static_cast<std::int64_t>(ef_.size()) == n_);
  }
  //! Forgets the residual and velocity (e.g. when the gradient length changes); every rank must call it.
  void reset() {
    phase_.require_none_in_flight(name_, "reset");
    ef_.forget();  // the agreement stays: a new length after it runs the step idle, then agrees (finish())
  }

  std::int64_t steps() const { return steps_; }
  //! The tag added to the step count in this compressor's frame headers (0 alone;
  //! Bucketed sets 1 + the bucket's index, detail/check_tag.hpp).
  void set_check_tag(std::uint32_t tag) { check_tag_ = detail::checked_tag(tag); }
  std::uint32_t check_tag() const { return check_tag_; }
  //! True when the next start() begins with this compressor's agreement (one small
  //! allreduce: the first step, the first after a load_state whose residual did not fit,
  //! a density warm-up step where the message's capacity changes). Bucketed starts no
  //! bucket during backward at such a step.
  //! Not const: sets the codec's step to the next step's, as start() does.
  bool needs_agreement() {
    if (!agreed_) return true;
    if constexpr (req::codec_has_begin_step<Codec>) codec_.begin_step(steps_);
    return capacity(static_cast<std::size_t>(n_)) != cap_;
  }
  std::int64_t skipped_steps() const { return skipped_; }
  //! The residual and the velocity in the space's memory (empty before the first
  //! committed step).
  span<const float> residual() const { return ef_.residual(); }
  span<const float> velocity() const { return ef_.velocity(); }
  //! Bytes of one rank's block (the agreed capacity).
  std::size_t block_bytes() const { return cap_; }
  Codec& codec() { return codec_; }
  const options& opts() const { return opt_; }
  auto& comm() { return agg_.comm(); }
  Aggregation& aggregation() { return agg_; }

  //! Address and capacity of every internal buffer, sorted (tests check that nothing is
  //! allocated after the first step).
  std::vector<std::pair<const void*, std::size_t>> workspace_signature() const {
    std::vector<std::pair<const void*, std::size_t>> s;
    if constexpr (requires { agg_.add_signature(s); }) agg_.add_signature(s);
    if constexpr (requires { codec_.add_signature(s); }) codec_.add_signature(s);
    if constexpr (requires { codec_ws_.add_signature(s); }) codec_ws_.add_signature(s);
    ef_.add_signature(s);
    for (const auto* b : {&approx_, &scale_}) s.emplace_back(b->data(), b->capacity());
    s.emplace_back(status_.data(), status_.capacity());
    s.emplace_back(headers_.data(), headers_.capacity());
    std::sort(s.begin(), s.end());  // the residual and candidate swap roles at every commit
    return s;
  }

 protected:
  std::string kind() const { return "commpact." + name_; }

 private:
  using codec_workspace = typename ops<space_type>::template codec_workspace<Codec>;

  auto exec() const { return comm_exec(const_cast<Aggregation&>(agg_).comm()); }
  //! Waits for the step's queued work under the communicator's deadline.
  void fence() const { comm_fence(const_cast<Aggregation&>(agg_).comm()); }

  std::string check(std::size_t n) const {
    std::string p;
    if constexpr (req::codec_has_check<Codec>) p = std::string(codec_.check(n));
    else if (n == 0) p = detail::cat("commpact::", name_, "::reduce: the gradient is empty; pass at least one entry.");
    if (p.empty() && n > 0) p = frame::payload_problem(name_, "encoded message", n, codec_.max_encoded_bytes(n));
    return p;
  }
  std::int64_t agreement_of(std::size_t n) const {
    if constexpr (req::codec_has_agreement<Codec>) return codec_.agreement(n);
    else return 0;
  }
  std::size_t capacity(std::size_t n) const { return (frame::header_bytes + codec_.max_encoded_bytes(n) + 3) / 4 * 4; }

  //! A step that met a non-finite value, alike on every rank: raises under
  //! nonfinite::raise (grad untouched), else zeroes grad and leaves a skipped step to
  //! commit.
  bool skip(const char* what) {
    if (opt_.on_nonfinite == nonfinite::raise)
      detail::raise_nonfinite(name_ + "::reduce", what, static_cast<std::size_t>(-1), steps_);
    const auto e = exec();
    ops<space_type>::fill(e, grad_, 0.0f);
    fence();
    phase_ = phase::finished;
    outcome_ = outcome::skipped;
    return false;
  }

  //! Queues the step on grad_: the encoding of grad_ with its residual (not when the input
  //! has a problem or the step is idle: a rejected header), the exchange of the blocks,
  //! the headers' copy to the host and the decode of every block into grad_, written only
  //! when every header is clean and the sum finite.
  void queue_step() {
    const auto e = exec();
    const int P = agg_.sources();
    const std::size_t N = grad_.size();
    const bool send = problem_.empty() && !idle_;
    const frame::header h{.flags = send ? std::uint16_t{0} : std::uint16_t{frame::rejected_input},
                          .n = static_cast<std::int64_t>(N),
                          .agreement = send ? agreement_of(N) : -1,
                          .step = detail::tagged_step(steps_, check_tag_),
                          .capacity = static_cast<std::int64_t>(cap_)};
    const auto block = agg_.block(cap_);
    status_.clear(e);
    if (send) {
      ef_.begin(e, N, true);  // no residual yet: zeros (installed at commit)
      span<const float> scale{};
      if (opt_.clip_norm > 0.0f) {
        scale_.resize(1, e);
        ops<space_type>::clip_scale(e, span<const float>(grad_), opt_.clip_norm, P, scale_.view());
        scale = scale_.cview();
      }
      ef_.accumulate(e, span<const float>(grad_), opt_.momentum, scale, status_.view());
      approx_.resize(req::codec_has_delivered<Codec> ? 0 : N, e);
    }
    ops<space_type>::template codec_encode_frame<Codec>(e, codec_ws_, codec_, std::as_const(ef_).candidate(), block, h,
                                                        approx_.view(), status_.cview());
    agg_.exchange();
    headers_.queue(e, agg_);  // 48 bytes per rank to the host; the payloads stay in the space
    // The decode is queued now: combine writes grad only when every header is clean and
    // the sum finite (a gate in the space), so finish() decides after one fence and a step
    // that raises leaves grad untouched. Every rank decodes the same blocks into the same sum.
    agg_.combine(codec_, grad_, status_.view());
    status_.fetch(e);
  }

  //! One allreduce (comm/agree.hpp): the same n and capacity on every rank, and no rank
  //! rejected its input.
  void agree(std::int64_t n, std::size_t cap, const std::string& problem) {
    commpact::agree(agg_.comm(), name_.c_str(),
                    {detail::length_item(n, opt_.on_nonfinite),
                     {"the message capacity in bytes", static_cast<std::int64_t>(cap)}},
                    problem, steps_);
    if constexpr (requires { agg_.reserve(cap); }) agg_.reserve(cap);
    cap_ = cap;
    n_ = n;
    agreed_ = true;
  }

  using phase = detail::step_phase;
  using outcome = detail::step_outcome;
  phase phase_;  // first: a move checks it before any other member has moved
  Aggregation agg_;
  Codec codec_;
  [[no_unique_address]] codec_workspace codec_ws_;  // the codec rows' workspace (empty on the host spaces)
  options opt_;
  std::string name_;
  basic_error_feedback<space_type> ef_;  // the residual, the velocity and their candidates
  buffer<float> approx_, scale_;
  detail::status_word<space_type> status_;
  frame::host_headers<space_type> headers_;
  span<float> grad_{};
  std::string problem_;
  outcome outcome_ = outcome::delivered;
  bool agreed_ = false;
  bool idle_ = false;  // this step's message capacity is not the agreed one (start())
  std::size_t cap_ = 0;
  std::int64_t n_ = -1;
  std::int64_t steps_ = 0, skipped_ = 0;
  std::uint32_t check_tag_ = 0;  // detail/check_tag.hpp
};

}  // namespace commpact
