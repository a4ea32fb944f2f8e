// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file fixed_sum.cuh
//! The device side of kernels/fixed_sum.hpp's reduction shape: a node of 2048 children is
//! one block of 256 threads (lane t adds children t, t + 256, ... in order, then a tree in
//! shared memory), so the host's host_sum and these kernels add in the same order and get
//! the same bits. No atomics, nothing that depends on the grid.
//!
//! | entry | what it runs |
//! |---|---|
//! | segmented_sum(leaf, add, fin, nseg, d, d_last, scratch, s) | nseg sums, segment s over leaf(s d + i) for i < d (d_last for the last segment), one launch per level (levels(d): 1 up to 2048 values, 2 up to 2^22); blocks over (segment, node); the last level's thread 0 calls fin(s, value) |
//! | block_sum(n, leaf, add, sh) | one sum by the calling block, every level in turn (the nodes of a level in order, each pushed to the lane of the level above); the value to every thread |
//!
//! Leaves and additions are functors callable on the device (leaf(i) -> Acc, add(Acc, Acc)
//! -> Acc), written with one IEEE operation per step (kernels/exact.hpp) like the host's.
//! Only nvcc compiles this file.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/fixed_sum.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "../fixed_sum.hpp"

namespace commpact::cuda_kernels::fixed {

namespace fs = commpact::fixed_sum;

inline constexpr int block = static_cast<int>(fs::lanes);  //!< threads of every kernel here

//! lanes values of Acc in shared memory (raw storage: Acc may have member initialisers).
template <class Acc>
__device__ Acc* shared_lanes() {
  __shared__ alignas(Acc) unsigned char raw[fs::lanes * sizeof(Acc)];
  return reinterpret_cast<Acc*>(raw);
}

//! The lane tree of one node (fixed_sum.hpp): a[t] = add(a[t], a[t + h]) for h = 128 .. 1;
//! the node's value to every thread of the block. sh: shared_lanes<Acc>().
template <class Acc, class Add>
__device__ Acc block_tree(const Acc& mine, const Add& add, Acc* sh) {
  const unsigned t = threadIdx.x;
  sh[t] = mine;
  __syncthreads();
  for (unsigned h = fs::lanes / 2; h > 0; h /= 2) {
    if (t < h) sh[t] = add(sh[t], sh[t + h]);
    __syncthreads();
  }
  const Acc r = sh[0];
  __syncthreads();
  return r;
}

//! Lane t's part of a node of `count` children child(lo + i), i < count.
template <class Acc, class Child, class Add>
__device__ Acc lane_part(const Child& child, std::size_t lo, std::size_t count, const Add& add) {
  Acc a{};
#pragma unroll
  for (unsigned r = 0; r < fs::depth; ++r) {
    const std::size_t i = r * fs::lanes + threadIdx.x;
    if (i < count) a = add(a, child(lo + i));
  }
  return a;
}

//! The leaves of segment s at the first level: leaf(s d + i).
template <class Leaf>
struct flat_leaf {
  Leaf leaf;
  std::size_t d;
  __device__ auto operator()(std::size_t s, std::size_t i) const { return leaf(s * d + i); }
};
//! The leaves of segment s above the first level: the nodes of the level below.
template <class Acc>
struct partial_leaf {
  const Acc* p;
  std::size_t stride;
  __device__ Acc operator()(std::size_t s, std::size_t i) const { return p[s * stride + i]; }
};
//! leaf(s, i) for a fixed s, as a one-argument child.
template <class Leaf>
struct in_segment {
  const Leaf& leaf;
  std::size_t s;
  __device__ auto operator()(std::size_t i) const { return leaf(s, i); }
};

//! One level of segmented_sum: the nodes of every segment at this level (w_full children
//! per segment, w_last in the last), node j of segment s written to out[s parents(w_full)
//! + j], or, at the last level (one node per segment), fin(s, value).
template <class Acc, class Leaf, class Add, class Finish>
__global__ void __launch_bounds__(block) level_kernel(Leaf leaf, Add add, Finish fin, std::size_t nseg,
                                                      std::size_t w_full, std::size_t w_last, Acc* out) {
  Acc* sh = shared_lanes<Acc>();
  const std::size_t per = fs::parents(w_full), nodes = nseg * per;
  for (std::size_t b = blockIdx.x; b < nodes; b += gridDim.x) {  // uniform over the block
    const std::size_t s = b / per, j = b - s * per;
    const std::size_t w = s + 1 == nseg ? w_last : w_full;
    if (j >= fs::parents(w)) continue;  // the last segment may have fewer nodes
    const std::size_t lo = j * fs::chunk, count = w - lo < fs::chunk ? w - lo : fs::chunk;
    const Acc v = block_tree(lane_part<Acc>(in_segment<Leaf>{leaf, s}, lo, count, add), add, sh);
    if (threadIdx.x == 0) {
      if (per == 1)
        fin(s, v);
      else
        out[b] = v;
    }
  }
}

//! Items of Acc scratch segmented_sum(nseg, d) needs: the nodes of every level but the last.
inline std::size_t scratch_items(std::size_t nseg, std::size_t d) {
  std::size_t items = 0;
  for (std::size_t w = d; fs::parents(w) > 1; w = fs::parents(w)) items += nseg * fs::parents(w);
  return items;
}

inline unsigned level_grid(std::size_t nodes) {
  return static_cast<unsigned>(nodes < 1 ? 1 : nodes > 65535u * 16 ? 65535u * 16 : nodes);
}

//! nseg fixed-shape sums on stream s (see the file comment): segment s (< nseg) reduces
//! leaf(s d + i) for i < d, or i < d_last for the last one, with the levels of d; fin(s,
//! value) on the device at the end. scratch: scratch_items(nseg, d) values of Acc (none
//! when d <= 2048).
template <class Acc, class Leaf, class Add, class Finish>
cudaError_t segmented_sum(const Leaf& leaf, const Add& add, const Finish& fin, std::size_t nseg, std::size_t d,
                          std::size_t d_last, Acc* scratch, cudaStream_t s) {
  if (nseg == 0) return cudaSuccess;
  std::size_t per = fs::parents(d);
  level_kernel<Acc><<<level_grid(nseg * per), block, 0, s>>>(flat_leaf<Leaf>{leaf, d}, add, fin, nseg, d, d_last,
                                                              per == 1 ? nullptr : scratch);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess || per == 1) return err;
  std::size_t wf = per, wl = fs::parents(d_last);
  Acc* in = scratch;
  Acc* out = scratch + nseg * per;
  for (;;) {
    per = fs::parents(wf);
    level_kernel<Acc><<<level_grid(nseg * per), block, 0, s>>>(partial_leaf<Acc>{in, wf}, add, fin, nseg, wf, wl,
                                                                per == 1 ? nullptr : out);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess || per == 1) return err;
    in = out;
    out += nseg * per;
    wf = per;
    wl = fs::parents(wl);
  }
}

