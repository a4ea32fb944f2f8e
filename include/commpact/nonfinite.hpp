// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file nonfinite.hpp
//! What every compressor, the gossip mixers and DataParallel do with NaN or Inf, written
//! once: the `nonfinite` policy, a finiteness scan, the end of a step that met a
//! non-finite value (the mean allreduce with its check is comm/mean_allreduce.hpp).
//!
//! Non-finite values are detected where every rank sees the same numbers (after a
//! reduction, or through a flag every rank receives), so every rank takes the same
//! decision: raise numeric_error (nonfinite::raise, the default) or drop the step
//! (nonfinite::skip_step: the output is zeroed, the state is kept, the step is counted
//! as skipped).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "comm/agree.hpp"
#include "error.hpp"
#include "kernels/host/vector_ops.hpp"

namespace commpact {

//! What a compressor does when a gradient holds NaN or Inf.
enum class nonfinite { raise, skip_step };

namespace detail {

//! The first-step agreement's item for the gradient length, with the compressor's
//! on_nonfinite in the same two words (agreement_item's bit): ranks that would decide a
//! non-finite step differently (one skips, the others raise) raise mismatch_error at the
//! first step instead.
inline agreement_item length_item(std::int64_t n, nonfinite on) {
  return {.what = "the gradient length",
          .value = n,
          .bit_what = "on_nonfinite = nonfinite::skip_step (else nonfinite::raise)",
          .bit = on != nonfinite::raise};  // as the steps decide: anything but raise skips
}

//! Raises invalid_argument at construction for an on_nonfinite outside the enum (an
//! integer cast to it), which the steps would read as skip_step.
inline void require_nonfinite_policy(nonfinite on, std::string_view who) {
  require(on == nonfinite::raise || on == nonfinite::skip_step, "commpact::", who, ": on_nonfinite = ",
          static_cast<int>(on), " is not a nonfinite value; pass nonfinite::raise or nonfinite::skip_step.");
}

//! Index of the first NaN or Inf in v, or v.size(): a branch-free, vectorised test of the
//! exponent bits, the index searched only in a block that holds one (host::first_nonfinite).
inline std::size_t first_nonfinite(std::span<const float> v) { return host::first_nonfinite(v); }

//! The closing advice of raise_nonfinite's message by default: it names on_nonfinite, an
//! option of the compressors (a binding without that option replaces this sentence).
inline constexpr std::string_view nonfinite_default_remedy =
    "Fix the gradient (lower the learning rate, clip), or set on_nonfinite = nonfinite::skip_step to drop such steps.";

//! Raises numeric_error, the same message on every rank: `<who>: the <what> is not
//! finite (NaN or Inf) at index <i> ...` (index -1: not known, left out). `remedy`
//! replaces the closing advice (nonfinite_default_remedy).
[[noreturn]] inline void raise_nonfinite(std::string_view who, std::string_view what, std::size_t index,
                                         std::int64_t step, std::string_view remedy = {}) {
  const std::string where = index == static_cast<std::size_t>(-1) ? std::string() : cat(" at index ", index);
  throw numeric_error(cat("commpact::", who, ": the ", what, " is not finite (NaN or Inf)", where, " at step ", step,
                          " (NaN or Inf in some rank's input, or a sum that overflowed; every rank raises this "
                          "error). ",
                          remedy.empty() ? nonfinite_default_remedy : remedy));
}

//! Ends a step that met NaN or Inf, alike on every rank: raises under nonfinite::raise;
//! under skip_step zeroes `out` and returns false (the caller counts the step skipped).
inline bool end_nonfinite_step(nonfinite policy, std::string_view who, std::string_view what, std::size_t index,
                               std::int64_t step, std::span<float> out) {
  if (policy == nonfinite::raise) raise_nonfinite(who, what, index, step);
  std::fill(out.begin(), out.end(), 0.0f);
  return false;
}

}  // namespace detail

}  // namespace commpact
