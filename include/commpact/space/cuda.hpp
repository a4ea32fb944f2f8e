// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cuda.hpp
//! cuda_space: data in GPU memory, work queued on a CUDA stream (the Space concept,
//! concepts/space.hpp). Compiled only by nvcc; its kernel table is ops<cuda_space>
//! (kernels/cuda/ops.cuh).
//!
//! Checked against the Space concept at compile time (tests/cuda/test_cuda_ops.cu); the rules
//! below are tested by tests/cuda/test_cuda_space_discipline.cu (docs/kernels.md, "Status",
//! says where it has run).
//!
//! - `span<T>` (cuda_span): a device pointer and a length. Host code cannot index it
//!   (operator[] is __device__ only: nvcc rejects a host call); kernels get the pointer
//!   through cuda_access, never algorithm code.
//! - `exec` (cuda_exec): a shared handle to a stream, the device it belongs to, an
//!   allocator hook, an event for the fence, grow-only scratch slots (one per row), and the hooks of
//!   the communicators that queue work on it. Copies share the state, like a stream
//!   handle. `make_exec(stream)` wraps a caller's stream (a framework's current stream);
//!   the stream must outlive the executor and everything bound to it.
//! - `buffer<T>` (cuda_buffer): grow-only device storage, stream-ordered. `resize(n, exec)`
//!   and `reserve(n, exec)` bind it to the executor's stream: growth allocates there
//!   (the allocator hook, cudaMallocAsync by default), copies the old contents and poisons
//!   the new elements (0xFF bytes, a NaN for floats) with cudaMemcpyAsync/cudaMemsetAsync
//!   there, and frees the old storage there (cudaFreeAsync): nothing waits on the host,
//!   and no storage is returned while work queued on that stream may still use it. The
//!   destructor frees on the bound stream too. Binding to another executor's stream first
//!   orders that stream after the old one (an event). `resize(n)` uses the bound stream;
//!   a buffer never bound uses the calling thread's per-thread default stream and waits
//!   for it (a set-up-time fallback: bind buffers that work is queued on). Work queued
//!   on a stream other than the bound one must be joined to it (record/wait) before the
//!   buffer is regrown or destroyed, as for any stream-ordered allocation.
//! - `pinned<T>` (cuda_pinned_buffer): grow-only page-locked host memory (cudaHostAlloc),
//!   where device-to-host copies land without blocking the host: status words, headers
//!   and counts that a step reads after its fence. Grow it before queueing copies into it
//!   (growing frees the old storage at once).
//! - `event` (cuda_event): `record(exec)` marks the work queued so far (a cudaEvent_t
//!   recorded on the stream); `wait(exec, ev)` orders the work queued on exec from then on
//!   after it (cudaStreamWaitEvent): no host wait. `record_stream(stream)` marks a
//!   caller's stream (join a framework's backward before a step), `stream_wait(stream,
//!   ev)` makes a caller's stream wait for a step, `cuda_event::adopt(ev)` wraps a
//!   caller's cudaEvent_t.
//! - `fence(exec, deadline)`: records the fence event on the stream and polls it
//!   (cudaEventQuery) and every communicator hook's asynchronous-error poll, yielding
//!   between polls; returns when the event completed, raises device_error on a CUDA error,
//!   a communicator's error when its poll raises, and timeout_error (after calling every
//!   hook's on_timeout, e.g. ncclCommAbort) once the deadline has passed. It never waits
//!   past the deadline by more than one poll. Inside a `cuda_fence_point` scope it waits
//!   for that earlier point of the stream instead (a deferred step's finish).
//! - `activate(exec)`: makes the executor's device current on the calling thread (every
//!   entry point and worker thread calls it); cuda_device_guard does the same for a scope.
//!
//! Kernels live in namespace commpact::cuda_kernels (not commpact::cuda, which would
//! shadow ::cuda and break `cuda::std::span` inside namespace commpact).

#if defined(__CUDACC__)

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "host.hpp"

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

//! A communicator's hooks on an executor, keyed by the communicator (`owner`): `poll`
//! raises its asynchronous error (ncclCommGetAsyncError), `on_timeout` runs once a
//! fence's deadline has passed, before timeout_error is raised (ncclCommAbort, so that
//! peers stop waiting too). Either may be empty.
struct cuda_exec_hook {
  const void* owner = nullptr;
  std::function<void()> poll;
  std::function<void(const char*)> on_timeout;
};

