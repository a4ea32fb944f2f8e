// Tests of kernels/host/lowrank.hpp: PowerSGD's products against (a) a double-precision
// reference within the documented error bounds and (b) a scalar emulation of the
// documented arithmetic order, bit for bit.
// commpact-long-test: under ASan+UBSan (clang++) 91 s at -O0, 23 s at -O1 (COMMPACT_LONG_TEST_FLAGS)

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "commpact/error.hpp"
#include "commpact/kernels/host/lowrank.hpp"
#include "commpact/kernels/host/orthogonalize.hpp"

namespace {

namespace h = commpact::host;
constexpr double u = 0x1p-24;

std::vector<float> gaussian(std::size_t n, std::uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

// Float operations rounded one at a time: the product goes through a volatile float, so
// that no compiler fuses it into an FMA (also under -march=native -ffp-contract=fast).
float fmul(float a, float b) {
  volatile float p = a * b;
  return p;
}
float fadd(float a, float b) { return static_cast<float>(static_cast<double>(a) + static_cast<double>(b)); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) {
      UNSCOPED_INFO("first difference at " << i << ": " << a[i] << " vs " << b[i]);
      return false;
    }
  return true;
}

// The documented order of lowrank_project.
std::vector<float> project_emulated(const std::vector<float>& M, std::size_t n, std::size_t m,
                                    const std::vector<float>& Q, std::size_t r) {
  std::vector<float> P(n * r);
  const std::size_t m8 = m - m % 8;
  for (std::size_t c = 0; c < r; ++c)
    for (std::size_t i = 0; i < n; ++i) {
      float s[8] = {};
      for (std::size_t j = 0; j < m8; ++j) s[j % 8] = fadd(s[j % 8], fmul(M[i * m + j], Q[c * m + j]));
      float t = fadd(fadd(fadd(s[0], s[4]), fadd(s[2], s[6])), fadd(fadd(s[1], s[5]), fadd(s[3], s[7])));
      for (std::size_t j = m8; j < m; ++j) t = fadd(t, fmul(M[i * m + j], Q[c * m + j]));
      P[c * n + i] = t;
    }
  return P;
}

// The documented tree of lowrank_back_project, level by level: the rows by chunks of 128,
// each chunk's products added in row order from 0; then groups of 128 consecutive sums,
// each added in order from 0, until one sum is left.
std::vector<float> back_emulated(const std::vector<float>& M, std::size_t n, std::size_t m, const std::vector<float>& P,
                                 std::size_t r) {
  constexpr std::size_t R = 128;
  std::vector<float> Q(m * r, 0.0f);
  for (std::size_t c = 0; c < r; ++c)
    for (std::size_t j = 0; j < m; ++j) {
      std::vector<float> level;
      for (std::size_t i0 = 0; i0 < n || level.empty(); i0 += R) {
        float s = 0.0f;
        for (std::size_t i = i0; i < std::min(n, i0 + R); ++i) s = fadd(s, fmul(M[i * m + j], P[c * n + i]));
        level.push_back(s);
      }
      while (level.size() > 1) {
        std::vector<float> up;
        for (std::size_t g = 0; g < level.size(); g += R) {
          float s = 0.0f;
          for (std::size_t k = g; k < std::min(level.size(), g + R); ++k) s = fadd(s, level[k]);
          up.push_back(s);
        }
        level.swap(up);
      }
      Q[c * m + j] = level[0];
    }
  return Q;
}

std::vector<float> approx_emulated(std::size_t n, std::size_t m, const std::vector<float>& P,
                                   const std::vector<float>& Q, std::size_t r) {
  std::vector<float> A(n * m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) {
      float a = fmul(P[i], Q[j]);
      for (std::size_t c = 1; c < r; ++c) a = fadd(a, fmul(P[c * n + i], Q[c * m + j]));
      A[i * m + j] = a;
    }
  return A;
}

}  // namespace

