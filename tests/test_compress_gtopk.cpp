// gTopK<TreeComm<ThreadComm>> for P in {1, 2, 3, 4, 5, 7, 8, 16}: bit-exact against the
// serial brute-force reference of the same tree semantics, conservation, exact byte
// counts, bad input, save/load, momentum and clipping, workspace reuse. The checks live
// in tests/common/sparse_checks.hpp and run under MPI too.
// Multi-rank cases run under CheckedComm<ThreadComm> (tests/common/checked_runs.hpp).
// commpact-long-test: under ASan+UBSan (clang++) 178 s at -O0, 44 s at -O1 (COMMPACT_LONG_TEST_FLAGS)
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/gtopk.hpp>

#include <atomic>
#include <chrono>

#include "common/checked_runs.hpp"
#include "common/sparse_checks.hpp"

using namespace commpact;
using namespace commpact_test;
using GT = gTopK<TreeComm<checked_thread_comm>>;  // every collective checked
static_assert(Compressor<GT>);
static_assert(Compressor<gTopK<TreeComm<CountingComm<ThreadComm>>>>);

namespace {
const thread_options quick{std::chrono::seconds(30)};
}

TEST_CASE("gTopK equals the serial tree reference bit for bit, conserves, and counts bytes exactly", "[compress][gtopk]") {
  const int P = GENERATE(1, 2, 3, 4, 5, 7, 8, 16);
  const std::uint64_t seed = GENERATE(1u, 77u, 4242u);
  const double density = GENERATE(0.01, 0.05, 0.3);
  const int kind = GENERATE(0, 1, 2);
  CAPTURE(P, seed, density, kind);
  REQUIRE_NOTHROW(run_checked_threads(
      P, [&](checked_thread_comm& comm) { check_gtopk_reference(comm, seed, 1000, density, 4, kind); }, quick));
}

TEST_CASE("gTopK's residual keeps values whose index re-entered G from another subtree", "[compress][gtopk]") {
  // The authors' rule (zero every local entry whose index is in G) would lose these
  // values; the reference counts them, and the bit-exact residual check keeps them.
  std::atomic<std::size_t> reentered{0};
  REQUIRE_NOTHROW(run_checked_threads(16, [&](checked_thread_comm& comm) {
    const auto r = check_gtopk_reference(comm, 99, 4000, 0.01, 3, 0);
    if (comm.rank() == 0) reentered = r;
  }));
  INFO("re-entered entries seen: " << reentered);
  REQUIRE(reentered > 0);
}

TEST_CASE("gTopK rejects bad options, k > n, non-finite input and length mismatch on every rank", "[compress][gtopk]") {
  const int P = GENERATE(1, 2, 3, 4, 5, 7, 8, 16);
  CAPTURE(P);
  std::atomic<int> done{0};
  REQUIRE_NOTHROW(run_checked_threads(
      P,
      [&](checked_thread_comm& comm) {
        check_bad_options<GT>(comm);
        check_k_above_n<GT>(comm);
        for (int bad = 0; bad < 3; ++bad) {
          check_nonfinite<GT>(comm, P - 1 - bad, std::numeric_limits<float>::quiet_NaN());
          check_nonfinite<GT>(comm, bad, -std::numeric_limits<float>::infinity());
        }
        check_length_mismatch<GT>(comm);
        ++done;
      },
      quick));
  REQUIRE(done == P);
}

TEST_CASE("gTopK: a sum that overflows to Inf in a merge is caught on every rank", "[compress][gtopk]") {
  const int P = GENERATE(2, 3, 4, 5, 8);
  std::atomic<int> raised{0};
  REQUIRE_NOTHROW(run_checked_threads(P, [&](checked_thread_comm& comm) {
    GT g{comm, {.k = 1}};
    std::vector<float> x(8, 0.0f);
    x[3] = 3e38f;  // finite on each rank, the merged sum is not
    if (throws_as<numeric_error>([&] { g.reduce(std::span<float>(x)); }) == 1) ++raised;
  }));
  REQUIRE(raised == P);
}

TEST_CASE("gTopK save/load continues identically", "[compress][gtopk]") {
  const int P = GENERATE(1, 3, 4, 7);
  const float momentum = GENERATE(0.0f, 0.9f);
  REQUIRE_NOTHROW(run_checked_threads(
      P, [&](checked_thread_comm& comm) { check_save_load<GT>(comm, {.density = 0.03, .momentum = momentum}, 700); }));
  // Loading a state saved by TopK is refused.
  auto comms = ThreadComm::make_world(1);
  TopK<ThreadComm> t{comms[0], {.density = 0.5}};
  std::vector<float> g(10, 1.0f);
  t.reduce(std::span<float>(g));
  std::vector<std::byte> st;
  t.save_state(st);
  GT g2{checked_thread_comm{comms[0]}};
  REQUIRE_THROWS_AS(g2.load_state(st), invalid_argument);
}

