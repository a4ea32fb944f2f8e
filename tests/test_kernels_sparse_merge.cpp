// Tests of commpact::host::sparse_merge_topk and the scatter helpers against brute-force
// references.

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "commpact/error.hpp"
#include "commpact/kernels/host/scatter.hpp"
#include "commpact/kernels/host/sparse_merge.hpp"

namespace {

using commpact::host::abs_key;

struct sparse_set {
  std::vector<std::int32_t> idx;
  std::vector<float> val;
};

// Reference: union through a map (a's value, then + b's value), order by (abs_key desc,
// index asc), keep k, sort by index.
sparse_set reference_merge(const sparse_set& a, const sparse_set& b, std::size_t k) {
  std::map<std::int32_t, float> u;
  for (std::size_t i = 0; i < a.idx.size(); ++i) u[a.idx[i]] = a.val[i];
  for (std::size_t i = 0; i < b.idx.size(); ++i) {
    auto it = u.find(b.idx[i]);
    if (it == u.end())
      u[b.idx[i]] = b.val[i];
    else
      it->second = it->second + b.val[i];
  }
  std::vector<std::pair<std::int32_t, float>> e(u.begin(), u.end());
  std::stable_sort(e.begin(), e.end(),
                   [](const auto& p, const auto& q) { return abs_key(p.second) > abs_key(q.second); });
  if (e.size() > k) e.resize(k);
  std::sort(e.begin(), e.end(), [](const auto& p, const auto& q) { return p.first < q.first; });
  sparse_set r;
  for (auto& [i, v] : e) {
    r.idx.push_back(i);
    r.val.push_back(v);
  }
  return r;
}

std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<std::uint32_t>(v[i]);
  return b;
}

// Random set of `count` distinct indices in [0, universe), sorted, with values from gen.
template <class Gen>
sparse_set random_set(std::mt19937_64& rng, std::size_t universe, std::size_t count, Gen gen) {
  std::vector<std::int32_t> all(universe);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(count);
  std::sort(all.begin(), all.end());
  sparse_set s;
  s.idx = all;
  for (std::size_t i = 0; i < count; ++i) s.val.push_back(gen());
  return s;
}

sparse_set check_merge(const sparse_set& a, const sparse_set& b, std::size_t k, commpact::host::merge_workspace& ws) {
  const std::size_t room = std::min(k, a.idx.size() + b.idx.size());
  std::vector<std::int32_t> io(room + 1, -777);
  std::vector<float> vo(room + 1, -777.0f);
  const std::size_t m = commpact::host::sparse_merge_topk(a.idx, a.val, b.idx, b.val, k, std::span(io.data(), room),
                                                          std::span(vo.data(), room), ws);
  CHECK(io[room] == -777);
  CHECK(vo[room] == -777.0f);
  io.resize(m);
  vo.resize(m);
  const sparse_set ref = reference_merge(a, b, k);
  REQUIRE(io == ref.idx);
  REQUIRE(bits(vo) == bits(ref.val));
  return {io, vo};
}

}  // namespace

TEST_CASE("sparse_merge_topk matches the reference on random overlapping sets", "[kernels][merge]") {
  const std::size_t universe = GENERATE(1, 10, 1000, 100000);
  const std::uint64_t seed = GENERATE(1, 2, 3);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  auto gen = [&] { return d(rng); };
  commpact::host::merge_workspace ws;
  for (int rep = 0; rep < 4; ++rep) {
    const std::size_t na = std::uniform_int_distribution<std::size_t>(0, std::min<std::size_t>(universe, 5000))(rng);
    const std::size_t nb = std::uniform_int_distribution<std::size_t>(0, std::min<std::size_t>(universe, 5000))(rng);
    const auto a = random_set(rng, universe, na, gen);
    const auto b = random_set(rng, universe, nb, gen);
    for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::max(na, nb), na + nb, na + nb + 10, (na + nb) / 3,
                          std::uniform_int_distribution<std::size_t>(0, na + nb)(rng)}) {
      CAPTURE(universe, seed, rep, na, nb, k);
      check_merge(a, b, k, ws);
    }
  }
}

