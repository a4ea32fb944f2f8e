// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file allgather.hpp
//! The allgather aggregation: one fixed-capacity block per rank moved to every rank (the
//! ring allgather of C). `CodecCompressor<Codec, Allgather<C>>` (compressors/codec_compressor.hpp)
//! composes it with any Codec and error feedback; the blocks carry the frame of wire/codec_frame.hpp.
//!
//! combine(codec, out, status) decodes every block's payload in rank order into a zeroed
//! sum (the same float additions on every rank) and writes the mean into out when every
//! frame header is clean (ops' frame_gate: well formed, no flag, one n, agreement value,
//! step and capacity) and every sum value is finite; else it sets status_wire or
//! status_nonfinite and leaves out untouched. The headers are the compressor's to check on
//! the host too (frame::check_headers on received(), after the fence), which names what
//! was wrong; a payload the codec finds malformed sets status_wire (the decoders never
//! throw on data). So combine can be queued before the host has seen a header, and the
//! step needs one fence.
//!
//! Bytes per rank per step: (P - 1) * capacity, capacity = 48 + max_encoded_bytes(n)
//! rounded up to 4. For top-k: (P - 1) * (48 + 8k).

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "../../comm/known_size.hpp"
#include "../../concepts.hpp"
#include "../../kernels/deferred/ops.hpp"
#include "../../kernels/host/ops.hpp"
#include "base.hpp"

namespace commpact {

//! The allgather aggregation over C: fixed-capacity blocks, one per rank.
template <class C>
class Allgather : public detail::comm_aggregation<C> {
  using detail::comm_aggregation<C>::comm_;
  using S = comm_space_t<C>;

 public:
  template <class T>
  using span = detail::comm_span<C, T>;
  using detail::comm_aggregation<C>::comm_aggregation;

  //! This rank's block of `capacity` bytes (a multiple of 4) as float storage in the
  //! space, to fill before exchange().
  span<float> block(std::size_t capacity) {
    const auto e = comm_exec(comm_);
    mine_.resize(capacity / 4, e);
    all_.resize(capacity / 4 * static_cast<std::size_t>(comm_.size()), e);
    return mine_.view();
  }
  //! Every rank receives every block (collective; queued in a deferred or device space).
  void exchange() { comm_.allgather(span<const float>(mine_.view()), all_.view()); }
  //! Every rank's block after exchange(), in rank order.
  span<const float> received() const { return all_.view(); }
  //! Rank r's block after exchange().
  span<const float> received(int r) const {
    const std::size_t b = mine_.size();
    return all_.view().subspan(static_cast<std::size_t>(r) * b, b);
  }
  //! After exchange(): out = mean over the sources of the codec's decode of their
  //! payloads (decoded in rank order into a zeroed sum); out untouched, with status_wire
  //! when a header is not clean or a payload malformed, status_nonfinite when the sum is
  //! not finite (it overflowed).
  template <class K>
  void combine(const K& codec, span<float> out, span<std::uint32_t> status) {
    const auto e = comm_exec(comm_);
    sum_.resize(out.size(), e);
    ops<S>::template codec_decode_sum<K>(e, codec, all_.cview(), mine_.size(), sum_.view(), status);
    ops<S>::frame_gate(e, all_.cview(), mine_.size(), sum_.view(), status);
    ops<S>::mean_into(e, sum_.cview(), out, comm_.size(), status);
  }

  template <class Out>
  void add_signature(Out& s) const {
    s.emplace_back(static_cast<const void*>(mine_.data()), mine_.capacity());
    s.emplace_back(static_cast<const void*>(all_.data()), all_.capacity());
    s.emplace_back(static_cast<const void*>(sum_.data()), sum_.capacity());
  }
  void reserve(std::size_t capacity) {
    const auto e = comm_exec(comm_);
    mine_.reserve(capacity / 4, e);
    all_.reserve(capacity / 4 * static_cast<std::size_t>(comm_.size()), e);
  }

 private:
  // bytes in float storage: the concept's allgather moves floats
  detail::comm_buffer<C, float> mine_, all_, sum_;  // sum_: combine's decoded sum
};

}  // namespace commpact
