// ThreadComm: every collective against a serial reference for P in {1,2,3,4,5,8},
// disagreement between ranks, and failure propagation within the deadline.
#include <commpact/comm/thread_comm.hpp>

#include <atomic>
#include <chrono>

#include "common/collective_checks.hpp"

using namespace commpact;
using namespace std::chrono_literals;

TEST_CASE("ThreadComm collectives match the serial reference", "[comm][thread]") {
  const int P = GENERATE(1, 2, 3, 4, 5, 8);
  const std::uint64_t seed = GENERATE(11u, 12345u);
  std::atomic<int> ran{0};
  run_threads(P, [&](ThreadComm& comm) {
    REQUIRE(comm.size() == P);
    commpact_test::check_all_collectives(comm, seed, /*rank_order_bitwise=*/true);
    ++ran;
  });
  REQUIRE(ran == P);
}

TEST_CASE("ThreadComm rejects bad arguments", "[comm][thread]") {
  REQUIRE_THROWS_AS(ThreadComm::make_world(0), invalid_argument);
  auto comms = ThreadComm::make_world(2);
  std::vector<std::byte> buf;
  std::byte b[1]{};
  REQUIRE_THROWS_AS(comms[0].send(0, b), invalid_argument);  // self
  REQUIRE_THROWS_AS(comms[0].send(2, b), invalid_argument);  // out of range
  REQUIRE_THROWS_AS(comms[1].recv(-1, buf), invalid_argument);
  std::vector<float> in(3), out(5);
  REQUIRE_THROWS_AS(comms[0].allgather(std::span<const float>(in), std::span<float>(out)), invalid_argument);
  REQUIRE_THROWS_AS(comms[0].broadcast(std::span<float>(in), 7), invalid_argument);
}

TEST_CASE("ThreadComm: ranks that disagree all get an error", "[comm][thread]") {
  const int P = GENERATE(2, 3, 5);
  std::atomic<int> errors{0};
  REQUIRE_THROWS_AS(run_threads(P,
                                [&](ThreadComm& comm) {
                                  std::vector<float> g(10 + (comm.rank() == P - 1 ? 1 : 0));
                                  try {
                                    comm.allreduce(std::span<float>(g));
                                  } catch (const mismatch_error&) {
                                    ++errors;
                                    throw;
                                  }
                                }),
                    mismatch_error);
  REQUIRE(errors == P);
  // Different collectives at the same point.
  errors = 0;
  REQUIRE_THROWS_AS(run_threads(P,
                                [&](ThreadComm& comm) {
                                  std::vector<float> g(4);
                                  try {
                                    if (comm.rank() == 0) comm.broadcast(std::span<float>(g), 0);
                                    else comm.allreduce(std::span<float>(g));
                                  } catch (const mismatch_error&) {
                                    ++errors;
                                    throw;
                                  }
                                }),
                    mismatch_error);
  REQUIRE(errors == P);
}

TEST_CASE("ThreadComm: a rank that fails mid-collective makes the others raise", "[comm][thread]") {
  const int P = GENERATE(2, 3, 4, 8);
  const int bad = P - 1;
  std::atomic<int> peer_failures{0};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run_threads(
        P,
        [&](ThreadComm& comm) {
          std::vector<float> g(1000, 1.f);
          comm.allreduce(std::span<float>(g));  // all ranks succeed once
          if (comm.rank() == bad) throw std::runtime_error("simulated failure on one rank");
          try {
            comm.allreduce(std::span<float>(g));
          } catch (const peer_failure&) {
            ++peer_failures;
            throw;
          }
        },
        {.timeout = 20s});
    FAIL("run_threads returned although a rank threw");
  } catch (const std::runtime_error& e) {
    // The root cause, not a peer_failure, is what run_threads rethrows.
    REQUIRE(std::string(e.what()) == "simulated failure on one rank");
  }
  REQUIRE(peer_failures == P - 1);
  // Propagation is immediate, far inside the deadline.
  REQUIRE(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("ThreadComm: a missing rank makes the others time out, and a rank that returns early is noticed",
          "[comm][thread]") {
  std::atomic<int> timeouts{0}, failures{0};
  REQUIRE_THROWS(run_threads(
      3,
      [&](ThreadComm& comm) {
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(600ms);  // late, past the others' deadline
          return;
        }
        try {
          comm.barrier();
        } catch (const timeout_error&) {
          ++timeouts;
          throw;
        } catch (const peer_failure&) {
          ++failures;
          throw;
        }
      },
      {.timeout = 150ms}));
  REQUIRE(timeouts + failures == 2);
  REQUIRE(timeouts >= 1);

  // A rank that returns while the others wait in a collective.
  failures = 0;
  REQUIRE_THROWS_AS(run_threads(4,
                                [&](ThreadComm& comm) {
                                  if (comm.rank() == 1) return;
                                  try {
                                    comm.barrier();
                                  } catch (const peer_failure&) {
                                    ++failures;
                                    throw;
                                  }
                                }),
                    peer_failure);
  REQUIRE(failures == 3);

  // recv from a rank that never sends and has returned.
  REQUIRE_THROWS_AS(run_threads(2,
                                [&](ThreadComm& comm) {
                                  if (comm.rank() == 0) return;
                                  std::vector<std::byte> buf;
                                  comm.recv(0, buf);
                                }),
                    peer_failure);
}

TEST_CASE("ThreadComm: abort reaches a rank blocked in recv", "[comm][thread]") {
  std::atomic<bool> got{false};
  REQUIRE_THROWS_AS(run_threads(2,
                                [&](ThreadComm& comm) {
                                  if (comm.rank() == 0) {
                                    std::this_thread::sleep_for(50ms);
                                    comm.abort("giving up");
                                    throw std::runtime_error("rank 0 gave up");
                                  }
                                  std::vector<std::byte> buf;
                                  try {
                                    comm.recv(0, buf);
                                  } catch (const peer_failure& e) {
                                    got = std::string(e.what()).find("giving up") != std::string::npos;
                                    throw;
                                  }
                                },
                                {.timeout = 30s}),
                    std::runtime_error);
  REQUIRE(got);
}

TEST_CASE("ThreadComm: point-to-point reuses message storage", "[comm][thread]") {
  run_threads(2, [](ThreadComm& comm) {
    const int peer = 1 - comm.rank();
    std::vector<std::byte> msg(4096, std::byte{1}), buf;
    comm.sendrecv(peer, msg, buf);
    comm.sendrecv(peer, msg, buf);
    const auto* p = buf.data();
    for (int i = 0; i < 10; ++i) {
      comm.sendrecv(peer, msg, buf);
      comm.barrier();
    }
    // Steady state: buffers circulate between the mailbox and the receiver.
    const bool stable = buf.capacity() >= 4096 && buf.size() == 4096;
    REQUIRE(stable);
    (void)p;
  });
}
