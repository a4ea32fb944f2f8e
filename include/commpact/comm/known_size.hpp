// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file known_size.hpp
//! Known-size point-to-point over any communicator, and the space a communicator's data
//! lives in.
//!
//! v3 moves every variable-length message into a fixed-capacity frame whose header
//! carries the count, so the receiver always knows the size (NCCL has no probe).
//! `exchange(comm, peer, out, in)` sends out and receives exactly in.size() bytes;
//! `send_known` / `recv_known` are the one-way forms. A communicator may provide them as
//! members (DeferredComm queues them); otherwise they are built from isend/irecv
//! (AsyncPointToPoint) or from send/recv with a size check.
//!
//! `comm_space_t<C>` is C::space_type when C names one, else host_space; `comm_exec(c)`
//! is c.exec() when C has one, else the host executor.
//!
//! Grouped point-to-point. An algorithm whose ranks send to peers that are themselves
//! sending (an all-to-all, a ring step, a neighbour exchange) posts those known-size
//! sends and receives as one group: `grouped(comm, [&] { send_known(...); recv_known(...); })`
//! or a `p2p_group` object. A communicator that needs it provides `group_begin()` and
//! `group_end()` (NcclComm: ncclGroupStart/ncclGroupEnd, so that NCCL never runs a send
//! that waits for a peer whose receive is queued behind its own send); the decorators
//! forward them; elsewhere (ThreadComm, MpiComm, CudaStagedComm: buffered sends) the
//! group does nothing and the calls run as written. Inside a group: known-size sends,
//! receives and exchanges only, on one thread; a receive's data is there after the group
//! ends (at the next fence in a queued space); a buffer is not written while a send of
//! the group reads it, and no two receives of a group share bytes.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../space/host.hpp"

namespace commpact {

//! The space whose spans a communicator's data-plane calls take.
template <class C>
using comm_space_t = space_of_t<C>;

//! The executor a communicator queues its data-plane work on.
template <class C>
auto comm_exec(C& c) {
  if constexpr (requires { c.exec(); }) return c.exec();
  else return typename comm_space_t<C>::exec{};
}

//! How long a wait on c's queued work may last: c.timeout() when C has one (ThreadComm,
//! MpiComm, NcclComm, and the wrappers that forward it), else forever (milliseconds::max()).
template <class C>
std::chrono::milliseconds comm_timeout(const C& c) {
  if constexpr (requires { c.timeout(); }) return std::chrono::duration_cast<std::chrono::milliseconds>(c.timeout());
  else return std::chrono::milliseconds::max();
}

//! now + t, or no_deadline() when that would not fit.
inline deadline deadline_after(std::chrono::milliseconds t) {
  const auto now = std::chrono::steady_clock::now();
  if (t >= std::chrono::duration_cast<std::chrono::milliseconds>(deadline::max() - now)) return no_deadline();
  return now + t;
}

//! When a wait on c's queued work that starts now must end (comm_timeout).
template <class C>
deadline comm_deadline(const C& c) {
  return deadline_after(comm_timeout(c));
}

//! Waits for the work queued on c's executor, never past comm_deadline(c): the one
//! host wait of a compressor's step (timeout_error at the deadline).
template <class C>
void comm_fence(C& c) {
  comm_space_t<C>::fence(comm_exec(c), comm_deadline(c));
}

//! Orders the work c queues from now on after the work `ev` marks (a framework's
//! backward, recorded on its stream): the join before a step, with no host wait.
template <class C>
void comm_wait(C& c, const typename comm_space_t<C>::event& ev) {
  comm_space_t<C>::wait(comm_exec(c), ev);
}

//! An event marking everything c has queued so far (a step's end): the consumer (the
//! optimiser's stream) waits on it instead of the host fencing.
template <class C>
auto comm_record(C& c) {
  return comm_space_t<C>::record(comm_exec(c));
}

namespace detail {
template <class C>
void check_received(C& c, int peer, std::size_t got, std::size_t want, const char* who) {
  if (got == want) return;
  const auto why = cat(who, ": rank ", c.rank(), " expected a ", want, "-byte message from rank ", peer, " and got ",
                       got, " bytes; ranks disagree on the message size.");
  c.abort(why);
  throw mismatch_error(cat("commpact::", why, " Every rank must use the same options."));
}
}  // namespace detail

//! Sends `out` to peer and receives exactly in.size() bytes from it.
template <class C, class Out, class In>
void exchange(C& c, int peer, Out out, In in) {
  if constexpr (requires { c.exchange(peer, out, in); }) {
    c.exchange(peer, out, in);
  } else if constexpr (req::has_nonblocking_send_recv<C>) {
    auto r = c.irecv(peer, in);
    auto s = c.isend(peer, out);
    s.wait();
    r.wait();
  } else {
    thread_local std::vector<std::byte> buf;
    c.sendrecv(peer, out, buf);
    detail::check_received(c, peer, buf.size(), in.size(), "exchange");
    std::copy(buf.begin(), buf.end(), in.begin());
  }
}

//! Sends `out` to peer (the peer calls recv_known with the same size).
template <class C, class Out>
void send_known(C& c, int peer, Out out) {
  if constexpr (requires { c.send_known(peer, out); }) c.send_known(peer, out);
  else c.send(peer, out);
}

//! Receives exactly in.size() bytes from peer.
template <class C, class In>
void recv_known(C& c, int peer, In in) {
  if constexpr (requires { c.recv_known(peer, in); }) {
    c.recv_known(peer, in);
  } else if constexpr (req::has_nonblocking_send_recv<C>) {
    c.irecv(peer, in).wait();
  } else {
    thread_local std::vector<std::byte> buf;
    c.recv(peer, buf);
    detail::check_received(c, peer, buf.size(), in.size(), "recv_known");
    std::copy(buf.begin(), buf.end(), in.begin());
  }
}

//! Opens a group of point-to-point calls on c (nothing when c has no groups).
template <class C>
void group_begin(C& c) {
  if constexpr (req::has_p2p_group<C>) c.group_begin();
}
//! Closes the group opened by group_begin(c): its sends and receives are posted together.
template <class C>
void group_end(C& c) {
  if constexpr (req::has_p2p_group<C>) c.group_end();
}

//! A group of point-to-point calls on a communicator, open from construction to end().
//! end() raises what the communicator raises; a group left open (an exception inside it)
//! is closed by the destructor, whose error, if any, is dropped for the one in flight.
template <class C>
class p2p_group {
 public:
  explicit p2p_group(C& c) : c_(&c) { commpact::group_begin(c); }
  p2p_group(const p2p_group&) = delete;
  p2p_group& operator=(const p2p_group&) = delete;
  ~p2p_group() {
    if (!c_) return;
    try {
      commpact::group_end(*c_);
    } catch (...) {  // NOLINT(bugprone-empty-catch): the exception that unwinds says more
    }
  }
  //! Closes the group (posts its calls).
  void end() {
    if (C* c = std::exchange(c_, nullptr)) commpact::group_end(*c);
  }

 private:
  C* c_;
};

//! Runs f() (known-size sends and receives on c) as one group of c.
template <class C, class F>
void grouped(C& c, F&& f) {
  p2p_group<C> g(c);
  std::forward<F>(f)();
  g.end();
}

}  // namespace commpact
