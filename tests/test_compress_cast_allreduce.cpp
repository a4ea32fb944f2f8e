// CastAllreduce (fp16 and bf16 summed by a ring allreduce in the 16-bit type, as PyTorch's
// fp16_compress_hook): the 16-bit addition against a correctly rounded reference, the
// compressor against a brute-force reference of the ring's order (bit for bit, every
// rank, with error feedback over several steps), exact bytes (half of Dense's ring),
// non-finite input and overflow alike on every rank with nothing changed, length
// mismatch, save/load and cancel.
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/wire_model.hpp>
#include <commpact/compress/compressors/cast_allreduce.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>

#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/checked_runs.hpp"
#include "common/random.hpp"
#include "common/rank_checks.hpp"

using namespace commpact;
using namespace commpact_test;

namespace {
const thread_options quick{std::chrono::seconds(30)};

// x rounded to a binary format with `mant` fraction bits, minimum normal exponent emin
// and largest finite value `big`, to nearest even, overflowing to Inf. The sum of two
// 16-bit values is exact in double, so this is IEEE addition's result.
double round_format(double x, int mant, int emin, double big) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  const int e = std::max(std::ilogb(x), emin);
  const double q = std::ldexp(1.0, e - mant);
  const double r = std::nearbyint(x / q) * q;  // ties to even under the default rounding mode
  return std::fabs(r) > big ? std::copysign(std::numeric_limits<double>::infinity(), x) : r;
}

template <class Cast>
double round_ref(double x) {
  if constexpr (std::is_same_v<Cast, fp16_codec>) return round_format(x, 10, -14, 65504.0);
  else return round_format(x, 7, -126, std::ldexp(2.0 - 0x1p-7, 127));
}

template <class Cast>
std::uint16_t random_finite_code(std::mt19937_64& g) {
  for (;;) {
    const auto h = static_cast<std::uint16_t>(g());
    if (Cast::finite_code(h)) return h;
  }
}

// The compressor's result for every rank's gradients, computed serially in the ring's
// order: chunk c summed left to right over ranks c, c + 1, ..., c - 1.
template <class Cast>
std::vector<float> ring_reference(const std::vector<std::vector<std::uint16_t>>& codes, int P) {
  const std::size_t n = codes[0].size();
  std::vector<float> out(n);
  std::size_t at = 0;
  for (int c = 0; c < P; ++c) {
    const std::size_t len = wire::ring_chunk(n, P, c);
    for (std::size_t i = at; i < at + len; ++i) {
      std::uint16_t s = codes[c][i];
      for (int j = 1; j < P; ++j) s = Cast::add(s, codes[(c + j) % P][i]);
      out[i] = Cast::finite_code(s) ? mean_of(Cast::from_code(s), P) : std::numeric_limits<float>::quiet_NaN();
    }
    at += len;
  }
  return out;
}

std::vector<float> rank_grad(std::uint64_t seed, int rank, int step, std::size_t n, float scale) {
  auto g = normal(seed * 7919 + static_cast<std::uint64_t>(rank) * 131 + static_cast<std::uint64_t>(step), n);
  for (auto& v : g) v *= scale;
  return g;
}
}  // namespace

TEMPLATE_TEST_CASE("the 16-bit add is IEEE addition: correctly rounded, ties to even, overflow to Inf",
                   "[compress][cast_allreduce]", fp16_codec, bf16_codec) {
  std::mt19937_64 g(12345);
  for (int t = 0; t < 400000; ++t) {
    std::uint16_t a = random_finite_code<TestType>(g), b = random_finite_code<TestType>(g);
    if (t % 4 == 1) b = static_cast<std::uint16_t>(a ^ 0x8000u);              // x + (-x)
    if (t % 4 == 2) b = static_cast<std::uint16_t>((a & 0x8000u) | (g() & 0x03FFu));  // subnormals and tiny values
    const double ref = round_ref<TestType>(static_cast<double>(TestType::from_code(a)) + TestType::from_code(b));
    const std::uint16_t s = TestType::add(a, b);
    if (std::isinf(ref)) {
      INFO("a " << a << " b " << b);
      REQUIRE(!TestType::finite_code(s));
      REQUIRE(std::isinf(TestType::from_code(s)));
      REQUIRE(std::signbit(TestType::from_code(s)) == std::signbit(ref));
    } else {
      INFO("a " << a << " b " << b << " sum " << TestType::from_code(s) << " ref " << ref);
      REQUIRE(static_cast<double>(TestType::from_code(s)) == ref);
    }
  }
  // The largest finite values: their sum overflows (the codec's saturating cast would not).
  const std::uint16_t big = std::is_same_v<TestType, fp16_codec> ? 0x7BFFu : 0x7F7Fu;
  REQUIRE(!TestType::finite_code(TestType::add(big, big)));
  REQUIRE(TestType::finite_code(TestType::to_code(std::numeric_limits<float>::max())));
}

