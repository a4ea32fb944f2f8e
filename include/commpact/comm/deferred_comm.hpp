// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file deferred_comm.hpp
//! DeferredComm<C>: a host communicator seen from the deferred space (space/deferred.hpp),
//! as a device communicator (NCCL) is seen from a CUDA stream. Data-plane calls on
//! deferred spans (allreduce, allgather, broadcast, exchange, send_known, recv_known)
//! are queued on the executor and run, in order, at the fence; an error they raise
//! (peer failure, timeout, mismatch) comes out of the fence, the deferred space's way of
//! reporting a communicator's asynchronous error. Control-plane calls on host memory
//! (the small agreement allreduces, barrier) first fence, then run at once, as a
//! device communicator's host-side calls synchronise the stream.
//! A group of point-to-point calls (known_size.hpp's `grouped`) is data plane too: when C
//! has groups, group_begin() and group_end() are queued around the group's calls and run
//! with them at the fence (a queued call that raises drops the rest of the queue, the
//! group's end included, as it drops every later call); when C has none, neither has
//! DeferredComm, and the group does nothing.
//!
//! \code
//! commpact::run_threads(4, [](commpact::ThreadComm& c) {
//!   commpact::gTopK<commpact::TreeComm<commpact::DeferredComm<commpact::ThreadComm>>> g{
//!       commpact::DeferredComm{c}, {.density = 0.01}};
//!   commpact::deferred_space::buffer<float> grad;   // device memory
//!   // ... the backward pass writes grad ...
//!   g.reduce(grad.view());    // start + finish: one fence
//! });
//! \endcode

#include <cstddef>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../space/deferred.hpp"
#include "known_size.hpp"

namespace commpact {

template <class C>
class DeferredComm {
  static_assert(diagnose_point_to_point<C>());

 public:
  using space_type = deferred_space;
  using inner_type = C;

  explicit DeferredComm(C comm, deferred_space::exec e = deferred_space::make_exec())
      : comm_(std::move(comm)), exec_(std::move(e)) {}

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  const deferred_space::exec& exec() const { return exec_; }
  void fence(deadline until = no_deadline()) { deferred_space::fence(exec_, until); }
  //! C's timeout, when it has one: the deadline of every fence on this executor's work.
  auto timeout() const
    requires requires(const C& c) { c.timeout(); }
  {
    return comm_.timeout();
  }

  // ---- data plane: queued ---------------------------------------------------------
  template <class T>
  void allreduce(deferred_span<T> data, reduce_op op = reduce_op::sum) {
    exec_.enqueue([c = &comm_, data, op] { c->allreduce(deferred_access::host(data), op); }, data);
  }
  template <class T>
  void allgather(deferred_span<const T> in, deferred_span<T> out) {
    exec_.enqueue([c = &comm_, in, out] {
      c->allgather(std::span<const T>(deferred_access::host(in)), deferred_access::host(out));
    }, in, out);
  }
  template <class T>
  void broadcast(deferred_span<T> data, int root) {
    exec_.enqueue([c = &comm_, data, root] { c->broadcast(deferred_access::host(data), root); }, data);
  }
  void exchange(int peer, deferred_span<const std::byte> out, deferred_span<std::byte> in) {
    exec_.enqueue([c = &comm_, peer, out, in] {
      commpact::exchange(*c, peer, deferred_access::host(out), deferred_access::host(in));
    }, out, in);
  }
  void send_known(int peer, deferred_span<const std::byte> out) {
    exec_.enqueue([c = &comm_, peer, out] { commpact::send_known(*c, peer, deferred_access::host(out)); }, out);
  }
  void recv_known(int peer, deferred_span<std::byte> in) {
    exec_.enqueue([c = &comm_, peer, in] { commpact::recv_known(*c, peer, deferred_access::host(in)); }, in);
  }
  //! C's group of point-to-point calls, queued (only when C has groups).
  void group_begin()
    requires req::has_p2p_group<C>
  {
    exec_.enqueue([c = &comm_] { c->group_begin(); });
  }
  void group_end()
    requires req::has_p2p_group<C>
  {
    exec_.enqueue([c = &comm_] { c->group_end(); });
  }

  // ---- control plane on host memory: fence, then at once --------------------------
  template <class T>
  void allreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    fence();
    comm_.allreduce(data, op);
  }
  template <class T>
  void allgather(std::span<const T> in, std::span<T> out) {
    fence();
    comm_.allgather(in, out);
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    fence();
    comm_.broadcast(data, root);
  }
  void barrier() {
    fence();
    comm_.barrier();
  }
  void send(int peer, std::span<const std::byte> msg) {
    fence();
    comm_.send(peer, msg);
  }
  void recv(int peer, std::vector<std::byte>& buf) {
    fence();
    comm_.recv(peer, buf);
  }
  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) {
    fence();
    comm_.sendrecv(peer, msg, buf);
  }
  //! Marks the group failed at once (not queued): the others raise instead of waiting.
  void abort(std::string_view why) {
    exec_.q->drop();
    comm_.abort(why);
  }

  C& inner() { return comm_; }
  const C& inner() const { return comm_; }

 private:
  C comm_;
  deferred_space::exec exec_;
};

template <class C>
DeferredComm(C) -> DeferredComm<C>;

}  // namespace commpact
