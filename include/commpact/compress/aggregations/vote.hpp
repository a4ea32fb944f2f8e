// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file vote.hpp
//! The majority-vote aggregation (signSGD with majority vote, Bernstein et al. 2018):
//! every rank's block is a frame (wire/codec_frame.hpp: the 48-byte header, then sign_codec's
//! payload: a float32 scale and ceil(n / 8) sign bits), all-gathered as Allgather<C>
//! moves them; combine(codec, out, status) (ops row sign_vote) writes out[i] = s
//! sign(sum_r sign_r[i]) (a tie gives 0), s the mean of the ranks' scales when `scaled`,
//! else 1. A malformed payload (length, scale, bits past n) sets status_wire and leaves
//! out untouched. `MajorityVote<C>` (compressors/majority.hpp) composes it with
//! sign_codec.
//!
//! Bytes per rank per step: (P - 1) (48 + 4 + ceil(n / 8) rounded up to 4).

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../../concepts.hpp"
#include "../../kernels/deferred/ops.hpp"
#include "../../kernels/host/ops.hpp"
#include "../codecs/topk_sign.hpp"
#include "allgather.hpp"

namespace commpact {

//! The majority-vote aggregation over C: the blocks of Allgather<C>, combined by a vote.
template <class C>
class Vote {
 public:
  using comm_type = C;
  using space_type = comm_space_t<C>;
  template <class T>
  using span = typename space_type::template span<T>;

  //! `scaled`: the update's magnitude is the mean of the ranks' scales (true) or 1.
  explicit Vote(C comm, bool scaled = true) : ag_(std::move(comm)), scaled_(scaled) {}

  //! This rank's block of `capacity` bytes (frame header and payload), float storage.
  span<float> block(std::size_t capacity) { return ag_.block(capacity); }
  //! Every rank receives every block (collective; queued in a deferred space).
  void exchange() { ag_.exchange(); }
  span<const float> received() const { return ag_.received(); }
  span<const float> received(int r) const { return ag_.received(r); }
  //! After exchange() (headers checked by the caller): the vote into out, or
  //! status_wire and out untouched for a malformed payload.
  template <class K>
  void combine(const K&, span<float> out, span<std::uint32_t> status) {
    static_assert(std::is_same_v<K, sign_codec>, "commpact::Vote counts sign_codec's sign bits; encode with sign_codec.");
    ops<space_type>::sign_vote(comm_exec(ag_.comm()), ag_.received(), ag_.received(0).size(), scaled_, out, status);
  }
  int sources() const { return ag_.sources(); }
  bool scaled() const { return scaled_; }
  C& comm() { return ag_.comm(); }
  const C& comm() const { return ag_.comm(); }

  template <class Out>
  void add_signature(Out& s) const {
    ag_.add_signature(s);
  }
  void reserve(std::size_t capacity) { ag_.reserve(capacity); }

 private:
  Allgather<C> ag_;
  bool scaled_;
};

}  // namespace commpact
