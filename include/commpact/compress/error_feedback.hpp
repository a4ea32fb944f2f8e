// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file error_feedback.hpp
//! basic_error_feedback<Space>: the one residual every compressor that keeps one uses
//! (TopK and every CodecCompressor, gTopK, OkTopK, LinearCompressor, CastAllreduce,
//! PowerCompressor, the parameter server's workers), in any execution space: its buffers
//! are the space's and every pass is a row of ops<Space>. What a rank did not deliver
//! stays in its residual and is added to the next input, so nothing is lost: after
//! every step, sum over ranks of (residual_new + delivered) == sum of (input +
//! residual_old), exactly for sparse codecs and up to rounding for dense ones.
//!
//! A step is a transaction on two buffer pairs: begin() sizes the candidate, the step
//! writes it (accumulate(), or a compressor's fused kernel reading residual() /
//! step_residual() and writing candidate()), the compressor removes what was delivered,
//! and commit() installs the candidate as the residual by swapping buffers; cancel()
//! (or a step that raises) leaves the residual, the velocity and their length as they
//! were. Nothing is allocated once the buffers have grown (reserve()).
//!
//! <!-- snippet: skip (the protocol a compressor follows: encode(...) and zero_delivered(...) stand for its codec's kernels) -->
//! \code
//! basic_error_feedback<S> ef{momentum};
//! ef.begin(e, n, true);                                  // candidate sized; zeros before the first step
//! ef.accumulate(e, grad, m, scale, status);              // acc = residual + (m u + s g)
//! encode(ef.candidate(), ..., approx);                   // the codec reads acc
//! ef.subtract(e, approx);                                // dense codecs: acc -= what was delivered
//! ef.commit();                                           // acc becomes the residual (a swap)
//! zero_delivered(ef.installed_residual(), ...);          // sparse codecs, instead of subtract()
//! \endcode
//!
//! With DGC momentum correction (momentum on) it also keeps the velocity u: u' = m u + s g,
//! acc = residual + u'; commit() installs u' too. State: sections 10 (residual) and 11
//! (velocity) of the owner's blob (save(), load(), install()); save_feedback_state /
//! load_feedback_state are the whole blob of a compressor that is error feedback plus
//! step counters.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../kernels/host/ops.hpp"
#include "../kernels/status.hpp"
#include "../kernels/copies.hpp"
#include "../space/host.hpp"
#include "../state.hpp"
#include "state_identity.hpp"

namespace commpact {

//! What basic_error_feedback::load read from a blob (host floats, any space).
struct feedback_loaded {
  std::vector<float> residual, velocity;
};

//! The residual (and DGC velocity) of one compressor, in space Space.
template <class Space>
class basic_error_feedback {
 public:
  using space_type = Space;
  using exec_type = typename Space::exec;
  template <class T>
  using span = typename Space::template span<T>;
  template <class T>
  using buffer = typename Space::template buffer<T>;

  explicit basic_error_feedback(bool momentum = false) : momentum_(momentum) {}

  // ---- sizing -----------------------------------------------------------------------
  //! Grows the residual and the candidate (and, with momentum, the velocity pair) to hold
  //! n values, so that no later step allocates; nothing is installed.
  void reserve(const exec_type& e, std::size_t n) {
    for (auto* b : {&acc_, &residual_}) b->reserve(n, e);
    if (momentum_)
      for (auto* b : {&u_next_, &velocity_}) b->reserve(n, e);
  }
  //! Sizes the residual and the candidate to n values each (a fixed-size residual such
  //! as PowerSGD's); nothing is installed (forget() it when a layout changes).
  void resize(const exec_type& e, std::size_t n) {
    residual_.resize(n, e);
    acc_.resize(n, e);
  }

  // ---- a step -----------------------------------------------------------------------
  //! Opens a step on n values: sizes the candidate (acc, and u' with momentum). With
  //! `zeros`, a residual (and velocity) not installed yet is written as n zeros for the
  //! step to read (step_residual(); installed only by commit()); without, the step reads
  //! residual(), empty before the first commit, which the fused kernels count as zero.
  void begin(const exec_type& e, std::size_t n, bool zeros) {
    acc_.resize(n, e);
    if (momentum_) u_next_.resize(n, e);
    step_n_ = n_;
    if (zeros && n_ == 0) {
      residual_.resize(n, e);
      if (momentum_) velocity_.resize(n, e);
      ops<Space>::fill(e, residual_.view(), 0.0f);
      if (momentum_) ops<Space>::fill(e, velocity_.view(), 0.0f);
      step_n_ = n;
    }
  }