//! What a CUDA executor carries (shared by its copies).
struct cuda_exec_state {
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  int device = 0;
  cudaEvent_t done = nullptr;
  const cuda_allocator* alloc = cuda_default_allocator();
  //! Grow-only device scratch of the rows without a workspace argument (clip_scale,
  //! PowerSGD's cuBLAS approximation tiles, OkTopK's control words), one slot per row,
  //! named by the row, each stream-ordered on `stream`: rows never share bytes.
  struct scratch_slot {
    std::string_view row;
    void* p = nullptr;
    std::size_t bytes = 0;
  };
  std::vector<scratch_slot> scratch;
  std::size_t scratch_allocations = 0;  // slot growths since construction
  //! A library handle bound to this stream, made once by the first row that needs it
  //! (kernels/cuda/blas.cuh: the cuBLAS handle of power_products::blas), destroyed with
  //! the state, before the stream. Type-erased so that this file needs no cuBLAS header.
  void* blas = nullptr;
  void (*blas_destroy)(void*) noexcept = nullptr;
  //! The event record() marked last; reused when no event handle shares it any more.
  std::shared_ptr<detail::cuda_event_handle> last_event;
  //! While set (cuda_fence_point), fence() waits for this point instead of the work
  //! queued so far: a deferred step's finish waits for its own work only.
  std::shared_ptr<detail::cuda_event_handle> fence_point;

  cuda_exec_state() = default;
  cuda_exec_state(const cuda_exec_state&) = delete;
  cuda_exec_state& operator=(const cuda_exec_state&) = delete;
  ~cuda_exec_state() {
    cuda_device_guard g(device, std::nothrow);
    if (blas && blas_destroy) blas_destroy(blas);
    for (const scratch_slot& x : scratch)
      if (x.p) alloc->deallocate(x.p, x.bytes, stream);
    last_event.reset();
    if (done) (void)cudaEventDestroy(done);
    // Work still queued (the free above included) completes; the stream's resources go then.
    if (owns_stream && stream) (void)cudaStreamDestroy(stream);
  }

  //! Installs (or replaces) the hooks of h.owner.
  void add_hook(cuda_exec_hook h) {
    std::lock_guard lk(hooks_m_);
    auto v = hooks_ ? std::make_shared<std::vector<cuda_exec_hook>>(*hooks_)
                    : std::make_shared<std::vector<cuda_exec_hook>>();
    std::erase_if(*v, [&](const cuda_exec_hook& o) { return o.owner == h.owner; });
    v->push_back(std::move(h));
    hooks_ = std::move(v);
  }
  //! Removes the hooks of owner (a communicator's destructor).
  void remove_hook(const void* owner) noexcept {
    std::lock_guard lk(hooks_m_);
    if (!hooks_) return;
    try {
      auto v = std::make_shared<std::vector<cuda_exec_hook>>(*hooks_);
      std::erase_if(*v, [&](const cuda_exec_hook& o) { return o.owner == owner; });
      hooks_ = v->empty() ? nullptr : std::shared_ptr<const std::vector<cuda_exec_hook>>(std::move(v));
    } catch (...) {
      // Out of memory: a stale hook only locks a weak pointer that no longer resolves.
    }
  }
  //! The hooks now (a snapshot: hooks added or removed later do not change it).
  std::shared_ptr<const std::vector<cuda_exec_hook>> hooks() const {
    std::lock_guard lk(hooks_m_);
    return hooks_;
  }

 private:
  mutable std::mutex hooks_m_;
  std::shared_ptr<const std::vector<cuda_exec_hook>> hooks_;
};

//! The executor of the CUDA space (cuda_space::exec; see the file comment).
struct cuda_exec {
  std::shared_ptr<cuda_exec_state> s;

