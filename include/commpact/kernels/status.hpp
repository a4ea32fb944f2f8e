// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file status.hpp
//! The step status: bits that kernels set in the space's memory instead of throwing
//! (device code cannot throw, and a check per kernel would synchronise per kernel). A
//! compressor's finish() reads it once, after its one fence, and raises the same error
//! on every rank.

#include <cstdint>

namespace commpact {

enum status_bit : std::uint32_t {
  status_nonfinite = 1u << 0,  //!< a NaN or Inf was met (input, sum or mean)
  status_wire = 1u << 1,       //!< a received message was malformed
  status_rejected = 1u << 2,   //!< this rank's input was rejected (size, k)
};

}  // namespace commpact
