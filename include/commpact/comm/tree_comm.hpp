// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file tree_comm.hpp
//! TreeComm<C>: a point-to-point communicator seen through the Hypercube's
//! recursive-doubling schedule, for any number of ranks P.
//!
//! Each rank's part of the schedule is a list of steps (see Hypercube):
//!
//! - P not a power of two: p2 = bit_floor(P); extra rank r >= p2 sends its payload to
//!   r - p2 (`fold_send`), which receives it (`fold_recv`);
//! - rounds j = 0 .. log2(p2) - 1: core rank r exchanges with r XOR 2^j (`exchange`);
//! - the core rank sends the result back to its extra rank (`unfold_send` /
//!   `unfold_recv`).
//!
//! `reduce(reducer, buffer)` walks the steps, moving variable-length byte payloads: for a
//! step that sends it asks `reducer.payload(step)`, for a step that receives it hands the
//! message to `reducer.absorb(step, bytes)`. The reducer does the merging (gTopK merges
//! sparse sets); TreeComm only moves bytes in the right order. P = 1 has no steps.
//!
//! \code
//! commpact::TreeComm<commpact::ThreadComm> tree{comm};
//! struct Sum { std::int64_t v; std::vector<std::byte> out;
//!   std::span<const std::byte> payload(const commpact::tree_step&) {
//!     out.resize(sizeof v); std::memcpy(out.data(), &v, sizeof v); return out; }
//!   void absorb(const commpact::tree_step& s, std::span<const std::byte> m) {
//!     std::int64_t x; std::memcpy(&x, m.data(), sizeof x);
//!     v = s.stage == commpact::tree_stage::unfold_recv ? x : v + x; } };   // unfold: the result
//! Sum s{comm.rank()};
//! std::vector<std::byte> buf;
//! tree.reduce(s, buf);   // s.v == 0 + 1 + ... + P-1 on every rank
//! \endcode
//!
//! TreeComm also forwards the whole Communicator interface of C, so it is itself a
//! PointToPoint communicator. It requires C to be PointToPoint; otherwise the
//! compilation stops with one sentence saying what is missing.
//!
//! Every rank sends and receives at most ceil(log2 P) + 1 messages per reduce: log2(p2)
//! exchanges, plus the fold or the unfold for P not a power of two.

#include <cstddef>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../topology/hypercube.hpp"
#include "forward_group.hpp"
#include "known_size.hpp"

namespace commpact {

//! The steps of `rank` in the recursive-doubling schedule of `h`.
inline std::vector<tree_step> tree_schedule(const Hypercube& h, int rank) {
  std::vector<tree_step> s;
  const int partner = h.fold_partner(rank);
  if (h.is_extra(rank)) {
    s.push_back({tree_stage::fold_send, partner, -1});
    s.push_back({tree_stage::unfold_recv, partner, -1});
    return s;
  }
  if (partner >= 0) s.push_back({tree_stage::fold_recv, partner, -1});
  for (int j = 0; j < h.rounds(); ++j) s.push_back({tree_stage::exchange, h.partner(rank, j), j});
  if (partner >= 0) s.push_back({tree_stage::unfold_send, partner, -1});
  return s;
}

namespace req {
template <class R>
concept tree_reducer = requires(R& r, const tree_step& s, std::span<const std::byte> m) {
  { r.payload(s) } -> std::convertible_to<std::span<const std::byte>>;
  r.absorb(s, m);
};
}  // namespace req

template <class C>
class TreeComm : public detail::forwards_p2p_group<TreeComm<C>, C> {
  static_assert(diagnose_point_to_point<C>());

 public:
  using inner_type = C;

  //! Implicit, so that a compressor over TreeComm<C> can be built from a plain C.
  TreeComm(C comm) : comm_(std::move(comm)), cube_(comm_.size()), steps_(tree_schedule(cube_, comm_.rank())) {}

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

