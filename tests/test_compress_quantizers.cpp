// The quantising codecs (quantizers.hpp, casts.hpp) and EF-SignSGD (sign_codec):
//  - encode against brute-force references written here from the papers' definitions
//    (no bit packing; the casts by a scan over every 16-bit code), decode round trip;
//  - unbiasedness of QSGD, TernGrad and natural compression over many seeded steps,
//    with a bound that a biased rounding fails (checked too);
//  - malformed messages raise wire_error and leave the accumulator alone;
//  - CodecCompressor<codec, Allgather<ThreadComm>> for P = 1..8 equals the serial
//    reference bit for bit on every rank, and conserves (sum of g = P sum of outputs
//    plus the residuals);
//  - bytes through CountingComm equal (P - 1)(48 + the codec's formula rounded up to 4).
// Multi-rank cases run under CheckedComm<ThreadComm> (tests/common/checked_runs.hpp).
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/topology/ring.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "common/checked_runs.hpp"

using namespace commpact;

static_assert(Codec<qsgd_codec> && Codec<terngrad_codec> && Codec<onebit_codec> && Codec<natural_codec> &&
              Codec<fp16_codec> && Codec<bf16_codec>);
static_assert(req::codec_has_bind_rank<qsgd_codec> && !req::codec_has_bind_rank<onebit_codec>);

namespace {

using vec = std::vector<float>;
using ref_fn = std::function<vec(const vec&, std::int64_t step, int rank)>;

//! Normal values over six decades, with exact zeros and a few negative zeros.
vec sample(std::uint64_t seed, std::size_t n) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::uniform_real_distribution<float> e(-3.f, 3.f);
  vec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = (i % 11 == 5) ? 0.0f : (i % 13 == 7 ? -0.0f : d(g) * std::pow(10.f, e(g)));
  return v;
}

