// Tests of kernels/host/vector_ops.hpp and commit.hpp against plain scalar references:
// results compared bit for bit, non-finite values placed at the start, the middle, the
// end and random positions, sizes around the vector and block widths.
// commpact-long-test: under ASan+UBSan (clang++) 130 s at -O0, 54 s at -O1 (COMMPACT_LONG_TEST_FLAGS)

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "commpact/error.hpp"
#include "commpact/kernels/host/vector_ops.hpp"

namespace {

namespace h = commpact::host;
constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

std::vector<float> gaussian(std::size_t n, std::uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

// Products and sums rounded to float one at a time. The product goes through a volatile
// float, so that no compiler fuses it into an FMA (GCC turns (float)((double)a * b) into
// a float product and would contract it under -march=native -ffp-contract=fast).
float mul_ref(float a, float b) {
  volatile float p = a * b;
  return p;
}
float add_ref(float a, float b) { return static_cast<float>(static_cast<double>(a) + static_cast<double>(b)); }
float sub_ref(float a, float b) { return static_cast<float>(static_cast<double>(a) - static_cast<double>(b)); }

std::size_t first_bad_ref(const std::vector<float>& x) {
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i])) return i;
  return x.size();
}

// Equal bits, or both NaN (the payload a NaN operation returns is the hardware's choice).
bool same(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) || (std::isnan(a) && std::isnan(b));
}
void require_same(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = got.size();
  for (std::size_t i = 0; i < got.size() && bad == got.size(); ++i)
    if (!same(got[i], want[i])) bad = i;
  INFO("first difference at " << bad);
  REQUIRE(bad == got.size());
}

// Positions for the non-finite values: none, start, middle, end, random, two (the first counts).
std::vector<std::size_t> poison_positions(std::size_t n, int where, std::uint64_t seed) {
  if (n == 0 || where == 0) return {};
  std::mt19937_64 rng(seed * 7 + 3);
  switch (where) {
    case 1: return {0};
    case 2: return {n / 2};
    case 3: return {n - 1};
    case 4: return {static_cast<std::size_t>(rng() % n)};
    default: {
      const std::size_t a = rng() % n, b = rng() % n;
      return {a, b};
    }
  }
}

}  // namespace

TEST_CASE("first_nonfinite, scale, scale_checked, add, sub match scalar loops", "[kernels][vector_ops]") {
  const std::size_t n = GENERATE(0u, 1u, 7u, 8u, 9u, 15u, 16u, 17u, 1023u, 1024u, 1025u, 4099u, 1000003u);
  const std::uint64_t seed = GENERATE(1u, 2u);
  const int where = GENERATE(0, 1, 2, 3, 4, 5);
  const float bad_value = GENERATE(qnan, inf, -inf);
  if (n > 100000 && seed == 2) return;  // keep the large size cheap
  CAPTURE(n, seed, where, bad_value);
  auto x = gaussian(n, seed);
  for (std::size_t p : poison_positions(n, where, seed)) x[p] = bad_value;
  const std::size_t want_bad = first_bad_ref(x);

  CHECK(h::first_nonfinite(x) == want_bad);

  const float s = 0.37f;
  std::vector<float> ref(n);
  for (std::size_t i = 0; i < n; ++i) ref[i] = mul_ref(x[i], s);
  auto y = x;
  h::scale(y, s);
  require_same(y, ref);
  y = x;
  CHECK(h::scale_checked(y, s) == want_bad);
  require_same(y, ref);
  // |s| > 1 takes the other path: same results.
  for (std::size_t i = 0; i < n; ++i) ref[i] = mul_ref(x[i], -3.5f);
  y = x;
  CHECK(h::scale_checked(y, -3.5f) == want_bad);
  require_same(y, ref);
  // Overflow in the product is not a non-finite input.
  if (where == 0 && n > 0) {
    y = x;
    y[n / 3] = 3e38f;
    CHECK(h::scale_checked(y, 4.0f) == n);
    CHECK(y[n / 3] == inf);
  }

  const auto z = gaussian(n, seed + 100);
  for (std::size_t i = 0; i < n; ++i) ref[i] = add_ref(x[i], z[i]);
  y = x;
  h::add(y, z);
  require_same(y, ref);
  for (std::size_t i = 0; i < n; ++i) ref[i] = sub_ref(x[i], z[i]);
  y = x;
  h::sub(y, z);
  require_same(y, ref);
  // In place: y += y, y -= y.
  for (std::size_t i = 0; i < n; ++i) ref[i] = add_ref(x[i], x[i]);
  y = x;
  h::add(y, y);
  require_same(y, ref);
  for (std::size_t i = 0; i < n; ++i) ref[i] = sub_ref(x[i], x[i]);
  y = x;
  h::sub(y, y);
  require_same(y, ref);
}

