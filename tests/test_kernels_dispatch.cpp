// Tests of the run-time instruction-set dispatch (kernels/host/isa.hpp): every level this
// CPU runs gives the bits of the scalar references, for the O(n) passes of vector_ops.hpp
// and the fp16 and bf16 conversions and CastAllreduce passes of half.hpp, bf16.hpp and
// cast.hpp. The half conversions are checked over all 65536 codes (half -> float) and,
// float -> half, over a strided sweep of all float bit patterns, every rounding tie and
// its neighbours, the overflow and subnormal edges and random bits.

#include <algorithm>
#include <bit>
#include <cmath>
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "commpact/compress/codecs/casts.hpp"
#include "commpact/error.hpp"
#include "commpact/kernels/host/cast.hpp"
#include "commpact/kernels/host/half.hpp"
#include "commpact/kernels/host/isa.hpp"
#include "commpact/kernels/host/topk.hpp"
#include "commpact/kernels/host/vector_ops.hpp"

namespace {

namespace h = commpact::host;
namespace isa = commpact::host::isa;

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

//! Every level this CPU runs, lowest first.
std::vector<isa::level> levels() {
  std::vector<isa::level> out;
  for (isa::level l : {isa::level::base, isa::level::avx2, isa::level::avx512})
    if (l <= isa::detected()) out.push_back(l);
  return out;
}

//! Forces a level for its lifetime.
struct at_level {
  isa::level was;
  explicit at_level(isa::level l) : was(isa::force(l)) {}
  ~at_level() { isa::force(was); }
  at_level(const at_level&) = delete;
  at_level& operator=(const at_level&) = delete;
};

// Products rounded one at a time (a volatile float: no FMA contraction in the reference).
float mul_ref(float a, float b) {
  volatile float p = a * b;
  return p;
}

//! Floats for the float -> half checks: a strided sweep of all bit patterns, every half's
//! midpoint to its successor and the floats one unit either side, the saturation and
//! overflow edges, signed zeros, float subnormals, Infs, NaNs with payloads, random bits.
std::vector<float> half_probe_floats() {
  std::vector<std::uint32_t> b;
  for (std::uint64_t x = 0; x <= 0xFFFFFFFFull; x += 16381) b.push_back(static_cast<std::uint32_t>(x));
  for (std::uint32_t hcode = 0; hcode < 0x7C00u; ++hcode) {
    // The float halfway between half hcode and hcode + 1 (both positive): a tie.
    const double lo = commpact::detail::from_half(static_cast<std::uint16_t>(hcode));
    const double hi = hcode + 1 == 0x7C00u ? 65536.0 : commpact::detail::from_half(static_cast<std::uint16_t>(hcode + 1));
    const std::uint32_t mid = bits(static_cast<float>((lo + hi) / 2));
    for (std::uint32_t m : {mid - 1, mid, mid + 1}) {
      b.push_back(m);
      b.push_back(m | 0x80000000u);
    }
  }
  for (std::uint32_t edge : {0x477FE000u, 0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x47800000u, 0x7F7FFFFFu, 0x7F800000u,
                             0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0x7FA00000u, 0x00000000u, 0x00000001u, 0x007FFFFFu,
                             0x00800000u, 0x33000000u, 0x33000001u, 0x32FFFFFFu, 0x387FFFFFu, 0x38800000u}) {
    b.push_back(edge);
    b.push_back(edge | 0x80000000u);
  }
  std::mt19937 rng(37);
  for (int i = 0; i < 100000; ++i) b.push_back(static_cast<std::uint32_t>(rng()));
  std::uniform_real_distribution<float> sub(-6.2e-5f, 6.2e-5f);  // the half subnormals and around
  for (int i = 0; i < 100000; ++i) b.push_back(bits(sub(rng)));
  std::vector<float> f(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) f[i] = from_bits(b[i]);
  return f;
}

}  // namespace

TEST_CASE("isa: levels are ordered, forcing one the CPU lacks is refused", "[kernels][isa]") {
  CHECK(isa::active() <= isa::detected());
  CHECK(std::string(isa::name(isa::level::avx2)) == "avx2");
  for (isa::level l : levels()) {
    at_level a(l);
    CHECK(isa::active() == l);
  }
  if (isa::detected() < isa::level::avx512) CHECK_THROWS_AS(isa::force(isa::level::avx512), commpact::invalid_argument);
  INFO("detected: " << isa::name(isa::detected()));
  SUCCEED();
}

