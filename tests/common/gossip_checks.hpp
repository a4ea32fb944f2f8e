#pragma once
// Checks of GossipMixer (D-PSGD, PowerGossip, CHOCO) written once over any point-to-point
// communicator, run from the ThreadComm tests (tests/test_gossip_mixer.cpp) and the MPI
// tests (tests/mpi/test_gossip_mpi.cpp). Topologies are built for comm.size().
//
// Every rank derives every rank's starting model from a shared seed; final models are
// gathered with allgather, so every rank computes the same averages in rank order.
// Failures are collected in a `verdict` and `settle`d (tests/common/sparse_checks.hpp):
// wrap a check in REQUIRE_NOTHROW(run_threads(...)) or REQUIRE_NOTHROW(mpi_guard(...)).
//
// The checks are templates over the communicator, so over its space too: with
// DeferredComm<C> the models live in deferred buffers (mix_host copies them in and out
// around each mix(); tests/test_space_gossip.cpp, tests/mpi/test_gossip_mpi.cpp).
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/known_size.hpp>
#include <commpact/kernels/deferred/ops.hpp>
#include <commpact/kernels/host/ops.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/topology/complete.hpp>
#include <commpact/topology/exponential.hpp>
#include <commpact/topology/ring.hpp>
#include <commpact/topology/torus.hpp>

#include <Eigen/Dense>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "sparse_checks.hpp"  // verdict, settle, throws_as

