// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file topk.cuh
//! Exact top-k by |x| on the GPU, the device twin of commpact::host::topk_abs: the same
//! order (abs_key descending, ties by the smaller index; NaNs above +Inf), the same
//! output (exactly k entries sorted by index, val[i] = x[idx[i]]), so host and device
//! results are bit-identical.
//!
//! Method: keys = abs_key(x) paired with their indices, a stable descending
//! cub::DeviceRadixSort over the 31 key bits (stability keeps equal keys in index order),
//! the first k indices sorted ascending by a second radix sort over ceil(log2 n) bits,
//! then a gather of the values. O(n) work; deterministic (CUB's radix sort is).
//!
//! CUB-style two-phase call: with d_temp == nullptr, topk_abs only sets temp_bytes.
//!
//! \code
//! std::size_t bytes = 0;
//! commpact::cuda_kernels::topk_abs(nullptr, bytes, d_x, n, k, d_idx, d_val, stream);
//! cudaMalloc(&d_temp, bytes);
//! commpact::cuda_kernels::topk_abs(d_temp, bytes, d_x, n, k, d_idx, d_val, stream);
//! // or, owning and reusing the temporary storage:
//! commpact::cuda_kernels::topk_workspace ws;
//! ws.run(d_x, n, k, d_idx, d_val, stream);
//! \endcode
//!
//! Only nvcc compiles this file (CUB headers need it); include it from .cu files.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/topk.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "../../error.hpp"
#include "check.cuh"

namespace commpact::cuda_kernels {

namespace detail {

template <class F>
__global__ void make_abs_keys(const F* __restrict__ x, std::uint32_t n, std::uint32_t* __restrict__ keys,
                              std::int32_t* __restrict__ idx) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    keys[i] = __float_as_uint(x[i]) & 0x7fffffffu;
    idx[i] = static_cast<std::int32_t>(i);
  }
}

template <class F>
__global__ void gather_values(const F* __restrict__ x, const std::int32_t* __restrict__ idx, std::uint32_t k,
                              F* __restrict__ val) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < k; i += gridDim.x * blockDim.x) val[i] = x[idx[i]];
}

inline std::size_t align256(std::size_t b) { return (b + 255) & ~std::size_t{255}; }

inline int bits_for(std::size_t n) {  // bits needed for the values 0 .. n-1
  int b = 1;
  while (b < 31 && (std::size_t{1} << b) < n) ++b;
  return b;
}

inline void check_args(std::size_t n, std::size_t k) {
  require(n < (std::size_t{1} << 31), "commpact::cuda_kernels::topk_abs: x has ", n,
          " entries, but indices are int32, so n must be below 2^31; split the tensor into buckets.");
  require(k <= n, "commpact::cuda_kernels::topk_abs: k = ", k, " is larger than n = ", n,
          "; k must be in [0, n]: pass a smaller k or check the density.");
}

}  // namespace detail

