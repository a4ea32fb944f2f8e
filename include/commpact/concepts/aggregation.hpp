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
template <class A>
concept has_blocks = requires(A& a, const A& ca, std::size_t capacity, int r) {
  typename A::comm_type;
  typename A::space_type;
  { a.block(capacity) } -> std::convertible_to<typename A::space_type::template span<float>>;
  a.exchange();
  { ca.received() } -> std::convertible_to<typename A::space_type::template span<const float>>;
  { ca.received(r) } -> std::convertible_to<typename A::space_type::template span<const float>>;
  { ca.sources() } -> std::convertible_to<int>;
};
template <class A>
concept has_aggregation_comm = requires(A& a) {
  a.comm();
  requires Communicator<std::remove_cvref_t<decltype(a.comm())>>;
};
}  // namespace req

//! An aggregation moves one block per rank, in its space (`space_type`, the space of its
//! communicator): `block(capacity)` is this rank's block of `capacity` bytes (a multiple
//! of 4) as float storage to fill, `exchange()` (collective) delivers, `received()` is
//! every source's block in rank order (the same on every rank) and `received(r)` source
//! r's, `sources()` how many there are; `comm()` is its Communicator (the compressor
//! agrees on sizes through it). Allgather<C> is one.
template <class A>
concept Aggregation = req::has_blocks<A> && req::has_aggregation_comm<A>;

template <class A>
constexpr bool diagnose_aggregation() {
  static_assert(req::has_blocks<A>,
                "commpact: this type is not an Aggregation: it needs `comm_type`, `space_type`, `span<float> "
                "block(std::size_t capacity)`, `exchange()`, `span<const float> received() const`, `span<const float> "
                "received(int) const` and `int sources() const`, spans of its space (write "
                "commpact::Allgather<YourComm>).");
  static_assert(req::has_aggregation_comm<A>,
                "commpact: this type is not an Aggregation: it needs `comm()` returning its Communicator.");
  return Aggregation<A>;
}

}  // namespace commpact
