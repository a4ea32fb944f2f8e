// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codecs_estimated.cuh
//! Device kernels of the threshold sparsifiers whose threshold is estimated from the
//! gradient, gaussiank_codec and dgc_codec (compress/codec_kernels_cuda_estimated.cuh). The
//! estimate lives on the device in an `estimate_state`; the selection under the cap is
//! threshold_codec's (codecs_threshold.cuh's compaction) with the threshold read there.
//!
//! | kernel | what it does | equal to the host |
//! |---|---|---|
//! | gaussiank_moments | one block: warps 1.. stage tiles of v in shared memory, one thread sums them in index order (detail::gaussiank_accumulate), then detail::gaussiank_estimate | bits (the host's sequential double sums) |
//! | dgc_sample | smp[j] = abs(v[detail::dgc_sample_index(random_stream::uniform(j), n)]), or abs(v[j]) when m = n | bits |
//! | dgc_kth | one block: the threshold = the smallest of the top sample_rank(m) samples (topk_abs's values) | bits (a minimum does not depend on the order) |
//! | estimate_count | the number of entries passing the state's float threshold, per block then one atomicAdd (integers) | the count |
//! | gaussiank_round, dgc_round | one thread: the host's decision after a count (detail::gaussiank_factor; DGC's count < lower k), the threshold moved on the device | bits |
//! | estimate_mask, estimate_flags | threshold_mask / threshold_flags with the state's threshold and strictness | bytes |
//!
//! The loops' counts never leave the device: each round is a count over v and a one-thread
//! decision, launched `rounds - 1` (Gaussian-k) or `iters` (DGC) times, a finished estimate
//! making the later launches return at once. No host synchronisation.
//!
//! Cost of bit-identity: the host sums x and x^2 sequentially in double (one value after
//! the other), which no parallel reduction reproduces, so gaussiank_moments adds the n
//! values on one thread: about n dependent double additions (of the order of milliseconds
//! per million values), while the other warps keep the tiles coming.
//!
//! NOT YET RUN ON A GPU: compiled by nvcc 13 and tested against the host codecs by
//! tests/cuda/test_cuda_codecs_estimated.cu (exit 77 without a device).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/codecs_estimated.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../../compress/codecs/bits.hpp"
#include "../../compress/codecs/sparsifiers.hpp"
#include "codecs.cuh"
#include "codecs_threshold.cuh"
#include "grid.cuh"

