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
[[noreturn]] inline void raise_rejected(const char* who, const std::string& mine, std::int64_t step,
                                        const char* call = "reduce") {
  if (!mine.empty()) throw invalid_argument(mine);
  if (std::string_view(call) != "reduce")
    throw peer_failure(cat("commpact::", who, "::", call, ": another rank rejected its arguments (its own error says ",
                           "why); every rank raises here."));
  throw peer_failure(cat("commpact::", who, "::reduce: another rank rejected its input at step ", step,
                         " (its own error says why); every rank abandons the step."));
}
}  // namespace detail

//! A value every rank must share, what to call it in the error and, optionally, the way
//! out the error ends with (null: the caller's usual sentence). `bit_what`, when set,
//! names a yes/no setting (`bit`: "ranks disagree on whether <bit_what>") that rides in
//! the same two words as the value (value x 2 + bit: no byte more on the wire), for
//! values within +-2^62; the error names whichever of the two the ranks disagree on (the
//! value first).
struct agreement_item {
  const char* what;
  std::int64_t value;
  const char* hint = nullptr;
  const char* bit_what = nullptr;
  bool bit = false;
};

namespace detail {
//! The one check behind agree() and require_same(): one allreduce (max) of every item's
//! value and its negation, followed by the `extra` values (their maxima are left in v
//! after the items' 2 items.size() slots). Raises mismatch_error "<prefix>ranks disagree
//! on <what>: rank r has <value>, the values range over [lo, hi]; <hint, or tail(item)>"
//! for the first item the ranks disagree on, alike on every rank. At most 8 items and
//! 1 extra value (v's size).
template <Communicator C, class Tail>
void agree_items(C& comm, std::initializer_list<agreement_item> items, std::initializer_list<std::int64_t> extra,
                 std::int64_t (&v)[2 * 8 + 1], std::string_view prefix, Tail tail) {
  require(items.size() <= 8 && extra.size() <= 1, "commpact::agree: at most 8 values, got ", items.size(), ".");
  const std::size_t m = items.size();
  std::size_t i = 0;
  auto word = [](const agreement_item& it) { return it.bit_what ? it.value * 2 + (it.bit ? 1 : 0) : it.value; };
  for (const auto& it : items) v[2 * i] = word(it), v[2 * i + 1] = -word(it), ++i;
  std::size_t e = 2 * m;
  for (const std::int64_t x : extra) v[e++] = x;
  comm.allreduce(std::span<std::int64_t>(v, 2 * m + extra.size()), reduce_op::max);
  i = 0;
  for (const auto& it : items) {
    const std::int64_t hi = v[2 * i], lo = -v[2 * i + 1];
    if (hi != lo && it.bit_what && (hi >> 1) == (lo >> 1))  // the values agree, the settings do not
      throw mismatch_error(cat(prefix, "ranks disagree on whether ", it.bit_what, ": rank ", comm.rank(), " says ",
                               it.bit ? "yes" : "no", ", another rank ", it.bit ? "no" : "yes", "; ",
                               it.hint ? std::string(it.hint) : tail(it)));
    if (hi != lo) {
      const std::int64_t h = it.bit_what ? hi >> 1 : hi, l = it.bit_what ? lo >> 1 : lo;
      throw mismatch_error(cat(prefix, "ranks disagree on ", it.what, ": rank ", comm.rank(), " has ", it.value,
                               ", the values range over [", l, ", ", h, "]; ",
                               it.hint ? std::string(it.hint) : tail(it)));
    }
    ++i;
  }
}
}  // namespace detail

//! The one agreement of commpact's compressors: one small allreduce (max of each value
//! and of its negation, and of a "rejected" flag) checks that every rank holds the same
//! values and that no rank rejected its input. Raises alike on every rank:
//! mismatch_error naming the first value the ranks disagree on; then, when some rank's
//! `problem` is not empty, invalid_argument(problem) on that rank and peer_failure on
//! the others. `who` names the caller ("TopK", "gTopK"...); `call` the operation the
//! errors name ("reduce", a step; another, such as a constructor's name, is not a step),
//! and `advice` ends a mismatch_error whose item has no hint (default: a step's advice).
template <Communicator C>
void agree(C& comm, const char* who, std::initializer_list<agreement_item> items, const std::string& problem,
           std::int64_t step, const char* call = "reduce", std::string_view advice = {}) {
  std::int64_t v[2 * 8 + 1];
  detail::agree_items(comm, items, {problem.empty() ? 0 : 1}, v, detail::cat("commpact::", who, "::", call, ": "),
                      [&](const agreement_item&) {
                        // A rank whose own input is bad (k > n there only) says so: that is the cause.
                        return detail::cat(advice.empty() ? "every rank must pass gradients of the same length and "
                                                            "use the same options and step count."
                                                          : advice,
                                           problem.empty() ? "" : " This rank's input is also invalid: ", problem);
                      });
  if (v[2 * items.size()]) detail::raise_rejected(who, problem, step, call);
}

//! Throws mismatch_error on every rank unless all ranks passed the same values (one
//! allreduce of two int64 per item), naming the first they disagree on.
template <Communicator C>
void require_same(C& comm, std::initializer_list<agreement_item> items) {
  std::int64_t v[2 * 8 + 1];
  detail::agree_items(comm, items, {}, v, "commpact: ",
                      [](const agreement_item& it) { return detail::cat("every rank must pass the same ", it.what, "."); });
}

//! Throws mismatch_error on every rank unless all ranks passed the same value.
template <Communicator C>
void require_same(C& comm, std::int64_t value, std::string_view what) {
  const std::string w(what);
  require_same(comm, {{w.c_str(), value}});
}

}  // namespace commpact
