// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file vector.cuh
//! Elementwise kernels of ops<cuda_space> (kernels/cuda/ops.cuh): fill, the mean over P
//! ranks, DGC's clipping factor, the scatter of a sparse mean into a zeroed vector, the
//! zeroing of delivered entries, and error feedback's accumulate. Each is a launch on a
//! stream returning cudaError_t; data-dependent outcomes (a non-finite value) set bits in
//! a status word in device memory (kernels/status.hpp), never an exception.
//!
//! Bits. Every float operation is the host's, one IEEE operation each, correctly rounded
//! and never contracted: products and sums are written with __fmul_rn / __fadd_rn (which
//! nvcc never fuses into an FMA), the mean with __fdiv_rn(sum, float(P)) exactly as
//! kernels/mean.hpp's mean_of. So results equal the host's bit for bit, clip_scale's too:
//! its sum of squares is added in double in kernels/fixed_sum.hpp's shape, which the host
//! row uses as well (kernels/clip.hpp).
//!
//! Checked against its host twin by tests/cuda/test_cuda_ops.cu (docs/cuda.md, "Status", says
//! where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/vector.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "../clip.hpp"
#include "../status.hpp"
#include "fixed_sum.cuh"
#include "select.cuh"
#include "grid.cuh"

namespace commpact::cuda_kernels {

namespace detail {

inline constexpr int vec_block = 256;

inline unsigned vec_grid(std::size_t n) {
  std::size_t g = (n + vec_block - 1) / vec_block;
  return static_cast<unsigned>(g < 1 ? 1 : g > 65535 * 4 ? 65535 * 4 : g);
}

__device__ __forceinline__ bool nonfinite(float v) { return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u; }

template <class T>
__global__ void fill_kernel(T* v, std::size_t n, T x) {
  for (const std::size_t i : cuda_kernels::grid_stride(n))
    v[i] = x;
}

__global__ void mean_kernel(float* v, std::size_t n, int P, std::uint32_t* status) {
  const float d = static_cast<float>(P);
  bool bad = false;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) {
    const float r = __fdiv_rn(v[i], d);
    v[i] = r;
    bad |= nonfinite(r);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0 && status) atomicOr(status, static_cast<std::uint32_t>(status_nonfinite));
}

//! clip_scale's end (thread 0 of the sum's last level): scale[0] = clip::factor(||g||^2).
struct clip_finish {
  float clip_norm;
  int P;
  float* scale;
  __device__ void operator()(std::size_t, double sumsq) const { scale[0] = clip::factor(sumsq, clip_norm, P); }
};

//! out[i] = 0 for i < n when *gate (or gate null) is set.
__global__ void zero_kernel(float* out, std::size_t n) {
  for (const std::size_t i : cuda_kernels::grid_stride(n))
    out[i] = 0.0f;
}

//! out[idx[j]] = val[j] / P for j < count (count: *d_count when not null, else cap);
//! indices outside [0, n) are skipped (never written).
__global__ void scatter_mean_kernel(float* out, std::size_t n, const std::int32_t* idx, const float* val,
                                    const std::uint32_t* d_count, std::size_t cap, int P) {
  const std::size_t c = d_count ? *d_count : cap;
  const float d = static_cast<float>(P);
  for (const std::size_t j : cuda_kernels::grid_stride(c < cap ? c : cap)) {
    const std::int32_t i = idx[j];
    if (i >= 0 && static_cast<std::size_t>(i) < n) out[i] = __fdiv_rn(val[j], d);
  }
}

//! residual[idx[j]] = 0 (and velocity[idx[j]]) where alive[j] (or alive null), j < count.
__global__ void zero_delivered_kernel(float* residual, float* velocity, std::size_t n, const std::int32_t* idx,
                                      const std::uint8_t* alive, const std::uint32_t* d_count, std::size_t cap) {
  const std::size_t c = d_count ? *d_count : cap;
  for (const std::size_t j : cuda_kernels::grid_stride(c < cap ? c : cap)) {
    if (alive && !alive[j]) continue;
    const std::int32_t i = idx[j];
    if (i < 0 || static_cast<std::size_t>(i) >= n) continue;
    residual[i] = 0.0f;
    if (velocity) velocity[i] = 0.0f;
  }
}

//! Error feedback's accumulate, the host's operations (kernels/host/sparse_tree.hpp's
//! local and vector_ops.hpp's ef_body), s = scale ? *scale : 1 read on the device:
//! - Mode 0 (no momentum): acc = (r ? r[i] : 0.0f) + (s == 1 ? g[i] : g[i] * s)
//! - Mode 1 (momentum, r and u present): g' = (s == 1 ? g : g * s); un = u * m + g';
//!   acc = r + un
//! - Mode 2 (momentum, first step): g' as above; un = m * (u ? u : 0) + g';
//!   acc = (r ? r : 0) + un
//! A non-finite acc sets status_nonfinite in *status.
template <int Mode>
__global__ void ef_kernel(float* acc, float* un, const float* u, const float* r, const float* g, std::size_t n,
                          const float* scale, float m, std::uint32_t* status) {
  const float s = scale ? *scale : 1.0f;
  bool bad = false;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) {
    const float gi = s == 1.0f ? g[i] : __fmul_rn(g[i], s);
    float a;
    if constexpr (Mode == 0) {
      a = __fadd_rn(r ? r[i] : 0.0f, gi);
    } else if constexpr (Mode == 1) {
      const float v = __fadd_rn(__fmul_rn(u[i], m), gi);
      un[i] = v;
      a = __fadd_rn(r[i], v);
    } else {
      const float v = __fadd_rn(__fmul_rn(m, u ? u[i] : 0.0f), gi);
      un[i] = v;
      a = __fadd_rn(r ? r[i] : 0.0f, v);
    }
    acc[i] = a;
    bad |= nonfinite(a);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(status, static_cast<std::uint32_t>(status_nonfinite));
}

__global__ void any_nonfinite_kernel(const float* v, std::size_t n, std::uint32_t* flag, std::uint32_t* status) {
  bool bad = false;
  for (const std::size_t i : cuda_kernels::grid_stride(n))
    bad |= nonfinite(v[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) {
    atomicOr(flag, 1u);
    if (status) atomicOr(status, static_cast<std::uint32_t>(status_nonfinite));
  }
}

//! dst[i] = mean_of(src[i], P) unless *flag is set.
__global__ void mean_into_kernel(const float* src, float* dst, std::size_t n, int P, const std::uint32_t* flag) {
  if (*flag) return;
  const float d = static_cast<float>(P);
  for (const std::size_t i : cuda_kernels::grid_stride(n))
    dst[i] = __fdiv_rn(src[i], d);
}

__global__ void add_kernel(float* y, const float* x, std::size_t n) {
  for (const std::size_t i : cuda_kernels::grid_stride(n))
    y[i] = __fadd_rn(y[i], x[i]);
}

//! The table's sgd_step (host::sgd_step): d = g + wd x; v = mu v + d; x -= a v (v null:
//! x -= a d), every product and sum rounded on its own (no FMA), as on the host.
__global__ void sgd_kernel(float* x, float* v, const float* g, std::size_t n, float a, float mu, float wd) {
  for (const std::size_t i : cuda_kernels::grid_stride(n)) {
    float d = __fadd_rn(g[i], __fmul_rn(wd, x[i]));
    if (v) {
      d = __fadd_rn(__fmul_rn(mu, v[i]), d);
      v[i] = d;
    }
    x[i] = __fsub_rn(x[i], __fmul_rn(a, d));
  }
}

__global__ void sub_kernel(float* y, const float* x, std::size_t n) {
  for (const std::size_t i : cuda_kernels::grid_stride(n))
    y[i] = __fsub_rn(y[i], x[i]);
}

//! The table's ef_accumulate (host::ef_accumulate / ef_accumulate_momentum): g' = s g
//! when a scale is given (always multiplied), u_next = u m + g' with momentum, acc = r +
//! (u_next or g').
template <bool Momentum>
__global__ void ef_table_kernel(float* acc, float* un, const float* u, const float* r, const float* g, std::size_t n,
                                const float* scale, float m, std::uint32_t* status) {
  bool bad = false;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) {
    float gi = scale ? __fmul_rn(g[i], *scale) : g[i];
    if constexpr (Momentum) {
      gi = __fadd_rn(__fmul_rn(u[i], m), gi);
      un[i] = gi;
    }
    const float a = __fadd_rn(r[i], gi);
    acc[i] = a;
    bad |= nonfinite(a);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0 && status)
    atomicOr(status, static_cast<std::uint32_t>(status_nonfinite));
}

}  // namespace detail

