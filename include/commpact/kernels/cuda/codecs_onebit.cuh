// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codecs_onebit.cuh
//! Device kernels of onebit_codec (device_codec<onebit_codec>,
//! compress/device_codecs_onebit.cuh), with the host's arithmetic (detail::
//! onebit_negative, onebit_leaf, onebit_add, onebit_means, onebit_means_ok, onebit_byte in
//! quantizers.hpp).
//!
//! | kernel | what it does | equal to the host |
//! |---|---|---|
//! | onebit_means | each side's sum in double and the count in kernels/fixed_sum.hpp's shape (fixed_sum.cuh's segmented_sum: a block per node of 2048 values, one launch per level); the means by detail::onebit_means into the payload, by the last level's thread 0 | bits (the host sums in the same shape) |
//! | onebit_bits | detail::onebit_byte per payload byte, approx = the mean of the value's side | bytes |
//! | onebit_validate, onebit_add | onebit_codec::decode_add's checks (length, detail::onebit_means_ok, no bit past n) per block; sum[i] = 0 + every block's value of bit i in rank order (__fadd_rn) | bits |
//!
//! Checked against its host twin by tests/cuda/test_cuda_codecs_more.cu (docs/cuda.md, "Status",
//! says where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/codecs_onebit.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../formulas/quantizers.hpp"
#include "../formulas/sign.hpp"
#include "codecs.cuh"
#include "fixed_sum.cuh"
#include "grid.cuh"

namespace commpact::cuda_kernels::codec {

//! onebit_codec's end of the sums (thread 0 of the last level): payload[0, 2) = detail::onebit_means.
struct onebit_means_out {
  std::size_t n;
  float* payload;
  __device__ void operator()(std::size_t, const commpact::detail::onebit_sums& s) const {
    commpact::detail::onebit_means(s, n, payload, payload + 1);
  }
};

//! Scratch (onebit_sums) of onebit_means for n values: none up to 2048.
inline std::size_t onebit_scratch(std::size_t n) { return fixed::scratch_items(1, n); }

//! payload[0, 2) = the two means of v: both sides' sums in kernels/fixed_sum.hpp's shape.
inline cudaError_t onebit_means(const float* v, std::size_t n, float* payload, commpact::detail::onebit_sums* scratch,
                                cudaStream_t s) {
  return fixed::segmented_sum(commpact::detail::onebit_leaf{v}, commpact::detail::onebit_add{},
                              onebit_means_out{n, payload}, 1, n, n, scratch, s);
}

//! bits[j] = detail::onebit_byte(v, n, j) for the nb payload bytes; approx (if not null)
//! the decoded values with the means at means[0, 2).
__global__ void onebit_bits(const float* v, std::size_t n, unsigned char* bits, std::size_t nb, float* approx,
                            const float* means) {
  const float a = means[0], b = means[1];
  for (const std::size_t j : cuda_kernels::grid_stride(nb)) {
    bits[j] = commpact::detail::onebit_byte(v, n, j);
    if (approx)
      for (std::size_t i = 8 * j; i < 8 * j + 8 && i < n; ++i) approx[i] = commpact::detail::onebit_negative(v[i]) ? b : a;
  }
}

//! Block r's payload checked as onebit_codec::decode_add does (thread r).
__global__ void onebit_validate(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t n,
                                std::uint32_t* status) {
  const std::size_t bytes = 8 + (n + 7) / 8;
  for (const std::size_t r : cuda_kernels::grid_stride(P)) {
    const std::uint32_t* b = blocks + r * block_words;
    bool ok = b[2] == bytes && 4 * (block_words - header_words) >= bytes;
    if (ok) {
      const auto* p = reinterpret_cast<const unsigned char*>(b + header_words);
      ok = commpact::detail::onebit_means_ok(__uint_as_float(b[header_words]), __uint_as_float(b[header_words + 1])) &&
           commpact::detail::sign_tail_ok(n % 8 ? p[8 + n / 8] : 0u, n);
    }
    if (!ok) atomicOr(status, static_cast<std::uint32_t>(status_wire));
  }
}

//! sum[i] = 0.0f + every block's value of bit i (its second mean if set, else its first),
//! in rank order (nothing once status_wire is set).
__global__ void onebit_add(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t n,
                           float* sum, const std::uint32_t* status) {
  rank_order_sum(blocks, block_words, P, n, sum, status, [](const std::uint32_t* b, std::size_t i, float& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(b + header_words);
    v = __uint_as_float(b[header_words + ((p[8 + i / 8] >> (i % 8)) & 1u)]);  // bit set: the second mean
    return true;
  });
}

}  // namespace commpact::cuda_kernels::codec
