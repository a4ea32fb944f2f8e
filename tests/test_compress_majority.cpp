// signSGD with majority vote and Signum (MajorityVote<C>) for P = 1..8: every rank gets
// the reference s * sign(sum of signs) bit for bit (ties give 0), bytes through
// CountingComm equal (P - 1)(48 + 4 + ceil(n/8) rounded up to 4), NaN on one rank
// reaches every rank, and the state round-trips.
// Multi-rank cases run under CheckedComm<ThreadComm> (tests/common/checked_runs.hpp).
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/majority.hpp>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/checked_runs.hpp"

using namespace commpact;
static_assert(Compressor<MajorityVote<commpact_test::checked_thread_comm>>);

namespace {
using vec = std::vector<float>;
vec normal(std::uint64_t seed, std::size_t n) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}
}  // namespace

TEST_CASE("MajorityVote equals the reference vote on every rank; bytes = formula", "[compress][majority]") {
  const float beta = GENERATE(0.0f, 0.9f);
  const bool scaled = GENERATE(true, false);
  const std::size_t n = 45;
  const int steps = 3;
  for (int P = 1; P <= 8; ++P) {
    CAPTURE(P, beta, scaled);
    auto grad = [](int s, int r) {
      vec g = normal(100 * s + r, n);
      g[0] = (r % 2) ? -1.0f : 1.0f;  // a tie on even P
      return g;
    };
    std::vector<vec> m(P), expect(steps);
    for (int s = 0; s < steps; ++s) {
      std::vector<int> votes(n, 0);
      double scales = 0;
      for (int r = 0; r < P; ++r) {
        const vec g = grad(s, r);
        if (beta == 0.0f || m[r].empty()) m[r] = g;
        else
          for (std::size_t i = 0; i < n; ++i) m[r][i] = beta * m[r][i] + (1.0f - beta) * g[i];
        double l1 = 0;
        for (float x : m[r]) l1 += std::abs(double(x));
        scales += float(l1 / double(n));
        for (std::size_t i = 0; i < n; ++i) votes[i] += m[r][i] < 0 ? -1 : 1;
      }
      const float sc = scaled ? float(scales / P) : 1.0f;
      expect[s].resize(n);
      for (std::size_t i = 0; i < n; ++i) expect[s][i] = votes[i] > 0 ? sc : (votes[i] < 0 ? -sc : 0.0f);
      if (P % 2 == 0) CHECK(expect[s][0] == 0.0f);
    }
    std::vector<std::vector<vec>> out(P);
    std::vector<std::uint64_t> bytes(P);
    commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
      CountingComm<commpact_test::checked_thread_comm> counted{comm};
      MajorityVote<CountingComm<commpact_test::checked_thread_comm>> c{counted, {.momentum = beta, .scaled = scaled}};
      for (int s = 0; s < steps; ++s) {
        vec g = grad(s, comm.rank());
        const auto before = counted.stats();
        if (!c.reduce(std::span<float>(g)))
          throw std::logic_error("a step was skipped");  // no Catch2 asserts in rank threads
        if (s == 1) bytes[comm.rank()] = (counted.stats() - before).bytes_sent;
        out[comm.rank()].push_back(g);
      }
    });
    for (int r = 0; r < P; ++r) {
      for (int s = 0; s < steps; ++s) CHECK(out[r][s] == expect[s]);
      CHECK(bytes[r] == std::uint64_t(P - 1) * ((48 + 4 + (n + 7) / 8 + 3) / 4 * 4));
    }
  }
}

TEST_CASE("MajorityVote: NaN on one rank raises on every rank or skips everywhere; state round-trips",
          "[compress][majority]") {
  const int P = 3;
  const std::size_t n = 20;
  std::vector<int> raised(P, 0), skipped(P, 0), ok(P, 1);  // Catch2 asserts on the main thread only
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    MajorityVote<commpact_test::checked_thread_comm> a{comm, {.momentum = 0.5f}};
    MajorityVote<commpact_test::checked_thread_comm> b{comm, {.momentum = 0.5f, .on_nonfinite = nonfinite::skip_step}};
    vec g = normal(comm.rank(), n);
    a.reduce(std::span<float>(g));
    const vec m_before(a.momentum().begin(), a.momentum().end());
    g = normal(10 + comm.rank(), n);
    if (comm.rank() == 1) g[3] = std::nanf("");
    try {
      a.reduce(std::span<float>(g));
    } catch (const numeric_error&) {
      raised[comm.rank()] = 1;
    }
    int& good = ok[comm.rank()];
    good &= vec(a.momentum().begin(), a.momentum().end()) == m_before;  // unchanged
    good &= a.steps() == 1;
    vec h = g;
    if (!b.reduce(std::span<float>(h))) skipped[comm.rank()] = 1;
    good &= h == vec(n, 0.0f);
    // save, load into a fresh object: the next step agrees with the original.
    std::vector<std::byte> blob;
    a.save_state(blob);
    MajorityVote<commpact_test::checked_thread_comm> c{comm, {.momentum = 0.5f}};
    c.load_state(blob);
    vec g1 = normal(20 + comm.rank(), n), g2 = g1;
    a.reduce(std::span<float>(g1));
    c.reduce(std::span<float>(g2));
    good &= g1 == g2;
    blob[blob.size() / 2] ^= std::byte{1};
    try {
      c.load_state(blob);
      good = 0;
    } catch (const wire_error&) {
    }
  });
  CHECK(ok == std::vector<int>(P, 1));
  CHECK(raised == std::vector<int>(P, 1));
  CHECK(skipped == std::vector<int>(P, 1));
}
