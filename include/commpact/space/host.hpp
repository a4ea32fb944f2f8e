// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file host.hpp
//! host_space: data in host memory, work run at once on the calling thread. The
//! reference model of the Space concept (concepts/space.hpp): its spans are std::span,
//! its executor is empty, its fence returns at once. Code written over a space costs
//! nothing here: every ops<host_space> call is the host kernel itself.
//!
//! \code
//! commpact::host_space::buffer<float> b;           // grow-only storage
//! b.resize(n);
//! std::span<float> v = b.view();                   // host code may index it
//! commpact::host_space::fence({}, commpact::no_deadline());
//! \endcode

#include <chrono>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

namespace commpact {

//! When a fence stops waiting (fence never waits past it).
using deadline = std::chrono::steady_clock::time_point;
//! A deadline that never comes.
inline deadline no_deadline() { return deadline::max(); }

//! Grow-only storage of trivially copyable T in host memory: resize() never gives
//! capacity back, so a buffer sized at the first step allocates nothing later.
template <class T>
class host_buffer {
 public:
  void resize(std::size_t n) { v_.resize(n); }
  void reserve(std::size_t n) { v_.reserve(n); }
  //! The same, ordered on an executor (a space whose buffers allocate on a stream uses it).
  template <class Exec>
  void resize(std::size_t n, const Exec&) {
    resize(n);
  }
  template <class Exec>
  void reserve(std::size_t n, const Exec&) {
    reserve(n);
  }
  std::size_t size() const { return v_.size(); }
  std::size_t capacity() const { return v_.capacity(); }
  bool empty() const { return v_.empty(); }
  void clear() { v_.clear(); }
  std::span<T> view() { return v_; }
  std::span<const T> view() const { return v_; }
  std::span<const T> cview() const { return v_; }
  const void* data() const { return v_.data(); }
  void swap(host_buffer& o) noexcept { v_.swap(o.v_); }

 private:
  std::vector<T> v_;
};

struct host_space {
  static constexpr const char* name = "host_space";
  //! Host code may read and write this space's spans directly.
  static constexpr bool host_accessible = true;
  template <class T>
  using span = std::span<T>;
  template <class T>
  using buffer = host_buffer<T>;
  //! Host memory that a device-to-host copy lands in (pinned memory on CUDA, so that the
  //! copy stays queued): status words, headers and counts a step reads after its fence.
  template <class T>
  using pinned = host_buffer<T>;
  //! Nothing to carry: work runs at once on the calling thread.
  struct exec {};
  //! A point in an executor's work (CUDA: an event), for ordering work across executors.
  struct event {};
  //! Marks the work queued on e so far; nothing to mark on the host.
  static event record(exec) { return {}; }
  //! Orders the work queued on e from now on after the work ev marks; it has run already.
  static void wait(exec, event) {}
  //! Makes e's device current on the calling thread (a worker thread calls it first); no device here.
  static void activate(exec) {}
  //! Queued work has already run.
  static void fence(exec, deadline) {}
};

namespace detail {
template <class T>
struct space_of {
  using type = host_space;
};
template <class T>
  requires requires { typename T::space_type; }
struct space_of<T> {
  using type = typename T::space_type;
};
}  // namespace detail

namespace detail {
template <class S, class T>
struct pinned_of {
  using type = host_buffer<T>;
};
template <class S, class T>
  requires requires { typename S::template pinned<T>; }
struct pinned_of<S, T> {
  using type = typename S::template pinned<T>;
};
}  // namespace detail

//! S's pinned host buffer of T (S::pinned<T>), or host_buffer<T> for a space without one.
template <class S, class T>
using pinned_t = typename detail::pinned_of<S, T>::type;

//! S::activate(e) where S has it (the CUDA space: e's device becomes current on this
//! thread, as a worker thread must do before it queues work), else nothing.
template <class S, class E>
void activate(const E& e) {
  if constexpr (requires { S::activate(e); }) S::activate(e);
}

//! The space of a communicator, compressor or aggregation: T::space_type when T names
//! one, else host_space (the v2 types, which take std::span).
template <class T>
using space_of_t = typename detail::space_of<std::remove_cvref_t<T>>::type;

}  // namespace commpact
