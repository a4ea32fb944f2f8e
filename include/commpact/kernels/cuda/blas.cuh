// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file blas.cuh
//! PowerSGD's products on cuBLAS (power_products::blas; the rows lowrank_project,
//! lowrank_back_project and lowrank_approx_residual of rows_power.cuh dispatch here):
//!
//! - P = M Q: one cublasSgemm (row-major M is column-major M^T, ld m: P = (M^T)^T Q),
//!   after M = g + res in one element kernel (__fadd_rn: the host's bits);
//! - Q = M^T P: one cublasSgemm;
//! - A = P Q^T and the residual: cublasSgemm into tiles of at most approx_tile_floats
//!   floats of the executor's scratch (whole rows of A), then one element kernel per tile
//!   that, when every status word is 0, writes g = A and M = M - A (__fsub_rn), and
//!   otherwise nothing (cuBLAS cannot read the status, and grad must stay untouched on a
//!   failed step). A is computed from the allreduced P and Q only, so it is the same on
//!   every rank.
//!
//! The handle: one per executor (so one per stream), made once by handle() (called off
//! the hot path by lowrank_prepare from PowerCompressor::set_layout), kept in the
//! executor's state and destroyed with it; bound to the executor's stream, with
//! CUBLAS_POINTER_MODE_HOST, CUBLAS_DEFAULT_MATH (FP32 arithmetic: no TF32, which needs
//! CUBLAS_TF32_TENSOR_OP_MATH) and CUBLAS_ATOMICS_NOT_ALLOWED. It belongs to the device
//! that is current when it is made (cuBLAS's rule): make the executor's stream on that
//! device. Like the executor, it is for one host thread at a time.
//!
//! Determinism (cuBLAS's documentation, "Results reproducibility"): a cuBLAS version gives
//! bit-wise identical results at every run on GPUs of the same architecture and SM count;
//! with several streams active at once that holds when each stream has its own handle
//! (here: one per executor) or its own workspace, so CUBLAS_WORKSPACE_CONFIG is not
//! needed. So ranks agree bit for bit when they run the same GPU model and the same
//! cuBLAS (a job mixing GPU models or cuBLAS versions must use power_products::exact).
//! The error bound against the exact order is in docs/cuda.md.
//!
//! Only nvcc compiles this file; include it from .cu files.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/blas.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "../../error.hpp"
#include "../../space/cuda.hpp"
#include "check.cuh"
#include "grid.cuh"
#include "vector.cuh"

