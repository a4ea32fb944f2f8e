// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file gossip_mixer.hpp
//! GossipMixer<Topology, Codec, Comm>: decentralised training. Each rank keeps its own
//! model and, once per round, mixes it with its neighbours' in a Topology over a
//! point-to-point communicator. No allreduce on the hot path (one 24-byte allreduce per
//! round checks that every model is finite and that the ranks are at the same round;
//! gossip_options::check_finite turns it off).
//!
//! The second parameter says what crosses an edge; one class per algorithm
//! (gossip/dpsgd.hpp, power_gossip.hpp, choco.hpp) shares the neighbour exchange
//! (exchange.hpp):
//!
//! | Codec | algorithm | bytes per edge per round, each way |
//! |---|---|---|
//! | `exact_mixing` (default) | D-PSGD (Lian et al. 2017): x_i = sum_j w_ij x_j | 4 n |
//! | `power_gossip<R>` | PowerGossip (Vogels et al. 2020) | 4 r (m or n) per matrix + 4 n per vector |
//! | any Codec Q, or `choco_gossip<Q>{codec, gamma}` | CHOCO-SGD (Koloskova et al. 2019) | Q's message: 8k (`topk_codec`), 4 + n/8 (`sign_codec`), a user's codec's |
//!
//! \code
//! commpact::tensor_layout layout = {{64, 147}, {64}, {10, 512}, {10}};
//! commpact::GossipMixer mixer{comm, commpact::Ring(comm.size()), layout, commpact::power_gossip<1>{}};
//! commpact::GossipMixer choco{comm, commpact::Ring(comm.size()), layout,
//!                             commpact::choco_gossip<commpact::topk_codec>{commpact::topk_codec{0.01}, 0.3}};
//! for (int step = 0; step < steps; ++step) {
//!   backward(grads);
//!   sgd_update(params, grads, lr);   // local step
//!   mixer.mix(std::span(params));    // gossip with the ring neighbours
//! }
//! \endcode
//!
//! Every algorithm preserves the average model over the ranks (up to float rounding):
//! the mixing matrix is symmetric and doubly stochastic and each PowerGossip edge applies
//! opposite updates at its two ends. mix() is collective over the ranks of the topology;
//! the first call checks with one small allreduce that every rank built the same mixer.
//! A round that raises (a malformed message, a non-finite model, ranks at different
//! round counts) leaves the model and the mixer's state as they were.
//!
//! Space (v3): every algorithm runs in the communicator's space (comm_space_t<Comm>;
//! `mix` takes its span, a deferred_span<float> over DeferredComm<C>): the round is
//! queued (non-finite check, CHOCO's encode or PowerGossip's projections, the 24-byte
//! agreement, the known-size exchange, decode, mix; kernels/host/gossip.hpp,
//! kernels/host/choco.hpp, kernels/host/power_gossip.hpp) and fenced once, with the
//! same bits as over a host communicator. `start(x)` + `finish()` are mix() in two
//! halves: start queues the round and returns, finish fences.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/thread_comm.hpp"
#include "../compress/codecs/tensor_layout.hpp"
#include "../concepts.hpp"
#include "../detail/hash.hpp"
#include "../error.hpp"
#include "../kernels/host/gossip.hpp"
#include "../state.hpp"
#include "choco.hpp"
#include "dpsgd.hpp"
#include "exchange.hpp"
#include "power_gossip.hpp"