  const Hypercube& schedule() const { return cube_; }
  //! This rank's steps, in order.
  std::span<const tree_step> steps() const { return steps_; }
  //! Messages this rank sends per reduce.
  std::size_t messages_per_reduce() const {
    std::size_t m = 0;
    for (const auto& s : steps_) m += s.sends() ? 1 : 0;
    return m;
  }

  //! Walks this rank's steps: payload(step) for what to send, absorb(step, bytes) for
  //! what arrived. `buf` is the receive buffer (reused across calls).
  template <class Reducer>
  void reduce(Reducer& r, std::vector<std::byte>& buf) {
    static_assert(req::tree_reducer<Reducer>,
                  "commpact::TreeComm::reduce: the reducer needs `std::span<const std::byte> payload(const "
                  "commpact::tree_step&)` and `void absorb(const commpact::tree_step&, std::span<const std::byte>)`.");
    for (const auto& s : steps_) {
      switch (s.stage) {
        case tree_stage::fold_send:
        case tree_stage::unfold_send: comm_.send(s.peer, std::span<const std::byte>(r.payload(s))); break;
        case tree_stage::fold_recv:
        case tree_stage::unfold_recv:
          comm_.recv(s.peer, buf);
          r.absorb(s, std::span<const std::byte>(buf));
          break;
        case tree_stage::exchange:
          comm_.sendrecv(s.peer, std::span<const std::byte>(r.payload(s)), buf);
          r.absorb(s, std::span<const std::byte>(buf));
          break;
      }
    }
  }

  //! Walks this rank's steps with fixed-capacity frames (known-size point-to-point, so
  //! no probe is needed: NCCL has none), in the space of C. For a step that sends,
  //! `r.payload(step)` fills (or queues the filling of) `r.frame_out(step)`; for a step
  //! that receives, exactly `r.frame_in(step).size()` bytes arrive there, then
  //! `r.absorb(step)` merges them (or queues the merge). Both sides of a step must agree
  //! on the frame size; a receiver that gets another size raises mismatch_error.
  template <class Reducer>
  void reduce_frames(Reducer& r) {
    for (const auto& s : steps_) {
      switch (s.stage) {
        case tree_stage::fold_send:
        case tree_stage::unfold_send:
          r.payload(s);
          commpact::send_known(comm_, s.peer, r.frame_out(s));
          break;
        case tree_stage::fold_recv:
        case tree_stage::unfold_recv:
          commpact::recv_known(comm_, s.peer, r.frame_in(s));
          r.absorb(s);
          break;
        case tree_stage::exchange:
          r.payload(s);
          commpact::exchange(comm_, s.peer, r.frame_out(s), r.frame_in(s));
          r.absorb(s);
          break;
      }
    }
  }

  // ---- the Communicator interface, forwarded ---------------------------------
  using space_type = comm_space_t<C>;
  auto exec() { return comm_exec(comm_); }
  //! C's timeout, when it has one (the deadline of a fence on the tree's work).
  auto timeout() const
    requires requires(const C& c) { c.timeout(); }
  {
    return comm_.timeout();
  }
  template <class Span>
  void allreduce(Span data, reduce_op op = reduce_op::sum) {
    comm_.allreduce(data, op);
  }
  template <class In, class Out>
  void allgather(In in, Out out) {
    comm_.allgather(in, out);
  }
  template <class Span>
  void broadcast(Span data, int root) {
    comm_.broadcast(data, root);
  }
  void barrier() { comm_.barrier(); }
  void abort(std::string_view why) { comm_.abort(why); }
  void send(int peer, std::span<const std::byte> msg) { comm_.send(peer, msg); }
  void recv(int peer, std::vector<std::byte>& buf) { comm_.recv(peer, buf); }
  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) { comm_.sendrecv(peer, msg, buf); }

  // group_begin() / group_end(): forwards_p2p_group (comm/forward_group.hpp), when C has them.
  C& inner() { return comm_; }
  const C& inner() const { return comm_; }

 private:
  C comm_;
  Hypercube cube_;
  std::vector<tree_step> steps_;
};

}  // namespace commpact
