// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file policies.hpp
//! SyncPolicy models: when the ranks synchronise.
//!
//! | policy | rule |
//! |---|---|
//! | `EveryStep{}` | BSP: average gradients at every step |
//! | `LocalSgd{H}` | average parameters after every H local steps |
//! | `QSRPolicy{alpha, h_base, warmup}` | after each round at learning rate lr the next period is H = max(h_base, floor((alpha / lr)^2)); h_base during the first `warmup` steps (Gu et al., ICLR 2024) |
//! | `QSRPolicy{alpha, h_base, lr_schedule}` | the same, with the warm-up taken from the schedule |
//! | `PostLocal{switch_step, H}` | EveryStep before `switch_step`, LocalSgd{H} from it on (Lin et al., ICLR 2020) |
//!
//! Each is a small value type and a pure function of (step, lr): every rank makes the
//! same decisions without communicating. The caller cuts the last period at the end of
//! the run (see DataParallel and plan_run in schedule.hpp).
//!
//! \code
//! commpact::WarmupCosineLr lr{0.008, 500, 10000};
//! commpact::QSRPolicy qsr{0.0175, 4, lr};     // alpha, h_base, and the schedule's 500 warm-up steps
//! auto p = qsr.plan(1000, 0.004);             // {parameters, max(4, floor((0.0175/0.004)^2)) = 19}
//! \endcode
//!
//! A QSR warm-up that differs from the schedule's is an error wherever both are known:
//! `check_schedule(policy, lr)`, which plan_run calls.

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../concepts.hpp"
#include "../error.hpp"
#include "lr_schedule.hpp"

namespace commpact {

namespace detail {
inline void check_step(const char* who, std::int64_t step) {
  require(step >= 0, who, ": step ", step, " is negative; steps count from 0.");
}
inline void check_run_length(const char* who, std::int64_t total_steps) {
  require(total_steps >= 0, who, ": the run length total_steps = ", total_steps,
          " is negative; pass the number of optimizer steps of the run (>= 0).");
}
}  // namespace detail

//! Calls `policy.check_run(total_steps)` when the policy has it (req::has_check_run).
template <SyncPolicy S>
void check_run(const S& policy, std::int64_t total_steps) {
  detail::check_run_length("commpact::check_run", total_steps);
  if constexpr (req::has_check_run<S>) policy.check_run(total_steps);
}

//! Calls `policy.check_schedule(lr)` when the policy has it: a policy that depends on the
//! learning-rate schedule (QSRPolicy's warm-up) rejects a schedule it disagrees with.
template <SyncPolicy S, class Lr>
void check_schedule(const S& policy, const Lr& lr) {
  if constexpr (requires { policy.check_schedule(lr); }) policy.check_schedule(lr);
}

//! BSP: every step reduces the gradients (through the Compressor).
struct EveryStep {
  sync_plan plan(std::int64_t step, double /*lr*/) const {
    detail::check_step("commpact::EveryStep::plan", step);
    return {sync_plan::mode::gradients, 1};
  }
};

//! Local SGD with a constant period: H local steps, then the ranks average parameters.
class LocalSgd {
 public:
  explicit LocalSgd(std::int64_t H) : h_(H) {
    require(H >= 1, "commpact::LocalSgd: the period H = ", H,
            " must be at least 1 (H local steps between averaging rounds); use H = 1 for an average after every "
            "step, or EveryStep to average gradients instead.");
  }
  sync_plan plan(std::int64_t step, double /*lr*/) const {
    detail::check_step("commpact::LocalSgd::plan", step);
    return {sync_plan::mode::parameters, h_};
  }
  std::int64_t period() const { return h_; }

 private:
  std::int64_t h_;
};

//! The Quadratic Synchronization Rule (Gu, Lyu, Arora, Zhang, Huang; ICLR 2024):
//! a period that starts at step t with learning rate lr lasts
//! H = max(h_base, floor((alpha / lr)^2)) steps, or h_base while t < warmup.
//!
//! Arithmetic: q = alpha / lr and floor(q * q) in double precision, the same on every
//! rank. A quotient whose square reaches 2^63 (a learning rate that decayed to almost
//! nothing), and a learning rate of 0 (a schedule that ends at 0, or reaches it by
//! rounding in a very long run), saturate to the largest std::int64_t instead of
//! overflowing; the caller then cuts the period at the end of the run. With alpha = 0
//! the period is h_base at every learning rate.
class QSRPolicy {
 public:
  //! alpha >= 0 (finite), h_base >= 1, warmup >= 0 steps of learning-rate warm-up.
  QSRPolicy(double alpha, std::int64_t h_base, std::int64_t warmup = 0) : alpha_(alpha), h_base_(h_base), warmup_(warmup) {
    require(std::isfinite(alpha) && alpha >= 0, "commpact::QSRPolicy: alpha = ", alpha,
            " must be a finite number >= 0 (the period is max(h_base, floor((alpha / lr)^2))); the paper's "
            "ViT-B setting uses alpha = 0.0175, and alpha = 0 gives LocalSgd{h_base}.");
    require(h_base >= 1, "commpact::QSRPolicy: h_base = ", h_base,
            " must be at least 1 (the shortest period, in steps); the paper's ViT-B setting uses h_base = 4.");
    require(warmup >= 0, "commpact::QSRPolicy: warmup = ", warmup,
            " must be >= 0 (the number of learning-rate warm-up steps, during which the period is h_base); pass 0 "
            "for a schedule without warm-up.");
  }

