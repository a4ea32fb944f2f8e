// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file dpsgd.hpp
//! D-PSGD (Lian et al., NeurIPS 2017): each rank sends its whole model to its
//! neighbours and mixes exactly, x_i = w_ii x_i + sum_j w_ij x_j (in double, neighbours
//! in ascending order). 4n bytes per edge per round, each way.

#include <cstddef>
#include <cstring>
#include <span>
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

  dpsgd_algorithm(const tensor_layout&, std::size_t n, exact_mixing, neighbor_exchange<Comm>&) : n_(n) {}

  void mix(std::span<float> x, neighbor_exchange<Comm>& ex) {
    for (std::size_t k = 0; k < ex.degree(); ++k) {
      auto& m = ex.send_buffer(k);
      m.resize(4 * n_);
      std::memcpy(m.data(), x.data(), 4 * n_);
    }
    ex.exchange();
    for (std::size_t k = 0; k < ex.degree(); ++k)
      require<wire_error>(ex.received(k).size() == 4 * n_, "commpact::GossipMixer (D-PSGD): rank ", ex.neighbor(k),
                          " sent ", ex.received(k).size(), " bytes; a model of ", n_, " floats is ", 4 * n_,
                          " bytes.");
    acc_.resize(n_);
    for (std::size_t i = 0; i < n_; ++i) acc_[i] = ex.self_weight() * x[i];
    for (std::size_t k = 0; k < ex.degree(); ++k) {
      const auto* xj = reinterpret_cast<const float*>(ex.received(k).data());
      const double w = ex.weight(k);
      for (std::size_t i = 0; i < n_; ++i) acc_[i] += w * static_cast<double>(xj[i]);
    }
    for (std::size_t i = 0; i < n_; ++i) x[i] = static_cast<float>(acc_[i]);
  }

  std::size_t message_bytes() const { return 4 * n_; }
  void save(state::writer&) const {}
  struct staged {};
  staged read(state::reader&) const { return {}; }
  void install(staged&&) {}

 private:
  std::size_t n_;
  std::vector<double> acc_;
};

}  // namespace detail
}  // namespace commpact
