// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cuda_buffer.hpp
//! The CUDA space's storage: cuda_buffer<T> (grow-only device memory, stream-ordered),
//! cuda_workspace_bytes (a workspace's bytes on one stream at a time) and
//! cuda_pinned_buffer<T> (page-locked host memory copies land in).
//! Part of cuda_space (include commpact/space/cuda.hpp); compiled only by nvcc.

#if defined(__CUDACC__)

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

#include "../error.hpp"
#include "cuda_device.hpp"
#include "cuda_exec.hpp"
#include "cuda_span.hpp"

namespace commpact {

//! Grow-only device storage, stream-ordered (see the file comment). Not copyable;
//! movable; swap() swaps storage and binding (the commit of error feedback).
template <class T>
class cuda_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "commpact::cuda_buffer holds trivially copyable types only.");

 public:
  //! `a`: the allocator hook; nullptr takes the hook of the executor that binds the
  //! buffer (or the default one when none does).
  explicit cuda_buffer(const cuda_allocator* a = nullptr) : want_(a) {}
  cuda_buffer(const cuda_buffer&) = delete;
  cuda_buffer& operator=(const cuda_buffer&) = delete;
  cuda_buffer(cuda_buffer&& o) noexcept { swap(o); }
  cuda_buffer& operator=(cuda_buffer&& o) noexcept {
    swap(o);
    return *this;
  }
  ~cuda_buffer() { release(); }

  //! Binds the buffer to e's stream (see the file comment); when it was bound to another
  //! stream, e's stream is first ordered after that one's work.
  void bind(const cuda_exec& e) {
    require(e.s != nullptr, "commpact::cuda_buffer: the executor has no stream; make one with "
                            "cuda_space::make_exec().");
    if (st_ == e.s) return;
    if (p_ && st_) detail::cuda_join_streams(st_->stream, st_->device, e.s->stream);
    st_ = e.s;
  }
  //! Makes room for n elements on e's stream, keeping the contents (queued, no host wait).
  void reserve(std::size_t n, const cuda_exec& e) {
    bind(e);
    if (n > cap_) {
      cuda_device_guard g(st_->device);
      regrow(n, st_->stream);
    }
  }
  //! n elements on e's stream; new ones poisoned (0xFF bytes), the rest kept (queued).
  void resize(std::size_t n, const cuda_exec& e) {
    bind(e);
    if (n <= n_) {
      n_ = n;
      return;
    }
    cuda_device_guard g(st_->device);
    grow_to(n, st_->stream);
  }
  //! reserve on the bound stream; never bound: the set-up fallback (see resize(n)).
  void reserve(std::size_t n) {
    if (n <= cap_) return;
    if (st_) {
      cuda_device_guard g(st_->device);
      regrow(n, st_->stream);
      return;
    }
    regrow(n, cudaStreamPerThread);
    unbound_wait();
  }
  //! resize on the bound stream. A buffer never bound grows on the calling thread's
  //! per-thread default stream and waits for it (a set-up-time fallback).
  void resize(std::size_t n) {
    if (n <= n_) {
      n_ = n;
      return;
    }
    if (st_) {
      cuda_device_guard g(st_->device);
      grow_to(n, st_->stream);
      return;
    }
    grow_to(n, cudaStreamPerThread);
    unbound_wait();
  }
  std::size_t size() const { return n_; }
  std::size_t capacity() const { return cap_; }
  bool empty() const { return n_ == 0; }
  void clear() { n_ = 0; }
  cuda_span<T> view() { return {p_, n_}; }
  cuda_span<const T> view() const { return {p_, n_}; }
  cuda_span<const T> cview() const { return view(); }
  const void* data() const { return p_; }
  //! The stream the storage is ordered on (nullptr: never bound).
  cudaStream_t bound_stream() const { return st_ ? st_->stream : nullptr; }
  void swap(cuda_buffer& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(cap_, o.cap_);
    std::swap(want_, o.want_);
    std::swap(owner_, o.owner_);
    std::swap(dev_, o.dev_);
    st_.swap(o.st_);
  }

 private:
  const cuda_allocator* choose() const {
    if (owner_) return owner_;
    if (want_) return want_;
    return st_ ? st_->alloc : cuda_default_allocator();
  }
  //! New storage of n elements on s, the contents copied there, the old storage freed
  //! there (all queued on s). The caller made the right device current.
  void regrow(std::size_t n, cudaStream_t s) {
    const cuda_allocator* a = choose();
    T* q = static_cast<T*>(a->allocate(n * sizeof(T), s));
    if (n_) {
      const cudaError_t r = cudaMemcpyAsync(q, p_, n_ * sizeof(T), cudaMemcpyDeviceToDevice, s);
      if (r != cudaSuccess) {
        a->deallocate(q, n * sizeof(T), s);
        detail::cuda_check_space(r, "cudaMemcpyAsync (growing a buffer)");
      }
    }
    if (p_) owner_->deallocate(p_, cap_ * sizeof(T), s);
    p_ = q;
    cap_ = n;
    owner_ = a;
    if (!st_) detail::cuda_check_space(cudaGetDevice(&dev_), "cudaGetDevice");
  }
  void grow_to(std::size_t n, cudaStream_t s) {
    if (n > cap_) regrow(n, s);
    detail::cuda_check_space(cudaMemsetAsync(p_ + n_, 0xFF, (n - n_) * sizeof(T), s),
                             "cudaMemsetAsync (poisoning new elements)");
    n_ = n;
  }
  static void unbound_wait() {
    detail::cuda_check_space(cudaStreamSynchronize(cudaStreamPerThread),  // commpact-discipline: allow set-up fallback of a buffer never bound to an executor
                             "cudaStreamSynchronize (growing a buffer bound to no executor)");
  }
  void release() noexcept {
    if (!p_) return;
    if (st_) {
      cuda_device_guard g(st_->device, std::nothrow);
      owner_->deallocate(p_, cap_ * sizeof(T), st_->stream);
    } else {
      cuda_device_guard g(dev_, std::nothrow);
      owner_->deallocate(p_, cap_ * sizeof(T), cudaStreamPerThread);
    }
    p_ = nullptr;
    n_ = cap_ = 0;
  }

  T* p_ = nullptr;
  std::size_t n_ = 0, cap_ = 0;
  const cuda_allocator* want_ = nullptr;   // the constructor's hook (nullptr: the executor's)
  const cuda_allocator* owner_ = nullptr;  // the hook p_ came from
  int dev_ = -1;                           // the device of unbound storage
  std::shared_ptr<cuda_exec_state> st_;    // the executor whose stream orders the storage
};

