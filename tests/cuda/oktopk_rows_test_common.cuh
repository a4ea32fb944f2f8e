// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers of tests/cuda/test_cuda_rows_oktopk.cu: device copies of host vectors, a
// byte-for-byte comparison (SAME), adversarial finite draws, random regions and frames.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/kernels/host/ops.hpp"

#include "cuda_test_common.cuh"

using commpact_test::failures;
namespace cp = commpact;
namespace hk = commpact::host::oktopk;
using D = cp::ops<cp::cuda_space>;
using H = cp::ops<cp::host_space>;
using u32 = std::uint32_t;
using i32 = std::int32_t;
using i64 = std::int64_t;
using bytes = std::vector<std::byte>;

namespace oktopk_rows_test {

inline cp::cuda_space::exec E;
inline std::mt19937_64 rng;

template <class T>
cp::cuda_buffer<T> dev(const std::vector<T>& h) {
  cp::cuda_buffer<T> b;
  b.resize(h.size());
  D::from_host(E, std::span<const T>(h), b.view());
  return b;
}
template <class T>
std::vector<T> host(const cp::cuda_buffer<T>& b) {
  std::vector<T> h(b.size());
  D::to_host(E, b.cview(), std::span<T>(h));
  cp::cuda_space::fence(E, cp::no_deadline());
  return h;
}
//! The first differing byte of two vectors, or -1.
template <class T>
inline long diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  const auto* x = reinterpret_cast<const unsigned char*>(a.data());
  const auto* y = reinterpret_cast<const unsigned char*>(b.data());
  for (std::size_t i = 0; i < a.size() * sizeof(T); ++i)
    if (x[i] != y[i]) return static_cast<long>(i);
  return -1;
}
#define SAME(dv, hv, ...)                                                                   \
  do {                                                                                      \
    const long at_ = diff(host(dv), hv);                                                    \
    EXPECT(at_ < 0, "%s differs from the host at byte %ld: ", #dv, at_);                    \
    if (at_ >= 0) std::printf(__VA_ARGS__), std::printf("\n");                              \
  } while (0)

inline std::size_t below(std::size_t n) { return n ? static_cast<std::size_t>(rng() % n) : 0; }
//! Finite: Gaussian, ties (+-0.75 multiples), +-0, denormals and large values.
inline float draw() {
  const float s = (rng() & 1) ? -1.0f : 1.0f;
  switch (rng() % 8) {
    case 0: return s * 0.0f;
    case 1: return s * std::numeric_limits<float>::denorm_min() * static_cast<float>(1 + below(40));
    case 2:
    case 3: return s * 0.75f * static_cast<float>(below(4));
    case 4: return s * 1.0e38f * static_cast<float>(1 + below(3));  // finite; sums may overflow to Inf
    default: return std::normal_distribution<float>(0.0f, 10.0f)(rng);
  }
}
inline std::vector<float> draws(std::size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = draw();
  return v;
}
inline float nan_poison() { return std::numeric_limits<float>::quiet_NaN(); }
//! P + 1 sorted boundaries of [0, n), some regions empty.
inline std::vector<i64> random_bounds(std::size_t P, std::size_t n) {
  std::vector<i64> b(P + 1);
  for (std::size_t j = 1; j < P; ++j) b[j] = static_cast<i64>(below(n + 1));
  std::sort(b.begin() + 1, b.end() - 1);
  b[0] = 0, b[P] = static_cast<i64>(n);
  return b;
}
//! c distinct ascending indices of [lo, hi), drawn from the first `pool` of them.
inline std::vector<i32> ascending(i64 lo, i64 hi, std::size_t c, std::size_t pool) {
  const auto len = static_cast<std::size_t>(hi - lo);
  pool = std::min(std::max(pool, c), len);
  std::vector<i32> all(pool);
  for (std::size_t i = 0; i < pool; ++i) all[i] = static_cast<i32>(lo + static_cast<i64>(i * len / pool));
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(c);
  std::sort(all.begin(), all.end());
  return all;
}
template <class T>
void put(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
inline void put_entries(std::byte* p, const std::vector<i32>& idx, const std::vector<float>& val) {
  for (std::size_t e = 0; e < idx.size(); ++e) put(p + 4 * e, idx[e]), put(p + 4 * (idx.size() + e), val[e]);
}
inline bytes garbage(std::size_t n) {
  bytes b(n);
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

}  // namespace oktopk_rows_test
