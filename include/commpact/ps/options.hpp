// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file options.hpp
//! What a ParameterServer is built over and with, and what it reports: the ServerComm
//! concept, ps_options, read_record (one pull) and ps_stats (bytes and messages sent).
//! Part of the parameter server (include commpact/ps/parameter_server.hpp).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

#include "../concepts.hpp"

namespace commpact::ps {

//! What a ParameterServer needs of a communicator: messages to one peer and a receive
//! of a known size that can be tested without waiting.
template <class C>
concept ServerComm = Communicator<C> && requires(C& c, int peer, std::span<const std::byte> msg,
                                                 std::span<std::byte> buf) {
  c.send(peer, msg);
  { c.irecv(peer, buf) } -> commpact::req::waitable;
};

struct ps_options {
  double momentum = 0.0;      //!< the servers' Sgd momentum
  double weight_decay = 0.0;  //!< the servers' Sgd weight decay
  //! Longest time a pull, finish or barrier waits without any message arriving (0: the
  //! communicator's own timeout when it has options().timeout, else 60 s). Each posted
  //! receive keeps the communicator's deadline too: a peer silent for longer fails.
  std::chrono::milliseconds timeout{0};
  bool record_reads = false;  //!< keep one read_record per pull (tests, staleness statistics)
};

//! One pull as the worker saw it.
struct read_record {
  std::int64_t clock = 0;  //!< the worker's clock (pushes done) when it pulled
  //! The fewest clocks whose updates from every worker a shard it read holds (Bsp/Ssp:
  //! the shard's version; Asp: the fewest pushes applied from a running worker), and the
  //! most; clock - min_version is the read's staleness.
  std::int64_t min_version = 0;
  std::int64_t max_version = 0;
};

//! Bytes and messages this rank sent, by what they carried.
struct ps_stats {
  std::uint64_t push_bytes = 0, push_messages = 0;    //!< headers and payloads of pushes
  std::uint64_t reply_bytes = 0, reply_messages = 0;  //!< parameter replies (server -> worker)
  std::uint64_t control_bytes = 0, control_messages = 0;  //!< pull requests, done, fence, bye
  std::uint64_t bytes() const { return push_bytes + reply_bytes + control_bytes; }
  std::uint64_t messages() const { return push_messages + reply_messages + control_messages; }
  std::uint64_t pulls_waited = 0;  //!< pulls that had to wait for the server (this worker)
  double wait_seconds = 0;         //!< time this worker spent inside pull() waiting
};

}  // namespace commpact::ps
