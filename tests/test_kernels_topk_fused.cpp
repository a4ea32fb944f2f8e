// Tests of commpact::host::ef_accumulate_topk_abs (kernels/host/topk_fused.hpp) against
// its definition: host::ef_accumulate followed by host::topk_abs, bit for bit (acc, idx,
// val, the returned index and the path taken), on random, tied, sparse, non-finite and
// denormal inputs, with and without a residual and a scale.
// commpact-long-test: under ASan+UBSan (clang++) 156 s at -O0, 66 s at -O1 (COMMPACT_LONG_TEST_FLAGS)

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "commpact/error.hpp"
#include "commpact/kernels/host/topk.hpp"
#include "commpact/kernels/host/topk_fused.hpp"
#include "commpact/kernels/host/vector_ops.hpp"

namespace {

namespace h = commpact::host;
using h::topk_path;

enum class kind { normal, tied, sparse, nonfinite_g, nonfinite_r, denormal };

std::vector<std::uint32_t> bits(std::span<const float> v) {
  std::vector<std::uint32_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<std::uint32_t>(v[i]);
  return b;
}

// Residual r and gradient g of length n of the given kind.
void make(kind kd, std::size_t n, std::uint64_t seed, std::vector<float>& r, std::vector<float>& g) {
  std::mt19937_64 rng(seed * 1000003 + n);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  r.resize(n);
  g.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    r[i] = nd(rng);
    g[i] = nd(rng);
  }
  const auto pos = [&] { return static_cast<std::size_t>(rng() % n); };
  switch (kd) {
    case kind::normal:
      break;
    case kind::tied: {  // a handful of values, both signs and zeros: massive ties
      const float vals[] = {-2.0f, -1.0f, -0.0f, 0.0f, 1.0f, 2.0f, 0.5f};
      for (std::size_t i = 0; i < n; ++i) {
        r[i] = vals[rng() % 7];
        g[i] = vals[rng() % 7];
      }
      break;
    }
    case kind::sparse:  // an embedding-like gradient: zeros but for a few rows, zero residual
      for (std::size_t i = 0; i < n; ++i) {
        r[i] = (i % 3 == 0) ? -0.0f : 0.0f;
        g[i] = rng() % 4000 == 0 ? nd(rng) : ((i % 2) ? -0.0f : 0.0f);
      }
      break;
    case kind::nonfinite_g:
    case kind::nonfinite_r: {
      auto& v = kd == kind::nonfinite_g ? g : r;
      const float specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0xffc01234u),
                                std::bit_cast<float>(0x7f800001u)};
      const std::size_t count = 1 + n / 5000;
      for (std::size_t c = 0; c < count; ++c) v[pos()] = specials[rng() % 5];
      if (n > 1) {  // Inf - Inf = NaN
        const std::size_t p = pos();
        r[p] = std::numeric_limits<float>::infinity();
        g[p] = -std::numeric_limits<float>::infinity();
      }
      break;
    }
    case kind::denormal:  // denormals, signed zeros, and a few normals
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t m = static_cast<std::uint32_t>(rng() % 0x800000u);
        const std::uint32_t sign = static_cast<std::uint32_t>(rng() & 1u) << 31;
        r[i] = rng() % 3 == 0 ? std::bit_cast<float>(sign) : std::bit_cast<float>(sign | m);
        g[i] = rng() % 5 == 0 ? -0.0f : std::bit_cast<float>(static_cast<std::uint32_t>(rng() % 0x1000u));
        if (rng() % 10000 == 0) g[i] = nd(rng) * 1e-30f;
      }
      break;
  }
}

// A float buffer aligned to 64 bytes (so that large spans take the streaming-store path).
struct aligned_floats {
  explicit aligned_floats(std::size_t n)
      : n_(n), p_(static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64 + 64))) {}
  std::span<float> span(std::size_t offset = 0) { return {p_.get() + offset, n_ - offset}; }

 private:
  struct freer {
    void operator()(float* p) const { std::free(p); }
  };
  std::size_t n_;
  std::unique_ptr<float, freer> p_;
};

