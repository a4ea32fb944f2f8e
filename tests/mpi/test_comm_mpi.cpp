// MpiComm: every collective against the serial reference (shared with ThreadComm),
// identical results on every rank, CountingComm totals, argument errors and
// disagreement between ranks (raised on every rank, communicator still usable), and no
// allocation in steady state. Failure and deadline tests: test_comm_mpi_failure.cpp.
// This file replaces the global operator new/delete with malloc/free to count
// allocations; GCC then flags every inlined delete as "mismatched".
// commpact-standalone: it replaces the global operator new (COMMPACT_TESTS_UNITY)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <new>
#include <type_traits>

#include "common/collective_checks.hpp"

using namespace commpact;
using namespace std::chrono_literals;

static_assert(PointToPoint<MpiComm>);
static_assert(PointToPoint<CountingComm<MpiComm>>);
static_assert(std::is_copy_constructible_v<MpiComm>);

// ---- allocation counter (for the steady-state test) ---------------------------------
// Not under AddressSanitizer, which owns operator new itself (g++ says so with
// __SANITIZE_ADDRESS__, clang++ 14 only through __has_feature).
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COMMPACT_TEST_UNDER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(COMMPACT_TEST_UNDER_ASAN)
#define COMMPACT_TEST_COUNT_ALLOCS 0
#else
#define COMMPACT_TEST_COUNT_ALLOCS 1
namespace {
std::atomic<long> g_allocs{0};
std::atomic<std::size_t> g_largest_alloc{0};  // the largest single allocation (reset by tests)
}
void* operator new(std::size_t n) {
  ++g_allocs;
  for (std::size_t m = g_largest_alloc.load(); n > m && !g_largest_alloc.compare_exchange_weak(m, n);) {
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace {
// A failed REQUIRE on one rank must not leave the others waiting: the guard tells them.
template <class F>
void on_all_ranks(MpiComm& comm, F&& f) {
  mpi_guard(comm, std::forward<F>(f));
}
}  // namespace

TEST_CASE("MpiComm collectives match the serial reference", "[comm][mpi]") {
  // Shared memory (the default where every rank shares a node), and point to point.
  const std::size_t shm = GENERATE(mpi_options{}.shared_memory_max, std::size_t{0});
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 60s, .shared_memory_max = shm}};
  int P = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  REQUIRE(comm.size() == P);
  for (std::uint64_t seed : {11u, 12345u, 987654321u}) {
    on_all_ranks(comm, [&] { commpact_test::check_all_collectives(comm, seed, /*rank_order_bitwise=*/false); });
  }
}

TEST_CASE("MpiComm large allreduces (shared memory, the ring) match the reference, staged or not", "[comm][mpi]") {
  // The default takes shared memory (mpi/shared_memory.hpp); shared_memory_max = 0 and
  // the unchecked mode take the ring.
  const std::size_t shm = GENERATE(std::size_t{0}, mpi_options{}.shared_memory_max);
  MpiComm def{MPI_COMM_WORLD, {.timeout = 60s, .shared_memory_max = shm}};
  MpiComm bare{MPI_COMM_WORLD, {.timeout = 60s, .verify_collectives = false, .isolate_buffers = false}};
  // 16385 floats: just above the 64 KiB switch; 300001: chunks of unequal length.
  for (std::size_t n : {std::size_t{16385}, std::size_t{300001}}) {
    on_all_ranks(def, [&] { commpact_test::check_allreduce(def, 5 + n, n, /*rank_order_bitwise=*/false); });
    on_all_ranks(bare, [&] { commpact_test::check_allreduce(bare, 6 + n, n, /*rank_order_bitwise=*/false); });
  }
}

TEST_CASE("MpiComm without verification or staging still matches the reference", "[comm][mpi]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 60s, .verify_collectives = false, .isolate_buffers = false}};
  on_all_ranks(comm, [&] { commpact_test::check_all_collectives(comm, 77, /*rank_order_bitwise=*/false); });
}

