// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file communicator.hpp
//! Communicator, PointToPoint, AsyncCommunicator, AsyncPointToPoint: how bytes move
//! between ranks: the concepts, their named requirements and diagnose_ sentences (part
//! of concepts.hpp, the umbrella).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace commpact {

//! Element-wise reduction applied by Communicator::allreduce.
enum class reduce_op { sum, min, max };

// ---------------------------------------------------------------------------
// Communicator: how bytes move between ranks.
// ---------------------------------------------------------------------------
namespace req {
template <class C>
concept has_rank_and_size = requires(const C& c) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
};
template <class C>
concept has_allreduce = requires(C& c, std::span<float> f, std::span<double> d, std::span<std::int64_t> i) {
  c.allreduce(f, reduce_op::sum);
  c.allreduce(d, reduce_op::sum);
  c.allreduce(i, reduce_op::max);
};
template <class C>
concept has_allgather = requires(C& c, std::span<const float> in, std::span<float> out) {
  c.allgather(in, out);
};
template <class C>
concept has_broadcast = requires(C& c, std::span<float> f, int root) { c.broadcast(f, root); };
template <class C>
concept has_barrier = requires(C& c) { c.barrier(); };
template <class C>
concept has_abort = requires(C& c, std::string_view why) { c.abort(why); };
template <class C>
concept has_send_recv = requires(C& c, int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) {
  c.send(peer, msg);
  c.recv(peer, buf);
  c.sendrecv(peer, msg, buf);
};
//! A handle of a nonblocking operation: `wait()` blocks until it completed, `test()`
//! says whether it has (and completes it when it has).
template <class H>
concept waitable = requires(H& h) {
  h.wait();
  { h.test() } -> std::convertible_to<bool>;
};
template <class C>
concept has_nonblocking_collectives =
    requires(C& c, std::span<float> f, std::span<const float> in, std::span<float> out, int root) {
      { c.iallreduce(f, reduce_op::sum) } -> waitable;
      { c.iallgather(in, out) } -> waitable;
      { c.ibroadcast(f, root) } -> waitable;
    };
template <class C>
concept has_nonblocking_send_recv = requires(C& c, int peer, std::span<const std::byte> msg, std::span<std::byte> buf) {
  { c.isend(peer, msg) } -> waitable;
  { c.irecv(peer, buf) } -> waitable;
};
//! Whether C groups known-size point-to-point calls (`group_begin()` / `group_end()`, as
//! NcclComm does; comm/known_size.hpp's `grouped` calls them, or nothing without them).
template <class C>
concept has_p2p_group = requires(C& c) {
  c.group_begin();
  c.group_end();
};
}  // namespace req

//! A group of `size()` ranks with collectives. `allreduce(span<T>, op)` reduces in
//! place (bit-identical on every rank), `allgather(in, out)` concatenates equal-sized
//! blocks in rank order, `broadcast(data, root)`, `barrier()`, and `abort(why)` marks
//! the group failed so that every other rank raises instead of waiting.
template <class C>
concept Communicator = req::has_rank_and_size<C> && req::has_allreduce<C> && req::has_allgather<C> &&
                       req::has_broadcast<C> && req::has_barrier<C> && req::has_abort<C>;

//! A Communicator that also exchanges variable-length byte messages with one peer:
//! `send(peer, bytes)` (does not wait for the receiver), `recv(peer, buffer)` (buffer is
//! resized to the message) and `sendrecv(peer, bytes, buffer)`, a pairwise exchange that
//! may wait until the peer has taken the message (MpiComm does, like MPI_Sendrecv): the
//! peer must be in a matching sendrecv or receive without first waiting on another rank.
template <class C>
concept PointToPoint = Communicator<C> && req::has_send_recv<C>;

template <class C>
constexpr bool diagnose_communicator() {
  static_assert(req::has_rank_and_size<C>,
                "commpact: this type is not a Communicator: it needs `int rank() const` and `int size() const`.");
  static_assert(req::has_allreduce<C>,
                "commpact: this type is not a Communicator: it needs `allreduce(std::span<T>, commpact::reduce_op)` "
                "for float, double and std::int64_t.");
  static_assert(req::has_allgather<C>,
                "commpact: this type is not a Communicator: it needs `allgather(std::span<const T> in, std::span<T> out)`.");
  static_assert(req::has_broadcast<C>,
                "commpact: this type is not a Communicator: it needs `broadcast(std::span<T>, int root)`.");
  static_assert(req::has_barrier<C>, "commpact: this type is not a Communicator: it needs `barrier()`.");
  static_assert(req::has_abort<C>,
                "commpact: this type is not a Communicator: it needs `abort(std::string_view why)` so that a failure "
                "reaches the other ranks.");
  return Communicator<C>;
}

template <class C>
constexpr bool diagnose_point_to_point() {
  if constexpr (!Communicator<C>) {
    return diagnose_communicator<C>();
  } else {
    static_assert(req::has_send_recv<C>,
                  "commpact: this communicator has no point-to-point exchange: it needs `send(int peer, "
                  "std::span<const std::byte>)`, `recv(int peer, std::vector<std::byte>&)` and `sendrecv(...)`.");
    return PointToPoint<C>;
  }
}

//! A Communicator whose collectives also start without waiting: `iallreduce(data, op)`,
//! `iallgather(in, out)` and `ibroadcast(data, root)` return a handle with `wait()` and
//! `test()`; several may be in flight, completed in any order, started in the same order
//! on every rank. Buffers stay the caller's until the handle completed.
template <class C>
concept AsyncCommunicator = Communicator<C> && req::has_nonblocking_collectives<C>;

//! An AsyncCommunicator with nonblocking messages of a size both sides know:
//! `isend(peer, bytes)` and `irecv(peer, std::span<std::byte>)` (exactly that many bytes).
template <class C>
concept AsyncPointToPoint = AsyncCommunicator<C> && PointToPoint<C> && req::has_nonblocking_send_recv<C>;

template <class C>
constexpr bool diagnose_async_communicator() {
  if constexpr (!Communicator<C>) {
    return diagnose_communicator<C>();
  } else {
    static_assert(req::has_nonblocking_collectives<C>,
                  "commpact: this communicator has no nonblocking collectives: it needs `iallreduce(std::span<T>, "
                  "reduce_op)`, `iallgather(in, out)` and `ibroadcast(data, root)`, each returning a handle with "
                  "`wait()` and `bool test()`.");
    return AsyncCommunicator<C>;
  }
}

template <class C>
constexpr bool diagnose_async_point_to_point() {
  if constexpr (!AsyncCommunicator<C>) {
    return diagnose_async_communicator<C>();
  } else if constexpr (!PointToPoint<C>) {
    return diagnose_point_to_point<C>();
  } else {
    static_assert(req::has_nonblocking_send_recv<C>,
                  "commpact: this communicator has no nonblocking point to point: it needs `isend(int peer, "
                  "std::span<const std::byte>)` and `irecv(int peer, std::span<std::byte>)`, each returning a handle "
                  "with `wait()` and `bool test()`.");
    return AsyncPointToPoint<C>;
  }
}

}  // namespace commpact
