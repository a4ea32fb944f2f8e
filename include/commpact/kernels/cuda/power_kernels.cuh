// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file power_kernels.cuh
//! The kernels of PowerCompressor's and PowerGossip's rows of ops<cuda_space>
//! (rows_power.cuh). Each reproduces its host twin's arithmetic order exactly, one IEEE
//! operation per step (__fadd_rn, __fmul_rn, __dadd_rn, __dmul_rn: never fused into an
//! FMA), so results are the host's bits:
//!
//! - project (host::detail::row_dots): 8 lanes per row of M; lane l sums the products of
//!   columns j = l, l + 8, ... < m - m % 8 in increasing j; the lanes combine as
//!   ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)) by shuffles (a + b is b + a
//!   exactly), then lane 0 adds the last m % 8 products in increasing j.
//! - back_project (host::detail::back_cols): the host's tree, a level per launch. First
//!   level: a thread per (column j of M, chunk of back_chunk = 128 rows), the chunk's
//!   products added in increasing row order from 0 (reads of a row coalesced over j);
//!   each level above: a thread per (output, group of 128 consecutive sums), added in
//!   order from 0. The sums of a level below the top go to the executor's scratch.
//! - approx: one thread per element, the r products summed in increasing c.
//! - orthonormalize: host::orthonormalize_columns in one thread block: every dot product
//!   is summed by the block in kernels/fixed_sum.hpp's shape (fixed_sum.cuh's block_sum,
//!   host::gs_dot_leaf, as the host), the updates and scalings spread over the block
//!   (gs_sub / gs_scale, shared with the host loop).
//! - gaussian: host::gaussian_pair per pair of values (shared with the host loop).
//!
//! Checked against its host twin by tests/cuda/test_cuda_rows_power.cu (docs/cuda.md, "Status",
//! says where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/power_kernels.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../host/orthogonalize.hpp"
#include "../host/power_gossip.hpp"
#include "../status.hpp"
#include "fixed_sum.cuh"
#include "vector.cuh"
#include "grid.cuh"

