// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file exchange.hpp
//! What every gossip algorithm shares: the neighbours of this rank in a Topology, their
//! mixing weights, one send and one receive buffer per neighbour, the exchange itself,
//! the setup check and the non-finite agreement.
//!
//! Exchange order: a rank first sends to every neighbour, then receives from every
//! neighbour in ascending order, so no topology can deadlock as long as `Comm::send`
//! does not wait for the receiver (ThreadComm, MpiComm).

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "../comm/agree.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
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
  //! or skip the round on every rank (models unchanged). Detected with one 8-byte
  //! allreduce per round.
  nonfinite on_nonfinite = nonfinite::raise;
  //! false: no check and no allreduce; a NaN then spreads to the neighbours' models.
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
    send_.resize(nb_.size());
    recv_.resize(nb_.size());
    for (int r = 0; r < comm_.size(); ++r)
      for (int j : topo.neighbors(r)) edges_.push_back(static_cast<std::int64_t>(r) * comm_.size() + j);
  }

  Comm& comm() { return comm_; }
  int rank() const { return comm_.rank(); }
  std::size_t degree() const { return nb_.size(); }
  const std::vector<int>& neighbors() const { return nb_; }
  int neighbor(std::size_t k) const { return nb_[k]; }
  double weight(std::size_t k) const { return w_[k]; }
  double self_weight() const { return self_w_; }
  //! Every edge (r, j) of the topology as r * P + j, for the setup hash.
  const std::vector<std::int64_t>& edges() const { return edges_; }

  std::vector<std::byte>& send_buffer(std::size_t k) { return send_[k]; }
  std::span<const std::byte> received(std::size_t k) const { return recv_[k]; }

  //! Sends send_buffer(k) to neighbour k (every k), then receives from each in order.
  void exchange() {
    for (std::size_t k = 0; k < nb_.size(); ++k) send(k, send_[k]);
    for (std::size_t k = 0; k < nb_.size(); ++k) comm_.recv(nb_[k], recv_[k]);
  }
  //! Sends the same message to every neighbour, then receives.
  void exchange_same(std::span<const std::byte> msg) {
    for (std::size_t k = 0; k < nb_.size(); ++k) send(k, msg);
    for (std::size_t k = 0; k < nb_.size(); ++k) comm_.recv(nb_[k], recv_[k]);
  }

  //! Once: every rank built the same setup (one small allreduce; mismatch_error on every rank).
  void check_setup(std::int64_t hash) {
    if (checked_) return;
    require_same(comm_, hash,
                 "the GossipMixer setup (a hash of the algorithm, the layout and the topology's edges; build the same "
                 "mixer on every rank)");
    checked_ = true;
  }

  //! True when every rank's x is finite (the same answer on every rank). Otherwise
  //! raises numeric_error on every rank, or returns false under skip_step.
  bool all_finite(std::span<const float> x, const gossip_options& opt, std::int64_t round) {
    if (!opt.check_finite) return true;
    const std::size_t bad = detail::first_nonfinite(x);
    std::int64_t flag = bad == x.size() ? 0 : 1;
    comm_.allreduce(std::span<std::int64_t>(&flag, 1), reduce_op::max);
    if (flag == 0) return true;
    if (opt.on_nonfinite == nonfinite::raise)
      throw numeric_error(detail::cat("commpact::GossipMixer::mix: the model of ",
                                      bad == x.size() ? "another rank" : detail::cat("rank ", comm_.rank(), " (index ", bad, ")"),
                                      " is not finite (NaN or Inf) at round ", round,
                                      "; every rank raises this error. Fix the training step, or set on_nonfinite = "
                                      "nonfinite::skip_step to skip such rounds on every rank."));
    return false;
  }

  gossip_stats& stats() { return stats_; }
  const gossip_stats& stats() const { return stats_; }

 private:
  void send(std::size_t k, std::span<const std::byte> msg) {
    comm_.send(nb_[k], msg);
    stats_.bytes_sent += msg.size();
    ++stats_.messages_sent;
  }

  Comm comm_;
  std::vector<int> nb_;
  std::vector<double> w_;
  double self_w_ = 1.0;
  std::vector<std::int64_t> edges_;
  std::vector<std::vector<std::byte>> send_, recv_;
  gossip_stats stats_;
  bool checked_ = false;
};

}  // namespace commpact
