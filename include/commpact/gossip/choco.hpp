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
//!
//! Runs in the communicator's space: the public copies and every scratch vector are the
//! space's buffers, the codec runs through the rows choco_encode (before the exchange) and
//! choco_decode (every message after it) with one choco_workspace per mixer (the CUDA
//! space's scratch), and the update through ops::choco_update, which changes nothing
//! when the round failed.
//! Messages have a known size: the codec's max_encoded_bytes(n) (4 more for a
//! variable_length_codec, which sends its length).

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../compress/codecs/topk_sign.hpp"
#include "../concepts.hpp"
#include "../compress/codecs/tensor_layout.hpp"
#include "../error.hpp"
#include "../state.hpp"
#include "../kernels/deferred/ops.hpp"
#include "../kernels/host/ops.hpp"
#include "variable_length_codec.hpp"
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
  //! Runs in the communicator's space (GossipMixer drives round_bytes(), queue(), commit()).
  static constexpr bool over_space = true;
  //! The message is encoded into the exchange's send buffer.
  static constexpr bool own_message = true;
  using space_type = comm_space_t<Comm>;
  template <class T>
  using span = typename space_type::template span<T>;
  template <class T>
  using buffer = typename space_type::template buffer<T>;

  choco_algorithm(const tensor_layout&, std::size_t n, choco_gossip<Q> pol, neighbor_exchange<Comm>& ex)
      : codec_(std::move(pol.codec)), gamma_(pol.gamma), n_(n), deg_(ex.degree()), exec_(ex.exec()), timeout_(ex.timeout()) {
    require(std::isfinite(gamma_) && gamma_ > 0.0 && gamma_ <= 1.0, "commpact::choco_gossip: gamma = ", gamma_,
            " must be in (0, 1] (CHOCO's consensus step size).");
    if constexpr (req::codec_has_bind_rank<Q>) codec_.bind_rank(ex.rank());  // stochastic codecs: own streams
    if constexpr (req::codec_has_check<Q>) {  // the layout's length against the codec (topk_codec's k <= n)
      const std::string problem(codec_.check(n_));
      require(problem.empty(), "commpact::GossipMixer (CHOCO-SGD): the codec does not fit the layout of ", n_,
              " parameters: ", problem);
    }
    if constexpr (framed)  // a variable-length message carries its length in 32 bits
      require(codec_.max_encoded_bytes(n_) <= 0xFFFFFFFFull, "commpact::GossipMixer (CHOCO-SGD): the codec's message "
              "for ", n_, " parameters may take ", codec_.max_encoded_bytes(n_), " bytes, above the 32-bit length "
              "its frame carries (4294967295 bytes); mix a smaller model per mixer, or use a codec with a shorter "
              "message.");
    hat_self_.resize(n_, exec_);
    hat_nb_.resize(deg_ * n_, exec_);
    q_nb_.resize(deg_ * n_, exec_);
    diff_.resize(n_, exec_);
    q_self_.resize(n_, exec_);
    acc_.resize(n_, exec_);
    ops<space_type>::fill(exec_, hat_self_.view(), 0.0f);
    ops<space_type>::fill(exec_, hat_nb_.view(), 0.0f);
    space_type::fence(exec_, deadline_after(timeout_));
  }

  //! The bytes of this round's message: the codec's max_encoded_bytes(n) at this round
  //! (after begin_step), behind a 4-byte length for a variable-length codec.
  std::size_t round_bytes() {
    if constexpr (req::codec_has_begin_step<Q>) codec_.begin_step(static_cast<std::int64_t>(round_));
    return message_bytes();
  }

  //! Queues the round after the exchange's check: q_self = Q(x - hat_self) (skipped when
  //! this model is not finite), the flag's agreement (a codec's short message counts),
  //! the exchange, every neighbour's message decoded, then the update of the public
  //! copies and of x (nothing when the round failed).
  void queue(span<float> x, neighbor_exchange<Comm>& ex, const gossip_options& opt) {
    const auto e = exec_;
    ops<space_type>::template choco_encode<Q>(e, choco_ws_, codec_, span<const float>(x), hat_self_.cview(),
                                              diff_.view(), ex.message(), q_self_.view(), ex.words(), framed);
    ex.agree_flag(opt);
    ex.exchange_same_known(span<const std::byte>(ex.message()));
    ops<space_type>::template choco_decode<Q>(e, choco_ws_, codec_, ex.received_all(), ex.message_bytes(), framed,
                                              q_nb_.view(), ex.words(), why_);
    ops<space_type>::choco_update(e, x, hat_self_.view(), q_self_.cview(), hat_nb_.view(), q_nb_.cview(), ex.weights(),
                                  gamma_, acc_.view(), span<const std::int64_t>(ex.words()));
  }
  //! Why the last round's message from a neighbour was malformed (the codec's sentence).
  const std::string& why() const { return why_; }
  //! Every rank saw a codec write a message shorter than max_encoded_bytes(n).
  [[noreturn]] void raise_short() const {
    throw invalid_argument(detail::cat(
        "commpact::GossipMixer (CHOCO): a rank's codec wrote a message shorter than its max_encoded_bytes(", n_,
        ") = ", codec_.max_encoded_bytes(n_), " bytes; the gossip exchange sends messages of a known size. Make "
        "encode() write exactly max_encoded_bytes(n) bytes, or specialise commpact::variable_length_codec<YourCodec> "
        "as std::true_type (each message then carries a 4-byte length)."));
  }
  void commit() { ++round_; }

  std::size_t message_bytes() const { return codec_.max_encoded_bytes(n_) + (framed ? 4 : 0); }

  void save(state::writer& w) const {
    w.i64(22, static_cast<std::int64_t>(round_));
    const auto self = to_host(hat_self_), nb = to_host(hat_nb_);
    w.f32s(20, self);
    for (std::size_t k = 0; k < deg_; ++k) w.f32s(21, std::span<const float>(nb).subspan(k * n_, n_));
  }
  struct staged {
    std::uint64_t round = 0;
    std::vector<float> self;
    std::vector<float> nb;
  };
  staged read(state::reader& r) const {
    staged s;
    const auto round = r.i64(22);
    r.require_that<wire_error>(round >= 0, "the CHOCO round ", round, " is negative; the state is corrupted.");
    s.round = static_cast<std::uint64_t>(round);
    s.self = r.f32s(20, n_);
    s.nb.reserve(deg_ * n_);
    for (std::size_t k = 0; k < deg_; ++k) {
      const auto h = r.f32s(21, n_);
      s.nb.insert(s.nb.end(), h.begin(), h.end());
    }
    return s;
  }
  void install(staged&& s) {
    round_ = s.round;
    ops<space_type>::from_host(exec_, std::span<const float>(s.self), hat_self_.view());
    if (!s.nb.empty()) ops<space_type>::from_host(exec_, std::span<const float>(s.nb), hat_nb_.view());
    space_type::fence(exec_, deadline_after(timeout_));
  }

  template <class Out>
  void add_signature(Out& s) const {
    for (const auto* b : {&hat_self_, &hat_nb_, &q_nb_, &diff_, &q_self_}) s.emplace_back(b->data(), b->capacity());
    s.emplace_back(acc_.data(), acc_.capacity());
    if constexpr (requires { choco_ws_.add_signature(s); }) choco_ws_.add_signature(s);  // the CUDA space's scratch
  }
  //! The parameters every rank must share (GossipMixer's setup hash): gamma's bits and the
  //! codec's agreement value (such as its k), when it has one.
  void add_setup(std::vector<std::int64_t>& w) const {
    w.push_back(std::bit_cast<std::int64_t>(gamma_));
    if constexpr (req::codec_has_agreement<Q>) w.push_back(codec_.agreement(n_));
  }

 private:
  using choco_workspace = typename ops<space_type>::template choco_workspace<Q>;
  static constexpr bool framed = variable_length_codec<Q>::value;

  std::vector<float> to_host(const buffer<float>& b) const {
    std::vector<float> h(b.size());
    if (h.empty()) return h;
    ops<space_type>::to_host(exec_, b.cview(), std::span<float>(h));
    space_type::fence(exec_, deadline_after(timeout_));
    return h;
  }

  Q codec_;
  choco_workspace choco_ws_;  // empty on the host spaces; the CUDA space's scratch (kernels/cuda/rows_choco.cuh)
  double gamma_;
  std::size_t n_, deg_;
  typename space_type::exec exec_;
  std::chrono::milliseconds timeout_;  // the communicator's: every fence's deadline
  buffer<float> hat_self_, hat_nb_, q_nb_, diff_, q_self_;
  buffer<double> acc_;
  std::string why_;
  std::uint64_t round_ = 0;
};

}  // namespace detail
}  // namespace commpact
