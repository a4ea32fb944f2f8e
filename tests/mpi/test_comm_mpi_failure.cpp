// MpiComm failure and deadline semantics: a rank that aborts (or throws inside
// mpi_guard, or never joins) mid-operation makes every other rank raise within the
// deadline, with the remote reason; a failed communicator refuses further work at once;
// a disagreement under CheckedComm raises mismatch_error on every rank; a sendrecv
// whose peer sends but never receives ends at the deadline. Each scenario
// runs on its own MpiComm (its own duplicated communicators), so the abandoned
// operations of a failed one never meet the next test, and the process still reaches
// MPI_Finalize and exits cleanly.
// commpact-mpi-ranks: 2 3 4 5 8
#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace commpact;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {
double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

// Every rank learns every rank's flag through a fresh, healthy communicator.
int count_on_all_ranks(bool flag) {
  int n = flag ? 1 : 0, total = 0;
  MPI_Allreduce(&n, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return total;
}
}  // namespace

TEST_CASE("MpiComm: a rank that aborts mid-collective makes the others raise peer_failure fast",
          "[comm][mpi][failure]") {
  const auto timeout = 20s;
  MpiComm comm{MPI_COMM_WORLD, {.timeout = timeout}};
  const MpiComm alias = comm;  // a copy, as a compressor would hold it
  const int P = comm.size(), r = comm.rank(), bad = P - 1;
  std::vector<float> g(100000, 1.f);
  comm.allreduce(std::span<float>(g));  // all ranks succeed once
  REQUIRE(g[0] == float(P));

  bool got_peer_failure = false;
  double waited = 0;
  if (r == bad) {
    std::this_thread::sleep_for(200ms);  // let the others enter the collective
    comm.abort("disk full while writing a checkpoint.");  // a reason that ends a sentence
    REQUIRE(comm.failed());
    // The aborting rank refuses further work at once.
    const auto t0 = clk::now();
    REQUIRE_THROWS_AS(comm.allreduce(std::span<float>(g)), peer_failure);
    REQUIRE_THROWS_AS(comm.barrier(), peer_failure);
    REQUIRE(seconds_since(t0) < 1.0);
    got_peer_failure = true;
  } else {
    const auto t0 = clk::now();
    try {
      comm.allreduce(std::span<float>(g));
      FAIL("allreduce returned although rank " << bad << " aborted");
    } catch (const peer_failure& e) {
      got_peer_failure = true;
      waited = seconds_since(t0);
      REQUIRE_THAT(std::string(e.what()), Catch::Contains("rank " + std::to_string(bad) + " aborted") &&
                                              Catch::Contains("disk full while writing a checkpoint") &&
                                              !Catch::Contains(".."));  // quoted without a doubled stop
    }
    // Well within the deadline: the notice, not the clock, ended the wait.
    REQUIRE(waited < 5.0);
    // And the communicator now refuses everything at once.
    const auto t1 = clk::now();
    std::vector<std::byte> buf;
    REQUIRE_THROWS_AS(comm.broadcast(std::span<float>(g), 0), peer_failure);
    REQUIRE_THROWS_AS(comm.send(bad, std::span<const std::byte>()), peer_failure);
    REQUIRE_THROWS_AS(comm.recv(bad, buf), peer_failure);
    REQUIRE(seconds_since(t1) < 1.0);
  }
  REQUIRE(comm.failed());
  REQUIRE(alias.failed());  // copies share the failure state
  REQUIRE_THAT(alias.failure(), Catch::Contains("disk full while writing a checkpoint"));
  REQUIRE(count_on_all_ranks(got_peer_failure) == P);
}

TEST_CASE("MpiComm: an exception inside mpi_guard reaches every rank", "[comm][mpi][failure]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s}};
  const int P = comm.size(), r = comm.rank(), bad = 1 % P;
  std::vector<double> v(1000, r);
  bool ok = false;
  const auto t0 = clk::now();
  try {
    mpi_guard(comm, [&](MpiComm& c) {
      c.broadcast(std::span<double>(v), 0);  // everyone succeeds once
      if (c.rank() == bad) throw std::runtime_error("loss is NaN at step 42");
      c.allreduce(std::span<double>(v));
    });
    FAIL("mpi_guard returned although rank " << bad << " threw");
  } catch (const peer_failure& e) {
    ok = r != bad && std::string(e.what()).find("loss is NaN at step 42") != std::string::npos &&
         std::string(e.what()).find("rank " + std::to_string(bad)) != std::string::npos;
  } catch (const std::runtime_error& e) {
    ok = r == bad && std::string(e.what()) == "loss is NaN at step 42";  // rethrown unchanged
  }
  REQUIRE(ok);
  REQUIRE(seconds_since(t0) < 5.0);
  REQUIRE(count_on_all_ranks(ok) == P);
}

