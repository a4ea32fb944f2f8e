// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codecs.cuh
//! Device kernels of the codecs (device_codec<Codec>,
//! compress/device_codecs.cuh): the frame around a payload and top-k's sparse
//! payload (k int32 indices strictly ascending, then k float32 values).
//!
//! Checked against its host twin by tests/cuda/test_cuda_codecs.cu (docs/cuda.md, "Status", says
//! where it has run).
//!
//! | kernel | what it does | equal to the host |
//! |---|---|---|
//! | frame_finish | writes the 48-byte header chosen by the status (nonfinite: flag set, payload 0) and zeroes the block after the payload | bytes (ops<host_space>::codec_encode_frame) |
//! | topk_validate | every entry of every block checked as topk_codec::decode_add does (length a multiple of 8, at most k entries, detail::sparse_index_ok, detail::finite_bits); a failure sets status_wire | the same blocks rejected |
//! | topk_add | sum[j] = __fadd_rn(sum[j], v) for one block, skipped once status_wire is set | bits (indices within a block are distinct, blocks run in rank order) |
//! | poison_on_wire | sum[0] = NaN when status_wire is set, so that mean_into leaves out untouched | - |
//! | sign_l1 | ||v||_1 in double in kernels/fixed_sum.hpp's shape (fixed_sum.cuh's segmented_sum: a block per node of 2048 values, one launch per level); scale = detail::sign_scale by the last level's thread 0 | bits (the host sums in the same shape) |
//! | sign_bits | detail::sign_byte per payload byte, approx = detail::sign_value | bytes |
//! | cast16_encode | code = detail::to_half / to_bf16 per value, approx = from_half / from_bf16 | bytes |
//! | cast16_validate, cast16_add | cast16_codec::decode_add's checks (length 2n, no Inf/NaN code); sum[i] = 0 + the decoded values in rank order (__fadd_rn) | bits |
//! | terngrad_absmax, terngrad_encode | m = max |v| (detail::terngrad_max, NaN skipped) by atomicMax on the bits; fields detail::terngrad_field with random_stream::uniform(i), four per byte | bytes (a maximum does not depend on the order) |
//! | terngrad_validate, terngrad_add | terngrad_codec::decode_add's checks (length, scale, no field 3, zero padding); sum[i] = 0 + the non-zero fields' values in rank order | bits |
//! | sign_validate, sign_add | sign_codec::decode_add's checks (length, detail::sign_scale_ok, detail::sign_tail_ok) per block; sum[i] = 0 + the blocks' values in rank order (__fadd_rn) | bits |
//!
//! Blocks are float storage; word w of a block is bytes [4w, 4w + 4), little-endian.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/codecs.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "../formulas/bits.hpp"
#include "../formulas/casts.hpp"
#include "../formulas/quantizers.hpp"
#include "../formulas/sign.hpp"
#include "../status.hpp"
#include "fixed_sum.cuh"
#include "grid.cuh"

