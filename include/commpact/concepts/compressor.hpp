// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file compressor.hpp
//! Compressor: what crosses the network, and how it is aggregated: the concept, its named requirements and its diagnose_ sentence (part of
//! concepts.hpp, the umbrella).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../space/host.hpp"

namespace commpact {

// ---------------------------------------------------------------------------
// Compressor: what crosses the network, and how it is aggregated.
// ---------------------------------------------------------------------------
namespace req {
template <class C>
concept has_reduce = requires(C& c, typename space_of_t<C>::template span<float> g) { c.reduce(g); };
template <class C>
concept has_state = requires(const C& cc, C& c, std::vector<std::byte>& out, std::span<const std::byte> in) {
  cc.save_state(out);
  c.load_state(in);
};
}  // namespace req

//! Holds a communicator and its own state. `reduce(grad)` replaces grad, on every rank,
//! by the same (compressed) average over the ranks, keeping what it did not send in its
//! error-feedback residual. `save_state(bytes)` appends the state; `load_state(bytes)`
//! restores it. grad is a span of the compressor's space (`space_of_t<C>`: C::space_type
//! when C names one, else host_space, whose spans are std::span).
template <class C>
concept Compressor = req::has_reduce<C> && req::has_state<C>;

template <class C>
constexpr bool diagnose_compressor() {
  static_assert(req::has_reduce<C>,
                "commpact: this type is not a Compressor: it needs `reduce(std::span<float> grad)` (or, for a "
                "compressor that names a `space_type`, `reduce(space_type::span<float> grad)`).");
  static_assert(req::has_state<C>,
                "commpact: this type is not a Compressor: it needs `save_state(std::vector<std::byte>&) const` and "
                "`load_state(std::span<const std::byte>)`.");
  return Compressor<C>;
}

}  // namespace commpact
