// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sparse_tree.cuh
//! gTop-k's data plane on the GPU: the device twins of kernels/host/sparse_tree.hpp's
//! local, payload, absorb, scatter and zero_delivered, and of host::sparse_merge_topk.
//! The step's meta (sparse_tree_meta) lives in device memory; every decision that
//! depends on data (a non-finite value, a malformed frame, ranks that disagree) is taken
//! by a decision kernel on the device (grid.cuh's decision_launch: one warp, lane 0), in
//! the host's order, and recorded in the meta's flags and status bits: nothing
//! synchronises the host and nothing throws.
//!
//! Checked against its host twin by tests/cuda/test_cuda_ops.cu (docs/cuda.md, "Status", says
//! where it has run).
//!
//! The sparse merge (host::sparse_merge_topk's twin) is sparse_merge.cuh's.
//!
//! Absorb (host::tree::absorb): a decision kernel checks the header (size, magic,
//! version, flags, ranges, the byte count), a grid kernel the zero padding and the body
//! (indices in [0, n) and strictly increasing, values finite), a decision kernel then
//! decides in the host's order: a structural fault is a wire error; else the ranges and
//! flags merge into the meta; an unhealthy step is abandoned (poisoned); else the body's
//! faults, the count against k and the mask length and stray bits are wire errors. A wire
//! error sets status_wire, wire_peer and flag_failed and poisons the counts, as the host.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/sparse_tree.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../../concepts/tree_schedule.hpp"
#include "../../wire/sparse_frame.hpp"
#include "../host/sparse_tree.hpp"
#include "../status.hpp"
#include "frame_check.cuh"
#include "select.cuh"
#include "sparse_merge.cuh"
#include "vector.cuh"
#include "grid.cuh"

