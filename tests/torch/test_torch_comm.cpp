// TorchComm (commpact over a c10d::ProcessGroup, here ProcessGroupGloo over a FileStore
// on loopback), P = 1..4 ranks as threads of this process (gloo_world.hpp), through the
// same checks as ThreadComm and MpiComm: every collective and point to point against the
// serial reference (tests/common/collective_checks.hpp), known-size point to point,
// gTopK's tree and TopK bit for bit against the brute-force reference
// (tests/common/sparse_checks.hpp), bad input rejected alike on every rank, ranks that
// disagree, and failures that raise within the deadline instead of hanging.
#include <commpact/torch.hpp>  // the umbrella first: it compiles on its own

#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/known_size.hpp>
#include <commpact/compress/compressors/dense.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "../python/feedback_by_parameter.hpp"
#include "common/collective_checks.hpp"
#include "common/rank_checks.hpp"
#include "common/sparse_checks.hpp"
#include "torch/gloo_world.hpp"

// LibTorch's glog (stl_logging.h) declares operator<< for every std::vector, which makes
// Catch2 think vector<std::byte> is printable; give std::byte the missing operator (found
// by argument-dependent lookup from inside namespace std).
namespace std {
inline ostream& operator<<(ostream& os, byte b) { return os << to_integer<int>(b); }
}  // namespace std

using namespace commpact;
using namespace commpact_test;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

static_assert(Communicator<TorchComm> && PointToPoint<TorchComm>);
static_assert(AsyncCommunicator<TorchComm> && AsyncPointToPoint<TorchComm>);
static_assert(PointToPoint<CheckedComm<TorchComm>>);
static_assert(Compressor<gTopK<TreeComm<TorchComm>>> && Compressor<TopK<TorchComm>> && Compressor<Dense<TorchComm>>);

namespace {
double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

// Checks on the ranks' threads are RANK_REQUIREs (rank_checks.hpp): a failed one throws
// rank_check_failed, which run_gloo rethrows on the main thread unless a lower rank failed
// first (it rethrows the lowest rank's root cause). Where a test expects run_gloo to throw,
// REQUIRE_THROWS would take a failed check for the expected exception, or another rank's
// exception would hide it: such a test runs its ranks through note(fn), which keeps the
// first failed check's message, and requires first() == "" on the main thread.
class failed_checks {
 public:
  template <class F>
  auto note(F fn) {
    return [this, fn](TorchComm& comm) {
      try {
        fn(comm);
      } catch (const rank_check_failed& e) {
        std::lock_guard lock(m_);
        if (first_.empty()) first_ = e.what();
        throw;
      }
    };
  }
  std::string first() {
    std::lock_guard lock(m_);
    return first_;
  }

 private:
  std::mutex m_;
  std::string first_;
};
}  // namespace

TEST_CASE("TorchComm collectives and point to point match the serial reference, P = 1..4", "[torch][comm]") {
  for (int P = 1; P <= 4; ++P) {
    CAPTURE(P);
    std::atomic<int> ran{0};
    run_gloo(P, [&](TorchComm& comm) {
      RANK_REQUIRE_EQ(comm.size(), P);
      check_all_collectives(comm, 11u + P, /*rank_order_bitwise=*/false);
      // Gloo's sums are bit-identical on every rank (each element is reduced on one rank).
      auto f = rank_floats(99, comm.rank(), 100003);
      comm.allreduce(std::span<float>(f));
      require_identical_on_all_ranks(comm, std::span<const float>(f));
      ++ran;
    });
    REQUIRE(ran == P);
  }
}

TEST_CASE("TorchComm without its own check, and under CheckedComm, matches the reference", "[torch][comm]") {
  for (int P : {2, 3}) {
    run_gloo(P, [&](TorchComm& comm) { check_all_collectives(comm, 5u, false); }, {.verify_collectives = false});
    run_gloo(P, [&](TorchComm& comm) {
      CheckedComm<TorchComm> checked{comm};
      check_all_collectives(checked, 6u, false);
    }, {.verify_collectives = false});
  }
}