//! The fixed-shape sum of leaf(0), ..., leaf(n - 1) by the calling block (fs::lanes threads,
//! every one calling it alike), returned to every thread: the level-1 nodes in order, each
//! pushed to its lane of the open node of level 2 (child p to lane p % 256, in order), a
//! node reduced by the tree once its last child is in, and so on up: host_sum's tree,
//! evaluated bottom-up by one block. sh: shared_lanes<Acc>().
template <class Acc, class Leaf, class Add>
__device__ Acc block_sum(std::size_t n, const Leaf& leaf, const Add& add, Acc* sh) {
  const int L = fs::levels(n);
  std::size_t w[fs::max_levels + 1];
  w[0] = n;
  for (int l = 1; l <= L; ++l) w[l] = fs::parents(w[l - 1]);
  Acc up[fs::max_levels + 1];             // lane threadIdx.x of the open node of level l >= 2
  std::size_t pos[fs::max_levels + 1];    // children of that node pushed so far
  std::size_t node[fs::max_levels + 1];   // its index in level l
  for (int l = 0; l <= L; ++l) up[l] = Acc{}, pos[l] = 0, node[l] = 0;
  Acc root{};
  for (std::size_t c = 0; c < w[1]; ++c) {
    const std::size_t lo = c * fs::chunk, count = n - lo < fs::chunk ? n - lo : fs::chunk;
    Acc v = block_tree(lane_part<Acc>(leaf, lo, count, add), add, sh);
    int l = 2;
    for (; l <= L; ++l) {
      const std::size_t p = pos[l]++;
      if (threadIdx.x == p % fs::lanes) up[l] = add(up[l], v);
      const std::size_t lo_l = node[l] * fs::chunk;
      const std::size_t cl = w[l - 1] - lo_l < fs::chunk ? w[l - 1] - lo_l : fs::chunk;
      if (pos[l] < cl) break;  // the node waits for more children
      v = block_tree(up[l], add, sh);
      up[l] = Acc{}, pos[l] = 0, ++node[l];
    }
    if (l > L) root = v;
  }
  return root;
}

}  // namespace commpact::cuda_kernels::fixed
