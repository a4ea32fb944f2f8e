// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by tests/cuda/test_cuda_codecs.cu and test_cuda_codec_leaves.cu: the executor,
// copies to and from the device, a bitwise comparison, and the input kinds every codec
// kernel must treat like the host (Gaussian, ties with +-0, all equal, denormals, +-0).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include "commpact/compress/codec_kernels_cuda.cuh"
#include "commpact/compress/codecs/casts.hpp"
#include "commpact/compress/codecs/quantizers.hpp"
#include "commpact/compress/compressors/topk.hpp"
#include "commpact/kernels/cuda/ops.cuh"

#include "cuda_test_common.cuh"

namespace codec_test {

namespace cp = commpact;
using D = cp::ops<cp::cuda_space>;

inline cp::cuda_space::exec E;

template <class T>
inline void upload(cp::cuda_buffer<T>& b, const std::vector<T>& h) {
  b.resize(h.size());
  D::from_host(E, std::span<const T>(h), b.view());
}
template <class T>
inline std::vector<T> download(const cp::cuda_space::exec& e, cp::cuda_span<const T> s) {
  std::vector<T> h(s.size());
  D::to_host(e, s, std::span<T>(h));
  cp::cuda_space::fence(e, cp::no_deadline());
  return h;
}
template <class T>
inline std::size_t diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size()) + 1;
  std::size_t d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return d;
}

//! Inputs of every kind the kernels must order like the host.
inline std::vector<float> make_input(int kind, std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d;
  std::uniform_int_distribution<int> pick(0, 7);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (kind) {
      case 0: v[i] = d(rng); break;                                          // Gaussian
      case 1: v[i] = static_cast<float>(pick(rng) - 4) * 0.5f; break;        // many ties, +-0
      case 2: v[i] = 1.25f; break;                                           // all equal
      case 3: v[i] = (pick(rng) & 1 ? -1.0f : 1.0f) * 1e-40f * static_cast<float>(pick(rng)); break;  // denormals, +-0
      default: v[i] = pick(rng) == 0 ? -0.0f : (pick(rng) == 1 ? 0.0f : d(rng)); break;  // +-0 among Gaussians
    }
  }
  return v;
}

}  // namespace codec_test
