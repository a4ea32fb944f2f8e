// OkTopK<commpact_test::checked_thread_comm> (Ok-Topk's sparse allreduce) for P = 1..8: bit-exact against a
// serial reference of the algorithm (local top-k by a sort, region sums in rank order,
// the threshold from every region's k largest sums, the capped selection, the
// rebalanced regions), conservation, exact bytes per rank through CountingComm, bytes
// flat in P (against TopK's (P - 1) 8k), NaN on one rank raising on every rank.
// Multi-rank cases run under CheckedComm<ThreadComm> (tests/common/checked_runs.hpp).
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/oktopk.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/checked_runs.hpp"

using namespace commpact;
static_assert(Compressor<OkTopK<commpact_test::checked_thread_comm>>);

namespace {
using vec = std::vector<float>;
vec grad(int s, int r, std::size_t n) {
  std::mt19937_64 g(7919 * s + r);
  std::normal_distribution<float> d(0.f, 1.f);
  vec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = d(g) * (i % 97 < 20 ? 3.f : 1.f);  // some denser regions
  return v;
}
//! The k largest |v| (ties: smaller index), ascending indices.
std::vector<std::size_t> top(const vec& v, const std::vector<std::size_t>& among, std::size_t k) {
  auto c = among;
  std::stable_sort(c.begin(), c.end(), [&](auto a, auto b) { return std::abs(v[a]) > std::abs(v[b]); });
  if (c.size() > k) c.resize(k);
  std::sort(c.begin(), c.end());
  return c;
}

struct reference {
  int P;
  std::size_t n, k;
  std::int64_t period;
  std::vector<vec> e;
  std::vector<std::int64_t> bounds;
  float theta = 0;
  bool valid = false;
  std::vector<std::uint64_t> bytes;  // per rank, the last step

  reference(int P_, std::size_t n_, std::size_t k_, std::int64_t period_)
      : P(P_), n(n_), k(k_), period(period_), e(P_, vec(n_, 0.0f)), bounds(P_ + 1) {
    for (int j = 0; j <= P; ++j) bounds[j] = std::int64_t(n) * j / P;
  }
  vec step(std::int64_t t) {
    std::vector<vec> acc(P);
    std::vector<std::vector<std::size_t>> local(P);
    std::vector<std::size_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    for (int r = 0; r < P; ++r) {
      const vec g = grad(int(t), r, n);
      acc[r].resize(n);
      for (std::size_t i = 0; i < n; ++i) acc[r][i] = e[r][i] + g[i];
      local[r] = top(acc[r], all, k);
    }
    vec sum(n, 0.0f);
    std::vector<char> touched(n, 0);
    for (int r = 0; r < P; ++r)  // region owners add in rank order; regions are disjoint
      for (auto i : local[r]) sum[i] += acc[r][i], touched[i] = 1;
    const bool estimate = !valid || t % period == 0;
    const std::size_t c = std::min(k, (2 * k + P - 1) / P);  // the per-region cap
    if (estimate) {
      vec mags;
      for (int j = 0; j < P; ++j) {
        vec m;
        for (auto i = bounds[j]; i < bounds[j + 1]; ++i)
          if (touched[i]) m.push_back(std::abs(sum[i]));
        std::sort(m.rbegin(), m.rend());
        m.resize(c, 0.0f);
        mags.insert(mags.end(), m.begin(), m.end());
      }
      std::sort(mags.rbegin(), mags.rend());
      theta = mags[k - 1], valid = true;
    }
    std::vector<std::vector<std::size_t>> sel(P);
    for (int j = 0; j < P; ++j) {
      std::vector<std::size_t> pass;
      for (auto i = bounds[j]; i < bounds[j + 1]; ++i)
        if (touched[i] && sum[i] != 0.0f && std::abs(sum[i]) >= theta) pass.push_back(std::size_t(i));
      sel[j] = top(sum, pass, c);
    }
    bytes.assign(P, 0);
    for (int r = 0; r < P; ++r) {
      for (int j = 0; j < P; ++j)
        if (j != r)
          bytes[r] += 40 + 8 * std::count_if(local[r].begin(), local[r].end(), [&](auto i) {
                        return std::int64_t(i) >= bounds[j] && std::int64_t(i) < bounds[j + 1];
                      });
      for (int s = 0; s < P - 1; ++s) bytes[r] += 8 + 8 * sel[((r - s) % P + P) % P].size();
      if (estimate) bytes[r] += std::uint64_t(P - 1) * 4 * c;
    }
    vec out(n, 0.0f);
    std::vector<std::size_t> G;
    for (int j = 0; j < P; ++j)
      for (auto i : sel[j]) out[i] = sum[i] / float(P), G.push_back(i);
    for (int r = 0; r < P; ++r) {
      e[r] = acc[r];
      for (auto i : local[r])
        if (std::binary_search(G.begin(), G.end(), i)) e[r][i] = 0.0f;
    }
    if (G.size() >= std::size_t(P))
      for (int j = 1; j < P; ++j) bounds[j] = std::max(bounds[j - 1], std::int64_t(G[G.size() * j / P]));
    return out;
  }
};
}  // namespace