//! mean_into: when every src[i] is finite, dst[i] = mean_of(src[i], P); else
//! *status |= status_nonfinite and dst is untouched. flag: one word of device scratch.
inline cudaError_t mean_into(const float* src, float* dst, std::size_t n, int P, std::uint32_t* status,
                             std::uint32_t* flag, cudaStream_t s) {
  COMMPACT_CU_TRY(cudaMemsetAsync(flag, 0, sizeof(std::uint32_t), s));
  if (n == 0) return cudaSuccess;
  detail::any_nonfinite_kernel<<<detail::vec_grid(n), detail::vec_block, 0, s>>>(src, n, flag, status);
  COMMPACT_CU_TRY(cudaGetLastError());
  detail::mean_into_kernel<<<detail::vec_grid(n), detail::vec_block, 0, s>>>(src, dst, n, P, flag);
  return cudaGetLastError();
}

//! y[i] = y[i] + x[i].
inline cudaError_t add(float* y, const float* x, std::size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  detail::add_kernel<<<detail::vec_grid(n), detail::vec_block, 0, s>>>(y, x, n);
  return cudaGetLastError();
}

//! SGD's update (detail::sgd_kernel); v is null without momentum.
inline cudaError_t sgd_step(float* x, float* v, const float* g, std::size_t n, float a, float mu, float wd,
                            cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  detail::sgd_kernel<<<detail::vec_grid(n), detail::vec_block, 0, s>>>(x, v, g, n, a, mu, wd);
  return cudaGetLastError();
}

