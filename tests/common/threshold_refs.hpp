#pragma once
// Brute-force references of the threshold sparsifiers' rules, written from the
// reference implementations (read, not copied) rather than from commpact's code:
//  - k: GRACE's max(1, int(n * ratio)) (plain floor), for densities where n * ratio is
//    not within rounding of an integer (test_compress_reference_defaults.cpp checks the
//    near-integer cases exactly with integer arithmetic);
//  - Gaussian-k: hclhkbu/GaussianK-SGD compression.py, GaussianCompressor: threshold
//    mean + std * z (torch.std: n - 1), 2 (1 - Phi(z)) = ratio; a loop of at most 3
//    counts of |v| > t that halves t below 2k/3 and multiplies it by 1.5 above 4k/3; the
//    entries of the last count are sent (commpact caps them at floor(4k/3), the largest);
//  - DGC: synxlin/deep-gradient-compression dgc/compression.py, _sparsify: the top
//    ceil(ratio m) of m sampled |v| give t; up to 10 times, t *= 0.8 while fewer than 0.8k
//    pass (|v| >= t); at most k sent (commpact: the largest k whenever more pass).
// The selection under a cap: stable sort by |v| descending, so ties go to the smaller index.
#include <commpact/kernels/formulas/bits.hpp>
#include <commpact/compress/codecs/sparsifiers.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace commpact_test::refs {

using vec = std::vector<float>;

//! GRACE's k: max(1, int(n * ratio)), at most n.
inline std::size_t k_ref(double density, std::size_t n) {
  const auto k = static_cast<std::size_t>(density * static_cast<double>(n));
  return std::clamp<std::size_t>(k, 1, n);
}

//! The entries with |v_i| > t (strict) or >= t, at most cap of them: the largest |v|
//! (ties: smaller index). Returns the dense vector of what is sent.
inline vec select_ref(const vec& v, float t, bool strict, std::size_t cap) {
  std::vector<std::size_t> pass;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (strict ? std::abs(v[i]) > t : std::abs(v[i]) >= t) pass.push_back(i);
  std::stable_sort(pass.begin(), pass.end(), [&](auto a, auto b) { return std::abs(v[a]) > std::abs(v[b]); });
  if (pass.size() > cap) pass.resize(cap);
  vec q(v.size(), 0.0f);
  for (auto i : pass) q[i] = v[i];
  return q;
}

inline std::size_t count_ref(const vec& v, float t, bool strict) {
  return static_cast<std::size_t>(
      std::count_if(v.begin(), v.end(), [&](float x) { return strict ? std::abs(x) > t : std::abs(x) >= t; }));
}

struct ref_result {
  float t = 0;         // the threshold of the sent set
  std::size_t passed;  // entries that pass it (before the cap)
  vec sent;            // dense
};

//! Gaussian-k by the authors' loop (see the file comment), with commpact's cap.
inline ref_result gaussian_ref(const vec& v, double density, int loops_max = 3, std::size_t cap = 0) {
  const std::size_t n = v.size(), k = k_ref(density, n);
  if (cap == 0) cap = std::min(n, std::max<std::size_t>(1, 4 * k / 3));
  double s = 0, ss = 0;  // torch.std (n - 1), in one pass: (sum x^2 - n mean^2) / (n - 1)
  for (float x : v) s += x, ss += double(x) * x;
  const double mean = s / double(n);
  const double sd = n > 1 ? std::sqrt(std::max(0.0, (ss - s * mean) / double(n - 1))) : 0.0;
  const double z = commpact::detail::normal_two_sided_quantile(density);  // checked by the caller
  double right = mean + sd * z;
  double counted_at = right;
  for (int loops = 0; loops < loops_max; ++loops) {  // while loops < 3
    counted_at = right;
    const double c = double(count_ref(v, float(right), true));
    if (c < 2.0 * double(k) / 3.0) right *= 0.5;
    else if (c > 4.0 * double(k) / 3.0) right *= 1.5;
    else break;
  }
  const float t = float(counted_at);
  return {t, count_ref(v, t, true), select_ref(v, t, true, cap)};
}

