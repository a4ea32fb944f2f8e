// ThreadComm's nonblocking forms: collectives in flight keep their
// order against blocking ones, errors reach every rank through the handles, known-size
// receives match messages in the order they were started whatever order they are waited
// in, a wrong size fails loudly, a receive nobody answers times out, an abort reaches a
// rank waiting on a handle, and a rank that returns with operations in flight completes
// them first. Results are recorded per rank and asserted after run_threads.
#include <commpact/comm/thread_comm.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

using namespace commpact;
using namespace std::chrono_literals;

static_assert(AsyncPointToPoint<ThreadComm>);

namespace {
std::vector<float> ramp(int rank, std::size_t n, int salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((rank + 1) * 1000 + static_cast<int>(i % 997) + salt);
  return v;
}
std::vector<float> ramp_sum(int P, std::size_t n, int salt) {
  std::vector<float> s(n, 0.f);
  for (int r = 0; r < P; ++r) {
    auto v = ramp(r, n, salt);
    for (std::size_t i = 0; i < n; ++i) s[i] += v[i];
  }
  return s;
}
}  // namespace

TEST_CASE("ThreadComm: nonblocking and blocking collectives interleave in start order", "[comm][thread][async]") {
  const int P = GENERATE(1, 2, 3, 5);
  const std::size_t n = GENERATE(std::size_t{1}, std::size_t{4099});
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const int r = comm.rank();
    auto a = ramp(r, n, 1), b = ramp(r, n, 2), c = ramp(r, n, 3);
    std::vector<float> gathered(n * P);
    auto ha = comm.iallreduce(std::span<float>(a));
    auto hg = comm.iallgather(std::span<const float>(c), std::span<float>(gathered));
    comm.allreduce(std::span<float>(b));  // blocking: runs after a and the gather on every rank
    // b is complete here, so the two started before it are too.
    const bool done_before = ha.test() && hg.test();
    auto hb = comm.ibroadcast(std::span<float>(c), P - 1);
    hb.wait();
    bool good = done_before && a == ramp_sum(P, n, 1) && b == ramp_sum(P, n, 2) && c == ramp(P - 1, n, 3);
    for (int q = 0; q < P; ++q) good = good && std::equal(gathered.begin() + q * n, gathered.begin() + (q + 1) * n,
                                                          ramp(q, n, 3).begin());
    ok[r] = good;
  });
  for (int r = 0; r < P; ++r) REQUIRE(ok[r] == 1);
}

TEST_CASE("ThreadComm: a nonblocking collective whose ranks disagree raises on every rank, then works",
          "[comm][thread][async]") {
  const int P = 3;
  std::vector<int> mismatched(P, 0), retried(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const int r = comm.rank();
    std::vector<float> v(r == 1 ? 10 : 10000, 1.f);
    auto h = comm.iallreduce(std::span<float>(v));
    try {
      h.wait();
    } catch (const mismatch_error&) {
      mismatched[r] = 1;
    }
    std::vector<float> w(64, 1.f);
    comm.iallreduce(std::span<float>(w)).wait();
    retried[r] = std::all_of(w.begin(), w.end(), [&](float x) { return x == static_cast<float>(P); });
  });
  for (int r = 0; r < P; ++r) {
    REQUIRE(mismatched[r] == 1);
    REQUIRE(retried[r] == 1);
  }
}

TEST_CASE("ThreadComm: known-size receives match messages in start order, waited in any order",
          "[comm][thread][async]") {
  const int P = GENERATE(2, 4);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const int r = comm.rank(), to = (r + 1) % P, from = (r + P - 1) % P;
    constexpr int kMsgs = 6;
    std::vector<std::vector<std::byte>> in(kMsgs);
    std::vector<ThreadComm::recv_request> rq;
    for (int m = 0; m < kMsgs; ++m) {
      in[m].resize(static_cast<std::size_t>(m * 37 + 1));
      // Messages 0..2 are received as nonblocking, then one blocking, then nonblocking.
      if (m != 3) rq.push_back(comm.irecv(from, in[m]));
      if (m == 2) {
        for (int k = 0; k < kMsgs; ++k) {
          std::vector<std::byte> out(static_cast<std::size_t>(k * 37 + 1), static_cast<std::byte>(16 * r + k));
          auto hs = comm.isend(to, out);
          hs.wait();
        }
      }
      if (m == 3) {
        std::vector<std::byte> blocking;
        comm.recv(from, blocking);
        in[m] = blocking;
      }
    }
    // Wait in reverse order, some through test().
    for (auto it = rq.rbegin(); it != rq.rend(); ++it) {
      if ((it - rq.rbegin()) % 2 == 0) {
        while (!it->test()) std::this_thread::yield();
      } else {
        it->wait();
      }
    }
    bool good = true;
    for (int m = 0; m < kMsgs; ++m) {
      good = good && in[m].size() == static_cast<std::size_t>(m * 37 + 1);
      for (auto b : in[m]) good = good && b == static_cast<std::byte>(16 * from + m);
    }
    ok[r] = good;
  });
  for (int r = 0; r < P; ++r) REQUIRE(ok[r] == 1);
}

