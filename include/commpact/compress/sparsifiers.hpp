// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sparsifiers.hpp
//! Threshold sparsifiers (the `Codec` concept): they pick the entries to send by a
//! threshold instead of an exact top-k, which is cheaper to find (one or a few passes).
//!
//! | codec | paper | threshold t | at most |
//! |---|---|---|---|
//! | `threshold_codec{lambda, max_density}` | hard threshold (Strom, Interspeech 2015) | lambda | round(max_density n) |
//! | `gaussiank_codec{density}` | Gaussian-k, Shi et al., 2019 | |mean| + std z, 2(1 - Phi(z)) = k/n, then up to 3 refinements: t /= 2 while fewer than k/2 pass, t *= 1.5 while more than 2k | k = round(density n) |
//! | `dgc_codec{density, sample, seed}` | DGC, Lin et al., ICLR 2018 | the ceil(density m)-th largest |v| of m = max(1, round(sample n)) entries drawn with replacement (random_stream{seed, step, rank}) | k |
//!
//! Every codec sends the entries with |v_i| >= t; when more pass than the cap, the cap's
//! largest |v| (ties: smaller index; host::topk_abs's order). Message: c int32 indices
//! (strictly ascending), then c float32 values, c <= cap: 8c bytes, the format of
//! topk_codec. max_encoded_bytes is 8 cap, which is what an Allgather block carries.
//! Indices are int32, so n < 2^31.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../kernels/host/topk.hpp"
#include "bits.hpp"

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

//! Shared part of the threshold codecs: selection under a cap, the wire format, decode.
class threshold_base {
 public:
  std::size_t max_encoded_bytes(std::size_t n) const { return 8 * cap(n); }
  std::int64_t agreement(std::size_t n) const { return static_cast<std::int64_t>(cap(n)); }
  std::string check(std::size_t n) const {
    if (n == 0) return cat("commpact::", who_, ": the gradient is empty; pass at least one entry.");
    if (n >= (std::size_t{1} << 31)) return cat("commpact::", who_, ": n = ", n, " needs indices above int32; split the tensor.");
    return {};
  }
  void begin_step(std::int64_t step) { step_ = step; }
  void bind_rank(int rank) { rank_ = rank; }
  //! The indices the last encode() delivered (ascending).
  std::span<const std::int32_t> delivered() const { return idx_; }
  //! The threshold and the count that passed it at the last encode().
  float last_threshold() const { return t_; }
  std::size_t last_passed() const { return passed_; }

  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    const std::size_t n = acc.size();
    require<wire_error>(msg.size() % 8 == 0, "commpact::", who_, ": a message of ", msg.size(),
                        " bytes is not a whole number of 8-byte entries; it is truncated or corrupt.");
    const std::size_t c = msg.size() / 8;
    require<wire_error>(c <= cap(n), "commpact::", who_, ": the message holds ", c, " entries, above the cap ", cap(n),
                        " for n = ", n, "; the sender uses other options or the message is corrupt.");
    std::int64_t prev = -1;
    for (std::size_t i = 0; i < c; ++i) {
      std::int32_t j;
      float v;
      std::memcpy(&j, msg.data() + 4 * i, 4);
      std::memcpy(&v, msg.data() + 4 * (c + i), 4);
      if (!(j > prev && static_cast<std::uint64_t>(j) < n && std::isfinite(v)))
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
  threshold_base(const char* who, double density) : who_(who), density_(density) {
    require(density > 0.0 && density <= 1.0, "commpact::", who, ": density = ", density,
            " is outside (0, 1]; pass the fraction of entries to send, such as 0.01.");
  }
  std::size_t cap(std::size_t n) const {
    return std::clamp<std::size_t>(static_cast<std::size_t>(std::llround(density_ * static_cast<double>(n))), 1, std::max<std::size_t>(n, 1));
  }
  //! Sends the entries of v with |v_i| >= t, at most cap(n) of them (the largest).
  std::size_t select(std::span<const float> v, float t, std::span<std::byte> msg, std::span<float> approx) {
    const std::size_t n = v.size(), kmax = cap(n);
    require(msg.size() >= 8 * kmax, "commpact::", who_, "::encode: the message buffer holds ", msg.size(),
            " bytes; the cap of ", kmax, " entries needs ", 8 * kmax, ".");
    t_ = t;
    cand_.clear();
    for (std::size_t i = 0; i < n; ++i)
      if (std::abs(v[i]) >= t) cand_.push_back(static_cast<std::int32_t>(i));
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
  std::int64_t step_ = 0;
  int rank_ = 0;

 private:
  float t_ = 0.0f;
  std::size_t passed_ = 0;
  std::vector<std::int32_t> cand_, sel_, idx_;
  std::vector<float> mag_, val_;
  copyable_workspace ws_;
};
}  // namespace detail

//! Hard threshold: the entries with |v_i| >= lambda, at most round(max_density n).
class threshold_codec : public detail::threshold_base {
 public:
  explicit threshold_codec(float lambda, double max_density = 0.01) : threshold_base("threshold_codec", max_density), lambda_(lambda) {
    require(std::isfinite(lambda) && lambda > 0.0f, "commpact::threshold_codec: lambda = ", lambda,
            " must be finite and > 0.");
  }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
    return select(v, lambda_, msg, approx);
  }

