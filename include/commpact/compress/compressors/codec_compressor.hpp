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
//! changes (first step, a warm-up boundary) is agreed first with one small allreduce.
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
#include <utility>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../state.hpp"
#include "../error_feedback.hpp"
#include "../frame.hpp"
#include "../aggregations/allgather.hpp"
#include "../../nonfinite.hpp"
#include "../codecs/sparse_options.hpp"
#include "../step_phase.hpp"

namespace commpact {

//! Options of CodecCompressor: error feedback (DGC momentum and clipping) and the
//! non-finite policy. (TopK takes sparse_options, which hold these and top-k's own.)
struct codec_options {
  float momentum = 0.0f;
  float clip_norm = 0.0f;
  nonfinite on_nonfinite = nonfinite::raise;
};

//! Codec + aggregation + error feedback = a Compressor. `Codec` is any type modelling
//! the Codec concept; `Aggregation` any type modelling Aggregation (Allgather<C>).
template <class Codec, class Aggregation>
class CodecCompressor {
  static_assert(diagnose_codec<Codec>());
  static_assert(diagnose_aggregation<Aggregation>());

 public:
  using options = codec_options;
  using codec_type = Codec;

  explicit CodecCompressor(typename Aggregation::comm_type comm, Codec codec = Codec(), options opt = {},
                           std::string_view name = "CodecCompressor")
      : agg_(std::move(comm)), codec_(std::move(codec)), opt_(opt), name_(name) {
    sparse_options o;
    o.momentum = opt_.momentum;
    o.clip_norm = opt_.clip_norm;
    detail::validate_sparse_options(o, name_.c_str());
    if constexpr (req::codec_has_bind_rank<Codec>) codec_.bind_rank(agg_.comm().rank());
  }

  //! Replaces grad by the mean over the ranks of what their codecs delivered, the same
  //! bits on every rank: start + finish + commit. Returns false when the step was
  //! skipped (NaN/Inf in an input or in the mean under nonfinite::skip_step: grad zeroed,
  //! state kept). A step that raises changes nothing, grad included.
  bool reduce(std::span<float> grad) {
    start(grad);
    const bool ok = finish();
    commit();
    return ok;
  }

  //! Encodes this rank's gradient (with its residual) and exchanges the blocks. grad is
  //! read here and written by finish().
  void start(std::span<float> grad) {
    phase_.require_idle(name_);
    const int P = agg_.sources();
    const auto n = static_cast<std::int64_t>(grad.size());
    if constexpr (req::codec_has_begin_step<Codec>) codec_.begin_step(steps_);
    problem_ = check(grad.size());
    if (problem_.empty()) problem_ = detail::length_problem(name_.c_str(), n, ef_.size());
    const std::int64_t agreement = problem_.empty() ? agreement_of(grad.size()) : -1;
    const std::size_t cap = problem_.empty() ? capacity(grad.size()) : cap_;

    if (!agreed_ || cap != cap_) agree(n, cap, problem_);
    frame::header h;
    h.n = n;
    h.agreement = agreement;
    h.step = steps_;
    h.capacity = static_cast<std::int64_t>(cap_);
    auto block = agg_.block(cap_);
    const auto payload = block.subspan(frame::header_bytes);
    if (!problem_.empty()) {
      h.flags = frame::rejected_input;
    } else if (!ef_.accumulate(grad, opt_.momentum, detail::clip_scale(grad, opt_.clip_norm, P))) {
      h.flags = frame::nonfinite_input;
    } else {
      approx_.resize(req::codec_has_delivered<Codec> ? 0 : grad.size());
      h.payload = static_cast<std::uint32_t>(codec_.encode(ef_.acc(), payload, std::span<float>(approx_)));
      require(h.payload <= payload.size(), "commpact::", name_, ": the codec wrote ", h.payload,
              " bytes, above its max_encoded_bytes; fix the codec's max_encoded_bytes().");
    }
    std::fill(payload.begin() + h.payload, payload.end(), std::byte{0});
    frame::write(block, h);
    agg_.exchange();
    grad_ = grad;
    phase_ = phase::started;
  }

  //! Reads every rank's header (the same on every rank, so every rank takes the same
  //! decision), decodes the blocks in rank order into a sum, and writes the mean into
  //! grad. Raises alike on every rank, in this order: ranks that disagree
  //! (mismatch_error), a rejected input (invalid_argument on its rank, peer_failure on
  //! the others), a malformed block (wire_error), a non-finite input or mean
  //! (numeric_error; under skip_step grad is zeroed and false returned). grad is
  //! untouched when it raises.
  bool finish() {
    phase_.require_started(name_);
    phase_ = phase::idle;
    const int P = agg_.sources();
    std::uint16_t flags = 0;
    constexpr auto lowest = std::numeric_limits<std::int64_t>::min(), highest = std::numeric_limits<std::int64_t>::max();
    std::int64_t lo[4] = {highest, highest, highest, highest}, hi[4] = {lowest, lowest, lowest, lowest};
    for (int r = 0; r < P; ++r) {
      const auto hr = frame::read(agg_.received(r), r);
      flags = static_cast<std::uint16_t>(flags | hr.flags);
      const std::int64_t v[4] = {hr.n, hr.agreement, hr.step, hr.capacity};
      for (int j = 0; j < 4; ++j) lo[j] = std::min(lo[j], v[j]), hi[j] = std::max(hi[j], v[j]);
    }
    // A rank that rejected its input sends agreement -1: compare the lengths first, then
    // the rest only among ranks that did not reject.
    static constexpr const char* what[4] = {"the gradient length", "the codec's parameter (such as k)",
                                            "the step count", "the block capacity"};
    for (int j = 0; j < 4; ++j) {
      if (j == 1 && (flags & frame::rejected_input)) continue;
      if (lo[j] != hi[j])
        throw mismatch_error(detail::cat("commpact::", name_, "::reduce: ranks disagree on ", what[j],
                                         ": the values range over [", lo[j], ", ", hi[j],
                                         "]; every rank must pass the same lengths and use the same options and "
                                         "step count."));
    }
    if (flags & frame::rejected_input) detail::raise_rejected(name_.c_str(), problem_, steps_);
    if (flags & frame::nonfinite_input) return skip("gradient (with its residual) of some rank");
    sum_.assign(grad_.size(), 0.0f);
    for (int r = 0; r < P; ++r) {  // rank order: the same float additions on every rank
      const auto blk = agg_.received(r);
      const auto hr = frame::read(blk, r);
      codec_.decode_add(blk.subspan(frame::header_bytes, hr.payload), std::span<float>(sum_));
    }
    // Every rank decoded the same blocks into the same sum, so every rank decides alike;
    // a sum of finite values that overflowed is caught here (dividing by P keeps the
    // rest finite), before grad is written.
    if (host::first_nonfinite(sum_) != sum_.size()) return skip("sum of the delivered gradients (it overflowed)");
    (void)host::mean_checked(std::span<const float>(sum_), grad_, P);
    phase_ = phase::finished;
    outcome_ = outcome::delivered;
    return true;
  }

