// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file aggregation.hpp
//! Aggregation: how ranks combine what their codecs produce: the concept, its named requirements and its diagnose_ sentence (part of
//! concepts.hpp, the umbrella).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "communicator.hpp"
namespace commpact {

// ---------------------------------------------------------------------------
// Aggregation: how ranks combine what their codecs produce (CodecCompressor's second part).
// ---------------------------------------------------------------------------
namespace req {
//! A stand-in codec for checking `combine` (declared only, never called): it has what
//! a Codec and a LinearCodec have, so an aggregation's combine may constrain its codec
//! on either concept.
struct any_codec {
  std::size_t max_encoded_bytes(std::size_t n) const;
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx);
  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const;
  std::size_t size(std::size_t n) const;
  void compress(std::span<const float> v, std::span<float> out);
  void decompress_add(std::span<const float> in, std::span<float> acc) const;
};
template <class A>
concept has_blocks = requires(A& a, const A& ca, std::size_t capacity) {
  typename A::comm_type;
  typename A::space_type;
  { a.block(capacity) } -> std::convertible_to<typename A::space_type::template span<float>>;
  a.exchange();
  { ca.sources() } -> std::convertible_to<int>;
};
template <class A>
concept has_combine = requires(A& a, const any_codec& k, typename A::space_type::template span<float> out,
                               typename A::space_type::template span<std::uint32_t> status) {
  a.combine(k, out, status);
};
template <class A>
concept has_received = requires(const A& ca, int r) {
  { ca.received() } -> std::convertible_to<typename A::space_type::template span<const float>>;
  { ca.received(r) } -> std::convertible_to<typename A::space_type::template span<const float>>;
};
template <class A>
concept has_aggregation_comm = requires(A& a) {
  a.comm();
  requires Communicator<std::remove_cvref_t<decltype(a.comm())>>;
};
}  // namespace req

//! An aggregation combines what every rank's codec produced, in its space (`space_type`,
//! the space of its communicator `comm_type`; `comm()` returns it, and the compressor
//! agrees on sizes through it):
//! - `block(capacity)`: this rank's contribution, `capacity` bytes (a multiple of 4) of
//!   float storage in the space, for the codec to fill;
//! - `exchange()`: the collective (allgather, allreduce...), queued on the
//!   communicator's executor;
//! - `combine(codec, out, status)`: writes out from what every rank contributed (decoded
//!   by `codec` where the aggregation needs it), the same bits on every rank; instead of
//!   throwing it sets bits of the step status (status_wire for a malformed message,
//!   status_nonfinite for a non-finite input or result) and then leaves out untouched;
//! - `sources()`: how many ranks contributed.
//! Models: Allgather<C> (decode in rank order, then the mean), Allreduce<C> (linear
//! codecs: the sum is the compressed sum), Vote<C> (majority vote of sign bits),
//! TreeMerge<Tree> (gTop-k's tree merge of sparse sets), SparseReduceScatter<C> (Ok-Topk's
//! sparse reduce-scatter and selection).
template <class A>
concept Aggregation = req::has_blocks<A> && req::has_aggregation_comm<A> && req::has_combine<A>;

//! An aggregation whose every block is visible after exchange(): `received()` (every
//! source's block in rank order, the same on every rank) and `received(r)`. A compressor
//! that checks frame headers (CodecCompressor, MajorityVote) needs one. Allgather<C> and
//! Vote<C> are.
template <class A>
concept BlockAggregation = Aggregation<A> && req::has_received<A>;

template <class A>
constexpr bool diagnose_aggregation() {
  static_assert(req::has_blocks<A>,
                "commpact: this type is not an Aggregation: it needs `comm_type`, `space_type`, `span<float> "
                "block(std::size_t capacity)`, `exchange()` and `int sources() const`, spans of its space (write "
                "commpact::Allgather<YourComm>).");
  static_assert(req::has_aggregation_comm<A>,
                "commpact: this type is not an Aggregation: it needs `comm()` returning its Communicator.");
  if constexpr (req::has_blocks<A>)
    static_assert(req::has_combine<A>,
                  "commpact: this type is not an Aggregation: it needs `void combine(const Codec& codec, span<float> "
                  "out, span<std::uint32_t> status)` that writes out from every rank's contribution and sets status "
                  "bits (status_wire, status_nonfinite) instead of throwing (see Allgather<C>::combine).");
  return Aggregation<A>;
}

//! diagnose_aggregation, and the visible blocks of a BlockAggregation.
template <class A>
constexpr bool diagnose_block_aggregation() {
  if constexpr (!diagnose_aggregation<A>()) {
    return false;
  } else {
    static_assert(req::has_received<A>,
                  "commpact: this Aggregation does not show every rank's block: it needs `span<const float> received() "
                  "const` and `span<const float> received(int) const`, spans of its space (Allgather<C> has them).");
    return BlockAggregation<A>;
  }
}

}  // namespace commpact
