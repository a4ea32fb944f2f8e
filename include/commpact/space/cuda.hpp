// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cuda.hpp
//! cuda_space: data in GPU memory, work queued on a CUDA stream (the Space concept,
//! concepts/space.hpp). Compiled only by nvcc; its kernel table is ops<cuda_space>
//! (kernels/cuda/ops.cuh).
//!
//! Checked against the Space concept at compile time (tests/cuda/test_cuda_ops.cu); the rules
//! below are tested by tests/cuda/test_cuda_space_discipline.cu (docs/cuda.md, "Status",
//! says where it has run).
//!
//! - `span<T>` (cuda_span): a device pointer and a length. Host code cannot index it
//!   (operator[] is __device__ only: nvcc rejects a host call); kernels get the pointer
//!   through cuda_access, never algorithm code.
//! - `exec` (cuda_exec): a shared handle to a stream, the device it belongs to, an
//!   allocator hook, an event for the fence, grow-only scratch slots (one per row), and the hooks of
//!   the communicators that queue work on it. Copies share the state, like a stream
//!   handle. `make_exec(stream)` wraps a caller's stream (a framework's current stream);
//!   the stream must outlive the executor and everything bound to it. A null stream makes
//!   a non-blocking stream of the executor's own: to wrap the legacy NULL stream (the
//!   handle PyTorch's default stream has), pass `cudaStreamLegacy`.
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
//!
//! The pieces: cuda_device.hpp (errors, device guard, allocator hook, stream joins),
//! cuda_span.hpp (the span), cuda_exec.hpp (the executor, its scratch slots and hooks, the
//! event) and cuda_buffer.hpp (device, workspace and pinned storage).

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
#include "cuda_buffer.hpp"
#include "cuda_device.hpp"
#include "cuda_exec.hpp"
#include "cuda_span.hpp"
#include "host.hpp"

namespace commpact {

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
      // cudaStreamLegacy and cudaStreamPerThread name a stream of whichever device is
      // current where they are used: a device given here is theirs.
      const bool special = stream == cudaStreamLegacy || stream == cudaStreamPerThread;
      const int sd = special && device >= 0 ? device : detail::cuda_stream_device(stream);
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
