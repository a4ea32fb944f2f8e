// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codecs_estimated.cuh
//! Device kernels of the threshold sparsifiers whose threshold is estimated from the
//! gradient, gaussiank_codec and dgc_codec (compress/device_codecs_estimated.cuh). The
//! estimate lives on the device in an `estimate_state`; the selection under the cap is
//! threshold_codec's (codecs_threshold.cuh's compaction) with the threshold read there.
//!
//! | kernel | what it does | equal to the host |
//! |---|---|---|
//! | gaussiank_moments | (x, x^2) summed in double in kernels/fixed_sum.hpp's shape (fixed_sum.cuh's segmented_sum: a block per node of 2048 values, one launch per level); the last level's thread 0 sets the state (detail::gaussiank_estimate) | bits (the host sums in the same shape) |
//! | dgc_sample | smp[j] = abs(v[detail::dgc_sample_index(random_stream::uniform(j), n)]), or abs(v[j]) when m = n; the state reset (tf = +Inf) | bits |
//! | dgc_kth | the threshold = the smallest of the top sample_rank(m) samples (topk_abs's values): block minima, then atomicMin on the bits | bits (a minimum does not depend on the order) |
//! | estimate_count | the number of entries passing the state's float threshold, per block then one atomicAdd (integers); the last block to finish (a ticket taken after a fence) takes the round's decision: Gaussian-k's detail::gaussiank_factor, DGC's count < lower k; the threshold moved on the device | the count; the decision's bits |
//! | estimate_mask, estimate_flags | threshold_mask / threshold_flags with the state's threshold and strictness | bytes |
//!
//! The loops' counts never leave the device: each round is one count launch that ends in
//! its decision, launched `rounds - 1` (Gaussian-k) or `iters` (DGC) times, a finished
//! estimate making the later launches return at once. No host synchronisation.
//!
//! Checked against its host twin by tests/cuda/test_cuda_codecs_estimated.cu (docs/cuda.md,
//! "Status", says where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/codecs_estimated.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../formulas/bits.hpp"
#include "../formulas/thresholds.hpp"
#include "codecs.cuh"
#include "codecs_threshold.cuh"
#include "fixed_sum.cuh"
#include "grid.cuh"

namespace commpact::cuda_kernels::codec {

//! An estimated threshold on the device: t (Gaussian-k's double; unused by DGC), tf the
//! float the selection uses, the passing count of the current round, whether the estimate
//! is final, how many times it moved, and the blocks of the current count that finished.
struct estimate_state {
  double t;
  float tf;
  std::uint32_t done;
  unsigned long long count;
  std::uint32_t adjusted;
  unsigned int finished;
};

//! Gaussian-k's first estimate at the end of the moments' sum (thread 0 of the last
//! level): t = detail::gaussiank_estimate(s, ss, n, z); the state reset.
struct gaussiank_start {
  estimate_state* st;
  std::size_t n;
  double z;
  __device__ void operator()(std::size_t, commpact::fixed_sum::double2_sum m) const {
    const double t = commpact::detail::gaussiank_estimate(m.a, m.b, n, z);
    st->t = t, st->tf = static_cast<float>(t), st->done = 0, st->count = 0, st->adjusted = 0, st->finished = 0;
  }
};

//! Scratch (double2_sum values) of gaussiank_moments for n values (0 up to 2048).
inline std::size_t gaussiank_scratch(std::size_t n) { return fixed::scratch_items(1, n); }

//! Gaussian-k's moments of v[0, n) and the first estimate into st (see the table).
inline cudaError_t gaussiank_moments(const float* v, std::size_t n, double z, estimate_state* st,
                                     commpact::fixed_sum::double2_sum* scratch, cudaStream_t s) {
  return fixed::segmented_sum(commpact::detail::gaussiank_leaf{v}, commpact::fixed_sum::add_double2{},
                              gaussiank_start{st, n, z}, 1, n, n, scratch, s);
}

//! Gaussian-k's decision after a count c (estimate_count's last block): t *=
//! detail::gaussiank_factor(c, k), or the estimate final when c is within [2k/3, 4k/3].
struct gaussiank_decide {
  std::uint64_t k;
  __device__ void operator()(estimate_state* st, unsigned long long c) const {
    const double f = commpact::detail::gaussiank_factor(c, k);
    if (f == 0.0) {
      st->done = 1;
      return;
    }
    const double t = __dmul_rn(st->t, f);
    st->t = t, st->tf = static_cast<float>(t), ++st->adjusted;
  }
};

//! DGC's decision after a count c: tf *= lower while c < floor_count, else final.
struct dgc_decide {
  double floor_count;
  float lower;
  __device__ void operator()(estimate_state* st, unsigned long long c) const {
    if (!(static_cast<double>(c) < floor_count)) {
      st->done = 1;
      return;
    }
    st->tf = __fmul_rn(st->tf, lower), ++st->adjusted;
  }
};

//! DGC's m samples: abs(v[dgc_sample_index(rng.uniform(j), n)]), every entry once when m
//! = n; thread 0 of block 0 resets the state for dgc_kth (tf = +Inf, the identity of its
//! minimum).
__global__ void dgc_sample(const float* v, std::size_t n, std::size_t m, random_stream rng, float* smp,
                           estimate_state* st) {
  if (blockIdx.x == 0 && threadIdx.x == 0)
    st->t = 0.0, st->tf = __int_as_float(0x7F800000), st->done = 0, st->count = 0, st->adjusted = 0, st->finished = 0;
  for (const std::size_t j : cuda_kernels::grid_stride(m))
    smp[j] = fabsf(v[m == n ? j : commpact::detail::dgc_sample_index(rng.uniform(j), n)]);
}

//! DGC's sampled threshold: st->tf = the smallest of the ks largest samples val[0, ks)
//! (topk_abs's output, every |value| >= +0), over the grid: a block minimum (fminf: a NaN
//! is passed over), then atomicMin on the bits (the order of non-negative floats; st->tf
//! starts at +Inf, dgc_sample's reset). A minimum does not depend on the order.
__global__ void __launch_bounds__(block_threads) dgc_kth(const float* val, std::size_t ks, estimate_state* st) {
  __shared__ float part[block_threads];
  float m = __int_as_float(0x7F800000);
  for (const std::size_t j : cuda_kernels::grid_stride(ks)) m = fminf(m, fabsf(val[j]));
  part[threadIdx.x] = m;
  __syncthreads();
  for (unsigned w = block_threads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] = fminf(part[threadIdx.x], part[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicMin(reinterpret_cast<unsigned int*>(&st->tf), __float_as_uint(part[0]));
}

//! st->count += the entries of v passing st->tf (detail::passes_threshold), unless
//! st->done; then the last block to finish (its ticket from st->finished, taken after a
//! fence, so that every other block's count is in) resets the count and the ticket and
//! calls decide(st, count).
template <class Decide>
__global__ void __launch_bounds__(block_threads)
    estimate_count(const float* v, std::size_t n, bool strict, estimate_state* st, Decide decide) {
  __shared__ unsigned long long part[block_threads];
  __shared__ bool last;
  if (st->done) return;  // the whole grid: st is written only after every block has read it
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
  if (threadIdx.x == 0) {
    if (part[0]) atomicAdd(&st->count, part[0]);
    __threadfence();
    last = atomicAdd(&st->finished, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    __threadfence();
    const unsigned long long total = atomicAdd(&st->count, 0ull);
    st->count = 0, st->finished = 0;
    decide(st, total);
  }
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