namespace commpact {

namespace detail {
template <class T>
struct is_power_gossip : std::false_type {};
template <int R>
struct is_power_gossip<power_gossip<R>> : std::true_type {};
template <class T>
struct is_choco : std::false_type {};
template <class Q>
struct is_choco<choco_gossip<Q>> : std::true_type {};

//! The algorithm and its parameters for GossipMixer's codec parameter K.
template <class K, class Comm>
struct gossip_algorithm {
  static_assert(diagnose_codec<K>(),
                "commpact::GossipMixer: the second parameter must be exact_mixing, power_gossip<R>, "
                "choco_gossip<Codec> or a Codec (CHOCO-SGD with that codec).");
  using params = choco_gossip<K>;
  using type = choco_algorithm<K, Comm>;
  static params make(K k) { return params{std::move(k)}; }
};
template <class Comm>
struct gossip_algorithm<exact_mixing, Comm> {
  using params = exact_mixing;
  using type = dpsgd_algorithm<Comm>;
  static params make(exact_mixing e) { return e; }
};
template <int R, class Comm>
struct gossip_algorithm<power_gossip<R>, Comm> {
  using params = power_gossip<R>;
  using type = power_gossip_algorithm<R, Comm>;
  static params make(power_gossip<R> p) { return p; }
};
template <class Q, class Comm>
struct gossip_algorithm<choco_gossip<Q>, Comm> {
  using params = choco_gossip<Q>;
  using type = choco_algorithm<Q, Comm>;
  static params make(choco_gossip<Q> p) { return p; }
};

template <class A>
concept gossip_over_space = requires { requires A::over_space; };
}  // namespace detail

template <class Topology, class Codec = exact_mixing, class Comm = ThreadComm>
class GossipMixer {
  static_assert(diagnose_topology<Topology>());
  using selector = detail::gossip_algorithm<Codec, Comm>;
  using algorithm = typename selector::type;
  static_assert(detail::gossip_over_space<algorithm>,
                "commpact::GossipMixer: every gossip algorithm runs in its communicator's space (over_space).");

 public:
  //! What the codec parameter configures (the codec itself, or the algorithm's parameters).
  using params = typename selector::params;
  //! Where the model lives: the communicator's space (host_space: std::span<float>).
  using space_type = comm_space_t<Comm>;
  template <class T>
  using span = typename space_type::template span<T>;

  GossipMixer(Comm comm, Topology topo, tensor_layout layout, Codec codec = Codec(), gossip_options opt = {})
      : topo_(std::move(topo)),
        ex_(std::move(comm), topo_),
        layout_(std::move(layout)),
        n_(static_cast<std::size_t>(detail::check_layout(layout_, "commpact::GossipMixer"))),
        algo_(layout_, n_, selector::make(std::move(codec)), ex_),
        opt_(opt) {
    detail::require_nonfinite_policy(opt_.on_nonfinite, "GossipMixer");
    std::vector<std::int64_t> words = {algorithm::id, static_cast<std::int64_t>(ex_.comm().size()),
                                       static_cast<std::int64_t>(opt_.on_nonfinite), opt_.check_finite ? 1 : 0};
    // The algorithm's parameters (add_setup): both ends of an edge must use the same rank,
    // step size and shared factors, or a pair's sum is no longer kept.
    algo_.add_setup(words);
    for (const auto& s : layout_) {
      words.push_back(s.rows);
      words.push_back(s.cols);
    }
    words.insert(words.end(), ex_.edges().begin(), ex_.edges().end());
    hash_ = detail::hash_words(words);
  }

  //! One gossip round on the flat parameter buffer x (in place; a span of the
  //! communicator's space). Returns false when the round was skipped (a non-finite model
  //! under nonfinite::skip_step; x unchanged).
  //!
  //! Every algorithm queues the whole round in the space (check, agreement, exchange,
  //! mix) and fences once; a round that raises or is skipped changes nothing: x, the
  //! public copies and the counters are as before (the same decision on every rank,
  //! except a malformed message, which raises wire_error on its receiver).
  //!
  //! x of another length than the layout's: that rank raises invalid_argument naming its
  //! length, and every other rank mismatch_error, at the same round. The round's flag
  //! carries it (the rank runs the round on zeros of the registered length, so that its
  //! neighbours' exchanges stay whole). Without the flag's allreduce (check_finite off)
  //! the rank raises at once, alone, and the others wait for its messages until their
  //! communicator's deadline (or its guard reports the failure).
  bool mix(span<float> x) {
    start(x);
    return finish();
  }

