// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file consistency.hpp
//! The parameter server's consistency models, SyncPolicy-like value types: BSP, SSP(s)
//! (Ho et al., NIPS 2013) and ASP. Each is a pure rule the server applies; a worker
//! never decides anything itself.
//!
//! | model | a pull at clock c returns parameters with | the server applies |
//! |---|---|---|
//! | `Bsp{}` | every update of clocks 0 .. c-1 from every worker, none newer | one step per clock: the mean of the W pushes, decoded in worker order |
//! | `Ssp{s}` | every update of clocks 0 .. c-s-1 from every worker, possibly newer clocks | the same, one step per completed clock |
//! | `Asp{}` | whatever the server holds (no waiting) | one step per push, with the push's gradient / W, in arrival order |
//!
//! A worker's clock c is the number of gradients it has pushed. The server's version is
//! the number of clocks it has applied (Bsp, Ssp) or of pushes (Asp). A pull at clock c
//! is answered once version >= required_version(c): c for Bsp, max(0, c - s) for Ssp{s},
//! 0 for Asp; so a fast worker waits inside pull() until the slowest is within s clocks.
//! Ssp{0} is Bsp (the same rule and the same steps, bit for bit).

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <limits>

#include "../error.hpp"

namespace commpact::ps {

//! Bulk-synchronous: every pull sees every update of the clocks before it.
struct Bsp {
  static constexpr bool per_push = false;
  std::int64_t required_version(std::int64_t clock) const { return clock; }
  //! The staleness bound s (Bsp: 0; Asp: -1, unbounded).
  std::int64_t staleness() const { return 0; }
  const char* name() const { return "BSP"; }
};

//! Stale-synchronous with bound s >= 0: a worker at clock c reads parameters that hold
//! every update of clocks <= c - s - 1 from every worker.
struct Ssp {
  std::int64_t s = 1;
  static constexpr bool per_push = false;
  explicit Ssp(std::int64_t bound = 1) : s(bound) {
    require(bound >= 0, "commpact::ps::Ssp: the staleness bound s = ", bound,
            " is negative; use s >= 0 (s = 0 is BSP) or ps::Asp for no bound.");
  }
  std::int64_t required_version(std::int64_t clock) const { return std::max<std::int64_t>(0, clock - s); }
  std::int64_t staleness() const { return s; }
  const char* name() const { return "SSP"; }
};

//! Asynchronous: pulls never wait; each push is applied as it arrives.
struct Asp {
  static constexpr bool per_push = true;
  std::int64_t required_version(std::int64_t) const { return 0; }
  std::int64_t staleness() const { return -1; }
  const char* name() const { return "ASP"; }
};

namespace req {
template <class M>
concept has_required_version = requires(const M& m, std::int64_t c) {
  { m.required_version(c) } -> std::same_as<std::int64_t>;
  { m.staleness() } -> std::convertible_to<std::int64_t>;
  { m.name() } -> std::convertible_to<const char*>;
};
template <class M>
concept has_per_push = requires {
  { M::per_push } -> std::convertible_to<bool>;
};
}  // namespace req

//! A consistency model: `required_version(clock)` (the oldest server version a pull at
//! that clock may return, non-decreasing in clock), `staleness()`, `name()` and a
//! static `per_push` (true: each push is one optimiser step; false: one step per clock).
template <class M>
concept Consistency = req::has_required_version<M> && req::has_per_push<M> && std::copy_constructible<M>;

template <class M>
constexpr bool diagnose_consistency() {
  static_assert(req::has_required_version<M>,
                "commpact::ps: this type is not a Consistency model: it needs `std::int64_t "
                "required_version(std::int64_t clock) const`, `std::int64_t staleness() const` and `const char* "
                "name() const` (see ps::Bsp, ps::Ssp, ps::Asp).");
  static_assert(req::has_per_push<M>,
                "commpact::ps: this type is not a Consistency model: it needs `static constexpr bool per_push` "
                "(true: apply each push at once, as Asp; false: one step per completed clock).");
  static_assert(std::copy_constructible<M>, "commpact::ps: a Consistency model must be copy-constructible.");
  return Consistency<M>;
}

static_assert(Consistency<Bsp> && Consistency<Ssp> && Consistency<Asp>);

}  // namespace commpact::ps
