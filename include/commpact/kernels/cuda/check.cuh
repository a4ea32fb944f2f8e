// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file check.cuh
//! Turns a failed CUDA runtime or cuBLAS call into commpact::device_error. The message
//! names the caller (`who`), the call, the status and the way out:
//!
//! <!-- snippet: p=void*; bytes=std::size_t -->
//! \code
//! commpact::cuda_kernels::detail::check(cudaMalloc(&p, bytes), "cudaMalloc");
//! // commpact::cuda_kernels: cudaMalloc failed with cudaErrorMemoryAllocation (out of memory);
//! // check the device, the pointers and the sizes passed.
//! \endcode
//!
//! Only nvcc compiles this file; include it from .cu files.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/check.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "../../error.hpp"

namespace commpact::cuda_kernels::detail {

//! Throws commpact::device_error naming `who`, the call and CUDA's message when e is not
//! cudaSuccess.
inline void check(cudaError_t e, const char* what, const char* who = "commpact::cuda_kernels") {
  if (e != cudaSuccess)
    throw commpact::device_error(commpact::detail::cat(who, ": ", what, " failed with ", cudaGetErrorName(e), " (",
                                                       cudaGetErrorString(e),
                                                       "); check the device, the pointers and the sizes passed."));
}

//! Throws commpact::device_error naming `who`, the call and cuBLAS's message when s is not
//! CUBLAS_STATUS_SUCCESS.
inline void check(cublasStatus_t s, const char* what, const char* who = "commpact::cuda_kernels") {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw commpact::device_error(commpact::detail::cat(who, ": ", what, " failed with cuBLAS status ",
                                                       static_cast<int>(s), " (", cublasGetStatusString(s),
                                                       "); check the handle, the pointers and the sizes passed."));
}

}  // namespace commpact::cuda_kernels::detail
