// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mean_allreduce.hpp
//! The mean allreduce (a collective): the sum in the communicator's fixed order, then
//! mean_of (kernels/mean.hpp), with the non-finite policy applied alike on every rank.
//! One entry for every space (host_space included). Used by DataParallel (model
//! averaging).

#include <cstdint>
#include <span>
#include <string_view>

#include "../concepts.hpp"
#include "../kernels/deferred/ops.hpp"
#include "../kernels/host/ops.hpp"
#include "../kernels/status.hpp"
#include "known_size.hpp"
#include "../nonfinite.hpp"

namespace commpact {

//! v = mean_of(sum over the ranks in the communicator's fixed order, P) (kernels/mean.hpp:
//! the sum divided by float(P), the one definition of the mean), the same bits on every
//! rank, in the communicator's space (host_space for ThreadComm and MpiComm): the sum is
//! queued, then ops<S>::mean with the non-finite check into `status` (a one-element
//! buffer of the space, grown once), one fence, and the same decision on every rank
//! (every rank holds the same sum). On a non-finite sum: raises numeric_error on every
//! rank (nonfinite::raise), or zeroes v and returns false (skip_step). `who` and `what`
//! name the caller and the buffer in the message; `remedy`, if given, its advice.
template <Communicator C>
bool mean_allreduce(C& comm, typename comm_space_t<C>::template span<float> v,
                    typename comm_space_t<C>::template buffer<std::uint32_t>& status, nonfinite policy,
                    std::string_view who, std::string_view what, std::int64_t step, std::string_view remedy = {}) {
  using S = comm_space_t<C>;
  const auto e = comm_exec(comm);
  status.resize(1, e);
  thread_local pinned_t<S, std::uint32_t> flags;  // pinned: the copy stays queued
  flags.resize(1);
  ops<S>::fill(e, status.view(), std::uint32_t{0});
  comm.allreduce(v, reduce_op::sum);
  ops<S>::mean(e, v, comm.size(), status.view());
  ops<S>::to_host(e, status.cview(), flags.view());
  comm_fence(comm);
  const std::uint32_t bits = flags.view()[0];
  require_fenced(bits, who);
  if ((bits & status_nonfinite) == 0) return true;
  if (policy == nonfinite::raise) detail::raise_nonfinite(who, what, static_cast<std::size_t>(-1), step, remedy);
  ops<S>::fill(e, v, 0.0f);
  comm_fence(comm);
  return false;
}

}  // namespace commpact