TEST_CASE("ef_accumulate and ef_accumulate_momentum match scalar loops", "[kernels][vector_ops]") {
  // 2100003 >= 2^21: a separate acc takes the non-temporal store path.
  const std::size_t n = GENERATE(0u, 1u, 7u, 8u, 9u, 1023u, 1024u, 1025u, 5000u, 1000003u, 2100003u);
  const std::uint64_t seed = GENERATE(3u, 4u);
  const int where = GENERATE(0, 1, 2, 3, 4, 5);
  const int kind = GENERATE(0, 1, 2, 3);            // no scale / scale / momentum / momentum + scale
  const int placement = GENERATE(0, 1, 2);          // acc separate / acc = residual / acc = g
  // Keep the large sizes cheap: one seed; clean, middle and end only (the small sizes
  // cover every position).
  if (n > 100000 && (seed == 4 || where == 1 || where >= 4 || (n > 2000000 && placement != 0))) return;
  CAPTURE(n, seed, where, kind, placement);
  auto g = gaussian(n, seed);
  const auto r = gaussian(n, seed + 1, 0.5f);
  const auto u = gaussian(n, seed + 2, 0.25f);
  for (std::size_t p : poison_positions(n, where, seed)) g[p] = (p % 2) ? qnan : -inf;
  const float s = 0.731f, m = 0.9f;

  std::vector<float> want_acc(n), want_u(n);
  for (std::size_t i = 0; i < n; ++i) {
    float gi = (kind == 1 || kind == 3) ? mul_ref(s, g[i]) : g[i];
    if (kind >= 2) {
      gi = add_ref(mul_ref(m, u[i]), gi);
      want_u[i] = gi;
    }
    want_acc[i] = add_ref(r[i], gi);
  }
  const std::size_t want_bad = first_bad_ref(want_acc);

  auto rr = r, gg = g, acc = std::vector<float>(n, -1.0f);
  std::span<float> out = placement == 0 ? std::span<float>(acc) : placement == 1 ? std::span<float>(rr) : std::span<float>(gg);
  std::size_t bad = 0;
  if (kind < 2) {
    bad = kind == 0 ? h::ef_accumulate(out, rr, gg) : h::ef_accumulate(out, rr, gg, s);
  } else {
    const bool in_place_u = seed % 2 == 1;
    std::vector<float> uu = u, un(n, -1.0f);
    std::span<float> u_next = in_place_u ? std::span<float>(uu) : std::span<float>(un);
    bad = kind == 2 ? h::ef_accumulate_momentum(out, u_next, uu, rr, gg, m)
                    : h::ef_accumulate_momentum(out, u_next, uu, rr, gg, m, s);
    require_same(std::vector<float>(u_next.begin(), u_next.end()), want_u);
  }
  CHECK(bad == want_bad);
  require_same(std::vector<float>(out.begin(), out.end()), want_acc);
}

TEST_CASE("ef_accumulate: overflow is reported, FMA is never used", "[kernels][vector_ops]") {
  // r + s * g with values chosen so that a fused multiply-add would round differently:
  // s * g = 1 + 3 2^-23 + 2^-45 exactly, 1 + 3 2^-23 in float; -1 + that is 3 2^-23,
  // while an FMA would give 3 2^-23 + 2^-45.
  const std::size_t n = 2048 + 3;
  const float g0 = 1.0f + 0x1p-23f, s = 1.0f + 0x1p-22f;
  std::vector<float> g(n, g0), r(n, -1.0f), acc(n);
  CHECK(h::ef_accumulate(acc, r, g, s) == n);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(acc[i] == 0x1p-23f * 3.0f);
  std::vector<float> big(n, 3e38f);
  big[1500] = 1.0f;
  CHECK(h::ef_accumulate(acc, big, big) == 0);
  std::vector<float> ok(n, 1.0f);
  ok[2050] = 3e38f;
  CHECK(h::ef_accumulate(acc, ok, ok) == 2050);
}