//! Exact top-k of the n floats at d_x by |x| (order as commpact::host::topk_abs), written
//! index-sorted to d_idx[0, k) and d_val[0, k). Two-phase: with d_temp == nullptr only
//! sets temp_bytes. Asynchronous on `stream`; returns the first CUDA error.
//! \throws commpact::invalid_argument when n >= 2^31 or k > n (before any launch).
inline cudaError_t topk_abs(void* d_temp, std::size_t& temp_bytes, const float* d_x, std::size_t n, std::size_t k,
                            std::int32_t* d_idx, float* d_val, cudaStream_t stream = 0) {
  detail::check_args(n, k);
  const std::size_t nn = n == 0 ? 1 : n;
  const std::size_t kk = k == 0 ? 1 : k;
  const int idx_bits = detail::bits_for(nn);

  // Sizes of CUB's temporary storage for the two sorts.
  std::size_t sort1 = 0, sort2 = 0;
  {
    cub::DoubleBuffer<std::uint32_t> keys(nullptr, nullptr);
    cub::DoubleBuffer<std::int32_t> vals(nullptr, nullptr);
    cudaError_t e =
        cub::DeviceRadixSort::SortPairsDescending(nullptr, sort1, keys, vals, static_cast<int>(nn), 0, 31, stream);
    if (e != cudaSuccess) return e;
    e = cub::DeviceRadixSort::SortKeys(nullptr, sort2, static_cast<const std::int32_t*>(nullptr),
                                       static_cast<std::int32_t*>(nullptr), static_cast<int>(kk), 0, idx_bits, stream);
    if (e != cudaSuccess) return e;
  }
  const std::size_t arr = detail::align256(nn * 4);
  const std::size_t need = 4 * arr + detail::align256(sort1 > sort2 ? sort1 : sort2);
  if (d_temp == nullptr) {
    temp_bytes = need;
    return cudaSuccess;
  }
  if (temp_bytes < need) return cudaErrorInvalidValue;
  if (k == 0) return cudaSuccess;

  auto* base = static_cast<unsigned char*>(d_temp);
  auto* keys_a = reinterpret_cast<std::uint32_t*>(base);
  auto* keys_b = reinterpret_cast<std::uint32_t*>(base + arr);
  auto* idx_a = reinterpret_cast<std::int32_t*>(base + 2 * arr);
  auto* idx_b = reinterpret_cast<std::int32_t*>(base + 3 * arr);
  void* cub_temp = base + 4 * arr;
  std::size_t cub_bytes = need - 4 * arr;

  const unsigned threads = 256;
  const unsigned blocks_n =
      static_cast<unsigned>((n + threads - 1) / threads < 65535 ? (n + threads - 1) / threads : 65535);
  detail::make_abs_keys<<<blocks_n, threads, 0, stream>>>(d_x, static_cast<std::uint32_t>(n), keys_a, idx_a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;

  cub::DoubleBuffer<std::uint32_t> keys(keys_a, keys_b);
  cub::DoubleBuffer<std::int32_t> vals(idx_a, idx_b);
  e = cub::DeviceRadixSort::SortPairsDescending(cub_temp, cub_bytes, keys, vals, static_cast<int>(n), 0, 31, stream);
  if (e != cudaSuccess) return e;

  cub_bytes = need - 4 * arr;
  e = cub::DeviceRadixSort::SortKeys(cub_temp, cub_bytes, static_cast<const std::int32_t*>(vals.Current()), d_idx,
                                     static_cast<int>(k), 0, idx_bits, stream);
  if (e != cudaSuccess) return e;

  const unsigned blocks_k =
      static_cast<unsigned>((k + threads - 1) / threads < 65535 ? (k + threads - 1) / threads : 65535);
  detail::gather_values<<<blocks_k, threads, 0, stream>>>(d_x, d_idx, static_cast<std::uint32_t>(k), d_val);
  return cudaGetLastError();
}

//! Owns the temporary storage of topk_abs; grows on demand, never shrinks, so repeated
//! calls with the same (n, k) allocate once.
class topk_workspace {
 public:
  topk_workspace() = default;
  topk_workspace(const topk_workspace&) = delete;
  topk_workspace& operator=(const topk_workspace&) = delete;
  ~topk_workspace() {
    if (temp_) cudaFree(temp_);
  }

  //! topk_abs with this workspace's storage; throws commpact::device_error on a CUDA error.
  void run(const float* d_x, std::size_t n, std::size_t k, std::int32_t* d_idx, float* d_val, cudaStream_t stream = 0) {
    std::size_t need = 0;
    detail::check(topk_abs(nullptr, need, d_x, n, k, d_idx, d_val, stream), "topk_abs (size query)");
    if (need > bytes_) {
      if (temp_) detail::check(cudaFree(temp_), "cudaFree");
      temp_ = nullptr;
      bytes_ = 0;
      detail::check(cudaMalloc(&temp_, need), "cudaMalloc of the top-k workspace");
      bytes_ = need;
      ++allocations_;
    }
    detail::check(topk_abs(temp_, bytes_, d_x, n, k, d_idx, d_val, stream), "topk_abs");
  }
  [[nodiscard]] std::size_t capacity_bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::size_t allocations() const noexcept { return allocations_; }

 private:
  void* temp_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t allocations_ = 0;
};

}  // namespace commpact::cuda_kernels
