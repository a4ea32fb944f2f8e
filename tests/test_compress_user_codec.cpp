// A codec written the way a user would write it, outside include/ and with no library
// change: a scaled sign with its own wire format. It plugs unchanged into
//  - CodecCompressor<codec, Allgather<C>> (TopK-style allgather with error feedback),
//    itself inside DataParallel, and
//  - GossipMixer (CHOCO-SGD with this codec).
// Results are compared with a brute-force reference computed here from the codec's own
// definition: the mean over ranks of decode(encode(g_r + e_r)), e_r = (g_r + e_r) - that.
// Multi-rank cases run under CheckedComm<ThreadComm> (tests/common/checked_runs.hpp).
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/topology/ring.hpp>
#include <commpact/train/data_parallel.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "common/checked_runs.hpp"
#include "common/random.hpp"

namespace user {

//! Scaled sign with one scale per block of 64 values: wire = u32 n, then per block a
//! float scale (mean |v| of the block), then one bit per value (set: negative).
struct blockwise_sign {
  static constexpr std::size_t block = 64;
  static std::size_t blocks(std::size_t n) { return (n + block - 1) / block; }
  std::size_t max_encoded_bytes(std::size_t n) const { return 4 + 4 * blocks(n) + (n + 7) / 8; }

  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) const {
    const std::size_t n = v.size(), nb = blocks(n);
    const auto n32 = static_cast<std::uint32_t>(n);
    std::memcpy(msg.data(), &n32, 4);
    std::byte* bits = msg.data() + 4 + 4 * nb;
    std::fill(bits, bits + (n + 7) / 8, std::byte{0});
    for (std::size_t b = 0; b < nb; ++b) {
      const std::size_t lo = b * block, hi = std::min(n, lo + block);
      double s = 0;
      for (std::size_t i = lo; i < hi; ++i) s += std::abs(static_cast<double>(v[i]));
      const auto scale = static_cast<float>(s / static_cast<double>(hi - lo));
      std::memcpy(msg.data() + 4 + 4 * b, &scale, 4);
      for (std::size_t i = lo; i < hi; ++i) {
        const bool neg = v[i] < 0.0f;
        if (neg) bits[i / 8] |= std::byte{static_cast<unsigned char>(1u << (i % 8))};
        if (!approx.empty()) approx[i] = neg ? -scale : scale;
      }
    }
    return max_encoded_bytes(n);
  }

  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    const std::size_t n = acc.size();
    if (msg.size() != max_encoded_bytes(n)) throw commpact::wire_error("blockwise_sign: wrong message length");
    std::uint32_t n32;
    std::memcpy(&n32, msg.data(), 4);
    if (n32 != n) throw commpact::wire_error("blockwise_sign: the message is for another length");
    const std::byte* bits = msg.data() + 4 + 4 * blocks(n);
    for (std::size_t i = 0; i < n; ++i) {
      float scale;
      std::memcpy(&scale, msg.data() + 4 + 4 * (i / block), 4);
      if (!std::isfinite(scale) || scale < 0) throw commpact::wire_error("blockwise_sign: bad scale");
      const bool neg = (static_cast<unsigned>(bits[i / 8]) >> (i % 8)) & 1u;
      acc[i] += neg ? -scale : scale;
    }
  }
};

}  // namespace user

static_assert(commpact::Codec<user::blockwise_sign>);

using commpact::ThreadComm;
using Comp = commpact::CodecCompressor<user::blockwise_sign, commpact::Allgather<commpact_test::checked_thread_comm>>;
static_assert(commpact::Compressor<Comp>);

namespace {
using commpact_test::normal;
}  // namespace