// --- brute-force references -----------------------------------------------------
ref_fn ref_qsgd(std::uint32_t s, std::uint64_t seed, std::size_t d = 512) {
  return [=](const vec& v, std::int64_t step, int rank) {
    const random_stream u(seed, step, rank);
    const std::size_t b = d ? d : v.size();
    vec q(v.size(), 0.0f);
    for (std::size_t i = 0; i < v.size(); ++i) {
      double ss = 0;  // the norm of i's bucket, recomputed for every i
      for (std::size_t j = i / b * b; j < std::min(v.size(), i / b * b + b); ++j) ss += double(v[j]) * v[j];
      const float norm = float(std::min(std::sqrt(ss), double(std::numeric_limits<float>::max())));
      if (norm == 0.0f) continue;
      const double r = std::abs(double(v[i])) * (double(s) / norm);  // |v_i| s / ||v_B||
      double l = std::floor(r);
      if (l >= s) l = s;
      else if (u.uniform(i) < r - l) l += 1;
      const float mag = float(double(norm) * l / s);
      q[i] = v[i] < 0 ? -mag : mag;
    }
    return q;
  };
}
ref_fn ref_terngrad(std::uint64_t seed) {
  return [=](const vec& v, std::int64_t step, int rank) {
    float m = 0;
    for (float x : v) m = std::max(m, std::abs(x));
    const random_stream u(seed, step, rank);
    vec q(v.size(), 0.0f);
    for (std::size_t i = 0; i < v.size(); ++i)
      if (m > 0 && u.uniform(i) < std::abs(double(v[i])) / m) q[i] = v[i] < 0 ? -m : m;
    return q;
  };
}
vec ref_onebit(const vec& v, std::int64_t, int) {
  double sp = 0, sn = 0;
  int np = 0, nn = 0;
  for (float x : v) (x < 0 ? (sn += x, ++nn) : (sp += x, ++np));
  vec q(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) q[i] = v[i] < 0 ? float(sn / nn) : float(sp / np);
  return q;
}
ref_fn ref_natural(std::uint64_t seed) {
  return [=](const vec& v, std::int64_t step, int rank) {
    const random_stream u(seed, step, rank);
    vec q(v.size(), 0.0f);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double a = std::abs(double(v[i]));
      if (a == 0) continue;
      double lo = 0, hi = std::ldexp(1.0, -126);
      if (a >= hi) {
        lo = hi;
        while (lo * 2 <= a && lo < std::ldexp(1.0, 127)) lo *= 2;
        hi = lo < std::ldexp(1.0, 127) ? 2 * lo : lo;
      }
      const double mag = (hi > lo && u.uniform(i) < (a - lo) / (hi - lo)) ? hi : lo;
      q[i] = float(v[i] < 0 ? -mag : mag);
    }
    return q;
  };
}
//! Nearest finite value of a 16-bit format (ties: even code), by a scan of every code.
vec ref_cast(const vec& v, float (*decode)(std::uint16_t), std::uint16_t max_finite) {
  vec q(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double a = std::abs(double(v[i]));
    std::uint32_t best = 0;
    if (a >= decode(max_finite)) {
      best = max_finite;  // saturated (and |a - x| would not be exact in double)
    } else {
      for (std::uint32_t c = 1; c <= max_finite; ++c) {
        const double d = std::abs(decode(std::uint16_t(c)) - a), db = std::abs(decode(std::uint16_t(best)) - a);
        if (d < db || (d == db && (c & 1u) == 0)) best = c;
      }
    }
    q[i] = std::signbit(v[i]) ? -decode(std::uint16_t(best)) : decode(std::uint16_t(best));
  }
  return q;
}
float half_ref(std::uint16_t h) {  // the IEEE formula, independent of casts.hpp
  const int e = (h >> 10) & 31, m = h & 1023;
  return float(e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15));
}
float bf16_ref(std::uint16_t b) {
  const int e = (b >> 7) & 255, m = b & 127;
  return float(e == 0 ? std::ldexp(double(m), -133) : std::ldexp(1.0 + m / 128.0, e - 127));
}
vec ref_fp16(const vec& v, std::int64_t, int) { return ref_cast(v, half_ref, 0x7BFF); }
vec ref_bf16(const vec& v, std::int64_t, int) { return ref_cast(v, bf16_ref, 0x7F7F); }
vec ref_sign(const vec& v, std::int64_t, int) {
  double l1 = 0;
  for (float x : v) l1 += std::abs(double(x));
  const float s = float(l1 / double(v.size()));
  vec q(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) q[i] = v[i] < 0 ? -s : s;
  return q;
}

template <class K>
vec encode_decode(K& k, const vec& v, std::int64_t step, int rank, std::size_t* bytes = nullptr) {
  if constexpr (req::codec_has_begin_step<K>) k.begin_step(step);
  if constexpr (req::codec_has_bind_rank<K>) k.bind_rank(rank);
  std::vector<std::byte> msg(k.max_encoded_bytes(v.size()) + 3, std::byte{0x5A});
  vec approx(v.size(), -1.0f), acc(v.size(), 0.0f);
  const std::size_t b = k.encode(v, msg, approx);
  if (bytes) *bytes = b;
  REQUIRE(b == k.max_encoded_bytes(v.size()));
  k.decode_add(std::span<const std::byte>(msg).first(b), acc);
  CHECK(acc == approx);  // the receivers decode what the sender kept as delivered
  return approx;
}

template <class K>
void check_reference(K k, const ref_fn& ref, const std::function<std::size_t(std::size_t)>& expected_bytes) {
  for (std::size_t n : {1, 2, 7, 8, 9, 33, 1000}) {
    for (std::int64_t step : {0, 5}) {
      for (int rank : {0, 3}) {
        CAPTURE(n, step, rank);
        const vec v = sample(n * 31 + step * 7 + rank, n);
        std::size_t bytes = 0;
        CHECK(encode_decode(k, v, step, rank, &bytes) == ref(v, step, rank));
        CHECK(bytes == expected_bytes(n));
      }
    }
  }
}

}  // namespace

