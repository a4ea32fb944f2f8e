// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file error_feedback.hpp
//! error_feedback: the one residual every lossy compressor keeps (TopK, gTopK, PowerSGD,
//! codec compressors, CHOCO's public copies are their own thing). What a rank did not
//! deliver stays in its residual and is added to the next input, so nothing is lost:
//! after every step, sum over ranks of (residual_new + delivered) == sum of (input +
//! residual_old), exactly for sparse codecs and up to rounding for dense ones.
//!
//! A step is transactional: accumulate() writes a candidate (acc = residual + input)
//! and commit() installs it as the residual; a step that raises or is skipped before
//! commit() leaves the residual, the velocity and their sizes as they were.
//!
//! \code
//! ef.accumulate(grad);                 // acc = residual + grad (0 residual at first)
//! encode(ef.acc(), ...);               // the codec reads acc
//! ef.subtract(approx);                 // dense codecs: acc -= what was delivered
//! ef.commit();                         // acc becomes the residual
//! ef.clear_delivered(indices);        // sparse codecs, instead of subtract()
//! \endcode
//!
//! With DGC momentum correction (momentum > 0) it also keeps the velocity u:
//! u' = m u + s g, acc = residual + u', and clear_delivered() zeroes both buffers.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../kernels/host/commit.hpp"
#include "../kernels/host/vector_ops.hpp"
#include "../state.hpp"
#include "../nonfinite.hpp"

namespace commpact {

class error_feedback {
 public:
  //! Sizes the candidate buffers for length n (no allocation once they have grown). The
  //! residual (and velocity) count as zero when they do not hold n values yet.
  void begin(std::size_t n, bool momentum) {
    momentum_ = momentum;
    acc_.resize(n);
    u_next_.resize(momentum ? n : 0);
    // Reserve the other half of each swap pair, so that commit() never leaves a buffer
    // without capacity: nothing is allocated after the first step.
    if (residual_.capacity() < n) residual_.reserve(n);
    if (momentum && velocity_.capacity() < n) velocity_.reserve(n);
  }

  //! acc[at + i] = residual[at + i] + (momentum ? u'[at + i] = m u[at + i] + s g[i] : s g[i]),
  //! s the clipping scale (g itself when absent). Returns false when a value of acc is
  //! not finite.
  bool accumulate_at(std::size_t at, std::span<const float> g, float momentum = 0.0f,
                     std::optional<float> scale = std::nullopt) {
    const std::size_t n = g.size();
    const bool have_r = residual_.size() == acc_.size();
    const bool have_u = velocity_.size() == acc_.size();
    const std::span<float> a(acc_.data() + at, n);
    if (have_r && (!momentum_ || have_u)) {  // the steady state: vectorised kernels
      const std::span<const float> r(residual_.data() + at, n);
      if (!momentum_)
        return (scale ? host::ef_accumulate(a, r, g, *scale) : host::ef_accumulate(a, r, g)) == n;
      const std::span<float> un(u_next_.data() + at, n);
      const std::span<const float> u(velocity_.data() + at, n);
      return (scale ? host::ef_accumulate_momentum(a, un, u, r, g, momentum, *scale)
                    : host::ef_accumulate_momentum(a, un, u, r, g, momentum)) == n;
    }
    // The first step: no residual (or velocity) yet, which count as zero.
    const float s = scale ? *scale : 1.0f;
    for (std::size_t i = 0; i < n; ++i) {
      float gi = scale ? g[i] * s : g[i];
      if (momentum_) {
        const float mu = have_u ? momentum * velocity_[at + i] : momentum * 0.0f;
        u_next_[at + i] = mu + gi;
        gi = u_next_[at + i];
      }
      a[i] = (have_r ? residual_[at + i] : 0.0f) + gi;
    }
    return detail::first_nonfinite(a) == n;
  }

  //! begin(g.size(), momentum > 0) and accumulate_at(0, g, ...).
  bool accumulate(std::span<const float> g, float momentum = 0.0f, std::optional<float> scale = std::nullopt) {
    begin(g.size(), momentum > 0.0f);
    return accumulate_at(0, g, momentum, scale);
  }

  //! The candidate residual of this step.
  std::span<float> acc() { return acc_; }
  std::span<const float> acc() const { return acc_; }