TEST_CASE("lowrank products: documented order bit for bit, double reference within the bound",
          "[kernels][lowrank]") {
  struct shape {
    std::size_t n, m;
  };
  const shape s = GENERATE(shape{0, 5}, shape{5, 0}, shape{1, 1}, shape{1, 7}, shape{7, 8}, shape{8, 9}, shape{9, 7},
                           shape{17, 33}, shape{64, 147}, shape{100, 1000}, shape{1000003, 1}, shape{1, 1000003},
                           shape{512, 2304});
  const std::size_t r = GENERATE(1u, 2u, 3u, 4u, 8u, 11u);
  const std::uint64_t seed = GENERATE(1u, 2u);
  const std::size_t n = s.n, m = s.m;
  if ((n * m > 200000) && (r == 3 || r == 11 || seed == 2)) return;  // keep the big shapes cheap
  CAPTURE(n, m, r, seed);

  const auto g0 = gaussian(n * m, seed), e = gaussian(n * m, seed + 1, 0.3f);
  auto Q = gaussian(m * r, seed + 2);
  auto g = g0;
  std::vector<float> P(n * r, -1.0f);
  h::lowrank_project_ef(g, e, n, m, Q, r, P);
  // g now holds M = g0 + e, element by element.
  std::vector<float> M(n * m);
  for (std::size_t k = 0; k < n * m; ++k) M[k] = fadd(g0[k], e[k]);
  REQUIRE(same_bits(g, M));
  REQUIRE(same_bits(P, project_emulated(M, n, m, Q, r)));
  std::vector<float> P2(n * r, -1.0f);
  h::lowrank_project(M, n, m, Q, r, P2);
  REQUIRE(same_bits(P2, P));
  // Out of place (the space row ops<Space>::lowrank_project): g untouched, the same bits
  // in M and P; with no residual, M = g and P = g Q.
  {
    std::vector<float> Mo(n * m, -1.0f), Po(n * r, -1.0f);
    h::lowrank_project_into(g0, e, Mo, n, m, Q, r, Po);
    REQUIRE(same_bits(Mo, M));
    REQUIRE(same_bits(Po, P));
    h::lowrank_project_into(g0, {}, Mo, n, m, Q, r, Po);
    REQUIRE(same_bits(Mo, g0));
    REQUIRE(same_bits(Po, project_emulated(g0, n, m, Q, r)));
  }
  for (std::size_t c = 0; c < r; ++c)
    for (std::size_t i = 0; i < n; ++i) {
      double exact = 0, mag = 0;
      for (std::size_t j = 0; j < m; ++j) {
        exact += static_cast<double>(M[i * m + j]) * Q[c * m + j];
        mag += std::abs(static_cast<double>(M[i * m + j]) * Q[c * m + j]);
      }
      REQUIRE(std::abs(P[c * n + i] - exact) <= (static_cast<double>(m) / 8 + 11) * u * mag);
    }

  if (n > 0) h::orthonormalize_columns(P.data(), n, r, n);
  std::vector<float> Qn(m * r, -1.0f);
  h::lowrank_back_project(M, n, m, P, r, Qn);
  REQUIRE(same_bits(Qn, back_emulated(M, n, m, P, r)));
  for (std::size_t c = 0; c < r; ++c)
    for (std::size_t j = 0; j < m; ++j) {
      double exact = 0, mag = 0;
      for (std::size_t i = 0; i < n; ++i) {
        exact += static_cast<double>(M[i * m + j]) * P[c * n + i];
        mag += std::abs(static_cast<double>(M[i * m + j]) * P[c * n + i]);
      }
      REQUIRE(std::abs(Qn[c * m + j] - exact) <= static_cast<double>(n + 1) * u * mag);
    }

  auto ee = gaussian(n * m, seed + 5);  // overwritten
  h::lowrank_approx_residual(g, ee, n, m, P, Qn, r);
  const auto A = approx_emulated(n, m, P, Qn, r);
  REQUIRE(same_bits(g, A));
  std::vector<float> want_e(n * m);
  for (std::size_t k = 0; k < n * m; ++k) want_e[k] = static_cast<float>(static_cast<double>(M[k]) - A[k]);
  REQUIRE(same_bits(ee, want_e));
  std::vector<float> A2(n * m, -1.0f);
  h::lowrank_approx(A2, n, m, P, Qn, r);
  REQUIRE(same_bits(A2, A));
  // The residual in place of M (the space row ops<Space>::lowrank_approx_residual).
  {
    auto me = M;
    std::vector<float> g2(n * m, -1.0f);
    h::lowrank_approx_residual_inplace(g2, me, n, m, P, Qn, r);
    REQUIRE(same_bits(g2, A));
    REQUIRE(same_bits(me, want_e));
  }
  const std::size_t step = std::max<std::size_t>(1, n * m / 5000);
  for (std::size_t k = 0; k < n * m; k += step) {
    const std::size_t i = k / m, j = k % m;
    double exact = 0, mag = 0;
    for (std::size_t c = 0; c < r; ++c) {
      exact += static_cast<double>(P[c * n + i]) * Qn[c * m + j];
      mag += std::abs(static_cast<double>(P[c * n + i]) * Qn[c * m + j]);
    }
    REQUIRE(std::abs(A[k] - exact) <= static_cast<double>(r + 1) * u * mag);
  }
}

