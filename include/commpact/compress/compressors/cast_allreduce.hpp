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
//! The codes are summed by ring_allreduce (comm/ring.hpp) with the codec's `add`: IEEE
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
//! Dense's ring allreduce of n floats; 2 (P - 1) messages. The first step (and a length
//! change, on every rank) agrees on n and the format with one small allreduce of int64.
//!
//! Two-phase like Dense: `start(grad)` encodes and reduces (grad untouched),
//! `finish()` checks the sums and writes grad, `commit()` keeps the residual and counts
//! the step, `cancel()` drops it. Host space only (the CUDA space's issue adds the
//! device cast kernels and NCCL's native half sum).

#include <algorithm>
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
#include "../../kernels/mean.hpp"
#include "../../state.hpp"
#include "../codecs/casts.hpp"
#include "../codecs/sparse_options.hpp"
#include "../../nonfinite.hpp"
#include "../step_phase.hpp"

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
  static_assert(std::is_same_v<comm_space_t<Comm>, host_space>,
                "commpact::CastAllreduce runs on host memory (ThreadComm, MpiComm); its device form is part of the "
                "CUDA space.");

 public:
  using options = cast_allreduce_options;
  using space_type = host_space;

  explicit CastAllreduce(Comm comm, options opt = {}) : comm_(std::move(comm)), opt_(opt) {}

  //! Averages grad over the ranks in place. Returns false when the step was skipped.
  bool reduce(std::span<float> grad) {
    start(grad);
    bool ok = false;
    try {
      ok = finish();
    } catch (...) {
      cancel();
      throw;
    }
    commit();
    return ok;
  }

  //! Encodes grad (plus the residual) and sums the codes over the ranks; grad is
  //! untouched until finish().
  void start(std::span<float> grad) {
    phase_.require_idle(who);
    const auto n = static_cast<std::int64_t>(grad.size());
    if (n != checked_size_) {
      const auto problem = detail::length_problem(who, n, static_cast<std::int64_t>(residual_.size()));
      agree(comm_, who, {{"the gradient length", n}, {"the 16-bit format (fp16 1, bf16 2)", format_id()}}, problem,
            steps_);
      checked_size_ = n;
      if (opt_.error_feedback && residual_.empty()) residual_.assign(grad.size(), 0.0f);
    }
    const std::size_t N = grad.size();
    codes_.resize(N);
    if (opt_.error_feedback) candidate_.resize(N);
    scratch_.resize(wire::ring_chunk(N, comm_.size(), 0));
    for (std::size_t i = 0; i < N; ++i) {
      const float a = opt_.error_feedback ? grad[i] + residual_[i] : grad[i];
      if (!std::isfinite(a)) {
        codes_[i] = nan_code;
        if (opt_.error_feedback) candidate_[i] = residual_[i];
        continue;
      }
      codes_[i] = Cast::to_code(a);
      if (opt_.error_feedback) candidate_[i] = a - Cast::from_code(codes_[i]);
    }
    ring_allreduce(comm_, std::span<std::uint16_t>(codes_), std::span<std::uint16_t>(scratch_),
                   [](std::uint16_t a, std::uint16_t b) { return Cast::add(a, b); });
    grad_ = grad;
    phase_ = phase::started;
  }

  //! Raises numeric_error on every rank for a non-finite sum (grad untouched), or under
  //! skip_step zeroes grad and returns false; otherwise writes the mean into grad.
  bool finish() {
    phase_.require_started(who);
    phase_ = phase::idle;
    std::size_t bad = codes_.size();
    for (std::size_t i = 0; i < codes_.size(); ++i)
      if (!Cast::finite_code(codes_[i])) {
        bad = i;
        break;
      }
    skipped_step_ = bad != codes_.size();
    if (skipped_step_) {
      if (opt_.on_nonfinite == nonfinite::raise) detail::raise_nonfinite(who, "summed gradient", bad, steps_);
      std::fill(grad_.begin(), grad_.end(), 0.0f);
    } else {
      const int P = comm_.size();
      for (std::size_t i = 0; i < codes_.size(); ++i) grad_[i] = mean_of(Cast::from_code(codes_[i]), P);
    }
    phase_ = phase::finished;
    return !skipped_step_;
  }

  //! Keeps the residual of a delivered step and counts the step.
  void commit() {
    phase_.require_finished(who);
    if (!skipped_step_ && opt_.error_feedback) std::swap(residual_, candidate_);
    ++steps_;
    if (skipped_step_) ++skipped_;
    phase_ = phase::idle;
  }

  //! Drops a started or finished step: the residual and counters stay as before it.
  void cancel() noexcept { phase_ = phase::idle; }

  void save_state(std::vector<std::byte>& out) const {
    state::writer w{out, kind};
    state::write_counters(w, steps_, skipped_);
    w.f32s(2, residual_);
    w.finish();
  }

  //! Restores what save_state wrote; raises and changes nothing on a malformed state (a
  //! residual of another length than the next gradient is rejected at that step).
  void load_state(std::span<const std::byte> in) {
    state::reader r{in, kind, who};
    const auto [s, k] = state::read_counters(r);
    auto res = r.f32s(2);
    r.fail_unless(opt_.error_feedback || res.empty(), "a residual of ", res.size(),
                  " values for a compressor without error feedback");
    r.done();
    steps_ = s;
    skipped_ = k;
    residual_ = std::move(res);
    checked_size_ = -1;
  }

  //! Forgets the residual (every rank, at the same step), e.g. before a length change.
  void reset() {
    phase_.require_idle(who);
    residual_.clear();
    checked_size_ = -1;
  }

  std::span<const float> residual() const { return residual_; }
  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_; }
  Comm& comm() { return comm_; }

 private:
  using phase = detail::step_phase;
  static constexpr const char* who = "CastAllreduce";
  static constexpr std::string_view kind = "commpact.CastAllreduce";
  static constexpr std::uint16_t nan_code = 0x7FFFu;  // a NaN in fp16 and bf16 alike
  static std::int64_t format_id() {
    if constexpr (std::is_same_v<Cast, fp16_codec>) return 1;
    else if constexpr (std::is_same_v<Cast, bf16_codec>) return 2;
    else return 3;
  }

  Comm comm_;
  options opt_;
  std::vector<float> residual_, candidate_;
  std::vector<std::uint16_t> codes_, scratch_;
  std::span<float> grad_{};
  phase phase_;
  bool skipped_step_ = false;
  std::int64_t checked_size_ = -1;
  std::int64_t steps_ = 0, skipped_ = 0;
};

//! IEEE binary16 allreduce (PyTorch's fp16_compress_hook).
template <class Comm>
using Fp16Allreduce = CastAllreduce<fp16_codec, Comm>;
//! bfloat16 allreduce (PyTorch's bf16_compress_hook).
template <class Comm>
using Bf16Allreduce = CastAllreduce<bf16_codec, Comm>;

}  // namespace commpact