namespace commpact::cuda_kernels::codec {

inline constexpr int block_threads = 256;
inline constexpr std::size_t header_words = 12;  //!< frame::header_bytes / 4

//! Blocks of block_threads for n items, at least one, at most 65535 * 8 (grid-stride loops).
inline unsigned grid_for(std::size_t n) {
  std::size_t g = (n + block_threads - 1) / block_threads;
  if (g == 0) g = 1;
  if (g > 65535u * 8) g = 65535u * 8;
  return static_cast<unsigned>(g);
}

//! A frame header as 12 words (frame::write's bytes).
struct header_words_t {
  std::uint32_t w[header_words];
};

//! block[0, 12) = (nonfinite ? bad : ok); the payload bytes at and after `payload` (0
//! when nonfinite) are zeroed up to the end of the block (nw words). With d_entries not
//! null the clean payload is entry_bytes * *d_entries bytes (a length known on the device
//! only, threshold_codec's), written into the header's payload word too.
__global__ void frame_finish(std::uint32_t* block, std::size_t nw, header_words_t ok, header_words_t bad,
                             std::uint32_t ok_payload, const std::uint32_t* status,
                             const std::uint32_t* d_entries = nullptr, std::uint32_t entry_bytes = 0) {
  const bool nonfinite = status != nullptr && (*status & status_nonfinite) != 0;
  // In 64 bits: entry_bytes * count wraps in 32 bits at 2^29 eight-byte entries. A length
  // the header's 32-bit word cannot hold saturates, so the receiver rejects the frame
  // (a payload above the block) instead of reading a wrapped, plausible length.
  const std::uint64_t clean64 = d_entries ? std::uint64_t{entry_bytes} * *d_entries : ok_payload;
  const std::uint32_t clean = clean64 > 0xFFFFFFFFull ? 0xFFFFFFFFu : static_cast<std::uint32_t>(clean64);
  const std::size_t payload = nonfinite ? 0 : static_cast<std::size_t>(clean64);
  for (const std::size_t w : cuda_kernels::grid_stride(nw)) {
    if (w < header_words) {
      block[w] = nonfinite ? bad.w[w] : (w == 2 ? clean : ok.w[w]);  // word 2: the payload bytes
      continue;
    }
    const std::size_t o = 4 * (w - header_words);  // payload byte of this word's first byte
    if (o >= payload) block[w] = 0u;
    else if (payload - o < 4) block[w] &= (1u << (8 * (payload - o))) - 1u;  // keep the payload's bytes
  }
}

//! Entry i of block r (thread t = r * cmax + i, cmax = entries a block can hold) checked
//! as topk_codec::decode_add checks it; the block's length once (i = 0). kk: the
//! receiver's k; n: its length.
__global__ void topk_validate(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t cmax,
                              std::uint64_t n, std::uint64_t kk, std::uint32_t* status) {
  const std::size_t per = cmax ? cmax : 1;
  for (const std::size_t t : cuda_kernels::grid_stride(P * per)) {
    const std::size_t r = t / per, i = t % per;
    const std::uint32_t* b = blocks + r * block_words;
    const std::uint32_t len = b[2];
    const std::size_t c = len / 8;
    if (len % 8 != 0 || c > kk || c > cmax) {
      if (i == 0) atomicOr(status, static_cast<std::uint32_t>(status_wire));
      continue;
    }
    if (i >= c) continue;
    const auto* idx = reinterpret_cast<const std::int32_t*>(b + header_words);
    const auto* val = reinterpret_cast<const float*>(b + header_words + c);
    const std::int64_t prev = i == 0 ? -1 : idx[i - 1];
    if (!commpact::detail::sparse_index_ok(idx[i], prev, n) || !commpact::detail::finite_bits(val[i]))
      atomicOr(status, static_cast<std::uint32_t>(status_wire));
  }
}

//! sum[idx[i]] += val[i] for the entries of one validated block (none once status_wire is set).
__global__ void topk_add(const std::uint32_t* block, std::size_t cmax, float* sum, const std::uint32_t* status) {
  if (*status & status_wire) return;
  const std::size_t c = block[2] / 8;
  const auto* idx = reinterpret_cast<const std::int32_t*>(block + header_words);
  const auto* val = reinterpret_cast<const float*>(block + header_words + c);
  for (const std::size_t i : cuda_kernels::grid_stride(c < cmax ? c : cmax)) {
    const auto j = static_cast<std::size_t>(idx[i]);
    sum[j] = __fadd_rn(sum[j], val[i]);
  }
}

//! sum[0] = NaN when status_wire is set (mean_into then flags the sum and leaves out untouched).
__global__ void poison_on_wire(float* sum, std::size_t n, const std::uint32_t* status) {
  if (!decision_lane()) return;
  if (n != 0 && (*status & status_wire)) sum[0] = __int_as_float(0x7FC00000);
}

// ---- sign_codec -----------------------------------------------------------------------

//! sign_codec's end of ||v||_1 (thread 0 of the sum's last level): *scale = detail::sign_scale(l1, n).
struct sign_scale_out {
  std::size_t n;
  float* scale;
  __device__ void operator()(std::size_t, double l1) const { *scale = commpact::detail::sign_scale(l1, n); }
};

//! Scratch (doubles) of sign_l1 for n values: none up to 2048.
inline std::size_t sign_l1_scratch(std::size_t n) { return fixed::scratch_items(1, n); }

//! *scale = detail::sign_scale(||v||_1, n): the sum in double in kernels/fixed_sum.hpp's shape.
inline cudaError_t sign_l1(const float* v, std::size_t n, float* scale, double* scratch, cudaStream_t s) {
  return fixed::segmented_sum(commpact::detail::sign_l1_leaf{v}, commpact::fixed_sum::add_double{},
                              sign_scale_out{n, scale}, 1, n, n, scratch, s);
}

//! bits[b] = detail::sign_byte(v, n, b) for the nb payload bytes; approx (if not null) the
//! decoded values with the scale at *scale.
__global__ void sign_bits(const float* v, std::size_t n, unsigned char* bits, std::size_t nb, float* approx,
                          const float* scale) {
  const float sc = *scale;
  for (const std::size_t b : cuda_kernels::grid_stride(nb)) {
    bits[b] = commpact::detail::sign_byte(v, n, b);
    if (approx)
      for (std::size_t i = 8 * b; i < 8 * b + 8 && i < n; ++i)
        approx[i] = commpact::detail::sign_value(commpact::detail::sign_negative(v[i]), sc);
  }
}

//! Block r's payload checked as sign_codec::decode_add does (thread r).
__global__ void sign_validate(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t n,
                              std::uint32_t* status) {
  const std::size_t bytes = 4 + (n + 7) / 8;
  for (const std::size_t r : cuda_kernels::grid_stride(P)) {
    const std::uint32_t* b = blocks + r * block_words;
    bool ok = b[2] == bytes && 4 * (block_words - header_words) >= bytes;
    if (ok) {
      const auto* p = reinterpret_cast<const unsigned char*>(b + header_words);
      ok = commpact::detail::sign_scale_ok(__uint_as_float(b[header_words])) &&
           commpact::detail::sign_tail_ok(n % 8 ? p[4 + n / 8] : 0u, n);
    }
    if (!ok) atomicOr(status, static_cast<std::uint32_t>(status_wire));
  }
}

//! The element loop of every dense decoder: sum[i] = 0.0f + v_r for r in rank order
//! (__fadd_rn), v_r the value block r gives element i when term(block r, i, v_r) returns
//! true (a block that gives none adds nothing), for every i < n. Nothing runs once
//! status_wire is set.
template <class Term>
__device__ void rank_order_sum(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t n,
                               float* sum, const std::uint32_t* status, Term term) {
  if (*status & status_wire) return;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) {
    float a = 0.0f;
    for (std::size_t r = 0; r < P; ++r) {
      float v;
      if (term(blocks + r * block_words, i, v)) a = __fadd_rn(a, v);
    }
    sum[i] = a;
  }
}

