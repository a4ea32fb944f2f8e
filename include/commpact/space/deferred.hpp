// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file deferred.hpp
//! deferred_space: CI's stand-in for a GPU. Data lives in host memory behind a
//! device-style span that host code cannot index (a compile error, with a sentence
//! saying why), and every kernel and collective is queued on the executor and runs only
//! at the fence, in order. So code that reads a result before fencing reads a stale
//! value, and code that touches device data from the host does not compile: the
//! discipline a CUDA stream imposes, checked on any CPU.
//!
//! \code
//! auto e = commpact::deferred_space::make_exec();
//! commpact::deferred_space::buffer<float> b;
//! b.resize(4);                                            // new storage is NaN-poisoned
//! commpact::ops<commpact::deferred_space>::fill(e, b.view(), 1.0f);   // queued
//! std::array<float, 4> h{};
//! commpact::ops<commpact::deferred_space>::to_host(e, b.cview(), std::span(h));  // queued
//! // h is still all zero here: nothing has run
//! commpact::deferred_space::fence(e, commpact::no_deadline());            // runs both
//! \endcode
//!
//! Buffers are grow-only like the host's; growing one reallocates, so work queued on
//! the old storage would touch freed memory (AddressSanitizer reports it): size buffers
//! before queueing work on them, as on a GPU.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "host.hpp"

namespace commpact {

namespace detail {
template <class>
inline constexpr bool always_false = false;
}

//! A view of device memory in the deferred space: a pointer and a length, with no
//! element access from host code. Kernels (ops<deferred_space>) unwrap it.
template <class T>
class deferred_span {
 public:
  using element_type = T;
  deferred_span() = default;
  //! A non-const span converts to a const one.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  deferred_span(deferred_span<U> o) : p_(o.p_), n_(o.n_) {}

  std::size_t size() const { return n_; }
  std::size_t size_bytes() const { return n_ * sizeof(T); }
  bool empty() const { return n_ == 0; }
  deferred_span subspan(std::size_t off, std::size_t count = std::size_t(-1)) const {
    require(off <= n_, "commpact::deferred_span::subspan: offset ", off, " is past the end (", n_, " elements).");
    const std::size_t c = count == std::size_t(-1) ? n_ - off : count;
    require(c <= n_ - off, "commpact::deferred_span::subspan: ", c, " elements from ", off, " run past the end (",
            n_, " elements).");
    return deferred_span(p_ + off, c);
  }
  deferred_span first(std::size_t count) const { return subspan(0, count); }
  //! Where the span starts, for identity checks only (never dereference it: device memory).
  const void* address() const { return p_; }

  //! Host code cannot read device memory: copy it with ops<deferred_space>::to_host and
  //! fence first.
  template <class I>
  T& operator[](I) const {
    static_assert(detail::always_false<I>,
                  "commpact: a deferred_span is device memory: host code cannot index it. Copy it to the host with "
                  "ops<deferred_space>::to_host(exec, span, host_span) and fence the executor first.");
    return *p_;
  }
  template <class I = void>
  T* begin() const {
    static_assert(detail::always_false<I>,
                  "commpact: a deferred_span is device memory: host code cannot iterate it. Copy it to the host with "
                  "ops<deferred_space>::to_host(exec, span, host_span) and fence the executor first.");
    return p_;
  }