namespace commpact::cuda_kernels {

//! Raw device pointers of the tree's buffers (sparse_tree_views), kcap entries each.
struct tree_ptrs {
  std::int32_t *mine_idx, *cur_idx, *oth_idx, *out_idx, *extra_idx;
  float *cur_val, *oth_val, *out_val;
  std::uint8_t *mine_alive, *extra_alive, *mask_in;
  std::uint32_t kcap;
};

namespace detail {

__device__ __forceinline__ bool healthy_dev(const sparse_tree_meta& m) {
  const auto& c = m.cur;
  return (c.flags & ~sparse_wire::step_bits) == 0 && sparse_wire::one_step(c.flags) && c.n_min == m.n &&
         c.n_max == m.n && c.k_min == m.k && c.k_max == m.k;
}
__device__ __forceinline__ void poison_dev(sparse_tree_meta& m) { m.cur_count = m.mine_count = m.extra_count = 0; }
__device__ __forceinline__ void wire_dev(sparse_tree_meta& m, int peer) {
  m.status |= status_wire;
  m.wire_peer = peer;
  m.cur.flags = static_cast<std::uint16_t>(m.cur.flags | sparse_wire::flag_failed);
  poison_dev(m);
}
__device__ __forceinline__ void merge_meta_dev(sparse_wire::header& a, const sparse_wire::header& o) {
  a.flags = static_cast<std::uint16_t>(a.flags | o.flags);
  a.n_min = o.n_min < a.n_min ? o.n_min : a.n_min;
  a.n_max = o.n_max > a.n_max ? o.n_max : a.n_max;
  a.k_min = o.k_min < a.k_min ? o.k_min : a.k_min;
  a.k_max = o.k_max > a.k_max ? o.k_max : a.k_max;
}

__global__ void local_begin(sparse_tree_meta* m, std::int64_t n, std::int64_t k, std::uint16_t flags) {
  if (!decision_lane()) return;
  sparse_tree_meta z{};
  z.n = n, z.k = k;
  z.cur.n_min = z.cur.n_max = n;
  z.cur.k_min = z.cur.k_max = k;
  z.cur.flags = flags;
  *m = z;
}

//! After the accumulate and the selection: a non-finite acc flags the step, else the
//! selection becomes this rank's original and current set.
__global__ void local_end(sparse_tree_meta* m, tree_ptrs b, std::uint32_t k) {
  const bool bad = (m->status & status_nonfinite) != 0;
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < k; j += gridDim.x * blockDim.x) {
    if (bad) break;
    b.cur_idx[j] = b.mine_idx[j];
    b.mine_alive[j] = 1;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (bad) {
      m->cur.flags = static_cast<std::uint16_t>(m->cur.flags | sparse_wire::flag_nonfinite);
    } else {
      m->mine_count = m->cur_count = k;
    }
  }
}

//! The frame of host::tree::payload, byte by byte (frames are small: 48 + 8k bytes).
__global__ void payload_kernel(const sparse_tree_meta* mp, bool unfold_send, std::byte* frame, std::size_t bytes,
                               tree_ptrs b) {
  const sparse_tree_meta& m = *mp;
  const bool ok = healthy_dev(m);
  const std::uint32_t c = ok ? m.cur_count : 0;
  const std::uint32_t mb = (unfold_send && ok) ? m.extra_count : 0;
  const std::size_t e_idx = sparse_wire::header_bytes + 4 * std::size_t(c), e_val = e_idx + 4 * std::size_t(c);
  const std::size_t e_mask = e_val + (mb + 7) / 8;
  for (const std::size_t t : cuda_kernels::grid_stride(bytes)) {
    unsigned char v = 0;
    if (t < sparse_wire::header_bytes) {
      unsigned char h[sparse_wire::header_bytes];
      const std::uint32_t magic = sparse_wire::magic;
      const std::uint16_t ver = sparse_wire::version, fl = m.cur.flags;
      memcpy(h + 0, &magic, 4);
      memcpy(h + 4, &ver, 2);
      memcpy(h + 6, &fl, 2);
      memcpy(h + 8, &c, 4);
      memcpy(h + 12, &mb, 4);
      memcpy(h + 16, &m.cur.n_min, 8);
      memcpy(h + 24, &m.cur.n_max, 8);
      memcpy(h + 32, &m.cur.k_min, 8);
      memcpy(h + 40, &m.cur.k_max, 8);
      v = h[t];
    } else if (t < e_idx) {
      const std::size_t o = t - sparse_wire::header_bytes;
      const std::int32_t x = b.cur_idx[o / 4];
      v = reinterpret_cast<const unsigned char*>(&x)[o % 4];
    } else if (t < e_val) {
      const std::size_t o = t - e_idx;
      const float x = b.cur_val[o / 4];
      v = reinterpret_cast<const unsigned char*>(&x)[o % 4];
    } else if (t < e_mask) {
      const std::size_t e = (t - e_val) * 8;
      for (std::size_t q = 0; q < 8 && e + q < mb; ++q)
        if (b.extra_alive[e + q]) v = static_cast<unsigned char>(v | (1u << q));
    }
    frame[t] = static_cast<std::byte>(v);
  }
}

__global__ void absorb_head(const sparse_tree_meta* m, const std::byte* f, std::size_t bytes, absorb_ctl* ctl) {
  if (!decision_lane()) return;
  if (m->status & status_wire) {
    absorb_ctl c{};
    c.skip = 1;
    *ctl = c;
    return;
  }
  *ctl = frame_head_dev(f, bytes);
}

//! frame_scan_dev of a structurally sound frame, n = the meta's.
__global__ void absorb_scan(const sparse_tree_meta* m, const std::byte* f, std::size_t bytes, absorb_ctl* ctl) {
  if (ctl->skip || ctl->err) return;
  frame_scan_dev(f, bytes, m->n, ctl);
}

__global__ void absorb_decide(sparse_tree_meta* m, absorb_ctl* ctl, const std::byte* f, bool unfold_recv, int peer,
                              std::uint32_t kcap) {
  if (!decision_lane()) return;
  absorb_ctl& c = *ctl;
  c.ok = 0;
  const std::uint32_t count = c.h.count;
  c.count = 0;
  if (c.skip) return;
  if (c.err || c.pad_bad) {
    wire_dev(*m, peer);
    return;
  }
  merge_meta_dev(m->cur, c.h);
  if (!healthy_dev(*m)) {
    poison_dev(*m);
    return;
  }
  const std::uint32_t want_mask = unfold_recv ? m->mine_count : 0;
  bool bad = c.h.n_min != m->n || c.h.n_max != m->n || std::int64_t(count) > m->k || count > kcap ||
             c.h.mask_bits != want_mask || c.h.mask_bits > kcap || c.body_bad;
  const std::uint32_t mask_bytes = (c.h.mask_bits + 7) / 8;
  if (!bad && mask_bytes && (c.h.mask_bits % 8) != 0) {
    const auto last = static_cast<unsigned>(f[sparse_wire::header_bytes + 8 * std::size_t(count) + mask_bytes - 1]);
    bad = (last >> (c.h.mask_bits % 8)) != 0;
  }
  if (bad) {
    wire_dev(*m, peer);
    return;
  }
  c.ok = 1;
  c.count = count;
}

//! Decodes a validated frame into oth_idx / oth_val / mask_in (as sparse_wire::decode).
__global__ void absorb_decode(const absorb_ctl* ctl, const std::byte* f, tree_ptrs b) {
  if (!ctl->ok) return;
  const std::uint32_t c = ctl->count, mb = ctl->h.mask_bits;
  const std::byte* pi = f + sparse_wire::header_bytes;
  const std::byte* pv = pi + 4 * std::size_t(c);
  const std::byte* pm = pv + 4 * std::size_t(c);
  const std::uint32_t top = c > mb ? c : mb;
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < top; j += gridDim.x * blockDim.x) {
    if (j < c) {
      b.oth_idx[j] = get_dev<std::int32_t>(pi + 4 * std::size_t(j));
      b.oth_val[j] = get_dev<float>(pv + 4 * std::size_t(j));
    }
    if (j < mb) b.mask_in[j] = static_cast<std::uint8_t>((static_cast<unsigned>(pm[j / 8]) >> (j % 8)) & 1u);
  }
}

