// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sparse_options.hpp
//! Options of the top-k family (TopK, gTopK, topk_codec): density or k, a density
//! warm-up schedule, DGC momentum correction, local gradient clipping and the
//! non-finite policy; and the helpers that turn them into k for a step.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../error.hpp"
#include "../../kernels/clip.hpp"
#include "../../kernels/formulas/density.hpp"
#include "../../nonfinite.hpp"

namespace commpact {

//! Options of TopK and gTopK (topk_codec reads density, k and density_warmup).
struct sparse_options {
  //! Fraction of the entries each rank selects, in (0, 1]: k = clamp(floor(density * n), 1, n)
  //! (detail::k_of_density, GRACE's rule).
  double density = 0.001;
  //! An explicit k (1 <= k <= n) instead of the density; not combined with a warm-up.
  std::optional<std::size_t> k{};
  //! Density warm-up: (step, density) pairs, steps strictly increasing; from step s on
  //! the density of the last pair with step <= s applies, before the first pair
  //! `density`. E.g. {{0, 0.25}, {100, 0.0625}, {200, 0.015625}, {300, 0.004}, {400, 0.001}}.
  std::vector<std::pair<std::int64_t, double>> density_warmup{};
  //! DGC momentum correction: u = momentum * u + g, v = v + u; v is sparsified and the
  //! delivered entries of u and v are zeroed. 0 (the default) turns it off; in [0, 1).
  float momentum = 0.0f;
  //! DGC local gradient clipping: before accumulation, g is scaled so that
  //! ||g||_2 <= clip_norm / sqrt(P). 0 (the default) turns it off.
  float clip_norm = 0.0f;
  //! NaN or Inf in a gradient: raise numeric_error on every rank (default) or skip the
  //! step on every rank (gradient zeroed, state untouched).
  nonfinite on_nonfinite = nonfinite::raise;
};

namespace detail {

inline bool density_ok(double d) { return d > 0.0 && d <= 1.0; }  // false for NaN

//! Checks options that do not depend on the gradient; throws invalid_argument.
inline void validate_sparse_options(const sparse_options& o, const char* who) {
  if (o.k) {
    require(*o.k >= 1, "commpact::", who, ": k = 0 selects nothing; pass k >= 1 or leave k unset and give a density.");
    require(o.density_warmup.empty(), "commpact::", who,
            ": an explicit k and a density warm-up were both given; give either k or densities.");
  } else {
    require(density_ok(o.density), "commpact::", who, ": density = ", o.density,
            " is outside (0, 1]; pass the fraction of entries to keep, e.g. 0.001.");
  }
  for (std::size_t i = 0; i < o.density_warmup.size(); ++i) {
    const auto& [s, d] = o.density_warmup[i];
    require(density_ok(d), "commpact::", who, ": warm-up density ", d, " at step ", s,
            " is outside (0, 1]; every density must be a fraction in (0, 1].");
    require(s >= 0 && (i == 0 || s > o.density_warmup[i - 1].first), "commpact::", who, ": warm-up step ", s,
            " at position ", i, " is negative or not after the previous step; list (step, density) pairs with "
            "strictly increasing steps >= 0.");
  }
  require(o.momentum >= 0.0f && o.momentum < 1.0f, "commpact::", who, ": momentum = ", o.momentum,
          " is outside [0, 1); use 0 to turn momentum correction off.");
  require(o.clip_norm >= 0.0f && std::isfinite(o.clip_norm), "commpact::", who, ": clip_norm = ", o.clip_norm,
          " must be finite and >= 0; use 0 to turn clipping off.");
  require_nonfinite_policy(o.on_nonfinite, who);
}

//! The density in force at `step`.
inline double density_at(const sparse_options& o, std::int64_t step) {
  double d = o.density;
  for (const auto& [s, dd] : o.density_warmup)
    if (s <= step) d = dd;
  return d;
}

//! k at `step` for a gradient of length n (may be 0 or above n for an explicit k; the
//! caller reports that).
inline std::int64_t k_at(const sparse_options& o, std::int64_t step, std::int64_t n) {
  if (o.k) return static_cast<std::int64_t>(*o.k);
  return k_of_density(density_at(o, step), n);
}

//! The largest k any step can use for length n (workspaces are sized for it once).
inline std::int64_t k_max(const sparse_options& o, std::int64_t n) {
  if (o.k) return std::min<std::int64_t>(static_cast<std::int64_t>(*o.k), n);
  std::int64_t k = k_of_density(o.density, n);
  for (const auto& [s, d] : o.density_warmup) k = std::max(k, k_of_density(d, n));
  return k;
}

//! Problems with this rank's gradient that make a sparse step impossible (empty: none).
inline std::string sparse_problem(const char* who, std::int64_t n, std::int64_t k) {
  if (n <= 0)
    return cat("commpact::", who, "::reduce: the gradient is empty; pass a gradient with at least one entry.");
  if (n > std::numeric_limits<std::int32_t>::max())
    return cat("commpact::", who, "::reduce: the gradient has n = ", n,
               " entries; sparse indices are int32, so n must be below 2^31: split the gradient into buckets.");
  if (k < 1 || k > n)
    return cat("commpact::", who, "::reduce: k = ", k, " is outside [1, n = ", n,
               "]; pass k <= the gradient length, or a density in (0, 1].");
  return {};
}

//! The length-change problem of a compressor whose residual holds `state_n` values.
inline std::string length_problem(const char* who, std::int64_t n, std::int64_t state_n) {
  if (state_n > 0 && state_n != n)
    return cat("commpact::", who, "::reduce: the gradient length changed from ", state_n, " to ", n,
               " between steps; the residual is kept per index. Keep the length fixed, or call reset() on every rank.");
  return {};
}

//! The clipping scale of DGC's local gradient clipping, or nullopt when no scaling
//! applies (off, within the bound, or a non-finite norm that the finiteness check reports).
inline std::optional<float> clip_scale(std::span<const float> g, float clip_norm, int P) {
  if (clip_norm <= 0.0f) return std::nullopt;
  const double norm = std::sqrt(clip::host_sumsq(g));  // kernels/clip.hpp: the device's order
  const double bound = static_cast<double>(clip_norm) / std::sqrt(static_cast<double>(P));
  if (!std::isfinite(norm) || norm <= bound) return std::nullopt;
  return static_cast<float>(bound / norm);
}

}  // namespace detail
}  // namespace commpact