// The reference's accumulation, ef_accumulate of (r, g, scale) (an empty residual counts
// as zeros): computed once and checked against the fused call for every k.
struct accumulated {
  std::vector<float> acc;
  std::vector<std::uint32_t> acc_bits;
  std::size_t bad = 0;
};
accumulated reference_acc(std::span<const float> r, std::span<const float> g, std::optional<float> scale) {
  const std::size_t n = g.size();
  const std::vector<float> r_ref = r.empty() ? std::vector<float>(n, 0.0f) : std::vector<float>(r.begin(), r.end());
  accumulated a;
  a.acc.resize(n);
  a.bad = scale ? h::ef_accumulate(a.acc, r_ref, g, *scale) : h::ef_accumulate(a.acc, r_ref, g);
  a.acc_bits = bits(a.acc);
  return a;
}

// Checks the fused call against ef_accumulate + topk_abs (ref: reference_acc of the same
// r, g and scale). acc is the fused output buffer (not aliasing r or g).
void check_fused(std::span<float> acc, std::span<const float> r, std::span<const float> g, std::optional<float> scale,
                 std::size_t k, h::topk_workspace& ws, const accumulated& ref) {
  const std::vector<float>& acc_ref = ref.acc;
  const std::size_t bad_ref = ref.bad;
  h::topk_workspace ws_ref;
  std::vector<std::int32_t> idx_ref(k);
  std::vector<float> val_ref(k);
  h::topk_abs(acc_ref, k, idx_ref, val_ref, ws_ref);

  constexpr std::int32_t sentinel_i = -12345;
  const float sentinel_v = std::bit_cast<float>(0x7fc0deadu);
  std::vector<std::int32_t> idx(k + 1, sentinel_i);
  std::vector<float> val(k + 1, sentinel_v);
  const std::size_t bad = h::ef_accumulate_topk_abs(acc, r, g, scale, k, std::span(idx.data(), k),
                                                    std::span(val.data(), k), ws);
  CHECK(idx[k] == sentinel_i);
  CHECK(std::bit_cast<std::uint32_t>(val[k]) == 0x7fc0deadu);
  idx.resize(k);
  val.resize(k);
  REQUIRE(bad == bad_ref);
  REQUIRE(bits(acc) == ref.acc_bits);
  REQUIRE(idx == idx_ref);
  REQUIRE(bits(val) == bits(val_ref));
  // The same sample and the same acc: the same path as topk_abs.
  CHECK(ws.last_path() == ws_ref.last_path());
}

void check_fused(std::span<float> acc, std::span<const float> r, std::span<const float> g, std::optional<float> scale,
                 std::size_t k, h::topk_workspace& ws) {
  check_fused(acc, r, g, scale, k, ws, reference_acc(r, g, scale));
}

std::vector<std::size_t> ks_for(std::size_t n) {
  std::vector<std::size_t> ks = {0, 1, n};
  if (n > 1) ks.push_back(n - 1);
  for (double d : {0.001, 0.01, 0.1, 0.5}) ks.push_back(std::max<std::size_t>(1, static_cast<std::size_t>(d * n)));
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

}  // namespace

TEST_CASE("ef_accumulate_topk_abs equals ef_accumulate + topk_abs bit for bit", "[kernels][topk][fused]") {
  const std::size_t n = GENERATE(std::size_t{1}, std::size_t{7}, std::size_t{1000}, (std::size_t{1} << 15) + 3,
                                 std::size_t{1} << 20);
  const kind kd =
      GENERATE(kind::normal, kind::tied, kind::sparse, kind::nonfinite_g, kind::nonfinite_r, kind::denormal);
  const std::uint64_t seed = GENERATE(1, 2);
  const bool with_r = GENERATE(true, false);
  const std::optional<float> scale = GENERATE(std::optional<float>{}, std::optional<float>{0.37f});
  std::vector<float> r, g;
  make(kd, n, seed, r, g);
  h::topk_workspace ws;  // one per (n, kind, seed, ...), reused over k
  std::vector<float> acc(n);
  const std::span<const float> rs = with_r ? std::span<const float>(r) : std::span<const float>();
  const accumulated ref = reference_acc(rs, g, scale);  // the same for every k
  for (std::size_t k : ks_for(n)) {
    CAPTURE(n, static_cast<int>(kd), seed, with_r, scale.has_value(), k);
    check_fused(acc, rs, g, scale, k, ws, ref);
  }
}