TEMPLATE_TEST_CASE("MpiComm allreduce over every supported element type", "[comm][mpi]", float, double, std::int32_t,
                   std::int64_t, std::uint32_t, std::uint64_t) {
  MpiComm comm{MPI_COMM_WORLD};
  const int P = comm.size(), r = comm.rank();
  on_all_ranks(comm, [&] {
    const std::size_t n = GENERATE(1, 5, 4099);
    std::vector<TestType> s(n), mn(n), mx(n);
    for (std::size_t i = 0; i < n; ++i) s[i] = mn[i] = mx[i] = static_cast<TestType>((i * 7 + r * 13) % 50);
    comm.allreduce(std::span<TestType>(s), reduce_op::sum);
    comm.allreduce(std::span<TestType>(mn), reduce_op::min);
    comm.allreduce(std::span<TestType>(mx), reduce_op::max);
    for (std::size_t i = 0; i < n; ++i) {
      TestType sum = 0, lo = 100, hi = 0;
      for (int q = 0; q < P; ++q) {
        const auto v = static_cast<TestType>((i * 7 + q * 13) % 50);
        sum = static_cast<TestType>(sum + v);
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      REQUIRE(s[i] == sum);
      REQUIRE(mn[i] == lo);
      REQUIRE(mx[i] == hi);
    }
  });
}

TEST_CASE("MpiComm real-valued sums are bit-identical on every rank", "[comm][mpi]") {
  const std::size_t shm = GENERATE(std::size_t{0}, mpi_options{}.shared_memory_max);  // the ring, shared memory
  MpiComm comm{MPI_COMM_WORLD, {.shared_memory_max = shm}};
  on_all_ranks(comm, [&] {
    // Sizes on both sides of MpiComm's switch (recursive doubling up to 64 KiB, then a
    // ring over point to point), with chunks of unequal length (n not a multiple of P).
    for (std::size_t n : {3u, 1000u, 16383u, 16384u, 100000u, 262145u, 1u << 20, (1u << 20) + 3}) {
      auto f = commpact_test::rank_floats(n, comm.rank(), n);
      std::vector<double> d(f.begin(), f.end());
      for (auto& x : d) x = x * 1e-3 + 1.0 / (comm.rank() + 3);
      comm.allreduce(std::span<float>(f));
      comm.allreduce(std::span<double>(d));
      commpact_test::require_identical_on_all_ranks(comm, std::span<const float>(f));
      commpact_test::require_identical_on_all_ranks(comm, std::span<const double>(d));
    }
  });
}

TEST_CASE("MpiComm copies share one communicator and failure state", "[comm][mpi]") {
  MpiComm a{MPI_COMM_WORLD};
  MpiComm b = a;  // compressors hold communicators by value
  REQUIRE(b.native() == a.native());
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(a.native(), MPI_COMM_WORLD, &cmp);
  REQUIRE(cmp == MPI_CONGRUENT);  // a duplicate, not the user's communicator
  on_all_ranks(a, [&] {
    std::int64_t x = a.rank();
    b.allreduce(std::span<std::int64_t>(&x, 1), reduce_op::max);
    REQUIRE(x == a.size() - 1);
  });
  // Two independent MpiComms on the same parent do not mix traffic.
  MpiComm c{MPI_COMM_WORLD};
  on_all_ranks(a, [&] {
    if (a.size() < 2) return;
    const int next = (a.rank() + 1) % a.size(), prev = (a.rank() + a.size() - 1) % a.size();
    std::byte x{1}, y{2};
    a.send(next, std::span<const std::byte>(&x, 1));
    c.send(next, std::span<const std::byte>(&y, 1));
    std::vector<std::byte> got;
    c.recv(prev, got);
    REQUIRE(got == std::vector<std::byte>{std::byte{2}});
    a.recv(prev, got);
    REQUIRE(got == std::vector<std::byte>{std::byte{1}});
  });
}

TEST_CASE("CountingComm<MpiComm> totals equal the wire model and the message sizes", "[comm][mpi][counting]") {
  MpiComm world{MPI_COMM_WORLD};
  CountingComm<MpiComm> comm{world};
  const int P = comm.size(), r = comm.rank();
  mpi_guard(comm, [&](CountingComm<MpiComm>& c) {  // the guard works through the decorator too
    REQUIRE(&c == &comm);
    std::vector<float> g(1001, 1.f);
    comm.allreduce(std::span<float>(g));
    REQUIRE(g[0] == float(P));
    std::vector<double> blk(13, r), all(13 * P);
    comm.allgather(std::span<const double>(blk), std::span<double>(all));
    std::vector<std::byte> bc(77);
    comm.broadcast(std::span<std::byte>(bc), P - 1);
    comm.barrier();

    comm_stats expect;
    expect += wire::ring_allreduce(r, P, 1001, sizeof(float));
    expect += wire::ring_allgather(r, P, 13 * sizeof(double));
    expect += wire::binomial_broadcast(r, P, P - 1, 77);
    expect.collectives = 4;
    REQUIRE(comm.stats() == expect);

    // Point to point is counted exactly as passed.
    comm.reset_stats();
    comm_stats p2p;
    std::vector<std::byte> buf;
    if (P > 1) {
      const int next = (r + 1) % P, prev = (r + P - 1) % P;
      std::vector<std::byte> msg(100 + r, std::byte{7});
      comm.send(next, std::span<const std::byte>(msg));
      comm.recv(prev, buf);
      REQUIRE(buf.size() == std::size_t(100 + prev));
      p2p.bytes_sent += 100 + r;
      p2p.bytes_received += 100 + prev;
      p2p.messages_sent = p2p.messages_received = 1;
      const int peer = r ^ 1;
      if (peer < P) {
        comm.sendrecv(peer, std::span<const std::byte>(msg.data(), 3 + r), buf);
        REQUIRE(buf.size() == std::size_t(3 + peer));
        p2p.bytes_sent += 3 + r;
        p2p.bytes_received += 3 + peer;
        ++p2p.messages_sent;
        ++p2p.messages_received;
      }
    }
    p2p.point_to_point_bytes_sent = p2p.bytes_sent;
    REQUIRE(comm.stats() == p2p);
    // Over all ranks, what is sent is received (checked on the uncounted handle).
    std::int64_t tot[2] = {std::int64_t(comm.stats().bytes_sent), std::int64_t(comm.stats().bytes_received)};
    world.allreduce(std::span<std::int64_t>(tot, 2));
    REQUIRE(tot[0] == tot[1]);
  });
}

namespace {
bool world_handler_is_fatal() {
  MPI_Errhandler h = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &h);
  const bool fatal = h == MPI_ERRORS_ARE_FATAL;
  MPI_Errhandler_free(&h);
  return fatal;
}
}  // namespace