namespace commpact::cuda_kernels::power_detail {

inline constexpr int ortho_block = fixed::block;  //!< threads of the one-block orthonormalisation

using cuda_kernels::detail::nonfinite;
using cuda_kernels::detail::vec_block;
using cuda_kernels::detail::vec_grid;

__device__ __forceinline__ bool words_clear(const std::uint32_t* st, std::size_t words) {
  for (std::size_t w = 0; w < words; ++w)
    if (st[w] != 0) return false;
  return true;
}
//! gossip::clear: words[0] = words[2] = 0.
__device__ __forceinline__ bool gossip_clear(const std::int64_t* w) { return w[0] == 0 && w[2] == 0; }

__global__ void check_finite_kernel(const float* v, std::size_t n, std::uint32_t* status) {
  bool bad = false;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) bad |= nonfinite(v[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(status, static_cast<std::uint32_t>(status_nonfinite));
}

__global__ void copy_if_clear_kernel(const float* src, float* dst, std::size_t n, const std::uint32_t* st,
                                     std::size_t words) {
  if (!words_clear(st, words)) return;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) dst[i] = src[i];
}

//! Rows of M per block of project_kernel (8 lanes each).
inline constexpr int project_rows = vec_block / 8;

//! P[:, 0..W) = M Q[:, 0..W) (see the file comment). With res, M = g + res (written);
//! else M = g (written when M is not g, and when write_m).
template <int W>
__global__ void __launch_bounds__(vec_block) project_kernel(const float* g, const float* res, float* M, bool write_m,
                                                            std::size_t n, std::size_t m, const float* q, float* p) {
  const unsigned lane = threadIdx.x % 8;
  const std::size_t m8 = m - m % 8;
  for (std::size_t base = blockIdx.x * std::size_t(project_rows); base < n;
       base += std::size_t(gridDim.x) * project_rows) {
    const std::size_t i = base + threadIdx.x / 8;
    const bool active = i < n;
    float s[W];
#pragma unroll
    for (int c = 0; c < W; ++c) s[c] = 0.0f;
    if (active) {
      const float* gr = g + i * m;
      const float* rr = res ? res + i * m : nullptr;
      float* mr = M + i * m;
      for (std::size_t j = lane; j < m8; j += 8) {
        const float a = rr ? __fadd_rn(gr[j], rr[j]) : gr[j];
        if (write_m) mr[j] = a;
#pragma unroll
        for (int c = 0; c < W; ++c) s[c] = __fadd_rn(s[c], __fmul_rn(a, q[static_cast<std::size_t>(c) * m + j]));
      }
    }
#pragma unroll
    for (int c = 0; c < W; ++c) {
      s[c] = __fadd_rn(s[c], __shfl_xor_sync(0xffffffffu, s[c], 4));
      s[c] = __fadd_rn(s[c], __shfl_xor_sync(0xffffffffu, s[c], 2));
      s[c] = __fadd_rn(s[c], __shfl_xor_sync(0xffffffffu, s[c], 1));
    }
    if (active && lane == 0) {
      const float* gr = g + i * m;
      const float* rr = res ? res + i * m : nullptr;
      float* mr = M + i * m;
      for (std::size_t j = m8; j < m; ++j) {
        const float a = rr ? __fadd_rn(gr[j], rr[j]) : gr[j];
        if (write_m) mr[j] = a;
#pragma unroll
        for (int c = 0; c < W; ++c) s[c] = __fadd_rn(s[c], __fmul_rn(a, q[static_cast<std::size_t>(c) * m + j]));
      }
#pragma unroll
      for (int c = 0; c < W; ++c) p[static_cast<std::size_t>(c) * n + i] = s[c];
    }
  }
}

//! back_project's first level for the columns P[:, 0..W): the sum of chunk k (rows
//! [128 k, 128 k + 128) below n, in increasing order from 0) of M[i, j] P[i, c] into
//! out[k W m + c m + j], or into q[c m + j] when there is one chunk. blockIdx.x: 256
//! columns; blockIdx.y and up: chunks.
template <int W>
__global__ void __launch_bounds__(vec_block)
    back_chunk_kernel(const float* M, std::size_t n, std::size_t m, const float* p, float* out) {
  constexpr std::size_t R = host::detail::back_chunk;
  const std::size_t j = blockIdx.x * std::size_t(vec_block) + threadIdx.x, chunks = n > R ? (n + R - 1) / R : 1;
  if (j >= m) return;
  for (std::size_t k = blockIdx.y; k < chunks; k += gridDim.y) {
    float acc[W];
#pragma unroll
    for (int c = 0; c < W; ++c) acc[c] = 0.0f;
    const std::size_t i1 = (k + 1) * R < n ? (k + 1) * R : n;
    for (std::size_t i = k * R; i < i1; ++i) {
      const float a = M[i * m + j];
#pragma unroll
      for (int c = 0; c < W; ++c) acc[c] = __fadd_rn(acc[c], __fmul_rn(a, p[static_cast<std::size_t>(c) * n + i]));
    }
#pragma unroll
    for (int c = 0; c < W; ++c) out[(k * W + static_cast<std::size_t>(c)) * m + j] = acc[c];
  }
}

//! back_project's level above `count` sums of wm floats each (in[s wm + x]): node g is the
//! sum of sums [128 g, 128 g + 128) below count, in order from 0, into out[g wm + x].
//! blockIdx.x: 256 of the wm outputs; blockIdx.y and up: nodes.
__global__ void __launch_bounds__(vec_block)
    back_combine_kernel(const float* in, std::size_t count, std::size_t wm, float* out) {
  constexpr std::size_t R = host::detail::back_chunk;
  const std::size_t x = blockIdx.x * std::size_t(vec_block) + threadIdx.x, nodes = (count + R - 1) / R;
  if (x >= wm) return;
  for (std::size_t g = blockIdx.y; g < nodes; g += gridDim.y) {
    float acc = 0.0f;
    const std::size_t s1 = (g + 1) * R < count ? (g + 1) * R : count;
    for (std::size_t s = g * R; s < s1; ++s) acc = __fadd_rn(acc, in[s * wm + x]);
    out[g * wm + x] = acc;
  }
}

//! Floats of scratch back_project needs for n rows, m columns and W columns of P at a
//! time: the sums of every level below the top (none for n <= back_chunk).
inline std::size_t back_scratch_floats(std::size_t n, std::size_t m, std::size_t W) {
  constexpr std::size_t R = host::detail::back_chunk;
  std::size_t f = 0;
  for (std::size_t w = (n + R - 1) / R; w > 1; w = (w + R - 1) / R) f += w * W * m;
  return f;
}

inline dim3 back_grid(std::size_t cols, std::size_t nodes) {
  const std::size_t x = (cols + vec_block - 1) / vec_block;
  return dim3(static_cast<unsigned>(x < 1 ? 1 : x), static_cast<unsigned>(nodes < 1 ? 1 : nodes > 65535 ? 65535 : nodes));
}

//! Q[:, 0..W) = M^T P[:, 0..W) in host::detail::back_cols' tree (see the file comment);
//! scratch: back_scratch_floats(n, m, W) floats.
template <int W>
cudaError_t back_project(const float* M, std::size_t n, std::size_t m, const float* p, float* q, float* scratch,
                         cudaStream_t s) {
  constexpr std::size_t R = host::detail::back_chunk;
  const std::size_t wm = static_cast<std::size_t>(W) * m;
  std::size_t count = n > R ? (n + R - 1) / R : 1;
  back_chunk_kernel<W><<<back_grid(m, count), vec_block, 0, s>>>(M, n, m, p, count > 1 ? scratch : q);
  const float* in = scratch;
  float* out = scratch + count * wm;
  while (count > 1) {
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    const std::size_t nodes = (count + R - 1) / R;
    back_combine_kernel<<<back_grid(wm, nodes), vec_block, 0, s>>>(in, count, wm, nodes > 1 ? out : q);
    in = out;
    out += nodes * wm;
    count = nodes;
  }
  return cudaGetLastError();
}

//! A[i, j] = sum over c (increasing) of Q[j, c] P[i, c], the first product not added to 0.
__device__ __forceinline__ float approx_at(const float* p, const float* q, std::size_t n, std::size_t m, std::size_t r,
                                           std::size_t i, std::size_t j) {
  float a = __fmul_rn(q[j], p[i]);
  for (std::size_t c = 1; c < r; ++c) a = __fadd_rn(a, __fmul_rn(q[c * m + j], p[c * n + i]));
  return a;
}

//! When every status word is 0: A = P Q^T, M = M - A, g = A.
__global__ void approx_residual_kernel(float* g, float* M, std::size_t n, std::size_t m, const float* p, const float* q,
                                       std::size_t r, const std::uint32_t* st, std::size_t words) {
  if (!words_clear(st, words)) return;
  for (const std::size_t k : cuda_kernels::grid_stride(n * m)) {
    const std::size_t i = k / m, j = k - i * m;
    const float a = approx_at(p, q, n, m, r, i, j);
    M[k] = __fsub_rn(M[k], a);
    g[k] = a;
  }
}

//! host::orthonormalize_columns(a, rows, cols, rows) by one block of ortho_block threads;
//! returns kept (to every thread). Every dot product is fixed_sum.cuh's block_sum of
//! host::gs_dot_leaf, the host's shape.
__device__ int block_orthonormalize(float* a, std::size_t rows, std::size_t cols) {
  double* sh = fixed::shared_lanes<double>();
  const commpact::fixed_sum::add_double add{};
  int kept = 0;
  for (std::size_t j = 0; j < cols; ++j) {
    float* cj = a + j * rows;
    double before = 0.0;
    if (j > 0) {
      __syncthreads();
      before = fixed::block_sum<double>(rows, host::gs_dot_leaf{cj, cj}, add, sh);
    }
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t k = 0; k < j; ++k) {
        const float* ck = a + k * rows;
        __syncthreads();
        const double dot = fixed::block_sum<double>(rows, host::gs_dot_leaf{ck, cj}, add, sh);
        if (dot == 0.0) continue;
        for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) cj[i] = host::gs_sub(cj[i], dot, ck[i]);
      }
    __syncthreads();
    const double nrm2 = fixed::block_sum<double>(rows, host::gs_dot_leaf{cj, cj}, add, sh);
    if (!isfinite(nrm2)) {
      // non-finite: left as is, as on the host
    } else if (nrm2 == 0.0 || (j > 0 && host::gs_dependent(nrm2, before, j))) {
      for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) cj[i] = 0.0f;
    } else {
      const double inv = host::gs_inv_norm(nrm2);
      for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) cj[i] = host::gs_scale(cj[i], inv);
      ++kept;
    }
  }
  __syncthreads();
  return kept;
}