TEST_CASE("quantising codecs equal their brute-force references; lengths equal the formulas", "[codec][quant]") {
  SECTION("QSGD") {
    auto nb = [](std::size_t n, std::size_t d) { return (n + d - 1) / d; };
    check_reference(qsgd_codec{1, 9}, ref_qsgd(1, 9), [=](std::size_t n) { return 4 * nb(n, 512) + (2 * n + 7) / 8; });
    check_reference(qsgd_codec{5, 1, 7}, ref_qsgd(5, 1, 7), [=](std::size_t n) { return 4 * nb(n, 7) + (4 * n + 7) / 8; });
    check_reference(qsgd_codec{256, 3, 0}, ref_qsgd(256, 3, 0), [](std::size_t n) { return 4 + (10 * n + 7) / 8; });
    check_reference(qsgd_codec{65535, 3, 100}, ref_qsgd(65535, 3, 100),
                    [=](std::size_t n) { return 4 * nb(n, 100) + (17 * n + 7) / 8; });
  }
  SECTION("TernGrad") {
    check_reference(terngrad_codec{4}, ref_terngrad(4), [](std::size_t n) { return 4 + (n + 3) / 4; });
  }
  SECTION("1-bit SGD") {
    check_reference(onebit_codec{}, ref_onebit, [](std::size_t n) { return 8 + (n + 7) / 8; });
  }
  SECTION("natural compression") {
    check_reference(natural_codec{2}, ref_natural(2), [](std::size_t n) { return (9 * n + 7) / 8; });
    natural_codec k{2};  // the edges of the exponent range
    const vec v = {0x1.0p-149f, 0x1.8p-127f, 0x1.0p-126f, 0x1.7p-100f, -3.0f, 0x1.0p127f, -0x1.fffffep127f};
    CHECK(encode_decode(k, v, 1, 0) == ref_natural(2)(v, 1, 0));
  }
  SECTION("EF-SignSGD's scaled sign") {
    check_reference(sign_codec{}, ref_sign, [](std::size_t n) { return 4 + (n + 7) / 8; });
  }
  SECTION("fp16 and bf16: round to nearest even, saturating") {
    vec v = sample(77, 300);
    for (float x : {65504.f, 65519.f, 65520.f, -1e6f, 0x1.0p-24f, 0x1.0p-25f, 0x1.8p-25f, 0x1.0p-14f, 1.0f + 0x1.0p-11f,
                    1.0f + 0x1.8p-11f, 3.0e38f, -3.4028235e38f, 0x1.0p-130f, 1.0f + 0x1.0p-8f, 1.0f + 0x1.8p-8f})
      v.push_back(x);
    fp16_codec h;
    bf16_codec b;
    CHECK(encode_decode(h, v, 0, 0) == ref_fp16(v, 0, 0));
    CHECK(encode_decode(b, v, 0, 0) == ref_bf16(v, 0, 0));
    CHECK(h.max_encoded_bytes(v.size()) == 2 * v.size());
  }
  SECTION("the stream depends on the seed, the step and the rank") {
    qsgd_codec k{2, 5};
    const vec v = sample(1, 500);
    const vec a = encode_decode(k, v, 0, 0);
    CHECK(a == encode_decode(k, v, 0, 0));
    CHECK(a != encode_decode(k, v, 1, 0));
    CHECK(a != encode_decode(k, v, 0, 1));
    qsgd_codec other{2, 6};
    CHECK(a != encode_decode(other, v, 0, 0));
  }
}