TEST_CASE("sparse_merge_topk: cancellation, ties after summing, special values", "[kernels][merge]") {
  const std::uint64_t seed = GENERATE(4, 5);
  std::mt19937_64 rng(seed);
  commpact::host::merge_workspace ws;
  const std::size_t universe = 20000;

  SECTION("coincident indices whose sum cancels to zero") {
    std::normal_distribution<float> d(0.0f, 1.0f);
    auto a = random_set(rng, universe, 3000, [&] { return d(rng); });
    sparse_set b = a;  // same indices
    for (std::size_t i = 0; i < b.val.size(); ++i) b.val[i] = (i % 2) ? -a.val[i] : 0.5f * a.val[i];
    for (std::size_t k : {std::size_t{1}, std::size_t{1000}, std::size_t{1500}, std::size_t{1600}, std::size_t{3000}}) {
      CAPTURE(k);
      const auto r = check_merge(a, b, k, ws);
      // Entries that cancelled are zero and only fill up once every non-zero entry is in.
      std::size_t zeros = 0;
      for (float v : r.val) zeros += v == 0.0f;
      CHECK(zeros == (k > 1500 ? k - 1500 : 0));
    }
  }
  SECTION("ties after summing: quantised values") {
    std::uniform_int_distribution<int> q(-4, 4);
    auto gen = [&] { return 0.25f * static_cast<float>(q(rng)); };
    const auto a = random_set(rng, universe, 5000, gen);
    const auto b = random_set(rng, universe, 5000, gen);
    for (std::size_t k : {std::size_t{1}, std::size_t{10}, std::size_t{777}, std::size_t{4000}, std::size_t{9000}}) {
      CAPTURE(k);
      check_merge(a, b, k, ws);
    }
  }
  SECTION("all values of equal magnitude") {
    auto gen = [&] { return (rng() & 1) ? 1.0f : -1.0f; };
    const auto a = random_set(rng, universe, 4000, gen);
    const auto b = random_set(rng, universe, 4000, gen);
    for (std::size_t k : {std::size_t{1}, std::size_t{100}, std::size_t{5000}}) check_merge(a, b, k, ws);
  }
  SECTION("denormals, zeros and infinities") {
    auto gen = [&] {
      switch (rng() % 5) {
        case 0:
          return std::numeric_limits<float>::denorm_min() * static_cast<float>(rng() % 8);
        case 1:
          return -0.0f;
        case 2:
          return std::numeric_limits<float>::infinity();
        case 3:
          return -std::numeric_limits<float>::infinity();
        default:
          return std::numeric_limits<float>::max();
      }
    };
    const auto a = random_set(rng, universe, 3000, gen);
    const auto b = random_set(rng, universe, 3000, gen);
    for (std::size_t k : {std::size_t{1}, std::size_t{500}, std::size_t{2500}, std::size_t{6000}}) {
      CAPTURE(k);
      check_merge(a, b, k, ws);  // inf + -inf = NaN, ranked above everything
    }
  }
  SECTION("one side empty, both empty, disjoint, k larger than the union") {
    std::normal_distribution<float> d(0.0f, 1.0f);
    const auto a = random_set(rng, universe, 100, [&] { return d(rng); });
    const sparse_set e;
    check_merge(a, e, 50, ws);
    check_merge(e, a, 50, ws);
    check_merge(e, e, 50, ws);
    sparse_set lo, hi;
    for (std::int32_t i = 0; i < 100; ++i) {
      lo.idx.push_back(i);
      lo.val.push_back(d(rng));
      hi.idx.push_back(1000 + i);
      hi.val.push_back(d(rng));
    }
    CHECK(check_merge(lo, hi, 1000, ws).idx.size() == 200);
    CHECK(check_merge(hi, lo, 150, ws).idx.size() == 150);
  }
}

TEST_CASE("sparse_merge_topk is symmetric when partners pass (lower, higher)", "[kernels][merge]") {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> d(0.0f, 1.0f);
  auto gen = [&] { return d(rng); };
  const auto a = random_set(rng, 50000, 5000, gen);
  const auto b = random_set(rng, 50000, 5000, gen);
  commpact::host::merge_workspace w1, w2;
  // Both partners call with (a, b): results are bit-identical, and equal to (b, a) too
  // for finite values (IEEE addition is commutative).
  const auto r1 = check_merge(a, b, 5000, w1);
  const auto r2 = check_merge(a, b, 5000, w2);
  CHECK(r1.idx == r2.idx);
  CHECK(bits(r1.val) == bits(r2.val));
  const auto r3 = check_merge(b, a, 5000, w2);
  CHECK(r1.idx == r3.idx);
  CHECK(bits(r1.val) == bits(r3.val));
}

TEST_CASE("sparse_merge_topk reuses its workspace", "[kernels][merge]") {
  std::mt19937_64 rng(10);
  std::normal_distribution<float> d(0.0f, 1.0f);
  auto gen = [&] { return d(rng); };
  commpact::host::merge_workspace ws;
  std::vector<std::int32_t> io(1000);
  std::vector<float> vo(1000);
  auto a = random_set(rng, 100000, 1000, gen);
  auto b = random_set(rng, 100000, 1000, gen);
  commpact::host::sparse_merge_topk(a.idx, a.val, b.idx, b.val, 1000, io, vo, ws);
  const auto allocs = ws.allocations();
  const auto bytes = ws.capacity_bytes();
  const void* data = ws.data();
  CHECK(allocs > 0);
  for (int rep = 0; rep < 5; ++rep) {
    a = random_set(rng, 100000, 1000, gen);
    b = random_set(rng, 100000, 1000 - static_cast<std::size_t>(rep), gen);
    commpact::host::sparse_merge_topk(a.idx, a.val, b.idx, b.val, 1000, io, vo, ws);
    CHECK(ws.allocations() == allocs);
    CHECK(ws.capacity_bytes() == bytes);
    CHECK(ws.data() == data);
  }
}

