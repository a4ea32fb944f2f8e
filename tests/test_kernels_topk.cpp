// Tests of commpact::host::topk_abs against a brute-force reference (a full stable sort by
// (abs_key desc, index asc)) on random and adversarial inputs.
// commpact-long-test: under ASan+UBSan (clang++) 93 s at -O0, 14 s at -O1 (COMMPACT_LONG_TEST_FLAGS)

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "commpact/error.hpp"
#include "commpact/kernels/host/topk.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace {

using commpact::host::abs_key;
using commpact::host::topk_path;

struct selection {
  std::vector<std::int32_t> idx;
  std::vector<float> val;
};

// Reference: order all indices by (abs_key desc, index asc), keep the first k, sort by index.
selection reference_topk(const std::vector<float>& x, std::size_t k) {
  std::vector<std::int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int32_t a, std::int32_t b) { return abs_key(x[a]) > abs_key(x[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  selection s;
  s.idx = order;
  for (auto i : order) s.val.push_back(x[i]);
  return s;
}

// Bitwise comparison of values (so that -0 vs +0 and NaN payloads count).
std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<std::uint32_t>(v[i]);
  return b;
}

// Runs topk_abs with outputs one larger than k, filled with a sentinel, and checks the
// result against the reference, that nothing past k was written, and the threshold API.
topk_path check_topk(const std::vector<float>& x, std::size_t k, commpact::host::topk_workspace& ws) {
  constexpr std::int32_t sentinel_i = -12345;
  const float sentinel_v = std::bit_cast<float>(0x7fc0dead);
  std::vector<std::int32_t> idx(k + 1, sentinel_i);
  std::vector<float> val(k + 1, sentinel_v);
  commpact::host::topk_abs(x, k, std::span(idx.data(), k), std::span(val.data(), k), ws);
  const topk_path path = ws.last_path();
  CHECK(idx[k] == sentinel_i);
  CHECK(std::bit_cast<std::uint32_t>(val[k]) == 0x7fc0deadu);
  idx.resize(k);
  val.resize(k);
  const selection ref = reference_topk(x, k);
  REQUIRE(idx == ref.idx);
  REQUIRE(bits(val) == bits(ref.val));

  // The threshold API describes the same selection.
  const auto t = commpact::host::topk_abs_threshold(x, k, ws);
  CHECK(t.above + t.ties_taken == k);
  if (k > 0) {
    std::uint32_t kth = 0xffffffffu;
    for (auto i : ref.idx) kth = std::min(kth, abs_key(x[i]));
    CHECK(t.key == kth);
    CHECK(std::bit_cast<std::uint32_t>(t.magnitude) == kth);
    std::size_t above = 0;
    for (float v : x) above += abs_key(v) > kth;
    CHECK(t.above == above);
    CHECK(t.ties_taken >= 1);
    std::vector<std::int32_t> idx2(k);
    std::vector<float> val2(k);
    CHECK(commpact::host::select_by_threshold(x, t, idx2, val2) == k);
    CHECK(idx2 == ref.idx);
    CHECK(bits(val2) == bits(ref.val));
  } else {
    CHECK(t.above == 0);
    CHECK(t.ties_taken == 0);
  }
  return path;
}

std::vector<float> gaussian(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

std::size_t random_k(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 1);
  return std::uniform_int_distribution<std::size_t>(0, n)(rng);
}

}  // namespace

TEST_CASE("topk_abs matches the brute-force reference on random data", "[kernels][topk]") {
  const std::size_t n = GENERATE(0, 1, 2, 3, 15, 16, 17, 100, 1000, 4097, 32767, 32768, 100000, 300007);
  const std::uint64_t seed = GENERATE(1, 2, 3);
  const auto x = gaussian(n, seed);
  commpact::host::topk_workspace ws;
  std::vector<std::size_t> ks = {0, n, random_k(n, seed)};
  if (n >= 1) ks.insert(ks.end(), {1, n - 1, n / 2});
  if (n >= 1000) ks.insert(ks.end(), {n / 1000, n / 100, n / 10, n / 3});
  for (std::size_t k : ks) {
    CAPTURE(n, seed, k);
    check_topk(x, k, ws);
  }
}

