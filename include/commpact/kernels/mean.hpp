// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mean.hpp
//! The one definition of the mean over P ranks: `sum / float(P)`, one correctly rounded
//! IEEE division per value. Every compressor, aggregation and kernel (host, deferred,
//! CUDA) divides this way, so results are bit-identical across spaces and ranks. (A
//! product with 1/P differs in the last bit when P is not a power of two.)

#include "../config.hpp"

namespace commpact {

//! The mean of a sum over P ranks.
COMMPACT_HOST_DEVICE inline float mean_of(float sum, int P) { return sum / static_cast<float>(P); }

}  // namespace commpact