 private:
  float lambda_;
};

//! Gaussian-k: the threshold of a normal fit, refined at most `rounds` times towards k.
class gaussiank_codec : public detail::threshold_base {
 public:
  explicit gaussiank_codec(double density = 0.01, int rounds = 3) : threshold_base("gaussiank_codec", density), rounds_(rounds) {
    require(rounds >= 0 && rounds <= 64, "commpact::gaussiank_codec: rounds = ", rounds, " is outside [0, 64].");
  }
  //! The first estimate for v: |mean| + std z, 2 (1 - Phi(z)) = k / n.
  float estimate(std::span<const float> v) const {
    const auto n = static_cast<double>(v.size());
    double s = 0.0, ss = 0.0;
    for (float x : v) s += x, ss += static_cast<double>(x) * x;
    const double mean = s / n, sd = std::sqrt(std::max(0.0, ss / n - mean * mean));
    const double q = std::min(1.0, static_cast<double>(cap(v.size())) / n);
    return static_cast<float>(std::abs(mean) + sd * detail::normal_two_sided_quantile(q));
  }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
    const double k = static_cast<double>(cap(v.size()));
    float t = estimate(v);
    for (int r = 0; r < rounds_; ++r) {
      std::size_t c = 0;
      for (float x : v) c += std::abs(x) >= t;
      if (static_cast<double>(c) < 0.5 * k) t *= 0.5f;
      else if (static_cast<double>(c) > 2.0 * k) t *= 1.5f;
      else break;
    }
    return select(v, t, msg, approx);
  }

 private:
  int rounds_;
};

//! DGC's sampled threshold: the top ceil(density m) of m sampled |v_i| set t.
class dgc_codec : public detail::threshold_base {
 public:
  explicit dgc_codec(double density = 0.01, double sample = 0.01, std::uint64_t seed = 0)
      : threshold_base("dgc_codec", density), sample_(sample), seed_(seed) {
    require(sample > 0.0 && sample <= 1.0, "commpact::dgc_codec: sample = ", sample,
            " is outside (0, 1]; DGC samples 0.1% to 1% of the entries.");
  }
  //! The sampled threshold for v at this step and rank.
  float estimate(std::span<const float> v) {
    const std::size_t n = v.size();
    const std::size_t m = std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(sample_ * static_cast<double>(n))));
    const random_stream rng(seed_, step_, rank_);
    smp_.resize(m);
    for (std::size_t j = 0; j < m; ++j)
      smp_[j] = std::abs(v[std::min(n - 1, static_cast<std::size_t>(rng.uniform(j) * static_cast<double>(n)))]);
    const auto ks = std::min(m, static_cast<std::size_t>(std::ceil(density_ * static_cast<double>(m))));
    std::nth_element(smp_.begin(), smp_.begin() + static_cast<std::ptrdiff_t>(ks - 1), smp_.end(), std::greater<>());
    return smp_[ks - 1];
  }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
    return select(v, estimate(v), msg, approx);
  }

 private:
  double sample_;
  std::uint64_t seed_;
  std::vector<float> smp_;
};

}  // namespace commpact