//! Column c of the column-major `rows`-row matrix a is exactly zero (block-wide).
__device__ bool block_column_is_zero(const float* a, std::size_t rows, std::size_t c) {
  bool nz = false;
  for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) nz |= a[c * rows + i] != 0.0f;
  return !__syncthreads_or(nz);
}

//! v[0, len) = host::fill_gaussian(seed), spread over the block.
__device__ void block_gaussian(float* v, std::size_t len, std::uint64_t seed) {
  for (std::size_t p = threadIdx.x; 2 * p < len; p += blockDim.x) {
    float x, y;
    host::gaussian_pair(seed, p, x, y);
    v[2 * p] = x;
    if (2 * p + 1 < len) v[2 * p + 1] = y;
  }
}


__global__ void __launch_bounds__(ortho_block) orthonormalize_kernel(float* a, std::size_t rows, std::size_t cols) {
  (void)block_orthonormalize(a, rows, cols);
}

//! host::power_gossip::orthonormalize_shared in one block.
__global__ void __launch_bounds__(ortho_block)
    orthonormalize_shared_kernel(float* s, std::size_t len, std::size_t r, std::uint64_t seed, std::uint64_t t,
                                 std::uint64_t step) {
  int kept = block_orthonormalize(s, len, r);
  for (std::size_t attempt = 0; kept < static_cast<int>(r) && attempt < 2; ++attempt) {
    for (std::size_t c = 0; c < r; ++c) {
      if (block_column_is_zero(s, len, c))
        block_gaussian(s + c * len, len, host::mix_seed(seed, t, step, c + 1 + attempt * r));
      __syncthreads();
    }
    kept = block_orthonormalize(s, len, r);
  }
}