TEMPLATE_TEST_CASE("CastAllreduce equals the ring-order reference bit for bit on every rank, with error feedback",
                   "[compress][cast_allreduce]", fp16_codec, bf16_codec) {
  const int P = GENERATE(1, 2, 3, 4, 5, 8);
  const std::size_t n = GENERATE(std::size_t{1}, std::size_t{7}, std::size_t{1000});
  const bool ef = GENERATE(true, false);
  CAPTURE(P, n, ef);
  const int steps = 4;
  const std::uint64_t seed = 77;
  // Serial reference: every rank's codes and residuals, step by step. Step 2 is large
  // (fp16 saturates at P = 1, where error feedback keeps what the cast clipped) but its
  // 16-bit sums stay finite; overflow has its own test below.
  auto scale = [&](int s) { return s == 2 ? 4e4f / static_cast<float>(P * P) : 1e-3f; };
  std::vector<std::vector<float>> want(steps), res(P, std::vector<float>(ef ? n : 0, 0.0f));
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<std::uint16_t>> codes(P, std::vector<std::uint16_t>(n));
    for (int r = 0; r < P; ++r) {
      const auto g = rank_grad(seed, r, s, n, scale(s));
      for (std::size_t i = 0; i < n; ++i) {
        const float a = ef ? g[i] + res[r][i] : g[i];
        codes[r][i] = TestType::to_code(a);
        if (ef) res[r][i] = a - TestType::from_code(codes[r][i]);
      }
    }
    want[s] = ring_reference<TestType>(codes, P);
    REQUIRE(std::all_of(want[s].begin(), want[s].end(), [](float v) { return std::isfinite(v); }));
  }
  std::vector<std::vector<float>> got_res(P);
  REQUIRE_NOTHROW(run_checked_threads(
      P,
      [&](checked_thread_comm& comm) {
        CastAllreduce<TestType, checked_thread_comm> c{comm, {.error_feedback = ef}};
        for (int s = 0; s < steps; ++s) {
          auto g = rank_grad(seed, comm.rank(), s, n, scale(s));
          RANK_REQUIRE(c.reduce(g));
          for (std::size_t i = 0; i < n; ++i)
            RANK_REQUIRE(std::bit_cast<std::uint32_t>(g[i]) == std::bit_cast<std::uint32_t>(want[s][i]));
        }
        got_res[comm.rank()].assign(c.residual().begin(), c.residual().end());
      },
      quick));
  for (int r = 0; r < P; ++r) REQUIRE(got_res[r] == res[r]);
}

TEMPLATE_TEST_CASE("CastAllreduce sends exactly half of Dense's ring allreduce", "[compress][cast_allreduce]",
                   fp16_codec, bf16_codec) {
  const int P = GENERATE(2, 3, 4, 7);
  const std::size_t n = GENERATE(std::size_t{10}, std::size_t{4099});
  CAPTURE(P, n);
  REQUIRE_NOTHROW(run_threads(
      P,
      [&](ThreadComm& tc) {
        CountingComm<ThreadComm> comm{tc};
        CastAllreduce<TestType, CountingComm<ThreadComm>> c{comm};
        auto g = rank_grad(5, tc.rank(), 0, n, 1.0f);
        c.reduce(g);  // the first step agrees on n
        const auto before = c.comm().stats();
        c.reduce(g);
        const auto after = c.comm().stats();
        const auto w = wire::ring_allreduce(tc.rank(), P, n, 2), dense = wire::ring_allreduce(tc.rank(), P, n, 4);
        // Every step: the step count (6 floats, compress/step_check.hpp), then the ring.
        const auto a = wire::ring_allreduce(tc.rank(), P, 6, 4);
        RANK_REQUIRE(after.bytes_sent - before.bytes_sent == w.bytes_sent + a.bytes_sent);
        RANK_REQUIRE(after.bytes_received - before.bytes_received == w.bytes_received + a.bytes_received);
        RANK_REQUIRE(after.messages_sent - before.messages_sent == a.messages_sent + 2 * static_cast<std::uint64_t>(P - 1));
        RANK_REQUIRE(2 * w.bytes_sent == dense.bytes_sent);
        // The allgather form of the same codec sends (P - 1)(48 + 2n) rounded to 4.
        RANK_REQUIRE(w.bytes_sent < static_cast<std::uint64_t>(P - 1) * (48 + 2 * n));
      },
      quick));
}

