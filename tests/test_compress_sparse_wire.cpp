// The sparse wire format: layout, round trip, every rule of the decoder, a fuzz of byte
// flips / truncations / extensions (each must raise wire_error or decode to a valid set,
// never crash; run it under the ASan build too), and a hostile peer in a gTopK world
// (the receiver raises wire_error, every other rank an error; nobody hangs).
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/wire/sparse_frame.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>
#include <random>

#include "common/sparse_checks.hpp"

using namespace commpact;
namespace sw = commpact::sparse_wire;

namespace {
std::vector<std::byte> make(std::vector<std::int32_t> idx, std::vector<float> val, std::int64_t n = 100,
                            std::int64_t k = 8, std::vector<std::uint8_t> mask = {}, std::uint16_t flags = 0) {
  sw::header h{};
  h.flags = flags;
  h.n_min = h.n_max = n;
  h.k_min = h.k_max = k;
  h.mask_bits = static_cast<std::uint32_t>(mask.size());
  std::vector<std::byte> out;
  sw::encode(out, h, idx, val, mask);
  return out;
}
template <class T>
void poke(std::vector<std::byte>& m, std::size_t at, T v) {
  std::memcpy(m.data() + at, &v, sizeof(T));
}
struct decoded {
  std::vector<std::int32_t> idx = std::vector<std::int32_t>(64);
  std::vector<float> val = std::vector<float>(64);
  std::vector<std::uint8_t> mask = std::vector<std::uint8_t>(64);
  sw::header h;
};
decoded dec(std::span<const std::byte> m, sw::expect e = {100, 8, 0}) {
  decoded d;
  d.h = sw::decode(m, e, d.idx, d.val, d.mask);
  return d;
}
}  // namespace

TEST_CASE("sparse wire: layout and round trip", "[compress][wire]") {
  STATIC_REQUIRE(sw::header_bytes == 48);
  STATIC_REQUIRE(sw::encoded_size(10) == 48 + 80);
  STATIC_REQUIRE(sw::encoded_size(10, 9) == 48 + 80 + 2);
  const auto m = make({1, 5, 99}, {0.5f, -2.0f, 3.0f}, 100, 8, {1, 0, 1}, sw::flag_nonfinite);
  REQUIRE(m.size() == 48 + 24 + 1);
  std::uint32_t magic;
  std::memcpy(&magic, m.data(), 4);
  REQUIRE(magic == 0x57535043u);
  std::int32_t i1;
  float v2;
  std::memcpy(&i1, m.data() + 48 + 4, 4);
  std::memcpy(&v2, m.data() + 48 + 12 + 8, 4);
  REQUIRE(i1 == 5);
  REQUIRE(v2 == 3.0f);
  const auto d = dec(m, {100, 8, 3});
  REQUIRE(d.h.count == 3);
  REQUIRE(d.h.flags == sw::flag_nonfinite);
  REQUIRE(std::vector<std::int32_t>(d.idx.begin(), d.idx.begin() + 3) == std::vector<std::int32_t>{1, 5, 99});
  REQUIRE(std::vector<float>(d.val.begin(), d.val.begin() + 3) == std::vector<float>{0.5f, -2.0f, 3.0f});
  REQUIRE(std::vector<std::uint8_t>(d.mask.begin(), d.mask.begin() + 3) == std::vector<std::uint8_t>{1, 0, 1});
  REQUIRE(dec(make({}, {})).h.count == 0);
}

TEST_CASE("sparse wire: the decoder rejects every broken rule with wire_error", "[compress][wire]") {
  const auto good = make({1, 5, 99}, {0.5f, -2.0f, 3.0f});
  REQUIRE_NOTHROW(dec(good));
  auto bad = [](std::vector<std::byte> m, sw::expect e = {100, 8, 0}) { REQUIRE_THROWS_AS(dec(m, e), wire_error); };
  SECTION("count above k") { bad(good, {100, 2, 0}); }
  SECTION("bytes not matching count") {
    bad(std::vector<std::byte>(good.begin(), good.end() - 1));
    auto longer = good;
    longer.push_back(std::byte{0});
    bad(longer);
    bad(std::vector<std::byte>(good.begin(), good.begin() + 47));
    bad({});
    auto m = good;
    poke<std::uint32_t>(m, 8, 4);  // announces 4 entries, carries 3
    bad(m);
    poke<std::uint32_t>(m, 8, 0xffffffffu);  // no overflow in the size check
    bad(m);
  }
  SECTION("indices out of [0, n)") {
    bad(make({1, 5, 100}, {1, 1, 1}));
    bad(make({-1, 5, 7}, {1, 1, 1}));
  }
  SECTION("unsorted or duplicate indices") {
    bad(make({5, 1, 7}, {1, 1, 1}));
    bad(make({1, 5, 5}, {1, 1, 1}));
  }
  SECTION("n different from ours (both sides of a pair check it)") {
    bad(make({1, 5}, {1, 1}, 101));
    bad(good, {99, 8, 0});
  }
  SECTION("header fields") {
    auto m = good;
    poke<std::uint32_t>(m, 0, 0x12345678u);
    bad(m);
    m = good;
    poke<std::uint16_t>(m, 4, 2);
    bad(m);
    m = good;
    poke<std::uint16_t>(m, 6, 0x04);  // a reserved flag bit (bits 4-15 carry gTopK's step count)
    bad(m);
    m = good;
    poke<std::int64_t>(m, 16, 200);  // n_min > n_max
    bad(m);
    m = good;
    poke<std::int64_t>(m, 32, -1);
    bad(m);
  }
  SECTION("non-finite values") {
    bad(make({1}, {std::numeric_limits<float>::quiet_NaN()}));
    bad(make({1}, {-std::numeric_limits<float>::infinity()}));
  }
  SECTION("mask") {
    bad(make({1}, {1}, 100, 8, {1, 1}), {100, 8, 3});
    auto m = make({1}, {1}, 100, 8, {1, 1, 0});
    REQUIRE_NOTHROW(dec(m, {100, 8, 3}));
    m.back() = std::byte{0xff};  // stray bits beyond the 3
    bad(m, {100, 8, 3});
  }
  SECTION("output too small") {
    std::vector<std::int32_t> i(2);
    std::vector<float> v(2);
    REQUIRE_THROWS_AS(sw::decode(good, {100, 8, 0}, i, v), wire_error);
  }
}

