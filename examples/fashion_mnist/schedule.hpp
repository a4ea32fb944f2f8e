#pragma once
// The examples' learning-rate schedule (the MLP demo and the LibTorch CNN): a linear
// warm-up over the first 5% of steps (at least one; a run of one step has none, since
// WarmupCosineLr needs total > warmup), then cosine decay to 1% of the peak (QSR needs
// lr > 0 at every step).
#include <commpact/sync/lr_schedule.hpp>

#include <algorithm>
#include <cstdint>

namespace demo {

inline std::int64_t warmup_steps(std::int64_t total) { return total > 1 ? std::max<std::int64_t>(1, total / 20) : 0; }

inline commpact::WarmupCosineLr lr_schedule(double peak, std::int64_t total) {
  return {peak, warmup_steps(total), total, 0.01 * peak};
}

}  // namespace demo
