// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sparsifiers.hpp
//! Threshold sparsifiers (the `Codec` concept): they pick the entries to send by a
//! threshold instead of an exact top-k, which is cheaper to find (one or a few passes).
//! Each default follows the reference a user compares against (docs/compressors.md has
//! the table with the measured differences); k = detail::k_of_density(density, n) =
//! clamp(floor(density n), 1, n), GRACE's rule.
//!
//! | codec | reference | threshold t, passing entries | cap (the most sent) |
//! |---|---|---|---|
//! | `threshold_codec{lambda, max_density = 1}` | hard threshold (Strom 2015; GRACE's `threshold`) | lambda, |v_i| >= t | k_of_density(max_density, n): n by default (no cap, as GRACE) |
//! | `gaussiank_codec{density, rounds = 3, cap_factor = 4/3}` | Gaussian-k (Shi et al. 2019; hclhkbu/GaussianK-SGD) | mean + sd z (sd with n - 1), 2 (1 - Phi(z)) = density; counted (|v_i| > t) at most `rounds` times, t *= 0.5 after a count below 2k/3, t *= 1.5 after one above 4k/3, the last count's entries sent | floor(cap_factor k) |
//! | `dgc_codec{density, sample, seed, lower = 0.8, iters = 10}` | DGC (Lin et al. 2018; synxlin/deep-gradient-compression) | the ceil(density m)-th largest of m = max(ceil(sample n), ceil(2/density)) |v_i| drawn with replacement (random_stream{seed, step, rank}; every entry once when m >= n), |v_i| >= t; t *= lower while fewer than lower k pass, at most `iters` times | k |
//!
//! When more entries pass than the cap, the cap's largest |v| are sent (ties: smaller
//! index; host::topk_abs's order). Message: c int32 indices (strictly ascending), then
//! c float32 values, c <= cap: 8c bytes, the format of topk_codec. max_encoded_bytes is
//! 8 cap, which is what an Allgather block carries (so an uncapped threshold_codec's
//! block is 8n bytes: pass max_density to bound it). Indices are int32, so n < 2^31.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../../error.hpp"
#include "../../kernels/exact.hpp"
#include "../../kernels/fixed_sum.hpp"
#include "../../kernels/formulas/thresholds.hpp"
#include "../../kernels/host/topk.hpp"
#include "../../config.hpp"
#include "../../kernels/formulas/bits.hpp"
#include "sparse_options.hpp"
#include "topk_sign.hpp"