TEST_CASE("topk_abs takes every path and each agrees with the reference", "[kernels][topk]") {
  commpact::host::topk_workspace ws;
  const std::size_t n = 200003;
  SECTION("sampled: Gaussian data, small density") {
    const auto x = gaussian(n, 11);
    CHECK(check_topk(x, n / 1000, ws) == topk_path::sampled);
    CHECK(check_topk(x, n / 100, ws) == topk_path::sampled);
  }
  SECTION("direct: small n, or large k") {
    const auto small = gaussian(1000, 12);
    CHECK(check_topk(small, 10, ws) == topk_path::direct);
    const auto x = gaussian(n, 12);
    CHECK(check_topk(x, n / 2, ws) == topk_path::direct);
  }
  SECTION("sampled_retry: the sample overestimates the threshold") {
    // The sample reads `len` entries at `chunks` evenly spaced points. Put very large values
    // at 64 sampled points and moderate ones elsewhere: the sample's bound lets fewer than k
    // entries through, so the kernel falls back to a histogram, whose top buckets are small.
    auto x = gaussian(n, 13);
    for (auto& v : x) v *= 1e-3f;
    std::vector<char> sampled(n, 0);
    const std::size_t chunks = commpact::host::topk_workspace::sample_chunks_for(n, 200);
    const std::size_t len = commpact::host::topk_workspace::sample_chunk_len;
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t start = c * (n - len) / (chunks - 1);
      for (std::size_t q = 0; q < len; ++q) sampled[start + q] = 1;
      if (c < 64) x[start] = 1000.0f + static_cast<float>(c);
    }
    std::size_t placed = 0;
    for (std::size_t i = 50; i < n && placed < 300; i += 401)
      if (!sampled[i]) x[i] = 1.0f + 0.01f * static_cast<float>(placed++);
    REQUIRE(placed == 300);
    CHECK(check_topk(x, 200, ws) == topk_path::sampled_retry);
  }
  SECTION("sampled_second_bound: a large group of ties at the sampled bound") {
    // Half the entries are 0.5, so the sample's bound is 0.5 and far too many entries pass;
    // the next larger sample key (the smallest of 30 sampled values >= 1) is a good bound.
    auto x = gaussian(n, 14);
    for (auto& v : x) v *= 1e-3f;
    for (std::size_t i = 0; i < n; i += 2) x[i] = 0.5f;
    std::vector<char> sampled(n, 0);
    const std::size_t chunks = commpact::host::topk_workspace::sample_chunks_for(n, 200);
    REQUIRE(chunks == commpact::host::topk_workspace::sample_chunks_for(n, 290));
    const std::size_t len = commpact::host::topk_workspace::sample_chunk_len;
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t start = c * (n - len) / (chunks - 1);
      for (std::size_t q = 0; q < len; ++q) sampled[start + q] = 1;
      if (c < 30) x[start] = -1.0f - 1e-3f * static_cast<float>(c);
    }
    std::size_t placed = 0;
    for (std::size_t i = 51; i < n && placed < 270; i += 401)
      if (!sampled[i]) x[i] = 1.5f + 1e-3f * static_cast<float>(placed++);
    REQUIRE(placed == 270);
    CHECK(check_topk(x, 200, ws) == topk_path::sampled_second_bound);
    CHECK(check_topk(x, 290, ws) == topk_path::sampled_second_bound);
  }
  SECTION("sampled_fallback: everything ties") {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = (i % 3 == 0) ? -0.5f : 0.5f;
    CHECK(check_topk(x, n / 1000, ws) == topk_path::sampled_fallback);
  }
}

