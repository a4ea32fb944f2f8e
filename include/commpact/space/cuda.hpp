// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cuda.hpp
//! cuda_space: data in GPU memory, work queued on a CUDA stream. Declared here so that
//! code can name it; its spans, buffers, fence and ops<cuda_space> (CUB and cuBLAS
//! kernels, inline .cuh) are the CUDA-space issue's work. Compiled only by nvcc.
//!
//! The shape it will have (the same as deferred_space's, which CI checks on a CPU):
//! - `span<T>`: a device pointer and a length with no host element access;
//! - `buffer<T>`: grow-only device storage from the executor's allocator hook;
//! - `exec`: a cudaStream_t and an allocator hook (no cudaMalloc after the first step);
//! - `fence(exec, deadline)`: a cudaEventQuery loop that also polls the communicator's
//!   asynchronous error (ncclCommGetAsyncError) and never waits past the deadline.
//!
//! Kernels live in namespace commpact::cuda_kernels (not commpact::cuda, which would
//! shadow ::cuda and break `cuda::std::span` inside namespace commpact).

#if defined(__CUDACC__)
namespace commpact {
struct cuda_space;
}  // namespace commpact
#endif
