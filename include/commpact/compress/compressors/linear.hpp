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
//! compressor keeps no residual; true when absent).
//!
//! `LinearCompressor<K, C>` per step: acc = g + residual; m floats of A acc and one flag
//! float (non-finite input) are summed by one ring allreduce; every rank
//! sees the same flags (so raises or skips alike), scales the sum by 1/P, decompresses
//! it into the zeroed gradient and keeps acc - B A acc as its residual (error feedback),
//! or, for a codec whose keeps_residual() is false, nothing: acc = g and the residual
//! stays empty (an unbiased estimate with a residual would deliver the same gradient
//! again and again: about n/k times for scaled random-k).
//! Bytes per rank per step: the ring allreduce of m + 1 floats, about 2 (P - 1)/P (m + 1) 4
//! (wire::ring_allreduce gives it exactly). n is agreed by one small allreduce of int64
//! on the first step and whenever it changes.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../state.hpp"
#include "../codecs/randomk.hpp"
#include "../error_feedback.hpp"
#include "../../nonfinite.hpp"
#include "../codecs/sparse_options.hpp"

namespace commpact {

//! LinearCodec + allreduce + error feedback = a Compressor (see the file comment).
template <class K, class C>
class LinearCompressor {
  static_assert(LinearCodec<K>, "commpact: LinearCompressor needs a LinearCodec: size(n), compress(v, out), "
                                "decompress_add(in, acc) const.");
  static_assert(diagnose_communicator<C>());

 public:
  explicit LinearCompressor(C comm, K codec = K(), nonfinite on_nonfinite = nonfinite::raise,
                            std::string_view name = "LinearCompressor")
      : comm_(std::move(comm)), codec_(std::move(codec)), policy_(on_nonfinite), name_(name) {}

  //! Replaces grad by the mean over the ranks of B A (g_r + e_r), the same bits on every
  //! rank. Returns false when the step was skipped (nonfinite::skip_step).
  bool reduce(std::span<float> grad) {
    const int P = comm_.size();
    const auto n = static_cast<std::int64_t>(grad.size());
    if constexpr (requires { codec_.begin_step(steps_); }) codec_.begin_step(steps_);
    std::string problem = grad.empty() ? detail::cat("commpact::", name_, "::reduce: the gradient is empty; pass at "
                                                     "least one entry.")
                                       : detail::length_problem(name_.c_str(), n, ef_.size());
    if (!agreed_ || n != n_ || !problem.empty()) agree(n, problem);
    const std::size_t m = codec_.size(grad.size());
    buf_.assign(m + 1, 0.0f);
    if (!ef_.accumulate(grad)) buf_[m] = 1.0f;
    else codec_.compress(ef_.acc(), std::span<float>(buf_).first(m));
    comm_.allreduce(std::span<float>(buf_), reduce_op::sum);
    if (buf_[m] != 0.0f) {
      detail::end_nonfinite_step(policy_, name_ + "::reduce", "gradient (with its residual) of some rank",
                                 static_cast<std::size_t>(-1), steps_, grad);
      ++steps_, ++skipped_;
      return false;
    }
    for (std::size_t j = 0; j < m; ++j) buf_[j] = mean_of(buf_[j], P);
    std::fill(grad.begin(), grad.end(), 0.0f);
    codec_.decompress_add(std::span<const float>(buf_).first(m), grad);
    if (!keeps_residual()) {
      // No error feedback (an unbiased codec): the residual stays empty, acc was g.
    } else if constexpr (requires { codec_.delivered(); }) {
      ef_.commit();
      ef_.clear_delivered(codec_.delivered());
    } else {
      approx_.resize(m);
      codec_.compress(ef_.acc(), std::span<float>(approx_));
      dense_.assign(grad.size(), 0.0f);
      codec_.decompress_add(std::span<const float>(approx_), std::span<float>(dense_));
      ef_.subtract(dense_);
      ef_.commit();
    }
    ++steps_;
    return true;
  }

  void save_state(std::vector<std::byte>& out) const { save_feedback_state(out, "commpact." + name_, ef_, steps_, skipped_); }
  void load_state(std::span<const std::byte> in) {
    error_feedback ef;
    std::int64_t steps = 0, skipped = 0;
    load_feedback_state(in, "commpact." + name_, name_, false, ef, steps, skipped);
    require(keeps_residual() || ef.size() == 0, "commpact::", name_, "::load_state: the state holds a residual of ",
            ef.size(), " values, but this codec runs without error feedback (scaled random-k keeps none); load it "
            "into a compressor whose codec keeps a residual (unscaled random-k), or start this one without a state.");
    ef_ = std::move(ef);
    steps_ = steps, skipped_ = skipped;
    agreed_ = false;
  }
  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_; }
  std::span<const float> residual() const { return ef_.residual(); }
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
  C& comm() { return comm_; }

 private:
  void agree(std::int64_t n, const std::string& problem) {
    std::int64_t v[3] = {n, -n, problem.empty() ? 0 : 1};
    comm_.allreduce(std::span<std::int64_t>(v, 3), reduce_op::max);
    if (v[2]) detail::raise_rejected(name_.c_str(), problem, steps_);
    if (v[0] != -v[1])
      throw mismatch_error(detail::cat("commpact::", name_, "::reduce: ranks disagree on the gradient length: this "
                                       "rank has n = ", n, ", the lengths range over [", -v[1], ", ", v[0],
                                       "]; every rank must pass gradients of the same length."));
    n_ = n, agreed_ = true;
  }

  C comm_;
  K codec_;
  nonfinite policy_;
  std::string name_;
  error_feedback ef_;
  std::vector<float> buf_, approx_, dense_;
  bool agreed_ = false;
  std::int64_t n_ = -1, steps_ = 0, skipped_ = 0;
};

}  // namespace commpact