TEST_CASE("TorchComm allreduce over int32 and int64, sum, min and max", "[torch][comm]") {
  run_gloo(3, [&](TorchComm& comm) {
    const int P = comm.size(), r = comm.rank();
    std::vector<std::int32_t> s(1001), mn(1001);
    std::vector<std::int64_t> mx(1001);
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = mn[i] = static_cast<std::int32_t>((i * 7 + r * 13) % 50), mx[i] = s[i];
    comm.allreduce(std::span<std::int32_t>(s));
    comm.allreduce(std::span<std::int32_t>(mn), reduce_op::min);
    comm.allreduce(std::span<std::int64_t>(mx), reduce_op::max);
    for (std::size_t i = 0; i < s.size(); ++i) {
      std::int32_t sum = 0, lo = 100, hi = 0;
      for (int q = 0; q < P; ++q) {
        const auto v = static_cast<std::int32_t>((i * 7 + q * 13) % 50);
        sum += v, lo = std::min(lo, v), hi = std::max(hi, v);
      }
      RANK_REQUIRE_EQ(s[i], sum);
      RANK_REQUIRE_EQ(mn[i], lo);
      RANK_REQUIRE_EQ(mx[i], hi);
    }
  });
}

TEST_CASE("TorchComm known-size point to point: exchange, send_known/recv_known, irecv before isend", "[torch][p2p]") {
  for (int P : {2, 3, 4}) {
    run_gloo(P, [&](TorchComm& comm) {
      const int r = comm.rank(), next = (r + 1) % P, prev = (r + P - 1) % P;
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{300001}}) {
        auto out = rank_bytes(n, r, next, n);
        std::vector<std::byte> in(n);
        // A ring of exchanges would pair next/prev differently; pair r with r ^ 1.
        const int peer = r ^ 1;
        if (peer < P) {
          auto o = rank_bytes(n + 1, r, peer, n);
          exchange(comm, peer, std::span<const std::byte>(o), std::span<std::byte>(in));
          RANK_REQUIRE(in == rank_bytes(n + 1, peer, r, n));
        }
        send_known(comm, next, std::span<const std::byte>(out));
        recv_known(comm, prev, std::span<std::byte>(in));
        RANK_REQUIRE(in == rank_bytes(n, prev, r, n));
      }
      // Several irecvs posted before the matching sends, completed out of order.
      std::vector<std::byte> a(10), b(70000);
      auto ra = comm.irecv(prev, std::span<std::byte>(a));
      auto rb = comm.irecv(prev, std::span<std::byte>(b));
      auto ma = rank_bytes(1, r, next, 10), mb = rank_bytes(2, r, next, 70000);
      auto sa = comm.isend(next, std::span<const std::byte>(ma));
      auto sb = comm.isend(next, std::span<const std::byte>(mb));
      while (!rb.test()) {
      }
      ra.wait();
      sb.wait();
      sa.wait();
      RANK_REQUIRE(a == rank_bytes(1, prev, r, 10));
      RANK_REQUIRE(b == rank_bytes(2, prev, r, 70000));
      comm.flush();
      RANK_REQUIRE(comm.pending_sends() == 0);
    });
  }
}

TEST_CASE("TorchComm: gTopK's tree and TopK equal the serial references bit for bit, P = 1..4", "[torch][gtopk]") {
  for (int P = 1; P <= 4; ++P) {
    CAPTURE(P);
    REQUIRE_NOTHROW(run_gloo(P, [&](TorchComm& comm) {
      check_tree_union(comm);
      for (double density : {0.01, 0.3})
        for (int kind : {0, 1}) check_gtopk_reference(comm, 1u + P, 1000, density, 3, kind);
      check_topk_reference(comm, 2u + P, 1000, 0.05, 3, 0);
    }));
  }
}

TEST_CASE("TorchComm: bad compressor input raises on every rank and the communicator stays usable", "[torch][gtopk]") {
  using GT = gTopK<TreeComm<TorchComm>>;
  using TK = TopK<TorchComm>;
  for (int P : {2, 3}) {
    REQUIRE_NOTHROW(run_gloo(P, [&](TorchComm& comm) {
      check_bad_options<GT>(comm);
      check_k_above_n<GT>(comm);
      check_nonfinite<GT>(comm, P - 1, std::numeric_limits<float>::quiet_NaN());
      check_length_mismatch<GT>(comm);
      check_bad_options<TK>(comm);
      check_nonfinite<TK>(comm, 0, std::numeric_limits<float>::infinity());
      check_length_mismatch<TK>(comm);
    }));
  }
}