TEST_CASE("OkTopK equals the serial reference bit for bit on every rank; exact bytes; conservation",
          "[compress][oktopk]") {
  const std::size_t n = 2000, k = 40;
  const int steps = 6;
  for (int P = 1; P <= 8; ++P) {
    CAPTURE(P);
    reference ref(P, n, k, 3);
    std::vector<vec> expect;
    std::vector<std::vector<std::uint64_t>> expect_bytes;
    for (int t = 0; t < steps; ++t) expect.push_back(ref.step(t)), expect_bytes.push_back(ref.bytes);
    std::vector<std::vector<vec>> out(P);
    std::vector<std::vector<std::uint64_t>> bytes(P);
    std::vector<vec> res(P);
    std::vector<std::vector<std::int64_t>> bounds(P);
    commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
      CountingComm<commpact_test::checked_thread_comm> counted{comm};
      OkTopK<CountingComm<commpact_test::checked_thread_comm>> ok{counted, {.density = 0.02, .period = 3}};
      for (int t = 0; t < steps; ++t) {
        vec g = grad(t, comm.rank(), n);
        const auto before = counted.stats();
        if (!ok.reduce(std::span<float>(g)))
          throw std::logic_error("a step was skipped");  // no Catch2 asserts in rank threads
        bytes[comm.rank()].push_back((counted.stats() - before).bytes_sent);
        out[comm.rank()].push_back(g);
      }
      res[comm.rank()].assign(ok.residual().begin(), ok.residual().end());
      bounds[comm.rank()].assign(ok.bounds().begin(), ok.bounds().end());
    });
    double lhs = 0, rhs = 0, scale = 0;
    for (int r = 0; r < P; ++r) {
      for (int t = 0; t < steps; ++t) {
        CHECK(out[r][t] == expect[t]);
        CHECK(bytes[r][t] == expect_bytes[t][r]);
        const vec g = grad(t, r, n);  // once per (step, rank): the loop below is O(n)
        for (std::size_t i = 0; i < n; ++i) {
          lhs += g[i], scale += std::abs(g[i]);
          if (r == 0) rhs += double(P) * out[0][t][i];
        }
      }
      CHECK(res[r] == ref.e[r]);
      CHECK(bounds[r] == ref.bounds);
      for (float x : res[r]) rhs += x;
    }
    CHECK(std::abs(lhs - rhs) <= 1e-5 * scale);
    if (P > 1) CHECK(ref.bounds != reference(P, n, k, 3).bounds);  // the regions moved
  }
}

TEST_CASE("OkTopK's bytes per rank stay flat as P grows; TopK's grow like P - 1", "[compress][oktopk]") {
  const std::size_t n = 20000, k = 200;
  std::vector<double> per_rank;
  for (int P : {2, 4, 8}) {
    std::vector<std::uint64_t> b(P);
    commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
      CountingComm<commpact_test::checked_thread_comm> counted{comm};
      OkTopK<CountingComm<commpact_test::checked_thread_comm>> ok{counted, {.density = 0.01, .period = 1000}};
      vec g = grad(0, comm.rank(), n);
      ok.reduce(std::span<float>(g));  // the threshold step
      const auto before = counted.stats();
      for (int t = 1; t < 5; ++t) {
        g = grad(t, comm.rank(), n);
        ok.reduce(std::span<float>(g));
      }
      b[comm.rank()] = (counted.stats() - before).bytes_sent;
    });
    const double mean = std::accumulate(b.begin(), b.end(), 0.0) / P / 4;
    per_rank.push_back(mean);
    CHECK(mean <= 24 * double(k) + 64 * P);  // local k entries out, at most about 2k selected in
  }
  // Flat: the (P - 1)/P factors approach 1. P = 4 to 8: TopK's bytes grow 7/3 times.
  CHECK(per_rank[2] < 1.3 * per_rank[1]);
  CHECK(per_rank[2] < 0.5 * 7 * (48 + 8 * double(k)));  // below half of TopK's at P = 8
}

TEST_CASE("OkTopK: NaN on one rank raises on every rank and changes nothing", "[compress][oktopk]") {
  const int P = 4;
  std::vector<int> raised(P, 0), good(P, 0);  // Catch2 asserts on the main thread only
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    OkTopK<commpact_test::checked_thread_comm> ok{comm, {.density = 0.05}};
    vec g = grad(0, comm.rank(), 300);
    ok.reduce(std::span<float>(g));
    const vec before(ok.residual().begin(), ok.residual().end());
    g = grad(1, comm.rank(), 300);
    if (comm.rank() == 2) g[5] = std::nanf("");
    try {
      ok.reduce(std::span<float>(g));
    } catch (const numeric_error&) {
      raised[comm.rank()] = 1;
    }
    const bool unchanged = vec(ok.residual().begin(), ok.residual().end()) == before;
    g = grad(2, comm.rank(), 300);
    good[comm.rank()] = unchanged && ok.reduce(std::span<float>(g));  // still usable
  });
  CHECK(raised == std::vector<int>(P, 1));
  CHECK(good == std::vector<int>(P, 1));
}
