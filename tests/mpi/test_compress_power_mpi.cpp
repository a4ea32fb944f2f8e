// commpact-mpi-ranks: 1 2 3 4 8
// PowerCompressor (PowerSGD) over MpiComm under mpiexec: the same checks as the ThreadComm
// tests (tests/common/lowrank_checks.hpp): recovery of an exact low-rank mean with results
// bit-identical on every rank, error feedback and global conservation, exact bytes
// through CountingComm<MpiComm>, bad input that raises on every rank without hanging, and
// the deferred space (DeferredComm<MpiComm>) equal to host_space bit for bit.
// The communicator is CheckedComm over an unchecked MpiComm (tests/common/checked_mpi.hpp).
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>
#include <commpact/compress/compressors/power.hpp>

#include "common/lowrank_checks.hpp"
#include "common/checked_mpi.hpp"

using namespace commpact;
using namespace commpact_test;
using namespace std::chrono_literals;
static_assert(Compressor<PowerCompressor<2>>);
static_assert(Compressor<PowerCompressor<2>>);

TEST_CASE("MPI: PowerSGD recovers an exact low-rank mean, bit-identical on every rank", "[mpi][power]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  for (int k : {1, 2}) {
    CAPTURE(k);
    REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_power_lowrank_recovery(comm, k); }));
  }
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_power_bit_identical(comm); }));
}

TEST_CASE("MPI: PowerSGD error feedback is exact and conserves the mean", "[mpi][power]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_power_error_feedback(comm); }));
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_power_conservation(comm); }));
}

TEST_CASE("MPI: PowerSGD bytes through CountingComm<MpiComm> follow the ring formula", "[mpi][power]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_power_bytes(comm); }));
}

TEST_CASE("MPI: PowerSGD bad input raises on every rank and leaves the communicator usable", "[mpi][power][errors]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] {
    check_power_shape_mismatch(comm);
    check_power_nonfinite_raises(comm);
    check_power_error_feedback(comm);  // the communicator still works
  }));
}

TEST_CASE("MPI: one rank passes a buffer that does not fit the layout: every rank raises, none hangs",
          "[mpi][power][errors][failure]") {
  // Its own MpiComm: mpi_guard marks it failed, and the next test must not meet it.
  auto comm = commpact_test::checked_mpi_world(20s);
  const int P = comm.size(), r = comm.rank(), bad = P - 1;
  const auto t0 = std::chrono::steady_clock::now();
  int ok = 0;
  try {
    mpi_guard(comm, [&] {
      PowerCompressor<2> c{comm, kPowerLayout};
      auto g = normal(r, numel(kPowerLayout) - (r == bad ? 1 : 0));
      c.reduce(std::span<float>(g));
    });
  } catch (const mismatch_error& e) {
    // Every rank: the length the ranks disagree on, with the range that holds the odd one.
    const std::string w = e.what();
    ok = w.find("ranks disagree on the gradient length: rank " + std::to_string(r) + " has") != std::string::npos &&
         w.find("[" + std::to_string(numel(kPowerLayout) - 1) + ", ") != std::string::npos;
  } catch (const invalid_argument& e) {
    // P = 1: the one rank is the odd one, so the ranks agree on a length that does not fit.
    ok = P == 1 && std::string(e.what()).find(std::to_string(numel(kPowerLayout) - 1)) != std::string::npos;
  } catch (const std::exception& e) {
    // Any other error fails the check here, so that every rank still reaches the count below.
    UNSCOPED_INFO("rank " << r << " raised: " << e.what());
    ok = 0;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s < 5.0);
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(ok == 1);
  REQUIRE(all == P);
}

namespace {
// Copies between host vectors and deferred buffers (queued, then fenced); space_copies.hpp
// would redefine sparse_checks.hpp's same_bits.
std::vector<float> host_of(const deferred_space::exec& e, deferred_span<const float> s) {
  std::vector<float> h(s.size());
  ops<deferred_space>::to_host(e, s, std::span<float>(h));
  deferred_space::fence(e, no_deadline());
  return h;
}
deferred_space::buffer<float> device_of(const deferred_space::exec& e, const std::vector<float>& h) {
  deferred_space::buffer<float> b;
  b.resize(h.size());
  ops<deferred_space>::from_host(e, std::span<const float>(h), b.view());
  deferred_space::fence(e, no_deadline());
  return b;
}
}  // namespace

TEST_CASE("MPI: PowerCompressor over DeferredComm equals host_space bit for bit, on every rank", "[mpi][power][space]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  using DC = DeferredComm<checked_mpi_comm>;
  const int r = comm.rank();
  int ok = 0;
  REQUIRE_NOTHROW(mpi_guard(comm, [&] {
    const power_options o{.min_compression_rate = 1.0, .start_step = 1};
    PowerCompressor<2> h{comm, kPowerLayout, o};
    PowerCompressor<2, deferred_space> d{DC{comm}, kPowerLayout, o};
    const auto e = d.comm().exec();
    const std::size_t n = numel(kPowerLayout);
    bool good = true;
    for (int step = 0; step < 4; ++step) {
      auto g = normal(100 * step + r, n);
      auto dg = device_of(e, g);
      good = good && h.reduce(std::span<float>(g)) && d.reduce(dg.view());
      good = good && same_bits(g, host_of(e, dg.cview())) && same_on_all_ranks(comm, std::span<const float>(g));
      for (std::size_t i = 0; i < kPowerLayout.size(); ++i)
        good = good && same_bits(h.residual(i), host_of(e, d.residual(i))) &&
               same_bits(h.q_factor(i), host_of(e, d.q_factor(i)));
    }
    ok = good;
  }));
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(ok == 1);
  REQUIRE(all == comm.size());
}
