// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file choco.hpp
//! CHOCO-SGD's gossip (Koloskova, Stich and Jaggi, ICML 2019) with any Codec: each rank
//! compresses the difference between its model and its public copy x_hat_i, sends the
//! message to its neighbours, and every rank updates the public copies it tracks:
//!   q_i = Q(x_i - x_hat_i); x_hat_j += q_j for j = i and every neighbour;
//!   x_i += gamma sum_j w_ij (x_hat_j - x_hat_i).
//! Bytes per edge per round: the codec's message (8k for topk_codec, 4 + ceil(n/8) for
//! sign_codec). Keeps degree + 1 model copies.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "../compress/codecs/topk_sign.hpp"
#include "../concepts.hpp"
#include "../compress/codecs/tensor_layout.hpp"
#include "../error.hpp"
#include "../state.hpp"
#include "exchange.hpp"

namespace commpact {

//! CHOCO-SGD with codec Q and consensus step size gamma (GossipMixer's codec parameter;
//! a bare Codec means choco_gossip<Codec> with the default gamma).
template <class Q>
struct choco_gossip {
  static_assert(diagnose_codec<Q>());
  Q codec{};
  double gamma = 0.5;  //!< consensus step size; must be tuned to the codec (smaller for sparser Q)
};

namespace detail {

template <class Q, class Comm>
class choco_algorithm {
 public:
  static constexpr std::int64_t id = 3;
  static constexpr const char* name = "CHOCO";

  choco_algorithm(const tensor_layout&, std::size_t n, choco_gossip<Q> pol, neighbor_exchange<Comm>& ex)
      : codec_(std::move(pol.codec)), gamma_(pol.gamma), n_(n) {
    require(std::isfinite(gamma_) && gamma_ > 0.0 && gamma_ <= 1.0, "commpact::choco_gossip: gamma = ", gamma_,
            " must be in (0, 1] (CHOCO's consensus step size).");
    if constexpr (req::codec_has_bind_rank<Q>) codec_.bind_rank(ex.rank());  // stochastic codecs: own streams
    hat_self_.assign(n_, 0.0f);
    hat_nb_.assign(ex.degree(), std::vector<float>(n_, 0.0f));
    q_nb_.assign(ex.degree(), std::vector<float>(n_, 0.0f));
    diff_.assign(n_, 0.0f);
    q_self_.assign(n_, 0.0f);
    acc_.assign(n_, 0.0);
  }

  void mix(std::span<float> x, neighbor_exchange<Comm>& ex) {
    if constexpr (req::codec_has_begin_step<Q>) codec_.begin_step(static_cast<std::int64_t>(round_));
    for (std::size_t i = 0; i < n_; ++i) diff_[i] = x[i] - hat_self_[i];
    msg_.resize(codec_.max_encoded_bytes(n_));
    const std::size_t len = codec_.encode(std::span<const float>(diff_), std::span<std::byte>(msg_), std::span<float>(q_self_));
    ex.exchange_same(std::span<const std::byte>(msg_).first(len));
    // Decode every message before changing anything: a malformed one leaves the state as it was.
    for (std::size_t k = 0; k < ex.degree(); ++k) {
      std::fill(q_nb_[k].begin(), q_nb_[k].end(), 0.0f);
      codec_.decode_add(ex.received(k), std::span<float>(q_nb_[k]));
    }
    for (std::size_t i = 0; i < n_; ++i) hat_self_[i] += q_self_[i];
    for (std::size_t k = 0; k < ex.degree(); ++k)
      for (std::size_t i = 0; i < n_; ++i) hat_nb_[k][i] += q_nb_[k][i];
    for (std::size_t i = 0; i < n_; ++i) acc_[i] = 0.0;
    for (std::size_t k = 0; k < ex.degree(); ++k) {
      const float* h = hat_nb_[k].data();
      const double w = ex.weight(k);
      for (std::size_t i = 0; i < n_; ++i) acc_[i] += w * (static_cast<double>(h[i]) - static_cast<double>(hat_self_[i]));
    }
    for (std::size_t i = 0; i < n_; ++i) x[i] = static_cast<float>(x[i] + gamma_ * acc_[i]);
    ++round_;
  }

  std::size_t message_bytes() const { return codec_.max_encoded_bytes(n_); }

  void save(state::writer& w) const {
    w.i64(22, static_cast<std::int64_t>(round_));
    w.f32s(20, hat_self_);
    for (const auto& h : hat_nb_) w.f32s(21, h);
  }
  struct staged {
    std::uint64_t round = 0;
    std::vector<float> self;
    std::vector<std::vector<float>> nb;
  };
  staged read(state::reader& r) const {
    staged s;
    const auto round = r.i64(22);
    r.require_that<wire_error>(round >= 0, "the CHOCO round ", round, " is negative; the state is corrupted.");
    s.round = static_cast<std::uint64_t>(round);
    s.self = r.f32s(20, n_);
    for (std::size_t k = 0; k < hat_nb_.size(); ++k) s.nb.push_back(r.f32s(21, n_));
    return s;
  }
  void install(staged&& s) {
    round_ = s.round;
    hat_self_ = std::move(s.self);
    hat_nb_ = std::move(s.nb);
  }

 private:
  Q codec_;
  double gamma_;
  std::size_t n_;
  std::vector<float> hat_self_, diff_, q_self_;
  std::vector<std::vector<float>> hat_nb_, q_nb_;
  std::vector<double> acc_;
  std::vector<std::byte> msg_;
  std::uint64_t round_ = 0;
};

}  // namespace detail
}  // namespace commpact
