// Threshold sparsifiers (hard threshold, Gaussian-k, DGC's sampled threshold) and
// random-k over the allreduce aggregation:
//  - each codec against a brute-force reference (the threshold recomputed here, the
//    selection by a sort), decode round trip, malformed messages rejected;
//  - CodecCompressor with each threshold codec for P = 1..8: bit-exact against the serial
//    reference on every rank, conservation, bytes = (P - 1)(48 + 8 cap);
//  - random-k: k distinct sorted indices shared by every rank, uniform over many steps;
//    LinearCompressor for P = 1..8: every rank the same bits, the reference mean, the
//    residual exactly acc with the sent indices cleared, bytes = the ring allreduce of k + 1 floats.
// Multi-rank cases run under CheckedComm<ThreadComm> (tests/common/checked_runs.hpp).
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/codecs/sparsifiers.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/checked_runs.hpp"
#include "common/threshold_refs.hpp"

using namespace commpact;
static_assert(Codec<threshold_codec> && Codec<gaussiank_codec> && Codec<dgc_codec>);
static_assert(LinearCodec<randomk_codec>);

namespace {
using vec = std::vector<float>;

vec normal(std::uint64_t seed, std::size_t n, float sd = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// The references: tests/common/threshold_refs.hpp (GRACE's k, the authors' Gaussian-k and
// DGC rules, the selection under a cap by a sort).
using commpact_test::refs::k_ref;
vec select_ref(const vec& v, float t, std::size_t cap) { return commpact_test::refs::select_ref(v, t, false, cap); }
//! The cap k_of_density(density, n) of threshold_codec and dgc_codec (floor, GRACE's rule).
std::size_t cap_of(double density, std::size_t n) { return k_ref(density, n); }
//! Gaussian-k's cap: floor(4k/3).
std::size_t gk_cap(double density, std::size_t n) { return std::min(n, std::max<std::size_t>(1, 4 * k_ref(density, n) / 3)); }

using ref_fn = std::function<vec(const vec&, std::int64_t, int)>;

template <class K>
vec round_trip(K& k, const vec& v, std::int64_t step, int rank) {
  k.begin_step(step);
  k.bind_rank(rank);
  std::vector<std::byte> msg(k.max_encoded_bytes(v.size()));
  vec approx(v.size(), -7.0f), acc(v.size(), 0.0f);
  const std::size_t b = k.encode(v, msg, approx);
  REQUIRE(b % 8 == 0);
  REQUIRE(b / 8 == k.delivered().size());
  k.decode_add(std::span<const std::byte>(msg).first(b), acc);
  CHECK(acc == approx);
  return approx;
}
}  // namespace

TEST_CASE("threshold sparsifiers equal brute-force references", "[codec][sparse]") {
  for (std::size_t n : {1, 10, 1000, 20000}) {
    for (int trial = 0; trial < 3; ++trial) {
      CAPTURE(n, trial);
      vec v = normal(n + 17 * trial, n, 0.01f);
      if (trial == 2)
        for (std::size_t i = 0; i < n; i += 3) v[i] = 0.02f;  // many ties at one magnitude
      threshold_codec th{0.015f, 0.05};
      CHECK(round_trip(th, v, 0, 0) == select_ref(v, 0.015f, cap_of(0.05, n)));
      threshold_codec all{0.015f};  // the default: no cap
      CHECK(round_trip(all, v, 0, 0) == select_ref(v, 0.015f, n));
      gaussiank_codec gk{0.01};
      const auto gr = commpact_test::refs::gaussian_ref(v, 0.01);
      CHECK(round_trip(gk, v, 0, 0) == gr.sent);
      CHECK(gk.last_threshold() == gr.t);
      dgc_codec dg{0.01, 0.05, 9};
      const auto dr = commpact_test::refs::dgc_ref(v, 0.01, 0.05, 9, 4, 2);
      CHECK(round_trip(dg, v, 4, 2) == dr.sent);
      CHECK(dg.last_threshold() == dr.t);
    }
  }
  // On normal data Gaussian-k's refined threshold passes between 2k/3 and 4k/3 entries.
  const vec v = normal(3, 100000);
  gaussiank_codec gk{0.01};
  round_trip(gk, v, 0, 0);
  CHECK(3 * gk.last_passed() >= 2 * 1000);
  CHECK(3 * gk.last_passed() <= 4 * 1000);
}

TEST_CASE("threshold sparsifiers reject malformed messages", "[codec][sparse][wire]") {
  const std::size_t n = 100;
  const gaussiank_codec k{0.05, 3, 1.0};  // cap 5 (cap_factor 1: k)
  auto msg_of = [](std::vector<std::pair<std::int32_t, float>> e) {
    std::vector<std::byte> m(8 * e.size());
    for (std::size_t j = 0; j < e.size(); ++j) {
      std::memcpy(m.data() + 4 * j, &e[j].first, 4);
      std::memcpy(m.data() + 4 * (e.size() + j), &e[j].second, 4);
    }
    return m;
  };
  auto rejects = [&](std::vector<std::byte> m) {
    vec acc(n, 2.0f);
    CHECK_THROWS_AS(k.decode_add(m, acc), wire_error);
    CHECK(acc == vec(n, 2.0f));
  };
  vec acc(n, 0.0f);
  k.decode_add(msg_of({{1, 1.f}, {5, 2.f}, {99, 3.f}}), acc);
  CHECK(acc[99] == 3.f);
  rejects(msg_of({{1, 1.f}, {2, 1.f}, {3, 1.f}, {4, 1.f}, {5, 1.f}, {6, 1.f}}));  // 6 > cap
  rejects(msg_of({{5, 1.f}, {1, 1.f}}));                                          // not ascending
  rejects(msg_of({{5, 1.f}, {5, 1.f}}));                                          // repeated
  rejects(msg_of({{100, 1.f}}));                                                  // out of range
  rejects(msg_of({{-1, 1.f}}));
  rejects(msg_of({{3, std::nanf("")}}));
  auto m = msg_of({{3, 1.f}});
  m.pop_back();
  rejects(m);  // not a whole entry
}

namespace {
template <class K>
void check_codec_compressor(const K& proto, const ref_fn& ref, std::size_t cap) {
  using C = CountingComm<commpact_test::checked_thread_comm>;
  const std::size_t n = 300;
  const int steps = 3;
  for (int P = 1; P <= 8; ++P) {
    CAPTURE(P);
    auto grad = [](int s, int r) { return normal(1000 * s + r, n, 0.01f); };
    std::vector<vec> e(P, vec(n, 0.0f)), expect(steps);
    for (int s = 0; s < steps; ++s) {
      std::vector<vec> q(P);
      for (int r = 0; r < P; ++r) {
        vec acc(n), g = grad(s, r);
        for (std::size_t i = 0; i < n; ++i) acc[i] = e[r][i] + g[i];
        q[r] = ref(acc, s, r);
        for (std::size_t i = 0; i < n; ++i) e[r][i] = q[r][i] != 0.0f ? 0.0f : acc[i];
      }
      vec sum(n, 0.0f);
      for (int r = 0; r < P; ++r)
        for (std::size_t i = 0; i < n; ++i) sum[i] += q[r][i];
      for (auto& x : sum) x = x / float(P);
      expect[s] = sum;
    }
    std::vector<std::vector<vec>> out(P);
    std::vector<vec> res(P);
    std::vector<std::uint64_t> bytes(P);
    commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
      C counted{comm};
      CodecCompressor<K, Allgather<C>> c{counted, proto};
      for (int s = 0; s < steps; ++s) {
        vec g = grad(s, comm.rank());
        const auto before = counted.stats();
        c.reduce(std::span<float>(g));
        if (s == 1) bytes[comm.rank()] = (counted.stats() - before).bytes_sent;
        out[comm.rank()].push_back(g);
      }
      res[comm.rank()].assign(c.residual().begin(), c.residual().end());
    });
    for (int r = 0; r < P; ++r) {
      for (int s = 0; s < steps; ++s) CHECK(out[r][s] == expect[s]);
      CHECK(res[r] == e[r]);
      CHECK(bytes[r] == std::uint64_t(P - 1) * (48 + 8 * cap));
    }
  }
}
}  // namespace

