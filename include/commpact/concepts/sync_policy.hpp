// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sync_policy.hpp
//! SyncPolicy: when ranks synchronise: the concept, its named requirements and its diagnose_ sentence (part of
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
// SyncPolicy: when ranks synchronise.
// ---------------------------------------------------------------------------

//! What a SyncPolicy decides at a round boundary.
struct sync_plan {
  enum class mode { gradients, parameters };
  mode what = mode::gradients;  //!< gradients: reduce gradients every step (BSP); parameters: Local SGD
  std::int64_t period = 1;      //!< steps until the next synchronisation (>= 1)
};

namespace req {
template <class S>
concept has_plan = requires(const S& s, std::int64_t step, double lr) {
  { s.plan(step, lr) } -> std::same_as<sync_plan>;
};
//! Optional: `check_run(total_steps) const` validates the policy against the length of
//! a run (for example a warm-up longer than the run) and throws commpact::invalid_argument.
template <class S>
concept has_check_run = requires(const S& s, std::int64_t total_steps) { s.check_run(total_steps); };
}  // namespace req

//! A pure rule: `plan(step, lr)`, asked at the first step and after each period, says
//! whether the next period synchronises gradients (every step of it) or parameters (once,
//! after its last step) and how many steps it lasts. `lr` is the learning rate of `step`,
//! the period's first step. It sees the step and the learning rate only, so every rank
//! makes the same decisions without communicating. The caller (DataParallel,
//! plan_run) cuts a period that would run past the last step. A policy may also offer
//! `check_run(total_steps) const` (req::has_check_run), which the driver calls once.
template <class S>
concept SyncPolicy = req::has_plan<S> && std::copy_constructible<S>;

template <class S>
constexpr bool diagnose_sync_policy() {
  static_assert(req::has_plan<S>,
                "commpact: this type is not a SyncPolicy: it needs `commpact::sync_plan plan(std::int64_t step, "
                "double lr) const`.");
  static_assert(std::copy_constructible<S>, "commpact: this type is not a SyncPolicy: it must be copy-constructible.");
  return SyncPolicy<S>;
}

}  // namespace commpact
