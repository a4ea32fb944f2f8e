// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by tests/cuda/test_cuda_rows_cast_vote.cu and the checks it includes: the
// executor, host <-> device copies that fence, and bitwise comparisons.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/kernels/host/ops.hpp"
#include "cuda_test_common.cuh"

namespace cp = commpact;

// A named namespace (the test says `using namespace rows_test`), not an anonymous one: CI's
// unity build of the CUDA tests (COMMPACT_CUDA_TESTS_UNITY) includes this header at global
// scope beside the other tests' headers, each of which has its own E.
namespace rows_test {

using D = cp::ops<cp::cuda_space>;
using H = cp::ops<cp::host_space>;
using commpact_test::failures;

inline cp::cuda_space::exec E;

//! b = h (resized), fenced, so that work on other streams sees it.
template <class T>
void upload(cp::cuda_buffer<T>& b, const std::vector<T>& h) {
  b.resize(h.size());
  if (!h.empty()) D::from_host(E, std::span<const T>(h), b.view());
  cp::cuda_space::fence(E, cp::no_deadline());
}
template <class T>
std::vector<T> download(const cp::cuda_buffer<T>& b) {
  std::vector<T> h(b.size());
  if (!h.empty()) D::to_host(E, b.cview(), std::span<T>(h));
  cp::cuda_space::fence(E, cp::no_deadline());
  return h;
}

//! Elements whose bytes differ (plus the difference in length).
template <class T>
std::size_t diff_bits(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t d = a.size() > b.size() ? a.size() - b.size() : b.size() - a.size();
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return d;
}
//! As diff_bits, but any NaN equals any NaN.
template <class T>
std::size_t diff_nan(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t d = a.size() > b.size() ? a.size() - b.size() : b.size() - a.size();
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    d += !(std::memcmp(&a[i], &b[i], sizeof(T)) == 0 || (std::isnan(a[i]) && std::isnan(b[i])));
  return d;
}

}  // namespace rows_test
