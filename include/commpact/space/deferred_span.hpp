// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file deferred_span.hpp
//! deferred_span: the deferred space's view of device memory (a pointer and a length
//! with no host element access), deferred_access (the one door to its host storage, for
//! kernels and communicators) and as_bytes / as_writable_bytes. Part of deferred_space
//! (include commpact/space/deferred.hpp).

#include <cstddef>
#include <span>
#include <type_traits>

#include "../error.hpp"

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

}  // namespace commpact
