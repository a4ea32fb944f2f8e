// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file lr_schedule.hpp
//! Learning-rate schedules that users pair with QSRPolicy: small value types with
//! `double operator()(std::int64_t step) const`, parameters validated at construction.
//!
//! | schedule | lr(step) |
//! |---|---|
//! | `ConstantLr{lr}` | lr |
//! | `WarmupCosineLr{peak, warmup, total, final = 0}` | peak (step + 1) / warmup for step < warmup, then final + (peak - final) (1 + cos(pi (step - warmup) / (total - warmup))) / 2 |
//! | `WarmupLinearLr{peak, warmup, total, final = 0}` | the same warm-up, then peak + (final - peak) (step - warmup) / (total - warmup) |
//! | `StepDecayLr{base, gamma, every, warmup = 0}` | the same warm-up to base, then base gamma^floor((step - warmup) / every) |
//!
//! The warm-up starts at peak / warmup, not at 0, so that every step of a run has a
//! positive learning rate (QSRPolicy divides by it). The decays reach `final` at step
//! `total`, one past the last step of a run of `total` steps; steps at or beyond `total`
//! return `final`. Negative steps are errors.
//!
//! The schedules with a warm-up expose it as `warmup()` (the concept lr_has_warmup), so
//! that QSRPolicy can take its warm-up from the schedule, and plan_run can reject a
//! policy whose warm-up disagrees with the schedule's.
//!
//! \code
//! commpact::WarmupCosineLr lr{0.1, 500, 10000};     // peak 0.1, 5% warm-up, 10000 steps
//! double a = lr(0), b = lr(500), c = lr(9999);       // 0.0002, 0.1, 2.7e-9
//! \endcode

#include <cmath>
#include <concepts>
#include <cstdint>
#include <numbers>

#include "../error.hpp"

namespace commpact {

//! A learning-rate schedule that knows its warm-up length in steps (`warmup()`).
template <class Lr>
concept lr_has_warmup = requires(const Lr& lr) {
  { lr.warmup() } -> std::convertible_to<std::int64_t>;
};

namespace detail {
inline void check_lr_value(const char* who, const char* name, double v, bool allow_zero) {
  require(std::isfinite(v) && (allow_zero ? v >= 0 : v > 0), who, ": ", name, " = ", v, " must be a finite number ",
          allow_zero ? ">= 0" : "> 0", " (a learning rate).");
}
inline void check_schedule_step(const char* who, std::int64_t step) {
  require(step >= 0, who, ": step ", step, " is negative; steps count from 0.");
}
//! The parameters of a warm-up to `peak` followed by a decay to `final` at step `total`.
inline void check_warmup_decay(const char* who, double peak, double final, std::int64_t warmup, std::int64_t total) {
  check_lr_value(who, "peak", peak, false);
  check_lr_value(who, "final", final, true);
  require(final <= peak, who, ": final = ", final, " exceeds peak = ", peak,
          "; a decay ends at or below its peak. Swap them, or use ConstantLr.");
  require(warmup >= 0, who, ": warmup = ", warmup, " must be >= 0 steps; pass 0 for no warm-up.");
  require(total > warmup, who, ": total = ", total, " steps must exceed warmup = ", warmup,
          " (the decay runs over steps [warmup, total)); shorten the warm-up or lengthen the run.");
}
//! Linear warm-up: peak (step + 1) / warmup.
inline double warmup_lr(double peak, std::int64_t step, std::int64_t warmup) {
  return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
}
}  // namespace detail

//! A constant learning rate.
class ConstantLr {
 public:
  explicit ConstantLr(double lr) : lr_(lr) { detail::check_lr_value("commpact::ConstantLr", "lr", lr, false); }
  double operator()(std::int64_t step) const {
    detail::check_schedule_step("commpact::ConstantLr", step);
    return lr_;
  }

 private:
  double lr_;
};

namespace detail {
//! Linear warm-up to `peak` over `warmup` steps, then `Decay::at(peak, final, t)` with
//! t = (step - warmup) / (total - warmup) in [0, 1), then `final` from step `total` on.
template <class Decay>
class warmup_decay_lr {
 public:
  warmup_decay_lr(double peak, std::int64_t warmup, std::int64_t total, double final = 0.0)
      : peak_(peak), final_(final), warmup_(warmup), total_(total) {
    check_warmup_decay(Decay::name, peak, final, warmup, total);
  }
  double operator()(std::int64_t step) const {
    check_schedule_step(Decay::name, step);
    if (step < warmup_) return warmup_lr(peak_, step, warmup_);
    if (step >= total_) return final_;
    const double t = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
    return Decay::at(peak_, final_, t);
  }
  double peak() const { return peak_; }
  std::int64_t warmup() const { return warmup_; }
  std::int64_t total() const { return total_; }

 private:
  double peak_, final_;
  std::int64_t warmup_, total_;
};
struct cosine_decay {
  static constexpr const char* name = "commpact::WarmupCosineLr";
  static double at(double peak, double final, double t) {
    return final + 0.5 * (peak - final) * (1.0 + std::cos(std::numbers::pi * t));
  }
};
struct linear_decay {
  static constexpr const char* name = "commpact::WarmupLinearLr";
  static double at(double peak, double final, double t) { return peak + (final - peak) * t; }
};
}  // namespace detail

//! Linear warm-up to `peak` over `warmup` steps, then cosine decay to `final` at step
//! `total`: WarmupCosineLr{peak, warmup, total, final = 0}.
using WarmupCosineLr = detail::warmup_decay_lr<detail::cosine_decay>;
//! Linear warm-up to `peak` over `warmup` steps, then linear decay to `final` at step
//! `total`: WarmupLinearLr{peak, warmup, total, final = 0}.
using WarmupLinearLr = detail::warmup_decay_lr<detail::linear_decay>;

//! Linear warm-up to `base` over `warmup` steps, then base * gamma^k where k counts the
//! completed blocks of `every` steps since the warm-up.
class StepDecayLr {
 public:
  StepDecayLr(double base, double gamma, std::int64_t every, std::int64_t warmup = 0)
      : base_(base), gamma_(gamma), every_(every), warmup_(warmup) {
    const char* who = "commpact::StepDecayLr";
    detail::check_lr_value(who, "base", base, false);
    require(std::isfinite(gamma) && gamma > 0 && gamma <= 1, who, ": gamma = ", gamma,
            " must lie in (0, 1] (the factor applied every `every` steps); 0.1 is the common choice.");
    require(every >= 1, who, ": every = ", every, " must be at least 1 step between decays.");
    require(warmup >= 0, who, ": warmup = ", warmup, " must be >= 0 steps; pass 0 for no warm-up.");
  }
  double operator()(std::int64_t step) const {
    detail::check_schedule_step("commpact::StepDecayLr", step);
    if (step < warmup_) return detail::warmup_lr(base_, step, warmup_);
    const auto k = (step - warmup_) / every_;
    return base_ * std::pow(gamma_, static_cast<double>(k));
  }
  double base() const { return base_; }
  std::int64_t warmup() const { return warmup_; }

 private:
  double base_, gamma_;
  std::int64_t every_, warmup_;
};

static_assert(lr_has_warmup<WarmupCosineLr> && lr_has_warmup<WarmupLinearLr> && lr_has_warmup<StepDecayLr>);

}  // namespace commpact
