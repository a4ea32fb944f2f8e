// MpiComm nonblocking forms: several collectives and known-size messages in flight at
// once give the blocking results; test() completes them too; a receive nobody answers
// ends in timeout_error at the deadline (on every rank); a message of the wrong size
// fails loudly on both sides; an abort reaches a rank polling with test().
#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>

#include <chrono>
#include <thread>

#include "common/collective_checks.hpp"

using namespace commpact;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {
int count_on_all_ranks(bool flag) {
  int n = flag ? 1 : 0, total = 0;
  MPI_Allreduce(&n, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return total;
}
}  // namespace

TEST_CASE("MpiComm: several nonblocking collectives in flight match the blocking ones", "[comm][mpi][async]") {
  const bool verify = GENERATE(true, false);
  const bool isolate = GENERATE(true, false);
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 60s, .verify_collectives = verify, .isolate_buffers = isolate}};
  mpi_guard(comm, [&] {
    for (std::size_t n : {1u, 1000u, 70000u}) commpact_test::check_nonblocking_collectives(comm, n, n);
    CheckedComm<MpiComm> checked{comm};
    for (std::size_t n : {0u, 5u, 70000u}) commpact_test::check_nonblocking_collectives(checked, n + 9, n);
  });
}

TEST_CASE("MpiComm: nonblocking known-size messages, several in flight, in order", "[comm][mpi][async]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 60s}};
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  mpi_guard(comm, [&] {
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    const std::size_t sizes[] = {0, 17, 4096, 1 << 20};  // empty, eager and rendezvous-sized
    std::vector<std::vector<std::byte>> out, in;
    for (std::size_t i = 0; i < 4; ++i) {
      out.push_back(commpact_test::rank_bytes(i, r, next, sizes[i]));
      in.emplace_back(sizes[i]);
    }
    std::vector<mpi_request> recvs, sends;
    for (std::size_t i = 0; i < 4; ++i) recvs.push_back(comm.irecv(prev, std::span<std::byte>(in[i])));
    for (std::size_t i = 0; i < 4; ++i) sends.push_back(comm.isend(next, std::span<const std::byte>(out[i])));
    // A blocking send() between them is received by the next recv() in order.
    std::vector<std::byte> tail(5, std::byte(r)), got;
    comm.send(next, std::span<const std::byte>(tail));
    for (int i = 3; i >= 0; --i) recvs[i].wait();
    for (auto& s : sends) s.wait();
    comm.recv(prev, got);
    for (std::size_t i = 0; i < 4; ++i) REQUIRE(in[i] == commpact_test::rank_bytes(i, prev, r, sizes[i]));
    REQUIRE(got == std::vector<std::byte>(5, std::byte(prev)));
  });
}

TEST_CASE("MpiComm: a nonblocking receive nobody answers times out at the deadline, polled with test()",
          "[comm][mpi][async][failure]") {
  // (Not much shorter: construction runs under the same deadline, and 8 ranks on two
  // busy cores can take a few hundred ms to duplicate a communicator.)
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 2s}};
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  std::vector<std::byte> buf(8);
  bool ok = false, own = false;
  const auto t0 = clk::now();
  try {
    auto h = comm.irecv((r + 1) % P, std::span<std::byte>(buf));
    while (!h.test()) std::this_thread::yield();
  } catch (const timeout_error& e) {
    ok = own = std::string(e.what()).find("irecv") != std::string::npos;
  } catch (const peer_failure& e) {
    ok = std::string(e.what()).find("waited more than 2000 ms") != std::string::npos;  // another rank's deadline
  }
  const double waited = std::chrono::duration<double>(clk::now() - t0).count();
  INFO("rank " << r << " waited " << waited << " s");
  REQUIRE(ok);
  if (own) REQUIRE(waited >= 1.99);  // not before its deadline
  REQUIRE(waited < 8.0);
  REQUIRE(count_on_all_ranks(ok) == P);
  REQUIRE(comm.failed());
}

TEST_CASE("MpiComm: a message of the wrong size for irecv fails on every rank", "[comm][mpi][async][failure]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s}};
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  std::vector<std::byte> msg(r == 0 ? 64 : 8), buf(16);  // rank 0 sends too much, the others too little
  bool raised = false;
  try {
    auto s = comm.isend((r + 1) % P, std::span<const std::byte>(msg));
    auto h = comm.irecv((r + P - 1) % P, std::span<std::byte>(buf));
    h.wait();
    s.wait();
    comm.barrier();
  } catch (const comm_error&) {
    raised = true;  // the receiver: MPI_ERR_TRUNCATE; the others: a notice
  } catch (const mismatch_error& e) {
    raised = std::string(e.what()).find("expected 16 bytes") != std::string::npos;
  }
  REQUIRE(raised);
  REQUIRE(count_on_all_ranks(raised) == P);
  REQUIRE(comm.failed());
}

TEST_CASE("MpiComm: an abort reaches a rank polling a nonblocking collective with test()",
          "[comm][mpi][async][failure]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s}};
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  std::vector<float> g(1000, 1.f);
  bool ok = false;
  if (r == P - 1) {
    std::this_thread::sleep_for(200ms);
    comm.abort("out of memory on the data loader");
    ok = true;
  } else {
    const auto t0 = clk::now();
    try {
      auto h = CheckedComm<MpiComm>{comm}.iallreduce(std::span<float>(g));
      while (!h.test()) {
      }
    } catch (const peer_failure& e) {
      ok = std::string(e.what()).find("out of memory on the data loader") != std::string::npos &&
           clk::now() - t0 < 5s;
    }
  }
  REQUIRE(count_on_all_ranks(ok) == P);
}