namespace commpact::cuda_kernels::blas {

//! The most floats of the executor's scratch one tile of A takes (16 MiB); a matrix with
//! more columns takes one row per tile.
inline constexpr std::size_t approx_tile_floats = std::size_t(1) << 22;

//! Rows of A per tile for an n x m matrix (n, m >= 1).
inline std::size_t approx_tile_rows(std::size_t n, std::size_t m) {
  const std::size_t t = approx_tile_floats / m;
  return t < 1 ? 1 : t > n ? n : t;
}
//! Bytes of scratch the approximation of an n x m matrix needs (0 when it is empty).
inline std::size_t approx_scratch_bytes(std::size_t n, std::size_t m) {
  return n == 0 || m == 0 ? 0 : approx_tile_rows(n, m) * m * sizeof(float);
}

inline void check(cublasStatus_t s, const char* what) {
  cuda_kernels::detail::check(s, what, "commpact::ops<cuda_space> (power_products::blas)");
}
inline void check(cudaError_t s, const char* what) {
  cuda_kernels::detail::check(s, what, "commpact::ops<cuda_space> (power_products::blas)");
}

inline void destroy_handle(void* h) noexcept { (void)cublasDestroy(static_cast<cublasHandle_t>(h)); }

//! The executor's cuBLAS handle, made on the first call (see the file comment).
inline cublasHandle_t handle(const cuda_space::exec& e) {
  require(e.s != nullptr, "commpact::ops<cuda_space> (power_products::blas): this executor has no stream; make one "
                          "with cuda_space::make_exec().");
  auto& s = *e.s;
  if (s.blas == nullptr) {
    cuda_device_guard g(s.device);  // the handle belongs to the executor's device
    cublasHandle_t h = nullptr;
    check(cublasCreate(&h), "cublasCreate");
    const auto setup = [&](cublasStatus_t st, const char* what) {
      if (st != CUBLAS_STATUS_SUCCESS) {
        (void)cublasDestroy(h);
        check(st, what);
      }
    };
    setup(cublasSetStream(h, s.stream), "cublasSetStream");
    setup(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
    setup(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    setup(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
    s.blas = h;
    s.blas_destroy = &destroy_handle;
  }
  return static_cast<cublasHandle_t>(s.blas);
}

//! cuBLAS takes int dimensions.
inline int dim(std::size_t v, const char* who) {
  require(v <= static_cast<std::size_t>(INT_MAX), "commpact::ops<cuda_space>::", who, " (power_products::blas): a ",
          "dimension of ", v, " is more than cuBLAS's int; use power_products::exact for this matrix.");
  return static_cast<int>(v);
}

//! M = g + res (__fadd_rn, the host's bits; M may be g).
__global__ void add_into_kernel(const float* g, const float* res, float* M, std::size_t count) {
  for (const std::size_t i : cuda_kernels::grid_stride(count)) M[i] = __fadd_rn(g[i], res[i]);
}

//! When every status word is 0: g = A and M = M - A over one tile (count floats).
__global__ void apply_tile_kernel(float* g, float* M, const float* A, std::size_t count, const std::uint32_t* st,
                                  std::size_t words) {
  for (std::size_t w = 0; w < words; ++w)
    if (st[w] != 0) return;
  for (const std::size_t i : cuda_kernels::grid_stride(count)) {
    const float a = A[i];
    M[i] = __fsub_rn(M[i], a);
    g[i] = a;
  }
}

//! M = g + res (M = g when res is null; nothing when M is g), then P = M Q. Sizes are
//! checked by the row.
inline void project(const cuda_space::exec& e, const float* g, const float* res, float* M, std::size_t n,
                    std::size_t m, const float* Q, std::size_t r, float* P) {
  const std::size_t nm = n * m;
  if (nm > 0) {
    if (res != nullptr) {
      add_into_kernel<<<cuda_kernels::detail::vec_grid(nm), cuda_kernels::detail::vec_block, 0, e.stream()>>>(
          g, res, M, nm);
      check(cudaGetLastError(), "add_into_kernel");
    } else if (M != g) {
      check(cudaMemcpyAsync(M, g, nm * sizeof(float), cudaMemcpyDeviceToDevice, e.stream()), "cudaMemcpyAsync (M = g)");
    }
  }
  if (n == 0 || r == 0) return;
  if (m == 0) {  // an empty sum
    check(cudaMemsetAsync(P, 0, n * r * sizeof(float), e.stream()), "cudaMemsetAsync (P = 0)");
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  const int ni = dim(n, "lowrank_project"), mi = dim(m, "lowrank_project"), ri = dim(r, "lowrank_project");
  check(cublasSgemm(handle(e), CUBLAS_OP_T, CUBLAS_OP_N, ni, ri, mi, &one, M, mi, Q, mi, &zero, P, ni),
        "cublasSgemm (P = M Q)");
}

//! Q = M^T P.
inline void back_project(const cuda_space::exec& e, const float* M, std::size_t n, std::size_t m, const float* P,
                         std::size_t r, float* Q) {
  if (m == 0 || r == 0) return;
  if (n == 0) {
    check(cudaMemsetAsync(Q, 0, m * r * sizeof(float), e.stream()), "cudaMemsetAsync (Q = 0)");
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  const int ni = dim(n, "lowrank_back_project"), mi = dim(m, "lowrank_back_project"),
            ri = dim(r, "lowrank_back_project");
  check(cublasSgemm(handle(e), CUBLAS_OP_N, CUBLAS_OP_N, mi, ri, ni, &one, M, mi, P, ni, &zero, Q, mi),
        "cublasSgemm (Q = M^T P)");
}

//! When every status word is 0: A = P Q^T, M = M - A, g = A; else nothing (tiles of the
//! executor's scratch, grown by prepare(), so nothing is allocated once prepared).
inline void approx_residual(const cuda_space::exec& e, float* g, float* M, std::size_t n, std::size_t m,
                            const float* P, const float* Q, std::size_t r, const std::uint32_t* st,
                            std::size_t words) {
  if (n == 0 || m == 0) return;
  const std::size_t rows = approx_tile_rows(n, m);
  float* W = static_cast<float*>(e.scratch("lowrank_approx_residual", approx_scratch_bytes(n, m)));
  const cublasHandle_t h = handle(e);
  const float one = 1.0f, zero = 0.0f;
  const int mi = dim(m, "lowrank_approx_residual"), ni = dim(n, "lowrank_approx_residual"),
            ri = dim(r, "lowrank_approx_residual");
  for (std::size_t i0 = 0; i0 < n; i0 += rows) {
    const std::size_t t = n - i0 < rows ? n - i0 : rows, count = t * m;
    if (r == 0) {  // A = 0
      check(cudaMemsetAsync(W, 0, count * sizeof(float), e.stream()), "cudaMemsetAsync (A = 0)");
    } else {
      // Rows i0 .. i0 + t of row-major A are columns of column-major A^T = Q P^T (m x n).
      check(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, mi, static_cast<int>(t), ri, &one, Q, mi, P + i0, ni, &zero, W,
                        mi),
            "cublasSgemm (A = P Q^T)");
    }
    apply_tile_kernel<<<cuda_kernels::detail::vec_grid(count), cuda_kernels::detail::vec_block, 0, e.stream()>>>(
        g + i0 * m, M + i0 * m, W, count, st, words);
    check(cudaGetLastError(), "apply_tile_kernel");
  }
}

//! Makes the handle and grows the scratch for an n x m matrix (off the hot path).
inline void prepare(const cuda_space::exec& e, std::size_t n, std::size_t m) {
  (void)handle(e);
  if (const std::size_t b = approx_scratch_bytes(n, m)) (void)e.scratch("lowrank_approx_residual", b);
}

}  // namespace commpact::cuda_kernels::blas
