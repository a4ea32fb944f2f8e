// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file allgather.hpp
//! The allgather aggregation: one fixed-capacity block per rank moved to every rank (the
//! ring allgather of C). `CodecCompressor<Codec, Allgather<C>>` (compressors/codec_compressor.hpp)
//! composes it with any Codec and error feedback; the blocks carry the frame of frame.hpp.
//!
//! Bytes per rank per step: (P - 1) * capacity, capacity = 48 + max_encoded_bytes(n)
//! rounded up to 4. For top-k: (P - 1) * (48 + 8k).

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "../../comm/known_size.hpp"
#include "../../concepts.hpp"

namespace commpact {

//! The allgather aggregation over C: fixed-capacity blocks, one per rank.
template <class C>
class Allgather {
  static_assert(diagnose_communicator<C>());

 public:
  using comm_type = C;
  using space_type = comm_space_t<C>;
  template <class T>
  using span = typename space_type::template span<T>;

  explicit Allgather(C comm) : comm_(std::move(comm)) {}

  //! This rank's block of `capacity` bytes (a multiple of 4) as float storage in the
  //! space, to fill before exchange().
  span<float> block(std::size_t capacity) {
    mine_.resize(capacity / 4);
    all_.resize(capacity / 4 * static_cast<std::size_t>(comm_.size()));
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
  int sources() const { return comm_.size(); }
  C& comm() { return comm_; }
  const C& comm() const { return comm_; }

  template <class Out>
  void add_signature(Out& s) const {
    s.emplace_back(static_cast<const void*>(mine_.data()), mine_.capacity());
    s.emplace_back(static_cast<const void*>(all_.data()), all_.capacity());
  }
  void reserve(std::size_t capacity) {
    mine_.reserve(capacity / 4);
    all_.reserve(capacity / 4 * static_cast<std::size_t>(comm_.size()));
  }

 private:
  C comm_;
  // bytes in float storage: the concept's allgather moves floats
  typename space_type::template buffer<float> mine_, all_;
};

}  // namespace commpact