TEST_CASE("ef_accumulate_topk_abs: the fused path is taken on Gaussian data", "[kernels][topk][fused]") {
  const std::size_t n = std::size_t{1} << 20;
  std::vector<float> r, g;
  make(kind::normal, n, 5, r, g);
  h::topk_workspace ws;
  std::vector<float> acc(n);
  for (std::size_t k : {n / 1000, n / 100}) {
    CAPTURE(k);
    check_fused(acc, r, g, std::nullopt, k, ws);
    CHECK(ws.last_path() == topk_path::sampled);
  }
  SECTION("tied data: the bound misses and it falls back to topk_abs over acc") {
    make(kind::tied, n, 5, r, g);
    check_fused(acc, r, g, std::nullopt, n / 1000, ws);
    CHECK(ws.last_path() != topk_path::sampled);
  }
}

TEST_CASE("ef_accumulate_topk_abs: streaming stores, misaligned and in-place outputs", "[kernels][topk][fused]") {
  // Above host::detail::stream_min (2^21) with a tail that is not a whole block.
  const std::size_t n = (std::size_t{1} << 21) + 37;
  const kind kd = GENERATE(kind::normal, kind::nonfinite_g, kind::tied);
  const std::optional<float> scale = GENERATE(std::optional<float>{}, std::optional<float>{0.37f});
  std::vector<float> r, g;
  make(kd, n, 9, r, g);
  h::topk_workspace ws;
  const std::size_t k = n / 1000;
  CAPTURE(static_cast<int>(kd), scale.has_value());
  SECTION("aligned output of its own (streaming)") {
    aligned_floats acc(n);
    check_fused(acc.span(), r, g, scale, k, ws);
    check_fused(acc.span(), {}, g, scale, k, ws);
  }
  SECTION("misaligned output (plain stores)") {
    aligned_floats acc(n + 1);
    check_fused(acc.span(1), r, g, scale, k, ws);
  }
  SECTION("in place: acc is the residual") {
    std::vector<float> acc = r;
    const std::vector<float> r_copy = r;
    // The reference reads the inputs first, so pass the copy as the reference's view
    // through a wrapper: compute the reference here.
    std::vector<float> acc_ref(n);
    const std::size_t bad_ref = scale ? h::ef_accumulate(acc_ref, r_copy, g, *scale) : h::ef_accumulate(acc_ref, r_copy, g);
    h::topk_workspace ws_ref;
    std::vector<std::int32_t> idx_ref(k), idx(k);
    std::vector<float> val_ref(k), val(k);
    h::topk_abs(acc_ref, k, idx_ref, val_ref, ws_ref);
    const std::size_t bad = h::ef_accumulate_topk_abs(acc, acc, g, scale, k, idx, val, ws);
    CHECK(bad == bad_ref);
    CHECK(bits(acc) == bits(acc_ref));
    CHECK(idx == idx_ref);
    CHECK(bits(val) == bits(val_ref));
  }
  SECTION("in place: acc is g") {
    std::vector<float> acc = g;
    std::vector<float> acc_ref(n);
    const std::size_t bad_ref = scale ? h::ef_accumulate(acc_ref, r, g, *scale) : h::ef_accumulate(acc_ref, r, g);
    h::topk_workspace ws_ref;
    std::vector<std::int32_t> idx_ref(k), idx(k);
    std::vector<float> val_ref(k), val(k);
    h::topk_abs(acc_ref, k, idx_ref, val_ref, ws_ref);
    const std::size_t bad = h::ef_accumulate_topk_abs(acc, r, acc, scale, k, idx, val, ws);
    CHECK(bad == bad_ref);
    CHECK(bits(acc) == bits(acc_ref));
    CHECK(idx == idx_ref);
    CHECK(bits(val) == bits(val_ref));
  }
}

