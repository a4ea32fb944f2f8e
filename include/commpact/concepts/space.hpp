// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file space.hpp
//! The Space concept: where data lives and where work runs.
//!
//! A space S names
//! - `S::span<T>`: a view of its memory (std::span on the host; a device span that host
//!   code cannot index elsewhere);
//! - `S::buffer<T>`: grow-only storage with `resize(n)`, `resize(n, exec)` and
//!   `reserve(n, exec)` (growth and release ordered on the executor), `size()`, `view()`;
//! - optionally `S::pinned<T>` (host memory a device copy lands in), `S::event` with
//!   `record(exec)` and `wait(exec, event)`, and `activate(exec)`;
//! - `S::exec`: an executor (empty on the host; a queue or a stream elsewhere);
//! - `S::fence(exec, deadline)`: waits for the work queued on exec, never past the
//!   deadline, and raises the asynchronous error of whatever was queued;
//! - `S::host_accessible`: whether host code may read its spans directly.
//! Models: host_space (space/host.hpp), deferred_space (space/deferred.hpp), cuda_space
//! (space/cuda.hpp, nvcc only). Kernels over a space are the table ops<S>
//! (kernels/ops.hpp).

#include <concepts>
#include <cstddef>

#include "../space/host.hpp"

namespace commpact {
namespace req {
template <class S>
concept space_has_types = requires {
  typename S::exec;
  typename S::template span<float>;
  typename S::template buffer<float>;
};
template <class S>
concept space_has_fence = requires(typename S::exec e, deadline d) { S::fence(e, d); };
template <class S>
concept space_has_buffer = requires(typename S::template buffer<float>& b, std::size_t n, typename S::exec e) {
  b.resize(n);
  b.resize(n, e);  // ordered on e's stream (the library always passes the exec its work runs on)
  b.reserve(n, e);
  { b.size() } -> std::convertible_to<std::size_t>;
  { b.view() } -> std::same_as<typename S::template span<float>>;
};
template <class S>
concept space_has_access = requires {
  { S::host_accessible } -> std::convertible_to<bool>;
};
}  // namespace req

template <class S>
concept Space = req::space_has_types<S> && req::space_has_fence<S> && req::space_has_buffer<S> &&
                req::space_has_access<S>;

template <class S>
constexpr bool diagnose_space() {
  static_assert(req::space_has_types<S>,
                "commpact: this type is not a Space: it needs `exec`, `template <class T> using span` and "
                "`template <class T> using buffer` (see commpact::host_space).");
  static_assert(req::space_has_fence<S>,
                "commpact: this type is not a Space: it needs `static void fence(exec, commpact::deadline)`.");
  static_assert(req::space_has_buffer<S>,
                "commpact: this type is not a Space: its buffer<T> needs `resize(n)`, `resize(n, exec)` and "
                "`reserve(n, exec)` (growth ordered on the executor's stream), `size()` and `view()` returning "
                "span<T>.");
  static_assert(req::space_has_access<S>,
                "commpact: this type is not a Space: it needs `static constexpr bool host_accessible`.");
  return Space<S>;
}

static_assert(Space<host_space>);

}  // namespace commpact