namespace commpact {

namespace detail {

//! z with 2 (1 - Phi(z)) = q (two-sided normal tail), by bisection, for q in (0, 1].
inline double normal_two_sided_quantile(double q) {
  double lo = 0.0, hi = 40.0;
  for (int i = 0; i < 200 && hi - lo > 1e-12; ++i) {
    const double mid = 0.5 * (lo + hi);
    (std::erfc(mid / std::sqrt(2.0)) > q ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

//! A topk_workspace that copies as empty (a copied codec takes the options, not the scratch).
struct copyable_workspace {
  host::topk_workspace ws;
  copyable_workspace() = default;
  copyable_workspace(const copyable_workspace&) {}
  copyable_workspace& operator=(const copyable_workspace&) { return *this; }
  copyable_workspace(copyable_workspace&&) noexcept = default;
  copyable_workspace& operator=(copyable_workspace&&) noexcept = default;
};


//! Shared part of the threshold codecs: k and the cap, selection under the cap, the
//! wire format, decode.
class threshold_base {
 public:
  std::size_t max_encoded_bytes(std::size_t n) const { return 8 * capacity(n); }
  std::int64_t agreement(std::size_t n) const { return static_cast<std::int64_t>(capacity(n)); }
  std::string check(std::size_t n) const {
    if (n == 0) return cat("commpact::", who_, ": the gradient is empty; pass at least one entry.");
    if (n >= (std::size_t{1} << 31)) return cat("commpact::", who_, ": n = ", n, " needs indices above int32; split the tensor.");
    return {};
  }
  void begin_step(std::int64_t step) { step_ = step; }
  void bind_rank(int rank) { rank_ = rank; }
  //! k for length n: detail::k_of_density(density, n) (the cap's density for threshold_codec).
  std::size_t k(std::size_t n) const {
    return static_cast<std::size_t>(k_of_density(density_, static_cast<std::int64_t>(n)));
  }
  //! The most entries one message carries for length n: floor(cap_factor k), in [1, n].
  std::size_t capacity(std::size_t n) const {
    if (n == 0) return 0;
    const double c = cap_factor_ * static_cast<double>(k(n));
    return std::clamp<std::size_t>(static_cast<std::size_t>(std::floor(c + 1e-14 * c)), 1, n);  // as k_of_density
  }
  //! The indices the last encode() delivered (ascending).
  std::span<const std::int32_t> delivered() const { return idx_; }
  //! The threshold, the count that passed it (before the cap) and how many times the
  //! first estimate was adjusted, at the last encode().
  float last_threshold() const { return t_; }
  std::size_t last_passed() const { return passed_; }
  int last_adjustments() const { return adjustments_; }

  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    const std::size_t n = acc.size();
    require<wire_error>(msg.size() % 8 == 0, "commpact::", who_, ": a message of ", msg.size(),
                        " bytes is not a whole number of 8-byte entries; it is truncated or corrupt.");
    const std::size_t c = msg.size() / 8;
    require<wire_error>(c <= capacity(n), "commpact::", who_, ": the message holds ", c, " entries, above the cap ",
                        capacity(n), " for n = ", n, "; the sender uses other options or the message is corrupt.");
    std::int64_t prev = -1;
    for (std::size_t i = 0; i < c; ++i) {
      std::int32_t j;
      float v;
      std::memcpy(&j, msg.data() + 4 * i, 4);
      std::memcpy(&v, msg.data() + 4 * (c + i), 4);
      if (!(sparse_index_ok(j, prev, n) && finite_bits(v)))
        throw wire_error(cat("commpact::", who_, ": entry ", i, " has index ", j, " and value ", v,
                             "; indices must be strictly ascending in [0, ", n, ") and values finite."));
      prev = j;
    }
    for (std::size_t i = 0; i < c; ++i) {
      std::int32_t j;
      float v;
      std::memcpy(&j, msg.data() + 4 * i, 4);
      std::memcpy(&v, msg.data() + 4 * (c + i), 4);
      acc[static_cast<std::size_t>(j)] += v;
    }
  }

 protected:
  threshold_base(const char* who, double density, double cap_factor = 1.0)
      : who_(who), density_(density), cap_factor_(cap_factor) {
    require(density > 0.0 && density <= 1.0, "commpact::", who, ": density = ", density,
            " is outside (0, 1]; pass the fraction of entries to send, such as 0.01.");
    require(cap_factor >= 1.0 && cap_factor <= 1e6, "commpact::", who, ": cap_factor = ", cap_factor,
            " is outside [1, 1e6]; the cap is floor(cap_factor k), at least k.");
  }
  //! The number of entries with |v_i| > t (strict) or >= t.
  static std::size_t count_passing(std::span<const float> v, float t, bool strict) {
    std::size_t c = 0;
    if (strict)
      for (float x : v) c += std::abs(x) > t;
    else
      for (float x : v) c += std::abs(x) >= t;
    return c;
  }
  //! Sends the entries of v with |v_i| > t (strict) or >= t, at most capacity(n) of them
  //! (the largest); `adjustments` is recorded for last_adjustments().
  std::size_t select(std::span<const float> v, float t, bool strict, int adjustments, std::span<std::byte> msg,
                     std::span<float> approx) {
    const std::size_t n = v.size(), kmax = capacity(n);
    require(msg.size() >= 8 * kmax, "commpact::", who_, "::encode: the message buffer holds ", msg.size(),
            " bytes; the cap of ", kmax, " entries needs ", 8 * kmax, ".");
    t_ = t;
    adjustments_ = adjustments;
    cand_.clear();
    for (std::size_t i = 0; i < n; ++i)
      if (passes_threshold(v[i], t, strict)) cand_.push_back(static_cast<std::int32_t>(i));
    passed_ = cand_.size();
    if (cand_.size() > kmax) {  // keep the cap's largest, in host::topk_abs's order
      mag_.resize(cand_.size());
      for (std::size_t j = 0; j < cand_.size(); ++j) mag_[j] = v[static_cast<std::size_t>(cand_[j])];
      sel_.resize(kmax), val_.resize(kmax);
      host::topk_abs(std::span<const float>(mag_), kmax, std::span<std::int32_t>(sel_), std::span<float>(val_), ws_.ws);
      idx_.resize(kmax);
      for (std::size_t j = 0; j < kmax; ++j) idx_[j] = cand_[static_cast<std::size_t>(sel_[j])];
    } else {
      idx_.assign(cand_.begin(), cand_.end());
    }
    const std::size_t c = idx_.size();
    for (std::size_t j = 0; j < c; ++j) {
      const float x = v[static_cast<std::size_t>(idx_[j])];
      std::memcpy(msg.data() + 4 * j, &idx_[j], 4);
      std::memcpy(msg.data() + 4 * (c + j), &x, 4);
    }
    if (!approx.empty()) {
      std::fill(approx.begin(), approx.end(), 0.0f);
      for (auto i : idx_) approx[static_cast<std::size_t>(i)] = v[static_cast<std::size_t>(i)];
    }
    return 8 * c;
  }

  const char* who_;
  double density_;
  double cap_factor_;
  std::int64_t step_ = 0;
  int rank_ = 0;

 private:
  float t_ = 0.0f;
  std::size_t passed_ = 0;
  int adjustments_ = 0;
  std::vector<std::int32_t> cand_, sel_, idx_;
  std::vector<float> mag_, val_;
  copyable_workspace ws_;
};
}  // namespace detail

//! Hard threshold: every entry with |v_i| >= lambda (GRACE's `threshold`); with
//! max_density < 1, at most k_of_density(max_density, n) of them, the largest.
class threshold_codec : public detail::threshold_base {
 public:
  explicit threshold_codec(float lambda, double max_density = 1.0)
      : threshold_base("threshold_codec", max_density), lambda_(lambda) {
    require(std::isfinite(lambda) && lambda > 0.0f, "commpact::threshold_codec: lambda = ", lambda,
            " must be finite and > 0.");
  }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
    return select(v, lambda_, false, 0, msg, approx);
  }
  //! The threshold lambda.
  float lambda() const { return lambda_; }

 private:
  float lambda_;
};

//! Gaussian-k (Shi et al.'s rule, see the file comment): the threshold of a normal fit,
//! moved towards [2k/3, 4k/3] passing entries, counted at most `rounds` times.
class gaussiank_codec : public detail::threshold_base {
 public:
  explicit gaussiank_codec(double density = 0.01, int rounds = 3, double cap_factor = 4.0 / 3.0)
      : threshold_base("gaussiank_codec", density, cap_factor), rounds_(rounds) {
    require(rounds >= 1 && rounds <= 64, "commpact::gaussiank_codec: rounds = ", rounds,
            " is outside [1, 64]; it counts the passes over the gradient (the authors' code: 3).");
  }
  //! The first estimate for v: mean + sd z, sd with n - 1 (0 for n = 1), 2 (1 - Phi(z)) =
  //! density. One pass in double: sd^2 = (sum x^2 - n mean^2) / (n - 1), at least 0; the
  //! sums in kernels/fixed_sum.hpp's shape (the device's order).
  double estimate(std::span<const float> v) const {
    const auto m = fixed_sum::host_sum<fixed_sum::double2_sum>(v.size(), detail::gaussiank_leaf{v.data()},
                                                               fixed_sum::add_double2{});
    return detail::gaussiank_estimate(m.a, m.b, v.size(), z());
  }
  //! z with 2 (1 - Phi(z)) = density.
  double z() const { return detail::normal_two_sided_quantile(density_); }
  //! The most counts of passing entries per encode.
  int rounds() const { return rounds_; }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
    if (v.empty()) return select(v, 0.0f, true, 0, msg, approx);
    const std::size_t k = this->k(v.size());  // the bounds 2k/3 and 4k/3: 3c against 2k and 4k
    double t = estimate(v);
    int adjusted = 0;
    for (int r = 1;; ++r) {
      const std::size_t c = count_passing(v, static_cast<float>(t), true);
      const double f = detail::gaussiank_factor(c, k);
      if (r >= rounds_ || f == 0.0) break;
      t *= f;
      ++adjusted;
    }
    return select(v, static_cast<float>(t), true, adjusted, msg, approx);
  }

