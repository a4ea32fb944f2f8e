// OkTopK<commpact_test::checked_thread_comm> (Ok-Topk's sparse allreduce) for P = 1..8: bit-exact against a
// serial reference of the algorithm (local top-k by a sort, region sums in rank order,
// the exact global top-k of the sums at an estimation step and theta its k-th |sum|,
// between estimations the capped selection by theta, the rebalanced regions),
// conservation, exact bytes per rank through CountingComm, bytes flat in P (against
// TopK's (P - 1) 8k), NaN on one rank raising on every rank; exactly the global top-k at
// an estimation step when the largest sums sit in one region; ranks built with other
// periods raising mismatch_error.
// Multi-rank cases run under CheckedComm<ThreadComm> (tests/common/checked_runs.hpp).
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/oktopk.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common/checked_runs.hpp"
#include "common/space_copies.hpp"

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
  vec (*gen)(int, int, std::size_t);

  reference(int P_, std::size_t n_, std::size_t k_, std::int64_t period_, vec (*gen_)(int, int, std::size_t) = grad)
      : P(P_), n(n_), k(k_), period(period_), e(P_, vec(n_, 0.0f)), bounds(P_ + 1), gen(gen_) {
    for (int j = 0; j <= P; ++j) bounds[j] = std::int64_t(n) * j / P;
  }
  vec step(std::int64_t t) {
    std::vector<vec> acc(P);
    std::vector<std::vector<std::size_t>> local(P);
    std::vector<std::size_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    for (int r = 0; r < P; ++r) {
      const vec g = gen(int(t), r, n);
      acc[r].resize(n);
      for (std::size_t i = 0; i < n; ++i) acc[r][i] = e[r][i] + g[i];
      local[r] = top(acc[r], all, k);
    }
    vec sum(n, 0.0f);
    std::vector<char> touched(n, 0);
    for (int r = 0; r < P; ++r)  // region owners add in rank order; regions are disjoint
      for (auto i : local[r]) sum[i] += acc[r][i], touched[i] = 1;
    const bool estimate = !valid || t % period == 0;
    const std::size_t c = std::min(k, (2 * k + P - 1) / P);  // the per-region cap between estimations
    std::vector<std::vector<std::size_t>> sel(P);
    if (estimate) {  // the exact global top-k of the nonzero sums; theta its k-th |sum| (0 if fewer)
      std::vector<std::size_t> nz;
      for (std::size_t i = 0; i < n; ++i)
        if (sum[i] != 0.0f) nz.push_back(i);
      const auto G = top(sum, nz, k);
      vec mags;
      for (std::size_t i = 0; i < n; ++i)
        if (touched[i]) mags.push_back(std::abs(sum[i]));
      std::sort(mags.rbegin(), mags.rend());
      theta = mags.size() >= k ? mags[k - 1] : 0.0f, valid = true;
      for (auto i : G) {
        int j = 0;
        while (std::int64_t(i) >= bounds[j + 1]) ++j;
        sel[j].push_back(i);
      }
    } else {
      for (int j = 0; j < P; ++j) {
        std::vector<std::size_t> pass;
        for (auto i = bounds[j]; i < bounds[j + 1]; ++i)
          if (touched[i] && sum[i] != 0.0f && std::abs(sum[i]) >= theta) pass.push_back(std::size_t(i));
        sel[j] = top(sum, pass, c);
      }
    }
    bytes.assign(P, 0);
    for (int r = 0; r < P; ++r) {
      for (int j = 0; j < P; ++j)
        if (j != r)
          bytes[r] += 40 + 8 * std::count_if(local[r].begin(), local[r].end(), [&](auto i) {
                        return std::int64_t(i) >= bounds[j] && std::int64_t(i) < bounds[j + 1];
                      });
      for (int s = 0; s < P - 1; ++s) bytes[r] += 8 + 8 * sel[((r - s) % P + P) % P].size();
      if (estimate) bytes[r] += std::uint64_t(P - 1) * 4 * k;
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

// Every rank's largest entries in the first eighth of the index space: one region.
vec skewed(int s, int r, std::size_t n) {
  vec v = grad(s, r, n);
  for (std::size_t i = 0; i < n / 8; ++i) v[i] *= 8.0f;
  return v;
}

TEST_CASE("OkTopK at an estimation step delivers exactly the global top-k, also when the largest sums sit in one "
          "region",
          "[compress][oktopk]") {
  const std::size_t n = 4096;
  for (int P = 2; P <= 6; ++P) {
    CAPTURE(P);
    const std::size_t k = std::size_t(0.02 * n);
    reference ref(P, n, k, 1, skewed);
    std::vector<vec> expect;
    for (int t = 0; t < 4; ++t) expect.push_back(ref.step(t));
    std::vector<std::vector<vec>> out(P);
    commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
      OkTopK<commpact_test::checked_thread_comm> ok{comm, {.density = 0.02, .period = 1}};
      for (int t = 0; t < 4; ++t) {
        vec g = skewed(t, comm.rank(), n);
        ok.reduce(std::span<float>(g));
        out[comm.rank()].push_back(g);
      }
    });
    for (int r = 0; r < P; ++r)
      for (int t = 0; t < 4; ++t) {
        CAPTURE(r, t);
        CHECK(out[r][t] == expect[t]);
        CHECK(std::size_t(std::count_if(out[r][t].begin(), out[r][t].end(), [](float x) { return x != 0.0f; })) == k);
      }
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

TEMPLATE_TEST_CASE("OkTopK: ranks built with different periods raise mismatch_error on every rank at the first "
                   "step where they differ, and change nothing",
                   "[compress][oktopk][mismatch]", ThreadComm, DeferredComm<ThreadComm>) {
  const int P = 3;
  std::vector<std::string> what(P);
  std::vector<int> unchanged(P, 0), before_ok(P, 0);
  run_threads(
      P,
      [&](ThreadComm& comm) {
        // Rank 2 re-estimates every 2 steps, the others every 3: steps 0 and 1 agree, step 2 does not.
        OkTopK<TestType> ok{TestType{comm}, {.density = 0.05, .period = comm.rank() == 2 ? 2 : 3}};
        auto step = [&](int t) {
          const vec g = grad(t, comm.rank(), 300);
          if constexpr (std::is_same_v<TestType, ThreadComm>) {
            vec x = g;
            return ok.reduce(std::span<float>(x));
          } else {
            auto x = commpact_test::device_copy(ok.comm().exec(), g);
            return ok.reduce(x.view());
          }
        };
        auto residual = [&] {
          if constexpr (std::is_same_v<TestType, ThreadComm>) return vec(ok.residual().begin(), ok.residual().end());
          else return commpact_test::host_copy(ok.comm().exec(), ok.residual());
        };
        before_ok[comm.rank()] = step(0) && step(1);
        const auto res = residual();
        try {
          step(2);
        } catch (const mismatch_error& e) {
          what[comm.rank()] = e.what();
        }
        unchanged[comm.rank()] = residual() == res && ok.steps() == 2;
      },
      thread_options{.timeout = std::chrono::seconds(20)});
  for (int r = 0; r < P; ++r) {
    CAPTURE(r, what[r]);
    CHECK(before_ok[r] == 1);
    CHECK(what[r].find("period") != std::string::npos);
    CHECK(unchanged[r] == 1);
  }
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

TEST_CASE("OkTopK restored from a state saved at any step continues with the same bits (regions and theta "
          "included); states of another rank or period are refused",
          "[compress][oktopk][state]") {
  const int P = GENERATE(2, 3);
  const int T1 = GENERATE(1, 2, 3, 5, 7, 11);  // between estimations (period 4) and next to them
  CAPTURE(P, T1);
  constexpr int T = 12;
  constexpr std::size_t n = 400;
  const oktopk_options opt{.density = 0.05, .period = 4};
  std::vector<int> same(static_cast<std::size_t>(P), 0), refused(static_cast<std::size_t>(P), 0);
  std::vector<std::vector<std::byte>> blobs(static_cast<std::size_t>(P));
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    using OK = OkTopK<commpact_test::checked_thread_comm>;
    std::vector<vec> whole;
    OK a{comm, opt};
    for (int s = 0; s < T; ++s) {
      vec g = grad(s, comm.rank(), n);
      a.reduce(std::span<float>(g));
      whole.push_back(g);
    }
    OK b{comm, opt};
    std::vector<std::byte> blob;
    for (int s = 0; s < T1; ++s) {
      vec g = grad(s, comm.rank(), n);
      b.reduce(std::span<float>(g));
    }
    b.save_state(blob);
    OK c{comm, opt};  // a fresh compressor: nothing but the state carries the regions and theta
    c.load_state(blob);
    bool ok = c.steps() == T1 && std::equal(c.bounds().begin(), c.bounds().end(), b.bounds().begin(), b.bounds().end()) &&
              c.theta() == b.theta();
    for (int s = T1; s < T; ++s) {
      vec g = grad(s, comm.rank(), n);
      c.reduce(std::span<float>(g));
      ok = ok && g == whole[static_cast<std::size_t>(s)];
    }
    same[static_cast<std::size_t>(comm.rank())] = ok ? 1 : 0;
    blobs[static_cast<std::size_t>(comm.rank())] = blob;
  });
  CHECK(same == std::vector<int>(static_cast<std::size_t>(P), 1));
  // Another period's compressor, or another rank, refuses the state (and stays as it was).
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    using OK = OkTopK<commpact_test::checked_thread_comm>;
    const auto r = static_cast<std::size_t>(comm.rank());
    int n_refused = 0;
    OK other_period{comm, {.density = 0.05, .period = 8}};
    OK mine{comm, opt};
    for (auto* load : {&other_period, &mine}) {
      const auto& blob = load == &mine ? blobs[(r + 1) % static_cast<std::size_t>(P)] : blobs[r];
      try {
        load->load_state(blob);
      } catch (const mismatch_error&) {
        n_refused += load->steps() == 0 ? 1 : 0;
      }
    }
    try {
      mine.load_state(blobs[r]);  // its own loads
      n_refused += mine.steps() == T1 ? 10 : 0;
    } catch (...) {
    }
    refused[r] = n_refused;
  });
  CHECK(refused == std::vector<int>(static_cast<std::size_t>(P), 12));  // two refused, its own loaded
}

