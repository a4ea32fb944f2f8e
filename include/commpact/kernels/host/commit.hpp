// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file commit.hpp
//! The commit of a sparse step: the sparse result written into a zeroed dense gradient,
//! and the delivered entries removed from the error-feedback residual.
//!
//! <!-- snippet: delivered=std::vector<std::int32_t>; alive=std::vector<std::uint8_t> -->
//! \code
//! // grad = 0 except grad[idx[j]] = val[j] / P; residual[d] = 0 for delivered d
//! commpact::host::commit_sparse(grad, idx, val, float(P), residual, velocity, delivered, alive);
//! \endcode
//!
//! Measured (bench/bench_vector_ops.cpp): a memset, which glibc streams with
//! non-temporal stores, followed by the k scattered stores beats a blocked one-pass
//! version (zeroed L1 block + entries + streaming copy) at every n from 1 M to 16 M and
//! k = n / 1000, so that is what `scatter_into_zeroed` does; the fusion left is checking
//! every argument once, before anything is written.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "../../error.hpp"
#include "simd.hpp"

namespace commpact::host {

//! out[i] = 0 for every i, then out[idx[j]] = val[j] / divisor for each j in order
//! (the quotient rounded once, as `val[j] / divisor` in a scalar loop; a repeated index:
//! the later entry wins). Indices must be inside [0, out.size()) and idx, val equally
//! long; all checks run before anything is written (invalid_argument names the
//! offending position).
inline void scatter_into_zeroed(std::span<float> out, std::span<const std::int32_t> idx, std::span<const float> val,
                                float divisor = 1.0f) {
  const std::size_t n = out.size(), k = idx.size();
  require(val.size() == k, "commpact::host::scatter_into_zeroed: ", k, " indices but ", val.size(),
          " values; pass equally long index and value spans.");
  for (std::size_t j = 0; j < k; ++j)
    require(idx[j] >= 0 && static_cast<std::size_t>(idx[j]) < n, "commpact::host::scatter_into_zeroed: index ",
            idx[j], " at position ", j, " is outside the output of length ", n,
            "; indices must be in [0, n): check the set came from a vector of this length.");
  if (n) std::memset(out.data(), 0, n * sizeof(float));
  float* o = out.data();
  for (std::size_t j = 0; j < k; ++j) o[idx[j]] = val[j] / divisor;
}

//! residual[d] = 0 (and velocity[d] = 0 when velocity is not empty) for every delivered
//! index d = delivered[j] with alive[j] != 0 (every j when alive is empty). Indices are
//! checked against the residual's length before anything is written; any order, repeats
//! allowed.
inline void zero_delivered(std::span<float> residual, std::span<float> velocity,
                           std::span<const std::int32_t> delivered, std::span<const std::uint8_t> alive = {}) {
  const std::size_t n = residual.size();
  require(velocity.empty() || velocity.size() == n, "commpact::host::zero_delivered: velocity holds ",
          velocity.size(), " values but the residual ", n, "; pass an empty velocity or one of the same length.");
  require(alive.empty() || alive.size() == delivered.size(), "commpact::host::zero_delivered: ", alive.size(),
          " alive flags for ", delivered.size(), " delivered indices; pass one flag per index or none.");
  for (std::size_t j = 0; j < delivered.size(); ++j)
    require(delivered[j] >= 0 && static_cast<std::size_t>(delivered[j]) < n, "commpact::host::zero_delivered: index ",
            delivered[j], " at position ", j, " is outside the residual of length ", n, "; indices must be in [0, n).");
  for (std::size_t j = 0; j < delivered.size(); ++j) {
    if (!alive.empty() && !alive[j]) continue;
    const auto d = static_cast<std::size_t>(delivered[j]);
    residual[d] = 0.0f;
    if (!velocity.empty()) velocity[d] = 0.0f;
  }
}

//! The commit of a sparse step: scatter_into_zeroed(out, idx, val, divisor), then
//! zero_delivered(residual, velocity, delivered, alive). Every argument is checked before
//! anything is written. out must not share storage with residual or velocity.
inline void commit_sparse(std::span<float> out, std::span<const std::int32_t> idx, std::span<const float> val,
                          float divisor, std::span<float> residual, std::span<float> velocity,
                          std::span<const std::int32_t> delivered, std::span<const std::uint8_t> alive = {}) {
  const std::size_t n = residual.size();
  require(velocity.empty() || velocity.size() == n, "commpact::host::commit_sparse: velocity holds ", velocity.size(),
          " values but the residual ", n, "; pass an empty velocity or one of the same length.");
  require(alive.empty() || alive.size() == delivered.size(), "commpact::host::commit_sparse: ", alive.size(),
          " alive flags for ", delivered.size(), " delivered indices; pass one flag per index or none.");
  for (std::size_t j = 0; j < delivered.size(); ++j)
    require(delivered[j] >= 0 && static_cast<std::size_t>(delivered[j]) < n, "commpact::host::commit_sparse: index ",
            delivered[j], " at position ", j, " is outside the residual of length ", n, "; indices must be in [0, n).");
  simd::check_no_partial_overlap("commit_sparse", "out", out.data(), out.size(), "residual", residual.data(), n);
  require(out.data() != residual.data() || out.empty(),
          "commpact::host::commit_sparse: out and residual are the same buffer; pass separate buffers.");
  scatter_into_zeroed(out, idx, val, divisor);
  zero_delivered(residual, velocity, delivered, alive);
}

}  // namespace commpact::host