  //! Takes the warm-up from the learning-rate schedule, so that the two agree by
  //! construction: QSRPolicy{alpha, h_base, lr}.
  template <lr_has_warmup Lr>
  QSRPolicy(double alpha, std::int64_t h_base, const Lr& schedule)
      : QSRPolicy(alpha, h_base, static_cast<std::int64_t>(schedule.warmup())) {}
  //! A schedule without warmup() (ConstantLr, ...): one sentence instead of a failed
  //! overload resolution.
  template <class Lr>
    requires(!lr_has_warmup<Lr> && !std::is_arithmetic_v<Lr>)
  QSRPolicy(double, std::int64_t, const Lr&) {
    static_assert(lr_has_warmup<Lr>,
                  "commpact::QSRPolicy{alpha, h_base, schedule}: this schedule has no warmup(), so QSRPolicy cannot "
                  "take its warm-up from it; pass the number of warm-up steps instead: QSRPolicy{alpha, h_base, 0} "
                  "for none (docs/sync.md lists the schedules with warmup()).");
  }

  sync_plan plan(std::int64_t step, double lr) const {
    detail::check_step("commpact::QSRPolicy::plan", step);
    require(std::isfinite(lr) && lr >= 0, "commpact::QSRPolicy::plan: the learning rate at step ", step, " is ", lr,
            "; the rule H = max(h_base, floor((alpha / lr)^2)) needs a finite lr >= 0 (at 0 the period runs to the "
            "end of the run). Pass the schedule's learning rate at that step.");
    return {sync_plan::mode::parameters, step < warmup_ ? h_base_ : period_for(lr)};
  }

  //! max(h_base, floor((alpha / lr)^2)), saturated to INT64_MAX (also at lr = 0 when
  //! alpha > 0); lr >= 0.
  std::int64_t period_for(double lr) const {
    if (alpha_ == 0) return h_base_;
    if (lr == 0) return std::numeric_limits<std::int64_t>::max();
    const double q = alpha_ / lr;
    const double q2 = q * q;  // +inf when q is huge: caught by the comparison below
    constexpr double limit = 9223372036854775808.0;  // 2^63, exactly representable
    if (!(q2 < limit)) return std::numeric_limits<std::int64_t>::max();
    const auto h = static_cast<std::int64_t>(std::floor(q2));
    return h > h_base_ ? h : h_base_;
  }

  //! Raises when the warm-up is longer than the run.
  void check_run(std::int64_t total_steps) const {
    detail::check_run_length("commpact::QSRPolicy::check_run", total_steps);
    require(warmup_ <= total_steps, "commpact::QSRPolicy: warmup = ", warmup_, " steps is longer than the run (",
            total_steps, " steps); the warm-up must end within the run. Pass the warm-up of the learning-rate "
            "schedule, or lengthen the run.");
  }

  //! Raises when the schedule's warm-up differs from this policy's: QSR keeps h_base
  //! during the learning-rate warm-up, and a period decided at a warm-up learning rate
  //! (tiny, so (alpha / lr)^2 is huge) would run far past it.
  template <class Lr>
  void check_schedule(const Lr& schedule) const {
    if constexpr (lr_has_warmup<Lr>) {
      const auto w = static_cast<std::int64_t>(schedule.warmup());
      require(w == warmup_, "commpact::QSRPolicy: warmup = ", warmup_,
              " steps, but the learning-rate schedule warms up over ", w,
              " steps; QSR keeps the period at h_base during the learning-rate warm-up. Build the policy from the "
              "schedule, QSRPolicy{alpha, h_base, lr}, or pass warmup = ",
              w, ".");
    }
  }

  double alpha() const { return alpha_; }
  std::int64_t h_base() const { return h_base_; }
  std::int64_t warmup() const { return warmup_; }

 private:
  double alpha_;
  std::int64_t h_base_;
  std::int64_t warmup_;
};

//! Post-local SGD (Lin, Stich, Patel, Jaggi; ICLR 2020): EveryStep for steps
//! [0, switch_step), then LocalSgd{H}. The first local period starts at switch_step.
class PostLocal {
 public:
  PostLocal(std::int64_t switch_step, std::int64_t H) : switch_(switch_step), h_(H) {
    require(switch_step >= 0, "commpact::PostLocal: switch_step = ", switch_step,
            " must be >= 0 (the first step of Local SGD); use 0 to run Local SGD from the start.");
    require(H >= 1, "commpact::PostLocal: the period H = ", H,
            " must be at least 1 (H local steps between averaging rounds after the switch).");
  }

  sync_plan plan(std::int64_t step, double /*lr*/) const {
    detail::check_step("commpact::PostLocal::plan", step);
    if (step < switch_) return {sync_plan::mode::gradients, 1};
    return {sync_plan::mode::parameters, h_};
  }

  //! Raises when the switch lies beyond the run (the run would never leave BSP).
  void check_run(std::int64_t total_steps) const {
    detail::check_run_length("commpact::PostLocal::check_run", total_steps);
    require(switch_ <= total_steps, "commpact::PostLocal: switch_step = ", switch_, " lies beyond the run (",
            total_steps, " steps), so the run would never switch to Local SGD; use EveryStep for that, or a switch "
            "step within the run.");
  }

  std::int64_t switch_step() const { return switch_; }
  std::int64_t period() const { return h_; }

 private:
  std::int64_t switch_, h_;
};

static_assert(SyncPolicy<EveryStep> && SyncPolicy<LocalSgd> && SyncPolicy<QSRPolicy> && SyncPolicy<PostLocal>);

}  // namespace commpact