 private:
  int rounds_;
};

//! DGC's sampled threshold (the authors' rule, see the file comment): the top
//! ceil(density m) of m sampled |v_i| set t, lowered while too few entries pass.
class dgc_codec : public detail::threshold_base {
 public:
  explicit dgc_codec(double density = 0.01, double sample = 0.01, std::uint64_t seed = 0, double lower = 0.8,
                     int iters = 10)
      : threshold_base("dgc_codec", density), sample_(sample), seed_(seed), lower_(lower), iters_(iters) {
    require(sample > 0.0 && sample <= 1.0, "commpact::dgc_codec: sample = ", sample,
            " is outside (0, 1]; DGC samples 0.1% to 1% of the entries.");
    require(lower > 0.0 && lower < 1.0, "commpact::dgc_codec: lower = ", lower,
            " is outside (0, 1); the authors lower the threshold by 0.8 while fewer than 0.8 k entries pass.");
    require(iters >= 0 && iters <= 64, "commpact::dgc_codec: iters = ", iters,
            " is outside [0, 64]; 0 keeps the sampled threshold (the authors allow 10 lowerings).");
  }
  //! The number of samples for length n: min(n, max(ceil(sample n), ceil(2 / density))).
  std::size_t samples(std::size_t n) const {
    const auto a = static_cast<std::size_t>(std::ceil(sample_ * static_cast<double>(n)));
    const auto b = static_cast<std::size_t>(std::ceil(2.0 / density_));
    return std::min(n, std::max<std::size_t>({1, a, b}));
  }
  //! The rank of the threshold among m sampled |v_i|: clamp(ceil(density m), 1, m).
  std::size_t sample_rank(std::size_t m) const {
    return std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(density_ * static_cast<double>(m))), 1, m);
  }
  //! The samples' random stream at this step and rank.
  random_stream stream() const { return random_stream(seed_, step_, rank_); }
  //! The lowering factor and the most lowerings.
  double lower() const { return lower_; }
  int iters() const { return iters_; }
  //! The threshold is lowered while fewer than floor_count(n) = lower k(n) entries pass.
  double floor_count(std::size_t n) const { return lower_ * static_cast<double>(k(n)); }
  //! The sampled threshold for v at this step and rank (before any lowering); 0 for an empty v.
  float estimate(std::span<const float> v) {
    const std::size_t n = v.size(), m = samples(n);
    if (n == 0) return 0.0f;
    smp_.resize(m);
    if (m == n) {
      for (std::size_t j = 0; j < n; ++j) smp_[j] = std::abs(v[j]);
    } else {
      const random_stream rng = stream();
      for (std::size_t j = 0; j < m; ++j) smp_[j] = std::abs(v[detail::dgc_sample_index(rng.uniform(j), n)]);
    }
    const std::size_t ks = sample_rank(m);
    std::nth_element(smp_.begin(), smp_.begin() + static_cast<std::ptrdiff_t>(ks - 1), smp_.end(), std::greater<>());
    return smp_[ks - 1];
  }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
    if (v.empty()) return select(v, 0.0f, false, 0, msg, approx);
    float t = estimate(v);
    const double floor_count = this->floor_count(v.size());
    const auto lower = static_cast<float>(lower_);
    int i = 0;
    for (; i < iters_; ++i) {
      if (!(static_cast<double>(count_passing(v, t, false)) < floor_count)) break;
      t *= lower;
    }
    return select(v, t, false, i, msg, approx);
  }

 private:
  double sample_;
  std::uint64_t seed_;
  double lower_;
  int iters_;
  std::vector<float> smp_;
};

}  // namespace commpact