TEST_CASE("MpiComm construction checks its arguments and leaves the user's communicator alone", "[comm][mpi][errors]") {
  REQUIRE_THROWS_AS(MpiComm(MPI_COMM_NULL), invalid_argument);
  REQUIRE_THROWS_WITH(MpiComm(MPI_COMM_WORLD, {.timeout = 0ms}), Catch::Contains("must be positive"));
  // A longer timeout than max_timeout overflowed the deadlines (a wait timed out at once).
  REQUIRE_THROWS_WITH(MpiComm(MPI_COMM_WORLD, {.timeout = std::chrono::milliseconds::max()}),
                      Catch::Contains("at most 1000000000000 ms (commpact::max_timeout"));
  REQUIRE_THROWS_WITH(MpiComm(MPI_COMM_WORLD, {.setup_timeout = -5ms}),
                      Catch::Contains("mpi_options::setup_timeout") && Catch::Contains("must be positive"));
  REQUIRE(world_handler_is_fatal());  // the default, untouched by construction ...
  MpiComm comm{MPI_COMM_WORLD};
  MPI_Errhandler h = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(comm.native(), &h);
  REQUIRE(h == MPI_ERRORS_RETURN);  // ... while the duplicate returns errors
  MPI_Errhandler_free(&h);
  std::vector<double> x(100, 1.0);
  comm.allreduce(std::span<double>(x));
  comm.barrier();
  REQUIRE(world_handler_is_fatal());  // ... and by the waits, which switch it only while they poll
}

