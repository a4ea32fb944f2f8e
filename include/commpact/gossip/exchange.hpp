// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file exchange.hpp
//! What every gossip algorithm shares: the neighbours of this rank in a Topology, their
//! mixing weights, one send and one receive buffer per neighbour, the exchange itself,
//! the setup check and the non-finite agreement.
//!
//! Exchange order: a rank first sends to every neighbour, then receives from every
//! neighbour in ascending order, so no topology can deadlock as long as `Comm::send`
//! does not wait for the receiver (ThreadComm, MpiComm). The known-size exchanges post a
//! round's sends and receives as one group (known_size.hpp's `grouped`), so a
//! communicator whose sends wait for their receivers (NcclComm) cannot deadlock either.
//!
//! Space (v3): every algorithm runs in the communicator's space (comm_space_t<Comm>):
//! the round's status words, the weights and the messages are the space's buffers, the
//! exchange is known-size point-to-point on its spans (exchange_same_known: one message
//! for every neighbour; exchange_each_known: PowerGossip's message per neighbour;
//! DeferredComm queues them), and finish_round() fences once, reads the status and
//! rolls the counters back when the round failed.

#include <cstddef>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../comm/agree.hpp"
#include "../comm/known_size.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/deferred/ops.hpp"
#include "../kernels/host/gossip.hpp"
#include "../kernels/host/ops.hpp"
#include "../nonfinite.hpp"

namespace commpact {

//! Bytes and messages a mixer sent (point-to-point payload only), and rounds.
struct gossip_stats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t messages_sent = 0;
  std::uint64_t steps = 0;    //!< rounds completed (mixed or skipped)
  std::uint64_t skipped = 0;  //!< rounds skipped because some rank's model was not finite
};

//! Options every gossip algorithm takes.
struct gossip_options {
  //! A model holding NaN or Inf on any rank: raise numeric_error on every rank (default)
  //! or skip the round on every rank (models unchanged). Detected with one 24-byte
  //! allreduce per round, which also raises mismatch_error on every rank when the ranks'
  //! round counts differ (a rank restored alone from an older state).
  nonfinite on_nonfinite = nonfinite::raise;
  //! false: no check and no allreduce; a NaN then spreads to the neighbours' models, and
  //! ranks at different rounds are not detected.
  bool check_finite = true;
};

template <class Comm>
class neighbor_exchange {
  static_assert(diagnose_point_to_point<Comm>(),
                "commpact::GossipMixer needs a point-to-point communicator (send/recv with neighbours).");

 public:
  template <class Topo>
  neighbor_exchange(Comm comm, const Topo& topo) : comm_(std::move(comm)) {
    static_assert(diagnose_topology<Topo>());
    require(static_cast<int>(topo.size()) == comm_.size(), "commpact::GossipMixer: the topology has ",
            static_cast<int>(topo.size()), " ranks but the communicator has ", comm_.size(),
            "; build the topology for comm.size() ranks (e.g. Ring(comm.size())).");
    const int me = comm_.rank();
    for (int j : topo.neighbors(me)) nb_.push_back(static_cast<int>(j));
    self_w_ = static_cast<double>(topo.weight(me, me));
    for (int j : nb_) w_.push_back(static_cast<double>(topo.weight(me, j)));
    for (int r = 0; r < comm_.size(); ++r)
      for (int j : topo.neighbors(r)) edges_.push_back(static_cast<std::int64_t>(r) * comm_.size() + j);
  }

  Comm& comm() { return comm_; }
  //! How long a wait on this exchange's queued work may last (the communicator's timeout).
  std::chrono::milliseconds timeout() const { return comm_timeout(comm_); }
  int rank() const { return comm_.rank(); }
  std::size_t degree() const { return nb_.size(); }
  const std::vector<int>& neighbors() const { return nb_; }
  int neighbor(std::size_t k) const { return nb_[k]; }
  double weight(std::size_t k) const { return w_[k]; }
  double self_weight() const { return self_w_; }
  //! Every edge (r, j) of the topology as r * P + j, for the setup hash.
  const std::vector<std::int64_t>& edges() const { return edges_; }

  //! Once: every rank built the same setup (one small allreduce; mismatch_error on every rank).
  void check_setup(std::int64_t hash) {
    if (checked_) return;
    require_same(comm_, {{"the GossipMixer setup (a hash of the algorithm, its parameters: gamma, seed, the codec's "
                          "agreement value; the gossip options, the layout and the topology's edges)",
                          hash,
                          "build the same mixer on every rank: the same algorithm, parameters, options, layout and "
                          "topology."}});
    checked_ = true;
  }