TEST_CASE("a user's codec composes with Allgather and error feedback: brute-force reference, conservation",
          "[codec][user]") {
  const int P = GENERATE(1, 2, 3, 5);
  const std::size_t n = GENERATE(std::size_t{1}, std::size_t{63}, std::size_t{200});
  CAPTURE(P, n);
  const int steps = 4;
  // Reference, serial: per rank residual e_r; per step acc_r = e_r + g_r; q_r = decode(encode(acc_r)).
  std::vector<std::vector<float>> e(P, std::vector<float>(n, 0.0f)), ref_out(steps);
  const user::blockwise_sign codec;
  for (int s = 0; s < steps; ++s) {
    std::vector<float> sum(n, 0.0f);
    std::vector<std::vector<float>> q(P, std::vector<float>(n));
    for (int r = 0; r < P; ++r) {
      auto g = normal(100 * s + r, n);
      std::vector<float> acc(n);
      for (std::size_t i = 0; i < n; ++i) acc[i] = e[r][i] + g[i];
      std::vector<std::byte> msg(codec.max_encoded_bytes(n));
      codec.encode(acc, msg, q[r]);
      for (std::size_t i = 0; i < n; ++i) e[r][i] = acc[i] - q[r][i];
    }
    // The receivers decode each rank's message into a zeroed sum in rank order.
    for (int r = 0; r < P; ++r)
      for (std::size_t i = 0; i < n; ++i) sum[i] += q[r][i];
    for (auto& x : sum) x = x / static_cast<float>(P);
    ref_out[s] = sum;
  }
  std::vector<std::vector<std::vector<float>>> out(P);
  std::vector<std::vector<float>> residual(P);
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    Comp c{comm};
    for (int s = 0; s < steps; ++s) {
      auto g = normal(100 * s + comm.rank(), n);
      c.reduce(std::span<float>(g));
      out[comm.rank()].push_back(g);
    }
    residual[comm.rank()].assign(c.residual().begin(), c.residual().end());
  });
  for (int r = 0; r < P; ++r) {
    for (int s = 0; s < steps; ++s) CHECK(out[r][s] == ref_out[s]);  // bit for bit, every rank
    CHECK(residual[r] == e[r]);                                     // nothing lost
  }
}

TEST_CASE("a user's codec inside DataParallel (gradient rounds) and as CHOCO's codec in GossipMixer",
          "[codec][user]") {
  const int P = 4;
  const std::size_t n = 130;
  const int T = 6;
  std::vector<std::vector<float>> params(P), mixed(P), mixed_ref(P);
  std::vector<std::uint64_t> bytes(P);
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    // DataParallel with the composed compressor: every rank ends with the same parameters.
    commpact::DataParallel dp{Comp{comm}, commpact::EveryStep{}, T};
    std::vector<float> x(n, 0.5f);
    auto sgd = [](std::span<float> p, std::span<const float> g, double lr) {
      for (std::size_t i = 0; i < p.size(); ++i) p[i] -= static_cast<float>(lr) * g[i];
    };
    for (int t = 0; t < T; ++t) {
      auto g = normal(7 * t + comm.rank(), n);
      dp.step(std::span<float>(x), std::span<float>(g), 0.1, sgd);
    }
    params[comm.rank()] = x;

    // GossipMixer (CHOCO) with the same codec, bytes counted: 4 + 4 * blocks + n/8 per edge.
    commpact::CountingComm<commpact_test::checked_thread_comm> counted{comm};
    commpact::GossipMixer mixer{counted, commpact::Ring(P), {{static_cast<std::int64_t>(n)}},
                                commpact::choco_gossip<user::blockwise_sign>{{}, 0.4}};
    auto y = normal(1000 + comm.rank(), n);
    for (int t = 0; t < 3; ++t) mixer.mix(std::span<float>(y));
    mixed[comm.rank()] = y;
    bytes[comm.rank()] = counted.stats().point_to_point_bytes_sent;
  });
  for (int r = 1; r < P; ++r) CHECK(params[r] == params[0]);
  CHECK(params[0] != std::vector<float>(n, 0.5f));
  // CHOCO keeps the average: sum of models unchanged up to rounding.
  double before = 0, after = 0;
  for (int r = 0; r < P; ++r) {
    const auto y0 = normal(1000 + r, n);
    for (std::size_t i = 0; i < n; ++i) before += y0[i], after += mixed[r][i];
  }
  CHECK(std::abs(after - before) < 1e-3 * n);
  const std::uint64_t msg = 4 + 4 * user::blockwise_sign::blocks(n) + (n + 7) / 8;
  for (int r = 0; r < P; ++r) CHECK(bytes[r] == 3 * 2 * msg);  // 3 rounds, 2 ring neighbours
}
