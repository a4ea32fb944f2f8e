// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codecs_qsgd.cuh
//! Device kernels of qsgd_codec (device_codec<qsgd_codec>,
//! compress/device_codecs.cuh), with the host's per-element arithmetic
//! (detail::qsgd_sq_leaf, qsgd_norm, qsgd_scale, qsgd_level, qsgd_value in quantizers.hpp)
//! and its random numbers (random_stream, counter-based, replayed here).
//!
//! | kernel | what it does | equal to the host |
//! |---|---|---|
//! | qsgd_norms | each bucket's sum of squares in double in kernels/fixed_sum.hpp's shape (fixed_sum.cuh's segmented_sum: a block per node of 2048 values, so one block per bucket up to d = 2048, one launch per level), the norm into the payload by the last level's thread 0 | bits (the host sums each bucket in the same shape) |
//! | qsgd_pack | one thread per payload byte of the fields (width w = 1 + bit_width(s), low bits first): every field that touches the byte, computed from its bucket's norm | bytes |
//! | qsgd_validate, qsgd_add | qsgd_codec::decode_add's checks (length, norms finite and >= 0, levels <= s, no sign on level 0, zero padding); sum[i] = 0 + the non-zero levels' values in rank order | bits |
//!
//! Checked against its host twin by tests/cuda/test_cuda_codec_leaves.cu,
//! tests/cuda/test_cuda_codecs.cu (docs/cuda.md, "Status", says where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/codecs_qsgd.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../formulas/quantizers.hpp"
#include "codecs.cuh"
#include "fixed_sum.cuh"
#include "grid.cuh"

namespace commpact::cuda_kernels::codec {

//! QSGD's shape for length n: s levels, d values per bucket, nb buckets, w bits a field.
struct qsgd_shape {
  std::size_t n, d, nb;
  std::uint32_t s;
  unsigned w;
  __device__ std::size_t field_bytes() const { return (n * w + 7) / 8; }
};

//! The end of bucket b's sum (thread 0 of the last level): norms[b] = detail::qsgd_norm(ss).
struct qsgd_norm_out {
  float* norms;
  __device__ void operator()(std::size_t b, double ss) const { norms[b] = commpact::detail::qsgd_norm(ss); }
};

//! Scratch (doubles) of qsgd_norms: none up to d = 2048.
inline std::size_t qsgd_norms_scratch(const qsgd_shape& q) { return fixed::scratch_items(q.nb, q.d); }

//! norms[b] = detail::qsgd_norm(bucket b's sum of squares) for the q.nb buckets (q.n > 0).
inline cudaError_t qsgd_norms(const float* v, const qsgd_shape& q, float* norms, double* scratch, cudaStream_t s) {
  return fixed::segmented_sum(commpact::detail::qsgd_sq_leaf{v}, commpact::fixed_sum::add_double{},
                              qsgd_norm_out{norms}, q.nb, q.d, q.n - (q.nb - 1) * q.d, scratch, s);
}

//! Field i: the level in the low w - 1 bits, the sign above (set only for a level > 0).
__device__ inline std::uint32_t qsgd_field(const float* v, const float* norms, qsgd_shape q, random_stream rng,
                                           std::size_t i, float* approx) {
  const float norm = norms[i / q.d];
  const std::uint32_t l = commpact::detail::qsgd_level(v[i], commpact::detail::qsgd_scale(norm, q.s), q.s, rng.uniform(i));
  const bool neg = l > 0 && v[i] < 0.0f;
  if (approx) {
    const float a = commpact::detail::qsgd_value(norm, l, q.s);
    approx[i] = neg ? -a : a;
  }
  return l | (static_cast<std::uint32_t>(neg) << (q.w - 1));
}

//! bytes[B] = the bits [8B, 8B + 8) of the field stream; approx[i] written by the thread
//! of the byte where field i starts.
__global__ void qsgd_pack(const float* v, const float* norms, qsgd_shape q, random_stream rng, unsigned char* bytes,
                          float* approx) {
  const std::size_t nbytes = q.field_bytes();
  for (const std::size_t B : cuda_kernels::grid_stride(nbytes)) {
    const std::size_t first = 8 * B / q.w, last = (8 * B + 7) / q.w;
    unsigned byte = 0;
    for (std::size_t i = first; i <= last && i < q.n; ++i) {
      const std::size_t start = i * q.w;  // bit where field i starts
      const std::uint64_t f = qsgd_field(v, norms, q, rng, i, start / 8 == B ? approx : nullptr);
      byte |= static_cast<unsigned>((start >= 8 * B ? f << (start - 8 * B) : f >> (8 * B - start)) & 0xFFu);
    }
    bytes[B] = static_cast<unsigned char>(byte);
  }
}

//! Field i of the stream at p (w <= 17 bits, within `nbytes` bytes).
__device__ inline std::uint32_t qsgd_read(const unsigned char* p, std::size_t nbytes, std::size_t i, unsigned w) {
  const std::size_t start = i * w, B = start / 8;
  std::uint32_t x = 0;
  for (unsigned k = 0; k < 4 && B + k < nbytes; ++k) x |= static_cast<std::uint32_t>(p[B + k]) << (8 * k);
  return (x >> (start % 8)) & ((1u << w) - 1u);
}

//! Thread t over P * (nb + n + 1): for block r = t / per, item j: a norm (j < nb), a field
//! (j < nb + n) or the length and the padding (j = nb + n).
__global__ void qsgd_validate(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, qsgd_shape q,
                              std::uint32_t* status) {
  const std::size_t per = q.nb + q.n + 1, fb = q.field_bytes(), bytes = 4 * q.nb + fb;
  for (const std::size_t t : cuda_kernels::grid_stride(P * per)) {
    const std::size_t r = t / per, j = t % per;
    const std::uint32_t* b = blocks + r * block_words;
    bool ok = b[2] == bytes && 4 * (block_words - header_words) >= bytes;
    if (ok) {
      const auto* fields = reinterpret_cast<const unsigned char*>(b + header_words + q.nb);
      if (j < q.nb) {
        ok = commpact::detail::sign_scale_ok(__uint_as_float(b[header_words + j]));
      } else if (j < q.nb + q.n) {
        const std::uint32_t f = qsgd_read(fields, fb, j - q.nb, q.w), l = f & ((1u << (q.w - 1)) - 1u);
        ok = l <= q.s && (l != 0 || f == 0);
      } else if ((q.n * q.w) % 8 != 0) {
        ok = (fields[fb - 1] >> ((q.n * q.w) % 8)) == 0u;
      }
    } else if (j != 0) {
      continue;  // the length is reported once per block
    }
    if (!ok) atomicOr(status, static_cast<std::uint32_t>(status_wire));
  }
}

//! sum[i] = 0.0f + the value of every block's field i with a level > 0, in rank order
//! (nothing once status_wire is set).
__global__ void qsgd_add(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, qsgd_shape q, float* sum,
                         const std::uint32_t* status) {
  const std::size_t fb = q.field_bytes();
  rank_order_sum(blocks, block_words, P, q.n, sum, status, [q, fb](const std::uint32_t* b, std::size_t i, float& v) {
    const auto* fields = reinterpret_cast<const unsigned char*>(b + header_words + q.nb);
    const std::uint32_t f = qsgd_read(fields, fb, i, q.w), l = f & ((1u << (q.w - 1)) - 1u);
    if (!l) return false;
    const float m = commpact::detail::qsgd_value(__uint_as_float(b[header_words + i / q.d]), l, q.s);
    v = (f >> (q.w - 1)) ? -m : m;
    return true;
  });
}

}  // namespace commpact::cuda_kernels::codec