//! Grow-only device bytes ordered on one stream at a time: the storage behind a
//! workspace (top-k's, the sparse merge's). Growth frees the old bytes on that stream
//! after the work queued there and allocates the new ones there; nothing waits on the
//! host. bind(exec) orders it on an executor's stream (kept alive with it); use(stream)
//! on a caller's raw stream (the caller keeps that stream alive until the storage is
//! destroyed or moved to another stream). Moving to another stream orders the new stream
//! after the old one. Not copyable; movable.
class cuda_workspace_bytes {
 public:
  explicit cuda_workspace_bytes(const cuda_allocator* a = nullptr) : want_(a) {}
  cuda_workspace_bytes(const cuda_workspace_bytes&) = delete;
  cuda_workspace_bytes& operator=(const cuda_workspace_bytes&) = delete;
  cuda_workspace_bytes(cuda_workspace_bytes&& o) noexcept { swap(o); }
  cuda_workspace_bytes& operator=(cuda_workspace_bytes&& o) noexcept {
    swap(o);
    return *this;
  }
  ~cuda_workspace_bytes() {
    if (!p_) return;
    cuda_device_guard g(dev_, std::nothrow);
    owner_->deallocate(p_, bytes_, stream_);
  }

  //! Orders the storage on e's stream (and, while it holds nothing, takes e's allocator
  //! unless one was chosen).
  void bind(const cuda_exec& e) {
    require(e.s != nullptr, "commpact::cuda_workspace_bytes: the executor has no stream; make one with "
                            "cuda_space::make_exec().");
    move_to(e.s->stream, e.s->device);
    st_ = e.s;
    if (!p_ && !want_) a_ = e.s->alloc;
  }
  //! Orders the storage on a caller's stream.
  void use(cudaStream_t stream) {
    if (ordered_ && stream == stream_) return;
    move_to(stream, detail::cuda_stream_device(stream));
    st_.reset();
  }
  //! At least `bytes`, stream-ordered on the stream set by bind/use (one of them first);
  //! true when it allocated.
  bool grow(std::size_t bytes) {
    if (bytes <= bytes_) return false;
    require(ordered_, "commpact::cuda_workspace_bytes: grow before bind(exec) or use(stream).");
    cuda_device_guard g(dev_);
    const cuda_allocator* a = a_ ? a_ : want_ ? want_ : cuda_default_allocator();
    void* q = a->allocate(bytes, stream_);
    if (p_) owner_->deallocate(p_, bytes_, stream_);
    p_ = q;
    bytes_ = bytes;
    owner_ = a;
    return true;
  }
  //! The allocator of the next growth while it holds nothing.
  void set_allocator(const cuda_allocator* a) {
    if (!p_ && a) a_ = want_ = a;
  }
  [[nodiscard]] bool ordered() const noexcept { return ordered_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] void* data() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  void swap(cuda_workspace_bytes& o) noexcept {
    std::swap(want_, o.want_);
    std::swap(a_, o.a_);
    std::swap(owner_, o.owner_);
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    std::swap(stream_, o.stream_);
    std::swap(ordered_, o.ordered_);
    std::swap(dev_, o.dev_);
    st_.swap(o.st_);
  }

