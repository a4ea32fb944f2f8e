// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cuda.hpp
//! cuda_space: data in GPU memory, work queued on a CUDA stream (the Space concept,
//! concepts/space.hpp). Compiled only by nvcc; its kernel table is ops<cuda_space>
//! (kernels/cuda/ops.cuh).
//!
//! NOT YET RUN ON A GPU: this file compiles with nvcc 13 and is checked against the Space
//! concept at compile time (tests/cuda/test_cuda_ops.cu); every behaviour below is what
//! the code is written to do, pending scripts/device-check on a machine with a GPU.
//!
//! - `span<T>` (cuda_span): a device pointer and a length. Host code cannot index it
//!   (operator[] is __device__ only: nvcc rejects a host call); kernels get the pointer
//!   through cuda_access, never algorithm code.
//! - `buffer<T>` (cuda_buffer): grow-only device storage from an allocator hook
//!   (cuda_allocator; cudaMalloc/cudaFree by default). Growing it synchronises the device
//!   (it copies the old contents and poisons the new elements with 0xFF bytes, a NaN for
//!   floats), so size buffers at the first step, before queueing work on them, as on the
//!   deferred space. Once grown, resize() within capacity allocates nothing.
//! - `exec` (cuda_exec): a shared handle to a stream, an allocator hook, an event for the
//!   fence, and the hooks a communicator installs (its asynchronous-error poll and what to
//!   do when a deadline passes). Copies share the state, like a stream handle.
//! - `fence(exec, deadline)`: records the event on the stream and polls it
//!   (cudaEventQuery) and the communicator's asynchronous error, yielding between polls;
//!   returns when the event completed, raises device_error on a CUDA error, the
//!   communicator's error when its poll raises, and timeout_error (after calling the
//!   communicator's on_timeout hook, e.g. ncclCommAbort) once the deadline has passed. It
//!   never waits past the deadline by more than one poll.
//!
//! Kernels live in namespace commpact::cuda_kernels (not commpact::cuda, which would
//! shadow ::cuda and break `cuda::std::span` inside namespace commpact).

#if defined(__CUDACC__)

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <type_traits>
#include <utility>

#include "../error.hpp"
#include "host.hpp"

namespace commpact {

//! Where device memory comes from: a hook so that a framework's caching allocator
//! (PyTorch's, say) can serve commpact's buffers and workspaces. alloc returns nullptr on
//! failure. The default is cudaMalloc / cudaFree.
struct cuda_allocator {
  void* (*alloc)(std::size_t bytes, void* ctx) = nullptr;
  void (*free)(void* p, void* ctx) = nullptr;
  void* ctx = nullptr;

  void* allocate(std::size_t bytes) const {
    if (bytes == 0) bytes = 1;
    void* p = nullptr;
    if (alloc) {
      p = alloc(bytes, ctx);
    } else if (cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    require<device_error>(p != nullptr, "commpact::cuda_space: allocating ", bytes,
                          " bytes of device memory failed; free device memory or pass a smaller gradient.");
    return p;
  }
  void deallocate(void* p) const noexcept {
    if (!p) return;
    if (free) free(p, ctx);
    else (void)cudaFree(p);
  }
};

//! The default allocator (cudaMalloc / cudaFree).
inline const cuda_allocator* cuda_default_allocator() {
  static const cuda_allocator a{};
  return &a;
}

template <class T>
class cuda_span;

//! The one door from a device span to its pointer: for kernels (ops<cuda_space>) and
//! communicators of the CUDA space, never for algorithm code.
struct cuda_access {
  template <class T>
  static T* ptr(cuda_span<T> s) {
    return s.p_;
  }
  template <class T>
  static cuda_span<T> wrap(T* p, std::size_t n) {
    return cuda_span<T>(p, n);
  }
};

//! A view of device memory: a pointer and a length, no element access from host code.
template <class T>
class cuda_span {
 public:
  using element_type = T;
  cuda_span() = default;
  //! A non-const span converts to a const one.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  cuda_span(cuda_span<U> o) : p_(o.p_), n_(o.n_) {}

  std::size_t size() const { return n_; }
  std::size_t size_bytes() const { return n_ * sizeof(T); }
  bool empty() const { return n_ == 0; }
  cuda_span subspan(std::size_t off, std::size_t count = std::size_t(-1)) const {
    require(off <= n_, "commpact::cuda_span::subspan: offset ", off, " is past the end (", n_, " elements).");
    const std::size_t c = count == std::size_t(-1) ? n_ - off : count;
    require(c <= n_ - off, "commpact::cuda_span::subspan: ", c, " elements from ", off, " run past the end (", n_,
            " elements).");
    return cuda_span(p_ + off, c);
  }
  cuda_span first(std::size_t count) const { return subspan(0, count); }
  //! Where the span starts, for identity checks only (a device address: never dereferenced on the host).
  const void* address() const { return p_; }