TEST_CASE("MpiComm: a receive from a rank that aborts raises peer_failure", "[comm][mpi][failure]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s}};
  const int P = comm.size(), r = comm.rank();
  bool ok = false;
  if (r == 0) {
    std::this_thread::sleep_for(200ms);
    comm.abort("preempted by the scheduler");
    ok = true;
  } else {
    std::vector<std::byte> buf;
    const auto t0 = clk::now();
    try {
      comm.recv(0, buf);
    } catch (const peer_failure& e) {
      ok = std::string(e.what()).find("preempted by the scheduler") != std::string::npos && seconds_since(t0) < 5.0;
    }
  }
  REQUIRE(count_on_all_ranks(ok) == P);
}

TEST_CASE("MpiComm: a sendrecv whose peer aborts raises peer_failure", "[comm][mpi][failure]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s}};
  const int P = comm.size(), r = comm.rank();
  // Rendezvous-sized, and kept alive past the test: an abandoned send may still read it.
  static std::vector<std::byte> msg(1 << 20, std::byte{3});
  bool ok = false;
  if (r == 0) {
    std::this_thread::sleep_for(200ms);
    comm.abort("lost its GPU");
    ok = true;
  } else {
    std::vector<std::byte> buf;
    const auto t0 = clk::now();
    try {
      comm.sendrecv(0, std::span<const std::byte>(msg), buf);
    } catch (const peer_failure& e) {
      ok = std::string(e.what()).find("lost its GPU") != std::string::npos && seconds_since(t0) < 5.0;
    }
  }
  REQUIRE(count_on_all_ranks(ok) == P);
}

TEST_CASE("MpiComm: a sendrecv whose peer sends but does not receive ends at the deadline",
          "[comm][mpi][failure][timeout]") {
  // Like MPI_Sendrecv, sendrecv returns only once the peer has taken the message: a peer
  // that sends and then waits elsewhere makes it time out (and every rank learns it).
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 300ms}};
  const int P = comm.size(), r = comm.rank();
  static std::vector<std::byte> msg(1 << 20, std::byte{4});
  bool ok = false;
  if (r == 0) {
    comm.send(1, std::span<const std::byte>(msg.data(), 100));  // eager: arrives without rank 0's help
    std::this_thread::sleep_for(2s);                              // far past rank 1's deadline
    std::vector<std::byte> buf;
    try {
      comm.recv(1, buf);
    } catch (const peer_failure& e) {
      ok = std::string(e.what()).find("waited more than 300 ms in sendrecv") != std::string::npos;
    }
  } else if (r == 1) {
    std::vector<std::byte> buf;
    const auto t0 = clk::now();
    try {
      comm.sendrecv(0, std::span<const std::byte>(msg), buf);
    } catch (const timeout_error&) {
      ok = buf.size() == 100 && seconds_since(t0) < 1.5;  // rank 0's message did arrive
    }
  } else {
    ok = true;
  }
  REQUIRE(count_on_all_ranks(ok) == P);
}

TEST_CASE("MpiComm: a point-to-point wait that times out names its peer, and everyone learns it",
          "[comm][mpi][failure][timeout]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 300ms}};
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  bool ok = false;
  if (r == 1) {  // waits for a message rank 0 never sends
    std::vector<std::byte> buf(16);
    try {
      auto h = comm.irecv(0, std::span<std::byte>(buf));
      h.wait();
    } catch (const timeout_error& e) {
      ok = std::string(e.what()).find("irecv from rank 0; that rank is missing") != std::string::npos;
    }
  } else {
    std::this_thread::sleep_for(1s);  // past rank 1's deadline: the failure is known here
    try {
      comm.barrier();
    } catch (const peer_failure& e) {
      ok = std::string(e.what()).find("irecv from rank 0") != std::string::npos;
    }
  }
  REQUIRE(count_on_all_ranks(ok) == P);
}