TEST_CASE("gTopK density warm-up changes k on schedule on every rank", "[compress][gtopk]") {
  const int P = GENERATE(1, 3, 4);
  REQUIRE_NOTHROW(run_checked_threads(P, [&](checked_thread_comm& comm) {
    verdict v;
    GT g{comm, {.density = 0.01, .density_warmup = {{1, 0.25}, {3, 0.05}}}};
    const std::int64_t want[] = {10, 250, 250, 50, 50};
    for (int s = 0; s < 5; ++s) {
      auto x = grad_of(8, s, comm.rank(), 1000);
      g.reduce(std::span<float>(x));
      v.expect(g.k() == want[s], "step ", s, ": k = ", g.k(), ", expected ", want[s]);
      v.expect(nnz(x) <= static_cast<std::size_t>(want[s]), "step ", s, ": nnz above k");
    }
    settle(comm, v, "warm-up");
  }));
}

TEST_CASE("gTopK momentum correction and clipping", "[compress][gtopk]") {
  SECTION("momentum: u = m u + g, v = v + u; delivered entries of both are zeroed; density 1 is exact") {
    REQUIRE_NOTHROW(run_checked_threads(2, [&](checked_thread_comm& comm) {
      verdict v;
      const float m = 0.5f;
      GT g{comm, {.density = 1.0, .momentum = m}};
      std::vector<float> u(4, 0.0f);
      for (int s = 0; s < 3; ++s) {
        std::vector<float> x(4), other(4);
        for (int i = 0; i < 4; ++i) {
          x[i] = static_cast<float>((s + 1) * (i + 1) * (comm.rank() + 1));
          other[i] = static_cast<float>((s + 1) * (i + 1) * (2 - comm.rank()));
        }
        // Every entry is delivered at density 1, so u and v restart from zero each step.
        std::vector<float> want(4);
        for (int i = 0; i < 4; ++i) want[i] = (x[i] + other[i]) / 2.0f;
        g.reduce(std::span<float>(x));
        v.expect(x == want, "momentum step ", s, " result");
        v.expect(nnz(g.velocity()) == 0 && nnz(g.residual()) == 0, "delivered entries not zeroed");
      }
      settle(comm, v, "momentum");
    }));
  }
  SECTION("momentum keeps the undelivered velocity") {
    auto comms = ThreadComm::make_world(1);
    GT g{checked_thread_comm{comms[0]}, {.k = 1, .momentum = 0.5f}};
    std::vector<float> x = {1.0f, 4.0f};
    g.reduce(std::span<float>(x));  // u = (1, 4), v = (1, 4); index 1 delivered
    REQUIRE(x == std::vector<float>{0.0f, 4.0f});
    REQUIRE(std::vector<float>(g.velocity().begin(), g.velocity().end()) == std::vector<float>{1.0f, 0.0f});
    x = {1.0f, 0.0f};
    g.reduce(std::span<float>(x));  // u = (0.5 + 1, 0), v = (1 + 1.5, 0) -> index 0 delivered
    REQUIRE(x == std::vector<float>{2.5f, 0.0f});
  }
  SECTION("local clipping scales the gradient norm to clip_norm / sqrt(P)") {
    const int P = GENERATE(1, 4);
    REQUIRE_NOTHROW(run_checked_threads(P, [&](checked_thread_comm& comm) {
      verdict v;
      GT g{comm, {.density = 1.0, .clip_norm = 0.5f}};
      std::vector<float> x(100, 0.0f);
      x[comm.rank()] = 10.0f;  // one entry per rank, norm 10, clipped to 0.5 / sqrt(P)
      g.reduce(std::span<float>(x));
      const float want = 0.5f / std::sqrt(static_cast<float>(P)) / static_cast<float>(P);
      for (int r = 0; r < P; ++r)
        v.expect(std::fabs(x[r] - want) <= 1e-6f * want, "clipped value ", x[r], " vs ", want);
      settle(comm, v, "clipping");
    }));
  }
}

TEST_CASE("gTopK allocates nothing after the first step", "[compress][gtopk]") {
  const int P = GENERATE(1, 2, 3, 5, 8);
  REQUIRE_NOTHROW(run_checked_threads(P, [&](checked_thread_comm& comm) {
    verdict v;
    GT g{comm, {.density = 0.02}};
    std::vector<std::pair<const void*, std::size_t>> sig;
    for (int s = 0; s < 6; ++s) {
      auto x = grad_of(31, s, comm.rank(), 5000, s % 3);
      g.reduce(std::span<float>(x));
      if (s == 1) sig = g.workspace_signature();
      if (s > 1) {
        const auto now = g.workspace_signature();
        for (std::size_t j = 0; j < sig.size(); ++j)
          v.expect(now[j] == sig[j], "buffer ", j, " moved or grew at step ", s, ": capacity ", sig[j].second, " -> ",
                   now[j].second);
      }
    }
    settle(comm, v, "workspace");
  }));
}
