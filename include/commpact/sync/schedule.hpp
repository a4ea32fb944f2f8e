// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file schedule.hpp
//! plan_run: what a SyncPolicy decides over a whole run, without training. Pure, so a
//! benchmark or a test can count the rounds and bytes of a policy for any schedule.
//!
//! \code
//! commpact::WarmupCosineLr lr{0.008, 500, 10000};
//! auto periods = commpact::plan_run(commpact::QSRPolicy{0.0175, 4, 500}, lr, 10000);
//! auto rounds = commpact::count_rounds(periods);   // the synchronisation rounds of the run
//! \endcode
//!
//! The periods are the ones DataParallel runs: asked at step 0 and at the end of each
//! period with the learning rate of the period's first step, each cut at the end of the
//! run. A gradient period synchronises at each of its steps, a parameter period once,
//! after its last step.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "policies.hpp"

namespace commpact {

//! One period of a run: steps [start, start + length).
struct sync_period {
  std::int64_t start = 0;
  std::int64_t length = 1;
  sync_plan::mode what = sync_plan::mode::gradients;
  //! Synchronisation rounds in this period: `length` for gradients, 1 for parameters.
  std::int64_t rounds() const { return what == sync_plan::mode::gradients ? length : 1; }
  //! The step after which this period's last round happens.
  std::int64_t last() const { return start + length - 1; }
  bool operator==(const sync_period&) const = default;
};

namespace detail {
//! Asks the policy at `step` and cuts the period at the end of the run; checks the
//! policy's answer so that a user policy with a bad period fails with a sentence.
template <SyncPolicy S>
sync_period next_period(const S& policy, std::int64_t step, double lr, std::int64_t total_steps) {
  const sync_plan p = policy.plan(step, lr);
  require(p.period >= 1, "commpact: the sync policy returned period ", p.period, " at step ", step,
          "; a period must be at least 1 step. Fix the policy's plan().");
  require(p.what == sync_plan::mode::gradients || p.what == sync_plan::mode::parameters,
          "commpact: the sync policy returned an unknown mode at step ", step, ".");
  return {step, std::min(p.period, total_steps - step), p.what};
}
}  // namespace detail

//! The periods of a run of `total_steps` steps under `policy` with learning rate
//! `lr(step)`. Calls the policy's check_run and check_schedule first (so a QSR warm-up
//! that differs from the schedule's is an error).
template <class S, class Lr>
  requires std::invocable<const Lr&, std::int64_t>
std::vector<sync_period> plan_run(const S& policy, const Lr& lr, std::int64_t total_steps) {
  static_assert(diagnose_sync_policy<S>());  // a type that is not a SyncPolicy: the missing piece, named
  std::vector<sync_period> out;
  if constexpr (SyncPolicy<S>) {  // else only the sentence above, no cascade
    check_run(policy, total_steps);
    check_schedule(policy, lr);
    for (std::int64_t step = 0; step < total_steps;) {
      out.push_back(detail::next_period(policy, step, static_cast<double>(lr(step)), total_steps));
      step += out.back().length;
    }
  }
  return out;
}

//! Total synchronisation rounds of a planned run.
inline std::int64_t count_rounds(const std::vector<sync_period>& periods) {
  std::int64_t r = 0;
  for (const auto& p : periods) r += p.rounds();
  return r;
}

//! The steps after which a round happens, ascending (what DataParallel::step returns true for).
inline std::vector<std::int64_t> round_steps(const std::vector<sync_period>& periods) {
  std::vector<std::int64_t> out;
  for (const auto& p : periods) {
    if (p.what == sync_plan::mode::gradients) {
      for (std::int64_t s = p.start; s <= p.last(); ++s) out.push_back(s);
    } else {
      out.push_back(p.last());
    }
  }
  return out;
}

}  // namespace commpact
