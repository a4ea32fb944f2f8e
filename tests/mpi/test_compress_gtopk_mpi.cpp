// commpact-mpi-ranks: 1 2 3 4 5 7 8 16
// gTopK<TreeComm<C>> and TopK<C> under mpiexec, C = CheckedComm<MpiComm> over an unchecked
// MpiComm (tests/common/checked_mpi.hpp): the same checks as the ThreadComm tests
// (tests/common/sparse_checks.hpp): bit-exact against the serial tree reference on every
// rank, conservation, exact bytes, bad input (every rank gets an error, none hangs, the
// communicator stays usable), save/load.
#include <commpact/comm/mpi_comm.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/topk.hpp>

#include "common/sparse_checks.hpp"
#include "common/checked_mpi.hpp"

using namespace commpact;
using namespace commpact_test;
using namespace std::chrono_literals;
using GT = gTopK<TreeComm<commpact_test::checked_mpi_comm>>;
using TK = TopK<commpact_test::checked_mpi_comm>;
static_assert(Compressor<GT> && Compressor<TK>);

TEST_CASE("MPI: TreeComm reaches every rank", "[mpi][tree]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_tree_union(comm); }));
}

TEST_CASE("MPI: gTopK equals the serial tree reference bit for bit, conserves, counts bytes", "[mpi][gtopk]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  for (std::uint64_t seed : {1u, 77u})
    for (double density : {0.01, 0.3})
      for (int kind : {0, 1}) {
        CAPTURE(seed, density, kind);
        REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_gtopk_reference(comm, seed, 1000, density, 3, kind); }));
      }
}

TEST_CASE("MPI: TopK equals the brute-force reference bit for bit, conserves, counts bytes", "[mpi][topk]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  for (std::uint64_t seed : {2u, 999u})
    for (int kind : {0, 1}) REQUIRE_NOTHROW(mpi_guard(comm, [&] { check_topk_reference(comm, seed, 1000, 0.05, 3, kind); }));
}

TEST_CASE("MPI: bad input raises on every rank and leaves the communicator usable", "[mpi][gtopk][topk]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  const int P = comm.size();
  REQUIRE_NOTHROW(mpi_guard(comm, [&] {
    check_bad_options<GT>(comm);
    check_k_above_n<GT>(comm);
    check_nonfinite<GT>(comm, P - 1, std::numeric_limits<float>::quiet_NaN());
    check_nonfinite<GT>(comm, 0, std::numeric_limits<float>::infinity());
    check_length_mismatch<GT>(comm);
    check_bad_options<TK>(comm);
    check_k_above_n<TK>(comm);
    check_nonfinite<TK>(comm, P - 1, std::numeric_limits<float>::quiet_NaN());
    check_length_mismatch<TK>(comm);
  }));
}

TEST_CASE("MPI: save/load continues identically", "[mpi][gtopk][topk]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] {
    check_save_load<GT>(comm, {.density = 0.03, .momentum = 0.9f}, 700);
    check_save_load<TK>(comm, {.density = 0.03}, 700);
  }));
}