TEST_CASE("MpiComm rejects bad peers, roots and sizes with clear errors", "[comm][mpi][errors]") {
  MpiComm comm{MPI_COMM_WORLD};
  const int P = comm.size(), r = comm.rank();
  std::vector<std::byte> buf;
  std::byte b[1]{};
  // Point to point: local checks, nothing sent, the communicator stays usable.
  REQUIRE_THROWS_AS(comm.send(r, b), invalid_argument);  // self
  REQUIRE_THROWS_AS(comm.send(P, b), invalid_argument);  // out of range
  REQUIRE_THROWS_AS(comm.recv(-1, buf), invalid_argument);
  REQUIRE_THROWS_AS(comm.sendrecv(P + 3, b, buf), invalid_argument);
  REQUIRE_THROWS_WITH(comm.send(-2, b), Catch::Contains("peer -2") && Catch::Contains("another rank in [0, "));
  REQUIRE_FALSE(comm.failed());

  // The same bad root everywhere: invalid_argument on every rank, before data moves.
  std::vector<float> v(5, float(r));
  REQUIRE_THROWS_WITH(comm.broadcast(std::span<float>(v), P),
                      Catch::Contains("root " + std::to_string(P)) && Catch::Contains("outside [0, "));
  REQUIRE_THROWS_AS(comm.broadcast(std::span<float>(v), -1), invalid_argument);

  // A wrong output size on ONE rank: that rank gets its own message, every other rank
  // an invalid_argument naming it; nobody waits for the deadline.
  {
    std::vector<float> in(3, 1.f), out(3 * P + (r == P - 1 ? 1 : 0));
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comm.allgather(std::span<const float>(in), std::span<float>(out));
      FAIL("allgather with a wrong output size did not throw");
    } catch (const invalid_argument& e) {
      const std::string what = e.what();
      if (r == P - 1) REQUIRE_THAT(what, Catch::Contains("must hold size() * in.size()"));
      else REQUIRE_THAT(what, Catch::Contains("rank " + std::to_string(P - 1) + " passed an invalid argument"));
    }
    REQUIRE(std::chrono::steady_clock::now() - t0 < 10s);
  }
  // The communicator is still usable and consistent afterwards.
  on_all_ranks(comm, [&] {
    std::vector<std::int32_t> x(4, 1);
    comm.allreduce(std::span<std::int32_t>(x));
    REQUIRE(x == std::vector<std::int32_t>(4, P));
  });
}

