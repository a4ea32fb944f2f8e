// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file agree.hpp
//! Checks that every rank holds the same value; raises mismatch_error on every rank
//! when they do not (one small allreduce, so no rank is left waiting).

#include <cstdint>
#include <initializer_list>
#include <string>
#include <span>
#include <string_view>

#include "../concepts.hpp"
#include "../error.hpp"

namespace commpact {

namespace detail {
//! One rank rejected its input (the flag reached every rank): that rank raises its own
//! error `mine`, every other rank peer_failure.
[[noreturn]] inline void raise_rejected(const char* who, const std::string& mine, std::int64_t step) {
  if (!mine.empty()) throw invalid_argument(mine);
  throw peer_failure(cat("commpact::", who, "::reduce: another rank rejected its input at step ", step,
                         " (its own error says why); every rank abandons the step."));
}
}  // namespace detail

//! A value every rank must share, and what to call it in the error.
struct agreement_item {
  const char* what;
  std::int64_t value;
};

//! The one agreement of commpact's compressors: one small allreduce (max of each value
//! and of its negation, and of a "rejected" flag) checks that every rank holds the same
//! values and that no rank rejected its input. Raises alike on every rank:
//! mismatch_error naming the first value the ranks disagree on; then, when some rank's
//! `problem` is not empty, invalid_argument(problem) on that rank and peer_failure on
//! the others. `who` names the caller ("TopK", "gTopK"...).
template <Communicator C>
void agree(C& comm, const char* who, std::initializer_list<agreement_item> items, const std::string& problem,
           std::int64_t step) {
  std::int64_t v[2 * 8 + 1];
  require(items.size() <= 8, "commpact::agree: at most 8 values, got ", items.size(), ".");
  const std::size_t m = items.size();
  std::size_t i = 0;
  for (const auto& it : items) v[2 * i] = it.value, v[2 * i + 1] = -it.value, ++i;
  v[2 * m] = problem.empty() ? 0 : 1;
  comm.allreduce(std::span<std::int64_t>(v, 2 * m + 1), reduce_op::max);
  i = 0;
  for (const auto& it : items) {
    const std::int64_t hi = v[2 * i], lo = -v[2 * i + 1];
    if (hi != lo)
      throw mismatch_error(detail::cat("commpact::", who, "::reduce: ranks disagree on ", it.what, ": rank ",
                                       comm.rank(), " has ", it.value, ", the values range over [", lo, ", ", hi,
                                       "]; every rank must pass gradients of the same length and use the same "
                                       "options and step count."));
    ++i;
  }
  if (v[2 * m]) detail::raise_rejected(who, problem, step);
}

//! Throws mismatch_error on every rank unless all ranks passed the same value.
template <Communicator C>
void require_same(C& comm, std::int64_t value, std::string_view what) {
  std::int64_t mm[2] = {value, -value};
  comm.allreduce(std::span<std::int64_t>(mm, 2), reduce_op::max);
  const std::int64_t hi = mm[0], lo = -mm[1];
  if (hi != lo) {
    throw mismatch_error(detail::cat("commpact: ranks disagree on ", what, ": rank ", comm.rank(), " has ", value,
                                     ", the values range over [", lo, ", ", hi,
                                     "]; every rank must pass the same ", what, "."));
  }
}

}  // namespace commpact
