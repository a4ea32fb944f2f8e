// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mean_allreduce.hpp
//! The mean allreduce (a collective): the sum in the communicator's fixed order, then
//! mean_of (kernels/mean.hpp), with the non-finite policy applied alike on every rank.
//! Used by PowerCompressor (its dense layers), DataParallel (model averaging) and the
//! gossip mixers' checks.

#include <cstdint>
#include <span>
#include <string_view>

#include "../concepts.hpp"
#include "../kernels/host/vector_ops.hpp"
#include "../nonfinite.hpp"

namespace commpact {

//! v = mean_of(sum over the ranks in the communicator's fixed order, P) (kernels/mean.hpp:
//! the sum divided by float(P), the one definition of the mean), the same bits on every
//! rank. On a non-finite sum: raises numeric_error on every rank
//! (nonfinite::raise), or zeroes v and returns false (skip_step). `who` and `what` name
//! the caller and the buffer in the message.
template <Communicator C>
bool mean_allreduce(C& comm, std::span<float> v, nonfinite policy, std::string_view who, std::string_view what,
                    std::int64_t step) {
  comm.allreduce(v, reduce_op::sum);
  const std::size_t bad = host::mean_checked(v, comm.size());
  if (bad == v.size()) return true;
  return detail::end_nonfinite_step(policy, who, what, bad, step, v);
}

}  // namespace commpact