TEST_CASE("topk_abs on adversarial inputs", "[kernels][topk]") {
  const std::size_t n = GENERATE(1, 2, 31, 1000, 65537, 200003);
  const std::uint64_t seed = GENERATE(5, 6);
  std::mt19937_64 rng(seed);
  commpact::host::topk_workspace ws;
  std::vector<std::size_t> ks = {0, 1, n, random_k(n, seed)};
  if (n > 1000) ks.insert(ks.end(), {n / 1000, n / 100});

  auto run_all = [&](const std::vector<float>& x) {
    for (std::size_t k : ks) {
      CAPTURE(n, seed, k);
      check_topk(x, k, ws);
    }
  };

  SECTION("all equal magnitude, random signs") {
    std::vector<float> x(n);
    for (auto& v : x) v = (rng() & 1) ? 0.75f : -0.75f;
    run_all(x);
  }
  SECTION("quantised values: few distinct magnitudes") {
    std::normal_distribution<float> d(0.0f, 2.0f);
    std::vector<float> x(n);
    for (auto& v : x) v = std::round(d(rng)) * 0.25f;
    run_all(x);
  }
  SECTION("all zeros, +0 and -0") {
    std::vector<float> x(n);
    for (auto& v : x) v = (rng() & 1) ? 0.0f : -0.0f;
    run_all(x);
  }
  SECTION("mostly zeros with a few non-zeros") {
    std::vector<float> x(n, 0.0f);
    for (std::size_t i = 0; i < n; i += 97) x[i] = static_cast<float>(rng() % 5) - 2.0f;
    run_all(x);
  }
  SECTION("denormals and tiny normals") {
    std::vector<float> x(n);
    for (auto& v : x) {
      const std::uint32_t mant = static_cast<std::uint32_t>(rng()) & 0x007fffffu;
      const std::uint32_t expo = (rng() % 4 == 0) ? (1u << 23) : 0u;  // some smallest normals
      const std::uint32_t sign = (rng() & 1) ? 0x80000000u : 0u;
      v = std::bit_cast<float>(sign | expo | (mant & 0x3fu));  // few mantissa values: ties
    }
    run_all(x);
  }
  SECTION("+-Inf among finite values") {
    auto x = gaussian(n, seed);
    for (std::size_t i = 3; i < n; i += 1009)
      x[i] = (i % 2) ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
    x[n - 1] = std::numeric_limits<float>::infinity();
    run_all(x);
  }
  SECTION("sorted ascending and descending magnitudes") {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i) * ((i % 2) ? 1.0f : -1.0f);
    run_all(x);
    std::reverse(x.begin(), x.end());
    run_all(x);
  }
  SECTION("the extremes of the key range") {
    std::vector<float> x(n);
    for (auto& v : x) {
      switch (rng() % 4) {
        case 0:
          v = std::numeric_limits<float>::max();
          break;
        case 1:
          v = -std::numeric_limits<float>::denorm_min();
          break;
        case 2:
          v = std::numeric_limits<float>::min();
          break;
        default:
          v = -std::numeric_limits<float>::max();
          break;
      }
    }
    run_all(x);
  }
}

TEST_CASE("topk_abs with NaN: NaNs rank above Inf, no out-of-bounds writes", "[kernels][topk]") {
  const std::size_t n = GENERATE(5, 1000, 200003);
  auto x = gaussian(n, 77);
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  const float nan_payload = std::bit_cast<float>(0xffc00123u);  // negative NaN, larger payload
  x[n / 2] = qnan;
  x[0] = -std::numeric_limits<float>::infinity();
  if (n > 10) {
    x[n - 1] = nan_payload;
    x[7] = qnan;
  }
  commpact::host::topk_workspace ws;
  for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3}, n / 100, n}) {
    CAPTURE(n, k);
    check_topk(x, k, ws);
  }
  // k = number of NaNs: exactly the NaNs are selected.
  const std::size_t nans = n > 10 ? 3 : 1;
  std::vector<std::int32_t> idx(nans);
  std::vector<float> val(nans);
  commpact::host::topk_abs(x, nans, idx, val, ws);
  for (float v : val) CHECK(std::isnan(v));
  // All NaN input.
  std::vector<float> all(n, qnan);
  for (std::size_t k : {std::size_t{1}, n / 2, n}) check_topk(all, k, ws);
}

