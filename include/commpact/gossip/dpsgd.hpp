// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file dpsgd.hpp
//! D-PSGD (Lian et al., NeurIPS 2017): each rank sends its whole model to its
//! neighbours and mixes exactly, x_i = w_ii x_i + sum_j w_ij x_j (in double, neighbours
//! in ascending order). 4n bytes per edge per round, each way.
//!
//! Runs in the communicator's space: the model is packed into one message of 4n bytes
//! (ops::gossip_pack; on host memory x itself is sent), sent to every neighbour with known-size point-to-point, and mixed
//! by ops::gossip_mix, which leaves x as it was when the round failed (kernels/host/gossip.hpp).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../compress/codecs/tensor_layout.hpp"
#include "../error.hpp"
#include "../state.hpp"
#include "exchange.hpp"

namespace commpact {

//! GossipMixer's codec for D-PSGD: models cross the edges uncompressed.
struct exact_mixing {};

namespace detail {

template <class Comm>
class dpsgd_algorithm {
 public:
  static constexpr std::int64_t id = 1;
  static constexpr const char* name = "D-PSGD";
  //! Runs in the communicator's space (GossipMixer drives queue() and commit()).
  static constexpr bool over_space = true;
  using space_type = comm_space_t<Comm>;
  //! A space whose spans are host memory sends x itself; another packs it first.
  static constexpr bool own_message = !space_type::host_accessible;
  template <class T>
  using span = typename space_type::template span<T>;

  dpsgd_algorithm(const tensor_layout&, std::size_t n, exact_mixing, neighbor_exchange<Comm>&) : n_(n) {}

  //! The bytes of this round's message (the model).
  std::size_t round_bytes() { return 4 * n_; }

  //! Queues the round after the exchange's check: the flag's agreement, the model to
  //! every neighbour, and the mix (which does nothing when the round failed).
  void queue(span<float> x, neighbor_exchange<Comm>& ex, const gossip_options& opt) {
    const auto e = ex.exec();
    acc_.resize(n_, e);
    ex.agree_flag(opt);
    if constexpr (space_type::host_accessible) {
      ex.exchange_same_known(std::as_bytes(x));  // host memory: the model itself is the message
    } else {
      ops<space_type>::gossip_pack(e, span<const float>(x), ex.message());
      ex.exchange_same_known(span<const std::byte>(ex.message()));
    }
    ops<space_type>::gossip_mix(e, x, ex.received_all(), ex.weights(), ex.self_weight(), acc_.view(),
                                span<const std::int64_t>(ex.words()));
  }
  //! Why the last round's messages were malformed (D-PSGD's are never: the size is known).
  const std::string& why() const { return why_; }
  [[noreturn]] void raise_short() const { throw wire_error("commpact::GossipMixer (D-PSGD): unreachable"); }
  void commit() {}

  std::size_t message_bytes() const { return 4 * n_; }
  void save(state::writer&) const {}
  struct staged {};
  staged read(state::reader&) const { return {}; }
  void install(staged&&) {}

  template <class Out>
  void add_signature(Out& s) const {
    s.emplace_back(acc_.data(), acc_.capacity());
  }
  //! The parameters every rank must share (GossipMixer's setup hash): none.
  void add_setup(std::vector<std::int64_t>&) const {}

 private:
  std::size_t n_;
  typename space_type::template buffer<double> acc_;
  std::string why_;
};

}  // namespace detail
}  // namespace commpact