TEST_CASE("MpiComm: ranks that disagree all get mismatch_error and the communicator survives", "[comm][mpi][errors]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 30s}};
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  auto count_everywhere = [&](bool threw) {
    std::int32_t n = threw ? 1 : 0;
    comm.allreduce(std::span<std::int32_t>(&n, 1));
    return n;
  };
  // Different sizes.
  {
    std::vector<float> g(10 + (r == P - 1 ? 1 : 0));
    bool threw = false;
    try {
      comm.allreduce(std::span<float>(g));
    } catch (const mismatch_error& e) {
      threw = true;
      REQUIRE_THAT(std::string(e.what()), Catch::Contains("ranks disagree on the size") && Catch::Contains("[40, 44]"));
    }
    REQUIRE(count_everywhere(threw) == P);
  }
  // Different collectives at the same point.
  {
    std::vector<float> g(4);
    bool threw = false;
    try {
      if (r == 0) comm.broadcast(std::span<float>(g), 0);
      else comm.allreduce(std::span<float>(g));
    } catch (const mismatch_error& e) {
      threw = true;
      REQUIRE_THAT(std::string(e.what()), Catch::Contains("same collectives"));
    }
    REQUIRE(count_everywhere(threw) == P);
  }
  // Different element types, same byte count.
  {
    std::vector<float> f(4);
    std::vector<std::int32_t> i(4);
    bool threw = false;
    try {
      if (r == 0) comm.allreduce(std::span<float>(f));
      else comm.allreduce(std::span<std::int32_t>(i));
    } catch (const mismatch_error&) {
      threw = true;
    }
    REQUIRE(count_everywhere(threw) == P);
  }
  // Different roots, different reduce ops, different allgather blocks.
  {
    std::vector<float> g(4);
    bool threw = false;
    try {
      comm.broadcast(std::span<float>(g), r == 0 ? 1 : 0);
    } catch (const mismatch_error& e) {
      threw = true;
      REQUIRE_THAT(std::string(e.what()), Catch::Contains("root"));
    }
    REQUIRE(count_everywhere(threw) == P);
    threw = false;
    try {
      comm.allreduce(std::span<float>(g), r == 0 ? reduce_op::max : reduce_op::sum);
    } catch (const mismatch_error&) {
      threw = true;
    }
    REQUIRE(count_everywhere(threw) == P);
    threw = false;
    std::vector<float> in(2 + r), out((2 + r) * P);
    try {
      comm.allgather(std::span<const float>(in), std::span<float>(out));
    } catch (const mismatch_error&) {
      threw = true;
    }
    REQUIRE(count_everywhere(threw) == P);
  }
  // A barrier against a collective.
  {
    std::vector<float> g(4);
    bool threw = false;
    try {
      if (r == 0) comm.barrier();
      else comm.allreduce(std::span<float>(g));
    } catch (const mismatch_error&) {
      threw = true;
    }
    REQUIRE(count_everywhere(threw) == P);
  }
  REQUIRE_FALSE(comm.failed());
}

