// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file fixed_sum.hpp
//! The fixed reduction shape shared by a host kernel and its CUDA twin: the order in
//! which n values are added, chosen so that a GPU adds them in parallel and the host
//! adds them in the same order, so both get the same bits. Used for the sums in double
//! of Gaussian-k's moments, DGC's clipping norm, sign_codec's and onebit_codec's scales,
//! QSGD's bucket norms and the Gram-Schmidt dot products of PowerSGD and PowerGossip.
//!
//! The shape. A node reduces up to `chunk` = 2048 children: lane t (of `lanes` = 256)
//! adds children t, t + 256, ..., t + 7 * 256 (those that exist) in that order to Acc{}
//! (zero), then the lanes combine as a tree: for w = 128, 64, ..., 1, a[t] = a[t] + a[t + w]
//! for t < w; the node's value is a[0]. Level 1 reduces the n values by chunks of 2048
//! (node j: values [2048 j, 2048 j + 2048)), level L + 1 reduces the nodes of level L the
//! same way, up to the level with a single node: levels(n) levels (1 for n <= 2048, 2 up
//! to 2^22, 3 up to 2^33). For n = 0 the value is Acc{}.
//!
//! On a device, a node is one block of 256 threads: coalesced loads, a tree in shared
//! memory, no atomics, nothing that depends on the grid (kernels/cuda/fixed_sum.cuh). On
//! the host, host_sum evaluates the same tree depth first, without allocating.
//!
//! The caller gives the leaf (value i as an Acc) and the addition, both written with one
//! IEEE operation per step (exact.hpp; exact_product below for a product that must not be
//! fused into an addition), so that both sides round alike.

#include <cstddef>
#include <cstdint>

#include "../config.hpp"
#include "exact.hpp"
#include "host/simd.hpp"

namespace commpact::fixed_sum {

inline constexpr std::size_t lanes = 256;            //!< accumulators of a node (a device block)
inline constexpr std::size_t depth = 8;              //!< children per lane
inline constexpr std::size_t chunk = lanes * depth;  //!< children per node
inline constexpr int max_levels = 6;                 //!< enough for any 64-bit count

//! The number of nodes of the level above `count` nodes: ceil(count / chunk), at least 1.
COMMPACT_HOST_DEVICE constexpr std::size_t parents(std::size_t count) {
  return count <= chunk ? 1 : (count + chunk - 1) / chunk;
}

//! The number of levels of the tree over n values: 1 for n <= chunk.
COMMPACT_HOST_DEVICE constexpr int levels(std::size_t n) {
  int l = 1;
  for (std::size_t w = parents(n); w > 1; w = parents(w)) ++l;
  return l;
}

//! double(a) double(b), rounded once and never fused into a following addition (an empty
//! asm on the host, __dmul_rn on the device).
COMMPACT_HOST_DEVICE inline double exact_product(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  double p = a * b;
  host::simd::opaque(p);
  return p;
#endif
}

//! The addition of doubles (exact::add), as a functor for host_sum and the device kernels.
struct add_double {
  COMMPACT_HOST_DEVICE double operator()(double a, double b) const { return exact::add(a, b); }
};

//! Two sums in double carried together (Gaussian-k's s and ss).
struct double2_sum {
  double a, b;
};
struct add_double2 {
  COMMPACT_HOST_DEVICE double2_sum operator()(double2_sum x, double2_sum y) const {
    return {exact::add(x.a, y.a), exact::add(x.b, y.b)};
  }
};

namespace detail {

//! Node j of level `level` (>= 1) of the tree whose level widths are w[0] (the leaves),
//! w[1], ...: its children are [j chunk, j chunk + chunk) of level - 1, below w[level - 1].
//! Lanes that hold no child are left out of the tree (the device adds their Acc{}): a
//! partial sum starts at +0 and so is never -0 (a sum is -0 only when both terms are), and
//! x + (+0) is x for every other x (a NaN stays a NaN), so the bits are the device's.
template <class Acc, class Leaf, class Add>
Acc node(int level, std::size_t j, const std::size_t* w, const Leaf& leaf, const Add& add) {
  Acc a[lanes];
  const std::size_t lo = j * chunk, count = w[level - 1] - lo < chunk ? w[level - 1] - lo : chunk;
  std::size_t live = count < lanes ? count : lanes;  // lanes holding a child
  for (std::size_t t = 0; t < live; ++t) a[t] = Acc{};
  if (level == 1) {
    for (std::size_t r = 0; r * lanes < count; ++r) {
      const std::size_t base = lo + r * lanes, m = count - r * lanes < lanes ? count - r * lanes : lanes;
      for (std::size_t t = 0; t < m; ++t) a[t] = add(a[t], leaf(base + t));
    }
  } else {
    for (std::size_t r = 0; r * lanes < count; ++r) {
      const std::size_t base = lo + r * lanes, m = count - r * lanes < lanes ? count - r * lanes : lanes;
      for (std::size_t t = 0; t < m; ++t) a[t] = add(a[t], node<Acc>(level - 1, base + t, w, leaf, add));
    }
  }
  if (live == 0) return Acc{};
  for (std::size_t h = lanes / 2; h > 0; h /= 2) {
    for (std::size_t t = 0; t < h && t + h < live; ++t) a[t] = add(a[t], a[t + h]);
    if (live > h) live = h;
  }
  return a[0];
}

}  // namespace detail

//! The sum of leaf(0), ..., leaf(n - 1) in the fixed shape (see the file comment), on the
//! host. `nlevels` > levels(n) adds levels of single nodes on top (a segment shorter than
//! its neighbours, reduced with their number of levels by a segmented device launch).
template <class Acc, class Leaf, class Add>
Acc host_sum(std::size_t n, const Leaf& leaf, const Add& add, int nlevels = 0) {
  std::size_t w[max_levels + 1];
  w[0] = n;
  int l = 0;
  do {
    w[l + 1] = parents(w[l]);
    ++l;
  } while (w[l] > 1 && l < max_levels);
  if (nlevels < l) nlevels = l;
  for (int k = l + 1; k <= nlevels && k <= max_levels; ++k) w[k] = 1;
  return detail::node<Acc>(nlevels, 0, w, leaf, add);
}

}  // namespace commpact::fixed_sum