// Not a check: how many entries Ok-Topk selects and how many of them are the exact
// global top-k of the summed accumulators (sum over ranks of g + residual), at the
// estimation steps and between them (docs/compressors.md quotes it). Run with
//   build/tests/test_compress_oktopk "[.measure]"
TEST_CASE("OkTopK's selection against the exact global top-k (measurement)", "[.measure][oktopk]") {
  const std::size_t n = 16384;
  const int steps = 96;
  const std::int64_t period = 32;
  for (int skew = 0; skew <= 1; ++skew)
    for (int P : {2, 4, 8}) {
      std::vector<std::vector<vec>> acc(steps, std::vector<vec>(P));
      std::vector<vec> out(steps);
      std::size_t k = 0;
      run_threads(P, [&](ThreadComm& comm) {
        OkTopK<ThreadComm> ok{comm, {.density = 0.01, .period = period}};
        k = ok.k(n);
        for (int t = 0; t < steps; ++t) {
          vec g = skew ? skewed(t, comm.rank(), n) : grad(t, comm.rank(), n);
          const auto res = ok.residual();
          vec a(g);
          for (std::size_t i = 0; i < res.size(); ++i) a[i] += res[i];
          acc[t][comm.rank()] = std::move(a);
          ok.reduce(std::span<float>(g));
          if (comm.rank() == 0) out[t] = g;
        }
      });
      double sel[2] = {0, 0}, hit[2] = {0, 0}, cnt[2] = {0, 0};
      for (int t = 0; t < steps; ++t) {
        std::vector<double> s(n, 0.0);
        for (int r = 0; r < P; ++r)
          for (std::size_t i = 0; i < n; ++i) s[i] += acc[t][r][i];
        std::vector<std::size_t> ix(n);
        std::iota(ix.begin(), ix.end(), std::size_t{0});
        std::partial_sort(ix.begin(), ix.begin() + std::ptrdiff_t(k), ix.end(),
                          [&](auto a, auto b) { return std::abs(s[a]) > std::abs(s[b]); });
        const int e = t % period == 0 ? 0 : 1;
        for (std::size_t i = 0; i < n; ++i) sel[e] += out[t][i] != 0.0f;
        for (std::size_t j = 0; j < k; ++j) hit[e] += out[t][ix[j]] != 0.0f;
        cnt[e] += 1;
      }
      std::printf("%s P=%d k=%zu: estimation steps select %.1f (%.1f of the exact top-k); between: %.1f (%.1f)\n",
                  skew ? "skewed" : "normal", P, k, sel[0] / cnt[0], hit[0] / cnt[0], sel[1] / cnt[1], hit[1] / cnt[1]);
    }
}