// A checked allgather sends a block of up to 32 KiB inside its signature message (a held
// gather, P <= 8) and a larger one after the check (by pieces of 64 KiB above 128 KiB):
// a check that fails must leave `out` untouched on every rank, no message in flight and
// the communicator usable, against every other call, for blocks inside the message, of a
// few pieces and of many.
TEST_CASE("MpiComm: a held allgather that fails its check writes nothing and leaves nothing behind",
          "[comm][mpi][errors]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 30s}};
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  // Floats per rank: inside the signature message (eager, and rendezvous within the first
  // fragment; 8160 floats is the most, so pattern 0's 8161 goes apart), three pieces
  // (more than the two receives in flight per peer), 19 pieces.
  static_assert(8160 * sizeof(float) == detail::mpi_inline_gather_block_max);
  for (const std::size_t block :
       {std::size_t{100}, std::size_t{6000}, std::size_t{8160}, std::size_t{40000}, std::size_t{300000}}) {
    for (int pattern = 0; pattern < 8; ++pattern) {
      // 0: the last rank's block is one float longer; 1: the last rank calls allreduce
      // on as many bytes; 2: rank 0 calls barrier; 3: the last rank's output is too
      // small (invalid_argument on every rank); 4: only rank 0 passes an empty block;
      // 5: the last rank's block is 20 pieces longer; 6: rank 0's block is one float
      // (inside its signature message, however large its peers' blocks are); 7: the last rank calls
      // broadcast on as many bytes.
      const bool odd = (pattern == 2 || pattern == 4 || pattern == 6) ? r == 0 : r == P - 1;
      const std::size_t n = !odd               ? block
                            : pattern == 0     ? block + 1
                            : pattern == 4     ? 0
                            : pattern == 5     ? block + 20 * 16384
                            : pattern == 6     ? 1
                                               : block;
      std::vector<float> in(n, float(r + 1)), out(n * static_cast<std::size_t>(P) - (pattern == 3 && odd), -7.f);
      int got = 0;
      try {
        if (pattern == 1 && odd) comm.allreduce(std::span<float>(in));
        else if (pattern == 2 && odd) comm.barrier();
        else if (pattern == 7 && odd) comm.broadcast(std::span<float>(in), 0);
        else comm.allgather(std::span<const float>(in), std::span<float>(out));
      } catch (const mismatch_error&) {
        got = 1;
      } catch (const invalid_argument&) {
        got = 2;
      }
      INFO("block " << block << ", pattern " << pattern << ", rank " << r);
      REQUIRE(got == (pattern == 3 ? 2 : 1));
      REQUIRE(std::all_of(out.begin(), out.end(), [](float x) { return x == -7.f; }));
      REQUIRE(std::all_of(in.begin(), in.end(), [&](float x) { return x == float(r + 1); }));
      // Nothing is left in flight: an agreeing allgather, blocking and nonblocking, is
      // exact in every element.
      std::vector<float> a(block), b(block * static_cast<std::size_t>(P));
      for (std::size_t i = 0; i < block; ++i) a[i] = float(r * 1000000 + static_cast<int>(i));
      auto exact = [&] {
        for (int q = 0; q < P; ++q)
          for (std::size_t i = 0; i < block; ++i)
            if (b[static_cast<std::size_t>(q) * block + i] != float(q * 1000000 + static_cast<int>(i))) return false;
        return true;
      };
      comm.allgather(std::span<const float>(a), std::span<float>(b));
      REQUIRE(exact());
      std::fill(b.begin(), b.end(), 0.f);
      comm.iallgather(std::span<const float>(a), std::span<float>(b)).wait();
      REQUIRE(exact());
    }
  }
  REQUIRE_FALSE(comm.failed());
}

TEST_CASE("MpiComm steady state does not allocate", "[comm][mpi]") {
  MpiComm comm{MPI_COMM_WORLD};
  const int P = comm.size(), r = comm.rank();
  on_all_ranks(comm, [&] {
    std::vector<float> g(5000, 1.f), big(40000, 1.f);  // 20 KB: recursive doubling; 160 KB: the ring
    std::vector<std::byte> msg(3000, std::byte{1}), buf;
    buf.reserve(4000);
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    auto step = [&] {
      comm.allreduce(std::span<float>(g), reduce_op::max);
      comm.allreduce(std::span<float>(big), reduce_op::max);
      comm.iallreduce(std::span<float>(big), reduce_op::min).wait();
      if (P > 1) {
        comm.send(next, std::span<const std::byte>(msg));
        comm.send(next, std::span<const std::byte>(msg.data(), 100));
        comm.recv(prev, buf);
        comm.recv(prev, buf);
      }
      comm.barrier();
      comm.flush();  // bound the sends in flight, so the warm pool covers them
    };
    for (int i = 0; i < 5; ++i) step();  // warm up: staging and the send pool grow here
    comm.flush();
    // The send pool holds one buffer per send in flight at once. How many were in
    // flight during the warm-up depends on timing (an eager send may complete, and its
    // buffer be reused, before the next send), so the pool may still gain its second
    // buffer, or grow one to the larger size, later: at most 4 allocations in all,
    // however many steps run. Anything per step would show up as >= 200.
#if COMMPACT_TEST_COUNT_ALLOCS
    const long before = g_allocs.load();
    for (int i = 0; i < 200; ++i) step();
    const long after = g_allocs.load();
    REQUIRE(after - before <= 4);
#else
    for (int i = 0; i < 200; ++i) step();
#endif
    if (P > 1) REQUIRE(buf.size() == 100);
  });
  comm.flush();
  REQUIRE(comm.pending_sends() == 0);
}

