// commpact-mpi-ranks: 1 2 3 4 8
// DataParallel over MpiComm under mpiexec: the same checks as the ThreadComm tests
// (tests/common/data_parallel_checks.hpp): the rounds equal the policy's schedule (QSR's
// from the hand table), LocalSgd{1} equals EveryStep with Dense bit for bit, parameters
// are identical on every rank after each round, bytes through CountingComm<MpiComm>
// follow the ring formula, PowerSGD as the compressor keeps ranks identical, and ranks
// that decide differently all raise, none hangs.
// The communicator is CheckedComm over an unchecked MpiComm (tests/common/checked_mpi.hpp).
#include <commpact/comm/mpi_comm.hpp>

#include "common/data_parallel_checks.hpp"
#include "common/checked_mpi.hpp"

using namespace commpact;
using namespace commpact_test;
using namespace std::chrono_literals;

TEST_CASE("MPI: DataParallel performs the rounds of QSR's hand-computed schedule", "[mpi][data_parallel][qsr]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_qsr_hand_schedule(comm); }));
}

TEST_CASE("MPI: DataParallel's rounds equal the policy's schedule", "[mpi][data_parallel]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_rounds_equal_schedule(comm); }));
}

TEST_CASE("MPI: LocalSgd{1} equals EveryStep with Dense bit for bit", "[mpi][data_parallel][bitwise]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  for (bool average_state : {false, true})
    for (double momentum : {0.0, 0.9}) {
      CAPTURE(average_state, momentum);
      REQUIRE_NOTHROW(mpi_guard(comm, [&] {  // MpiComm does not sum in rank order: the reference within 1e-6
        check_localsgd1_equals_everystep(comm, average_state, momentum, false);
      }));
    }
}

TEST_CASE("MPI: bytes through CountingComm<MpiComm> follow the ring formula", "[mpi][data_parallel][bytes]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_data_parallel_bytes(comm); }));
}

TEST_CASE("MPI: DataParallel with PowerCompressor<2> keeps every rank identical",
          "[mpi][data_parallel][compress]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_data_parallel_powersgd(comm); }));
}

TEST_CASE("MPI: verify_plans catches ranks that decide differently on every rank; none hangs",
          "[mpi][data_parallel][errors]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] {
    check_verify_plans_mismatch(comm);
    check_rounds_equal_schedule(comm);  // the communicator still works
  }));
}
