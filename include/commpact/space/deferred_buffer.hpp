// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file deferred_buffer.hpp
//! deferred_buffer<T>: the deferred space's grow-only storage, poisoned when it grows and
//! watched by the checker (deferred_check.hpp), and deferred_pinned<T>, its host-readable
//! twin (deferred_space::pinned). Part of deferred_space (include
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
//! Storage the buffer destroys or reallocates away from is quarantined (up to
//! deferred_check::quarantine_bytes): work queued later through a span taken before
//! raises usage_error, as it would use freed memory on a GPU.
template <class T>
class deferred_buffer {
 public:
  deferred_buffer() = default;
  deferred_buffer(const deferred_buffer& o) : kind_(o.kind_) {
    o.require_idle("copied");
    if (o.v_) {
      v_ = std::make_shared<std::vector<T>>(*o.v_);
      enroll();
    }
  }
  //! Raises usage_error when work is queued on either buffer (this one's storage would
  //! be freed under it).
  deferred_buffer& operator=(const deferred_buffer& o) {
    if (this != &o) {
      require_idle("assigned over (its storage freed)");
      deferred_buffer t(o);
      swap(t);
    }
    return *this;
  }
  //! Moves and swaps exchange storage, which takes its queued work along (as a
  //! cuda_buffer's does): the work still runs on that storage, under its new owner.
  deferred_buffer(deferred_buffer&& o) noexcept : kind_(o.kind_) { swap(o); }
  deferred_buffer& operator=(deferred_buffer&& o) noexcept {
    swap(o);
    return *this;
  }
  ~deferred_buffer() { retire(); }

  //! Growing past the capacity (a reallocation) raises usage_error while queued work uses
  //! the storage; growing within it (the new elements are poisoned now, on the host)
  //! raises while queued work uses those elements. Shrinking keeps the storage and is
  //! always allowed.
  void resize(std::size_t n) {
    const std::size_t old = size();
    if (n > capacity()) regrow(n);
    else if (n > old) require_idle_bytes(old * sizeof(T), n * sizeof(T), "grown over elements");
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
  //! Raises when queued work uses bytes [from, to) of the storage.
  void require_idle_bytes(std::size_t from, std::size_t to, const char* what) const {
    if (!rec_) return;
    std::lock_guard lk(detail::deferred_check::reg().m);
    std::size_t uses = 0;
    for (const auto& a : rec_->pending)
      if (a.overlaps(rec_->lo + from, rec_->lo + to)) ++uses;
    if (uses)
      throw usage_error(detail::cat("commpact::deferred_space: ", detail::deferred_check::describe(*rec_), " was ",
                                    what, " [", from / sizeof(T), ", ", to / sizeof(T), ") while ", uses,
                                    " queued operations still use them; fence the executor first (its new "
                                    "elements are poisoned now, under that work: on a GPU the poison is "
                                    "stream-ordered)."));
  }
  //! New storage of n elements, the contents kept: only when no queued work uses the old,
  //! which is retired (quarantined: a span still pointing there raises when work is
  //! queued on it).
  void regrow(std::size_t n) {
    require_idle("regrown (reallocated)");
    auto fresh = std::make_shared<std::vector<T>>();
    fresh->reserve(n);
    if (v_) fresh->assign(v_->begin(), v_->end());
    auto old = std::move(v_);
    v_ = std::move(fresh);
    if (rec_) {
      std::lock_guard lk(detail::deferred_check::reg().m);
      detail::deferred_check::retire_locked(rec_, std::move(old), "reallocated (grown past its capacity)");
      rec_.reset();
    }
    enroll();
  }
  void enroll() {
    if (!v_ || v_->capacity() == 0) return;
    auto r = std::make_shared<record>();
    r->lo = reinterpret_cast<const std::byte*>(v_->data());
    r->hi = r->lo + v_->capacity() * sizeof(T);
    r->kind = kind_;
    r->type = type_name();
    std::lock_guard lk(detail::deferred_check::reg().m);
    detail::deferred_check::reg().by_lo[r->lo] = r;
    rec_ = std::move(r);
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
  const char* kind_ = "deferred_buffer";

  template <class>
  friend class deferred_pinned;
};

//! The deferred space's pinned host memory (deferred_space::pinned<T>): host code reads
//! and writes it through std::span, as page-locked memory on CUDA, and the checker
//! watches it as it watches a deferred_buffer: a copy queued into or out of it on one
//! executor and touched by another's work without a join raises; growing it while queued
//! work uses it raises; destroying it with a copy queued keeps the storage alive and
//! makes that executor's next fence raise (on a GPU the copy would land in freed memory).
//! New elements are poisoned (NaN bits for floats, 0xA5 bytes otherwise).
template <class T>
class deferred_pinned {
 public:
  deferred_pinned() { b_.kind_ = "pinned host buffer"; }
  void resize(std::size_t n) { b_.resize(n); }
  void reserve(std::size_t n) { b_.reserve(n); }
  void resize(std::size_t n, const auto&) { resize(n); }
  void reserve(std::size_t n, const auto&) { reserve(n); }
  std::size_t size() const { return b_.size(); }
  std::size_t capacity() const { return b_.capacity(); }
  bool empty() const { return b_.empty(); }
  void clear() { b_.clear(); }
  std::span<T> view() { return deferred_access::host(b_.view()); }
  std::span<const T> view() const { return deferred_access::host(b_.view()); }
  std::span<const T> cview() const { return view(); }
  const void* data() const { return b_.data(); }
  void swap(deferred_pinned& o) noexcept { b_.swap(o.b_); }

 private:
  deferred_buffer<T> b_;
};

template <class T>
void deferred_buffer<T>::retire() noexcept {
  if (!rec_) return;
  std::lock_guard lk(detail::deferred_check::reg().m);
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
  }
  // Quarantined (a span taken before raises when work is queued on it); storage that queued
  // work still uses lives at least until the last such item is gone.
  detail::deferred_check::retire_locked(rec_, std::move(v_), "destroyed (or assigned over)");
  rec_.reset();
}

}  // namespace commpact
