// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file deferred_buffer.hpp
//! deferred_buffer<T>: the deferred space's grow-only storage, poisoned when it grows and
//! watched by the checker (deferred_check.hpp). Part of deferred_space (include
//! commpact/space/deferred.hpp).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "deferred_check.hpp"
#include "deferred_span.hpp"

namespace commpact {

//! Grow-only device storage of the deferred space. New storage is poisoned (NaN bits
//! for floats, 0xA5 bytes otherwise), so a kernel that reads what nobody wrote shows.
//! The checker (see deferred_space) watches it: growing it past its capacity while
//! work queued on any executor still uses it raises usage_error, and destroying it
//! with work queued keeps its storage alive and makes that executor's next fence raise
//! usage_error (a destructor cannot throw) instead of running the work on freed memory.
template <class T>
class deferred_buffer {
 public:
  deferred_buffer() = default;
  deferred_buffer(const deferred_buffer& o) {
    o.require_idle("copied");
    if (o.v_) {
      v_ = std::make_shared<std::vector<T>>(*o.v_);
      enroll();
    }
  }
  deferred_buffer& operator=(const deferred_buffer& o) {
    if (this != &o) {
      deferred_buffer t(o);
      swap(t);
    }
    return *this;
  }
  deferred_buffer(deferred_buffer&& o) noexcept { swap(o); }
  deferred_buffer& operator=(deferred_buffer&& o) noexcept {
    swap(o);
    return *this;
  }
  ~deferred_buffer() { retire(); }

  void resize(std::size_t n) {
    const std::size_t old = size();
    if (n > capacity()) regrow(n);
    vec().resize(n);
    poison(old);
  }
  void reserve(std::size_t n) {
    if (n > capacity()) regrow(n);
  }
  //! The same, ordered on an executor (the CUDA space allocates on its stream).
  void resize(std::size_t n, const auto&) { resize(n); }
  void reserve(std::size_t n, const auto&) { reserve(n); }
  std::size_t size() const { return v_ ? v_->size() : 0; }
  std::size_t capacity() const { return v_ ? v_->capacity() : 0; }
  bool empty() const { return size() == 0; }
  void clear() {
    if (v_) v_->clear();
  }
  deferred_span<T> view() { return {ptr(), size()}; }
  deferred_span<const T> view() const { return {ptr(), size()}; }
  deferred_span<const T> cview() const { return view(); }
  const void* data() const { return ptr(); }
  void swap(deferred_buffer& o) noexcept {
    v_.swap(o.v_);
    rec_.swap(o.rec_);
  }

 private:
  using record = detail::deferred_check::record;
  T* ptr() const { return v_ ? v_->data() : nullptr; }
  std::vector<T>& vec() {
    if (!v_) v_ = std::make_shared<std::vector<T>>();
    return *v_;
  }
  void require_idle(const char* what) const {
    if (!rec_) return;
    std::lock_guard lk(detail::deferred_check::reg().m);
    if (!rec_->pending.empty())
      throw usage_error(detail::cat("commpact::deferred_space: ", detail::deferred_check::describe(*rec_), " was ",
                                    what, " while ", rec_->pending.size(),
                                    " queued operations still use it; fence the executor first (on a GPU this "
                                    "would touch memory that queued kernels read or write)."));
  }
  //! New storage of n elements, the contents kept: only when no queued work uses the old.
  void regrow(std::size_t n) {
    require_idle("regrown (reallocated)");
    auto& v = vec();
    unenroll();
    v.reserve(n);
    enroll();
  }
  void enroll() {
    if (!v_ || v_->capacity() == 0) return;
    auto r = std::make_shared<record>();
    r->lo = reinterpret_cast<const std::byte*>(v_->data());
    r->hi = r->lo + v_->capacity() * sizeof(T);
    r->type = type_name();
    std::lock_guard lk(detail::deferred_check::reg().m);
    detail::deferred_check::reg().by_lo[r->lo] = r;
    rec_ = std::move(r);
  }
  void unenroll() {
    if (!rec_) return;
    std::lock_guard lk(detail::deferred_check::reg().m);
    detail::deferred_check::erase_locked(rec_);
    rec_.reset();
  }
  //! The destructor's half of the checker: storage still used by queued work is handed
  //! to the record (kept alive until that work is dropped) and its executors are told.
  void retire() noexcept;
  static const char* type_name() {
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, std::byte>) return "std::byte";
    else if constexpr (std::is_same_v<T, std::uint32_t>) return "std::uint32_t";
    else if constexpr (std::is_same_v<T, std::int32_t>) return "std::int32_t";
    else if constexpr (std::is_same_v<T, std::int64_t>) return "std::int64_t";
    else return "T";
  }
  void poison(std::size_t from) {
    if (from >= size()) return;
    auto& v = *v_;
    if constexpr (std::is_same_v<T, float>) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (std::size_t i = from; i < v.size(); ++i) v[i] = nan;
    } else {
      std::memset(static_cast<void*>(v.data() + from), 0xA5, (v.size() - from) * sizeof(T));
    }
  }
  std::shared_ptr<std::vector<T>> v_;
  std::shared_ptr<record> rec_;
};

template <class T>
void deferred_buffer<T>::retire() noexcept {
  if (!rec_) return;
  std::lock_guard lk(detail::deferred_check::reg().m);
  detail::deferred_check::erase_locked(rec_);
  if (!rec_->pending.empty()) {
    try {
      const auto why = detail::cat("commpact::deferred_space: ", detail::deferred_check::describe(*rec_),
                                   " was destroyed while ", rec_->pending.size(),
                                   " queued operations still used it; the queued work is dropped (on a GPU it "
                                   "would run on freed memory). Fence before destroying a buffer.");
      for (const auto& a : rec_->pending) {
        auto* q = const_cast<detail::deferred_check::queue_state*>(a.q);
        if (q->violation.empty()) q->violation = why;
      }
    } catch (...) {
    }
    rec_->orphan = std::move(v_);  // lives until the last item that touches it is gone
  }
  rec_.reset();
}

}  // namespace commpact