  //! Installs a finished step: the candidate residual (what the codec did not deliver)
  //! becomes the residual, the counters advance.
  void commit() {
    phase_.require_finished(name_);
    phase_ = phase::idle;
    if (outcome_ == outcome::skipped) {
      ++steps_, ++skipped_;
      return;
    }
    if constexpr (req::codec_has_delivered<Codec>) {
      ef_.commit();
      ef_.clear_delivered(codec_.delivered());
    } else {
      ef_.subtract(approx_);
      ef_.commit();
    }
    ++steps_;
  }

  //! Drops a started or finished step: residual, velocity and counters as before start().
  void cancel() noexcept { phase_ = phase::idle; }

  //! Saves the counters, the residual and the velocity (state.hpp, kind "commpact.<name>").
  void save_state(std::vector<std::byte>& out) const { save_feedback_state(out, kind(), ef_, steps_, skipped_); }
  //! Restores what save_state wrote; raises and changes nothing on a malformed state.
  void load_state(std::span<const std::byte> in) {
    load_feedback_state(in, kind(), name_, opt_.momentum > 0.0f, ef_, steps_, skipped_);
    agreed_ = false;
  }
  //! Forgets the residual and velocity (e.g. when the gradient length changes); every rank must call it.
  void reset() {
    ef_.clear();
    agreed_ = false;
  }

  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_; }
  std::span<const float> residual() const { return ef_.residual(); }
  std::span<const float> velocity() const { return ef_.velocity(); }
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
    ef_.add_signature(s);
    if constexpr (requires { codec_.add_signature(s); }) codec_.add_signature(s);
    s.emplace_back(static_cast<const void*>(approx_.data()), approx_.capacity());
    s.emplace_back(static_cast<const void*>(sum_.data()), sum_.capacity());
    std::sort(s.begin(), s.end());
    return s;
  }

 protected:
  std::string kind() const { return "commpact." + name_; }

 private:
  std::string check(std::size_t n) const {
    if constexpr (req::codec_has_check<Codec>) return std::string(codec_.check(n));
    else
      return n == 0 ? detail::cat("commpact::", name_, "::reduce: the gradient is empty; pass at least one entry.")
                    : std::string{};
  }
  std::int64_t agreement_of(std::size_t n) const {
    if constexpr (req::codec_has_agreement<Codec>) return codec_.agreement(n);
    else return 0;
  }
  std::size_t capacity(std::size_t n) const { return (frame::header_bytes + codec_.max_encoded_bytes(n) + 3) / 4 * 4; }

  //! A step that met a non-finite value, alike on every rank: raises under
  //! nonfinite::raise (grad untouched), else zeroes grad and leaves a
  //! skipped step to commit.
  bool skip(const char* what) {
    if (opt_.on_nonfinite == nonfinite::raise)
      detail::raise_nonfinite(name_ + "::reduce", what, static_cast<std::size_t>(-1), steps_);
    std::fill(grad_.begin(), grad_.end(), 0.0f);
    phase_ = phase::finished;
    outcome_ = outcome::skipped;
    return false;
  }

  //! One allreduce (comm/agree.hpp): the same n and capacity on every rank, and no rank
  //! rejected its input.
  void agree(std::int64_t n, std::size_t cap, const std::string& problem) {
    commpact::agree(agg_.comm(), name_.c_str(),
                    {{"the gradient length", n}, {"the message capacity in bytes", static_cast<std::int64_t>(cap)}},
                    problem, steps_);
    if constexpr (requires { agg_.reserve(cap); }) agg_.reserve(cap);
    cap_ = cap;
    n_ = n;
    agreed_ = true;
  }

  Aggregation agg_;
  Codec codec_;
  options opt_;
  std::string name_;
  using phase = detail::step_phase;
  enum class outcome { delivered, skipped };
  error_feedback ef_;
  std::vector<float> approx_, sum_;
  std::span<float> grad_;
  std::string problem_;
  phase phase_;
  outcome outcome_ = outcome::delivered;
  bool agreed_ = false;
  std::size_t cap_ = 0;
  std::int64_t n_ = -1;
  std::int64_t steps_ = 0, skipped_ = 0;
};

}  // namespace commpact
