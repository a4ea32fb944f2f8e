// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codecs_natural.cuh
//! Device kernels of natural_codec (device_codec<natural_codec>,
//! compress/device_codecs_natural.cuh), with the host's per-element arithmetic
//! (detail::natural_field, natural_value, natural_field_ok in formulas/casts.hpp, on the float's
//! bits) and its random numbers (random_stream, counter-based: uniform(i) for element i,
//! replayed here; no sequential state, so one thread per byte draws what the host draws).
//!
//! | kernel | what it does | equal to the host |
//! |---|---|---|
//! | natural_pack | one thread per payload byte of the 9-bit fields (low bits first): every field that touches the byte; approx by the thread of the byte where the field starts | bytes |
//! | natural_validate, natural_add | natural_codec::decode_add's checks (length, no code 255, no sign on code 0, zero padding); sum[i] = 0 + the non-zero codes' values in rank order (__fadd_rn) | bits |
//!
//! Checked against its host twin by tests/cuda/test_cuda_codecs_more.cu (docs/cuda.md, "Status",
//! says where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/codecs_natural.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../formulas/bits.hpp"
#include "../formulas/casts.hpp"
#include "codecs.cuh"
#include "grid.cuh"

namespace commpact::cuda_kernels::codec {

inline constexpr unsigned natural_bits = 9;  //!< bits of one field: the sign and the exponent code

//! Payload bytes of n fields.
__host__ __device__ inline std::size_t natural_bytes(std::size_t n) { return (n * natural_bits + 7) / 8; }

//! bytes[B] = the bits [8B, 8B + 8) of the field stream; approx[i] (if not null) written
//! by the thread of the byte where field i starts.
__global__ void natural_pack(const float* v, std::size_t n, random_stream rng, unsigned char* bytes, float* approx) {
  const std::size_t nbytes = natural_bytes(n);
  for (const std::size_t B : cuda_kernels::grid_stride(nbytes)) {
    const std::size_t first = 8 * B / natural_bits, last = (8 * B + 7) / natural_bits;
    unsigned byte = 0;
    for (std::size_t i = first; i <= last && i < n; ++i) {
      const std::size_t start = i * natural_bits;  // bit where field i starts
      const std::uint32_t f = commpact::detail::natural_field(v[i], rng.uniform(i));
      if (approx && start / 8 == B) approx[i] = commpact::detail::natural_value(f);
      byte |= static_cast<unsigned>((start >= 8 * B ? f << (start - 8 * B) : f >> (8 * B - start)) & 0xFFu);
    }
    bytes[B] = static_cast<unsigned char>(byte);
  }
}

//! Field i of the stream at p (within `nbytes` bytes).
__device__ inline std::uint32_t natural_read(const unsigned char* p, std::size_t nbytes, std::size_t i) {
  const std::size_t start = i * natural_bits, B = start / 8;
  std::uint32_t x = p[B];
  if (B + 1 < nbytes) x |= static_cast<std::uint32_t>(p[B + 1]) << 8;
  return (x >> (start % 8)) & 0x1FFu;
}

//! Thread t over P * (n + 1): block r = t / (n + 1), item j: field j (j < n), or the
//! padding (j = n); the length once per block (a wrong length skips the rest).
__global__ void natural_validate(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t n,
                                 std::uint32_t* status) {
  const std::size_t per = n + 1, bytes = natural_bytes(n);
  for (const std::size_t t : cuda_kernels::grid_stride(P * per)) {
    const std::size_t r = t / per, j = t % per;
    const std::uint32_t* b = blocks + r * block_words;
    bool ok = b[2] == bytes && 4 * (block_words - header_words) >= bytes;
    if (ok) {
      const auto* p = reinterpret_cast<const unsigned char*>(b + header_words);
      if (j < n) ok = commpact::detail::natural_field_ok(natural_read(p, bytes, j));
      else if ((n * natural_bits) % 8 != 0) ok = (p[bytes - 1] >> ((n * natural_bits) % 8)) == 0u;
    } else if (j != 0) {
      continue;  // the length is reported once per block
    }
    if (!ok) atomicOr(status, static_cast<std::uint32_t>(status_wire));
  }
}

//! sum[i] = 0.0f + the value of every block's field i with a non-zero code, in rank order
//! (nothing once status_wire is set).
__global__ void natural_add(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t n,
                            float* sum, const std::uint32_t* status) {
  const std::size_t bytes = natural_bytes(n);
  rank_order_sum(blocks, block_words, P, n, sum, status, [bytes](const std::uint32_t* b, std::size_t i, float& v) {
    const std::uint32_t f = natural_read(reinterpret_cast<const unsigned char*>(b + header_words), bytes, i);
    if (f & 0xFFu) v = commpact::detail::natural_value(f);
    return (f & 0xFFu) != 0u;
  });
}

}  // namespace commpact::cuda_kernels::codec
