// CheckedComm<MpiComm>: the shared collective checks through the decorator over an
// unchecked MpiComm and over a default one (which it passes through); a disagreement,
// even 10 against 10000 floats (heap corruption inside OpenMPI when unchecked), raises
// mismatch_error on EVERY rank, fast, and the communicator stays usable.
#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>

#include <chrono>

#include "common/collective_checks.hpp"

using namespace commpact;
using namespace std::chrono_literals;

static_assert(PointToPoint<CheckedComm<MpiComm>>);
static_assert(AsyncPointToPoint<MpiComm>);
static_assert(AsyncPointToPoint<CheckedComm<MpiComm>>);
static_assert(diagnose_async_point_to_point<CheckedComm<MpiComm>>());

namespace {
int count_everywhere(MpiComm& comm, bool flag) {
  std::int32_t n = flag ? 1 : 0;
  comm.allreduce(std::span<std::int32_t>(&n, 1));
  return n;
}
}  // namespace

TEST_CASE("CheckedComm<MpiComm> passes every collective check", "[comm][mpi][checked]") {
  MpiComm unchecked{MPI_COMM_WORLD, {.timeout = 60s, .verify_collectives = false}};
  MpiComm checked{MPI_COMM_WORLD, {.timeout = 60s}};
  CheckedComm<MpiComm> a{unchecked}, b{checked};
  mpi_guard(a, [&] { commpact_test::check_all_collectives(a, 31, /*rank_order_bitwise=*/false); });
  mpi_guard(b, [&] { commpact_test::check_all_collectives(b, 32, /*rank_order_bitwise=*/false); });
  MpiComm bare{MPI_COMM_WORLD, {.timeout = 60s, .verify_collectives = false, .isolate_buffers = false}};
  CheckedComm<CountingComm<MpiComm>> c{CountingComm<MpiComm>{bare}};
  mpi_guard(c, [&] { commpact_test::check_all_collectives(c, 33, /*rank_order_bitwise=*/false); });
}

TEST_CASE("CheckedComm<MpiComm>: a disagreement raises mismatch_error on every rank and the communicator survives",
          "[comm][mpi][checked][errors]") {
  const bool built_in = GENERATE(false, true);  // the decorator's check, or MpiComm's own
  MpiComm inner{MPI_COMM_WORLD, {.timeout = 20s, .verify_collectives = built_in}};
  CheckedComm<MpiComm> comm{inner};
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  for (int round = 0; round < 10; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    bool threw = false;
    std::vector<float> g(r == round % P ? 10 : 10000, 1.f);  // unchecked: malloc(): corrupted top size
    try {
      comm.allreduce(std::span<float>(g));
    } catch (const mismatch_error& e) {
      threw = std::string(e.what()).find("ranks disagree on the size") != std::string::npos;
    }
    REQUIRE(std::chrono::steady_clock::now() - t0 < 5s);  // the check, not the deadline, decided
    REQUIRE(count_everywhere(inner, threw) == P);
    // A different operation and a bad argument on one rank, then good calls.
    threw = false;
    try {
      if (r == 0) comm.barrier();
      else comm.broadcast(std::span<float>(g.data(), 1), 0);
    } catch (const mismatch_error&) {
      threw = true;
    }
    REQUIRE(count_everywhere(inner, threw) == P);
    threw = false;
    try {
      comm.broadcast(std::span<float>(g.data(), 1), r == P - 1 ? P : 0);
    } catch (const invalid_argument&) {
      threw = true;
    }
    REQUIRE(count_everywhere(inner, threw) == P);
    std::vector<std::int64_t> x(7, r);
    comm.allreduce(std::span<std::int64_t>(x));
    REQUIRE(x == std::vector<std::int64_t>(7, std::int64_t(P) * (P - 1) / 2));
  }
  REQUIRE_FALSE(inner.failed());
}