namespace {
// The DDP hooks' compressors by bucket (python/feedback_by_parameter.hpp): when buckets
// hold other parameters (DDP's rebuild), each new compressor starts from the residual and
// velocity its parameters had, in its own order, zeros for a parameter never seen; a
// bucket that did not change keeps its compressor. P = 2 ranks, momentum on.
template <class C>
void check_feedback_follows_parameters(TorchComm& comm) {
  using commpact_hooks::bucket_params;
  verdict v;
  const sparse_options opt{.density = 0.25, .momentum = 0.9f};
  commpact_hooks::bucket_compressors<C> bc;
  auto make = [&] { return std::make_unique<C>(comm, opt); };
  auto grad = [&](std::size_t n, int step) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i)
      g[i] = std::sin(1.7f * static_cast<float>(i + 1) + 0.9f * static_cast<float>(comm.rank() + 3 * step));
    return g;
  };
  // Step 0: parameters 1 to 4 (lengths 3, 5, 4, 6) in buckets {1, 2} and {3, 4}.
  const bucket_params old0{{1, 3, 3}, {2, 5, 5}}, old1{{3, 4, 4}, {4, 6, 6}};
  // id -> (residual, velocity)
  std::map<std::uintptr_t, std::pair<std::vector<float>, std::vector<float>>> had;
  for (const auto& [index, ps] : {std::pair{0, old0}, std::pair{1, old1}}) {
    auto g = grad(static_cast<std::size_t>(commpact_hooks::total_numel(ps)), 0);
    C& c = bc.get(index, ps, static_cast<std::int64_t>(g.size()), make);
    c.reduce(g);
    v.expect(&bc.get(index, ps, static_cast<std::int64_t>(g.size()), make) == &c, "bucket ", index,
             ": the same parameters got a new compressor");
    std::size_t off = 0;
    for (const auto& p : ps) {
      const auto n = static_cast<std::size_t>(p.numel);
      had[p.id] = {std::vector<float>(c.residual().begin() + off, c.residual().begin() + off + n),
                   std::vector<float>(c.velocity().begin() + off, c.velocity().begin() + off + n)};
      off += n;
    }
  }
  // The rebuild: {4, 1}, {2}, and {3, 5} with parameter 5 new.
  const bucket_params new0{{4, 6, 6}, {1, 3, 3}}, new1{{2, 5, 5}}, new2{{3, 4, 4}, {5, 2, 2}};
  for (const auto& [index, ps] : {std::pair{0, new0}, std::pair{1, new1}, std::pair{2, new2}}) {
    std::vector<float> want_r, want_v;
    for (const auto& p : ps) {
      const auto it = had.find(p.id);
      const std::vector<float> zeros(static_cast<std::size_t>(p.numel), 0.0f);
      want_r.insert(want_r.end(), it == had.end() ? zeros.begin() : it->second.first.begin(),
                    it == had.end() ? zeros.end() : it->second.first.end());
      want_v.insert(want_v.end(), it == had.end() ? zeros.begin() : it->second.second.begin(),
                    it == had.end() ? zeros.end() : it->second.second.end());
    }
    auto g = grad(want_r.size(), 1);
    C& c = bc.get(index, ps, static_cast<std::int64_t>(g.size()), make);
    v.expect(std::equal(c.residual().begin(), c.residual().end(), want_r.begin(), want_r.end()), "bucket ", index,
             ": the new compressor's residual is not its parameters' old one");
    v.expect(std::equal(c.velocity().begin(), c.velocity().end(), want_v.begin(), want_v.end()), "bucket ", index,
             ": the new compressor's velocity is not its parameters' old one");
    c.reduce(g);  // the seeded compressor steps (and agrees) like any other
    v.expect(c.steps() == 1, "bucket ", index, ": ", c.steps(), " steps");
  }
  v.expect(bc.kept() == 0, bc.kept(), " parameters' feedback kept for no bucket");
  settle(comm, v, "check_feedback_follows_parameters");
}
}  // namespace

TEST_CASE("The hooks' residual and velocity follow their parameters when DDP rebuilds its buckets",
          "[torch][hooks]") {
  REQUIRE_NOTHROW(run_gloo(2, [&](TorchComm& comm) {
    check_feedback_follows_parameters<gTopK<TreeComm<TorchComm>>>(comm);
    check_feedback_follows_parameters<TopK<TorchComm>>(comm);
  }));
}