//! commpact's Gaussian-k before this change (d0cb695), for the measured difference:
//! |mean| + sd z (sd with n), 2 (1 - Phi(z)) = k/n with k = round(density n), then at
//! most 3 times: t /= 2 below k/2, t *= 1.5 above 2k; >= t; at most k (the largest).
inline ref_result gaussian_old(const vec& v, double density) {
  const std::size_t n = v.size();
  const std::size_t k = std::clamp<std::size_t>(std::size_t(std::llround(density * double(n))), 1, n);
  double s = 0, ss = 0;
  for (float x : v) s += x, ss += double(x) * x;
  const double mean = s / double(n), sd = std::sqrt(std::max(0.0, ss / double(n) - mean * mean));
  float t = float(std::abs(mean) + sd * commpact::detail::normal_two_sided_quantile(std::min(1.0, double(k) / double(n))));
  for (int r = 0; r < 3; ++r) {
    const double c = double(count_ref(v, t, false));
    if (c < 0.5 * double(k)) t *= 0.5f;
    else if (c > 2.0 * double(k)) t *= 1.5f;
    else break;
  }
  return {t, count_ref(v, t, false), select_ref(v, t, false, k)};
}

//! The m sampled |v| of dgc_codec (random_stream{seed, step, rank}, with replacement;
//! every entry once when m = n).
inline vec dgc_samples(const vec& v, std::size_t m, std::uint64_t seed, std::int64_t step, int rank) {
  const std::size_t n = v.size();
  vec smp;
  if (m >= n) {
    for (float x : v) smp.push_back(std::abs(x));
    return smp;
  }
  const commpact::random_stream u(seed, step, rank);
  for (std::size_t j = 0; j < m; ++j)
    smp.push_back(std::abs(v[std::min(n - 1, std::size_t(u.uniform(j) * double(n)))]));
  return smp;
}

//! DGC by the authors' rule (see the file comment) with dgc_codec's sampling.
inline ref_result dgc_ref(const vec& v, double density, double sample, std::uint64_t seed, std::int64_t step, int rank,
                          double lower = 0.8, int iters = 10) {
  const std::size_t n = v.size(), k = k_ref(density, n);
  const std::size_t m = std::min(n, std::max<std::size_t>({1, std::size_t(std::ceil(sample * double(n))),
                                                           std::size_t(std::ceil(2.0 / density))}));
  vec smp = dgc_samples(v, m, seed, step, rank);
  std::sort(smp.rbegin(), smp.rend());
  const std::size_t ks = std::clamp<std::size_t>(std::size_t(std::ceil(double(m) * density)), 1, m);
  float t = smp[ks - 1];  // min of the top ks samples
  for (int it = 0; it < iters; ++it) {
    if (double(count_ref(v, t, false)) < lower * double(k)) t = t * float(lower);
    else break;
  }
  return {t, count_ref(v, t, false), select_ref(v, t, false, k)};
}

//! commpact's DGC before this change (d0cb695): m = max(1, round(sample n)) samples, the
//! ceil(density m)-th largest, no lowering, at most round(density n) (the largest).
inline ref_result dgc_old(const vec& v, double density, double sample, std::uint64_t seed, std::int64_t step, int rank) {
  const std::size_t n = v.size();
  const std::size_t k = std::clamp<std::size_t>(std::size_t(std::llround(density * double(n))), 1, n);
  const std::size_t m = std::max<std::size_t>(1, std::size_t(std::llround(sample * double(n))));
  vec smp;  // m draws with replacement, whatever m
  const commpact::random_stream u(seed, step, rank);
  for (std::size_t j = 0; j < m; ++j) smp.push_back(std::abs(v[std::min(n - 1, std::size_t(u.uniform(j) * double(n)))]));
  std::sort(smp.rbegin(), smp.rend());
  const float t = smp[std::size_t(std::ceil(density * double(m))) - 1];
  return {t, count_ref(v, t, false), select_ref(v, t, false, k)};
}

}  // namespace commpact_test::refs
