// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file power.cuh
//! PowerSGD's per-matrix work on the GPU through cuBLAS: the device twin of what
//! PowerCompressor does on the host for each compressed matrix between its allreduces.
//! The caller owns the buffers (device pointers) and runs the allreduces (NCCL, or a
//! copy to the host) between the phases, on the same stream:
//!
//! \code
//! // M: n x m row-major gradient (in place), e: its residual, Q: m x r, P: n x r (column-major)
//! commpact::cuda_kernels::power_handle h{stream};
//! commpact::cuda_kernels::power_compensate_project(h, M, e, Q, P, n, m, r);   // M += e; P = M Q
//! allreduce_sum(P, n * r);
//! commpact::cuda_kernels::orthonormalize_columns(h, P, n, r);                  // Gram-Schmidt twice
//! commpact::cuda_kernels::power_project_back(h, M, P, Q, n, m, r);             // Q = M^T P
//! allreduce_sum(Q, m * r); commpact::cuda_kernels::scale(h, Q, m * r, 1.0f / ranks);
//! commpact::cuda_kernels::power_decompress(h, M, e, P, Q, n, m, r);            // e = M; M = P Q^T; e -= M
//! \endcode
//!
//! Layouts are the host path's: M row-major (n x m), P (n x r) and Q (m x r)
//! column-major. The orthonormalisation is the host algorithm (modified Gram-Schmidt
//! twice, dot products in double, zero columns stay zero) with one thread block per
//! matrix and a fixed reduction tree, so it is deterministic; it agrees with the host to
//! rounding, not bit for bit (different summation order; cuBLAS GEMMs use FMA). Every
//! rank of one job runs the same kernels on the same kind of GPU, so ranks still agree
//! bit for bit.
//!
//! Only nvcc compiles this file; include it from .cu files.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/power.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "../../error.hpp"
#include "check.cuh"

namespace commpact::cuda_kernels {

namespace power_detail {

//! The CUDA and cuBLAS checks of kernels/cuda/check.cuh, naming PowerSGD in the message.
template <class Status>
inline void check(Status s, const char* what) {
  detail::check(s, what, "commpact::cuda_kernels (PowerSGD)");
}

inline void check_dims(int n, int m, int r, const char* who) {
  commpact::require(n >= 1 && m >= 1 && r >= 1 && r <= (n < m ? n : m), "commpact::cuda_kernels::", who, ": n = ", n,
                    ", m = ", m, ", r = ", r, "; need n, m >= 1 and 1 <= r <= min(n, m).");
}

constexpr int threads = 256;

//! Sum over the block in double with a fixed tree (deterministic). All threads return it.
__device__ inline double block_sum(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

//! One block: modified Gram-Schmidt twice on the columns of a (rows x cols, ld).
__global__ void orthonormalize_kernel(float* a, int rows, int cols, int ld, int* kept) {
  __shared__ double sh[threads];
  int nk = 0;
  for (int j = 0; j < cols; ++j) {
    float* cj = a + static_cast<std::size_t>(j) * ld;
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = 0; k < j; ++k) {
        const float* ck = a + static_cast<std::size_t>(k) * ld;
        double part = 0.0;
        for (int i = threadIdx.x; i < rows; i += blockDim.x)
          part += static_cast<double>(ck[i]) * static_cast<double>(cj[i]);
        const double dot = block_sum(part, sh);
        if (dot != 0.0)
          for (int i = threadIdx.x; i < rows; i += blockDim.x)
            cj[i] = static_cast<float>(static_cast<double>(cj[i]) - dot * static_cast<double>(ck[i]));
        __syncthreads();
      }
    }
    double part = 0.0;
    for (int i = threadIdx.x; i < rows; i += blockDim.x) part += static_cast<double>(cj[i]) * static_cast<double>(cj[i]);
    const double nrm2 = block_sum(part, sh);
    if (nrm2 > 0.0 && isfinite(nrm2)) {
      const double inv = 1.0 / sqrt(nrm2);
      for (int i = threadIdx.x; i < rows; i += blockDim.x) cj[i] = static_cast<float>(static_cast<double>(cj[i]) * inv);
      ++nk;
    } else if (nrm2 == 0.0) {
      for (int i = threadIdx.x; i < rows; i += blockDim.x) cj[i] = 0.0f;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0 && kept != nullptr) *kept = nk;
}

__global__ void add_kernel(float* __restrict__ g, const float* __restrict__ e, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    g[i] += e[i];
}

__global__ void sub_kernel(float* __restrict__ e, const float* __restrict__ a, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    e[i] -= a[i];
}

__global__ void scale_kernel(float* __restrict__ x, std::size_t n, float s) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    x[i] *= s;
}

inline unsigned blocks_for(std::size_t n) {
  const std::size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 4096 ? (b ? b : 1) : 4096);
}

}  // namespace power_detail