TEST_CASE("MpiComm: a rank that never joins makes the others time out, and everyone learns it",
          "[comm][mpi][failure][timeout]") {
  const auto timeout = 300ms;
  MpiComm comm{MPI_COMM_WORLD, {.timeout = timeout}};
  const int P = comm.size(), r = comm.rank(), late = 0;
  std::vector<float> g(1000, 1.f);
  bool ok = false, timed_out = false;
  if (r == late) {
    std::this_thread::sleep_for(3s);  // far past the others' deadline
    const auto t0 = clk::now();
    try {
      comm.allreduce(std::span<float>(g));
    } catch (const peer_failure& e) {
      // Told by the ranks that timed out; raised at entry, not after another deadline.
      ok = std::string(e.what()).find("waited more than 300 ms") != std::string::npos && seconds_since(t0) < 0.25;
    }
  } else {
    const auto t0 = clk::now();
    try {
      comm.allreduce(std::span<float>(g));
    } catch (const timeout_error& e) {
      timed_out = true;
      // Its own deadline fired: not before it, and with a message that says what to do.
      ok = std::string(e.what()).find("mpi_options::timeout") != std::string::npos && seconds_since(t0) >= 0.29;
    } catch (const peer_failure& e) {
      // Another rank's deadline fired first and told us.
      ok = std::string(e.what()).find("waited more than 300 ms") != std::string::npos;
    }
    const double waited = seconds_since(t0);
    INFO("rank " << r << " waited " << waited << " s");
    ok = ok && waited < 2.5;  // far below the 3 s the late rank stays away
  }
  REQUIRE(ok);
  REQUIRE(count_on_all_ranks(ok) == P);
  REQUIRE(count_on_all_ranks(timed_out) >= 1);
}

TEST_CASE("CheckedComm<MpiComm>: disagreeing sizes over an unchecked MpiComm raise mismatch_error on every rank",
          "[comm][mpi][failure][checked]") {
  // Without any check, 10 against 10000 floats is undefined behaviour in MPI (OpenMPI
  // 4.1's shared-memory single-copy path corrupts the heap: "malloc(): corrupted top
  // size"). The decorator's signature check stops it before MPI sees the counts.
  MpiComm raw{MPI_COMM_WORLD, {.timeout = 5s, .verify_collectives = false}};
  CheckedComm<MpiComm> comm{raw};
  const int P = comm.size(), r = comm.rank();
  std::vector<float> g(r == 0 ? 10 : 10000, 1.f);
  std::string what;
  const auto t0 = clk::now();
  try {
    comm.allreduce(std::span<float>(g));
  } catch (const mismatch_error& e) {
    what = e.what();
  }
  INFO("rank " << r << ": " << what);
  REQUIRE(seconds_since(t0) < 5.0);  // the check, not the deadline, ended every wait
  REQUIRE(count_on_all_ranks(what.find("[40, 40000] bytes") != std::string::npos) == P);
  REQUIRE_FALSE(comm.inner().failed());  // and the communicator stays usable
  std::vector<float> ok(10000, 1.f);
  comm.allreduce(std::span<float>(ok));
  REQUIRE(ok[9999] == float(P));
}

TEST_CASE("MpiComm: a failure notice for a destroyed communicator does not poison the next one",
          "[comm][mpi][failure]") {
  const int P = [] {
    int p = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    return p;
  }();
  for (int round = 0; round < 3; ++round) {
    {
      MpiComm a{MPI_COMM_WORLD, {.timeout = 20s}};
      a.barrier();
      MPI_Barrier(MPI_COMM_WORLD);  // every rank is done with `a` ...
      // ... and one rank aborts anyway; the others destroy their handle without
      // looking, while the notice may still be in flight to them.
      if (a.rank() == P - 1) a.abort("late abort of an old communicator");
    }
    MpiComm b{MPI_COMM_WORLD, {.timeout = 20s}};  // may reuse a's context ids
    std::vector<std::int64_t> x(3, 1);
    for (int i = 0; i < 20; ++i) {
      b.allreduce(std::span<std::int64_t>(x), reduce_op::max);
      b.barrier();
    }
    REQUIRE_FALSE(b.failed());
    REQUIRE(count_on_all_ranks(!b.failed()) == P);
  }
}

TEST_CASE("MpiComm: construction waits for a late rank under setup_timeout, not the operations' deadline",
          "[comm][mpi][timeout]") {
  // The tests above build communicators with a 300 ms deadline; construction used to run
  // under it too, so a rank that reached its constructor 0.3 s late failed everyone's.
  int P = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (r == P - 1) std::this_thread::sleep_for(700ms);
  const auto t0 = clk::now();
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 300ms}};  // setup_timeout: 60 s by default
  const double waited = seconds_since(t0);
  INFO("rank " << r << " constructed in " << waited << " s");
  REQUIRE(comm.timeout() == 300ms);
  REQUIRE(waited < 30.0);
  std::vector<std::int64_t> x(10, 1);
  comm.allreduce(std::span<std::int64_t>(x));
  REQUIRE(x[9] == P);
  REQUIRE(count_on_all_ranks(r == P - 1 || waited > 0.35) == P);  // the early ranks waited past 300 ms
}

TEST_CASE("MpiComm: a healthy communicator after the failures works", "[comm][mpi][failure]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s}};
  std::vector<std::int64_t> x(10, 1);
  comm.allreduce(std::span<std::int64_t>(x));
  REQUIRE(x[9] == comm.size());
  comm.barrier();
}
