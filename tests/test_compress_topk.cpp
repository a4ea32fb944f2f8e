// TopK<ThreadComm> (Top-k S-SGD, all-gather of every rank's k entries) for P in
// {1, 2, 3, 4, 5, 7, 8, 16}: bit-exact against a brute-force reference, conservation, exact
// bytes by the ring allgather formula, bad input, save/load, workspace reuse. The checks
// live in tests/common/sparse_checks.hpp.
// Multi-rank cases run under CheckedComm<ThreadComm> (tests/common/checked_runs.hpp).
// commpact-long-test: under ASan+UBSan (clang++) 54 s at -O0, 11 s at -O1 (COMMPACT_LONG_TEST_FLAGS)
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/topk.hpp>

#include <atomic>
#include <chrono>

#include "common/checked_runs.hpp"
#include "common/sparse_checks.hpp"

using namespace commpact;
using namespace commpact_test;
using TK = TopK<checked_thread_comm>;  // every collective checked
static_assert(Compressor<TK>);

namespace {
const thread_options quick{std::chrono::seconds(30)};
}

TEST_CASE("TopK equals the brute-force reference bit for bit, conserves, and counts bytes", "[compress][topk]") {
  const int P = GENERATE(1, 2, 3, 4, 5, 7, 8, 16);
  const std::uint64_t seed = GENERATE(2u, 999u);
  const double density = GENERATE(0.01, 0.1);
  const int kind = GENERATE(0, 1, 2);
  CAPTURE(P, seed, density, kind);
  REQUIRE_NOTHROW(run_checked_threads(
      P, [&](checked_thread_comm& comm) { check_topk_reference(comm, seed, 1000, density, 3, kind); }, quick));
}

TEST_CASE("TopK rejects bad options, k > n, non-finite input and length mismatch on every rank", "[compress][topk]") {
  const int P = GENERATE(1, 2, 3, 5, 8);
  CAPTURE(P);
  std::atomic<int> done{0};
  REQUIRE_NOTHROW(run_checked_threads(
      P,
      [&](checked_thread_comm& comm) {
        check_bad_options<TK>(comm);
        check_k_above_n<TK>(comm);
        check_nonfinite<TK>(comm, P - 1, std::numeric_limits<float>::quiet_NaN());
        check_nonfinite<TK>(comm, 0, std::numeric_limits<float>::infinity());
        check_length_mismatch<TK>(comm);
        ++done;
      },
      quick));
  REQUIRE(done == P);
}

TEST_CASE("TopK save/load continues identically", "[compress][topk]") {
  const int P = GENERATE(1, 3, 4);
  const float momentum = GENERATE(0.0f, 0.9f);
  REQUIRE_NOTHROW(run_checked_threads(
      P, [&](checked_thread_comm& comm) { check_save_load<TK>(comm, {.density = 0.03, .momentum = momentum}, 700); }));
}

TEST_CASE("TopK allocates nothing after the first step, across warm-up changes of k", "[compress][topk]") {
  const int P = GENERATE(1, 2, 5);
  REQUIRE_NOTHROW(run_checked_threads(P, [&](checked_thread_comm& comm) {
    verdict v;
    TK t{comm, {.density = 0.01, .density_warmup = {{0, 0.05}, {3, 0.02}}}};
    std::vector<std::pair<const void*, std::size_t>> sig;
    const std::int64_t want_k[] = {250, 250, 250, 100, 100, 100};
    for (int s = 0; s < 6; ++s) {
      auto x = grad_of(41, s, comm.rank(), 5000);
      t.reduce(std::span<float>(x));
      v.expect(t.k() == want_k[s], "step ", s, ": k = ", t.k());
      v.expect(t.block_bytes() == 48 + 8 * static_cast<std::size_t>(want_k[s]), "block bytes ", t.block_bytes());
      if (s == 1) sig = t.workspace_signature();
      if (s > 1) v.expect(t.workspace_signature() == sig, "a workspace moved or grew at step ", s);
    }
    settle(comm, v, "workspace");
  }));
}
