// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cuda_exec.hpp
//! cuda_exec: the shared handle to a stream, its device, allocator hook, fence event,
//! grow-only scratch slots (one per row) and communicators' hooks (cuda_exec_state,
//! cuda_exec_hook); cuda_event, a point in a stream's work.
//! Part of cuda_space (include commpact/space/cuda.hpp); compiled only by nvcc.

#if defined(__CUDACC__)

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "cuda_device.hpp"

namespace commpact {

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

}  // namespace commpact

#endif  // __CUDACC__