TEST_CASE("ThreadComm: a message of the wrong size fails the receive and reaches the sender",
          "[comm][thread][async]") {
  std::string receiver, sender;
  REQUIRE_THROWS(run_threads(2, [&](ThreadComm& comm) {
    if (comm.rank() == 0) {
      std::vector<std::byte> msg(12);
      comm.isend(1, msg).wait();
      std::vector<float> x(4, 1.f);
      try {
        comm.allreduce(std::span<float>(x));  // rank 1 failed instead of joining
      } catch (const peer_failure& e) {
        sender = e.what();
        throw;
      }
    } else {
      std::vector<std::byte> buf(16);
      try {
        comm.irecv(0, buf).wait();
      } catch (const mismatch_error& e) {
        receiver = e.what();
        throw;
      }
    }
  }));
  REQUIRE(receiver.find("expected 16 bytes from rank 0 and received 12") != std::string::npos);
  REQUIRE(sender.find("expected 16 bytes") != std::string::npos);
}

TEST_CASE("ThreadComm: a receive nobody answers times out through test() and wait()", "[comm][thread][async]") {
  const bool poll = GENERATE(true, false);
  std::atomic<int> timed_out{0}, settled{0};
  std::chrono::steady_clock::duration took{};
  REQUIRE_THROWS(run_threads(
      2,
      [&](ThreadComm& comm) {
        if (comm.rank() == 1) {  // stays in the world, sends nothing, until rank 0 raised (a
          // sleep would not order it: a late start of rank 0 let this rank leave first)
          const auto cap = std::chrono::steady_clock::now() + 20s;
          while (settled == 0 && std::chrono::steady_clock::now() < cap) std::this_thread::sleep_for(1ms);
          return;
        }
        std::vector<std::byte> buf(8);
        const auto t0 = std::chrono::steady_clock::now();
        auto h = comm.irecv(1, buf);
        try {
          if (poll) {
            while (!h.test()) std::this_thread::sleep_for(1ms);
          } else {
            h.wait();
          }
        } catch (const timeout_error&) {
          ++timed_out;
          took = std::chrono::steady_clock::now() - t0;
          ++settled;
          throw;
        } catch (...) {
          ++settled;
          throw;
        }
      },
      {.timeout = 150ms}));
  REQUIRE(timed_out == 1);
  REQUIRE(took < 5s);
}

TEST_CASE("ThreadComm: an abort reaches a rank waiting on a nonblocking collective", "[comm][thread][async]") {
  std::string seen;
  REQUIRE_THROWS(run_threads(
      2,
      [&](ThreadComm& comm) {
        if (comm.rank() == 0) {
          std::this_thread::sleep_for(50ms);
          comm.abort("rank 0 stops");
          return;
        }
        std::vector<float> v(100, 1.f);
        auto h = comm.iallreduce(std::span<float>(v));
        try {
          h.wait();
        } catch (const peer_failure& e) {
          seen = e.what();
          throw;
        }
      },
      {.timeout = 30s}));
  REQUIRE(seen.find("rank 0 stops") != std::string::npos);
}

TEST_CASE("ThreadComm: a rank that returns with collectives in flight completes them first",
          "[comm][thread][async]") {
  const int P = 4;
  std::vector<std::vector<float>> results(P);
  std::vector<std::vector<float>> kept(P);  // rank 0's buffer must outlive its function
  for (auto& k : kept) k.assign(513, 0.f);
  run_threads(P, [&](ThreadComm& comm) {
    const int r = comm.rank();
    kept[r] = ramp(r, 513, 7);
    if (r == 0) {
      auto h = comm.iallreduce(std::span<float>(kept[r]));
      (void)h.pending();
      // The handle is dropped here; its destructor waits, and leave() waits for the worker.
      return;
    }
    comm.allreduce(std::span<float>(kept[r]));
    results[r] = kept[r];
  });
  const auto ref = ramp_sum(P, 513, 7);
  REQUIRE(kept[0] == ref);
  for (int r = 1; r < P; ++r) REQUIRE(results[r] == ref);
}