//! sum[i] = 0.0f + the value of bit i of every block, in rank order (nothing once status_wire is set).
__global__ void sign_add(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t n, float* sum,
                         const std::uint32_t* status) {
  rank_order_sum(blocks, block_words, P, n, sum, status, [](const std::uint32_t* b, std::size_t i, float& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(b + header_words);
    v = commpact::detail::sign_value((p[4 + i / 8] >> (i % 8)) & 1u, __uint_as_float(b[header_words]));
    return true;
  });
}

// ---- fp16_codec, bf16_codec ---------------------------------------------------------------

//! The 16-bit format: binary16 (Bf16 false) or bfloat16.
template <bool Bf16>
struct cast16 {
  static constexpr std::uint16_t exp_mask = Bf16 ? 0x7F80u : 0x7C00u;
  __device__ static std::uint16_t to(float v) { return Bf16 ? commpact::detail::to_bf16(v) : commpact::detail::to_half(v); }
  __device__ static float from(std::uint16_t h) {
    return Bf16 ? commpact::detail::from_bf16(h) : commpact::detail::from_half(h);
  }
};

//! code[i] = to(v[i]); approx[i] = from(code[i]) when approx is not null.
template <bool Bf16>
__global__ void cast16_encode(const float* v, std::size_t n, std::uint16_t* code, float* approx) {
  for (const std::size_t i : cuda_kernels::grid_stride(n)) {
    const std::uint16_t h = cast16<Bf16>::to(v[i]);
    code[i] = h;
    if (approx) approx[i] = cast16<Bf16>::from(h);
  }
}

//! Every block's length (2n) and codes (none of Inf or NaN), thread t over P * max(n, 1).
template <bool Bf16>
__global__ void cast16_validate(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t n,
                                std::uint32_t* status) {
  const std::size_t per = n ? n : 1;
  for (const std::size_t t : cuda_kernels::grid_stride(P * per)) {
    const std::size_t r = t / per, i = t % per;
    const std::uint32_t* b = blocks + r * block_words;
    if (b[2] != 2 * n || 4 * (block_words - header_words) < 2 * n) {
      if (i == 0) atomicOr(status, static_cast<std::uint32_t>(status_wire));
      continue;
    }
    if (i >= n) continue;
    const auto h = reinterpret_cast<const std::uint16_t*>(b + header_words)[i];
    if ((h & cast16<Bf16>::exp_mask) == cast16<Bf16>::exp_mask) atomicOr(status, static_cast<std::uint32_t>(status_wire));
  }
}

