// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file allreduce.hpp
//! The allreduce aggregation of linear codecs: when every rank compresses with the same
//! linear map A (random-k with a shared seed keeps the same k indices on every rank),
//! the sum of the compressed vectors is the compressed sum, so the ranks allreduce m
//! floats instead of all-gathering P messages. `LinearCompressor<K, C>`
//! (compressors/linear.hpp) composes it with a LinearCodec and error feedback.
//!
//! A block is m + 1 floats: A v and one flag float (1 when this rank's input was not
//! finite; ops row linear_encode writes both). exchange() sums the blocks by the
//! communicator's allreduce (the same bits on every rank); combine(codec, out, status)
//! (ops row linear_decode) sets status_nonfinite when some rank flagged its input or a
//! mean is not finite (finite inputs whose sum overflowed: every rank holds the same
//! sums, so every rank sees it) and leaves out untouched, else writes out = B (sum / P),
//! the mean being mean_of (kernels/mean.hpp) of each summed value.
//!
//! Bytes per rank per step: the allreduce of m + 1 floats (a ring: about
//! 2 (P - 1) / P (m + 1) 4; wire::ring_allreduce gives it exactly).

#include <cstddef>
#include <cstdint>
#include <utility>

#include "../../comm/known_size.hpp"
#include "../../concepts.hpp"
#include "../../kernels/deferred/ops.hpp"
#include "../../kernels/host/ops.hpp"
#include "base.hpp"

namespace commpact {

//! The allreduce aggregation over C: one block of m + 1 floats per rank, summed.
template <class C>
class Allreduce : public detail::comm_aggregation<C> {
  using detail::comm_aggregation<C>::comm_;

 public:
  template <class T>
  using span = detail::comm_span<C, T>;
  using detail::comm_aggregation<C>::comm_aggregation;

  //! This rank's block of `capacity` bytes (4 (m + 1): the compressed vector and the
  //! flag) as float storage in the space, to fill before exchange().
  span<float> block(std::size_t capacity) {
    buf_.resize(capacity / 4, comm_exec(comm_));
    return buf_.view();
  }
  //! Sums the blocks of every rank in place (collective; queued in a deferred space).
  void exchange() { comm_.allreduce(buf_.view(), reduce_op::sum); }
  //! After exchange(): out = B (the mean of the compressed vectors) when no rank flagged
  //! a non-finite input and every mean is finite, else status_nonfinite and out untouched.
  template <class K>
  void combine(const K& codec, span<float> out, span<std::uint32_t> status) {
    ops<comm_space_t<C>>::linear_decode(comm_exec(comm_), codec, buf_.view(), out, comm_.size(), status);
  }

  template <class Out>
  void add_signature(Out& s) const {
    s.emplace_back(static_cast<const void*>(buf_.data()), buf_.capacity());
  }

 private:
  detail::comm_buffer<C, float> buf_;
};

}  // namespace commpact
