// GossipMixer over ThreadComm: D-PSGD, PowerGossip and CHOCO-SGD. The average model is
// preserved; without gradients the consensus distance shrinks geometrically, at rates
// ordered by the spectral gap; exact bytes per step; bad input. Rank threads record what
// they see; Catch2 assertions run on the main thread. The checks that run on any
// communicator live in tests/common/gossip_checks.hpp and run under MPI too
// (tests/mpi/test_gossip_mpi.cpp).
// Multi-rank cases run under CheckedComm<ThreadComm> (tests/common/checked_runs.hpp).
#include <catch2/catch.hpp>

#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/topology/complete.hpp>
#include <commpact/topology/exponential.hpp>
#include <commpact/topology/ring.hpp>
#include <commpact/topology/torus.hpp>

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <limits>
#include <vector>

#include "common/checked_runs.hpp"
#include "common/gossip_checks.hpp"
#include "common/matchers.hpp"

using namespace commpact;
using commpact_test::mean_of;
using commpact_test::MessageContains;
using commpact_test::rank_model;
using commpact_test::rel_diff;

namespace {

const tensor_layout& kLayout = commpact_test::kGossipLayout;
constexpr std::size_t kN = commpact_test::kGossipN;
const thread_options quick{std::chrono::seconds(60)};

// The consensus distances {ring, torus, complete} of a check run on P threads (rank 0's;
// the checks make sure every rank saw the same).
template <class Check>
std::array<std::vector<double>, 3> distances(int P, Check check) {
  std::array<std::vector<double>, 3> out;
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P,
      [&](commpact_test::checked_thread_comm& comm) {
        auto d = check(comm);
        if (comm.rank() == 0) out = d;
      },
      quick));
  return out;
}

}  // namespace

TEST_CASE("gossip preserves the average model: D-PSGD, PowerGossip, CHOCO on ring, torus, complete", "[gossip]") {
  const int P = GENERATE(2, 3, 4, 8, 16);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_average_preserved_all_modes(comm); },
      quick));
}

TEST_CASE("D-PSGD: consensus distance shrinks at least as fast as lambda_2^2 per step, ordered by spectral gap",
          "[gossip]") {
  const int P = 16, T = 15;
  // The lambda_2^2 bound per step and one-step averaging on Complete (any P).
  const auto [ring, torus, comp] = distances(
      P, [&](commpact_test::checked_thread_comm& comm) { return commpact_test::check_dpsgd_contraction(comm, T); });
  const double lr = commpact_test::lambda2(Ring(P)), lt = commpact_test::lambda2(Torus2D(P));
  // Asymptotic rates approach lambda_2^2 (the slowest mode dominates).
  const double rate_ring = ring[T] / ring[T - 1], rate_torus = torus[T] / torus[T - 1];
  CHECK(rate_ring == Approx(lr * lr).epsilon(0.05));
  CHECK(rate_torus == Approx(lt * lt).epsilon(0.05));
  CHECK(rate_torus < rate_ring);
}

TEST_CASE("PowerGossip: consensus shrinks geometrically, complete fastest, ring slowest", "[gossip]") {
  const int P = 16, T = 60;
  // Each step is a symmetric contraction on the disagreement: never increases (any P).
  const auto [ring, torus, comp] = distances(P, [&](commpact_test::checked_thread_comm& comm) {
    return commpact_test::check_power_gossip_contraction(comm, T);
  });
  auto rate = [](const std::vector<double>& d, int a, int b) { return std::pow(d[b] / d[a], 1.0 / (b - a)); };
  const double r_ring = rate(ring, 0, T), r_torus = rate(torus, 0, T), r_comp = rate(comp, 0, T);
  INFO("mean per-step factor: ring " << r_ring << " torus " << r_torus << " complete " << r_comp);
  CHECK(r_comp < r_torus);
  CHECK(r_torus < r_ring);
  CHECK(r_ring < 1.0);
  // Geometric: the second half shrinks at a rate no slower than (1 + 10%) the first
  // half's (no stall), and well below 1.
  for (const auto* d : {&ring, &torus, &comp}) {
    const double first = rate(*d, 0, T / 2), second = rate(*d, T / 2, T);
    INFO("first half " << first << " second half " << second);
    CHECK(second < 1.0);
    CHECK(second <= first * 1.1);
  }
}