namespace commpact::cuda_kernels::codec {

//! An estimated threshold on the device: t (Gaussian-k's double; unused by DGC), tf the
//! float the selection uses, the passing count of the last round, whether the estimate is
//! final, and how many times it moved.
struct estimate_state {
  double t;
  float tf;
  std::uint32_t done;
  unsigned long long count;
  std::uint32_t adjusted;
};

inline constexpr int moments_threads = 256;  //!< one block; warp 0 sums, the others load
inline constexpr std::size_t moments_tile = 4096;

//! Gaussian-k's first estimate (one block of moments_threads): s and ss over v[0, n) in
//! index order, then t = detail::gaussiank_estimate(s, ss, n, z); the state reset.
__global__ void __launch_bounds__(moments_threads)
    gaussiank_moments(const float* v, std::size_t n, double z, estimate_state* st) {
  __shared__ float tile[2][moments_tile];
  const unsigned loaders = moments_threads - 32, me = threadIdx.x - 32;  // warps 1..: loaders
  const std::size_t tiles = (n + moments_tile - 1) / moments_tile;
  auto load = [&](std::size_t j) {
    const std::size_t base = j * moments_tile;
    for (std::size_t i = me; i < moments_tile && base + i < n; i += loaders) tile[j & 1][i] = v[base + i];
  };
  if (threadIdx.x >= 32 && tiles) load(0);
  __syncthreads();
  double s = 0.0, ss = 0.0;
  for (std::size_t j = 0; j < tiles; ++j) {
    if (threadIdx.x >= 32) {
      if (j + 1 < tiles) load(j + 1);
    } else if (threadIdx.x == 0) {
      const std::size_t base = j * moments_tile, c = n - base < moments_tile ? n - base : moments_tile;
      const float* t = tile[j & 1];
      for (std::size_t i = 0; i < c; ++i) commpact::detail::gaussiank_accumulate(s, ss, t[i]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double t = commpact::detail::gaussiank_estimate(s, ss, n, z);
    st->t = t, st->tf = static_cast<float>(t), st->done = 0, st->count = 0, st->adjusted = 0;
  }
}

//! After a count: Gaussian-k's decision (one thread), t *= detail::gaussiank_factor(count, k)
//! unless the count is within [2k/3, 4k/3]; the count reset.
__global__ void gaussiank_round(estimate_state* st, std::uint64_t k) {
  const unsigned long long c = st->count;
  st->count = 0;
  if (st->done) return;
  const double f = commpact::detail::gaussiank_factor(c, k);
  if (f == 0.0) {
    st->done = 1;
    return;
  }
  const double t = __dmul_rn(st->t, f);
  st->t = t, st->tf = static_cast<float>(t), ++st->adjusted;
}

//! DGC's m samples: abs(v[dgc_sample_index(rng.uniform(j), n)]), every entry once when m = n.
__global__ void dgc_sample(const float* v, std::size_t n, std::size_t m, random_stream rng, float* smp) {
  for (const std::size_t j : cuda_kernels::grid_stride(m))
    smp[j] = fabsf(v[m == n ? j : commpact::detail::dgc_sample_index(rng.uniform(j), n)]);
}

//! DGC's sampled threshold (one block of block_threads): the smallest of the ks largest
//! samples val[0, ks) (topk_abs's output, every value >= +0); the state reset.
__global__ void __launch_bounds__(block_threads) dgc_kth(const float* val, std::size_t ks, estimate_state* st) {
  __shared__ float part[block_threads];
  float m = __int_as_float(0x7F800000);
  for (std::size_t j = threadIdx.x; j < ks; j += blockDim.x) m = fminf(m, fabsf(val[j]));
  part[threadIdx.x] = m;
  __syncthreads();
  for (unsigned w = block_threads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] = fminf(part[threadIdx.x], part[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) st->t = 0.0, st->tf = part[0], st->done = 0, st->count = 0, st->adjusted = 0;
}

//! After a count: DGC's decision (one thread), tf *= lower while count < floor_count; the count reset.
__global__ void dgc_round(estimate_state* st, double floor_count, float lower) {
  const unsigned long long c = st->count;
  st->count = 0;
  if (st->done) return;
  if (!(static_cast<double>(c) < floor_count)) {
    st->done = 1;
    return;
  }
  st->tf = __fmul_rn(st->tf, lower), ++st->adjusted;
}

//! st->count += the entries of v passing st->tf (detail::passes_threshold), unless st->done.
__global__ void __launch_bounds__(block_threads)
    estimate_count(const float* v, std::size_t n, bool strict, estimate_state* st) {
  __shared__ unsigned long long part[block_threads];
  if (st->done) return;  // the whole grid: st is not written before the next launch
  const float t = st->tf;
  unsigned long long c = 0;
  for (const std::size_t i : cuda_kernels::grid_stride(n))
    c += commpact::detail::passes_threshold(v[i], t, strict) ? 1u : 0u;
  part[threadIdx.x] = c;
  __syncthreads();
  for (unsigned w = block_threads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0 && part[0]) atomicAdd(&st->count, part[0]);
}

//! w[i] = v[i] when it passes st->tf, else +0. Every passing entry outranks a +0 in
//! topk_abs unless the threshold lets every non-NaN entry pass (t < 0, or t <= 0 with
//! strict false), where w = v.
__global__ void estimate_mask(const float* v, std::size_t n, bool strict, const estimate_state* st, float* w) {
  const float t = st->tf;
  for (const std::size_t i : cuda_kernels::grid_stride(n))
    w[i] = commpact::detail::passes_threshold(v[i], t, strict) ? v[i] : 0.0f;
}

//! flag[j] = 1 when the selected value val[j] passes st->tf, else 0.
__global__ void estimate_flags(const float* val, std::size_t cap, bool strict, const estimate_state* st,
                               std::uint32_t* flag) {
  const float t = st->tf;
  for (const std::size_t j : cuda_kernels::grid_stride(cap))
    flag[j] = commpact::detail::passes_threshold(val[j], t, strict) ? 1u : 0u;
}

}  // namespace commpact::cuda_kernels::codec