TEST_CASE("a NaN among the values: scales, norms and means are the one quiet NaN, levels 0", "[codec][quant]") {
  // The compressor flags such an input (the frame is never decoded), but the sender's own
  // frame and approximation must not depend on which NaN arithmetic made: x86 keeps an
  // operand's payload (here a negative NaN first), a GPU makes its own, so both write
  // 0x7FC00000 (the CUDA kernels share these formulas, tests/cuda/test_cuda_codec_leaves_more.cu).
  const float inf = std::numeric_limits<float>::infinity();
  const float neg_nan = std::bit_cast<float>(0xFFC00000u), payload_nan = std::bit_cast<float>(0x7FA00001u);
  const vec v = {neg_nan, inf, -inf, payload_nan, 1.5f, -2.0f, 0.0f, -0.0f, 0x1.0p127f, -3.0f};
  const std::uint32_t quiet = 0x7FC00000u;
  auto word = [](const std::vector<std::byte>& m, std::size_t at) {
    std::uint32_t w;
    std::memcpy(&w, m.data() + at, 4);
    return w;
  };
  auto bits = [](float f) { return std::bit_cast<std::uint32_t>(f); };
  SECTION("sign: the scale; approx is +-that NaN by the sign bit of each value") {
    sign_codec k;
    std::vector<std::byte> m(k.max_encoded_bytes(v.size()));
    vec approx(v.size());
    k.encode(v, m, approx);
    CHECK(word(m, 0) == quiet);
    for (std::size_t i = 0; i < v.size(); ++i)
      CHECK(bits(approx[i]) == (quiet | (detail::sign_negative(v[i]) ? 0x80000000u : 0u)));
  }
  SECTION("QSGD: every bucket's norm with a NaN, and level 0 (Inf included) under it") {
    qsgd_codec k{256, 3, 4};  // buckets {NaN, Inf, -Inf, NaN}, {1.5, -2, 0, -0}, {2^127, -3}
    std::vector<std::byte> m(k.max_encoded_bytes(v.size()));
    vec approx(v.size());
    k.encode(v, m, approx);
    CHECK(word(m, 0) == quiet);
    CHECK(std::isfinite(std::bit_cast<float>(word(m, 4))));
    detail::bit_reader r(m.data() + 12);
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(r.get(10) == 0u);  // level and sign of the values under the NaN norm
      CHECK(bits(approx[i]) == quiet);
    }
  }
  SECTION("1-bit: the mean of the side that holds the NaNs; the other saturates") {
    onebit_codec k;
    std::vector<std::byte> m(k.max_encoded_bytes(v.size()));
    k.encode(v, m, {});
    CHECK(word(m, 0) == quiet);
    CHECK(word(m, 4) == bits(-std::numeric_limits<float>::max()));  // -Inf, -2, -3
  }
}

TEST_CASE("QSGD, TernGrad and natural compression are unbiased; a biased rounding fails the same bound",
          "[codec][quant][unbiased]") {
  const std::size_t n = 64;
  const int T = 4000;
  const vec v = sample(2024, n);
  // Each estimator takes two values lo < hi with probability p of hi: its variance is
  // (hi - lo)^2 p (1 - p). The mean of T draws must lie within 5 standard errors.
  auto check_unbiased = [&](auto codec, auto spread, bool expect_pass) {
    std::vector<double> mean(n, 0.0);
    for (int t = 0; t < T; ++t) {
      const vec q = encode_decode(codec, v, t, 1);
      for (std::size_t i = 0; i < n; ++i) mean[i] += q[i] / double(T);
    }
    int violations = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto [lo, hi] = spread(i);
      const double p = (std::abs(double(v[i])) - lo) / (hi - lo + 1e-300);
      const double se = (hi - lo) * std::sqrt(std::max(0.0, p * (1 - p)) / T);
      if (std::abs(mean[i] - v[i]) > 5 * se + 1e-6 * std::abs(v[i])) ++violations;
    }
    if (expect_pass) CHECK(violations == 0);
    else CHECK(violations > 0);
  };
  double ss = 0, mx = 0;
  for (float x : v) ss += double(x) * x, mx = std::max(mx, std::abs(double(x)));
  const double norm = float(std::sqrt(ss));
  const std::uint32_t s = 4;
  auto qsgd_spread = [&](std::size_t i) {
    const double l = std::floor(std::abs(double(v[i])) * s / norm);
    return std::pair{norm * l / s, norm * (l + 1) / s};
  };
  check_unbiased(qsgd_codec{s, 11}, qsgd_spread, true);
  check_unbiased(terngrad_codec{11}, [&](std::size_t) { return std::pair{0.0, mx}; }, true);
  check_unbiased(natural_codec{11}, [&](std::size_t i) {
    const double a = std::abs(double(v[i]));
    const double lo = a == 0 ? 0 : std::ldexp(1.0, std::ilogb(a));
    return std::pair{lo, 2 * lo};
  }, true);
  // The bound has power: QSGD's levels with deterministic rounding to the nearest level
  // (the bias stochastic rounding removes) fail it.
  struct nearest_qsgd {
    double norm;
    std::size_t max_encoded_bytes(std::size_t m) const { return 4 * m; }
    std::size_t encode(std::span<const float> x, std::span<std::byte> msg, std::span<float> approx) const {
      for (std::size_t i = 0; i < x.size(); ++i) {
        const float q = float(norm * std::round(std::abs(double(x[i])) * s / norm) / s) * (x[i] < 0 ? -1.f : 1.f);
        std::memcpy(msg.data() + 4 * i, &q, 4);
        approx[i] = q;
      }
      return 4 * x.size();
    }
    void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += detail::read_f32(msg.data() + 4 * i);
    }
  };
  check_unbiased(nearest_qsgd{norm}, qsgd_spread, false);
}