TEST_CASE("TorchComm rejects bad peers, roots and sizes alike on every rank", "[torch][errors]") {
  for (int P : {2, 4}) {
    run_gloo(P, [&](TorchComm& comm) {
      const int r = comm.rank();
      std::vector<std::byte> buf;
      std::byte b[1]{};
      RANK_REQUIRE_THROWS_AS(comm.send(r, b), invalid_argument);
      RANK_REQUIRE_THROWS_AS(comm.send(P, b), invalid_argument);
      RANK_REQUIRE_THROWS_AS(comm.recv(-1, buf), invalid_argument);
      RANK_REQUIRE_THROWS_AS_WITH(comm.send(-2, b), std::exception, "peer -2", "another rank in [0, ");
      RANK_REQUIRE_FALSE(comm.failed());
      std::vector<float> v(5, float(r));
      RANK_REQUIRE_THROWS_AS_WITH(comm.broadcast(std::span<float>(v), P), std::exception, "root " + std::to_string(P),
                                  "outside [0, ");
      // A wrong output size on one rank: its own message there, invalid_argument naming it elsewhere.
      std::vector<float> in(3, 1.f), out(3 * P + (r == P - 1 ? 1 : 0));
      const auto t0 = clk::now();
      try {
        comm.allgather(std::span<const float>(in), std::span<float>(out));
        rank_check_fail(__FILE__, __LINE__, "allgather with a wrong output size did not throw");
      } catch (const invalid_argument& e) {  // not a rank_check_failed (a std::runtime_error, not a commpact::error)
        const std::string what = e.what();
        if (r == P - 1) RANK_REQUIRE(what.find("must hold size() * in.size()") != std::string::npos);
        else RANK_REQUIRE(what.find("rank " + std::to_string(P - 1) + " passed an invalid argument") != std::string::npos);
      }
      RANK_REQUIRE(seconds_since(t0) < 10);
      // Different sizes on one rank: mismatch_error on every rank, before data moves.
      std::vector<float> g(10 + (r == 0 ? 1 : 0));
      RANK_REQUIRE_THROWS_AS_WITH(comm.allreduce(std::span<float>(g)), std::exception, "ranks disagree on the size");
      // Different collectives at the same point.
      std::vector<float> h(4);
      if (r == 0) RANK_REQUIRE_THROWS_AS(comm.broadcast(std::span<float>(h), 0), mismatch_error);
      else RANK_REQUIRE_THROWS_AS(comm.allreduce(std::span<float>(h)), mismatch_error);
      // Still usable and exact afterwards.
      std::vector<std::int32_t> x(4, 1);
      comm.allreduce(std::span<std::int32_t>(x));
      RANK_REQUIRE(x == std::vector<std::int32_t>(4, P));
      RANK_REQUIRE_FALSE(comm.failed());
    });
  }
}

TEST_CASE("TorchComm: a message of the wrong size for irecv fails on every rank", "[torch][p2p][failure]") {
  std::atomic<int> mismatches{0}, failures{0};
  REQUIRE_THROWS(run_gloo(2, [&](TorchComm& comm) {
    std::vector<std::byte> msg(12, std::byte{1}), in(8);
    try {
      if (comm.rank() == 0) {
        comm.send(1, std::span<const std::byte>(msg));
        comm.barrier();  // rank 1 fails instead of joining: peer_failure here
      } else {
        comm.irecv(0, std::span<std::byte>(in)).wait();
      }
    } catch (const mismatch_error&) {
      ++mismatches;
      throw;
    } catch (const peer_failure&) {
      ++failures;
      throw;
    }
  }, {.timeout = 30s}));
  REQUIRE(mismatches == 1);
  REQUIRE(failures == 1);
}