TEST_CASE("PowerGossip on two ranks whose models differ by a rank-1 matrix agrees exactly after two steps",
          "[gossip]") {
  // Step 0 projects on a random vector; step 1 uses the warm-started d, which spans the
  // row space of the difference, and w = 1/2 closes the gap.
  const tensor_layout l = {{9, 7}};
  std::vector<std::vector<float>> xs(2), x0(2);
  for (int r = 0; r < 2; ++r) {
    x0[r].resize(63);
    for (int i = 0; i < 9; ++i)
      for (int j = 0; j < 7; ++j)
        x0[r][i * 7 + j] = 0.5f * float(i - j) + (r == 1 ? float(i + 1) * float(j % 3 - 1) : 0.0f);
  }
  const auto mean = mean_of(x0);
  commpact_test::run_checked_threads(2, [&](commpact_test::checked_thread_comm& comm) {
    GossipMixer mixer{comm, Ring(2), l, power_gossip<1>{}};
    auto x = x0[comm.rank()];
    mixer.mix(std::span<float>(x));
    mixer.mix(std::span<float>(x));
    xs[comm.rank()] = x;
  });
  for (int r = 0; r < 2; ++r) {
    std::vector<double> xd(xs[r].begin(), xs[r].end());
    CHECK(rel_diff(xd, mean) < 1e-6);
  }
}

TEST_CASE("PowerGossip: gamma scales the matrices' increments; vectors mix exactly as D-PSGD, whatever gamma",
          "[gossip]") {
  // Layout: two matrices and two vectors (a 1 x m tensor is a vector too). After a round
  // with gamma = 0.5 the vectors' entries equal D-PSGD's mix of the same models bit for
  // bit, and each matrix entry moved by half of what it moves with gamma = 1.
  const tensor_layout l = {{6, 4}, {5}, {3, 7}, {1, 9}};
  std::vector<bool> in_vector;  // per flat entry: whether its tensor is a vector
  for (const auto& s : l) in_vector.insert(in_vector.end(), static_cast<std::size_t>(s.numel()), s.is_vector());
  const std::size_t n = in_vector.size();
  const int P = GENERATE(2, 3, 4);
  CAPTURE(P);
  std::vector<std::vector<float>> half(P), full(P), exact(P), x0(P);
  for (int r = 0; r < P; ++r) x0[r] = rank_model(r, 11, n);
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    const int r = comm.rank();
    GossipMixer a{comm, Ring(P), l, power_gossip<1>{.gamma = 0.5}};
    GossipMixer b{comm, Ring(P), l, power_gossip<1>{.gamma = 1.0}};
    GossipMixer c{comm, Ring(P), l, exact_mixing{}};
    half[r] = x0[r], full[r] = x0[r], exact[r] = x0[r];
    a.mix(std::span<float>(half[r]));
    b.mix(std::span<float>(full[r]));
    c.mix(std::span<float>(exact[r]));
  });
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    bool vectors_exact = true, matrices_half = true, moved = false;
    for (std::size_t i = 0; i < n; ++i) {
      if (in_vector[i]) {
        vectors_exact = vectors_exact && half[r][i] == exact[r][i] && full[r][i] == exact[r][i];
      } else {
        const double d_half = double(half[r][i]) - x0[r][i], d_full = double(full[r][i]) - x0[r][i];
        matrices_half = matrices_half && std::abs(d_half - 0.5 * d_full) <= 1e-5 * (1.0 + std::abs(x0[r][i]));
        moved = moved || d_full != 0.0;
      }
    }
    CHECK(vectors_exact);
    CHECK(matrices_half);
    CHECK(moved);
  }
}

TEST_CASE("gossip bytes per step: exact message sizes per neighbour", "[gossip]") {
  const int P = 8;
  std::vector<std::size_t> degree(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P,
      [&](commpact_test::checked_thread_comm& comm) { degree[comm.rank()] = commpact_test::check_gossip_bytes(comm); },
      quick));
  // Torus2D(8) is 2 x 4: 3 neighbours each.
  for (int rk = 0; rk < P; ++rk) CHECK(degree[rk] == 3);
}

