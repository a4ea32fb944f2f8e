// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cuda_device.hpp
//! The CUDA space's device plumbing: CUDA errors as device_error, cuda_device_guard,
//! the allocator hook (cuda_allocator, cudaMallocAsync / cudaFreeAsync by default), a
//! stream's device, the join of one stream after another, and the shared event handle.
//! Part of cuda_space (include commpact/space/cuda.hpp); compiled only by nvcc.

#if defined(__CUDACC__)

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

#include "../error.hpp"

namespace commpact {

namespace detail {
inline void cuda_check_space(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw device_error(cat("commpact::cuda_space: ", what, " failed with ", cudaGetErrorName(e), " (",
                           cudaGetErrorString(e), "); check the device and the sizes passed."));
}
}  // namespace detail

//! Makes `device` current for a scope and restores the previous device after it (a no-op
//! when it is current already, or when device < 0).
class cuda_device_guard {
 public:
  explicit cuda_device_guard(int device) {
    if (device < 0) return;
    detail::cuda_check_space(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) {
      detail::cuda_check_space(cudaSetDevice(device), "cudaSetDevice");
      set_ = true;
    }
  }
  //! For destructors: errors are ignored (the guard then changes nothing).
  cuda_device_guard(int device, std::nothrow_t) noexcept {
    if (device < 0 || cudaGetDevice(&prev_) != cudaSuccess) return;
    set_ = prev_ != device && cudaSetDevice(device) == cudaSuccess;
  }
  cuda_device_guard(const cuda_device_guard&) = delete;
  cuda_device_guard& operator=(const cuda_device_guard&) = delete;
  ~cuda_device_guard() {
    if (set_) (void)cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool set_ = false;
};

//! Where device memory comes from: a hook so that a framework's caching allocator can
//! serve commpact's buffers, workspaces and scratch. Both calls are stream-ordered on the
//! stream they get: `alloc` returns memory usable by work queued on that stream from now
//! on (nullptr on failure), `free` returns it once the work queued on that stream so far
//! has finished. The default is cudaMallocAsync / cudaFreeAsync.
//!
//! PyTorch's caching allocator fits this shape (in the extension, which has torch's
//! headers; this file includes none):
//! <!-- snippet: skip (needs LibTorch's CUDA headers (c10/cuda) under nvcc: python/commpact_hooks.cpp's torch_alloc and torch_free, compiled by test_torch_cuda_objects, are this code) -->
//! \code
//! void* torch_alloc(std::size_t bytes, cudaStream_t s, void*) {
//!   try { return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, s); }
//!   catch (...) { return nullptr; }   // out of memory: commpact raises device_error
//! }
//! void torch_free(void* p, std::size_t, cudaStream_t, void*) {
//!   c10::cuda::CUDACachingAllocator::raw_delete(p);  // reused in the order of p's stream
//! }
//! static const commpact::cuda_allocator torch_hook{&torch_alloc, &torch_free, nullptr};
//! auto e = commpact::cuda_space::make_exec(at::cuda::getCurrentCUDAStream().stream(), &torch_hook);
//! \endcode
//! (raw_delete returns the block to the pool of the stream it was allocated on; commpact
//! frees on that same stream, so the caching allocator's reuse is ordered after the work
//! commpact queued there.) The hook must outlive every executor and buffer using it.
struct cuda_allocator {
  void* (*alloc)(std::size_t bytes, cudaStream_t stream, void* ctx) = nullptr;
  void (*free)(void* p, std::size_t bytes, cudaStream_t stream, void* ctx) = nullptr;
  void* ctx = nullptr;

  //! `bytes` (at least 1) usable on `stream`; raises device_error when the hook fails.
  void* allocate(std::size_t bytes, cudaStream_t stream) const {
    if (bytes == 0) bytes = 1;
    void* p = nullptr;
    if (alloc) {
      p = alloc(bytes, stream, ctx);
    } else if (cudaMallocAsync(&p, bytes, stream) != cudaSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    require<device_error>(p != nullptr, "commpact::cuda_space: allocating ", bytes,
                          " bytes of device memory failed; free device memory or pass a smaller gradient.");
    return p;
  }
  //! Returns p (allocate(bytes, ...)) once the work queued on `stream` so far has finished.
  void deallocate(void* p, std::size_t bytes, cudaStream_t stream) const noexcept {
    if (!p) return;
    if (bytes == 0) bytes = 1;
    if (free) free(p, bytes, stream, ctx);
    else (void)cudaFreeAsync(p, stream);
  }
};

//! The default allocator (cudaMallocAsync / cudaFreeAsync).
inline const cuda_allocator* cuda_default_allocator() {
  static const cuda_allocator a{};
  return &a;
}

namespace detail {
//! The device a stream belongs to (the current device for the special handles).
inline int cuda_stream_device(cudaStream_t s) {
  int d = 0;
#if CUDART_VERSION >= 12080
  if (s != nullptr && s != cudaStreamPerThread && s != cudaStreamLegacy) {
    cuda_check_space(cudaStreamGetDevice(s, &d), "cudaStreamGetDevice");
    return d;
  }
#else
  (void)s;
#endif
  cuda_check_space(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}
//! Orders the work queued on `to` from now on after the work queued on `from` so far
//! (an event recorded on `from`, made on from_device; no host wait).
inline void cuda_join_streams(cudaStream_t from, int from_device, cudaStream_t to) {
  if (from == to) return;
  cuda_device_guard g(from_device);
  cudaEvent_t ev = nullptr;
  cuda_check_space(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate (stream join)");
  const cudaError_t r = cudaEventRecord(ev, from);
  const cudaError_t w = r == cudaSuccess ? cudaStreamWaitEvent(to, ev, 0) : r;
  (void)cudaEventDestroy(ev);  // released once it completes; the wait above is already queued
  cuda_check_space(w, "cudaEventRecord/cudaStreamWaitEvent (stream join)");
}

//! One CUDA event, destroyed with the last event handle that shares it (unless adopted).
struct cuda_event_handle {
  cudaEvent_t ev = nullptr;
  int device = -1;
  bool owned = true;
  cuda_event_handle() = default;
  cuda_event_handle(const cuda_event_handle&) = delete;
  cuda_event_handle& operator=(const cuda_event_handle&) = delete;
  ~cuda_event_handle() {
    if (owned && ev) {
      cuda_device_guard g(device, std::nothrow);
      (void)cudaEventDestroy(ev);
    }
  }
  static std::shared_ptr<cuda_event_handle> make(int device) {
    auto h = std::make_shared<cuda_event_handle>();
    cuda_device_guard g(device);
    cuda_check_space(cudaEventCreateWithFlags(&h->ev, cudaEventDisableTiming), "cudaEventCreate");
    h->device = device;
    return h;
  }
};
}  // namespace detail

}  // namespace commpact

#endif  // __CUDACC__