namespace {
//! decode_add must raise wire_error and leave acc as it was.
template <class K>
void check_rejects(const K& k, std::vector<std::byte> msg, std::size_t n) {
  vec acc(n, 1.5f);
  CHECK_THROWS_AS(k.decode_add(msg, acc), wire_error);
  CHECK(acc == vec(n, 1.5f));
}
template <class K>
std::vector<std::byte> good_message(K k, std::size_t n) {
  if constexpr (req::codec_has_begin_step<K>) k.begin_step(3);
  std::vector<std::byte> msg(k.max_encoded_bytes(n));
  const vec v = sample(5, n);
  k.encode(v, msg, {});
  return msg;
}
void set_field(std::vector<std::byte>& msg, std::size_t offset, std::size_t j, unsigned width, std::uint32_t value) {
  for (unsigned b = 0; b < width; ++b) {
    const std::size_t bit = offset * 8 + j * width + b;
    const auto mask = std::byte{static_cast<unsigned char>(1u << (bit % 8))};
    msg[bit / 8] = ((value >> b) & 1u) ? (msg[bit / 8] | mask) : (msg[bit / 8] & ~mask);
  }
}
void set_f32(std::vector<std::byte>& msg, std::size_t at, float f) { std::memcpy(msg.data() + at, &f, 4); }

//! Every truncation and extension is rejected; random byte strings never crash.
template <class K>
void check_lengths_and_fuzz(const K& k, std::size_t n) {
  auto msg = good_message(k, n);
  for (std::size_t len : {std::size_t{0}, msg.size() / 2, msg.size() - 1})
    check_rejects(k, std::vector<std::byte>(msg.begin(), msg.begin() + static_cast<std::ptrdiff_t>(len)), n);
  auto longer = msg;
  longer.push_back(std::byte{0});
  check_rejects(k, longer, n);
  check_rejects(k, msg, n + 8);  // (n + 1 may share the length: its last field is the zero padding)
  std::mt19937_64 g(n);
  for (int t = 0; t < 300; ++t) {
    auto m = msg;
    for (int f = 0; f < 3; ++f) m[g() % m.size()] = static_cast<std::byte>(g());
    vec acc(n, 0.0f);
    try {
      k.decode_add(m, acc);
      for (float x : acc) REQUIRE(std::isfinite(x));
    } catch (const wire_error&) {
    }
  }
}
}  // namespace