//! y[i] = y[i] - x[i].
inline cudaError_t sub(float* y, const float* x, std::size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  detail::sub_kernel<<<detail::vec_grid(n), detail::vec_block, 0, s>>>(y, x, n);
  return cudaGetLastError();
}

//! The table's ef_accumulate (see detail::ef_table_kernel); un/u only with momentum (m > 0).
inline cudaError_t ef_accumulate(float* acc, float* un, const float* u, const float* r, const float* g, std::size_t n,
                                 float m, const float* scale, std::uint32_t* status, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (m > 0.0f)
    detail::ef_table_kernel<true><<<detail::vec_grid(n), detail::vec_block, 0, s>>>(acc, un, u, r, g, n, scale, m, status);
  else
    detail::ef_table_kernel<false><<<detail::vec_grid(n), detail::vec_block, 0, s>>>(acc, un, u, r, g, n, scale, m,
                                                                                     status);
  return cudaGetLastError();
}

template <class T>
cudaError_t fill(T* v, std::size_t n, T x, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  detail::fill_kernel<<<detail::vec_grid(n), detail::vec_block, 0, s>>>(v, n, x);
  return cudaGetLastError();
}

//! v[i] = mean_of(v[i], P); *status |= status_nonfinite when a result is not finite.
inline cudaError_t mean(float* v, std::size_t n, int P, std::uint32_t* status, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  detail::mean_kernel<<<detail::vec_grid(n), detail::vec_block, 0, s>>>(v, n, P, status);
  return cudaGetLastError();
}

//! Scratch bytes of clip_scale for n values (0 up to 2048).
inline std::size_t clip_scratch_bytes(std::size_t n) { return sizeof(double) * fixed::scratch_items(1, n); }

//! scale[0] = DGC's clipping factor of g (ops.hpp's clip_scale): ||g||^2 in double in
//! kernels/fixed_sum.hpp's shape (fixed_sum.cuh, a block per node of 2048 values), the
//! factor by the last level's thread 0. part: clip_scratch_bytes(n).
inline cudaError_t clip_scale(const float* g, std::size_t n, float clip_norm, int P, float* scale, double* part,
                              cudaStream_t s) {
  return fixed::segmented_sum(clip::square_leaf{g}, commpact::fixed_sum::add_double{},
                              detail::clip_finish{clip_norm, P, scale}, 1, n, n, part, s);
}

//! out = 0, then out[idx[j]] = mean_of(val[j], P) for j < k (indices distinct; an index
//! outside [0, n) is skipped).
inline cudaError_t scatter_mean(float* out, std::size_t n, const std::int32_t* idx, const float* val, std::size_t k,
                                int P, cudaStream_t s) {
  if (n) COMMPACT_CU_TRY(cudaMemsetAsync(out, 0, n * sizeof(float), s));
  if (k == 0) return cudaSuccess;
  detail::scatter_mean_kernel<<<detail::vec_grid(k), detail::vec_block, 0, s>>>(out, n, idx, val, nullptr, k, P);
  return cudaGetLastError();
}

//! residual[idx[j]] = 0 (velocity too when not null) where alive[j] (every j when null).
inline cudaError_t zero_delivered(float* residual, float* velocity, std::size_t n, const std::int32_t* idx,
                                  const std::uint8_t* alive, std::size_t k, cudaStream_t s) {
  if (k == 0) return cudaSuccess;
  detail::zero_delivered_kernel<<<detail::vec_grid(k), detail::vec_block, 0, s>>>(residual, velocity, n, idx, alive,
                                                                                 nullptr, k);
  return cudaGetLastError();
}

}  // namespace commpact::cuda_kernels
