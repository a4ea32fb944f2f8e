// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cuda_span.hpp
//! cuda_span: a device pointer and a length that host code cannot index, cuda_access
//! (the one door to its pointer, for kernels and communicators) and as_bytes /
//! as_writable_bytes.
//! Part of cuda_space (include commpact/space/cuda.hpp); compiled only by nvcc.

#if defined(__CUDACC__)

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <type_traits>

#include "../error.hpp"

namespace commpact {

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

}  // namespace commpact

#endif  // __CUDACC__