TEST_CASE("gossip bad input: topology size, rank, length, disagreeing ranks, malformed messages",
          "[gossip][errors]") {
  auto comms = ThreadComm::make_world(4);
  SECTION("topology size differs from the communicator's") {
    for (int P : {1, 4})
      REQUIRE_NOTHROW(commpact_test::run_checked_threads(
          P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_gossip_topology_size(comm); },
          quick));
  }
  SECTION("rank above min(n, m) is clamped per matrix, as PowerCompressor does") {
    // A 3 x 50 matrix at rank 4 travels as rank-3 factors: 4 * 3 * 50 bytes in phase 0.
    GossipMixer<Ring, power_gossip<4>> m{comms[0], Ring(4), {{3, 50}}};
    CHECK(m.message_bytes() == 4 * 3 * 50);
  }
  SECTION("bad options") {
    CHECK_THROWS_AS((GossipMixer<Ring, choco_gossip<topk_codec>>{comms[0], Ring(4), {{10}}, {topk_codec{0.0}}}),
                    invalid_argument);
    // k above the layout's length: at construction, naming the mixer (not at each mix()).
    CHECK_THROWS_MATCHES((GossipMixer<Ring, choco_gossip<topk_codec>>{comms[0], Ring(4), {{10}},
                                                                       {topk_codec{sparse_options{.k = 11}}}}),
                         invalid_argument, MessageContains({"GossipMixer (CHOCO-SGD)", "k = 11"}));
    CHECK_THROWS_AS((GossipMixer<Ring, power_gossip<1>>{comms[0], Ring(4), {{4, 4}}, {.gamma = 1.5}}),
                    invalid_argument);
    CHECK_THROWS_AS((GossipMixer<Ring>{comms[0], Ring(4), {}}), invalid_argument);
  }
  SECTION("buffer length mismatch") {
    auto one = ThreadComm::make_world(1);
    GossipMixer<Ring> m{one[0], Ring(1), kLayout};
    std::vector<float> x(kN - 1);
    const std::string len = std::to_string(kN - 1);
    CHECK_THROWS_MATCHES(m.mix(std::span<float>(x)), invalid_argument,
                         MessageContains({len.c_str(), "Every rank raises"}));
    // Without the round's flag allreduce the rank cannot tell the others: it raises at once, saying so.
    GossipMixer<Ring> quiet{one[0], Ring(1), kLayout, exact_mixing{}, {.check_finite = false}};
    CHECK_THROWS_MATCHES(quiet.mix(std::span<float>(x)), invalid_argument,
                         MessageContains({len.c_str(), "other ranks are not told"}));
    CHECK(quiet.stats().steps == 0);
  }
  SECTION("malformed CHOCO messages raise wire_error") {
    topk_codec topk{0.5};
    std::vector<float> acc(8, 0.0f);
    auto msg = [](std::vector<std::int32_t> idx, std::vector<float> val) {
      std::vector<std::byte> m(4 * idx.size() + 4 * val.size());
      if (!idx.empty()) std::memcpy(m.data(), idx.data(), 4 * idx.size());
      if (!val.empty()) std::memcpy(m.data() + 4 * idx.size(), val.data(), 4 * val.size());
      return m;
    };
    CHECK_NOTHROW(topk.decode_add(msg({1, 5}, {1.f, 2.f}), acc));
    CHECK(acc[5] == 2.0f);
    CHECK_THROWS_AS(topk.decode_add(msg({5, 1}, {1.f, 2.f}), acc), wire_error);   // unsorted
    CHECK_THROWS_AS(topk.decode_add(msg({1, 8}, {1.f, 2.f}), acc), wire_error);   // out of range
    CHECK_THROWS_AS(topk.decode_add(msg({1, -1}, {1.f, 2.f}), acc), wire_error);  // negative
    CHECK_THROWS_AS(topk.decode_add(msg({1, 1}, {1.f, 2.f}), acc), wire_error);   // duplicate
    auto cut = msg({1, 2}, {1.f, 2.f});
    cut.pop_back();
    CHECK_THROWS_AS(topk.decode_add(cut, acc), wire_error);                        // not whole entries
    CHECK_THROWS_AS(topk.decode_add(msg({0, 1, 2, 3, 4}, {1, 1, 1, 1, 1}), acc), wire_error);  // more than k = 4
    CHECK_THROWS_AS(topk.decode_add(msg({1, 2}, {1.f, std::numeric_limits<float>::quiet_NaN()}), acc), wire_error);
    const auto before = acc;
    CHECK_THROWS_AS(topk.decode_add(msg({1, 9}, {1.f, 2.f}), acc), wire_error);
    CHECK(acc == before);  // validated before anything is added
    sign_codec sign{};
    std::vector<std::byte> s(4 + 1, std::byte{0});
    float scale = 0.5f;
    std::memcpy(s.data(), &scale, 4);
    CHECK_NOTHROW(sign.decode_add(s, std::span<float>(acc).first(8)));
    s.push_back(std::byte{0});
    CHECK_THROWS_AS(sign.decode_add(s, std::span<float>(acc).first(8)), wire_error);
    std::vector<std::byte> s5(4 + 1, std::byte{0xff});
    std::memcpy(s5.data(), &scale, 4);
    CHECK_THROWS_AS(sign.decode_add(s5, std::span<float>(acc).first(5)), wire_error);  // bits past n
  }
}