TEST_CASE("lowrank: a non-finite entry reaches its row of P and its column of Q", "[kernels][lowrank]") {
  const std::size_t n = 37, m = 41, r = 2;
  const std::size_t where = GENERATE(0u, 20u * 41u + 17u, 37u * 41u - 1u);
  const float bad = GENERATE(std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity());
  auto g = gaussian(n * m, 9);
  const auto e = gaussian(n * m, 10);
  const auto Q = gaussian(m * r, 11);
  g[where] = bad;
  std::vector<float> P(n * r);
  h::lowrank_project_ef(g, e, n, m, Q, r, P);
  for (std::size_t i = 0; i < n; ++i) CHECK(std::isfinite(P[i]) == (i != where / m));
  std::vector<float> ones(n * r, 1.0f), Qn(m * r);
  h::lowrank_back_project(g, n, m, ones, r, Qn);
  for (std::size_t j = 0; j < m; ++j) CHECK(std::isfinite(Qn[j]) == (j != where % m));
}

TEST_CASE("lowrank: shapes are checked", "[kernels][lowrank]") {
  std::vector<float> M(12), P(8), Q(6), e(12);
  CHECK_NOTHROW(h::lowrank_project(M, 4, 3, Q, 2, P));
  CHECK_THROWS_WITH(h::lowrank_project(M, 3, 3, Q, 2, P), Catch::Contains("n x m = 3 x 3"));
  CHECK_THROWS_WITH(h::lowrank_back_project(M, 4, 3, P, 1, Q), Catch::Contains("P holds 8"));
  CHECK_THROWS_WITH(h::lowrank_project(M, 4, 3, Q, 0, P), Catch::Contains("r = 0"));
  CHECK_THROWS_AS(h::lowrank_project_ef(M, std::vector<float>(11), 4, 3, Q, 2, P), commpact::invalid_argument);
  CHECK_THROWS_WITH(h::lowrank_approx_residual(M, M, 4, 3, P, Q, 2), Catch::Contains("separate buffer"));
  CHECK_NOTHROW(h::lowrank_approx_residual(M, e, 4, 3, P, Q, 2));
}

TEST_CASE("fill_gaussian: the sequential Box-Muller stream, pair by pair through gaussian_pair",
          "[kernels][lowrank][gaussian]") {
  // The reference is the stream as first written: one splitmix64 state advanced twice per
  // pair. gaussian_pair (shared with the CUDA rows) jumps to pair p directly.
  auto reference = [](std::size_t n, std::uint64_t seed) {
    std::vector<float> out(n);
    std::uint64_t s = seed;
    for (std::size_t i = 0; i < n; i += 2) {
      const double u1 = (static_cast<double>(h::splitmix64(s) >> 11) + 1.0) * 0x1.0p-53;
      const double u2 = static_cast<double>(h::splitmix64(s) >> 11) * 0x1.0p-53;
      const double rad = std::sqrt(-2.0 * std::log(u1));
      const double ang = 6.283185307179586476925286766559 * u2;
      out[i] = static_cast<float>(rad * std::cos(ang));
      if (i + 1 < n) out[i + 1] = static_cast<float>(rad * std::sin(ang));
    }
    return out;
  };
  for (std::uint64_t seed : {0ull, 0x51EDull, ~0ull, 0x9E3779B97F4A7C15ull})
    for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{4097}}) {
      std::vector<float> v(n, std::numeric_limits<float>::quiet_NaN());
      h::fill_gaussian(v, seed);
      const auto ref = reference(n, seed);
      for (std::size_t i = 0; i < n; ++i)
        REQUIRE(std::bit_cast<std::uint32_t>(v[i]) == std::bit_cast<std::uint32_t>(ref[i]));
      for (std::size_t p = 0; 2 * p < n; p += 97) {
        float a = 0, b = 0;
        h::gaussian_pair(seed, p, a, b);
        CHECK(std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(v[2 * p]));
        if (2 * p + 1 < n) CHECK(std::bit_cast<std::uint32_t>(b) == std::bit_cast<std::uint32_t>(v[2 * p + 1]));
      }
    }
}
