// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file vote.hpp
//! The majority-vote aggregation (signSGD with majority vote, Bernstein et al. 2018):
//! every rank's block is a frame (wire/codec_frame.hpp: the 48-byte header, then sign_codec's
//! payload: a float32 scale and ceil(n / 8) sign bits), all-gathered as Allgather<C>
//! moves them; combine(codec, out, status) (ops row sign_vote) writes out[i] = s
//! sign(sum_r sign_r[i]) (a tie gives 0), s the mean of the ranks' scales when `scaled`,
//! else 1. The vote is cast into a buffer of its own and copied into out only when the
//! step's status is clear: a frame header that is not clean (ops' frame_gate: well formed,
//! no flag, one n, step and capacity) or a malformed payload (length, scale, bits past n)
//! sets status_wire and leaves out untouched, so the vote can be queued before the host
//! has read a header. `MajorityVote<C>` (compressors/majority.hpp) composes it with
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
  //! After exchange(): the vote into out when the status is clear (every header clean,
  //! every payload well formed, no bit set earlier in the step); else status_wire (or the
  //! bit already set) and out untouched. The caller still reads the headers on the host,
  //! which name what was wrong.
  template <class K>
  void combine(const K&, span<float> out, span<std::uint32_t> status) {
    static_assert(std::is_same_v<K, sign_codec>, "commpact::Vote counts sign_codec's sign bits; encode with sign_codec.");
    const auto e = comm_exec(ag_.comm());
    const std::size_t bw = ag_.received(0).size();
    vote_.resize(out.size(), e);
    ops<space_type>::sign_vote(e, ag_.received(), bw, scaled_, vote_.view(), status);
    ops<space_type>::frame_gate(e, ag_.received(), bw, vote_.view(), status);
    ops<space_type>::copy_if_clear(e, vote_.cview(), out, span<const std::uint32_t>(status));
  }
  int sources() const { return ag_.sources(); }
  bool scaled() const { return scaled_; }
  C& comm() { return ag_.comm(); }
  const C& comm() const { return ag_.comm(); }

  template <class Out>
  void add_signature(Out& s) const {
    ag_.add_signature(s);
    s.emplace_back(static_cast<const void*>(vote_.data()), vote_.capacity());
  }
  void reserve(std::size_t capacity) { ag_.reserve(capacity); }

 private:
  Allgather<C> ag_;
  bool scaled_;
  typename space_type::template buffer<float> vote_;  // the vote, copied into out when the status is clear
};

}  // namespace commpact