TEST_CASE("vector_ops reject unequal lengths and shifted overlap", "[kernels][vector_ops]") {
  std::vector<float> a(100, 1.0f), b(99, 1.0f), u(100, 0.0f);
  std::span<float> sa(a);
  CHECK_THROWS_AS(h::add(sa, b), commpact::invalid_argument);
  CHECK_THROWS_AS(h::sub(sa.first(50), sa.subspan(1, 50)), commpact::invalid_argument);
  CHECK_THROWS_WITH(h::ef_accumulate(sa, b, a), Catch::Contains("residual holds 99") &&
                                                    Catch::Contains("same length"));
  CHECK_THROWS_AS(h::ef_accumulate(sa.first(50), sa.subspan(3, 50), sa.subspan(50, 50)), commpact::invalid_argument);
  CHECK_THROWS_WITH(h::ef_accumulate_momentum(sa, u, u, b, a, 0.9f), Catch::Contains("same length"));
  std::vector<float> r(100, 0.0f), g(100, 0.0f);
  CHECK_THROWS_WITH(h::ef_accumulate_momentum(a, r, u, r, g, 0.9f), Catch::Contains("u_next is the same buffer"));
  CHECK_THROWS_WITH(h::ef_accumulate_momentum(u, a, u, r, g, 0.9f), Catch::Contains("acc is the same buffer as u"));
}

TEST_CASE("scatter_into_zeroed and commit_sparse match fill + scatter", "[kernels][commit]") {
  const std::size_t n = GENERATE(0u, 1u, 7u, 9u, 1023u, 1025u, 1000003u, (1u << 21) + 5u);
  const std::uint64_t seed = GENERATE(5u, 6u);
  const int density = GENERATE(0, 1, 2, 3);  // k = 0, n / 1000 + 1, n / 3, n
  const std::size_t offset = GENERATE(0u, 1u);  // misaligned output
  if (n > 100000 && seed == 6) return;  // keep the large sizes cheap
  CAPTURE(n, seed, density, offset);
  std::mt19937_64 rng(seed);
  std::size_t k = density == 0 ? 0 : density == 1 ? std::min(n, n / 1000 + 1) : density == 2 ? n / 3 : n;
  std::vector<std::int32_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<std::int32_t> idx(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k));
  std::sort(idx.begin(), idx.end());
  const auto val = gaussian(k, seed + 9);
  const float divisor = 3.0f;

  std::vector<float> store(n + offset, 7.0f);
  std::span<float> out(store.data() + offset, n);
  std::vector<float> want(n, 0.0f);
  for (std::size_t j = 0; j < k; ++j) want[static_cast<std::size_t>(idx[j])] = val[j] / divisor;

  auto residual = gaussian(n, seed + 10), velocity = gaussian(n, seed + 11);
  std::vector<std::uint8_t> alive(k);
  for (auto& a : alive) a = static_cast<std::uint8_t>(rng() % 2);
  auto want_r = residual, want_v = velocity;
  for (std::size_t j = 0; j < k; ++j)
    if (alive[j]) want_r[static_cast<std::size_t>(idx[j])] = want_v[static_cast<std::size_t>(idx[j])] = 0.0f;

  h::commit_sparse(out, idx, val, divisor, residual, velocity, idx, alive);
  require_same(std::vector<float>(out.begin(), out.end()), want);
  if (offset) CHECK(store[0] == 7.0f);
  require_same(residual, want_r);
  require_same(velocity, want_v);

  // Without velocity and alive flags: every delivered entry leaves the residual.
  auto res2 = gaussian(n, seed + 10);
  h::commit_sparse(out, idx, val, 1.0f, res2, {}, idx);
  std::size_t wrong = k;
  for (std::size_t j = 0; j < k && wrong == k; ++j)
    if (res2[static_cast<std::size_t>(idx[j])] != 0.0f || !same(out[static_cast<std::size_t>(idx[j])], val[j])) wrong = j;
  REQUIRE(wrong == k);
}