  //! Device code only: host code cannot read device memory (copy it with
  //! ops<cuda_space>::to_host and fence first). nvcc rejects a call from host code.
  __device__ T& operator[](std::size_t i) const { return p_[i]; }

 private:
  cuda_span(T* p, std::size_t n) : p_(p), n_(n) {}
  template <class>
  friend class cuda_span;
  template <class>
  friend class cuda_buffer;
  friend struct cuda_access;
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

//! The bytes of a device span, still on the device (for known-size point-to-point of
//! typed buffers, as comm/ring.hpp's ring_allreduce_spans sends CastAllreduce's codes;
//! found by argument-dependent lookup, as std::as_bytes is for std::span).
template <class T>
cuda_span<const std::byte> as_bytes(cuda_span<T> s) {
  return cuda_access::wrap(reinterpret_cast<const std::byte*>(cuda_access::ptr(s)), s.size_bytes());
}
template <class T>
  requires(!std::is_const_v<T>)
cuda_span<std::byte> as_writable_bytes(cuda_span<T> s) {
  return cuda_access::wrap(reinterpret_cast<std::byte*>(cuda_access::ptr(s)), s.size_bytes());
}

namespace detail {
inline void cuda_check_space(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw device_error(cat("commpact::cuda_space: ", what, " failed with ", cudaGetErrorName(e), " (",
                           cudaGetErrorString(e), "); check the device and the sizes passed."));
}
}  // namespace detail

//! Grow-only device storage (see the file comment). Not copyable; movable; swap() swaps
//! storage (the commit of error feedback).
template <class T>
class cuda_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "commpact::cuda_buffer holds trivially copyable types only.");

 public:
  explicit cuda_buffer(const cuda_allocator* a = cuda_default_allocator()) : a_(a) {}
  cuda_buffer(const cuda_buffer&) = delete;
  cuda_buffer& operator=(const cuda_buffer&) = delete;
  cuda_buffer(cuda_buffer&& o) noexcept { swap(o); }
  cuda_buffer& operator=(cuda_buffer&& o) noexcept {
    swap(o);
    return *this;
  }
  ~cuda_buffer() { a_->deallocate(p_); }

  //! Makes room for n elements, keeping the contents (synchronises the device when it grows).
  void reserve(std::size_t n) {
    if (n <= cap_) return;
    T* q = static_cast<T*>(a_->allocate(n * sizeof(T)));
    detail::cuda_check_space(cudaDeviceSynchronize(), "cudaDeviceSynchronize before growing a buffer");
    if (n_) detail::cuda_check_space(cudaMemcpy(q, p_, n_ * sizeof(T), cudaMemcpyDeviceToDevice), "cudaMemcpy");
    a_->deallocate(p_);
    p_ = q;
    cap_ = n;
  }
  //! New elements are poisoned (0xFF bytes); a size that grows synchronises the device.
  void resize(std::size_t n) {
    reserve(n);
    if (n > n_) {
      // Queued work (on any stream) may still use the storage: wait for it first.
      detail::cuda_check_space(cudaDeviceSynchronize(), "cudaDeviceSynchronize before poisoning a buffer");
      detail::cuda_check_space(cudaMemset(p_ + n_, 0xFF, (n - n_) * sizeof(T)), "cudaMemset");
      detail::cuda_check_space(cudaDeviceSynchronize(), "cudaDeviceSynchronize after poisoning a buffer");
    }
    n_ = n;
  }
  std::size_t size() const { return n_; }
  std::size_t capacity() const { return cap_; }
  bool empty() const { return n_ == 0; }
  void clear() { n_ = 0; }
  cuda_span<T> view() { return {p_, n_}; }
  cuda_span<const T> view() const { return {p_, n_}; }
  cuda_span<const T> cview() const { return view(); }
  const void* data() const { return p_; }
  void swap(cuda_buffer& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(cap_, o.cap_);
    std::swap(a_, o.a_);
  }