  // ---- the data plane in the communicator's space (D-PSGD, CHOCO) -------------------
  using space_type = comm_space_t<Comm>;
  template <class T>
  using span = typename space_type::template span<T>;
  template <class T>
  using buffer = typename space_type::template buffer<T>;
  using K = ops<space_type>;

  auto exec() const { return comm_exec(const_cast<Comm&>(comm_)); }

  //! Starts a round on x: sizes the status words, the message buffers (msg_bytes to send
  //! when `own_message`, one block of msg_bytes per neighbour to receive) and the weights
  //! (uploaded at the first round), and queues the non-finite check of x (status words,
  //! kernels/host/gossip.hpp).
  void begin_round(span<const float> x, std::size_t msg_bytes, const gossip_options& opt, bool own_message) {
    const auto e = exec();
    msg_bytes_ = msg_bytes;
    flag_ = 0;
    words_.resize(host::gossip::status_words + host::gossip::agreement_words, e);
    send_dev_.resize(own_message ? msg_bytes : 0, e);
    recv_dev_.resize(msg_bytes * nb_.size(), e);
    if (w_dev_.size() != nb_.size()) {
      w_dev_.resize(nb_.size(), e);
      if (!nb_.empty()) K::from_host(e, std::span<const double>(w_), w_dev_.view());
    }
    K::gossip_check(e, x, opt.check_finite, words_.view());
  }
  //! This rank's verdict on the round (host::gossip::flag_length), after begin_round:
  //! agree_flag() writes it into words[0] just before the allreduce, after the round's
  //! own checks (an algorithm's gossip_check rewrites words[0]).
  void flag_round(std::int64_t flag) { flag_ = flag; }
  //! Queues the agreement on the round's flag and on the round count (stats().steps, the
  //! rounds completed): one 24-byte allreduce (max) of {flag, round, -round}, unless
  //! check_finite is off. Ranks whose counts differ read flag_rounds (finish_round).
  void agree_flag(const gossip_options& opt) {
    const auto e = exec();
    if (flag_ != 0) K::fill(e, words_.view().first(1), flag_);  // begin_round clears flag_
    if (!opt.check_finite) return;
    constexpr auto s = host::gossip::status_words, a = host::gossip::agreement_words;
    K::gossip_agree_begin(e, static_cast<std::int64_t>(stats_.steps), words_.view());
    comm_.allreduce(words_.view().subspan(s, a), reduce_op::max);
    K::gossip_agree_end(e, words_.view());
  }
  //! The round's status words (host::gossip::status_words, then the agreement's).
  span<std::int64_t> words() { return words_.view(); }
  span<const double> weights() const { return w_dev_.cview(); }
  //! The send buffer (sized by begin_round when own_message) and this round's message size.
  span<std::byte> message() { return send_dev_.view(); }
  std::size_t message_bytes() const { return msg_bytes_; }
  span<const std::byte> received_all() const { return recv_dev_.cview(); }

  //! Sends `out` (this round's message_bytes()) to every neighbour, then receives one
  //! message of that size from each in ascending order (known-size point-to-point on the
  //! space's spans).
  void exchange_same_known(span<const std::byte> out) {
    const std::size_t m = msg_bytes_;
    grouped(comm_, [&] {
      for (std::size_t k = 0; k < nb_.size(); ++k) {
        send_known(comm_, nb_[k], out);
        stats_.bytes_sent += m;
        ++stats_.messages_sent;
      }
      for (std::size_t k = 0; k < nb_.size(); ++k) recv_known(comm_, nb_[k], recv_dev_.view().subspan(k * m, m));
    });
  }

  //! Sends the k-th block of message_bytes() of `out` to neighbour k (every k), then
  //! receives one message of that size from each in ascending order (PowerGossip: a
  //! different message per edge; known-size point-to-point on the space's spans).
  void exchange_each_known(span<const std::byte> out) {
    const std::size_t m = msg_bytes_;
    grouped(comm_, [&] {
      for (std::size_t k = 0; k < nb_.size(); ++k) {
        send_known(comm_, nb_[k], out.subspan(k * m, m));
        stats_.bytes_sent += m;
        ++stats_.messages_sent;
      }
      for (std::size_t k = 0; k < nb_.size(); ++k) recv_known(comm_, nb_[k], recv_dev_.view().subspan(k * m, m));
    });
  }

