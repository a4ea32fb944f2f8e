// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file step_check.hpp
//! The step count agreed at every step by the compressors whose messages carry no header
//! (Dense, LinearCompressor, CastAllreduce, PowerCompressor): start() queues an allreduce
//! (max) of the step count and its negation in the communicator's space and its copy
//! into pinned host memory; finish(), after its one fence, raises mismatch_error on every
//! rank alike when the ranks' counts differ: a rank committed a step another cancelled,
//! or retried a step the others kept. Queued like the step's own work, so start() still
//! does not wait. (A compressor with frame headers carries its step count in them.)

#include <cstddef>
#include <cstdint>
#include <span>

#include "../comm/known_size.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/ops.hpp"
#include "../space/host.hpp"

namespace commpact::detail {

template <class Space>
class step_check {
 public:
  //! Sizes the two buffers (the first queue() does it too).
  void prepare(const typename Space::exec& e) {
    buf_.resize(2 * pieces, e);
    host_.resize(2 * pieces);
  }
  //! Queues the allreduce of this rank's step count on comm's executor (host_space: runs
  //! it). The count travels as three floats of 21 bits each, every one exact, so that
  //! the float allreduce every communicator has in its space carries it.
  template <class Comm>
  void queue(Comm& comm, std::int64_t step) {
    const auto e = comm_exec(comm);
    prepare(e);
    const auto u = static_cast<std::uint64_t>(step);
    for (std::size_t i = 0; i < pieces; ++i) {
      const auto p = static_cast<float>((u >> (21 * i)) & ((std::uint64_t{1} << 21) - 1));
      ops<Space>::fill(e, buf_.view().subspan(2 * i, 1), p);
      ops<Space>::fill(e, buf_.view().subspan(2 * i + 1, 1), -p);
    }
    comm.allreduce(buf_.view(), reduce_op::max);
    ops<Space>::to_host(e, buf_.cview(), host_.view());
  }
  //! After the fence that covers queue(): mismatch_error (the same on every rank) when
  //! the ranks' step counts differ.
  void require_same(const char* who, int rank, std::int64_t step) const {
    const auto h = host_.view();
    bool same = true;
    for (std::size_t i = 0; i < pieces; ++i) same = same && h[2 * i] == -h[2 * i + 1];
    if (!same)
      throw mismatch_error(cat("commpact::", who, "::reduce: ranks disagree on the step count: rank ", rank, " has ",
                               step, " and another rank a different one; a rank kept (commit) a step that another "
                               "dropped (cancel), or retried a step the others kept. Every rank must commit or cancel "
                               "each step alike; restore every rank from one checkpoint to go on."));
  }

 private:
  static constexpr std::size_t pieces = 3;  // 3 x 21 bits: every count from 0 to 2^63 - 1
  typename Space::template buffer<float> buf_;
  pinned_t<Space, float> host_;
};

}  // namespace commpact::detail
