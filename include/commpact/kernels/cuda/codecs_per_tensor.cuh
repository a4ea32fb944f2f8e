// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codecs_per_tensor.cuh
//! Device kernels of per_tensor<K> (device_codec<per_tensor<K>>,
//! compress/device_codecs_per_tensor.cuh): the framing of per_tensor's message (for
//! each tensor t a u32 length L_t, then its L_t bytes, no padding) around the frames K's
//! own kernels write. Tensor t's frame ("temp block": 48-byte header, word 2 the payload
//! length, then the payload) sits at word tb_off[t] of a workspace; these kernels move the
//! payloads between those word-aligned blocks and the byte-packed message.
//!
//! | kernel | what it does | equal to the host |
//! |---|---|---|
//! | per_tensor_scan | out_off[t] = sum over s < t of (4 + L_s), out_off[T] the message length (one block, cub::BlockScan) | - |
//! | per_tensor_pack | the message: L_t (little-endian) then tensor t's payload at out_off[t] (a byte per thread, a tensor per grid row) | bytes (per_tensor::encode) |
//! | per_tensor_walk | per_tensor::decode_add's framing checks, one thread per rank walking its lengths in order (every length within the bytes left, no trailing bytes): each tensor's offset and length, or 0 after a failure | the same blocks rejected (with per_tensor_unpack's length bound) |
//! | per_tensor_unpack | tensor t's message of every rank into a temp block of K's frame layout (header zero but word 2 = L_t); L_t above K's max_encoded_bytes sets status_wire (as the host) and leaves the block empty | bytes |
//!
//! Checked against its host twin by tests/cuda/test_cuda_codecs_more.cu (docs/cuda.md, "Status",
//! says where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/codecs_per_tensor.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>
#include <cstddef>
#include <cstdint>

#include "../status.hpp"
#include "codecs.cuh"
#include "grid.cuh"

namespace commpact::cuda_kernels::codec {

inline constexpr int per_tensor_scan_threads = 1024;

//! out_off[t] = the byte where tensor t's length goes (exclusive sum of 4 + L_s, L_s =
//! word 2 of temp block s); out_off[T] = the message length. One block of
//! per_tensor_scan_threads.
__global__ void __launch_bounds__(per_tensor_scan_threads)
    per_tensor_scan(const std::uint32_t* tmp, const std::uint64_t* tb_off, std::size_t T, std::uint32_t* out_off) {
  using scan = cub::BlockScan<std::uint32_t, per_tensor_scan_threads>;
  __shared__ typename scan::TempStorage ts;
  __shared__ std::uint32_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (std::size_t base = 0; base < T; base += per_tensor_scan_threads) {
    const std::size_t t = base + threadIdx.x;
    const std::uint32_t x = t < T ? 4u + tmp[tb_off[t] + 2] : 0u;
    std::uint32_t ex, total;
    scan(ts).ExclusiveSum(x, ex, total);
    if (t < T) out_off[t] = carry + ex;
    __syncthreads();  // every thread read carry (and ts is free again)
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) out_off[T] = carry;
}

//! out[out_off[t] + j] for j < 4 + L_t: the bytes of L_t, then temp block t's payload.
__global__ void per_tensor_pack(const std::uint32_t* tmp, const std::uint64_t* tb_off, std::size_t T,
                                const std::uint32_t* out_off, unsigned char* out) {
  for (std::size_t t = blockIdx.y; t < T; t += gridDim.y) {
    const std::uint32_t* tb = tmp + tb_off[t];
    const std::uint32_t L = tb[2];
    const auto* src = reinterpret_cast<const unsigned char*>(tb + header_words);
    unsigned char* dst = out + out_off[t];
    for (const std::size_t j : cuda_kernels::grid_stride(4 + std::size_t(L)))
      dst[j] = j < 4 ? static_cast<unsigned char>((L >> (8 * j)) & 0xFFu) : src[j - 4];
  }
}

//! The u32 at byte p (any alignment), little-endian.
__device__ inline std::uint32_t per_tensor_u32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

//! Rank r's framing (thread r): off[r T + t] = the byte of tensor t's message in the
//! payload, len[r T + t] = L_t, while every length fits in the bytes that remain; from a
//! failure on (and for every tensor when the payload does not fit the block) 0 and 0, and
//! status_wire; status_wire too when bytes remain after the last tensor.
__global__ void per_tensor_walk(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t T,
                                std::uint32_t* off, std::uint32_t* len, std::uint32_t* status) {
  for (const std::size_t r : cuda_kernels::grid_stride(P)) {
    const std::uint32_t* b = blocks + r * block_words;
    const auto* p = reinterpret_cast<const unsigned char*>(b + header_words);
    const std::size_t total = b[2];
    bool ok = total <= 4 * (block_words - header_words);
    std::size_t at = 0;
    for (std::size_t t = 0; t < T; ++t) {
      std::uint32_t o = 0, L = 0;
      if (ok) {
        const std::size_t left = total - at;
        if (left < 4) {
          ok = false;
        } else {
          L = per_tensor_u32(p + at);
          if (L > left - 4) ok = false, L = 0;
          else o = static_cast<std::uint32_t>(at + 4), at += 4 + std::size_t(L);
        }
      }
      off[r * T + t] = o;
      len[r * T + t] = L;
    }
    if (!ok || at != total) atomicOr(status, static_cast<std::uint32_t>(status_wire));
  }
}

//! Tensor t's message of every rank (thread over P * tbf words) into temp block r of tbf
//! words: the header zero but word 2 = L, then the L bytes, zero after them. L above mt
//! (K's max_encoded_bytes for the tensor) sets status_wire and leaves the block empty.
__global__ void per_tensor_unpack(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, std::size_t T,
                                  std::size_t t, const std::uint32_t* off, const std::uint32_t* len, std::size_t mt,
                                  std::uint32_t* tmp, std::size_t tbf, std::uint32_t* status) {
  for (const std::size_t x : cuda_kernels::grid_stride(P * tbf)) {
    const std::size_t r = x / tbf, w = x % tbf;
    const std::uint32_t L0 = len[r * T + t];
    const bool fits = L0 <= mt;
    if (!fits && w == 0) atomicOr(status, static_cast<std::uint32_t>(status_wire));
    const std::size_t L = fits ? L0 : 0;
    std::uint32_t word = 0;
    if (w < header_words) {
      word = w == 2 ? static_cast<std::uint32_t>(L) : 0u;
    } else {
      const auto* src = reinterpret_cast<const unsigned char*>(blocks + r * block_words + header_words) + off[r * T + t];
      const std::size_t o = 4 * (w - header_words);
      for (unsigned k = 0; k < 4; ++k)
        if (o + k < L) word |= static_cast<std::uint32_t>(src[o + k]) << (8 * k);
    }
    tmp[x] = word;
  }
}

}  // namespace commpact::cuda_kernels::codec