TEST_CASE("sparse wire fuzz: flips, truncations and extensions never crash", "[compress][wire][fuzz]") {
  std::mt19937_64 gen(GENERATE(1u, 2u, 3u));
  std::size_t rejected = 0, accepted = 0;
  for (int it = 0; it < 20000; ++it) {
    const std::int64_t n = 1 + static_cast<std::int64_t>(gen() % 200);
    const std::size_t k = 1 + gen() % 16;
    const std::size_t c = gen() % (std::min<std::size_t>(k, n) + 1);
    std::vector<std::int32_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), gen);
    std::vector<std::int32_t> idx(all.begin(), all.begin() + c);
    std::sort(idx.begin(), idx.end());
    std::vector<float> val(c);
    for (auto& x : val) x = static_cast<float>(static_cast<int>(gen() % 2001) - 1000) / 7.0f;
    const std::size_t mb = gen() % 3 == 0 ? gen() % 20 : 0;
    std::vector<std::uint8_t> mask(mb);
    for (auto& b : mask) b = gen() & 1;
    auto m = make(idx, val, n, static_cast<std::int64_t>(k), mask, static_cast<std::uint16_t>(gen() % 4));
    switch (gen() % 4) {
      case 0:
      case 1: {
        const int flips = 1 + static_cast<int>(gen() % 4);
        for (int f = 0; f < flips; ++f) m[gen() % m.size()] ^= static_cast<std::byte>(1u << (gen() % 8));
        break;
      }
      case 2: m.resize(gen() % m.size()); break;
      default: {
        const std::size_t extra = 1 + gen() % 12;
        for (std::size_t e = 0; e < extra; ++e) m.push_back(static_cast<std::byte>(gen() & 0xff));
      }
    }
    // Exactly-sized outputs, so an overrun is an ASan error.
    std::vector<std::int32_t> oi(k);
    std::vector<float> ov(k);
    std::vector<std::uint8_t> om(mb);
    try {
      const auto h = sw::decode(m, {n, k, mb}, oi, ov, om);
      ++accepted;
      REQUIRE(h.count <= k);
      for (std::size_t j = 0; j < h.count; ++j) {
        REQUIRE(oi[j] >= 0);
        REQUIRE(oi[j] < n);
        if (j) REQUIRE(oi[j - 1] < oi[j]);
        REQUIRE(std::isfinite(ov[j]));
      }
      for (auto b : om) REQUIRE(b <= 1);
    } catch (const wire_error&) {
      ++rejected;
    }
  }
  INFO("accepted " << accepted << ", rejected " << rejected);
  REQUIRE(rejected > 10000);
  REQUIRE(accepted > 0);
}

TEST_CASE("gTopK: a malformed message raises wire_error at its receiver and an error everywhere", "[compress][wire]") {
  const int P = GENERATE(2, 4, 5);
  CAPTURE(P);
  std::vector<int> kind(P, -1);  // 0 none, 1 wire_error, 2 peer_failure/comm_error, 3 other
  const auto t0 = std::chrono::steady_clock::now();
  run_threads(
      P,
      [&](ThreadComm& comm) {
        const int me = comm.rank();
        try {
          if (me == 1) {
            // Hostile rank: takes part in the first step's agreement (contributing the
            // smallest values, so the others' agree), answers round 0 with a garbage frame
            // of the right size (48 + 8k bytes, k = 10), then waits in a barrier.
            std::vector<std::int64_t> agree(9, std::numeric_limits<std::int64_t>::min());
            comm.allreduce(std::span<std::int64_t>(agree), reduce_op::max);
            std::vector<std::byte> junk(sparse_tree_frame_bytes(10, false), std::byte{0x5a}), buf;
            comm.sendrecv(0, junk, buf);
            comm.barrier();
          } else {
            gTopK<TreeComm<ThreadComm>> g{comm, {.density = 0.1}};
            auto x = commpact_test::grad_of(1, 0, me, 100);
            g.reduce(std::span<float>(x));
            comm.barrier();
          }
          kind[me] = 0;
        } catch (const wire_error&) {
          kind[me] = 1;
        } catch (const comm_error&) {
          kind[me] = 2;
        } catch (...) {
          kind[me] = 3;
        }
      },
      thread_options{std::chrono::seconds(20)});
  REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));  // nobody waited for a deadline
  REQUIRE(kind[0] == 1);
  for (int r = 1; r < P; ++r) REQUIRE(kind[r] == 2);
}