TEST_CASE("topk_abs reuses its workspace", "[kernels][topk]") {
  const std::size_t n = GENERATE(1000, 200003);
  const std::size_t k = n / 100;
  commpact::host::topk_workspace ws;
  std::vector<std::int32_t> idx(k);
  std::vector<float> val(k);
  const auto x = gaussian(n, 3);
  commpact::host::topk_abs(x, k, idx, val, ws);
  const std::size_t allocs = ws.allocations();
  const std::size_t bytes = ws.capacity_bytes();
  const void* data = ws.data();
  for (std::uint64_t seed = 4; seed < 8; ++seed) {
    const auto y = gaussian(n, seed);
    commpact::host::topk_abs(y, k, idx, val, ws);
    commpact::host::topk_abs(y, k / 2, idx, val, ws);  // smaller k: no growth either
    CHECK(ws.allocations() == allocs);
    CHECK(ws.capacity_bytes() == bytes);
    CHECK(ws.data() == data);
  }
  if (n > 100000) {
    CHECK(ws.last_path() == topk_path::sampled);
    CHECK(allocs > 0);
    // The buffer is O(k), not O(n).
    CHECK(bytes < n * sizeof(float));
  }
  // The fallback on tied data does not allocate either.
  std::vector<float> tied(n, 1.0f);
  commpact::host::topk_abs(tied, k, idx, val, ws);
  CHECK(ws.allocations() == allocs);
}

TEST_CASE("topk_abs rejects bad arguments with invalid_argument", "[kernels][topk]") {
  commpact::host::topk_workspace ws;
  std::vector<float> x(10, 1.0f);
  std::vector<std::int32_t> idx(10);
  std::vector<float> val(10);
  CHECK_THROWS_AS(commpact::host::topk_abs(x, 11, idx, val, ws), commpact::invalid_argument);
  CHECK_THROWS_WITH(commpact::host::topk_abs(x, 11, idx, val, ws),
                    Catch::Contains("k = 11") && Catch::Contains("n = 10"));
  CHECK_THROWS_AS(commpact::host::topk_abs(x, 5, std::span(idx.data(), 4), val, ws), commpact::invalid_argument);
  CHECK_THROWS_AS(commpact::host::topk_abs(x, 5, idx, std::span(val.data(), 4), ws), commpact::invalid_argument);
  CHECK_THROWS_AS(commpact::host::topk_abs_threshold(x, 11, ws), commpact::invalid_argument);
  CHECK_NOTHROW(commpact::host::topk_abs(x, 5, std::span(idx.data(), 5), std::span(val.data(), 5), ws));
  CHECK_NOTHROW(
      commpact::host::topk_abs(std::span<const float>(), 0, std::span<std::int32_t>(), std::span<float>(), ws));
#if defined(__linux__)
  // n >= 2^31: a real (lazily mapped, never touched) 8 GiB range.
  const std::size_t big = std::size_t{1} << 31;
  void* p = mmap(nullptr, big * sizeof(float), PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p != MAP_FAILED) {
    std::span<const float> huge(static_cast<const float*>(p), big);
    CHECK_THROWS_AS(commpact::host::topk_abs(huge, 1, idx, val, ws), commpact::invalid_argument);
    CHECK_THROWS_WITH(commpact::host::topk_abs(huge, 1, idx, val, ws), Catch::Contains("2^31"));
    munmap(p, big * sizeof(float));
  }
#endif
}