namespace commpact_test {

inline const commpact::tensor_layout kGossipLayout = {{12, 10}, {10}, {8, 16}, {5}, {20, 6}};
inline constexpr std::size_t kGossipN = 120 + 10 + 128 + 5 + 120;

// x_r = c + noise_r: a shared component plus a per-rank one, both N(0, 1).
inline std::vector<float> rank_model(int rank, std::uint64_t seed, std::size_t n = kGossipN) {
  std::mt19937_64 shared(seed), own(seed * 1000003 + static_cast<std::uint64_t>(rank) + 1);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(shared);
  for (auto& x : v) x += d(own);
  return v;
}

inline std::vector<double> mean_of(const std::vector<std::vector<float>>& xs) {
  std::vector<double> m(xs[0].size(), 0.0);
  for (auto& x : xs)
    for (std::size_t i = 0; i < x.size(); ++i) m[i] += x[i];
  for (auto& v : m) v /= static_cast<double>(xs.size());
  return m;
}

inline double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

//! Second largest |eigenvalue| of the topology's mixing matrix (0 for one rank).
template <class Topo>
double lambda2(const Topo& t) {
  const int P = t.size();
  Eigen::MatrixXd W(P, P);
  for (int i = 0; i < P; ++i)
    for (int j = 0; j < P; ++j) W(i, j) = t.weight(i, j);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(W);
  Eigen::VectorXd ev = es.eigenvalues().cwiseAbs();
  std::sort(ev.data(), ev.data() + ev.size(), std::greater<>());
  return P > 1 ? ev[1] : 0.0;
}

//! True when Comm's data plane runs on host memory.
template <class Comm>
inline constexpr bool host_data_plane = commpact::comm_space_t<Comm>::host_accessible;

//! mixer.mix on a host vector x: at once on a host communicator; over another space
//! (DeferredComm) through a buffer of that space, copied in before and out after (x is
//! unchanged when mix raises).
template <class Mixer, class Comm>
bool mix_host(Mixer& mixer, Comm& comm, std::vector<float>& x) {
  using S = commpact::comm_space_t<Comm>;
  if constexpr (S::host_accessible) {
    return mixer.mix(std::span<float>(x));
  } else {
    const auto e = commpact::comm_exec(comm);
    typename S::template buffer<float> b;
    b.resize(x.size());
    commpact::ops<S>::from_host(e, std::span<const float>(x), b.view());
    const bool mixed = mixer.mix(b.view());
    commpact::ops<S>::to_host(e, b.cview(), std::span<float>(x));
    S::fence(e, commpact::no_deadline());
    return mixed;
  }
}

//! Every rank's buffer, gathered in rank order on every rank.
template <class Comm>
std::vector<std::vector<float>> gather_models(Comm& comm, const std::vector<float>& x) {
  const int P = comm.size();
  std::vector<float> all(x.size() * static_cast<std::size_t>(P));
  comm.allgather(std::span<const float>(x), std::span<float>(all));
  std::vector<std::vector<float>> xs(P);
  for (int r = 0; r < P; ++r) xs[r].assign(all.begin() + r * x.size(), all.begin() + (r + 1) * x.size());
  return xs;
}

// Runs `steps` mixing rounds on this rank; returns its final model and the consensus
// distance after each round (index 0: before any round), the same on every rank.
template <class Topo, class Mode, class Comm>
std::pair<std::vector<float>, std::vector<double>> run_mixing(Comm& comm, int steps, Mode mode,
                                                              std::uint64_t seed = 1) {
  std::vector<double> dist(steps + 1);
  commpact::GossipMixer<Topo, Mode, Comm> mixer{comm, Topo(comm.size()), kGossipLayout, mode};
  auto x = rank_model(comm.rank(), seed);
  dist[0] = commpact::consensus_distance(comm, std::span<const float>(x));
  for (int s = 0; s < steps; ++s) {
    mix_host(mixer, comm, x);
    dist[s + 1] = commpact::consensus_distance(comm, std::span<const float>(x));
  }
  return {x, dist};
}

//! 20 rounds keep the average model to 1e-6 relative and (P > 1) shrink the consensus
//! distance.
template <class Topo, class Mode, class Comm>
void check_average_preserved(Comm& comm, Mode mode, const char* name) {
  const int P = comm.size();
  verdict v;
  std::vector<std::vector<float>> x0(P);
  for (int r = 0; r < P; ++r) x0[r] = rank_model(r, 1);
  const auto before = mean_of(x0);
  auto [x, dist] = run_mixing<Topo>(comm, 20, mode);
  const auto after = mean_of(gather_models(comm, x));
  const double rd = rel_diff(after, before);
  v.expect(rd < 1e-6, name, " P=", P, ": the average moved by ", rd, " relative");
  if (P > 1)
    v.expect(dist.back() < dist.front(), name, " P=", P, ": consensus ", dist.front(), " -> ", dist.back());
  settle(comm, v, name);
}

//! D-PSGD, PowerGossip and CHOCO on Ring, Torus2D, Complete (and Exponential).
template <class Comm>
void check_average_preserved_all_modes(Comm& comm) {
  using namespace commpact;
  check_average_preserved<Ring>(comm, exact_mixing{}, "D-PSGD ring");
  check_average_preserved<Torus2D>(comm, exact_mixing{}, "D-PSGD torus");
  check_average_preserved<Complete>(comm, exact_mixing{}, "D-PSGD complete");
  check_average_preserved<Ring>(comm, power_gossip<1>{}, "PowerGossip r1 ring");
  check_average_preserved<Torus2D>(comm, power_gossip<1>{}, "PowerGossip r1 torus");
  check_average_preserved<Complete>(comm, power_gossip<1>{}, "PowerGossip r1 complete");
  check_average_preserved<Ring>(comm, power_gossip<3>{}, "PowerGossip r3 ring");
  check_average_preserved<Torus2D>(comm, power_gossip<2>{}, "PowerGossip r2 torus");
  check_average_preserved<Ring>(comm, choco_gossip<topk_codec>{topk_codec{0.1}, 0.3}, "CHOCO top-k ring");
  check_average_preserved<Torus2D>(comm, choco_gossip<sign_codec>{{}, 0.3}, "CHOCO sign torus");
  check_average_preserved<Complete>(comm, choco_gossip<topk_codec>{topk_codec{0.1}, 0.3}, "CHOCO top-k complete");
  check_average_preserved<Exponential>(comm, power_gossip<1>{}, "PowerGossip r1 exponential");
}

//! D-PSGD over T rounds on Ring, Torus2D and Complete: the consensus distance shrinks at
//! least as fast as lambda_2^2 per round (a graph with lambda_2 = 0 averages exactly in
//! one round: float rounding only), and Complete averages in one round. Returns the
//! distances {ring, torus, complete}, the same on every rank.
template <class Comm>
std::array<std::vector<double>, 3> check_dpsgd_contraction(Comm& comm, int T) {
  using namespace commpact;
  const int P = comm.size();
  verdict v;
  auto ring = run_mixing<Ring>(comm, T, exact_mixing{}).second;
  auto torus = run_mixing<Torus2D>(comm, T, exact_mixing{}).second;
  auto comp = run_mixing<Complete>(comm, T, exact_mixing{}).second;
  const double lr = lambda2(Ring(P)), lt = lambda2(Torus2D(P));
  for (int t = 1; t <= T; ++t) {
    for (auto [d, l, name] : {std::tuple{&ring, lr, "ring"}, std::tuple{&torus, lt, "torus"}}) {
      if (l > 1e-9)
        v.expect((*d)[t] <= std::pow(l, 2 * t) * (*d)[0] * (1 + 1e-6), name, " step ", t, ": ", (*d)[t],
                 " above lambda_2^2t bound (lambda_2 = ", l, ")");
      else
        v.expect((*d)[t] <= 1e-12 * (*d)[0], name, " step ", t, ": ", (*d)[t], " with lambda_2 = 0");
    }
  }
  // Complete: exact averaging in one step (float rounding only).
  v.expect(P > 1 ? comp[1] < 1e-12 * comp[0] : comp[1] == 0.0, "complete after one step: ", comp[1], " from ", comp[0]);
  if (P > 1) v.expect(ring[0] > 0 && comp[0] > 0, "the models start in consensus");
  settle(comm, v, "check_dpsgd_contraction");
  return {ring, torus, comp};
}

//! PowerGossip<1> over T rounds on Ring, Torus2D and Complete: each round is a symmetric
//! contraction on the disagreement, so the consensus distance never increases, and
//! (P > 1) it ends below where it started. Returns {ring, torus, complete}.
template <class Comm>
std::array<std::vector<double>, 3> check_power_gossip_contraction(Comm& comm, int T) {
  using namespace commpact;
  const int P = comm.size();
  verdict v;
  auto ring = run_mixing<Ring>(comm, T, power_gossip<1>{}).second;
  auto torus = run_mixing<Torus2D>(comm, T, power_gossip<1>{}).second;
  auto comp = run_mixing<Complete>(comm, T, power_gossip<1>{}).second;
  for (auto [d, name] : {std::pair{&ring, "ring"}, std::pair{&torus, "torus"}, std::pair{&comp, "complete"}}) {
    for (int t = 1; t <= T; ++t)
      v.expect((*d)[t] <= (*d)[t - 1] * (1 + 1e-6), name, " step ", t, ": consensus grew from ", (*d)[t - 1], " to ",
               (*d)[t]);
    if (P > 1) v.expect((*d)[T] < (*d)[0], name, ": consensus did not shrink");
  }
  settle(comm, v, "check_power_gossip_contraction");
  return {ring, torus, comp};
}

//! Bytes per step through CountingComm<Comm> on Torus2D(P), exact per neighbour:
//! PowerGossip<2> alternates m x r and n x r projections (plus the vectors), D-PSGD sends
//! the model, CHOCO top-k 4 + 8k, CHOCO sign 4 + n/8 bytes. Returns this rank's degree.
template <class Comm>
std::size_t check_gossip_bytes(Comm& comm) {
  using namespace commpact;
  using CC = CountingComm<Comm>;
  const int P = comm.size();
  verdict v;
  GossipMixer<Torus2D, power_gossip<2>, CC> pg{CC{comm}, Torus2D(P), kGossipLayout};
  GossipMixer<Torus2D, exact_mixing, CC> dp{CC{comm}, Torus2D(P), kGossipLayout};
  GossipMixer<Torus2D, choco_gossip<topk_codec>, CC> ct{CC{comm}, Torus2D(P), kGossipLayout, {topk_codec{0.05}}};
  GossipMixer<Torus2D, choco_gossip<sign_codec>, CC> cs{CC{comm}, Torus2D(P), kGossipLayout};
  auto x = rank_model(comm.rank(), 3);
  std::vector<std::uint64_t> bytes;
  for (int s = 0; s < 4; ++s) {
    pg.comm().reset_stats();
    pg.mix(std::span<float>(x));
    bytes.push_back(pg.comm().stats().point_to_point_bytes_sent);
  }
  dp.mix(std::span<float>(x));
  ct.mix(std::span<float>(x));
  cs.mix(std::span<float>(x));
  // Matrices 12x10, 8x16, 20x6; vectors 10 + 5.
  const std::uint64_t deg = pg.neighbors().size(), vec = 15, r = 2;
  const std::uint64_t even = 4 * (r * (10 + 16 + 6) + vec);  // X^T p: m x r
  const std::uint64_t odd = 4 * (r * (12 + 8 + 20) + vec);   // X d:   n x r
  const std::uint64_t k = 19;                                // round(0.05 * 383)
  v.expect(bytes == std::vector<std::uint64_t>{deg * even, deg * odd, deg * even, deg * odd},
           "PowerGossip bytes per step differ (degree ", deg, ")");
  v.expect(dp.comm().stats().point_to_point_bytes_sent == deg * 4 * kGossipN, "D-PSGD bytes ",
           dp.comm().stats().point_to_point_bytes_sent);
  v.expect(ct.comm().stats().point_to_point_bytes_sent == deg * (8 * k), "CHOCO top-k bytes ",
           ct.comm().stats().point_to_point_bytes_sent);
  v.expect(cs.comm().stats().point_to_point_bytes_sent == deg * (4 + (kGossipN + 7) / 8), "CHOCO sign bytes ",
           cs.comm().stats().point_to_point_bytes_sent);
  settle(comm, v, "check_gossip_bytes");
  return deg;
}

//! A topology built for another size raises invalid_argument on every rank (before any
//! communication), naming both sizes.
template <class Comm>
void check_gossip_topology_size(Comm& comm) {
  using namespace commpact;
  const int P = comm.size();
  verdict v;
  std::string what;
  const int got = throws_as<invalid_argument>(
      [&] { GossipMixer<Ring, exact_mixing, Comm> m{comm, Ring(P + 1), kGossipLayout}; }, &what);
  v.expect(got == 1, "Ring(", P + 1, ") on ", P, " ranks: expected invalid_argument, got ", got, ": ", what);
  v.expect(what.find(std::to_string(P + 1) + " ranks") != std::string::npos &&
               what.find("communicator has " + std::to_string(P)) != std::string::npos,
           "message: ", what);
  settle(comm, v, "check_gossip_topology_size");
}

//! The first mix of m (120 floats) raises mismatch_error naming the GossipMixer setup.
template <class Mixer, class Comm>
void expect_setup_mismatch(Mixer& m, Comm& comm, verdict& v, const char* name) {
  std::vector<float> x(120, 1.0f);
  std::string what;
  const int got = throws_as<commpact::mismatch_error>([&] { mix_host(m, comm, x); }, &what);
  v.expect(got == 1, name, ": expected mismatch_error, got ", got, ": ", what);
  v.expect(what.find("GossipMixer setup") != std::string::npos, name, ": message: ", what);
}

//! Ranks that build different mixers (rank P-1 lists the same number of values in other
//! shapes) all raise mismatch_error at the first mix (PowerGossip; and D-PSGD over a
//! space that is not host memory). Needs P >= 2.
template <class Comm>
void check_gossip_mixer_mismatch(Comm& comm) {
  using namespace commpact;
  const int P = comm.size();
  if (P < 2) return;
  verdict v;
  const tensor_layout l = comm.rank() == P - 1 ? tensor_layout{{10, 12}} : tensor_layout{{12, 10}};
  auto run = [&]<class Mode>(Mode, const char* name) {
    GossipMixer<Ring, Mode, Comm> m{comm, Ring(P), l};
    expect_setup_mismatch(m, comm, v, name);
  };
  run(power_gossip<1>{}, "PowerGossip");
  if constexpr (!host_data_plane<Comm>) run(exact_mixing{}, "D-PSGD");
  settle(comm, v, "check_gossip_mixer_mismatch");
}

//! The last rank passes a buffer one float short at the second round (D-PSGD, PowerGossip,
//! CHOCO top-k): it raises invalid_argument naming its length, and every other rank
//! mismatch_error, at that round, none waiting. Nothing changed anywhere: the model and
//! the counters are as before, and after two more whole rounds the mixer equals, bit for
//! bit and in bytes sent, a twin that never saw the failed round.
template <class Comm>
void check_gossip_length_mismatch(Comm& comm) {
  using namespace commpact;
  const int P = comm.size();
  verdict v;
  const bool odd = comm.rank() == P - 1;
  auto run = [&]<class Mode>(Mode mode, const char* name) {
    GossipMixer<Ring, Mode, Comm> a{comm, Ring(P), kGossipLayout, mode};
    GossipMixer<Ring, Mode, Comm> twin{comm, Ring(P), kGossipLayout, mode};
    auto x = rank_model(comm.rank(), 11), y = x;
    mix_host(a, comm, x);
    mix_host(twin, comm, y);
    const auto before = x;
    const gossip_stats st = a.stats();
    std::string what;
    int got = 0;
    if (odd) {
      std::vector<float> cut(x.begin(), x.end() - 1);
      got = throws_as<invalid_argument>([&] { mix_host(a, comm, cut); }, &what);
      v.expect(what.find("rank " + std::to_string(comm.rank()) + " passed " + std::to_string(kGossipN - 1)) !=
                       std::string::npos &&
                   what.find("Every rank raises") != std::string::npos,
               name, ": message: ", what);
    } else {
      got = throws_as<mismatch_error>([&] { mix_host(a, comm, x); }, &what);
      v.expect(what.find("another rank passed a buffer of another length") != std::string::npos &&
                   what.find(std::to_string(kGossipN) + " floats") != std::string::npos,
               name, ": message: ", what);
    }
    v.expect(got == 1, name, ": expected ", odd ? "invalid_argument" : "mismatch_error", ", got ", got, ": ", what);
    v.expect(x == before, name, ": the failed round changed the model");
    v.expect(a.stats().steps == st.steps && a.stats().bytes_sent == st.bytes_sent &&
                 a.stats().messages_sent == st.messages_sent,
             name, ": the failed round counted");
    for (int r = 0; r < 2; ++r) {
      mix_host(a, comm, x);
      mix_host(twin, comm, y);
    }
    v.expect(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0, name,
             ": after the failed round, the models differ from the twin's");
    v.expect(a.stats().steps == twin.stats().steps && a.stats().bytes_sent == twin.stats().bytes_sent, name,
             ": after the failed round, the counters differ from the twin's");
  };
  run(exact_mixing{}, "D-PSGD");
  run(power_gossip<1>{}, "PowerGossip");
  run(choco_gossip<topk_codec>{topk_codec{0.1}, 0.3}, "CHOCO top-k");
  settle(comm, v, "check_gossip_length_mismatch");
}

//! The last rank loads, alone, the state it saved two rounds earlier (D-PSGD, PowerGossip,
//! CHOCO top-k; two, so that PowerGossip's phase, and its message sizes, agree): at the
//! next round every rank raises mismatch_error naming the round counts, and nothing
//! changed (models, counters). Then every rank loads its state of that round and mixes
//! twice: the models equal, bit for bit, those the first run reached. Needs P >= 2.
template <class Comm>
void check_gossip_restored_alone(Comm& comm) {
  using namespace commpact;
  const int P = comm.size();
  if (P < 2) return;
  verdict v;
  const bool odd = comm.rank() == P - 1;
  auto run = [&]<class Mode>(Mode mode, const char* name) {
    GossipMixer<Ring, Mode, Comm> a{comm, Ring(P), kGossipLayout, mode};
    auto x = rank_model(comm.rank(), 13);
    mix_host(a, comm, x);
    std::vector<std::byte> at1;
    a.save_state(at1);
    const auto x1 = x;
    mix_host(a, comm, x);
    mix_host(a, comm, x);
    const auto x3 = x;
    if (odd) a.load_state(at1);  // round 1 here, round 3 on the others
    const auto x_before = odd ? x1 : x3;
    x = x_before;
    const gossip_stats st = a.stats();
    std::string what;
    const int got = throws_as<mismatch_error>([&] { mix_host(a, comm, x); }, &what);
    v.expect(got == 1, name, ": expected mismatch_error, got ", got, ": ", what);
    v.expect(what.find("different rounds (from 1 to 3") != std::string::npos &&
                 what.find("at " + std::to_string(odd ? 1 : 3) + ")") != std::string::npos,
             name, ": message: ", what);
    v.expect(x == x_before, name, ": the failed round changed the model");
    v.expect(a.stats().steps == st.steps && a.stats().bytes_sent == st.bytes_sent, name,
             ": the failed round counted");
    a.load_state(at1);  // every rank back at round 1
    x = x1;
    mix_host(a, comm, x);
    mix_host(a, comm, x);
    v.expect(std::memcmp(x.data(), x3.data(), x.size() * sizeof(float)) == 0, name,
             ": restored on every rank, the rounds differ from the first run's");
    v.expect(a.stats().steps == 3, name, ": steps ", a.stats().steps, " after the restored rounds");
  };
  run(exact_mixing{}, "D-PSGD");
  run(power_gossip<1>{}, "PowerGossip");
  run(choco_gossip<topk_codec>{topk_codec{0.1}, 0.3}, "CHOCO top-k");
  settle(comm, v, "check_gossip_restored_alone");
}

//! The same layout and topology, but the last rank built with another parameter or
//! option (PowerGossip's seed or gamma, CHOCO's gamma or its codec's k, the gossip
//! options): every rank raises mismatch_error at the first mix, none waits (a pair that
//! mixed with different factors or step sizes would no longer keep its sum; a rank
//! without the finite check would skip the others' flag allreduce).
template <class Comm>
void check_gossip_parameter_mismatch(Comm& comm) {
  using namespace commpact;
  const int P = comm.size();
  if (P < 2) return;
  verdict v;
  const bool odd = comm.rank() == P - 1;
  const tensor_layout l{{12, 10}};
  auto run = [&]<class Mode>(Mode mode, gossip_options opt, const char* name) {
    GossipMixer<Ring, Mode, Comm> m{comm, Ring(P), l, mode, opt};
    expect_setup_mismatch(m, comm, v, name);
  };
  run(power_gossip<1>{.gamma = 1.0, .seed = odd ? 7u : 8u}, {}, "PowerGossip, another seed");
  run(power_gossip<1>{.gamma = odd ? 0.5 : 1.0}, {}, "PowerGossip, another gamma");
  run(choco_gossip<topk_codec>{topk_codec{0.1}, odd ? 0.25 : 0.3}, {}, "CHOCO, another gamma");
  run(choco_gossip<topk_codec>{topk_codec{odd ? 0.2 : 0.1}, 0.3}, {}, "CHOCO, another k");
  run(power_gossip<1>{}, {.check_finite = !odd}, "PowerGossip, the finite check on some ranks only");
  run(power_gossip<1>{}, {.on_nonfinite = odd ? nonfinite::skip_step : nonfinite::raise},
      "PowerGossip, another on_nonfinite");
  settle(comm, v, "check_gossip_parameter_mismatch");
}

}  // namespace commpact_test