  //! mix() in two halves, so that a round can overlap other work: start(x) queues the
  //! whole round (on the communicator's executor; nothing has run on a device when it
  //! returns, and the host has not waited, after the first round's setup check) and
  //! finish() fences once and returns or raises what mix() would. x must stay alive and
  //! untouched until finish(); every start() needs its finish() (a second start()
  //! raises usage_error) on every rank, in the same order.
  void start(span<float> x) {
    if (round_.started)
      throw usage_error("commpact::GossipMixer::start: the last round was started and not finished; call finish() "
                        "first.");
    const bool fits = x.size() == n_;
    if (!fits && !opt_.check_finite) throw invalid_argument(length_problem(x.size(), false));
    ex_.check_setup(hash_);
    auto& st = ex_.stats();
    const gossip_stats before = st;
    const span<float> model = fits ? x : idle_model();
    try {
      ex_.begin_round(span<const float>(model), algo_.round_bytes(), opt_, algorithm::own_message);
      if (!fits) ex_.flag_round(host::gossip::flag_length);
      algo_.queue(model, ex_, opt_);
    } catch (...) {  // a communicator's error: the round did not count
      st = before;
      throw;
    }
    round_ = {true, x.size(), before};
  }

  //! Waits for the round start() queued (one fence) and returns what mix() returns:
  //! false when it was skipped (a non-finite model under nonfinite::skip_step; x
  //! unchanged). A round that raises changes nothing (see mix()).
  bool finish() {
    if (!round_.started)
      throw usage_error("commpact::GossipMixer::finish: no round was started; call start(x) first.");
    const auto r = round_;
    round_ = {};
    auto& st = ex_.stats();
    std::int64_t flag = 0;
    try {
      flag = ex_.finish_round(r.before, algo_.why());
    } catch (...) {  // a communicator's error (out of the fence): the round did not count
      st = r.before;
      throw;
    }
    if (r.got != n_) throw invalid_argument(length_problem(r.got, true));
    if (flag == host::gossip::flag_length)
      throw mismatch_error(detail::cat("commpact::GossipMixer::mix: another rank passed a buffer of another length "
                                       "than the registered shapes hold (", n_, " floats) at round ", st.steps,
                                       "; every rank raises at this round (that rank invalid_argument, naming its "
                                       "length) and nothing changed. Pass the whole flat parameter buffer on every "
                                       "rank."));
    if (flag == host::gossip::flag_rounds) {
      const auto [hi, lo] = ex_.agreed_rounds();
      throw mismatch_error(detail::cat(
          "commpact::GossipMixer::mix: the ranks are at different rounds (from ", lo, " to ", hi, "; this rank, ",
          ex_.rank(), ", at ", st.steps, "): a rank restored alone from an older state, or one rank mixed a round "
          "the others did not (a rank that raised wire_error did not count its round). Every rank raises at this "
          "round and nothing changed; load every rank's state saved at the same round (save_state/load_state)."));
    }
    if (flag == host::gossip::flag_short) algo_.raise_short();
    if (flag == host::gossip::flag_nonfinite) {
      std::size_t none = n_;  // the index of "none on this rank" in the checked values
      if constexpr (requires { algo_.checked_length(); }) none = algo_.checked_length();
      ex_.nonfinite_round(ex_.bad_index(), n_, opt_, static_cast<std::int64_t>(st.steps), none);
      ++st.steps, ++st.skipped;
      return false;
    }
    algo_.commit();
    ++st.steps;
    return true;
  }

  //! Appends the mixer's state (state.hpp format, kind "commpact.GossipMixer"): the
  //! setup hash, this rank, the counters and the algorithm's state (PowerGossip's shared
  //! factors per edge, CHOCO's public copies). load_state() restores it into a mixer
  //! built the same way on the same rank; a state from another setup or rank raises
  //! mismatch_error, a corrupted one wire_error, and nothing changes on failure.
  void save_state(std::vector<std::byte>& out) const {
    require_no_round("save_state");
    state::writer w{out, "commpact.GossipMixer"};
    const auto& st = ex_.stats();
    w.i64s(1, std::array<std::int64_t, 4>{hash_, ex_.rank(), static_cast<std::int64_t>(st.steps),
                                          static_cast<std::int64_t>(st.skipped)});
    algo_.save(w);
    w.finish();
  }