  //! The stream work is queued on (never the legacy default stream).
  cudaStream_t stream() const { return state().stream; }
  const cuda_allocator* allocator() const { return s ? s->alloc : cuda_default_allocator(); }
  //! The device the stream belongs to.
  int device() const { return state().device; }
  //! The scratch slot of `row` (a name that outlives the executor, such as a string
  //! literal; slots are told apart by its text), grown to at least `bytes`: a row asks its
  //! size first (CUB's nullptr query, or its own formula), then takes its slot, and no two
  //! rows share bytes. Growth is stream-ordered (the old slot is freed on the stream after
  //! the work queued so far, the new one allocated there), so a pointer returned earlier
  //! stays valid for work already queued.
  void* scratch(std::string_view row, std::size_t bytes) const {
    auto& st = state();
    auto it = std::find_if(st.scratch.begin(), st.scratch.end(),
                           [&](const cuda_exec_state::scratch_slot& x) { return x.row == row; });
    if (it == st.scratch.end()) it = st.scratch.insert(st.scratch.end(), {row, nullptr, 0});
    if (bytes > it->bytes) {
      cuda_device_guard g(st.device);
      void* q = st.alloc->allocate(bytes, st.stream);
      if (it->p) st.alloc->deallocate(it->p, it->bytes, st.stream);
      it->p = q;
      it->bytes = bytes;
      ++st.scratch_allocations;
    }
    return it->p;
  }
  //! How many times a slot has grown (allocated) since the executor was made: a step that
  //! allocates nothing leaves it unchanged.
  std::size_t scratch_allocations() const noexcept { return s ? s->scratch_allocations : 0; }
  //! The bytes the slots hold now (all rows).
  std::size_t scratch_bytes() const noexcept {
    std::size_t b = 0;
    if (s)
      for (const auto& x : s->scratch) b += x.bytes;
    return b;
  }
  //! Installs a communicator's hooks (replacing the ones of the same owner).
  void add_hook(cuda_exec_hook h) const { state().add_hook(std::move(h)); }
  void remove_hook(const void* owner) const noexcept {
    if (s) s->remove_hook(owner);
  }
  //! How many communicators have hooks on this executor.
  std::size_t hook_count() const {
    const auto h = s ? s->hooks() : nullptr;
    return h ? h->size() : 0;
  }

 private:
  cuda_exec_state& state() const {
    require(s != nullptr, "commpact::cuda_space: this executor has no stream; make one with "
                          "cuda_space::make_exec().");
    return *s;
  }
};

//! A point in a stream's work (cuda_space::event; see the file comment). Copies share
//! the event.
class cuda_event {
 public:
  cuda_event() = default;
  //! Wraps a caller's event (recorded by a framework): not destroyed here; it must live
  //! until the waits on it are queued.
  static cuda_event adopt(cudaEvent_t ev) {
    cuda_event e;
    if (ev) {
      e.h_ = std::make_shared<detail::cuda_event_handle>();
      e.h_->ev = ev;
      e.h_->owned = false;
    }
    return e;
  }
  //! The CUDA event (nullptr when empty): for a framework to wait on.
  cudaEvent_t native() const { return h_ ? h_->ev : nullptr; }
  bool empty() const { return native() == nullptr; }
  //! True once the work it marks has finished (an empty event is always ready).
  bool ready() const {
    if (empty()) return true;
    const cudaError_t q = cudaEventQuery(h_->ev);
    if (q == cudaErrorNotReady) return false;
    detail::cuda_check_space(q, "cudaEventQuery");
    return true;
  }

 private:
  friend struct cuda_space;
  friend class cuda_fence_point;
  explicit cuda_event(std::shared_ptr<detail::cuda_event_handle> h) : h_(std::move(h)) {}
  std::shared_ptr<detail::cuda_event_handle> h_;
};

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

struct cuda_space {
  static constexpr const char* name = "cuda_space";
  static constexpr bool host_accessible = false;
  template <class T>
  using span = cuda_span<T>;
  template <class T>
  using buffer = cuda_buffer<T>;
  template <class T>
  using pinned = cuda_pinned_buffer<T>;
  using exec = cuda_exec;
  using event = cuda_event;

  //! An executor on `stream` (nullptr: a new non-blocking stream it owns, on `device`)
  //! with `alloc`. device < 0: the stream's device (for a new stream: the current one).
  static exec make_exec(cudaStream_t stream = nullptr, const cuda_allocator* alloc = cuda_default_allocator(),
                        int device = -1) {
    auto st = std::make_shared<cuda_exec_state>();
    if (stream) {
      const int sd = detail::cuda_stream_device(stream);
      require(device < 0 || device == sd, "commpact::cuda_space::make_exec: the stream belongs to device ", sd,
              ", not to device ", device, "; pass that stream's device or -1.");
      st->device = sd;
      st->stream = stream;
    } else if (device < 0) {
      detail::cuda_check_space(cudaGetDevice(&st->device), "cudaGetDevice");
    } else {
      st->device = device;
    }
    cuda_device_guard g(st->device);
    if (!stream) {
      detail::cuda_check_space(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "cudaStreamCreate");
      st->owns_stream = true;
    }
    detail::cuda_check_space(cudaEventCreateWithFlags(&st->done, cudaEventDisableTiming), "cudaEventCreate");
    st->alloc = alloc ? alloc : cuda_default_allocator();
    return {std::move(st)};
  }

  //! Makes e's device current on the calling thread (a no-op for an empty executor).
  static void activate(const exec& e) {
    if (e.s) detail::cuda_check_space(cudaSetDevice(e.s->device), "cudaSetDevice");
  }