TEST_CASE("sparse_merge_topk rejects bad arguments", "[kernels][merge]") {
  commpact::host::merge_workspace ws;
  std::vector<std::int32_t> io(10);
  std::vector<float> vo(10);
  const std::vector<std::int32_t> ok_i = {1, 3, 5};
  const std::vector<float> ok_v = {1, 2, 3};
  const std::vector<std::int32_t> unsorted = {1, 5, 3};
  const std::vector<std::int32_t> dup = {1, 3, 3};
  const std::vector<float> short_v = {1, 2};
  using commpact::host::sparse_merge_topk;
  CHECK_THROWS_AS(sparse_merge_topk(unsorted, ok_v, ok_i, ok_v, 3, io, vo, ws), commpact::invalid_argument);
  CHECK_THROWS_WITH(sparse_merge_topk(ok_i, ok_v, unsorted, ok_v, 3, io, vo, ws),
                    Catch::Contains("set b") && Catch::Contains("not strictly sorted"));
  CHECK_THROWS_AS(sparse_merge_topk(dup, ok_v, ok_i, ok_v, 3, io, vo, ws), commpact::invalid_argument);
  CHECK_THROWS_AS(sparse_merge_topk(ok_i, short_v, ok_i, ok_v, 3, io, vo, ws), commpact::invalid_argument);
  // Outputs must hold min(k, |a| + |b|) = 5.
  CHECK_THROWS_AS(sparse_merge_topk(ok_i, ok_v, ok_i, ok_v, 5, std::span(io.data(), 4), vo, ws),
                  commpact::invalid_argument);
  CHECK_THROWS_AS(sparse_merge_topk(ok_i, ok_v, ok_i, ok_v, 5, io, std::span(vo.data(), 4), ws),
                  commpact::invalid_argument);
  CHECK(sparse_merge_topk(ok_i, ok_v, ok_i, ok_v, 100, std::span(io.data(), 6), std::span(vo.data(), 6), ws) == 3);
  CHECK(vo[0] == 2.0f);
}

TEST_CASE("scatter, scatter_add, gather, zero_at", "[kernels][scatter]") {
  std::vector<float> dense(10, 1.0f);
  const std::vector<std::int32_t> idx = {0, 3, 9, 3};
  const std::vector<float> val = {5.0f, 2.0f, -1.0f, 4.0f};
  commpact::host::scatter(dense, idx, val);
  CHECK(dense == std::vector<float>{5, 1, 1, 4, 1, 1, 1, 1, 1, -1});  // later duplicate wins
  commpact::host::scatter_add(dense, idx, val);
  CHECK(dense == std::vector<float>{10, 1, 1, 10, 1, 1, 1, 1, 1, -2});  // duplicates accumulate in order
  commpact::host::scatter_add(dense, idx, val, 0.5f);
  CHECK(dense == std::vector<float>{12.5f, 1, 1, 13, 1, 1, 1, 1, 1, -2.5f});
  std::vector<float> got(4);
  commpact::host::gather(dense, idx, got);
  CHECK(got == std::vector<float>{12.5f, 13, -2.5f, 13});
  commpact::host::zero_at(dense, idx);
  CHECK(dense == std::vector<float>{0, 1, 1, 0, 1, 1, 1, 1, 1, 0});

  // Out-of-range indices raise and leave the dense vector untouched.
  const auto before = dense;
  const std::vector<std::int32_t> bad = {1, 10};
  const std::vector<std::int32_t> neg = {-1};
  const std::vector<float> two = {7.0f, 7.0f};
  const std::vector<float> one = {7.0f};
  CHECK_THROWS_AS(commpact::host::scatter(dense, bad, two), commpact::invalid_argument);
  CHECK_THROWS_WITH(commpact::host::scatter_add(dense, bad, two), Catch::Contains("index 10"));
  CHECK_THROWS_AS(commpact::host::scatter_add(dense, neg, one, 2.0f), commpact::invalid_argument);
  std::vector<float> got2(2);
  CHECK_THROWS_WITH(commpact::host::gather(dense, bad, got2), Catch::Contains("outside"));
  CHECK_THROWS_AS(commpact::host::zero_at(dense, bad), commpact::invalid_argument);
  CHECK_THROWS_AS(commpact::host::scatter(dense, idx, two), commpact::invalid_argument);  // length mismatch
  CHECK(dense == before);
}
