// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file frame_check.cuh
//! The device checks of a received sparse frame (wire/sparse_frame.hpp), as
//! sparse_wire::decode_header(frame, true) and sparse_wire::decode make them on the host,
//! split so that each consumer decides in its host twin's order: a header check in a
//! decision kernel (frame_head_dev; grid.cuh's decision_launch) and a grid check of the zero padding and the body (frame_scan_dev).
//! Shared by sparse_tree.cuh's absorb (tree_absorb), tree_begin.cuh (tree_begin) and
//! oktopk_begin.cuh (oktopk_begin); their results sit in an absorb_ctl in device memory.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/frame_check.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../../wire/sparse_frame.hpp"
#include "vector.cuh"

namespace commpact::cuda_kernels {

//! What a frame check found and its consumer decided (device memory: the merge workspace
//! of tree_absorb, the executor's scratch of tree_begin and oktopk_begin).
struct absorb_ctl {
  std::uint32_t skip, err, pad_bad, body_bad, ok, count, bad_sum;
  std::uint64_t expect;
  sparse_wire::header h;
};

namespace detail {

template <class T>
__device__ __forceinline__ T get_dev(const std::byte* p) {
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}

//! sparse_wire::decode_header(frame, true)'s structural checks (a decision's lane): err for a
//! frame shorter than the header, a bad magic or version, unknown flags, ranges that are
//! not ordered and non-negative, or a byte count above `bytes`; expect and h as read, the
//! rest zero.
__device__ __forceinline__ absorb_ctl frame_head_dev(const std::byte* f, std::size_t bytes) {
  absorb_ctl c{};
  if (bytes < sparse_wire::header_bytes) {
    c.err = 1;
    return c;
  }
  sparse_wire::header h;
  const auto mg = get_dev<std::uint32_t>(f);
  const auto ver = get_dev<std::uint16_t>(f + 4);
  h.flags = get_dev<std::uint16_t>(f + 6);
  h.count = get_dev<std::uint32_t>(f + 8);
  h.mask_bits = get_dev<std::uint32_t>(f + 12);
  h.n_min = get_dev<std::int64_t>(f + 16);
  h.n_max = get_dev<std::int64_t>(f + 24);
  h.k_min = get_dev<std::int64_t>(f + 32);
  h.k_max = get_dev<std::int64_t>(f + 40);
  const std::uint64_t expect = sparse_wire::header_bytes + sparse_wire::entry_bytes * std::uint64_t(h.count) +
                               (std::uint64_t(h.mask_bits) + 7) / 8;
  c.err = mg != sparse_wire::magic || ver != sparse_wire::version || (h.flags & ~sparse_wire::known_flags) != 0 ||
          !(0 <= h.n_min && h.n_min <= h.n_max && 0 <= h.k_min && h.k_min <= h.k_max) || expect > bytes;
  c.expect = expect;
  c.h = h;
  return c;
}

//! The zero padding (bytes from ctl->expect on) and the body's entries (indices in [0, n),
//! strictly increasing, values finite) of a frame that frame_head_dev found structurally
//! sound, by a grid of threads: faults are ORed into ctl->pad_bad and ctl->body_bad.
__device__ __forceinline__ void frame_scan_dev(const std::byte* f, std::size_t bytes, std::int64_t n,
                                               absorb_ctl* ctl) {
  const std::uint64_t expect = ctl->expect;
  const std::uint32_t count = ctl->h.count;
  const std::byte* pi = f + sparse_wire::header_bytes;
  const std::byte* pv = pi + 4 * std::size_t(count);
  bool pad = false, body = false;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t t = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; t < bytes; t += stride) {
    if (t >= expect) pad |= f[t] != std::byte{0};
    if (t < count) {
      const auto ix = get_dev<std::int32_t>(pi + 4 * t);
      body |= ix < 0 || ix >= n;
      if (t > 0) body |= ix <= get_dev<std::int32_t>(pi + 4 * (t - 1));
      body |= nonfinite(get_dev<float>(pv + 4 * t));
    }
  }
  if (pad) atomicOr(&ctl->pad_bad, 1u);
  if (body) atomicOr(&ctl->body_bad, 1u);
}

}  // namespace detail

}  // namespace commpact::cuda_kernels