  void load_state(std::span<const std::byte> in) {
    require_no_round("load_state");
    state::reader r{in, "commpact.GossipMixer", "GossipMixer"};
    const auto h = r.i64s(1, 4);
    r.require_that<mismatch_error>(h[0] == hash_ && h[1] == ex_.rank(), "the state was saved by rank ", h[1],
                                   " of a mixer with setup hash ", h[0], "; this is rank ", ex_.rank(), " with hash ",
                                   hash_, ". Load each rank's own state into the same algorithm, layout and topology.");
    r.require_that<wire_error>(h[2] >= 0 && h[3] >= 0 && h[3] <= h[2] && h[2] <= state::max_counter,
                               "counters steps = ", h[2], ", skipped = ", h[3],
                               " are out of range (0 <= skipped <= steps <= 2^62); the state is corrupted.");
    auto s = algo_.read(r);
    r.done();
    algo_.install(std::move(s));
    ex_.stats().steps = static_cast<std::uint64_t>(h[2]);
    ex_.stats().skipped = static_cast<std::uint64_t>(h[3]);
  }

  const gossip_stats& stats() const { return ex_.stats(); }
  const Topology& topology() const { return topo_; }
  const tensor_layout& layout() const { return layout_; }
  const std::vector<int>& neighbors() const { return ex_.neighbors(); }
  Comm& comm() { return ex_.comm(); }
  //! Bytes one call of mix() sends to each neighbour (payload; PowerGossip: first phase).
  std::size_t message_bytes() const { return algo_.message_bytes(); }

  //! Address and capacity of every buffer of the mixer's data plane, sorted (tests
  //! check that nothing is allocated after the first mix()).
  std::vector<std::pair<const void*, std::size_t>> workspace_signature() const {
    std::vector<std::pair<const void*, std::size_t>> s;
    ex_.add_signature(s);
    algo_.add_signature(s);
    std::sort(s.begin(), s.end());
    return s;
  }

 private:
  void require_no_round(const char* what) const {
    if (round_.started)
      throw usage_error(detail::cat("commpact::GossipMixer::", what, ": a round is in flight (start() without "
                                    "finish()); finish it first."));
  }
  std::string length_problem(std::size_t got, bool told) const {
    return detail::cat("commpact::GossipMixer::mix: rank ", ex_.rank(), " passed ", got,
                       " floats but the registered shapes hold ", n_, "; pass the whole flat parameter buffer. ",
                       told ? "Every rank raises at this round (the others mismatch_error) and nothing changed."
                            : "The other ranks are not told (check_finite is off, so the round has no flag "
                              "allreduce): they wait for this rank's messages until their deadline.");
  }
  //! Zeros of the registered length, for a round whose buffer has another: the round
  //! runs on them (messages of the known size) and changes nothing (its flag is set).
  span<float> idle_model() {
    const auto e = ex_.exec();
    if (idle_.size() != n_) {
      idle_.resize(n_, e);
      ops<space_type>::fill(e, idle_.view(), 0.0f);
    }
    return idle_.view();
  }

  Topology topo_;
  neighbor_exchange<Comm> ex_;
  tensor_layout layout_;
  std::size_t n_;
  algorithm algo_;
  gossip_options opt_;
  std::int64_t hash_ = 0;
  typename space_type::template buffer<float> idle_;  // idle_model(), sized at the first use
  //! The round between start() and finish().
  struct round_in_flight {
    bool started = false;
    std::size_t got = 0;  // the length start() was given (the layout's n_, or a rank's wrong one)
    gossip_stats before{};
  } round_;
};

template <class Topology, class Codec, class Comm>
GossipMixer(Comm, Topology, tensor_layout, Codec) -> GossipMixer<Topology, Codec, Comm>;
template <class Topology, class Codec, class Comm>
GossipMixer(Comm, Topology, tensor_layout, Codec, gossip_options) -> GossipMixer<Topology, Codec, Comm>;
template <class Topology, class Comm>
GossipMixer(Comm, Topology, tensor_layout) -> GossipMixer<Topology, exact_mixing, Comm>;

//! Consensus distance (1/P) sum_i ||x_i - x_bar||^2 over the ranks of comm (collective;
//! two allreduces in double). A diagnostic for tests and benchmarks.
template <Communicator C>
double consensus_distance(C& comm, std::span<const float> x) {
  std::vector<double> mean(x.begin(), x.end());
  comm.allreduce(std::span<double>(mean), reduce_op::sum);
  const double inv = 1.0 / comm.size();
  double local = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = static_cast<double>(x[i]) - mean[i] * inv;
    local += d * d;
  }
  comm.allreduce(std::span<double>(&local, 1), reduce_op::sum);
  return local * inv;
}

}  // namespace commpact
