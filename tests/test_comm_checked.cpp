// CheckedComm<ThreadComm>: the shared collective checks pass through the decorator;
// every kind of disagreement (size, operation, element type, root, reduce_op, allgather
// block, barrier against a collective) and every bad argument raises the same error on
// EVERY rank before data moves, and the communicator stays usable afterwards (many
// rounds, so a race after an error would show). The MPI twin is
// tests/mpi/test_comm_mpi_checked.cpp.
#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "common/collective_checks.hpp"
#include "common/rank_checks.hpp"

using namespace commpact;

static_assert(PointToPoint<CheckedComm<ThreadComm>>);
static_assert(PointToPoint<CheckedComm<CountingComm<ThreadComm>>>);
static_assert(diagnose_point_to_point<CheckedComm<ThreadComm>>());

TEST_CASE("CheckedComm<ThreadComm> passes every collective check", "[comm][checked]") {
  const int P = GENERATE(1, 2, 3, 4, 8);
  for (std::uint64_t seed : {5u, 99u}) {
    run_threads(P, [&](ThreadComm& t) {
      CheckedComm<ThreadComm> comm{t};
      commpact_test::check_all_collectives(comm, seed, /*rank_order_bitwise=*/true);
    });
  }
}

namespace {
// Runs `bad(comm)` on every rank; each rank records which exception it got. Then a good
// allreduce follows on every rank and must give the exact sum (the communicator
// survived). Returns how many ranks raised E.
template <class E>
int raised_everywhere(int P, const std::function<void(CheckedComm<ThreadComm>&)>& bad, int rounds = 20) {
  std::atomic<int> raised{0}, other{0};
  run_threads(P, [&](ThreadComm& t) {
    CheckedComm<ThreadComm> comm{t};
    for (int round = 0; round < rounds; ++round) {
      try {
        bad(comm);
        ++other;  // returned normally: a rank that disagreed was not told
      } catch (const E&) {
        ++raised;
      } catch (...) {
        ++other;
      }
      std::vector<std::int64_t> x(5, comm.rank() + round);
      comm.allreduce(std::span<std::int64_t>(x));
      std::int64_t want = 0;
      for (int q = 0; q < P; ++q) want += q + round;
      RANK_REQUIRE(x == std::vector<std::int64_t>(5, want));
    }
  });
  REQUIRE(other.load() == 0);
  return raised.load() / rounds;
}
}  // namespace

TEST_CASE("CheckedComm<ThreadComm>: every disagreement raises mismatch_error on every rank", "[comm][checked]") {
  const int P = GENERATE(2, 3, 8);
  using C = CheckedComm<ThreadComm>;
  SECTION("sizes (one rank passes one float fewer)") {
    REQUIRE(raised_everywhere<mismatch_error>(P, [](C& c) {
              std::vector<float> g(10 - (c.rank() == c.size() - 1 ? 1 : 0));
              c.allreduce(std::span<float>(g));
            }) == P);
  }
  SECTION("sizes far apart (10 against 10000 floats)") {
    REQUIRE(raised_everywhere<mismatch_error>(P, [](C& c) {
              std::vector<float> g(c.rank() == 0 ? 10 : 10000);
              c.allreduce(std::span<float>(g));
            }) == P);
  }
  SECTION("operations") {
    REQUIRE(raised_everywhere<mismatch_error>(P, [](C& c) {
              std::vector<float> g(4);
              if (c.rank() == 0) c.broadcast(std::span<float>(g), 0);
              else c.allreduce(std::span<float>(g));
            }) == P);
  }
  SECTION("barrier against allreduce") {
    REQUIRE(raised_everywhere<mismatch_error>(P, [](C& c) {
              std::vector<float> g(4);
              if (c.rank() == 0) c.barrier();
              else c.allreduce(std::span<float>(g));
            }) == P);
  }
  SECTION("element types of the same byte size") {
    REQUIRE(raised_everywhere<mismatch_error>(P, [](C& c) {
              std::vector<float> f(4);
              std::vector<std::int32_t> i(4);
              if (c.rank() == 0) c.allreduce(std::span<float>(f));
              else c.allreduce(std::span<std::int32_t>(i));
            }) == P);
  }
  SECTION("roots, reduce ops, allgather blocks") {
    REQUIRE(raised_everywhere<mismatch_error>(P, [](C& c) {
              std::vector<float> g(4);
              c.broadcast(std::span<float>(g), c.rank() == 0 ? 1 : 0);
            }) == P);
    REQUIRE(raised_everywhere<mismatch_error>(P, [](C& c) {
              std::vector<float> g(4);
              c.allreduce(std::span<float>(g), c.rank() == 0 ? reduce_op::max : reduce_op::sum);
            }) == P);
    REQUIRE(raised_everywhere<mismatch_error>(P, [](C& c) {
              std::vector<float> in(2 + c.rank()), out((2 + c.rank()) * c.size());
              c.allgather(std::span<const float>(in), std::span<float>(out));
            }) == P);
  }
}

TEST_CASE("CheckedComm<ThreadComm>: a bad argument on one rank raises invalid_argument on every rank",
          "[comm][checked]") {
  const int P = GENERATE(2, 5);
  using C = CheckedComm<ThreadComm>;
  // An invalid reduce_op value.
  REQUIRE(raised_everywhere<invalid_argument>(P, [](C& c) {
            std::vector<float> g(3, 1.f);
            c.allreduce(std::span<float>(g), c.rank() == 1 ? static_cast<reduce_op>(7) : reduce_op::sum);
          }) == P);
  // A wrong allgather output on the last rank: its own message there, the culprit named elsewhere.
  std::atomic<int> named{0};
  REQUIRE(raised_everywhere<invalid_argument>(P, [&](C& c) {
            std::vector<float> in(3), out(3 * c.size() + (c.rank() == c.size() - 1 ? 1 : 0));
            try {
              c.allgather(std::span<const float>(in), std::span<float>(out));
            } catch (const invalid_argument& e) {
              const std::string w = e.what();
              if (w.find(c.rank() == c.size() - 1 ? "must hold size() * in.size()"
                                                  : "rank " + std::to_string(c.size() - 1) + " passed an invalid") !=
                  std::string::npos)
                ++named;
              throw;
            }
          }, 1) == P);
  REQUIRE(named.load() == P);
  // A root out of range everywhere.
  REQUIRE(raised_everywhere<invalid_argument>(P, [](C& c) {
            std::vector<float> g(3);
            c.broadcast(std::span<float>(g), c.size());
          }) == P);
}

TEST_CASE("CheckedComm error messages name the values and the way out", "[comm][checked]") {
  std::vector<std::string> msgs(2);
  run_threads(2, [&](ThreadComm& t) {
    CheckedComm<ThreadComm> comm{t};
    std::vector<float> g(10 + comm.rank());
    try {
      comm.allreduce(std::span<float>(g));
    } catch (const mismatch_error& e) {
      msgs[comm.rank()] = e.what();
    }
  });
  for (const auto& m : msgs) {
    REQUIRE_THAT(m, Catch::Contains("ranks disagree on the size") && Catch::Contains("[40, 44]") &&
                        Catch::Contains("every rank must pass the same number of elements"));
  }
}
