// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file topology.hpp
//! Topology: who talks to whom, with what weight: the concept, its named requirements and its diagnose_ sentence (part of
//! concepts.hpp, the umbrella).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace commpact {

// ---------------------------------------------------------------------------
// Topology: who talks to whom, with what weight.
// ---------------------------------------------------------------------------
namespace req {
template <class T>
concept has_topology_size = requires(const T& t) {
  { t.size() } -> std::convertible_to<int>;
};
template <class T>
concept has_neighbors = requires(const T& t, int r) {
  { t.neighbors(r) } -> std::ranges::input_range;
  requires std::convertible_to<std::ranges::range_value_t<decltype(t.neighbors(r))>, int>;
};
template <class T>
concept has_weight = requires(const T& t, int i, int j) {
  { t.weight(i, j) } -> std::convertible_to<double>;
};
}  // namespace req

//! A graph over `size()` ranks: `neighbors(r)` (excluding r, ascending) and the mixing
//! weight `weight(i, j)` of a symmetric doubly-stochastic matrix (`weight(i, i)` is the
//! self weight; rows sum to 1).
template <class T>
concept Topology = req::has_topology_size<T> && req::has_neighbors<T> && req::has_weight<T>;

template <class T>
constexpr bool diagnose_topology() {
  static_assert(req::has_topology_size<T>, "commpact: this type is not a Topology: it needs `int size() const`.");
  static_assert(req::has_neighbors<T>,
                "commpact: this type is not a Topology: it needs `neighbors(int rank) const` returning a range of int.");
  static_assert(req::has_weight<T>,
                "commpact: this type is not a Topology: it needs `double weight(int i, int j) const`.");
  return Topology<T>;
}

}  // namespace commpact