//! A cuBLAS handle bound to a stream (owned; not copyable).
class power_handle {
 public:
  explicit power_handle(cudaStream_t stream = nullptr) : stream_(stream) {
    power_detail::check(cublasCreate(&h_), "cublasCreate");
    power_detail::check(cublasSetStream(h_, stream_), "cublasSetStream");
  }
  ~power_handle() {
    if (h_) cublasDestroy(h_);
  }
  power_handle(const power_handle&) = delete;
  power_handle& operator=(const power_handle&) = delete;

  cublasHandle_t blas() const { return h_; }
  cudaStream_t stream() const { return stream_; }

 private:
  cublasHandle_t h_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

//! Orthonormalises the r columns of P (n x r, column-major) in place; zero columns stay
//! zero. If d_kept is not null, the number of unit columns is written there (device int).
inline void orthonormalize_columns(const power_handle& h, float* P, int n, int r, int* d_kept = nullptr) {
  commpact::require(n >= 1 && r >= 1, "commpact::cuda_kernels::orthonormalize_columns: n = ", n, ", r = ", r,
                    "; both must be >= 1.");
  power_detail::orthonormalize_kernel<<<1, power_detail::threads, 0, h.stream()>>>(P, n, r, n, d_kept);
  power_detail::check(cudaGetLastError(), "orthonormalize_kernel launch");
}

//! M += e (error feedback), then P = M Q. M: n x m row-major; Q: m x r; P: n x r.
//! e may be null (no residual yet).
inline void power_compensate_project(const power_handle& h, float* M, const float* e, const float* Q, float* P, int n,
                                     int m, int r) {
  power_detail::check_dims(n, m, r, "power_compensate_project");
  const std::size_t nm = static_cast<std::size_t>(n) * m;
  if (e) {
    power_detail::add_kernel<<<power_detail::blocks_for(nm), power_detail::threads, 0, h.stream()>>>(M, e, nm);
    power_detail::check(cudaGetLastError(), "add_kernel launch");
  }
  const float one = 1.0f, zero = 0.0f;
  // Row-major M (n x m) is column-major M^T (m x n, ld m): P = (M^T)^T Q.
  power_detail::check(cublasSgemm(h.blas(), CUBLAS_OP_T, CUBLAS_OP_N, n, r, m, &one, M, m, Q, m, &zero, P, n),
                      "cublasSgemm (P = M Q)");
}

//! Q = M^T P. M: n x m row-major; P: n x r; Q: m x r.
inline void power_project_back(const power_handle& h, const float* M, const float* P, float* Q, int n, int m, int r) {
  power_detail::check_dims(n, m, r, "power_project_back");
  const float one = 1.0f, zero = 0.0f;
  power_detail::check(cublasSgemm(h.blas(), CUBLAS_OP_N, CUBLAS_OP_N, m, r, n, &one, M, m, P, n, &zero, Q, m),
                      "cublasSgemm (Q = M^T P)");
}

//! x *= s over n values (e.g. Q / ranks after the allreduce).
inline void scale(const power_handle& h, float* x, std::size_t n, float s) {
  if (n == 0) return;
  power_detail::scale_kernel<<<power_detail::blocks_for(n), power_detail::threads, 0, h.stream()>>>(x, n, s);
  power_detail::check(cudaGetLastError(), "scale_kernel launch");
}

//! e = M; M = P Q^T (the approximation, row-major n x m); e -= M. So e = M - P Q^T
//! exactly as the host path defines it.
inline void power_decompress(const power_handle& h, float* M, float* e, const float* P, const float* Q, int n, int m,
                             int r) {
  power_detail::check_dims(n, m, r, "power_decompress");
  const std::size_t nm = static_cast<std::size_t>(n) * m;
  power_detail::check(cudaMemcpyAsync(e, M, nm * sizeof(float), cudaMemcpyDeviceToDevice, h.stream()),
                      "cudaMemcpyAsync (e = M)");
  const float one = 1.0f, zero = 0.0f;
  // Row-major A = P Q^T is column-major A^T = Q P^T (m x n, ld m).
  power_detail::check(cublasSgemm(h.blas(), CUBLAS_OP_N, CUBLAS_OP_T, m, n, r, &one, Q, m, P, n, &zero, M, m),
                      "cublasSgemm (M = P Q^T)");
  power_detail::sub_kernel<<<power_detail::blocks_for(nm), power_detail::threads, 0, h.stream()>>>(e, M, nm);
  power_detail::check(cudaGetLastError(), "sub_kernel launch");
}

}  // namespace commpact::cuda_kernels
