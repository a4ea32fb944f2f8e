// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file status.hpp
//! The step status: bits that kernels set in the space's memory instead of throwing
//! (device code cannot throw, and a check per kernel would synchronise per kernel). A
//! compressor's finish() reads it once, after its one fence, and raises the same error
//! on every rank.

#include <cstdint>
#include <string_view>

#include "../error.hpp"

namespace commpact {

enum status_bit : std::uint32_t {
  status_nonfinite = 1u << 0,  //!< a NaN or Inf was met (input, sum or mean)
  status_wire = 1u << 1,       //!< a received message was malformed
  status_rejected = 1u << 2,   //!< this rank's input was rejected (size, k)
  //! Never set by a kernel: a host copy of a status read before the fence that covers
  //! the copy holds it (the deferred space poisons host copies with 0xFF bytes).
  status_unfenced = 1u << 31,
};

//! Raises usage_error when a status word copied to the host was read before its fence.
inline void require_fenced(std::uint32_t bits, std::string_view who) {
  if (bits & status_unfenced)
    throw usage_error(detail::cat("commpact::", who, ": the step's status was read on the host before the fence "
                                  "that covers its copy (it reads 'not fenced'); fence the executor first."));
}

}  // namespace commpact
