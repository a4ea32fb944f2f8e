// ThreadComm: every collective against a serial reference for P in {1,2,3,4,5,8},
// disagreement between ranks, and failure propagation within the deadline.
#include <commpact/comm/thread_comm.hpp>

#include <atomic>
#include <chrono>
#include <limits>
#include <string>
#include <thread>

#include "common/collective_checks.hpp"
#include "common/rank_checks.hpp"

using namespace commpact;
using namespace std::chrono_literals;

TEST_CASE("ThreadComm collectives match the serial reference", "[comm][thread]") {
  const int P = GENERATE(1, 2, 3, 4, 5, 8);
  const std::uint64_t seed = GENERATE(11u, 12345u);
  std::atomic<int> ran{0};
  run_threads(P, [&](ThreadComm& comm) {
    RANK_REQUIRE(comm.size() == P);
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
  // Collective arguments are checked collectively: see "an invalid argument on any rank".
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
  std::atomic<int> timeouts{0}, failures{0}, others{0};
  REQUIRE_THROWS(run_threads(
      3,
      [&](ThreadComm& comm) {
        if (comm.rank() == 2) {  // late, past the others' deadline: it returns once they raised
          // (a sleep would not order it: a late start of the others let this rank leave first)
          const auto cap = std::chrono::steady_clock::now() + 20s;
          while (timeouts + failures + others < 2 && std::chrono::steady_clock::now() < cap)
            std::this_thread::sleep_for(1ms);
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
        } catch (...) {
          ++others;
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
                                    comm.abort("giving up.");  // a reason that ends a sentence
                                    throw std::runtime_error("rank 0 gave up");
                                  }
                                  std::vector<std::byte> buf;
                                  try {
                                    comm.recv(0, buf);
                                  } catch (const peer_failure& e) {
                                    const std::string what = e.what();
                                    // quoted once, without a doubled full stop
                                    got = what.find("giving up") != std::string::npos &&
                                          what.find("..") == std::string::npos;
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
    RANK_REQUIRE(stable);
    (void)p;
  });
}

// ---- a failed collective completes for every rank before the next starts ----

namespace {
// x_r[i] = 1000 r + i + round: small integers, so every float sum is exact in any order.
std::vector<float> retry_input(int rank, std::size_t n, int round) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(1000 * rank + static_cast<int>(i) + round);
  return v;
}
}  // namespace

TEST_CASE("ThreadComm stays usable after a mismatch: each round fails, then retries give exact results",
          "[comm][thread]") {
  const int P = GENERATE(2, 3, 8);
  const int rounds = 300;
  std::atomic<int> mismatches{0}, wrong{0}, other{0};
  run_threads(
      P,
      [&](ThreadComm& comm) {
        const int r = comm.rank();
        for (int round = 0; round < rounds; ++round) {
          const std::size_t n = 2 + static_cast<std::size_t>(round * 37 % 300);
          // Rank P-1 passes one float fewer: every rank must raise mismatch_error.
          auto bad = retry_input(r, r == P - 1 ? n - 1 : n, round);
          try {
            comm.allreduce(std::span<float>(bad));
            ++other;  // returned normally
          } catch (const mismatch_error&) {
            ++mismatches;
          } catch (...) {
            ++other;
          }
          // Immediately retry with agreeing sizes: the sum must be exact on every rank.
          auto g = retry_input(r, n, round);
          comm.allreduce(std::span<float>(g));
          for (std::size_t i = 0; i < n; ++i) {
            const float want = static_cast<float>(1000 * P * (P - 1) / 2 + P * (static_cast<int>(i) + round));
            if (g[i] != want) ++wrong;
          }
          // And the other collectives after a failed one.
          std::vector<int> all(static_cast<std::size_t>(P));
          const int mine = r * 7 + round;
          comm.allgather(std::span<const int>(&mine, 1), std::span<int>(all));
          for (int q = 0; q < P; ++q)
            if (all[static_cast<std::size_t>(q)] != q * 7 + round) ++wrong;
          int root_value = r == round % P ? round : -1;
          comm.broadcast(std::span<int>(&root_value, 1), round % P);
          if (root_value != round) ++wrong;
        }
      },
      {.timeout = 30s});
  REQUIRE(other == 0);
  REQUIRE(wrong == 0);
  REQUIRE(mismatches == P * rounds);
}

TEST_CASE("ThreadComm: barrier on one rank against allreduce on the others raises on every rank",
          "[comm][thread]") {
  const int P = GENERATE(2, 3, 5);
  const int caller = GENERATE(0, 1);
  std::atomic<int> mismatches{0}, wrong{0};
  run_threads(
      P,
      [&](ThreadComm& comm) {
        for (int round = 0; round < 50; ++round) {
          std::vector<float> g(4, 1.f);
          try {
            if (comm.rank() == caller % P) comm.barrier();
            else comm.allreduce(std::span<float>(g));
          } catch (const mismatch_error& e) {
            if (std::string(e.what()).find("barrier") != std::string::npos) ++mismatches;
          }
          // Usable afterwards.
          std::vector<float> h(5, 1.f);
          comm.allreduce(std::span<float>(h));
          for (float x : h)
            if (x != static_cast<float>(P)) ++wrong;
          comm.barrier();
        }
      },
      {.timeout = 30s});
  REQUIRE(wrong == 0);
  REQUIRE(mismatches == 50 * P);
}

TEST_CASE("ThreadComm: an invalid argument on any rank raises invalid_argument on every rank", "[comm][thread]") {
  const int P = GENERATE(1, 2, 3, 4);
  std::atomic<int> invalid{0}, named{0}, wrong{0};
  run_threads(
      P,
      [&](ThreadComm& comm) {
        const int r = comm.rank();
        const int culprit = P - 1;
        // The message names the lowest rank that passed an invalid argument.
        auto expect_invalid = [&](auto&& call, int named_rank) {
          try {
            call();
          } catch (const invalid_argument& e) {
            ++invalid;
            if (std::string(e.what()).find("rank " + std::to_string(named_rank) + " passed") != std::string::npos)
              ++named;
          }
        };
        std::vector<float> g(6, 1.f);
        // Every rank passes reduce_op 7.
        expect_invalid([&] { comm.allreduce(std::span<float>(g), static_cast<reduce_op>(7)); }, 0);
        // Only the culprit does; the others pass a valid op.
        const auto op7 = r == culprit ? static_cast<reduce_op>(7) : reduce_op::max;
        const auto op_neg = r == culprit ? static_cast<reduce_op>(-1) : reduce_op::sum;
        expect_invalid([&] { comm.allreduce(std::span<float>(g), op7); }, culprit);
        expect_invalid([&] { comm.allreduce(std::span<float>(g), op_neg); }, culprit);
        // allgather with a wrong output size, broadcast with a root outside [0, P).
        std::vector<float> in(3, 1.f), out(static_cast<std::size_t>(3 * P + (r == culprit ? 1 : 0)));
        expect_invalid([&] { comm.allgather(std::span<const float>(in), std::span<float>(out)); }, culprit);
        expect_invalid([&] { comm.broadcast(std::span<float>(in), r == culprit ? P : 0); }, culprit);
        // Nothing moved, and the communicator stays usable.
        for (float x : g)
          if (x != 1.f) ++wrong;
        comm.allreduce(std::span<float>(g));
        for (float x : g)
          if (x != static_cast<float>(P)) ++wrong;
      },
      {.timeout = 30s});
  REQUIRE(wrong == 0);
  REQUIRE(invalid == 5 * P);
  REQUIRE(named == 5 * P);
}

TEST_CASE("run_threads rejects a rank count below 1 with commpact::invalid_argument", "[comm][thread]") {
  for (int P : {0, -1, -3, std::numeric_limits<int>::min()}) {
    bool ran = false;
    REQUIRE_THROWS_AS(run_threads(P, [&](ThreadComm&) { ran = true; }), invalid_argument);
    REQUIRE_THROWS_AS(ThreadComm::make_world(P), invalid_argument);
    REQUIRE(!ran);
  }
}

TEST_CASE("run_threads: when every rank fails for the same local reason, each rank raises that reason",
          "[comm][thread]") {
  // A ring exchange, then every rank throws its own invalid_argument. Rank 0 is late, so
  // the others finish first: they must not turn rank 0's (and its neighbour's) pending
  // but completable operations into peer notices, and run_threads must rethrow rank 0's.
  const int P = GENERATE(3, 4, 8);
  for (int rep = 0; rep < 5; ++rep) {
    std::atomic<int> own{0}, peer{0};
    try {
      run_threads(
          P,
          [&](ThreadComm& comm) {
            const int r = comm.rank();
            try {
              if (r == 0) std::this_thread::sleep_for(30ms);
              std::vector<std::byte> msg(16, std::byte{1}), buf;
              comm.send((r + 1) % P, msg);
              comm.recv((r + P - 1) % P, buf);
              throw invalid_argument("rank " + std::to_string(r) + ": k is above n");
            } catch (const peer_failure&) {
              ++peer;
              throw;
            } catch (const invalid_argument&) {
              ++own;
              throw;
            }
          },
          {.timeout = 20s});
      FAIL("run_threads returned although every rank threw");
    } catch (const peer_failure& e) {
      FAIL("run_threads rethrew a peer notice: " << e.what());
    } catch (const invalid_argument& e) {
      REQUIRE(std::string(e.what()) == "rank 0: k is above n");
    }
    REQUIRE(peer == 0);
    REQUIRE(own == P);
  }
}

TEST_CASE("ThreadComm's timeout must be positive and at most max_timeout (a longer one overflowed the deadline)",
          "[comm][thread][errors]") {
  for (const auto bad : {0ms, -1ms, max_timeout + 1ms, std::chrono::milliseconds::max()}) {
    CAPTURE(bad.count());
    REQUIRE_THROWS_MATCHES(run_threads(2, [](ThreadComm&) {}, {.timeout = bad}), invalid_argument,
                           Catch::Matchers::Message(
                               "commpact::ThreadComm: thread_options::timeout is " + std::to_string(bad.count()) +
                               " ms; it must be positive and at most 1000000000000 ms (commpact::max_timeout, about "
                               "31 years)."));
  }
  // The longest one waits as any other: a rank that never comes is still seen (its failure
  // ends the wait), and collectives complete.
  std::atomic<int> done{0};
  run_threads(3, [&](ThreadComm& comm) {
    std::vector<float> v{1.f};
    comm.allreduce(std::span<float>(v));
    RANK_REQUIRE_EQ(v[0], 3.f);
    comm.barrier();
    ++done;
  }, {.timeout = max_timeout});
  REQUIRE(done == 3);
  REQUIRE_THROWS_AS(run_threads(2, [](ThreadComm& comm) {
    if (comm.rank() == 0) throw std::runtime_error("rank 0 leaves");
    comm.barrier();  // ended by rank 0's failure, not by the 31-year deadline
  }, {.timeout = max_timeout}), std::runtime_error);
}
