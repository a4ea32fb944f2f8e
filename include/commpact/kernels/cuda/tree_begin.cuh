// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file tree_begin.cuh
//! The device twin of kernels/host/tree_block.hpp's host::tree::begin (TreeMerge's start
//! from a codec's block, the row tree_begin of ops<cuda_space>). It reuses
//! sparse_tree.cuh's frame checks (frame_check.cuh's, shared with oktopk_begin.cuh): a
//! decision kernel (grid.cuh's decision_launch) resets the meta and reads the header
//! (frame_head_dev: size, magic, version, flags, ranges, the byte count), absorb_scan
//! checks the zero padding and the body (indices in [0, n), strictly increasing; values
//! finite) with n taken from the block's own header; a decision kernel then
//! decides in the host's order and a grid kernel installs the entries as this rank's
//! original and current set, all alive. A malformed block sets status_wire, wire_peer =
//! self and flag_failed, exactly where the host's begin does.
//!
//! Checked against its host twin by tests/cuda/test_cuda_rows_cast_vote.cu (docs/cuda.md,
//! "Status", says where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/tree_begin.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "sparse_tree.cuh"

namespace commpact::cuda_kernels {

namespace detail {

//! A decision: meta = {} (the host's `m = {}`), ctl = the frame's header (frame_head_dev),
//! and m->n = the header's n_min when it is sound (absorb_scan checks the indices against
//! the n begin adopts).
__global__ void begin_head(sparse_tree_meta* m, const std::byte* f, std::size_t bytes, absorb_ctl* ctl) {
  if (!decision_lane()) return;
  sparse_tree_meta z{};
  const absorb_ctl c = frame_head_dev(f, bytes);
  if (!c.err) z.n = c.h.n_min;
  *m = z;
  *ctl = c;
}

//! host::tree::begin's decisions, in its order; ctl->ok and ctl->count say what to install.
__global__ void begin_decide(sparse_tree_meta* mp, absorb_ctl* ctl, int self, std::uint32_t kcap) {
  if (!decision_lane()) return;
  sparse_tree_meta& m = *mp;
  absorb_ctl& c = *ctl;
  c.ok = 0;
  auto malformed = [&] {
    m.status |= status_wire, m.wire_peer = self;
    m.cur.flags = static_cast<std::uint16_t>(m.cur.flags | sparse_wire::flag_failed);
    m.cur_count = m.mine_count = m.extra_count = 0;
  };
  if (c.err || c.pad_bad) {  // decode_header raised: ranges that merge harmlessly
    m = sparse_tree_meta{};
    malformed();
    return;
  }
  const sparse_wire::header h = c.h;
  m.n = h.n_min, m.k = h.k_min;
  m.cur = h;
  m.cur.count = 0, m.cur.mask_bits = 0;
  if (h.n_min != h.n_max || h.k_min != h.k_max || h.mask_bits != 0) return malformed();
  if (h.flags & sparse_wire::flag_nonfinite) m.status |= status_nonfinite;
  if (h.flags & ~sparse_wire::step_bits) return;  // flagged: empty
  const std::uint64_t k = m.k > 0 ? static_cast<std::uint64_t>(m.k) : 0;
  const std::uint64_t max_count = k < kcap ? k : kcap;
  if (h.count > max_count || c.body_bad) return malformed();
  c.ok = 1;
  c.count = h.count;
  m.mine_count = m.cur_count = h.count;
}

//! mine_idx = cur_idx = the entries' indices, cur_val their values, mine_alive = 1.
__global__ void begin_install(const absorb_ctl* ctl, const std::byte* f, tree_ptrs b) {
  if (!ctl->ok) return;
  const std::uint32_t c = ctl->count;
  const std::byte* pi = f + sparse_wire::header_bytes;
  const std::byte* pv = pi + 4 * std::size_t(c);
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x) {
    const auto ix = get_dev<std::int32_t>(pi + 4 * std::size_t(j));
    b.mine_idx[j] = ix;
    b.cur_idx[j] = ix;
    b.cur_val[j] = get_dev<float>(pv + 4 * std::size_t(j));
    b.mine_alive[j] = 1;
  }
}

}  // namespace detail

//! host::tree::begin on stream s: m (device) from the block f of `bytes` bytes; ctl is
//! device scratch for one absorb_ctl; kcap = mine_idx's capacity.
inline cudaError_t tree_begin(sparse_tree_meta* m, const std::byte* f, std::size_t bytes, int self, tree_ptrs b,
                              std::uint32_t kcap, absorb_ctl* ctl, cudaStream_t s) {
  decision_launch(detail::begin_head, s, m, f, bytes, ctl);
  if (bytes) detail::absorb_scan<<<detail::vec_grid(bytes), detail::vec_block, 0, s>>>(m, f, bytes, ctl);
  decision_launch(detail::begin_decide, s, m, ctl, self, kcap);
  detail::begin_install<<<detail::vec_grid(kcap), detail::vec_block, 0, s>>>(ctl, f, b);
  return cudaGetLastError();
}

}  // namespace commpact::cuda_kernels
