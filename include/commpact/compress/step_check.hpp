// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file step_check.hpp
//! The step count agreed at every step by the compressors whose messages carry no header
//! (Dense, LinearCompressor, CastAllreduce, PowerCompressor): start() queues an allreduce
//! (max) of the step count and its negation in the communicator's space and its copy
//! into pinned host memory; finish(), after its one fence, raises mismatch_error on every
//! rank alike when the ranks' counts differ: a rank committed a step another cancelled,
//! or retried a step the others kept. Every one of them also passes its gradient length
//! (agreed in full at its first step, and again when every rank changes it) and whether it
//! runs the step idle (its length changed after the agreement: its collectives run on
//! zeroed workspaces of the agreed length), in the same 6 floats. Queued like the step's
//! own work, so start() still does not wait. (A compressor with frame headers carries its
//! step count in them.) The count carries the compressor's check tag (detail/check_tag.hpp:
//! Bucketed's bucket), so that two buckets' steps never match.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "../comm/known_size.hpp"
#include "../concepts.hpp"
#include "../detail/check_tag.hpp"
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
  //! The tag added to every step count this check carries (detail/check_tag.hpp).
  void set_tag(std::uint32_t tag) { tag_ = checked_tag(tag); }
  std::uint32_t tag() const { return tag_; }
  //! Queues the allreduce of this rank's step count (and, where the caller passes them,
  //! its gradient length and its idle flag) on comm's executor (host_space: runs it).
  //! Three floats carry 90 bits, 30 each, as the bit patterns of normal positive floats
  //! (0x00800000 + piece: their order is the integers' order, and negation is exact), so
  //! that the float allreduce every communicator has in its space carries them: the step
  //! count in bits 0 to 62, the length's low 26 bits in bits 63 to 88, the idle flag in
  //! bit 89.
  template <class Comm>
  void queue(Comm& comm, std::int64_t step, std::int64_t length = 0, bool idle = false) {
    const auto e = comm_exec(comm);
    prepare(e);
    const auto u = static_cast<std::uint64_t>(tagged_step(step, tag_));
    const auto len = (static_cast<std::uint64_t>(length) & ((std::uint64_t{1} << 26) - 1)) |
                     (std::uint64_t{idle} << 26);
    const std::uint64_t piece[pieces] = {u & mask, (u >> 30) & mask, (u >> 60) | (len << 3)};
    for (std::size_t i = 0; i < pieces; ++i) {
      const auto p = std::bit_cast<float>(static_cast<std::uint32_t>(0x00800000u + piece[i]));
      ops<Space>::fill(e, buf_.view().subspan(2 * i, 1), p);
      ops<Space>::fill(e, buf_.view().subspan(2 * i + 1, 1), -p);
    }
    comm.allreduce(buf_.view(), reduce_op::max);
    ops<Space>::to_host(e, buf_.cview(), host_.view());
  }
  //! After the fence that covers queue(): mismatch_error (the same on every rank) when
  //! the ranks' step counts differ, or (a caller that passed its length) their lengths:
  //! every length difference below 2^26 is seen, and so is a rank that runs the step
  //! idle beside one that does not.
  void require_same(const char* who, int rank, std::int64_t step, std::int64_t length = -1) const {
    const auto h = host_.view();
    bool same[pieces];
    for (std::size_t i = 0; i < pieces; ++i) same[i] = h[2 * i] == -h[2 * i + 1];
    if (!same[0] || !same[1] || (!same[2] && length < 0)) throw out_of_step(who, rank, step, tag_);
    if (!same[2])
      throw mismatch_error(cat("commpact::", who, "::reduce: ranks disagree on the gradient length: rank ", rank,
                               " has ", length, " floats at step ", step, " and another rank a different length (or "
                               "step count); every rank must pass gradients of the same length, the concatenation of "
                               "the registered tensors. No state changed; the ranks whose length fit hold the step's result "
                               "in grad."));
  }

 private:
  static constexpr std::size_t pieces = 3;  // 3 x 30 bits: the count (63 bits), 26 bits of the length, the idle flag
  static constexpr std::uint64_t mask = (std::uint64_t{1} << 30) - 1;
  typename Space::template buffer<float> buf_;
  pinned_t<Space, float> host_;
  std::uint32_t tag_ = 0;
};

}  // namespace commpact::detail