 private:
  const cuda_allocator* a_ = cuda_default_allocator();
  T* p_ = nullptr;
  std::size_t n_ = 0, cap_ = 0;
};

//! What a CUDA executor carries (shared by its copies).
struct cuda_exec_state {
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  cudaEvent_t done = nullptr;
  const cuda_allocator* alloc = cuda_default_allocator();
  //! Installed by a communicator: raises its asynchronous error (ncclCommGetAsyncError).
  std::function<void()> poll_async_error;
  //! Installed by a communicator: called once a fence's deadline has passed, before
  //! timeout_error is raised (ncclCommAbort, so that peers stop waiting too).
  std::function<void(const char*)> on_timeout;
  //! Small grow-only device scratch for kernels without a workspace argument (clip_scale,
  //! PowerSGD's cuBLAS approximation tiles).
  void* scratch = nullptr;
  std::size_t scratch_bytes = 0;
  //! A library handle bound to this stream, made once by the first row that needs it
  //! (kernels/cuda/blas.cuh: the cuBLAS handle of power_products::blas), destroyed with
  //! the state, before the stream. Type-erased so that this file needs no cuBLAS header.
  void* blas = nullptr;
  void (*blas_destroy)(void*) noexcept = nullptr;

  cuda_exec_state() = default;
  cuda_exec_state(const cuda_exec_state&) = delete;
  cuda_exec_state& operator=(const cuda_exec_state&) = delete;
  ~cuda_exec_state() {
    if (blas && blas_destroy) blas_destroy(blas);
    if (scratch) alloc->deallocate(scratch);
    if (done) (void)cudaEventDestroy(done);
    if (owns_stream && stream) (void)cudaStreamDestroy(stream);
  }
};

struct cuda_space {
  static constexpr const char* name = "cuda_space";
  static constexpr bool host_accessible = false;
  template <class T>
  using span = cuda_span<T>;
  template <class T>
  using buffer = cuda_buffer<T>;

  //! The executor: a stream, an allocator hook and a communicator's hooks.
  struct exec {
    std::shared_ptr<cuda_exec_state> s;
    cudaStream_t stream() const { return s ? s->stream : nullptr; }
    const cuda_allocator* allocator() const { return s ? s->alloc : cuda_default_allocator(); }
    //! The executor's scratch, grown to at least `bytes` (growing synchronises the stream).
    void* scratch(std::size_t bytes) const {
      require(s != nullptr, "commpact::cuda_space: this executor has no stream; make one with "
                            "cuda_space::make_exec().");
      if (bytes > s->scratch_bytes) {
        detail::cuda_check_space(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize before growing scratch");
        s->alloc->deallocate(s->scratch);
        s->scratch = nullptr;
        s->scratch_bytes = 0;
        s->scratch = s->alloc->allocate(bytes);
        s->scratch_bytes = bytes;
      }
      return s->scratch;
    }
  };

  //! An executor on `stream` (nullptr: a new non-blocking stream it owns) with `alloc`.
  static exec make_exec(cudaStream_t stream = nullptr, const cuda_allocator* alloc = cuda_default_allocator()) {
    auto st = std::make_shared<cuda_exec_state>();
    if (!stream) {
      detail::cuda_check_space(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "cudaStreamCreate");
      st->owns_stream = true;
    } else {
      st->stream = stream;
    }
    detail::cuda_check_space(cudaEventCreateWithFlags(&st->done, cudaEventDisableTiming), "cudaEventCreate");
    st->alloc = alloc ? alloc : cuda_default_allocator();
    return {std::move(st)};
  }

  //! Waits for the work queued on e (see the file comment).
  static void fence(exec e, deadline until) {
    require(e.s != nullptr, "commpact::cuda_space::fence: this executor has no stream; make one with "
                            "cuda_space::make_exec().");
    auto& s = *e.s;
    detail::cuda_check_space(cudaEventRecord(s.done, s.stream), "cudaEventRecord");
    for (unsigned spin = 0;; ++spin) {
      const cudaError_t q = cudaEventQuery(s.done);
      if (q == cudaSuccess) {
        // (A kernel that faulted makes cudaEventQuery return that error instead.)
        if (s.poll_async_error) s.poll_async_error();
        return;
      }
      if (q != cudaErrorNotReady) detail::cuda_check_space(q, "the work queued on this executor");
      if (s.poll_async_error) s.poll_async_error();
      if (std::chrono::steady_clock::now() > until) {
        if (s.on_timeout) s.on_timeout("commpact::cuda_space::fence: the deadline passed");
        throw timeout_error("commpact::cuda_space::fence: the deadline passed with work still queued on the "
                            "stream; the step is abandoned.");
      }
      if (spin > 64) std::this_thread::yield();
    }
  }
};

}  // namespace commpact

#else

namespace commpact {
struct cuda_space;  // defined when compiled by nvcc
}  // namespace commpact

#endif