TEST_CASE("malformed messages raise wire_error and change nothing", "[codec][quant][wire]") {
  const std::size_t n = 13;  // no codec's fields end on a byte boundary
  SECTION("QSGD") {
    const qsgd_codec k{5, 1, 8};  // 2 buckets; 4-bit fields: level in 3 bits, sign above
    const std::size_t at = 8;     // the fields start after the two norms
    check_lengths_and_fuzz(k, n);
    auto m = good_message(k, n);
    set_field(m, at, 2, 4, 6), check_rejects(k, m, n);                          // level 6 > s
    m = good_message(k, n), set_field(m, at, 2, 4, 8), check_rejects(k, m, n);  // level 0 with a sign
    m = good_message(k, n), set_f32(m, 4, -1.0f), check_rejects(k, m, n);
    m = good_message(k, n), set_f32(m, 0, std::numeric_limits<float>::quiet_NaN()), check_rejects(k, m, n);
    m = good_message(k, n), m.back() |= std::byte{0x80}, check_rejects(k, m, n);  // padding
    check_rejects(qsgd_codec{4, 1, 8}, good_message(k, n), n);  // another s: another length
  }
  SECTION("TernGrad") {
    const terngrad_codec k{1};
    check_lengths_and_fuzz(k, n);
    auto m = good_message(k, n);
    set_field(m, 4, 7, 2, 3), check_rejects(k, m, n);
    m = good_message(k, n), set_f32(m, 0, std::numeric_limits<float>::infinity()), check_rejects(k, m, n);
    m = good_message(k, n), m.back() |= std::byte{0x80}, check_rejects(k, m, n);
  }
  SECTION("1-bit SGD") {
    const onebit_codec k;
    check_lengths_and_fuzz(k, n);
    auto m = good_message(k, n);
    set_f32(m, 0, -0.5f), check_rejects(k, m, n);
    m = good_message(k, n), set_f32(m, 4, 0.5f), check_rejects(k, m, n);
    m = good_message(k, n), m.back() |= std::byte{0x80}, check_rejects(k, m, n);
  }
  SECTION("natural compression") {
    const natural_codec k{1};
    check_lengths_and_fuzz(k, n);
    auto m = good_message(k, n);
    set_field(m, 0, 4, 9, 255), check_rejects(k, m, n);
    m = good_message(k, n), set_field(m, 0, 4, 9, 256), check_rejects(k, m, n);
    m = good_message(k, n), m.back() |= std::byte{0x80}, check_rejects(k, m, n);
  }
  SECTION("fp16, bf16") {
    check_lengths_and_fuzz(fp16_codec{}, n);
    check_lengths_and_fuzz(bf16_codec{}, n);
    auto m = good_message(fp16_codec{}, n);
    m[5] = std::byte{0x7C}, m[4] = std::byte{0}, check_rejects(fp16_codec{}, m, n);
    m = good_message(bf16_codec{}, n), m[7] = std::byte{0xFF}, m[6] = std::byte{0x80}, check_rejects(bf16_codec{}, m, n);
  }
}

namespace {
//! CodecCompressor over ThreadComm for P ranks against the serial reference; bytes of
//! the second step through CountingComm against (P - 1)(48 + payload rounded up to 4).
template <class K>
void check_compressor(const K& proto, const ref_fn& ref, std::size_t payload_bytes) {
  using C = CountingComm<commpact_test::checked_thread_comm>;
  const std::size_t n = 37;
  const int steps = 3;
  for (int P = 1; P <= 8; ++P) {
    CAPTURE(P);
    auto grad = [](int s, int r) { return sample(1000 * s + r, n); };
    std::vector<vec> e(P, vec(n, 0.0f)), expect(steps);
    for (int s = 0; s < steps; ++s) {
      vec sum(n, 0.0f);
      std::vector<vec> q(P);
      for (int r = 0; r < P; ++r) {
        const vec g = grad(s, r);
        vec acc(n);
        for (std::size_t i = 0; i < n; ++i) acc[i] = e[r][i] + g[i];
        q[r] = ref(acc, s, r);
        for (std::size_t i = 0; i < n; ++i) e[r][i] = acc[i] - q[r][i];
      }
      for (int r = 0; r < P; ++r)
        for (std::size_t i = 0; i < n; ++i) sum[i] += q[r][i];
      for (auto& x : sum) x = x / float(P);
      expect[s] = sum;
    }
    std::vector<std::vector<vec>> out(P);
    std::vector<vec> residual(P);
    std::vector<std::uint64_t> second_step_bytes(P);
    commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
      C counted{comm};
      CodecCompressor<K, Allgather<C>> c{counted, proto};
      for (int s = 0; s < steps; ++s) {
        vec g = grad(s, comm.rank());
        const auto before = counted.stats();
        if (!c.reduce(std::span<float>(g)))
          throw std::logic_error("a step was skipped");  // no Catch2 asserts in rank threads
        if (s == 1) second_step_bytes[comm.rank()] = (counted.stats() - before).bytes_sent;
        out[comm.rank()].push_back(g);
      }
      residual[comm.rank()].assign(c.residual().begin(), c.residual().end());
    });
    double lhs = 0, rhs = 0, scale = 0;
    for (int r = 0; r < P; ++r) {
      for (int s = 0; s < steps; ++s) CHECK(out[r][s] == expect[s]);  // bit for bit, every rank
      CHECK(residual[r] == e[r]);
      CHECK(second_step_bytes[r] == std::uint64_t(P - 1) * ((48 + payload_bytes + 3) / 4 * 4));
      for (int s = 0; s < steps; ++s)
        for (std::size_t i = 0; i < n; ++i) {
          lhs += grad(s, r)[i], scale += std::abs(grad(s, r)[i]);
          if (r == 0) rhs += double(P) * out[0][s][i];
        }
      for (float x : residual[r]) rhs += x;
    }
    CHECK(std::abs(lhs - rhs) <= 1e-5 * scale);  // conservation: nothing lost, nothing invented
  }
}
}  // namespace