  //! acc[at + i] -= delivered[i]: what a dense codec delivered leaves the candidate.
  void subtract(std::span<const float> delivered, std::size_t at = 0) {
    host::sub(std::span<float>(acc_.data() + at, delivered.size()), delivered);
  }

  //! The candidate's segment [at, at + n) (PowerSGD writes M - A there itself).
  std::span<float> acc_segment(std::size_t at, std::size_t n) { return {acc_.data() + at, n}; }
  //! The installed residual's segment, or an empty span before the first committed step.
  std::span<const float> residual_segment(std::size_t at, std::size_t n) const {
    return residual_.size() == acc_.size() && !acc_.empty() ? std::span<const float>(residual_.data() + at, n)
                                                           : std::span<const float>{};
  }

  //! Installs the candidate as the residual (and u' as the velocity).
  void commit() {
    std::swap(residual_, acc_);
    if (momentum_) std::swap(velocity_, u_next_);
  }

  //! After commit(): the entries delivered[j] (those with alive[j] != 0, every one when
  //! alive is empty) were delivered; they leave the residual (and the velocity).
  void clear_delivered(std::span<const std::int32_t> delivered, std::span<const std::uint8_t> alive = {}) {
    host::zero_delivered(residual_, velocity_, delivered, alive);
  }

  std::span<const float> residual() const { return residual_; }
  std::span<const float> velocity() const { return velocity_; }
  //! Length of the installed residual (0 before the first committed step).
  std::int64_t size() const { return static_cast<std::int64_t>(residual_.size()); }

  void clear() {
    residual_.clear();
    velocity_.clear();
  }

  // ---- state (sections 10 and 11 of the owner's blob) ------------------------------
  void save(state::writer& w) const {
    w.f32s(10, residual_);
    w.f32s(11, velocity_);
  }

  //! What load() read; install() it once every other part of the owner's state is read.
  struct loaded {
    std::vector<float> residual, velocity;
  };

  //! Reads the residual (n values, or any length when n is npos) and the velocity (the
  //! same length with momentum, none without). Raises; changes nothing.
  static loaded load(state::reader& r, std::size_t n, bool momentum) {
    loaded l;
    l.residual = r.f32s(10, n);
    l.velocity = r.f32s(11);
    r.require_that<invalid_argument>(
        l.velocity.size() == (momentum ? l.residual.size() : 0),
        "the state was saved ", l.velocity.empty() ? "without" : "with", " momentum correction but this compressor "
        "has it ", momentum ? "on" : "off", "; load it into a compressor with the same options.");
    return l;
  }

  void install(loaded&& l) {
    residual_ = std::move(l.residual);
    velocity_ = std::move(l.velocity);
    momentum_ = !velocity_.empty();
  }

  //! Address and capacity of every buffer (tests check that nothing is allocated after
  //! the first step).
  template <class Out>
  void add_signature(Out& s) const {
    for (const auto* v : {&residual_, &velocity_, &acc_, &u_next_})
      s.emplace_back(static_cast<const void*>(v->data()), v->capacity());
  }

 private:
  std::vector<float> residual_, velocity_, acc_, u_next_;
  bool momentum_ = false;
};

//! The whole state of a compressor that is error feedback plus step counters (TopK,
//! gTopK, every CodecCompressor): one blob of `kind`.
inline void save_feedback_state(std::vector<std::byte>& out, std::string_view kind, const error_feedback& ef,
                                std::int64_t steps, std::int64_t skipped) {
  state::writer w{out, kind};
  state::write_counters(w, steps, skipped);
  ef.save(w);
  w.finish();
}

//! Loads what save_feedback_state wrote into ef, steps and skipped, all or nothing.
inline void load_feedback_state(std::span<const std::byte> in, std::string_view kind, std::string_view who,
                                bool momentum, error_feedback& ef, std::int64_t& steps, std::int64_t& skipped) {
  state::reader r{in, kind, who};
  const auto [s, k] = state::read_counters(r);
  auto l = error_feedback::load(r, state::reader::npos, momentum);
  r.fail_unless(l.residual.size() < (std::size_t{1} << 31), "a residual of ", l.residual.size(),
                " values is longer than sparse indices allow.");
  r.done();
  ef.install(std::move(l));
  steps = s;
  skipped = k;
}

}  // namespace commpact