  //! acc = step_residual() + (momentum ? u' = m u + s g : s g), s the clipping scale
  //! (scale[0], or 1 when scale is empty); sets status_nonfinite in status[0] when a
  //! value of acc is not finite (the row ops<Space>::ef_accumulate).
  void accumulate(const exec_type& e, span<const float> g, float m, span<const float> scale,
                  span<std::uint32_t> status) {
    ops<Space>::ef_accumulate(e, acc_.view(), momentum_ ? u_next_.view() : span<float>{}, step_velocity(),
                              step_residual(), g, momentum_ ? m : 0.0f, scale, status);
  }

  //! acc -= delivered: what a dense codec delivered leaves the candidate.
  void subtract(const exec_type& e, span<const float> delivered) { ops<Space>::sub(e, acc_.view(), delivered); }

  //! The candidate residual of the step (and the candidate velocity u', empty without momentum).
  span<float> candidate() { return acc_.view(); }
  span<const float> candidate() const { return acc_.cview(); }
  span<float> candidate_velocity() { return momentum_ ? u_next_.view() : span<float>{}; }

  //! What the open step reads as its residual and velocity: the installed ones, or the
  //! zeros begin() wrote.
  span<const float> step_residual() const { return residual_.cview().first(step_n_); }
  span<const float> step_velocity() const { return momentum_ ? velocity_.cview().first(step_n_) : span<const float>{}; }

  //! Installs the candidate as the residual (and u' as the velocity): a swap of buffers.
  void commit() {
    residual_.swap(acc_);
    if (momentum_) velocity_.swap(u_next_);
    n_ = static_cast<std::int64_t>(residual_.size());
  }
  //! Drops the open step: the candidate is the step's alone, so the installed residual,
  //! velocity and length stay as they were.
  void cancel() noexcept {}

  //! The installed residual and velocity, writable (delivered entries leave them after
  //! commit()).
  span<float> installed_residual() { return residual_.view().first(static_cast<std::size_t>(n_)); }
  span<float> installed_velocity() {
    return momentum_ ? velocity_.view().first(static_cast<std::size_t>(n_)) : span<float>{};
  }

  //! Installs n zeros as the residual (a compressor that keeps a residual from its first
  //! agreement on, such as CastAllreduce).
  void install_zeros(const exec_type& e, std::size_t n) {
    residual_.resize(n, e);
    ops<Space>::fill(e, residual_.view(), 0.0f);
    if (momentum_) {
      velocity_.resize(n, e);
      ops<Space>::fill(e, velocity_.view(), 0.0f);
    }
    n_ = static_cast<std::int64_t>(n);
  }
  //! Forgets the residual and the velocity (buffers kept for reuse).
  void forget() { n_ = 0; }

  //! The installed residual and velocity in the space's memory (empty before the first
  //! committed step).
  span<const float> residual() const { return residual_.cview().first(static_cast<std::size_t>(n_)); }
  span<const float> velocity() const {
    return momentum_ ? velocity_.cview().first(static_cast<std::size_t>(n_)) : span<const float>{};
  }
  //! Length of the installed residual (0 before the first committed step).
  std::int64_t size() const { return n_; }
  bool momentum() const { return momentum_; }

  // ---- state (sections 10 and 11 of the owner's blob) ------------------------------
  //! Writes the residual in section 10 and the velocity in section 11 (host copies).
  void save(state::writer& w, const exec_type& e) const {
    w.f32s(10, copy_to_host<Space>(e, residual()));
    w.f32s(11, copy_to_host<Space>(e, velocity()));
  }
  //! Writes the residual alone, in section `tag` (a blob without a velocity section).
  void save_residual(state::writer& w, const exec_type& e, std::uint32_t tag) const {
    w.f32s(tag, copy_to_host<Space>(e, residual()));
  }

  //! What load() read; install() it once every other part of the owner's state is read.
  using loaded = feedback_loaded;

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

