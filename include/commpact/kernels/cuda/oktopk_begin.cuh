// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file oktopk_begin.cuh
//! The device twin of kernels/host/oktopk.hpp's host::oktopk::begin (SparseReduceScatter's
//! start from a codec's block, the row oktopk_begin of ops<cuda_space>, rows_oktopk.cuh).
//! It reuses frame_check.cuh's checks, as tree_begin does: frame_head_dev (size, magic,
//! version, flags, ranges, the byte count) and frame_scan_dev (zero padding; indices in
//! [0, n), strictly increasing; values finite) with the caller's n; a decision kernel
//! (grid.cuh's decision_launch) then decides in the host's order (a structural fault or other ranges or a mask:
//! status_rejected; a flagged frame: flagged_status; a count above the outputs or a bad
//! body: status_rejected) and a grid kernel installs the entries and the unused slots
//! (unused_index, +0), only when the frame was accepted: otherwise idx/val are untouched.
//!
//! Checked against its host twin by tests/cuda/test_cuda_rows_oktopk.cu (docs/cuda.md, "Status",
//! says where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/oktopk_begin.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../../wire/sparse_frame.hpp"
#include "../host/oktopk.hpp"
#include "../status.hpp"
#include "frame_check.cuh"
#include "vector.cuh"
#include "grid.cuh"

namespace commpact::cuda_kernels::oktopk {

__global__ void begin_head(const std::byte* f, std::size_t bytes, absorb_ctl* ctl) {
  if (!decision_lane()) return;
  *ctl = cuda_kernels::detail::frame_head_dev(f, bytes);
}

__global__ void begin_scan(const std::byte* f, std::size_t bytes, std::int64_t n, absorb_ctl* ctl) {
  if (ctl->err) return;
  cuda_kernels::detail::frame_scan_dev(f, bytes, n, ctl);
}

//! host::oktopk::begin's decisions, in its order; ctl->ok and ctl->count say what to
//! install. cap = min(idx.size(), val.size()) (the host's decode limit).
__global__ void begin_decide(absorb_ctl* ctl, std::int64_t n, std::int64_t k, std::size_t cap,
                             std::uint32_t* status) {
  if (!decision_lane()) return;
  absorb_ctl& c = *ctl;
  const sparse_wire::header h = c.h;
  c.ok = 0;
  c.count = 0;
  if (c.err || c.pad_bad || h.n_min != n || h.n_max != n || h.k_min != k || h.k_max != k || h.mask_bits != 0) {
    status[0] |= status_rejected;  // decode_header raised, or other ranges or a mask
    return;
  }
  if (h.flags) {
    status[0] |= commpact::host::oktopk::flagged_status(h.flags);
    return;
  }
  if (h.count > cap || c.body_bad) {  // decode raised
    status[0] |= status_rejected;
    return;
  }
  c.ok = 1;
  c.count = h.count;
}

//! idx/val = the frame's entries, then unused_index and +0 to their ends (ni, nv slots).
__global__ void begin_install(const absorb_ctl* ctl, const std::byte* f, std::int32_t* idx, std::size_t ni,
                              float* val, std::size_t nv) {
  if (!ctl->ok) return;
  using cuda_kernels::detail::get_dev;
  const std::size_t c = ctl->count, top = ni > nv ? ni : nv;
  const std::byte* pi = f + sparse_wire::header_bytes;
  const std::byte* pv = pi + 4 * c;
  for (const std::size_t j : cuda_kernels::grid_stride(top)) {
    if (j < ni) idx[j] = j < c ? get_dev<std::int32_t>(pi + 4 * j) : commpact::host::oktopk::unused_index;
    if (j < nv) val[j] = j < c ? get_dev<float>(pv + 4 * j) : 0.0f;
  }
}

//! host::oktopk::begin on stream s: the block f of `bytes` bytes (device) into idx (ni
//! slots) and val (nv slots); status (device) takes the bits; ctl is device scratch for
//! one absorb_ctl.
inline cudaError_t begin(const std::byte* f, std::size_t bytes, std::int64_t n, std::int64_t k, std::int32_t* idx,
                         std::size_t ni, float* val, std::size_t nv, std::uint32_t* status, absorb_ctl* ctl,
                         cudaStream_t s) {
  namespace kd = cuda_kernels::detail;
  const std::size_t top = ni > nv ? ni : nv;
  decision_launch(begin_head, s, f, bytes, ctl);
  if (bytes) begin_scan<<<kd::vec_grid(bytes), kd::vec_block, 0, s>>>(f, bytes, n, ctl);
  decision_launch(begin_decide, s, ctl, n, k, ni < nv ? ni : nv, status);
  if (top) begin_install<<<kd::vec_grid(top), kd::vec_block, 0, s>>>(ctl, f, idx, ni, val, nv);
  return cudaGetLastError();
}

}  // namespace commpact::cuda_kernels::oktopk
