// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file grid.cuh
//! The grid-stride loop of commpact's element-wise kernels, written once:
//!
//! <!-- snippet: namespace -->
//! \code
//! __global__ void copy(const float* x, float* y, std::size_t n) {
//!   for (const std::size_t i : commpact::cuda_kernels::grid_stride(n)) y[i] = x[i];
//! }
//! \endcode
//!
//! visits this thread's indices blockIdx.x * blockDim.x + threadIdx.x + j * gridDim.x *
//! blockDim.x below n, in increasing order (the loop every kernel here wrote by hand).
//!
//! And decision_launch: the one launch shape for a decision, a kernel that reads and
//! writes a few words of device state (a frame header, a status word, a count; at most a
//! loop over the P ranks), never the data. It runs as one warp whose lane 0 works (the
//! kernel starts with `if (!decision_lane()) return;`), and every other kernel is
//! parallel over its data: include/ has no single-thread launch
//! (tests/package/check_no_serial_launch.cmake).
//! Only nvcc compiles this file.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/grid.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>

namespace commpact::cuda_kernels {

//! Threads of a decision launch: one warp.
inline constexpr unsigned decision_threads = 32;

//! True on the thread of a decision kernel that works (lane 0); the others return.
__device__ __forceinline__ bool decision_lane() { return threadIdx.x == 0 && blockIdx.x == 0; }

//! Queues the decision kernel `kernel(args...)` on stream s as one warp (see the file
//! comment). A launch error is left for the caller's cudaGetLastError().
template <class... Params, class... Args>
inline void decision_launch(void (*kernel)(Params...), cudaStream_t s, Args... args) {
  kernel<<<1, decision_threads, 0, s>>>(args...);
}

class grid_stride {
 public:
  struct end_t {};
  class iterator {
   public:
    __device__ iterator(std::size_t i, std::size_t step, std::size_t n) : i_(i), step_(step), n_(n) {}
    __device__ std::size_t operator*() const { return i_; }
    __device__ iterator& operator++() {
      i_ += step_;
      return *this;
    }
    __device__ bool operator!=(end_t) const { return i_ < n_; }

   private:
    std::size_t i_, step_, n_;
  };

  __device__ explicit grid_stride(std::size_t n) : n_(n) {}
  __device__ iterator begin() const {
    return {blockIdx.x * std::size_t(blockDim.x) + threadIdx.x, std::size_t(gridDim.x) * blockDim.x, n_};
  }
  __device__ end_t end() const { return {}; }

 private:
  std::size_t n_;
};

}  // namespace commpact::cuda_kernels
