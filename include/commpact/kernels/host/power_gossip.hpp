// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file power_gossip.hpp
//! The host kernels of PowerGossip (gossip/power_gossip.hpp) that no other row of the
//! kernel table covers: the orthonormalisation of an edge's shared factor with its
//! zero-column retries, the update of one matrix from an edge's two projections, and
//! the exact mix of one vector. They are the reference of the ops rows
//! `power_gossip_orthonormalize`, `power_gossip_update`, `power_gossip_vectors`
//! (kernels/ops.hpp). The projections themselves are the rows lowrank_project and
//! lowrank_back_project (kernels/host/lowrank.hpp).
//!
//! The kernels that change the model do nothing unless the round is clear
//! (gossip::clear: words[0] = words[2] = 0, kernels/host/gossip.hpp), so a failed round
//! changes nothing and no kernel throws.

#include <cstddef>
#include <cstdint>
#include <span>

#include "../../config.hpp"
#include "gossip.hpp"
#include "lowrank.hpp"
#include "orthogonalize.hpp"
#include "simd.hpp"

namespace commpact::host::power_gossip {

//! The per-element formulas of update and vectors, shared with the CUDA rows
//! (kernels/cuda/rows_power.cuh): one IEEE operation each, the product rounded before
//! the sum (never fused into an FMA: simd::opaque here, __fmul_rn / __dmul_rn there).
//!
//! x + coef u in float (update's X[i] += coef U[i]).
COMMPACT_HOST_DEVICE inline float add_scaled(float x, float coef, float u) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(x, __fmul_rn(coef, u));
#else
  float p = coef * u;
  simd::opaque(p);
  return x + p;
#endif
}
//! acc + w double(v) in double (one neighbour's term of vectors' mix).
COMMPACT_HOST_DEVICE inline double mix_term(double acc, double w, float v) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(acc, __dmul_rn(w, static_cast<double>(v)));
#else
  double p = w * static_cast<double>(v);
  simd::opaque(p);
  return acc + p;
#endif
}

//! Orthonormalises the shared factor s (len x r, column-major) in
//! orthonormalize_columns' order. While a column stays zero (the two ends' models agree
//! on it, or it depends on the previous ones), every zero column c is redrawn as
//! gaussian(mix_seed(seed, t, step, c + 1 + attempt r)) and s orthonormalised again, at
//! most twice: both ends of the edge compute the same bits.
inline void orthonormalize_shared(std::span<float> s, std::size_t len, std::size_t r, std::uint64_t seed,
                                  std::uint64_t t, std::uint64_t step) {
  float* a = s.data();
  int kept = orthonormalize_columns(a, len, static_cast<int>(r), len);
  for (std::size_t attempt = 0; kept < static_cast<int>(r) && attempt < 2; ++attempt) {
    for (std::size_t c = 0; c < r; ++c)
      if (column_is_zero(a, len, c, len))
        fill_gaussian(std::span<float>(a + c * len, len), mix_seed(seed, t, step, c + 1 + attempt * r));
    kept = orthonormalize_columns(a, len, static_cast<int>(r), len);
  }
}

//! One matrix X (n x m, row-major) and one edge, when the round is clear: with S the
//! orthonormalised shared factor (phase 0: n x r; phase 1: m x r), `mine` this rank's
//! projection and `theirs` the neighbour's (the bytes of dl x r floats, dl = m in phase
//! 0, n in phase 1), d = q_high - q_low (the lower rank's projection is q_low), then
//! U = S d^T (phase 0) or d S^T (phase 1) in lowrank_approx's order (upd: n m floats of
//! scratch) and X[i] += coef U[i] in float. d is the next round's shared factor.
inline void update(std::span<float> X, std::size_t n, std::size_t m, std::span<const float> S,
                   std::span<const float> mine, std::span<const std::byte> theirs, std::span<float> d, std::size_t r,
                   int phase, bool lower, float coef, std::span<float> upd, std::span<const std::int64_t> words) {
  if (!gossip::clear(words)) return;
  const std::size_t dl = (phase == 0 ? m : n) * r;
  const auto* th = reinterpret_cast<const float*>(theirs.data());
  const float* q_low = lower ? mine.data() : th;
  const float* q_high = lower ? th : mine.data();
  for (std::size_t i = 0; i < dl; ++i) d[i] = q_high[i] - q_low[i];
  const std::span<const float> dc(d.data(), dl);
  lowrank_approx(upd, n, m, phase == 0 ? S : dc, phase == 0 ? dc : S, r);
  float* x = X.data();
  const float* u = upd.data();
  const std::size_t nm = n * m;
  std::size_t i = 0;
#if COMMPACT_HOST_SIMD
  for (; i + simd::lanes <= nm; i += simd::lanes) {  // add_scaled, a vector at a time
    simd::vf p = simd::load<simd::vf>(u + i) * coef;
    simd::opaque(p);
    simd::store(x + i, simd::load<simd::vf>(x + i) + p);
  }
#endif
  for (; i < nm; ++i) x[i] = add_scaled(x[i], coef, u[i]);
}

//! One vector x (len floats), when the round is clear: x = float(self_w x + sum_k w[k]
//! x_k) in double (acc: len doubles), neighbours in ascending order; x_k is the len
//! floats at byte `offset` of neighbour k's message, the k-th block of `stride` bytes
//! of recv.
inline void vectors(std::span<float> x, std::span<const std::byte> recv, std::size_t stride, std::size_t offset,
                    std::span<const double> w, double self_w, std::span<double> acc,
                    std::span<const std::int64_t> words) {
  if (!gossip::clear(words)) return;
  const std::size_t len = x.size();
  for (std::size_t i = 0; i < len; ++i) acc[i] = self_w * x[i];
  for (std::size_t k = 0; k < w.size(); ++k) {
    const auto* v = reinterpret_cast<const float*>(recv.data() + k * stride + offset);
    const double wk = w[k];
    for (std::size_t i = 0; i < len; ++i) acc[i] = mix_term(acc[i], wk, v[i]);
  }
  for (std::size_t i = 0; i < len; ++i) x[i] = static_cast<float>(acc[i]);
}

}  // namespace commpact::host::power_gossip
