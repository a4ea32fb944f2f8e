// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file agree.hpp
//! Checks that every rank holds the same value; raises mismatch_error on every rank
//! when they do not (one small allreduce, so no rank is left waiting).

#include <cstdint>
#include <span>
#include <string_view>

#include "../concepts.hpp"
#include "../error.hpp"

namespace commpact {

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