//! sum[i] = 0.0f + from(code of block r at i), r in rank order (nothing once status_wire is set).
template <bool Bf16>
__global__ void cast16_add(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t n,
                           float* sum, const std::uint32_t* status) {
  if (*status & status_wire) return;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) {
    float a = 0.0f;
    for (std::size_t r = 0; r < P; ++r)
      a = __fadd_rn(a, cast16<Bf16>::from(reinterpret_cast<const std::uint16_t*>(blocks + r * block_words +
                                                                                    header_words)[i]));
    sum[i] = a;
  }
}

// ---- terngrad_codec ---------------------------------------------------------------------

//! *m_bits = max over the bits of detail::terngrad_max(0, v[i]) (non-negative floats order
//! as their bits); *m_bits must hold 0 before.
__global__ void terngrad_absmax(const float* v, std::size_t n, std::uint32_t* m_bits) {
  float m = 0.0f;
  for (const std::size_t i : cuda_kernels::grid_stride(n))
    m = commpact::detail::terngrad_max(m, v[i]);
  atomicMax(m_bits, __float_as_uint(m));
}

//! The payload: the scale m (word 0), then byte b of the 2-bit fields of v[4b, 4b + 4);
//! approx (if not null) the decoded values.
__global__ void terngrad_encode(const float* v, std::size_t n, const std::uint32_t* m_bits, random_stream rng,
                                std::uint32_t* payload, float* approx) {
  const float m = __uint_as_float(*m_bits);
  auto* bytes = reinterpret_cast<unsigned char*>(payload + 1);
  const std::size_t nb = (2 * n + 7) / 8;
  if (blockIdx.x == 0 && threadIdx.x == 0) payload[0] = *m_bits;
  for (const std::size_t b : cuda_kernels::grid_stride(nb)) {
    unsigned byte = 0;
    for (unsigned t = 0; t < 4 && 4 * b + t < n; ++t) {
      const std::size_t i = 4 * b + t;
      const unsigned f = commpact::detail::terngrad_field(v[i], m, rng.uniform(i));
      byte |= f << (2 * t);
      if (approx) approx[i] = commpact::detail::terngrad_value(f, m);
    }
    bytes[b] = static_cast<unsigned char>(byte);
  }
}

//! Byte b of every block's fields (thread t over P * max(nb, 1)): length and scale once per
//! block (b = 0), no field 3, no bit set past the n fields.
__global__ void terngrad_validate(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t n,
                                  std::uint32_t* status) {
  const std::size_t nb = (2 * n + 7) / 8, per = nb ? nb : 1, bytes = 4 + nb;
  for (const std::size_t t : cuda_kernels::grid_stride(P * per)) {
    const std::size_t r = t / per, b = t % per;
    const std::uint32_t* w = blocks + r * block_words;
    if (w[2] != bytes || 4 * (block_words - header_words) < bytes) {
      if (b == 0) atomicOr(status, static_cast<std::uint32_t>(status_wire));
      continue;
    }
    bool ok = b != 0 || commpact::detail::sign_scale_ok(__uint_as_float(w[header_words]));
    if (b < nb) {
      const unsigned byte = reinterpret_cast<const unsigned char*>(w + header_words + 1)[b];
      for (unsigned f = 0; f < 4; ++f) {
        const unsigned field = (byte >> (2 * f)) & 3u;
        if (4 * b + f < n) ok = ok && field != 3u;
        else ok = ok && field == 0u;  // padding
      }
    }
    if (!ok) atomicOr(status, static_cast<std::uint32_t>(status_wire));
  }
}

//! sum[i] = 0.0f + the value of every block's non-zero field i, in rank order (nothing
//! once status_wire is set).
__global__ void terngrad_add(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t n,
                             float* sum, const std::uint32_t* status) {
  rank_order_sum(blocks, block_words, P, n, sum, status, [](const std::uint32_t* w, std::size_t i, float& v) {
    const unsigned f = (reinterpret_cast<const unsigned char*>(w + header_words + 1)[i / 4] >> (2 * (i % 4))) & 3u;
    if (f) v = commpact::detail::terngrad_value(f, __uint_as_float(w[header_words]));
    return f != 0u;
  });
}

}  // namespace commpact::cuda_kernels::codec
