// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cost_fit.hpp
//! Fitting the host-aware link of cost_model.hpp to measured communication times:
//!
//!   t = alpha L + beta max(0, B - bursts burst) + host_beta B + sched L max(0, rho - 1)
//!
//! (L latency rounds, B path bytes, rho ranks per core; the burst is the emulated link's
//! token bucket, known from its configuration, not fitted). fit_host_link() is a
//! non-negative least-squares fit of the four coefficients: every subset of them is solved
//! by the normal equations and the best subset whose coefficients are all >= 0 wins (four
//! coefficients: 15 subsets), so a term the data cannot see is 0, never negative.
//!
//! \code
//! std::vector<commpact::cost::comm_sample> s = {{commpact::cost::gtopk(8, n, k), 8.8e-3, 4.0} /* , ... */};
//! const auto l = commpact::cost::fit_host_link(s, 262144);   // tc tbf burst 256 KiB
//! double t = commpact::cost::comm_time(commpact::cost::topk(8, n, k), l, 4.0);
//! \endcode

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <span>
#include <utility>

#include "cost_model.hpp"

namespace commpact::cost {

namespace detail {
//! The four regressors of fit_host_link for one sample.
inline std::array<double, 4> host_terms(const comm_sample& x, double burst) {
  const auto& c = x.cost;
  return {c.latency_rounds, rate_bytes(c, burst), c.path_bytes,
          c.latency_rounds * std::max(0.0, x.ranks_per_core - 1)};
}
}  // namespace detail

//! alpha, beta, host_beta and sched (all >= 0) minimising the sum of squared errors
//! relative to max(t, floor_seconds) over the samples, for a link whose token bucket holds
//! `burst` bytes (0: a plain link; then beta and host_beta both multiply the path's bytes
//! and only one of them is fitted, the other is 0).
inline link fit_host_link(std::span<const comm_sample> s, double burst, double floor_seconds = 0) {
  require(!s.empty(), "commpact::cost::fit_host_link: no samples; pass measured runs.");
  require(burst >= 0 && floor_seconds >= 0, "commpact::cost::fit_host_link: burst = ", burst,
          " and floor_seconds = ", floor_seconds, " must be >= 0.");
  constexpr int K = 4;
  // Normal equations of the relative residuals, columns scaled to unit norm for conditioning.
  std::array<std::array<double, K>, K> A{};
  std::array<double, K> b{}, norm{};
  for (const auto& x : s) {
    require(x.seconds > 0, "commpact::cost::fit_host_link: a measured time is ", x.seconds,
            " s; times must be > 0.");
    require(x.ranks_per_core > 0, "commpact::cost::fit_host_link: ranks_per_core = ", x.ranks_per_core,
            " must be > 0.");
    const double d = std::max(x.seconds, floor_seconds);
    const auto f = detail::host_terms(x, burst);
    for (int i = 0; i < K; ++i) {
      norm[i] += f[i] * f[i] / (d * d);
      b[i] += f[i] * x.seconds / (d * d);
      for (int j = 0; j < K; ++j) A[i][j] += f[i] * f[j] / (d * d);
    }
  }
  for (auto& v : norm) v = std::sqrt(v);
  double best_res = INFINITY;
  std::array<double, K> best{};
  for (unsigned mask = 1; mask < (1u << K); ++mask) {
    std::array<int, K> idx{};
    int m = 0;
    for (int i = 0; i < K; ++i)
      if ((mask >> i & 1u) && norm[i] > 0) idx[m++] = i;
    if (m == 0 || m != std::popcount(mask)) continue;
    // Gaussian elimination with partial pivoting on the m x m system (scaled columns).
    std::array<std::array<double, K + 1>, K> M{};
    for (int r = 0; r < m; ++r) {
      for (int c = 0; c < m; ++c) M[r][c] = A[idx[r]][idx[c]] / (norm[idx[r]] * norm[idx[c]]);
      M[r][m] = b[idx[r]] / norm[idx[r]];
    }
    bool singular = false;
    for (int c = 0; c < m && !singular; ++c) {
      int p = c;
      for (int r = c + 1; r < m; ++r)
        if (std::abs(M[r][c]) > std::abs(M[p][c])) p = r;
      std::swap(M[c], M[p]);
      if (std::abs(M[c][c]) < 1e-10) singular = true;
      for (int r = 0; r < m && !singular; ++r)
        if (r != c) {
          const double f = M[r][c] / M[c][c];
          for (int k = c; k <= m; ++k) M[r][k] -= f * M[c][k];
        }
    }
    if (singular) continue;
    std::array<double, K> coef{};
    bool negative = false;
    for (int r = 0; r < m; ++r) {
      coef[idx[r]] = M[r][m] / M[r][r] / norm[idx[r]];
      negative |= coef[idx[r]] < 0;
    }
    if (negative) continue;
    double res = 0;
    for (const auto& x : s) {
      const double d = std::max(x.seconds, floor_seconds);
      const auto f = detail::host_terms(x, burst);
      double t = 0;
      for (int i = 0; i < K; ++i) t += coef[i] * f[i];
      res += (t - x.seconds) * (t - x.seconds) / (d * d);
    }
    if (res < best_res) best_res = res, best = coef;
  }
  require(best_res < INFINITY, "commpact::cost::fit_host_link: no sample has latency rounds or path bytes; "
          "pass the step costs of the measured runs.");
  return {.alpha = best[0], .beta = best[1], .host_beta = best[2], .burst = burst, .sched = best[3]};
}

}  // namespace commpact::cost