//! v = fill_gaussian(seed): one thread per pair of values.
__global__ void gaussian_kernel(float* v, std::size_t n, std::uint64_t seed) {
  for (const std::size_t p : cuda_kernels::grid_stride((n + 1) / 2)) {
    float x, y;
    host::gaussian_pair(seed, p, x, y);
    v[2 * p] = x;
    if (2 * p + 1 < n) v[2 * p + 1] = y;
  }
}

//! One block per column: a column of q that is exactly zero = gaussian(mix_seed(seed, t, step, j + 1)).
__global__ void redraw_zero_columns_kernel(float* q, std::size_t rows, std::uint64_t seed, std::uint64_t t,
                                           std::uint64_t step) {
  const std::size_t j = blockIdx.x;
  if (block_column_is_zero(q, rows, j)) block_gaussian(q + j * rows, rows, host::mix_seed(seed, t, step, j + 1));
}

//! PowerGossip's d = q_high - q_low when the round is clear.
__global__ void gossip_diff_kernel(float* d, const float* mine, const float* theirs, std::size_t dl, bool lower,
                                   const std::int64_t* words) {
  if (!gossip_clear(words)) return;
  const float* lo = lower ? mine : theirs;
  const float* hi = lower ? theirs : mine;
  for (const std::size_t i : cuda_kernels::grid_stride(dl)) d[i] = __fsub_rn(hi[i], lo[i]);
}

//! PowerGossip's U = P Q^T (upd) and X += coef U when the round is clear.
__global__ void gossip_apply_kernel(float* X, float* upd, std::size_t n, std::size_t m, const float* p, const float* q,
                                    std::size_t r, float coef, const std::int64_t* words) {
  if (!gossip_clear(words)) return;
  for (const std::size_t k : cuda_kernels::grid_stride(n * m)) {
    const std::size_t i = k / m, j = k - i * m;
    const float a = approx_at(p, q, n, m, r, i, j);
    upd[k] = a;
    X[k] = host::power_gossip::add_scaled(X[k], coef, a);
  }
}

//! PowerGossip's exact mix of one vector when the round is clear.
__global__ void gossip_vectors_kernel(float* x, const std::byte* recv, std::size_t stride, std::size_t offset,
                                      const double* w, std::size_t nw, double self_w, double* acc, std::size_t len,
                                      const std::int64_t* words) {
  if (!gossip_clear(words)) return;
  for (const std::size_t i : cuda_kernels::grid_stride(len)) {
    double a = __dmul_rn(self_w, static_cast<double>(x[i]));
    for (std::size_t k = 0; k < nw; ++k)
      a = host::power_gossip::mix_term(a, w[k], reinterpret_cast<const float*>(recv + k * stride + offset)[i]);
    acc[i] = a;
    x[i] = __double2float_rn(a);
  }
}


}  // namespace commpact::cuda_kernels::power_detail