TEST_CASE("scatter_into_zeroed and commit_sparse validate before writing", "[kernels][commit]") {
  std::vector<float> out(2000, 5.0f), res(2000, 1.0f);
  const std::vector<float> val = {1.0f, 2.0f, 3.0f};
  const std::vector<std::int32_t> outside = {3, 10, 2000}, negative = {-1, 3, 4};
  CHECK_THROWS_WITH(h::scatter_into_zeroed(out, outside, val), Catch::Contains("index 2000"));
  CHECK_THROWS_AS(h::scatter_into_zeroed(out, negative, val), commpact::invalid_argument);
  CHECK_THROWS_AS(h::scatter_into_zeroed(out, std::vector<std::int32_t>{1, 2}, val), commpact::invalid_argument);
  const std::vector<std::int32_t> good = {1, 2, 3};
  CHECK_THROWS_WITH(h::commit_sparse(out, good, val, 1.0f, res, {}, outside), Catch::Contains("outside the residual"));
  std::vector<float> short_velocity(5);
  CHECK_THROWS_AS(h::commit_sparse(out, good, val, 1.0f, res, short_velocity, good), commpact::invalid_argument);
  CHECK_THROWS_AS(h::commit_sparse(out, good, val, 1.0f, out, {}, good), commpact::invalid_argument);
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 5.0f; }));
  CHECK(std::all_of(res.begin(), res.end(), [](float v) { return v == 1.0f; }));
  // Any order; a repeated index takes the later value.
  const std::vector<std::int32_t> unsorted = {10, 3, 10};
  h::scatter_into_zeroed(out, unsorted, val, 2.0f);
  CHECK(out[10] == 1.5f);
  CHECK(out[3] == 1.0f);
  CHECK(std::count(out.begin(), out.end(), 0.0f) == 1998);
}

TEST_CASE("mean_checked is src / float(P) bit for bit, for P a power of two (a product) and not", "[kernels][mean]") {
  std::mt19937_64 g(77);
  const std::size_t n = 5000;  // several SIMD blocks and a scalar tail
  std::vector<float> src(n);
  for (auto& v : src) {
    // every exponent: normal, subnormal and huge values, both signs, zeros
    v = std::bit_cast<float>(static_cast<std::uint32_t>(g()) & 0xFF7FFFFFu);
  }
  src[3] = 0.0f, src[4] = -0.0f, src[5] = std::numeric_limits<float>::denorm_min();
  for (int P : {1, 2, 3, 4, 5, 7, 8, 16, 64, 96, 1024}) {
    CAPTURE(P);
    std::vector<float> dst(n, 1.0f);
    const std::size_t bad = commpact::host::mean_checked(src, dst, P);
    std::size_t want_bad = n;
    for (std::size_t i = 0; i < n; ++i) {
      const float want = src[i] / static_cast<float>(P);
      REQUIRE(std::bit_cast<std::uint32_t>(dst[i]) == std::bit_cast<std::uint32_t>(want));
      if (!std::isfinite(want) && want_bad == n) want_bad = i;
    }
    REQUIRE(bad == want_bad);
    std::vector<float> inplace = src;  // in place (Dense's form): the same bits and index
    REQUIRE(commpact::host::mean_checked(inplace, P) == want_bad);
    REQUIRE(inplace == dst);
  }
  // a NaN is reported at its index on both paths
  src[4321] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> dst(n);
  REQUIRE(commpact::host::mean_checked(src, dst, 4) == 4321);
  REQUIRE(commpact::host::mean_checked(src, dst, 3) == 4321);
  std::vector<float> a = src, b = src;
  REQUIRE(commpact::host::mean_checked(a, 4) == 4321);
  REQUIRE(commpact::host::mean_checked(b, 3) == 4321);
}