 private:
  deferred_span(T* p, std::size_t n) : p_(p), n_(n) {}
  template <class>
  friend class deferred_span;
  template <class>
  friend class deferred_buffer;
  friend struct deferred_access;
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

//! The one door from a deferred span to its host storage: for kernels (ops) and
//! communicators of the deferred space, never for algorithm code.
struct deferred_access {
  template <class T>
  static std::span<T> host(deferred_span<T> s) {
    return {s.p_, s.n_};
  }
  template <class T>
  static deferred_span<T> wrap(std::span<T> s) {
    return {s.data(), s.size()};
  }
};

//! The bytes of a deferred span, still in the deferred space (for known-size
//! point-to-point of typed buffers; found by argument-dependent lookup, as std::as_bytes
//! is for std::span).
template <class T>
deferred_span<const std::byte> as_bytes(deferred_span<T> s) {
  return deferred_access::wrap(std::as_bytes(deferred_access::host(s)));
}
template <class T>
  requires(!std::is_const_v<T>)
deferred_span<std::byte> as_writable_bytes(deferred_span<T> s) {
  return deferred_access::wrap(std::as_writable_bytes(deferred_access::host(s)));
}

//! Grow-only device storage of the deferred space. New storage is poisoned (NaN bits
//! for floats, 0xA5 bytes otherwise), so a kernel that reads what nobody wrote shows.
template <class T>
class deferred_buffer {
 public:
  void resize(std::size_t n) {
    const std::size_t old = v_.size();
    v_.resize(n);
    poison(old);
  }
  void reserve(std::size_t n) { v_.reserve(n); }
  std::size_t size() const { return v_.size(); }
  std::size_t capacity() const { return v_.capacity(); }
  bool empty() const { return v_.empty(); }
  void clear() { v_.clear(); }
  deferred_span<T> view() { return {v_.data(), v_.size()}; }
  deferred_span<const T> view() const { return {v_.data(), v_.size()}; }
  deferred_span<const T> cview() const { return view(); }
  const void* data() const { return v_.data(); }
  void swap(deferred_buffer& o) noexcept { v_.swap(o.v_); }

 private:
  void poison(std::size_t from) {
    if (from >= v_.size()) return;
    if constexpr (std::is_same_v<T, float>) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (std::size_t i = from; i < v_.size(); ++i) v_[i] = nan;
    } else {
      std::memset(static_cast<void*>(v_.data() + from), 0xA5, (v_.size() - from) * sizeof(T));
    }
  }
  std::vector<T> v_;
};

//! The work queue behind a deferred executor.
struct deferred_queue {
  std::vector<std::function<void()>> work;
  std::uint64_t enqueued = 0, fences = 0;
};

struct deferred_space {
  static constexpr const char* name = "deferred_space";
  static constexpr bool host_accessible = false;
  template <class T>
  using span = deferred_span<T>;
  template <class T>
  using buffer = deferred_buffer<T>;

  //! The executor: a handle to a FIFO queue (copies share it), like a CUDA stream.
  struct exec {
    std::shared_ptr<deferred_queue> q;
    template <class F>
    void enqueue(F&& f) const {
      require(q != nullptr, "commpact::deferred_space: this executor has no queue; make one with "
                            "deferred_space::make_exec().");
      q->work.emplace_back(std::forward<F>(f));
      ++q->enqueued;
    }
    //! Work queued and not yet run.
    std::size_t pending() const { return q ? q->work.size() : 0; }
  };
  static exec make_exec() { return {std::make_shared<deferred_queue>()}; }

  //! Runs the queued work in order. Raises timeout_error (leaving the rest queued) when
  //! the deadline passes between two items; an item that raises (a communicator's error,
  //! which is how the deferred space reports asynchronous errors) drops the rest of the
  //! queue and the error propagates: the step is abandoned, as a failed stream is.
  static void fence(exec e, deadline until) {
    if (!e.q) return;
    auto& q = *e.q;
    ++q.fences;
    std::size_t i = 0;
    try {
      for (; i < q.work.size(); ++i) {
        if (std::chrono::steady_clock::now() > until) {
          q.work.erase(q.work.begin(), q.work.begin() + static_cast<std::ptrdiff_t>(i));
          throw timeout_error(detail::cat("commpact::deferred_space::fence: the deadline passed with ", q.work.size(),
                                          " queued operations left; they stay queued."));
        }
        auto f = std::move(q.work[i]);
        f();
      }
    } catch (const timeout_error&) {
      throw;
    } catch (...) {
      q.work.clear();
      throw;
    }
    q.work.clear();
  }
};

}  // namespace commpact