  //! Reserves the receive buffer for messages of up to max_bytes (an algorithm whose
  //! message size changes between rounds: no allocation after the first round).
  void reserve_messages(std::size_t max_bytes) { recv_dev_.reserve(max_bytes * nb_.size(), exec()); }

  //! Fences once and reads the status words. A round that failed (any flag, a malformed
  //! message) leaves the counters as in `before`; a malformed message raises wire_error
  //! on its receiver (nothing changed). Returns the agreed flag (host::gossip): 0 mixed,
  //! flag_nonfinite a non-finite model (nonfinite_round), flag_short a codec's short
  //! message (the algorithm raises), flag_length a buffer of another length on some rank
  //! (GossipMixer::mix raises), flag_rounds ranks at different round counts (agreed_rounds;
  //! GossipMixer::mix raises).
  //! `why` is read after the fence (the decode kernel writes it).
  std::int64_t finish_round(const gossip_stats& before, const std::string& why) {
    const auto e = exec();
    words_host_.resize(host::gossip::status_words + host::gossip::agreement_words);
    K::to_host(e, words_.cview(), words_host_.view());
    comm_fence(comm_);
    const auto w = std::span<const std::int64_t>(words_host_.view());
    // The flag is 0 to 4; a copy read before its fence holds all-ones bytes (-1).
    require_fenced(static_cast<std::uint32_t>(w[0] >> 32), "GossipMixer::mix");
    if (w[0] == 0 && w[2] == 0) return 0;
    stats_ = before;
    if (w[2] != 0)
      throw wire_error(detail::cat("commpact::GossipMixer::mix: rank ", comm_.rank(), " received a malformed message from rank ",
                                   nb_[static_cast<std::size_t>(w[2] - 1)], ": ", why,
                                   " The round changed nothing on this rank."));
    return w[0];
  }
  //! The highest and lowest round count of the ranks at the last finish_round that
  //! returned flag_rounds.
  std::pair<std::int64_t, std::int64_t> agreed_rounds() const {
    const auto w = std::span<const std::int64_t>(words_host_.view());
    return {w[host::gossip::status_words + 1], -w[host::gossip::status_words + 2]};
  }
  //! This rank's first non-finite index at the last finish_round (n when none).
  std::size_t bad_index() const { return static_cast<std::size_t>(std::span<const std::int64_t>(words_host_.view())[1]); }

  //! A round with a non-finite model somewhere (every rank knows it): raises
  //! numeric_error on every rank, or returns false under skip_step.
  //! `none`: the index that means "none on this rank" (n, or the length an algorithm checked).
  bool nonfinite_round(std::size_t bad, std::size_t n, const gossip_options& opt, std::int64_t round,
                       std::size_t none) const {
    if (opt.on_nonfinite == nonfinite::raise)
      throw numeric_error(detail::cat("commpact::GossipMixer::mix: the model of ",
                                      bad == none ? std::string("another rank")
                                      : bad < n ? detail::cat("rank ", comm_.rank(), " (index ", bad, ")")
                                                : detail::cat("rank ", comm_.rank(), " (a projection it sends)"),
                                      " is not finite (NaN or Inf), or (PowerGossip) too large to mix without "
                                      "overflow, at round ", round,
                                      "; every rank raises this error. Fix the training step, or set on_nonfinite = "
                                      "nonfinite::skip_step to skip such rounds on every rank."));
    return false;
  }

  //! Address and capacity of the exchange's space buffers (GossipMixer::workspace_signature).
  template <class Out>
  void add_signature(Out& s) const {
    s.emplace_back(words_.data(), words_.capacity());
    s.emplace_back(w_dev_.data(), w_dev_.capacity());
    s.emplace_back(send_dev_.data(), send_dev_.capacity());
    s.emplace_back(recv_dev_.data(), recv_dev_.capacity());
  }

  gossip_stats& stats() { return stats_; }
  const gossip_stats& stats() const { return stats_; }

 private:
  Comm comm_;
  std::vector<int> nb_;
  std::vector<double> w_;
  double self_w_ = 1.0;
  std::vector<std::int64_t> edges_;
  gossip_stats stats_;
  bool checked_ = false;
  buffer<std::int64_t> words_;
  buffer<double> w_dev_;
  buffer<std::byte> send_dev_, recv_dev_;
  std::size_t msg_bytes_ = 0;
  std::int64_t flag_ = 0;  // flag_round(), written by agree_flag()
  pinned_t<space_type, std::int64_t> words_host_;  // the round's status words, read after the fence
};

}  // namespace commpact