  //! Installs what load() read (copied into the space; an empty residual installs none
  //! and keeps the buffers).
  void install(const exec_type& e, loaded&& l) {
    if (!l.residual.empty()) copy_from_host<Space>(e, std::span<const float>(l.residual), residual_);
    if (!l.velocity.empty()) copy_from_host<Space>(e, std::span<const float>(l.velocity), velocity_);
    n_ = static_cast<std::int64_t>(l.residual.size());
  }

  //! Address and capacity of every buffer (tests check that nothing is allocated after
  //! the first step; the residual and the candidate swap roles at every commit).
  template <class Out>
  void add_signature(Out& s) const {
    for (const auto* b : {&residual_, &velocity_, &acc_, &u_next_})
      s.emplace_back(static_cast<const void*>(b->data()), b->capacity());
  }

  // ---- host conveniences (the parameter server's workers) ---------------------------
  //! begin(n, zeros) and accumulate(g) on the host; false when a value of acc is not finite.
  bool accumulate(std::span<const float> g)
    requires std::same_as<Space, host_space>
  {
    const exec_type e{};
    begin(e, g.size(), true);
    std::uint32_t status = 0;
    accumulate(e, g, 0.0f, {}, std::span<std::uint32_t>(&status, 1));
    return (status & status_nonfinite) == 0;
  }
  std::span<float> acc()
    requires std::same_as<Space, host_space>
  {
    return candidate();
  }
  void subtract(std::span<const float> delivered)
    requires std::same_as<Space, host_space>
  {
    subtract(exec_type{}, delivered);
  }

 private:
  buffer<float> residual_, velocity_, acc_, u_next_;
  std::int64_t n_ = 0;        // length of the installed residual (0: none)
  std::size_t step_n_ = 0;    // length of the residual the open step reads
  bool momentum_ = false;
};

//! Error feedback on the host.
using error_feedback = basic_error_feedback<host_space>;

//! The whole state of a compressor that is error feedback plus step counters (TopK,
//! gTopK, every CodecCompressor, OkTopK, LinearCompressor): one blob of `kind`, then
//! (when `id` is given) who saved it (section 20, state_identity.hpp). `more(w)` appends
//! the owner's own sections before that (OkTopK's regions and threshold).
template <class Space, class More = void (*)(state::writer&)>
void save_feedback_state(std::vector<std::byte>& out, std::string_view kind, const basic_error_feedback<Space>& ef,
                         const typename Space::exec& e, std::int64_t steps, std::int64_t skipped,
                         const state_identity* id = nullptr, More&& more = [](state::writer&) {}) {
  state::writer w{out, kind};
  state::write_counters(w, steps, skipped);
  ef.save(w, e);
  more(w);
  if (id) state::write_identity(w, *id);
  w.finish();
}

//! What load_feedback_state read: the error feedback to install and the counters.
struct feedback_state {
  feedback_loaded ef;
  std::int64_t steps = 0, skipped = 0;
};

//! What load_feedback_state checks of who saved a blob (state_identity.hpp): this rank,
//! the number of ranks and this object's fingerprint at the state's length and step
//! (required).
struct identity_check {
  std::int64_t rank = 0, size = 1;
  std::function<std::int64_t(std::size_t, std::int64_t)> fingerprint;
};

//! Reads what save_feedback_state wrote; raises and changes nothing on a malformed blob
//! (the caller installs it: ef.install(e, std::move(s.ef))). `more(r, loaded)` reads the
//! owner's own sections (and checks them against what was loaded). With `id`, a blob
//! saved by another rank, number of ranks or other options raises mismatch_error;
//! without, its section 20 is skipped (the DDP hooks hand residuals over by parameter).
template <class More = void (*)(state::reader&, const feedback_state&)>
feedback_state load_feedback_state(std::span<const std::byte> in, std::string_view kind, std::string_view who,
                                   bool momentum, const identity_check* id = nullptr,
                                   More&& more = [](state::reader&, const feedback_state&) {}) {
  state::reader r{in, kind, who};
  const auto [s, k] = state::read_counters(r);
  feedback_state st{error_feedback::load(r, state::reader::npos, momentum), s, k};
  r.fail_unless(st.ef.residual.size() < (std::size_t{1} << 31), "a residual of ", st.ef.residual.size(),
                " values is longer than sparse indices allow.");
  more(r, st);
  if (id)
    state::check_identity(r, who, id->rank, id->size, st.ef.residual.size(), s, id->fingerprint);
  else
    state::skip_identity(r);
  r.done();
  return st;
}

}  // namespace commpact