  //! Marks the work queued on e so far (an event recorded on its stream).
  static event record(const exec& e) {
    auto& st = *require_state(e, "record");
    if (!st.last_event || st.last_event.use_count() != 1) st.last_event = detail::cuda_event_handle::make(st.device);
    detail::cuda_check_space(cudaEventRecord(st.last_event->ev, st.stream), "cudaEventRecord");
    return event(st.last_event);
  }
  //! Marks the work queued so far on a caller's stream (a framework's current stream).
  static event record_stream(cudaStream_t stream) {
    auto h = detail::cuda_event_handle::make(detail::cuda_stream_device(stream));
    detail::cuda_check_space(cudaEventRecord(h->ev, stream), "cudaEventRecord");
    return event(std::move(h));
  }
  //! Work queued on e from now on runs after the work ev marks (no host wait; an empty
  //! event orders nothing).
  static void wait(const exec& e, const event& ev) {
    auto& st = *require_state(e, "wait");
    if (ev.empty()) return;
    detail::cuda_check_space(cudaStreamWaitEvent(st.stream, ev.native(), 0), "cudaStreamWaitEvent");
  }
  //! Work queued on a caller's stream from now on runs after the work ev marks (the
  //! consumer of a step, e.g. the optimiser's stream).
  static void stream_wait(cudaStream_t stream, const event& ev) {
    if (ev.empty()) return;
    detail::cuda_check_space(cudaStreamWaitEvent(stream, ev.native(), 0), "cudaStreamWaitEvent");
  }

  //! Waits for the work queued on e (see the file comment).
  static void fence(const exec& e, deadline until) {
    auto& s = *require_state(e, "fence");
    cuda_device_guard g(s.device);
    const cudaEvent_t done = s.fence_point ? s.fence_point->ev : s.done;
    if (!s.fence_point) detail::cuda_check_space(cudaEventRecord(s.done, s.stream), "cudaEventRecord");
    const auto hooks = s.hooks();
    const auto poll = [&] {
      if (hooks)
        for (const auto& h : *hooks)
          if (h.poll) h.poll();
    };
    const auto t0 = std::chrono::steady_clock::now();
    for (unsigned spin = 0;; ++spin) {
      const cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) {
        // (A kernel that faulted makes cudaEventQuery return that error instead.)
        poll();
        return;
      }
      if (q != cudaErrorNotReady) detail::cuda_check_space(q, "the work queued on this executor");
      poll();
      const auto now = std::chrono::steady_clock::now();
      if (now > until) {
        if (hooks)
          for (const auto& h : *hooks) {
            if (!h.on_timeout) continue;
            try {
              h.on_timeout("commpact::cuda_space::fence: the deadline passed");
            } catch (...) {
              // Every hook runs; the timeout is what is raised.
            }
          }
        throw timeout_error("commpact::cuda_space::fence: the deadline passed with work still queued on the "
                            "stream; the step is abandoned.");
      }
      // Spin briefly (a step's tail), then yield, then sleep a little: a long wait does
      // not hold a core.
      if (spin < 64) continue;
      if (now - t0 < std::chrono::milliseconds(2)) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  static cuda_exec_state* require_state(const exec& e, const char* who) {
    require(e.s != nullptr, "commpact::cuda_space::", who, ": this executor has no stream; make one with "
                            "cuda_space::make_exec().");
    return e.s.get();
  }
};

//! Scoped: while it lives, cuda_space::fence(e, ...) waits for the work `point` marks (an
//! event recorded on e's stream earlier, cuda_space::record) instead of everything queued
//! on e so far, still polling e's communicator hooks under the deadline. For a step whose
//! finish() is deferred past later work on the same stream (a DDP hook that returns before
//! its step ran): its finish waits for its own work, not for the framework's work queued
//! after it. Nothing queued after `point` may be read on the host in its scope.
class cuda_fence_point {
 public:
  cuda_fence_point(const cuda_exec& e, const cuda_event& point) : s_(e.s) {
    require(s_ != nullptr, "commpact::cuda_fence_point: this executor has no stream; make one with "
                           "cuda_space::make_exec().");
    require(!s_->fence_point, "commpact::cuda_fence_point: the executor already has a fence point; they do not nest.");
    if (!point.empty()) s_->fence_point = point.h_;
  }
  cuda_fence_point(const cuda_fence_point&) = delete;
  cuda_fence_point& operator=(const cuda_fence_point&) = delete;
  ~cuda_fence_point() { s_->fence_point.reset(); }

 private:
  std::shared_ptr<cuda_exec_state> s_;
};

}  // namespace commpact

#else

namespace commpact {
struct cuda_space;  // defined when compiled by nvcc
}  // namespace commpact

#endif
