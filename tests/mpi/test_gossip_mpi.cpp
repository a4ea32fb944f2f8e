// commpact-mpi-ranks: 1 2 3 4 8
// GossipMixer over MpiComm under mpiexec: the same checks as the ThreadComm tests
// (tests/common/gossip_checks.hpp), with Ring, Torus2D and Complete built for the MPI
// world size: D-PSGD, PowerGossip and CHOCO keep the average model to 1e-6 relative and
// shrink the consensus distance; D-PSGD contracts at least as fast as lambda_2^2 per
// round; exact bytes per neighbour through CountingComm<MpiComm>; bad input (a
// topology of another size, ranks that build different mixers) raises on every rank
// without hanging.
// The communicator is CheckedComm over an unchecked MpiComm (tests/common/checked_mpi.hpp).
// Over the deferred space (DeferredComm<CheckedComm<MpiComm>>): D-PSGD, CHOCO and
// PowerGossip equal host_space bit for bit, NaN on one rank raises or skips alike, and the checks above run
// too (tests/common/gossip_space_checks.hpp).
#include <commpact/comm/mpi_comm.hpp>
#include <commpact/gossip/gossip_mixer.hpp>

#include "common/gossip_checks.hpp"
#include "common/gossip_space_checks.hpp"
#include "common/checked_mpi.hpp"

using namespace commpact;
using namespace commpact_test;
using namespace std::chrono_literals;

TEST_CASE("MPI: gossip preserves the average model: D-PSGD, PowerGossip, CHOCO on ring, torus, complete",
          "[mpi][gossip]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_average_preserved_all_modes(comm); }));
}

TEST_CASE("MPI: D-PSGD and PowerGossip shrink the consensus distance", "[mpi][gossip]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  // 6 rounds: on Ring(4) every disagreement mode has |lambda| = 1/3, so the bound holds
  // with equality in exact arithmetic, and after ~9 rounds the disagreement is so small
  // that float rounding of the models exceeds the bound's 1e-6 relative slack.
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_dpsgd_contraction(comm, 6); }));
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_power_gossip_contraction(comm, 20); }));
}

TEST_CASE("MPI: gossip bytes through CountingComm<MpiComm>: exact message sizes per neighbour", "[mpi][gossip]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_gossip_bytes(comm); }));
}

TEST_CASE("MPI: gossip bad input raises on every rank and leaves the communicator usable", "[mpi][gossip][errors]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] {
    check_gossip_topology_size(comm);
    check_gossip_mixer_mismatch(comm);
    check_gossip_length_mismatch(comm);
    check_gossip_restored_alone(comm);
    check_average_preserved<Ring>(comm, exact_mixing{}, "D-PSGD ring after the errors");
  }));
}

TEST_CASE("MPI: gossip over the deferred space equals host_space bit for bit; NaN on one rank alike",
          "[mpi][gossip][space]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] {
    check_gossip_deferred_twins(comm);
    check_gossip_deferred_nonfinite(comm);
  }));
}

TEST_CASE("MPI: gossip checks over DeferredComm<MpiComm>: average, contraction, bad input", "[mpi][gossip][space]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] {
    DeferredComm<commpact_test::checked_mpi_comm> dc{comm};
    check_average_preserved_all_modes(dc);
    check_dpsgd_contraction(dc, 6);
    check_power_gossip_contraction(dc, 6);
    check_gossip_topology_size(dc);
    check_gossip_mixer_mismatch(dc);
    check_gossip_length_mismatch(dc);
    check_gossip_restored_alone(dc);
  }));
}

TEST_CASE("MPI: one rank builds the topology for another size: every rank raises, none hangs",
          "[mpi][gossip][errors][failure]") {
  // Its own MpiComm: mpi_guard marks it failed, and the next test must not meet it.
  auto comm = commpact_test::checked_mpi_world(20s);
  const int P = comm.size(), r = comm.rank(), bad = 1 % P;
  const auto t0 = std::chrono::steady_clock::now();
  int ok = 0;
  try {
    mpi_guard(comm, [&] {
      GossipMixer<Ring, power_gossip<1>, commpact_test::checked_mpi_comm> m{comm, Ring(r == bad ? P + 1 : P),
                                                                            kGossipLayout};
      auto x = rank_model(r, 1);
      m.mix(std::span<float>(x));
    });
  } catch (const peer_failure& e) {
    ok = r != bad && std::string(e.what()).find("rank " + std::to_string(bad)) != std::string::npos;
  } catch (const invalid_argument& e) {
    ok = r == bad && std::string(e.what()).find(std::to_string(P + 1) + " ranks") != std::string::npos;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s < 5.0);
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(ok == 1);
  REQUIRE(all == P);
}