TEST_CASE("half: from_half over all 65536 codes gives the scalar bits at every level", "[kernels][isa][half]") {
  std::vector<std::uint16_t> codes(65536 + 5);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint16_t>(i);
  for (isa::level l : levels()) {
    at_level a(l);
    INFO("level " << isa::name(l));
    // Offsets 0 and 3: whole vectors and scalar tails both cover every code.
    for (std::size_t off : {std::size_t{0}, std::size_t{3}}) {
      std::vector<float> out(codes.size() - off);
      h::half::from_half(std::span<const std::uint16_t>(codes).subspan(off), out);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < out.size(); ++i)
        bad += bits(out[i]) != bits(commpact::detail::from_half(codes[off + i]));
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("half: to_half and to_half_ieee give the scalar bits at every level", "[kernels][isa][half]") {
  const std::vector<float> f = half_probe_floats();
  std::vector<std::uint16_t> ref(f.size()), ref_ieee(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    ref[i] = commpact::detail::to_half(f[i]);
    ref_ieee[i] = commpact::detail::to_half_ieee(f[i]);
  }
  // The probe reaches the cases that matter: saturation, overflow to Inf, NaN, ties.
  CHECK(std::count(ref.begin(), ref.end(), std::uint16_t{0x7BFF}) > 1);
  CHECK(std::count(ref_ieee.begin(), ref_ieee.end(), std::uint16_t{0x7C00}) > 1);
  CHECK(std::count(ref.begin(), ref.end(), std::uint16_t{0x7E00}) > 1);
  for (isa::level l : levels()) {
    at_level a(l);
    INFO("level " << isa::name(l));
    for (std::size_t off : {std::size_t{0}, std::size_t{5}}) {
      const std::span<const float> in = std::span<const float>(f).subspan(off);
      std::vector<std::uint16_t> got(in.size()), got_ieee(in.size());
      h::half::to_half(in, got);
      h::half::to_half_ieee(in, got_ieee);
      std::size_t bad = 0, bad_ieee = 0, first = in.size();
      for (std::size_t i = 0; i < in.size(); ++i) {
        bad += got[i] != ref[off + i];
        bad_ieee += got_ieee[i] != ref_ieee[off + i];
        if ((got[i] != ref[off + i] || got_ieee[i] != ref_ieee[off + i]) && first == in.size()) first = i;
      }
      INFO("first mismatch at float bits " << (first < in.size() ? bits(in[first]) : 0u));
      CHECK(bad == 0);
      CHECK(bad_ieee == 0);
    }
  }
}

TEMPLATE_TEST_CASE("CastAllreduce's fp16 and bf16 passes give the scalar bits at every level", "[kernels][isa][half]",
                   commpact::fp16_codec, commpact::bf16_codec) {
  using Cast = TestType;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1e-4f);  // mostly half subnormals, as gradients
  const std::size_t n = 4099;
  std::vector<float> g(n), r(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = nd(rng);
    r[i] = i % 3 == 0 ? 0.0f : nd(rng) * 0.01f;
  }
  g[5] = 70000.0f;  // saturates in fp16
  g[6] = 3.4e38f;   // saturates in bf16
  g[17] = std::numeric_limits<float>::infinity();
  g[40] = std::numeric_limits<float>::quiet_NaN();
  r[41] = std::numeric_limits<float>::infinity();
  g[n - 1] = -std::numeric_limits<float>::infinity();
  // Reference: the per-value scalar code.
  std::vector<std::uint16_t> codes_ref(n), codes_ref_nor(n);
  std::vector<float> cand_ref(n, -1.0f), cand_ref_nor(n, -1.0f);
  for (std::size_t i = 0; i < n; ++i) {
    codes_ref[i] = h::cast_encode_value<Cast>(g[i], r.data(), i, cand_ref.data());
    codes_ref_nor[i] = h::cast_encode_value<Cast>(g[i], nullptr, i, cand_ref_nor.data());
  }
  // Sums: random code pairs, including signalling and quiet NaN codes and Infs.
  std::vector<std::uint16_t> in(n), mine(n), add_ref(n);
  for (std::size_t i = 0; i < n; ++i) {
    in[i] = static_cast<std::uint16_t>(rng());
    mine[i] = i % 2 ? codes_ref[i] : static_cast<std::uint16_t>(rng());
  }
  in[1] = 0x7C01;  // signalling NaN (fp16)
  in[3] = 0x7F81;  // signalling NaN (bf16)
  in[4] = 0xFF80;  // -Inf (bf16)
  mine[2] = 0xFC00;
  for (std::size_t i = 0; i < n; ++i) add_ref[i] = Cast::add(in[i], mine[i]);
  std::vector<float> mean_ref(n);
  const std::vector<std::uint16_t>& fin = codes_ref_nor;  // holds NaN codes
  std::vector<std::uint16_t> finite_codes(n);
  for (std::size_t i = 0; i < n; ++i) finite_codes[i] = Cast::finite_code(fin[i]) ? fin[i] : 0x3C00;
  for (std::size_t i = 0; i < n; ++i) mean_ref[i] = commpact::mean_of(Cast::from_code(finite_codes[i]), 3);

  for (isa::level l : levels()) {
    at_level a(l);
    INFO("level " << isa::name(l));
    std::vector<std::uint16_t> codes(n);
    std::vector<float> cand(n, -1.0f);
    h::cast_encode<Cast>(g, r, codes, cand);
    CHECK(codes == codes_ref);
    CHECK(std::equal(cand.begin(), cand.end(), cand_ref.begin(), [](float x, float y) { return bits(x) == bits(y); }));
    h::cast_encode<Cast>(g, {}, codes, cand);
    CHECK(codes == codes_ref_nor);
    CHECK(std::equal(cand.begin(), cand.end(), cand_ref_nor.begin(), [](float x, float y) { return bits(x) == bits(y); }));
    h::cast_encode<Cast>(g, r, codes, {});
    CHECK(codes == codes_ref);

    std::vector<std::uint16_t> sum = mine;
    h::cast_add<Cast>(in, sum);
    // Bits equal, except the sign of NaN + NaN: x86 returns the first operand's NaN and
    // the compiler may swap the operands of a float addition, in the scalar code as well.
    auto is_nan = [](std::uint16_t c) { return std::isnan(Cast::from_code(c)); };
    std::size_t mismatched = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (sum[i] != add_ref[i] && !(is_nan(in[i]) && is_nan(mine[i]) && (sum[i] & 0x7FFFu) == (add_ref[i] & 0x7FFFu)))
        ++mismatched;
    CHECK(mismatched == 0);

    std::vector<float> out(n, 5.0f);
    CHECK_FALSE(h::cast_decode_mean<Cast>(codes_ref_nor, out, 3));  // holds NaN codes
    CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 5.0f; }));
    REQUIRE(h::cast_decode_mean<Cast>(finite_codes, out, 3));
    CHECK(std::equal(out.begin(), out.end(), mean_ref.begin(), [](float x, float y) { return bits(x) == bits(y); }));
  }
}