TEST_CASE("A checked allgather of blocks inside the signature messages allocates no piece slots",
          "[comm][mpi]") {
  // The piece slots (mpi_gather_depth pieces per peer) are for blocks that travel by
  // pieces; a block of up to mpi_inline_gather_block_max bytes comes inside the
  // signature message and needs none of them.
  MpiComm comm{MPI_COMM_WORLD};
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  on_all_ranks(comm, [&] {
    std::vector<std::byte> in(1000, std::byte(r)), out(1000 * static_cast<std::size_t>(P));
#if COMMPACT_TEST_COUNT_ALLOCS
    const std::size_t slots_bytes =
        static_cast<std::size_t>((P - 1) * detail::mpi_gather_depth) * detail::mpi_gather_piece_bytes;
    g_largest_alloc = 0;
#endif
    comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out));
#if COMMPACT_TEST_COUNT_ALLOCS
    const std::size_t largest = g_largest_alloc.load();
    INFO("largest allocation " << largest << " bytes; the piece slots would take " << slots_bytes);
    REQUIRE(largest < slots_bytes);
#endif
    for (int q = 0; q < P; ++q) REQUIRE(out[1000 * static_cast<std::size_t>(q) + 999] == std::byte(q));
  });
}

TEST_CASE("MpiComm send does not wait for the receiver", "[comm][mpi]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 30s}};
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  on_all_ranks(comm, [&] {
    // Large (rendezvous-sized) messages sent before the peer posts any receive, with a
    // barrier in between: a send that waited for its receiver would hang here.
    std::vector<std::byte> big(1 << 20, std::byte(r)), buf;
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    comm.send(next, std::span<const std::byte>(big));
    comm.send(next, std::span<const std::byte>(big.data(), 10));
    comm.barrier();
    comm.recv(prev, buf);
    REQUIRE(buf.size() == big.size());
    REQUIRE(buf[12345] == std::byte(prev));
    comm.recv(prev, buf);
    REQUIRE(buf.size() == 10);
    comm.flush();
    REQUIRE(comm.pending_sends() == 0);
  });
}