TEST_CASE("CodecCompressor with each quantiser: every rank equals the reference, conserves, bytes = formula",
          "[codec][quant][compressor]") {
  const std::size_t n = 37;
  SECTION("QSGD") { check_compressor(qsgd_codec{7, 21}, ref_qsgd(7, 21), 4 + (4 * n + 7) / 8); }
  SECTION("TernGrad") { check_compressor(terngrad_codec{21}, ref_terngrad(21), 4 + (n + 3) / 4); }
  SECTION("1-bit SGD") { check_compressor(onebit_codec{}, ref_onebit, 8 + (n + 7) / 8); }
  SECTION("natural compression") { check_compressor(natural_codec{21}, ref_natural(21), (9 * n + 7) / 8); }
  SECTION("fp16") { check_compressor(fp16_codec{}, ref_fp16, 2 * n); }
  SECTION("bf16") { check_compressor(bf16_codec{}, ref_bf16, 2 * n); }
  SECTION("EF-SignSGD = CodecCompressor<sign_codec, Allgather<C>>") {
    check_compressor(sign_codec{}, ref_sign, 4 + (n + 7) / 8);
  }
}

TEST_CASE("a quantiser as CHOCO-SGD's codec in GossipMixer keeps the average and reaches consensus",
          "[codec][quant][gossip]") {
  const int P = 5;
  const std::size_t n = 64;
  std::vector<vec> start(P), end(P);
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    GossipMixer mixer{comm, Ring(P), {{static_cast<std::int64_t>(n)}}, choco_gossip<qsgd_codec>{qsgd_codec{64, 3}, 0.5}};
    vec y = sample(500 + comm.rank(), n);
    for (auto& x : y) x = std::max(-10.f, std::min(10.f, x));
    start[comm.rank()] = y;
    for (int t = 0; t < 200; ++t) mixer.mix(std::span<float>(y));
    end[comm.rank()] = y;
  });
  double spread0 = 0, spread1 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double before = 0, after = 0, mean = 0;
    for (int r = 0; r < P; ++r) before += start[r][i], after += end[r][i];
    CHECK(std::abs(after - before) < 1e-3 * (1 + std::abs(before)));  // CHOCO keeps the sum
    mean = after / P;
    for (int r = 0; r < P; ++r) spread1 += (end[r][i] - mean) * (end[r][i] - mean);
    for (int r = 0; r < P; ++r) spread0 += (start[r][i] - before / P) * (start[r][i] - before / P);
  }
  CHECK(spread1 < 1e-2 * spread0);  // consensus: the models moved together
}