TEST_CASE("gossip: a buffer of another length on one rank: it raises invalid_argument, the others mismatch_error, "
          "nothing changes",
          "[gossip][errors]") {
  const int P = GENERATE(1, 2, 4);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_gossip_length_mismatch(comm); }, quick));
}

TEST_CASE("gossip: one rank restored alone from an older state: every rank raises mismatch_error, nothing changes",
          "[gossip][errors]") {
  const int P = GENERATE(2, 3, 4);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_gossip_restored_alone(comm); }, quick));
}

TEST_CASE("gossip: ranks that build different mixers all raise mismatch_error", "[gossip][errors]") {
  const int P = GENERATE(2, 4);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_gossip_mixer_mismatch(comm); }, quick));
}

TEST_CASE("gossip: ranks whose mixers differ in a parameter or option all raise mismatch_error",
          "[gossip][errors]") {
  const int P = GENERATE(2, 4);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_gossip_parameter_mismatch(comm); },
      quick));
}

TEST_CASE("GossipMixer: a bare Codec means CHOCO with that codec", "[gossip]") {
  std::vector<std::vector<float>> a(3), b(3);
  commpact_test::run_checked_threads(3, [&](commpact_test::checked_thread_comm& comm) {
    GossipMixer<Ring, sign_codec, commpact_test::checked_thread_comm> m1{comm, Ring(3), kLayout};
    GossipMixer<Ring, choco_gossip<sign_codec>, commpact_test::checked_thread_comm> m2{comm, Ring(3), kLayout};
    auto x = rank_model(comm.rank(), 9), y = x;
    for (int s = 0; s < 3; ++s) {
      m1.mix(std::span<float>(x));
      m2.mix(std::span<float>(y));
    }
    a[comm.rank()] = x;
    b[comm.rank()] = y;
  });
  CHECK(a == b);
  CHECK(a[0] != rank_model(0, 9));
}

TEST_CASE("gossip state save/load continues bit for bit (PowerGossip, CHOCO)", "[gossip]") {
  const int P = 4;
  std::vector<int> same_pg(P, 0), same_choco(P, 0), errors(P, 0);
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    auto x = rank_model(comm.rank(), 5);
    auto y = x;
    GossipMixer<Ring, power_gossip<2>, commpact_test::checked_thread_comm> a{comm, Ring(P), kLayout};
    GossipMixer<Ring, choco_gossip<topk_codec>, commpact_test::checked_thread_comm> c{
        comm, Ring(P), kLayout, {topk_codec{0.1}, 0.3}};
    for (int s = 0; s < 3; ++s) {  // odd count: the restored mixer must resume in phase 1
      a.mix(std::span<float>(x));
      c.mix(std::span<float>(y));
    }
    std::vector<std::byte> sa, sc;
    a.save_state(sa);
    c.save_state(sc);
    GossipMixer<Ring, power_gossip<2>, commpact_test::checked_thread_comm> b{comm, Ring(P), kLayout};
    GossipMixer<Ring, choco_gossip<topk_codec>, commpact_test::checked_thread_comm> d{
        comm, Ring(P), kLayout, {topk_codec{0.1}, 0.3}};
    b.load_state(sa);
    d.load_state(sc);
    auto x2 = x, y2 = y;
    for (int s = 0; s < 3; ++s) {
      a.mix(std::span<float>(x));
      b.mix(std::span<float>(x2));
      c.mix(std::span<float>(y));
      d.mix(std::span<float>(y2));
    }
    same_pg[comm.rank()] = x == x2;
    same_choco[comm.rank()] = y == y2;
    int e = 0;
    try {
      b.load_state(std::span<const std::byte>(sa).first(sa.size() - 4));
    } catch (const wire_error&) {
      ++e;
    }
    try {
      d.load_state(sa);  // a PowerGossip state into a CHOCO mixer
    } catch (const mismatch_error&) {
      ++e;
    }
    errors[comm.rank()] = e;
  });
  for (int r = 0; r < P; ++r) {
    CHECK(same_pg[r] == 1);
    CHECK(same_choco[r] == 1);
    CHECK(errors[r] == 2);
  }
}