TEST_CASE("vector_ops: every level gives the scalar bits and the same first bad index", "[kernels][isa]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (std::size_t n : {std::size_t{0}, std::size_t{7}, std::size_t{1024 * 3 + 13}, std::size_t{20000}}) {
    for (int with_bad : {0, 1}) {
      std::vector<float> x(n), y(n), u(n);
      for (std::size_t i = 0; i < n; ++i) {
        x[i] = nd(rng);
        y[i] = nd(rng);
        u[i] = nd(rng);
      }
      const std::size_t bad_at = with_bad && n > 0 ? n * 2 / 3 : n;
      if (bad_at < n) x[bad_at] = std::numeric_limits<float>::quiet_NaN();
      const float s = 0.37f, big = 3.0f, m = 0.9f;
      // Scalar references.
      std::vector<float> sc(n), sc_big(n), mean3(n), mean4(n), add(n), sub(n), ef0(n), ef1(n), ef2(n), ef3(n), un2(n),
          un3(n);
      for (std::size_t i = 0; i < n; ++i) {
        sc[i] = mul_ref(x[i], s);
        sc_big[i] = mul_ref(x[i], big);
        mean3[i] = x[i] / 3.0f;
        mean4[i] = x[i] / 4.0f;
        add[i] = x[i] + y[i];
        sub[i] = x[i] - y[i];
        ef0[i] = y[i] + x[i];
        ef1[i] = y[i] + mul_ref(x[i], s);
        un2[i] = mul_ref(u[i], m) + x[i];
        ef2[i] = y[i] + un2[i];
        un3[i] = mul_ref(u[i], m) + mul_ref(x[i], s);
        ef3[i] = y[i] + un3[i];
      }
      auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](float p, float q) { return bits(p) == bits(q); });
      };
      for (isa::level l : levels()) {
        at_level a(l);
        INFO("level " << isa::name(l) << ", n " << n << ", bad at " << bad_at);
        CHECK(h::first_nonfinite(x) == bad_at);
        std::vector<float> t = x;
        h::scale(t, s);
        CHECK(same(t, sc));
        t = x;
        CHECK(h::scale_checked(t, s) == bad_at);
        CHECK(same(t, sc));
        t = x;
        CHECK(h::scale_checked(t, big) == bad_at);
        CHECK(same(t, sc_big));
        std::vector<float> o(n);
        CHECK(h::mean_checked(x, o, 3) == bad_at);
        CHECK(same(o, mean3));
        CHECK(h::mean_checked(x, o, 4) == bad_at);
        CHECK(same(o, mean4));
        t = x;
        h::add(t, y);
        CHECK(same(t, add));
        t = x;
        h::sub(t, y);
        CHECK(same(t, sub));
        CHECK(h::ef_accumulate(o, y, x) == bad_at);
        CHECK(same(o, ef0));
        CHECK(h::ef_accumulate(o, y, x, s) == bad_at);
        CHECK(same(o, ef1));
        std::vector<float> un(n);
        CHECK(h::ef_accumulate_momentum(o, un, u, y, x, m) == bad_at);
        CHECK(same(o, ef2));
        CHECK(same(un, un2));
        CHECK(h::ef_accumulate_momentum(o, un, u, y, x, m, s) == bad_at);
        CHECK(same(o, ef3));
        CHECK(same(un, un3));
      }
    }
  }
}