//! unfold_recv: the result becomes the current set (its count by thread 0); the mask
//! gives this rank's survivors.
__global__ void absorb_unfold(sparse_tree_meta* m, const absorb_ctl* ctl, tree_ptrs b) {
  if (!ctl->ok) return;
  const std::uint32_t c = ctl->count, mc = m->mine_count;
  if (blockIdx.x == 0 && threadIdx.x == 0) m->cur_count = c;  // no thread reads it here
  const std::uint32_t top = c > mc ? c : mc;
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < top; j += gridDim.x * blockDim.x) {
    if (j < c) {
      b.cur_idx[j] = b.oth_idx[j];
      b.cur_val[j] = b.oth_val[j];
    }
    if (j < mc) b.mine_alive[j] = b.mask_in[j];
  }
}

//! fold_recv: the extra rank's set is kept as its original entries, all alive.
__global__ void absorb_fold(sparse_tree_meta* m, const absorb_ctl* ctl, tree_ptrs b) {
  if (!ctl->ok) return;
  const std::uint32_t c = ctl->count;
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x) {
    b.extra_idx[j] = b.oth_idx[j];
    b.extra_alive[j] = 1;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) m->extra_count = c;
}

// ---- the sparse merge --------------------------------------------------------------

//! Number of entries of s[0, n) below x (Strict) or at most x.
template <bool Strict>
__device__ __forceinline__ std::uint32_t rank_in(const std::int32_t* s, std::uint32_t n, std::int32_t x) {
  std::uint32_t lo = 0, hi = n;
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (Strict ? s[mid] < x : s[mid] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

//! After a merge: out -> cur, the alive flags of mine and extra, and the finiteness of
//! the merged values (summed into ctl->bad_sum).
__global__ void absorb_after_merge(sparse_tree_meta* m, absorb_ctl* ctl, const std::uint32_t* merged_p, tree_ptrs b) {
  if (!ctl->ok) return;
  const std::uint32_t merged = *merged_p, mc = m->mine_count, ec = m->extra_count;
  std::uint32_t top = merged > mc ? merged : mc;
  top = top > ec ? top : ec;
  bool bad = false;
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < top; j += gridDim.x * blockDim.x) {
    if (j < merged) bad |= nonfinite(b.out_val[j]);
    // Alive tracking reads the merged set in out_idx (the host copies it to cur first).
    if (j < mc) {
      const std::int32_t x = b.mine_idx[j];
      const std::uint32_t r = rank_in<true>(b.out_idx, merged, x);
      if (!(r < merged && b.out_idx[r] == x)) b.mine_alive[j] = 0;
    }
    if (j < ec) {
      const std::int32_t x = b.extra_idx[j];
      const std::uint32_t r = rank_in<true>(b.out_idx, merged, x);
      if (!(r < merged && b.out_idx[r] == x)) b.extra_alive[j] = 0;
    }
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(&ctl->bad_sum, 1u);
}
__global__ void absorb_copy_out(const absorb_ctl* ctl, const std::uint32_t* merged_p, tree_ptrs b) {
  if (!ctl->ok) return;
  const std::uint32_t merged = *merged_p;
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < merged; j += gridDim.x * blockDim.x) {
    b.cur_idx[j] = b.out_idx[j];
    b.cur_val[j] = b.out_val[j];
  }
}
__global__ void absorb_finish(sparse_tree_meta* m, const absorb_ctl* ctl, const std::uint32_t* merged_p) {
  if (!decision_lane()) return;
  if (!ctl->ok) return;
  m->cur_count = *merged_p;
  if (ctl->bad_sum) {
    m->cur.flags = static_cast<std::uint16_t>(m->cur.flags | sparse_wire::flag_nonfinite);
    m->status |= status_nonfinite;
    poison_dev(*m);
  }
}

__global__ void tree_scatter_zero(const sparse_tree_meta* m, float* out, std::size_t n) {
  if (!healthy_dev(*m) || (m->status & status_wire)) return;
  for (const std::size_t i : cuda_kernels::grid_stride(n))
    out[i] = 0.0f;
}
__global__ void tree_scatter_values(const sparse_tree_meta* m, float* out, std::size_t n, tree_ptrs b, int P) {
  if (!healthy_dev(*m) || (m->status & status_wire)) return;
  const std::uint32_t c = m->cur_count;
  const float d = static_cast<float>(P);
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < c && j < b.kcap; j += gridDim.x * blockDim.x) {
    const std::int32_t i = b.cur_idx[j];
    if (i >= 0 && static_cast<std::size_t>(i) < n) out[i] = __fdiv_rn(b.cur_val[j], d);
  }
}
__global__ void tree_zero_delivered_kernel(const sparse_tree_meta* m, float* residual, float* velocity, std::size_t n,
                                           tree_ptrs b) {
  const std::uint32_t c = m->mine_count;
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < c && j < b.kcap; j += gridDim.x * blockDim.x) {
    if (!b.mine_alive[j]) continue;
    const std::int32_t i = b.mine_idx[j];
    if (i < 0 || static_cast<std::size_t>(i) >= n) continue;
    residual[i] = 0.0f;
    if (velocity) velocity[i] = 0.0f;
  }
}
//! TreeMerge: status[0] |= the merge's outcome, as host::tree::status (kernels/host/tree_block.hpp). A decision.
__global__ void tree_status_kernel(const sparse_tree_meta* m, std::uint32_t* status) {
  if (!decision_lane()) return;
  std::uint32_t s = m->status & status_wire;
  if (m->cur.flags & sparse_wire::flag_nonfinite) s |= status_nonfinite;
  if ((m->cur.flags & sparse_wire::flag_failed) || (!healthy_dev(*m) && !(s & status_nonfinite))) s |= status_rejected;
  status[0] |= s;
}

}  // namespace detail

}  // namespace commpact::cuda_kernels