TEST_CASE("TorchComm: a rank that aborts mid-collective makes the others raise peer_failure fast", "[torch][failure]") {
  for (int P : {2, 3, 4}) {
    std::atomic<int> peer_failures{0};
    std::atomic<double> slowest{0};
    failed_checks checks;
    const auto t0 = clk::now();
    REQUIRE_THROWS_WITH(run_gloo(P, checks.note([&](TorchComm& comm) {
      const TorchComm alias = comm;  // copies share the failure state
      std::vector<float> g(100000, 1.f);
      comm.allreduce(std::span<float>(g));
      RANK_REQUIRE_EQ(g[0], float(P));
      if (comm.rank() == P - 1) {
        std::this_thread::sleep_for(200ms);
        comm.abort("disk full while writing a checkpoint");
        RANK_REQUIRE(alias.failed());
        const auto t1 = clk::now();
        RANK_REQUIRE_THROWS_AS(comm.allreduce(std::span<float>(g)), peer_failure);
        RANK_REQUIRE_THROWS_AS(comm.barrier(), peer_failure);
        RANK_REQUIRE(seconds_since(t1) < 1.0);
        throw std::runtime_error("the aborting rank");
      }
      const auto t1 = clk::now();
      try {
        comm.allreduce(std::span<float>(g));
        rank_check_fail(__FILE__, __LINE__, "allreduce returned although a rank aborted");
      } catch (const peer_failure& e) {
        const double w = seconds_since(t1);
        if (w > slowest) slowest = w;
        const std::string what = e.what();
        RANK_REQUIRE(what.find("rank " + std::to_string(P - 1) + " aborted") != std::string::npos &&
                     what.find("disk full while writing a checkpoint") != std::string::npos);
        ++peer_failures;
      }
      RANK_REQUIRE(alias.failed());
      std::vector<std::byte> buf;
      RANK_REQUIRE_THROWS_AS(comm.broadcast(std::span<float>(g), 0), peer_failure);
      RANK_REQUIRE_THROWS_AS(comm.send(P - 1, std::span<const std::byte>()), peer_failure);
      RANK_REQUIRE_THROWS_AS(comm.recv(P - 1, buf), peer_failure);
    }), {.timeout = 30s}), Catch::Contains("the aborting rank"));
    REQUIRE(checks.first() == "");
    REQUIRE(peer_failures == P - 1);
    REQUIRE(slowest < 5.0);  // the notice, not the 30 s deadline, ended the wait
    REQUIRE(seconds_since(t0) < 20.0);
  }
}

TEST_CASE("TorchComm: an exception inside torch_guard reaches every rank, also one blocked in recv",
          "[torch][failure]") {
  std::atomic<int> peer_failures{0};
  failed_checks checks;
  REQUIRE_THROWS_WITH(run_gloo(3, checks.note([&](TorchComm& comm) {
    torch_guard(comm, [&] {
      try {
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(100ms);
          throw std::runtime_error("out of memory in backward");
        }
        std::vector<std::byte> buf;
        if (comm.rank() == 0) comm.recv(1, buf);  // rank 1 never sends
        else comm.barrier();
      } catch (const peer_failure& e) {
        RANK_REQUIRE(std::string(e.what()).find("out of memory in backward") != std::string::npos);
        ++peer_failures;
        throw;
      }
    });
  }), {.timeout = 30s}), Catch::Contains("out of memory in backward"));
  REQUIRE(checks.first() == "");
  REQUIRE(peer_failures == 2);
}

TEST_CASE("TorchComm: a rank that never joins makes the others time out at the deadline", "[torch][failure]") {
  std::atomic<int> timeouts{0}, failures{0};
  failed_checks checks;
  const auto t0 = clk::now();
  REQUIRE_THROWS(run_gloo(3, checks.note([&](TorchComm& comm) {
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(3s);  // late, past the others' deadline
      const auto t1 = clk::now();       // it learns that the group gave up from the notice
      RANK_REQUIRE_THROWS_AS_WITH(comm.barrier(), std::exception, "timed out after 1000 ms");
      RANK_REQUIRE(comm.failed());
      RANK_REQUIRE(seconds_since(t1) < 0.9);
      return;
    }
    try {
      std::vector<double> x(10, 1.0);
      comm.allreduce(std::span<double>(x));
    } catch (const timeout_error& e) {
      RANK_REQUIRE(std::string(e.what()).find("timed out after 1000 ms") != std::string::npos);
      ++timeouts;
      throw;
    } catch (const peer_failure&) {
      ++failures;  // the other waiting rank may see the first one's notice first
      throw;
    }
  }), {.timeout = 1s}));
  REQUIRE(checks.first() == "");
  REQUIRE(timeouts + failures == 2);
  REQUIRE(timeouts >= 1);
  REQUIRE(seconds_since(t0) < 30.0);
}