 private:
  void move_to(cudaStream_t stream, int device) {
    if (ordered_ && stream == stream_) {
      dev_ = device;
      return;
    }
    if (p_ && ordered_) detail::cuda_join_streams(stream_, dev_, stream);
    stream_ = stream;
    dev_ = device;
    ordered_ = true;
  }
  const cuda_allocator* want_ = nullptr;   // the constructor's or set_allocator's hook
  const cuda_allocator* a_ = nullptr;      // the hook of the next growth
  const cuda_allocator* owner_ = nullptr;  // the hook p_ came from
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;  // the stream the bytes are ordered on, once ordered_
  bool ordered_ = false;
  int dev_ = -1;
  std::shared_ptr<cuda_exec_state> st_;  // keeps a bound executor's stream alive
};

//! Grow-only page-locked host memory (cudaHostAlloc, portable across devices): the
//! landing place of device-to-host copies that must stay queued (see the file comment).
//! New elements are zero. Not copyable; movable.
template <class T>
class cuda_pinned_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "commpact::cuda_pinned_buffer holds trivially copyable types only.");

 public:
  cuda_pinned_buffer() = default;
  cuda_pinned_buffer(const cuda_pinned_buffer&) = delete;
  cuda_pinned_buffer& operator=(const cuda_pinned_buffer&) = delete;
  cuda_pinned_buffer(cuda_pinned_buffer&& o) noexcept { swap(o); }
  cuda_pinned_buffer& operator=(cuda_pinned_buffer&& o) noexcept {
    swap(o);
    return *this;
  }
  ~cuda_pinned_buffer() {
    if (p_) (void)cudaFreeHost(p_);
  }

  //! Makes room for n elements, keeping the contents. Growing frees the old storage at
  //! once: grow before queueing copies into it.
  void reserve(std::size_t n) {
    if (n <= cap_) return;
    void* q = nullptr;
    detail::cuda_check_space(cudaHostAlloc(&q, n * sizeof(T), cudaHostAllocPortable), "cudaHostAlloc");
    if (n_) std::memcpy(q, static_cast<const void*>(p_), n_ * sizeof(T));
    if (p_) (void)cudaFreeHost(p_);
    p_ = static_cast<T*>(q);
    cap_ = n;
  }
  void resize(std::size_t n) {
    reserve(n);
    if (n > n_) std::memset(static_cast<void*>(p_ + n_), 0, (n - n_) * sizeof(T));
    n_ = n;
  }
  std::size_t size() const { return n_; }
  std::size_t capacity() const { return cap_; }
  bool empty() const { return n_ == 0; }
  void clear() { n_ = 0; }
  std::span<T> view() { return {p_, n_}; }
  std::span<const T> view() const { return {p_, n_}; }
  std::span<const T> cview() const { return view(); }
  const void* data() const { return p_; }
  void swap(cuda_pinned_buffer& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(cap_, o.cap_);
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0, cap_ = 0;
};

}  // namespace commpact

#endif  // __CUDACC__