TEST_CASE("ef_accumulate_topk_abs: a scale that overflows, and NaNs beyond k", "[kernels][topk][fused]") {
  const std::size_t n = (std::size_t{1} << 15) + 3;
  std::vector<float> r, g;
  make(kind::normal, n, 3, r, g);
  h::topk_workspace ws;
  std::vector<float> acc(n);
  SECTION("g * s overflows to Inf at a few places") {
    g[100] = 3e38f;
    g[20000] = -3e38f;
    check_fused(acc, r, g, 10.0f, 5, ws);
    check_fused(acc, r, g, 10.0f, n / 1000, ws);
  }
  SECTION("more NaNs than k: the selection is the first k NaNs' order by payload, then index") {
    for (std::size_t i = 0; i < n; i += 97) g[i] = std::numeric_limits<float>::quiet_NaN();
    check_fused(acc, r, g, std::nullopt, 10, ws);
    check_fused(acc, r, g, std::nullopt, n / 50, ws);
  }
}

TEST_CASE("ef_accumulate_topk_abs does not allocate after the first call of an (n, k)", "[kernels][topk][fused]") {
  const std::size_t n = GENERATE(std::size_t{1000}, std::size_t{1} << 20);
  const std::size_t k = std::max<std::size_t>(1, n / 1000);
  std::vector<float> r, g;
  make(kind::normal, n, 4, r, g);
  std::vector<float> acc(n);
  std::vector<std::int32_t> idx(k);
  std::vector<float> val(k);
  h::topk_workspace ws;
  (void)h::ef_accumulate_topk_abs(acc, r, g, std::nullopt, k, idx, val, ws);
  const std::size_t after_first = ws.allocations();
  const void* where = ws.data();
  for (int step = 0; step < 3; ++step) {
    make(step == 1 ? kind::tied : kind::normal, n, 10 + step, r, g);  // a fallback step too
    (void)h::ef_accumulate_topk_abs(acc, r, g, 0.5f, k, idx, val, ws);
    (void)h::ef_accumulate_topk_abs(acc, {}, g, std::nullopt, k, idx, val, ws);
    h::topk_abs(acc, k, idx, val, ws);  // shares the buffers with topk_abs
  }
  CHECK(ws.allocations() == after_first);
  CHECK(ws.data() == where);
}

TEST_CASE("ef_accumulate_topk_abs rejects bad arguments before writing", "[kernels][topk][fused]") {
  std::vector<float> r(100, 1.0f), g(100, 2.0f), acc(100, 7.0f), shortv(99);
  std::vector<std::int32_t> idx(10);
  std::vector<float> val(10);
  h::topk_workspace ws;
  CHECK_THROWS_AS(h::ef_accumulate_topk_abs(acc, r, shortv, std::nullopt, 5, idx, val, ws), commpact::invalid_argument);
  CHECK_THROWS_AS(h::ef_accumulate_topk_abs(acc, shortv, g, std::nullopt, 5, idx, val, ws), commpact::invalid_argument);
  CHECK_THROWS_AS(h::ef_accumulate_topk_abs(acc, r, g, std::nullopt, 101, idx, val, ws), commpact::invalid_argument);
  CHECK_THROWS_AS(h::ef_accumulate_topk_abs(acc, r, g, std::nullopt, 11, idx, val, ws), commpact::invalid_argument);
  CHECK_THROWS_AS(h::ef_accumulate_topk_abs(std::span(acc).subspan(1), std::span<const float>(acc).first(99),
                                            std::span<const float>(g).first(99), std::nullopt, 5, idx, val, ws),
                  commpact::invalid_argument);
  CHECK(std::all_of(acc.begin(), acc.end(), [](float v) { return v == 7.0f; }));
}