TEMPLATE_TEST_CASE("CastAllreduce: NaN on one rank, an overflowing sum and a length mismatch raise alike on every rank",
                   "[compress][cast_allreduce]", fp16_codec, bf16_codec) {
  const int P = GENERATE(1, 2, 3, 5);
  CAPTURE(P);
  std::atomic<int> done{0};
  REQUIRE_NOTHROW(run_checked_threads(
      P,
      [&](checked_thread_comm& comm) {
        using C = CastAllreduce<TestType, checked_thread_comm>;
        const std::size_t n = 64;
        C c{comm};
        auto g = rank_grad(9, comm.rank(), 0, n, 1.0f);
        RANK_REQUIRE(c.reduce(g));  // a first step: the residual is not empty
        const std::vector<float> res0(c.residual().begin(), c.residual().end());
        // NaN (and Inf) on the last rank only.
        for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
          auto h = rank_grad(9, comm.rank(), 1, n, 1.0f);
          if (comm.rank() == P - 1) h[17] = bad;
          const auto before = h;
          RANK_REQUIRE_THROWS_AS(c.reduce(h), numeric_error);
          for (std::size_t i = 0; i < n; ++i)
            RANK_REQUIRE(std::bit_cast<std::uint32_t>(h[i]) == std::bit_cast<std::uint32_t>(before[i]));
          RANK_REQUIRE(std::vector<float>(c.residual().begin(), c.residual().end()) == res0);
        }
        RANK_REQUIRE(c.steps() == 1);
        // skip_step: every rank skips, grad zeroed, the residual kept, the step counted.
        C skip{comm, {.on_nonfinite = nonfinite::skip_step}};
        auto h = rank_grad(9, comm.rank(), 2, n, 1.0f);
        if (comm.rank() == 0) h[3] = std::numeric_limits<float>::quiet_NaN();
        RANK_REQUIRE_FALSE(skip.reduce(h));
        RANK_REQUIRE(std::all_of(h.begin(), h.end(), [](float v) { return v == 0.0f; }));
        RANK_REQUIRE(std::all_of(skip.residual().begin(), skip.residual().end(), [](float v) { return v == 0.0f; }));
        RANK_REQUIRE(skip.skipped_steps() == 1);
        // Finite inputs whose 16-bit sum overflows (fp16 only: bf16 has float's range).
        if constexpr (std::is_same_v<TestType, fp16_codec>) {
          if (P > 1) {
            C o{comm};
            std::vector<float> big(n, 60000.0f);
            RANK_REQUIRE_THROWS_AS(o.reduce(big), numeric_error);
            RANK_REQUIRE(big == std::vector<float>(n, 60000.0f));
          }
        }
        // One rank with another length: mismatch_error on every rank.
        if (P > 1) {
          C m{comm};
          std::vector<float> x(comm.rank() == 1 ? 33 : 32, 1.0f);
          RANK_REQUIRE_THROWS_AS(m.reduce(x), mismatch_error);
        }
        // An on_nonfinite outside the enum is refused at construction (every compressor's is:
        // test_hardening_values.cpp).
        RANK_REQUIRE_THROWS_AS((C{comm, {.on_nonfinite = static_cast<nonfinite>(7)}}), invalid_argument);
        ++done;
      },
      quick));
  REQUIRE(done == P);
}

TEMPLATE_TEST_CASE("CastAllreduce: save/load and cancel continue as if nothing happened", "[compress][cast_allreduce]",
                   fp16_codec, bf16_codec) {
  const int P = GENERATE(1, 3, 4);
  CAPTURE(P);
  REQUIRE_NOTHROW(run_checked_threads(
      P,
      [&](checked_thread_comm& comm) {
        using C = CastAllreduce<TestType, checked_thread_comm>;
        const std::size_t n = 300;
        C a{comm}, b{comm};
        for (int s = 0; s < 2; ++s) {
          auto g = rank_grad(3, comm.rank(), s, n, 0.01f);
          a.reduce(g);
        }
        std::vector<std::byte> blob;
        a.save_state(blob);
        b.load_state(blob);
        // a cancelled step on b leaves it as loaded
        auto c0 = rank_grad(3, comm.rank(), 9, n, 5.0f);
        b.start(c0);
        b.finish();
        b.cancel();
        for (int s = 2; s < 4; ++s) {
          auto g1 = rank_grad(3, comm.rank(), s, n, 0.01f), g2 = g1;
          a.reduce(g1);
          b.reduce(g2);
          RANK_REQUIRE(g1 == g2);
        }
        RANK_REQUIRE(std::vector<float>(a.residual().begin(), a.residual().end()) ==
                std::vector<float>(b.residual().begin(), b.residual().end()));
        RANK_REQUIRE(a.steps() == b.steps());
        // a blob cut short, or from another compressor, raises and changes nothing
        std::vector<std::byte> cut(blob.begin(), blob.end() - 8);
        RANK_REQUIRE_THROWS(b.load_state(cut));
        RANK_REQUIRE(b.steps() == a.steps());
        // a residual of another length is rejected at the next step, on that rank and the others alike
        C d{comm};
        d.load_state(blob);
        std::vector<float> shorter(n - 1, 1.0f);
        RANK_REQUIRE_THROWS(d.reduce(shorter));
      },
      quick));
}

TEST_CASE("CastAllreduce at P = 1 gives the codec's own round trip, as its allgather form does", "[compress][cast_allreduce]") {
  REQUIRE_NOTHROW(run_threads(
      1,
      [&](ThreadComm& comm) {
        Fp16Allreduce<ThreadComm> ar{comm};
        CodecCompressor<fp16_codec, Allgather<ThreadComm>> ag{comm};
        for (int s = 0; s < 3; ++s) {
          auto g1 = rank_grad(1, 0, s, 257, 1.0f), g2 = g1;
          ar.reduce(g1);
          ag.reduce(g2);
          RANK_REQUIRE(g1 == g2);
        }
      },
      quick));
}