TEMPLATE_TEST_CASE("MpiComm integer sums wrap like MPI_SUM on both paths", "[comm][mpi]", std::int32_t, std::int64_t,
                   std::uint32_t) {
  MpiComm comm{MPI_COMM_WORLD};
  const int P = comm.size(), r = comm.rank();
  using U = std::make_unsigned_t<TestType>;
  on_all_ranks(comm, [&] {
    // 5 elements: recursive doubling over point to point; 300000: the ring (blocking)
    // and MPI_Iallreduce (nonblocking).
    for (std::size_t n : {std::size_t{5}, std::size_t{300000}})
     for (bool nonblocking : {false, true}) {
      auto value = [](std::size_t i, int q) {
        return static_cast<TestType>(std::numeric_limits<TestType>::max() - static_cast<TestType>(i % 7 + q));
      };
      std::vector<TestType> x(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = value(i, r);
      if (nonblocking) comm.iallreduce(std::span<TestType>(x)).wait();
      else comm.allreduce(std::span<TestType>(x));
      for (std::size_t i = 0; i < n; i += 997) {
        U want = 0;
        for (int q = 0; q < P; ++q) want = static_cast<U>(want + static_cast<U>(value(i, q)));
        REQUIRE(static_cast<U>(x[i]) == want);
      }
    }
  });
}

TEST_CASE("MpiComm min and max of signed zeros give the same bits on every rank", "[comm][mpi]") {
  MpiComm comm{MPI_COMM_WORLD};
  const int r = comm.rank();
  on_all_ranks(comm, [&] {
    // Recursive doubling, then the ring (blocking) and MPI_Iallreduce (nonblocking).
    for (std::size_t n : {std::size_t{9}, std::size_t{300000}, std::size_t{300001}}) {
      std::vector<float> mn(n), mx(n);
      for (std::size_t i = 0; i < n; ++i) mn[i] = mx[i] = ((i + static_cast<std::size_t>(r)) % 2) ? 0.f : -0.f;
      if (n % 2) {
        comm.iallreduce(std::span<float>(mn), reduce_op::min).wait();
        comm.iallreduce(std::span<float>(mx), reduce_op::max).wait();
      } else {
        comm.allreduce(std::span<float>(mn), reduce_op::min);
        comm.allreduce(std::span<float>(mx), reduce_op::max);
      }
      commpact_test::require_identical_on_all_ranks(comm, std::span<const float>(mn));
      commpact_test::require_identical_on_all_ranks(comm, std::span<const float>(mx));
      for (std::size_t i = 0; i < n; ++i) REQUIRE((mn[i] == 0.f && mx[i] == 0.f));
    }
  });
}

TEST_CASE("MpiComm sendrecv delivers every byte whichever form the peer receives with", "[comm][mpi]") {
  MpiComm def{MPI_COMM_WORLD, {.timeout = 60s}};
  MpiComm bare{MPI_COMM_WORLD, {.timeout = 60s, .verify_collectives = false, .isolate_buffers = false}};
  const int P = def.size(), r = def.rank(), peer = r ^ 1;
  const bool paired = peer < P;  // an odd last rank has no partner
  // The bytes rank `from` sends in round k: a pattern no other (rank, round) repeats.
  auto fill = [](std::vector<std::byte>& v, std::size_t n, int from, int k) {
    v.resize(n);
    std::uint32_t x = 0x9e3779b9u * static_cast<std::uint32_t>(from * 131 + k + 1);
    for (auto& b : v) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      b = static_cast<std::byte>(x >> 24);
    }
  };
  // Sizes on both sides of the eager limit, different on the two ranks; the receive
  // buffer is reused across rounds, growing and shrinking.
  const std::size_t sizes[] = {0, 1, 4096 + 7, (1u << 20) + 3, 200000, 64u << 10, 12};
  for (MpiComm* c : {&def, &bare}) {
    on_all_ranks(*c, [&] {
      std::vector<std::byte> msg, buf, want, got;
      for (int form = 0; form < 3 && paired; ++form) {
        for (int k = 0; k < int(std::size(sizes)); ++k) {
          const std::size_t mine = sizes[k] + std::size_t(r % 2) * 5, theirs = sizes[k] + std::size_t(peer % 2) * 5;
          fill(msg, mine, r, k + 10 * form);
          const bool lower = r < peer;
          if (form == 0 || lower) {
            c->sendrecv(peer, std::span<const std::byte>(msg), buf);
          } else if (form == 1) {  // the peer: send() then recv()
            c->send(peer, std::span<const std::byte>(msg));
            c->recv(peer, buf);
          } else {  // the peer: irecv() of the known size, then isend()
            buf.resize(theirs);
            auto rq = c->irecv(peer, std::span<std::byte>(buf));
            auto sq = c->isend(peer, std::span<const std::byte>(msg));
            rq.wait();
            sq.wait();
          }
          // msg is free once the exchange returned (the peer has taken it): scribbling
          // on it must not change what the peer got.
          std::fill(msg.begin(), msg.end(), std::byte{0xEE});
          fill(want, theirs, peer, k + 10 * form);
          REQUIRE(buf.size() == theirs);
          REQUIRE(buf == want);
        }
      }
      c->flush();
      // Both ranks of every pair agree they finished (a late byte would still be in flight).
      std::int64_t pend = static_cast<std::int64_t>(c->pending_sends());
      c->allreduce(std::span<std::int64_t>(&pend, 1), reduce_op::max);
      REQUIRE(pend == 0);
    });
  }
}
