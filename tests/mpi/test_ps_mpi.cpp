// commpact-mpi-ranks: 3 4
// The parameter server over MpiComm under mpiexec: the checks of tests/test_ps.cpp
// (tests/common/ps_checks.hpp) with one process per rank: BSP equals all-reduce S-SGD bit
// for bit, SSP's bound holds and is reached, Ssp{0} equals Bsp, ASP passes a stalled
// worker, bytes equal the formula, and a failing worker makes every rank raise.
#include <commpact/comm/mpi_comm.hpp>

#include "common/ps_checks.hpp"

using namespace commpact_test;
using commpact::MpiComm;
using namespace std::chrono_literals;

namespace {
MpiComm world(std::chrono::milliseconds t = 30s) { return MpiComm{MPI_COMM_WORLD, {.timeout = t}}; }

// Runs fn; an exception (a failed PS_EXPECT on this rank, or a peer's failure) aborts the
// communicator (mpi_guard) and fails the test with its message on every rank.
template <class F>
void guarded(MpiComm& comm, F fn) {
  try {
    commpact::mpi_guard(comm, fn);
  } catch (const std::exception& e) {
    FAIL(e.what());
  }
}
}  // namespace

// Against the serial S-SGD reference (worker-order sums, ThreadComm's allreduce order).
TEST_CASE("MPI ps: BSP equals all-reduce S-SGD bit for bit", "[mpi][ps][bsp]") {
  auto comm = world();
  const int P = comm.size();
  guarded(comm, [&] {
    check_bsp_equals_allreduce(comm, ps::roles::colocated(P), 0.9, false);
    check_bsp_equals_allreduce(comm, ps::roles::separate(P, 1), 0.9, false);
  });
}

TEST_CASE("MPI ps: SSP bound for s in {0, 1, 3}; Ssp{0} equals Bsp", "[mpi][ps][ssp]") {
  auto comm = world();
  const int P = comm.size();
  guarded(comm, [&] {
    for (std::int64_t s : {0, 1, 3}) check_ssp_bound(comm, ps::roles::colocated(P), s, 7);
    check_ssp_bound(comm, ps::roles::separate(P, 1), 1, 8);
    check_ssp0_equals_bsp(comm, ps::roles::colocated(P));
  });
}

TEST_CASE("MPI ps: ASP progresses with a stalled worker", "[mpi][ps][asp]") {
  auto comm = world();
  const int P = comm.size();
  // The fast workers' signal: an MPI_Ibarrier on a duplicate of the world, which the
  // fast workers enter when they have finished their clocks and the others at once.
  struct ibarrier_done {
    MPI_Comm c = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    ibarrier_done() { MPI_Comm_dup(MPI_COMM_WORLD, &c); }
    ~ibarrier_done() {  // a check that failed skipped close(): a barrier some rank never
      // entered stays active (never waited for: that could hang; the test has failed)
      if (req != MPI_REQUEST_NULL) ready();
      MPI_Comm_free(&c);
    }
    void join() { MPI_Ibarrier(c, &req); }
    void arrive() { MPI_Ibarrier(c, &req); }
    bool ready() {
      int flag = 0;
      MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      return flag != 0;
    }
    void close() {
      if (req != MPI_REQUEST_NULL) MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
  } done;
  guarded(comm, [&] { check_asp_progress(comm, ps::roles::colocated(P), 600, done); });
}

TEST_CASE("MPI ps: bytes per push and pull equal the formula", "[mpi][ps][bytes]") {
  auto comm = world();
  const int P = comm.size();
  guarded(comm, [&] {
    check_ps_bytes(comm, ps::roles::colocated(P), ps::dense_codec{}, 101, 3);
    check_ps_bytes(comm, ps::roles::separate(P, 1), commpact::topk_codec{0.1}, 101, 3);
  });
}

// Last: the communicator is failed afterwards.
TEST_CASE("MPI ps: a failing worker makes every rank raise within the deadline", "[mpi][ps][failure]") {
  auto comm = world(20s);
  const int P = comm.size();
  const auto t0 = std::chrono::steady_clock::now();
  bool raised = false;
  try {
    std::vector<float> init(40, 1.0f), x(40), g(40, 0.5f);
    ps::ParameterServer<MpiComm, ps::dense_codec, ps::Bsp> server{comm, ps::roles::separate(P, 1), init};
    if (server.is_worker())
      for (int t = 0; t < 10; ++t) {
        server.pull(x);
        if (comm.rank() == P - 1 && t == 3) throw commpact::invalid_argument("the last worker's data loader failed");
        server.push(g, 0.1);
      }
    server.finish();
  } catch (const std::exception&) {
    raised = true;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(raised);
  REQUIRE(secs < 10.0);
}