TEST_CASE("vector_ops: the streamed accumulation gives the same bits at every level", "[kernels][isa]") {
  // n >= stream_min with acc in a buffer of its own: the non-temporal path, plus a tail.
  const std::size_t n = h::detail::stream_min + 1000;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> g(n), r(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = nd(rng);
    r[i] = nd(rng);
  }
  g[n - 3] = std::numeric_limits<float>::infinity();
  std::vector<float> ref(n);
  for (std::size_t i = 0; i < n; ++i) ref[i] = r[i] + mul_ref(g[i], 0.5f);
  for (isa::level l : levels()) {
    at_level a(l);
    INFO("level " << isa::name(l));
    std::vector<float> acc(n);
    CHECK(h::ef_accumulate(acc, r, g, 0.5f) == n - 3);
    CHECK(std::equal(acc.begin(), acc.end(), ref.begin(), [](float x, float y) { return bits(x) == bits(y); }));
  }
}

TEST_CASE("topk_abs: the collect pass gives the same selection at every level", "[kernels][isa][topk]") {
  // n >= 2^15 takes the sampled path, whose collect pass is dispatched; the reference is
  // a full sort by (key desc, index asc).
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (std::size_t n : {std::size_t{1} << 15, (std::size_t{1} << 17) + 7}) {
    for (int tied : {0, 1}) {
      std::vector<float> x(n);
      for (auto& v : x) v = tied ? static_cast<float>(static_cast<int>(nd(rng) * 4.0f)) : nd(rng);
      const std::size_t k = n / 1000 + 1;
      std::vector<std::size_t> order(n);
      for (std::size_t i = 0; i < n; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(),
                       [&](std::size_t a, std::size_t b) { return h::abs_key(x[a]) > h::abs_key(x[b]); });
      std::vector<std::int32_t> want(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
      std::sort(want.begin(), want.end());
      for (isa::level l : levels()) {
        at_level a(l);
        INFO("level " << isa::name(l) << ", n " << n << ", tied " << tied);
        h::topk_workspace ws;
        std::vector<std::int32_t> idx(k);
        std::vector<float> val(k);
        h::topk_abs(x, k, idx, val, ws);
        CHECK(idx == want);
        bool vals_ok = true;
        for (std::size_t j = 0; j < k; ++j) vals_ok &= bits(val[j]) == bits(x[static_cast<std::size_t>(idx[j])]);
        CHECK(vals_ok);
        if (!tied) CHECK(ws.last_path() == h::topk_path::sampled);
      }
    }
  }
}
