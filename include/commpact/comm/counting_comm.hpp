// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file counting_comm.hpp
//! CountingComm<C>: a decorator that counts the bytes and messages one rank sends and
//! receives. Point-to-point traffic is counted exactly as passed; collectives are
//! charged by the textbook algorithm's exact formula (wire_model.hpp), so counts do
//! not depend on which MPI or thread implementation runs underneath.
//!
//! \code
//! commpact::CountingComm<commpact::ThreadComm> counted{comm};
//! counted.allreduce(std::span(grad));
//! auto s = counted.stats();   // s.bytes_sent, s.messages_sent, s.collectives ...
//! \endcode
//!
//! Copies share one counter, like copies of a ThreadComm share one world: keep a copy
//! and hand another to a compressor, and the copy you kept sees the compressor's traffic.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "forward_group.hpp"
#include "wire_model.hpp"

namespace commpact {

struct comm_stats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t messages_sent = 0;
  std::uint64_t messages_received = 0;
  std::uint64_t collectives = 0;  //!< collective calls (allreduce, allgather, broadcast, barrier)
  std::uint64_t point_to_point_bytes_sent = 0;  //!< the part of bytes_sent that went through send/sendrecv

  comm_stats& operator+=(const wire_cost& w) {
    bytes_sent += w.bytes_sent;
    bytes_received += w.bytes_received;
    messages_sent += w.messages_sent;
    messages_received += w.messages_received;
    return *this;
  }
  friend comm_stats operator-(comm_stats a, const comm_stats& b) {
    a.bytes_sent -= b.bytes_sent;
    a.bytes_received -= b.bytes_received;
    a.messages_sent -= b.messages_sent;
    a.messages_received -= b.messages_received;
    a.collectives -= b.collectives;
    a.point_to_point_bytes_sent -= b.point_to_point_bytes_sent;
    return a;
  }
  bool operator==(const comm_stats&) const = default;
};

template <class C>
class CountingComm : public detail::forwards_p2p_group<CountingComm<C>, C> {
  static_assert(diagnose_communicator<C>());

 public:
  explicit CountingComm(C inner) : inner_(std::move(inner)), stats_(std::make_shared<comm_stats>()) {}

  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  //! Forwarded from the wrapped communicator when it has it (MpiComm).
  bool allows_calls_from_other_threads() const
    requires requires(const C& c) { c.allows_calls_from_other_threads(); }
  {
    return inner_.allows_calls_from_other_threads();
  }

  template <class T>
  void allreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    inner_.allreduce(data, op);
    ++stats_->collectives;
    *stats_ += wire::ring_allreduce(rank(), size(), data.size(), sizeof(T));
  }

  template <class T>
  void allgather(std::span<const T> in, std::span<T> out) {
    inner_.allgather(in, out);
    ++stats_->collectives;
    *stats_ += wire::ring_allgather(rank(), size(), in.size_bytes());
  }

  template <class T>
  void broadcast(std::span<T> data, int root) {
    inner_.broadcast(data, root);
    ++stats_->collectives;
    *stats_ += wire::binomial_broadcast(rank(), size(), root, data.size_bytes());
  }

  void barrier() {
    inner_.barrier();
    ++stats_->collectives;
  }

  void abort(std::string_view why) { inner_.abort(why); }

  void send(int peer, std::span<const std::byte> msg)
    requires req::has_send_recv<C>
  {
    inner_.send(peer, msg);
    count_send(msg.size());
  }

  void recv(int peer, std::vector<std::byte>& buf)
    requires req::has_send_recv<C>
  {
    inner_.recv(peer, buf);
    count_recv(buf.size());
  }

  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf)
    requires req::has_send_recv<C>
  {
    inner_.sendrecv(peer, msg, buf);
    count_send(msg.size());
    count_recv(buf.size());
  }

  //! Known-size nonblocking messages, forwarded when the wrapped communicator has them
  //! (counted when started: both sides know the size).
  auto isend(int peer, std::span<const std::byte> msg)
    requires req::has_nonblocking_send_recv<C>
  {
    auto h = inner_.isend(peer, msg);
    count_send(msg.size());
    return h;
  }
  auto irecv(int peer, std::span<std::byte> buf)
    requires req::has_nonblocking_send_recv<C>
  {
    auto h = inner_.irecv(peer, buf);
    count_recv(buf.size());
    return h;
  }
  // group_begin() / group_end(): forwards_p2p_group (comm/forward_group.hpp), when C has them.
  const comm_stats& stats() const { return *stats_; }
  void reset_stats() { *stats_ = {}; }
  C& inner() { return inner_; }
  const C& inner() const { return inner_; }

 private:
  void count_send(std::size_t n) {
    ++stats_->messages_sent;
    stats_->bytes_sent += n;
    stats_->point_to_point_bytes_sent += n;
  }
  void count_recv(std::size_t n) {
    ++stats_->messages_received;
    stats_->bytes_received += n;
  }

  C inner_;
  std::shared_ptr<comm_stats> stats_;
};

}  // namespace commpact