TEST_CASE("TorchComm: a send no peer receives makes the sender's next wait raise timeout_error with the advice",
          "[torch][failure]") {
  // Rank 1 neither receives nor sends. Rank 0's send reaper reaches its deadline 1 s
  // before rank 0's receive would: the receive is cut short and says that this rank timed
  // out (timeout_error, with the advice), as its own deadline would have; it used to raise
  // peer_failure "gave up waiting" with no advice (a DDP hook's error read that way at random).
  std::string what, later;
  double waited = -1;
  bool timed_out = false;
  REQUIRE_THROWS(run_gloo(2, [&](TorchComm& comm) {
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(4500ms);
      return;
    }
    comm.send(1, std::span<const std::byte>(rank_bytes(3, 0, 1, 4096)));
    std::this_thread::sleep_for(1s);
    const auto t1 = clk::now();
    try {
      std::vector<std::byte> buf;
      comm.recv(1, buf);
    } catch (const timeout_error& e) {
      what = e.what();
      timed_out = true;
      waited = seconds_since(t1);
    } catch (const std::exception& e) {
      what = e.what();
      throw;
    }
    try {  // every later call says so too
      comm.barrier();
    } catch (const timeout_error& e) {
      later = e.what();
      throw;
    }
  }, {.timeout = 2s}));
  INFO(later);
  CHECK_THAT(later, Catch::Contains("failed earlier (rank 0 timed out after 2000 ms") &&
                        Catch::Contains("raise torch_options::timeout"));
  INFO(what);
  REQUIRE(timed_out);
  CHECK_THAT(what, Catch::Contains("rank 0 timed out after 2000 ms") && Catch::Contains("was not received") &&
                       Catch::Contains("raise torch_options::timeout"));
  CHECK(waited < 1.5);  // the reaper's deadline ended the receive, not the receive's own (2 s)
}

TEST_CASE("TorchComm construction checks its arguments", "[torch][errors]") {
  REQUIRE_THROWS_AS(TorchComm(c10::intrusive_ptr<c10d::ProcessGroup>()), invalid_argument);
  run_gloo(1, [&](TorchComm& comm) {
    RANK_REQUIRE_THROWS_AS_WITH(TorchComm(comm.group(), {}, {.timeout = 0ms}), std::exception, "must be positive");
    // Longer than max_timeout: Gloo's waits (nanoseconds) overflowed and timed out at once.
    RANK_REQUIRE_THROWS_AS_WITH(TorchComm(comm.group(), {}, {.timeout = max_timeout + 1ms}), invalid_argument,
                                "at most 1000000000000 ms (commpact::max_timeout");
  });
}

TEST_CASE("TorchComm: Dense averages exactly over the process group", "[torch][dense]") {
  run_gloo(4, [&](TorchComm& comm) {
    Dense<TorchComm> dense{comm};
    std::vector<float> g(5000);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = float((i + 3 * comm.rank()) % 17);  // exact sums
    dense.reduce(std::span<float>(g));
    for (std::size_t i = 0; i < g.size(); i += 97) {
      float s = 0;
      for (int q = 0; q < 4; ++q) s += float((i + 3 * q) % 17);
      RANK_REQUIRE_EQ(g[i], s * (1.f / 4.f));
    }
  });
}

TEST_CASE("TorchComm: a communicator destroyed right after a send still delivers it", "[torch][p2p]") {
  // A hook's state freed after the last step (or a script that ends) must not cancel the
  // message the peer's last step waits for: the destructor delivers the sends in flight
  // first, within the deadline. (It used to abort them: the peer waited until its deadline.)
  const std::size_t n = std::size_t{1} << 20;
  run_gloo(2, [&](TorchComm& comm) {
    const int r = comm.rank();
    if (r == 0) {
      TorchComm mine{comm.group(), {}, {.timeout = 5s}};
      mine.send(1, std::span<const std::byte>(rank_bytes(7, 0, 1, n)));
    } else {
      TorchComm mine{comm.group(), {}, {.timeout = 5s}};
      std::this_thread::sleep_for(300ms);  // rank 0's communicator is gone by now
      std::vector<std::byte> got;
      mine.recv(0, got);
      RANK_REQUIRE(got == rank_bytes(7, 0, 1, n));
    }
    comm.barrier();
  });
}