TEST_CASE("CodecCompressor with threshold sparsifiers: every rank equals the reference; bytes = formula",
          "[codec][sparse][compressor]") {
  const std::size_t n = 300;
  check_codec_compressor(threshold_codec{0.012f, 0.03},
                         [](const vec& v, std::int64_t, int) { return select_ref(v, 0.012f, cap_of(0.03, 300)); },
                         cap_of(0.03, n));
  check_codec_compressor(threshold_codec{0.02f},  // no cap: blocks of 8n bytes
                         [](const vec& v, std::int64_t, int) { return select_ref(v, 0.02f, 300); }, n);
  check_codec_compressor(gaussiank_codec{0.02},
                         [](const vec& v, std::int64_t, int) { return commpact_test::refs::gaussian_ref(v, 0.02).sent; },
                         gk_cap(0.02, n));
  check_codec_compressor(dgc_codec{0.02, 0.2, 5},
                         [](const vec& v, std::int64_t s, int r) {
                           return commpact_test::refs::dgc_ref(v, 0.02, 0.2, 5, s, r).sent;
                         },
                         cap_of(0.02, n));
}

TEST_CASE("random-k: shared uniform indices; LinearCompressor allreduces k values on every rank alike",
          "[codec][randomk][allreduce]") {
  SECTION("the indices: k distinct, ascending, uniform over steps") {
    const std::size_t n = 50, T = 4000;
    randomk_codec k{0.1, 3};
    std::vector<int> hits(n, 0);
    for (std::size_t t = 0; t < T; ++t) {
      k.begin_step(std::int64_t(t));
      const auto ix = k.indices(n);
      REQUIRE(ix.size() == 5);
      for (std::size_t j = 0; j < ix.size(); ++j) {
        REQUIRE(ix[j] >= 0);
        REQUIRE(std::size_t(ix[j]) < n);
        if (j) REQUIRE(ix[j] > ix[j - 1]);
        ++hits[std::size_t(ix[j])];
      }
    }
    // Each index is drawn with probability k/n = 0.1 per step: 400 +- 5 sd (sd = 19).
    for (int h : hits) CHECK(std::abs(h - 400) < 95);
    randomk_codec same{0.1, 3}, other{0.1, 4};
    same.begin_step(7), other.begin_step(7), k.begin_step(7);
    const auto a = std::vector<std::int32_t>(k.indices(n).begin(), k.indices(n).end());
    CHECK(a == std::vector<std::int32_t>(same.indices(n).begin(), same.indices(n).end()));
    CHECK(a != std::vector<std::int32_t>(other.indices(n).begin(), other.indices(n).end()));
  }
  SECTION("LinearCompressor<randomk_codec, C> for P = 1..8") {
    using C = CountingComm<commpact_test::checked_thread_comm>;
    const std::size_t n = 401;
    const int steps = 3;
    for (int P = 1; P <= 8; ++P) {
      CAPTURE(P);
      auto grad = [](int s, int r) { return normal(77 * s + r, n); };
      std::vector<std::vector<vec>> out(P);
      std::vector<vec> res(P);
      std::vector<std::uint64_t> bytes(P);
      commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
        C counted{comm};
        LinearCompressor<randomk_codec, C> c{counted, randomk_codec{0.05, 11}};
        for (int s = 0; s < steps; ++s) {
          vec g = grad(s, comm.rank());
          const auto before = counted.stats();
          if (!c.reduce(std::span<float>(g)))
            throw std::logic_error("a step was skipped");  // no Catch2 asserts in rank threads
          if (s == 1) bytes[comm.rank()] = (counted.stats() - before).bytes_sent;
          out[comm.rank()].push_back(g);
        }
        res[comm.rank()].assign(c.residual().begin(), c.residual().end());
      });
      // Reference: the same indices on every rank; residual = acc with them cleared.
      randomk_codec ref{0.05, 11};
      std::vector<vec> e(P, vec(n, 0.0f));
      for (int s = 0; s < steps; ++s) {
        ref.begin_step(s);
        const auto ix = ref.indices(n);
        REQUIRE(ix.size() == 20);
        vec mean(n, 0.0f);
        double total = 0;
        for (int r = 0; r < P; ++r) {
          const vec g = grad(s, r);
          for (std::size_t i = 0; i < n; ++i) e[r][i] += g[i];
          for (auto i : ix) mean[std::size_t(i)] += e[r][std::size_t(i)] / float(P), e[r][std::size_t(i)] = 0.0f;
        }
        for (int r = 0; r < P; ++r) CHECK(out[r][s] == out[0][s]);  // the same bits everywhere
        for (std::size_t i = 0; i < n; ++i) {
          CHECK(out[0][s][i] == Approx(mean[i]).margin(1e-5));
          total += std::abs(out[0][s][i]) > 0;
        }
        CHECK(total <= 20);
      }
      for (int r = 0; r < P; ++r) {
        for (std::size_t i = 0; i < n; ++i) CHECK(res[r][i] == Approx(e[r][i]).margin(1e-5));
        // k values and the flag, and the step count (6 floats, compress/step_check.hpp).
        CHECK(bytes[r] == wire::ring_allreduce(r, P, 20 + 1, 4).bytes_sent + wire::ring_allreduce(r, P, 6, 4).bytes_sent);
      }
    }
  }
}
