// per_tensor<K> (compress/codecs/per_tensor.hpp): a codec applied to each tensor of a layout on
// its own, inside one message. Checked against the same codec applied tensor by tensor
// by hand (per-tensor copies bound to stream rank * T + t, messages concatenated with a
// u32 length each), bit for bit; through CodecCompressor<per_tensor<K>, Allgather> at
// P = 1, 3, 4 against a brute-force reference; the scale of a small layer; malformed
// frames; a layout that does not fit the gradient.
#include <catch2/catch.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/codecs/per_tensor.hpp>
#include <commpact/compress/codecs/quantizers.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "common/random.hpp"

using commpact::per_tensor;
using commpact::tensor_layout;

static_assert(commpact::Codec<per_tensor<commpact::sign_codec>>);
static_assert(commpact::Codec<per_tensor<commpact::terngrad_codec>>);
static_assert(commpact::Codec<per_tensor<commpact::onebit_codec>>);
static_assert(commpact::Codec<per_tensor<commpact::qsgd_codec>>);
static_assert(commpact::Codec<per_tensor<commpact::topk_codec>>);
static_assert(commpact::Compressor<
              commpact::CodecCompressor<per_tensor<commpact::sign_codec>, commpact::Allgather<commpact::ThreadComm>>>);

namespace {

// The prototypes under test (seeded where the codec draws random numbers).
template <class K>
K proto();
template <>
commpact::sign_codec proto() { return {}; }
template <>
commpact::terngrad_codec proto() { return commpact::terngrad_codec{7}; }
template <>
commpact::onebit_codec proto() { return {}; }
template <>
commpact::qsgd_codec proto() { return commpact::qsgd_codec{16, 7, 8}; }  // buckets of 8: several per tensor
template <>
commpact::topk_codec proto() { return commpact::topk_codec{0.2}; }

// Four tensors of very different magnitudes (x1, x1e-2, x1e-1, x1e-3).
const tensor_layout kLayout = {{3, 5}, {7}, {2, 9}, {1, 4}};
const float kScale[] = {1.0f, 1e-2f, 1e-1f, 1e-3f};

std::size_t total(const tensor_layout& l) {
  std::size_t n = 0;
  for (auto& s : l) n += static_cast<std::size_t>(s.numel());
  return n;
}

std::vector<float> gradient(std::uint64_t seed, const tensor_layout& l) {
  auto g = commpact_test::normal(seed, total(l));
  std::size_t o = 0;
  for (std::size_t t = 0; t < l.size(); ++t)
    for (std::int64_t i = 0; i < l[t].numel(); ++i) g[o++] *= kScale[t % 4];
  return g;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

// K applied tensor by tensor by hand: one copy per tensor, bound to stream rank * T + t.
template <class K>
struct by_hand {
  tensor_layout layout;
  std::vector<K> codecs;
  std::vector<std::size_t> off;

  by_hand(const tensor_layout& l, int rank) : layout(l) {
    off.push_back(0);
    for (std::size_t t = 0; t < l.size(); ++t) {
      codecs.push_back(proto<K>());
      if constexpr (commpact::req::codec_has_bind_rank<K>)
        codecs.back().bind_rank(rank * static_cast<int>(l.size()) + static_cast<int>(t));
      off.push_back(off.back() + static_cast<std::size_t>(l[t].numel()));
    }
  }
  void begin_step(std::int64_t s) {
    if constexpr (commpact::req::codec_has_begin_step<K>)
      for (auto& k : codecs) k.begin_step(s);
  }
  // The concatenated message (u32 length, message, per tensor) and the approximation.
  std::vector<std::byte> encode(std::span<const float> v, std::vector<float>& approx) {
    std::vector<std::byte> out;
    approx.assign(v.size(), 0.0f);
    for (std::size_t t = 0; t < codecs.size(); ++t) {
      const std::size_t m = off[t + 1] - off[t];
      std::vector<std::byte> msg(codecs[t].max_encoded_bytes(m));
      const std::size_t len =
          codecs[t].encode(v.subspan(off[t], m), msg, std::span<float>(approx).subspan(off[t], m));
      const auto len32 = static_cast<std::uint32_t>(len);
      const auto* p = reinterpret_cast<const std::byte*>(&len32);
      out.insert(out.end(), p, p + 4);
      out.insert(out.end(), msg.begin(), msg.begin() + static_cast<std::ptrdiff_t>(len));
    }
    return out;
  }
  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    std::size_t at = 0;
    for (std::size_t t = 0; t < codecs.size(); ++t) {
      std::uint32_t len;
      std::memcpy(&len, msg.data() + at, 4);
      codecs[t].decode_add(msg.subspan(at + 4, len), acc.subspan(off[t], off[t + 1] - off[t]));
      at += 4 + len;
    }
  }
};

template <class K>
using Comp = commpact::CodecCompressor<per_tensor<K>, commpact::Allgather<commpact::ThreadComm>>;

}  // namespace

TEMPLATE_TEST_CASE("per_tensor<K> equals K applied tensor by tensor by hand, bit for bit", "[codec][per_tensor]",
                   commpact::sign_codec, commpact::terngrad_codec, commpact::onebit_codec, commpact::qsgd_codec,
                   commpact::topk_codec) {
  using K = TestType;
  const int rank = GENERATE(0, 2);
  per_tensor<K> pt{kLayout, proto<K>()};
  pt.bind_rank(rank);
  by_hand<K> ref{kLayout, rank};
  const std::size_t n = total(kLayout);
  REQUIRE(pt.size() == n);
  REQUIRE(pt.check(n).empty());
  std::size_t max = 0;
  for (std::size_t t = 0; t < kLayout.size(); ++t)
    max += 4 + ref.codecs[t].max_encoded_bytes(static_cast<std::size_t>(kLayout[t].numel()));
  CHECK(pt.max_encoded_bytes(n) == max);
  for (std::int64_t step = 0; step < 3; ++step) {
    CAPTURE(rank, step);
    pt.begin_step(step);
    ref.begin_step(step);
    const auto v = gradient(10 + static_cast<std::uint64_t>(step), kLayout);
    std::vector<float> approx(n, -1.0f), ref_approx;
    std::vector<std::byte> msg(pt.max_encoded_bytes(n));
    const std::size_t len = pt.encode(v, msg, approx);
    const auto ref_msg = ref.encode(v, ref_approx);
    REQUIRE(len == ref_msg.size());
    CHECK(std::memcmp(msg.data(), ref_msg.data(), len) == 0);
    CHECK(same_bits(approx, ref_approx));

    // An empty approx is allowed and changes nothing in the message.
    std::vector<std::byte> msg2(msg.size());
    CHECK(pt.encode(v, msg2, {}) == len);  // stochastic codecs: the same stream again
    CHECK(std::memcmp(msg2.data(), msg.data(), len) == 0);

    auto acc = commpact_test::normal(99, n), ref_acc = acc;
    pt.decode_add(std::span<const std::byte>(msg.data(), len), acc);
    ref.decode_add(ref_msg, ref_acc);
    CHECK(same_bits(acc, ref_acc));

    if constexpr (commpact::req::codec_has_delivered<K>) {
      pt.encode(v, msg, approx);
      const auto d = pt.delivered();
      std::vector<std::int32_t> want;
      for (std::size_t t = 0; t < kLayout.size(); ++t)
        for (std::int32_t i : ref.codecs[t].delivered()) want.push_back(i + static_cast<std::int32_t>(ref.off[t]));
      CHECK(std::vector<std::int32_t>(d.begin(), d.end()) == want);
      CHECK(std::is_sorted(d.begin(), d.end()));
      // Each tensor keeps its own k: the one rule, clamp(floor(0.2 * numel), 1, numel).
      for (std::size_t t = 0; t < kLayout.size(); ++t)
        CHECK(pt.codec(t).k(pt.numel(t)) == ref.codecs[t].k(static_cast<std::size_t>(kLayout[t].numel())));
    }
  }
}

TEST_CASE("per_tensor over a one-tensor layout sends K's message behind its length", "[codec][per_tensor]") {
  const std::size_t n = 37;
  per_tensor<commpact::terngrad_codec> pt{{{static_cast<std::int64_t>(n)}}, commpact::terngrad_codec{3}};
  commpact::terngrad_codec k{3};
  pt.bind_rank(5), k.bind_rank(5);
  pt.begin_step(2), k.begin_step(2);
  const auto v = commpact_test::normal(1, n);
  std::vector<std::byte> a(pt.max_encoded_bytes(n)), b(k.max_encoded_bytes(n));
  REQUIRE(pt.encode(v, a, {}) == 4 + k.encode(v, b, {}));
  CHECK(std::memcmp(a.data() + 4, b.data(), b.size()) == 0);
}

TEMPLATE_TEST_CASE("CodecCompressor<per_tensor<K>, Allgather>: brute-force reference, same bits on every rank, "
                   "conservation",
                   "[codec][per_tensor]", commpact::sign_codec, commpact::terngrad_codec, commpact::onebit_codec,
                   commpact::qsgd_codec, commpact::topk_codec) {
  using K = TestType;
  constexpr bool sparse = commpact::req::codec_has_delivered<K>;
  const int P = GENERATE(1, 3, 4);
  CAPTURE(P);
  const int steps = 4;
  const std::size_t n = total(kLayout);
  auto grad = [&](int s, int r) { return gradient(1000 * static_cast<std::uint64_t>(s) + r, kLayout); };

  // Reference, serial: per rank a residual e_r and codecs bound by hand.
  std::vector<by_hand<K>> codecs;
  for (int r = 0; r < P; ++r) codecs.emplace_back(kLayout, r);
  std::vector<std::vector<float>> e(P, std::vector<float>(n, 0.0f)), ref_out(steps);
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<std::byte>> msgs(P);
    for (int r = 0; r < P; ++r) {
      const auto g = grad(s, r);
      std::vector<float> acc(n), q;
      for (std::size_t i = 0; i < n; ++i) acc[i] = e[r][i] + g[i];
      codecs[r].begin_step(s);
      msgs[r] = codecs[r].encode(acc, q);
      for (std::size_t i = 0; i < n; ++i) e[r][i] = acc[i] - q[i];
    }
    std::vector<float> sum(n, 0.0f);  // the per-tensor decodes, in rank order
    for (int r = 0; r < P; ++r) codecs[r].decode_add(msgs[r], sum);
    for (auto& x : sum) x = x / static_cast<float>(P);
    ref_out[s] = sum;
  }

  std::vector<std::vector<std::vector<float>>> out(P), res(P);
  std::vector<std::size_t> block(P), max(P);
  commpact::run_threads(P, [&](commpact::ThreadComm& comm) {
    Comp<K> c{comm, per_tensor<K>{kLayout, proto<K>()}};
    for (int s = 0; s < steps; ++s) {
      auto g = grad(s, comm.rank());
      c.reduce(std::span<float>(g));
      out[comm.rank()].push_back(g);
      res[comm.rank()].emplace_back(c.residual().begin(), c.residual().end());
    }
    block[comm.rank()] = c.block_bytes();
    max[comm.rank()] = c.codec().max_encoded_bytes(n);
  });
  // One frame per rank per step: 48 + sum_t (4 + K's max), rounded up to 4.
  for (int r = 0; r < P; ++r) CHECK(block[r] == (48 + max[r] + 3) / 4 * 4);
  for (int r = 0; r < P; ++r) {
    for (int s = 0; s < steps; ++s) {
      CAPTURE(r, s);
      CHECK(same_bits(out[r][s], ref_out[s]));  // the reference, on every rank
      CHECK(same_bits(out[r][s], out[0][s]));
    }
    CHECK(same_bits(res[r][steps - 1], e[r]));
  }
  // Conservation per step: sum_r e_new + P * result == sum_r g + sum_r e_old.
  for (int s = 0; s < steps; ++s) {
    for (std::size_t i = 0; i < n; ++i) {
      double lhs = static_cast<double>(P) * out[0][s][i], rhs = 0, mag = std::abs(lhs);
      for (int r = 0; r < P; ++r) {
        const double g = grad(s, r)[i], old = s ? res[r][s - 1][i] : 0.0;
        lhs += res[r][s][i];
        rhs += g + old;
        mag += std::abs(res[r][s][i]) + std::abs(g) + std::abs(old);
      }
      CHECK(std::abs(lhs - rhs) <= 1e-5 * mag + 1e-30);
    }
    if constexpr (sparse) {  // top-k: every entry is either delivered whole or kept whole, exactly
      for (int r = 0; r < P; ++r) {
        const auto g = grad(s, r);
        std::size_t kept = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const float acc = (s ? res[r][s - 1][i] : 0.0f) + g[i];
          const float now = res[r][s][i];
          CHECK((now == acc || now == 0.0f));
          kept += now == acc && acc != 0.0f;
        }
        std::size_t k = 0;
        for (auto& t : kLayout) k += static_cast<std::size_t>(commpact::detail::k_of_density(0.2, t.numel()));
        CHECK(kept == n - k);
      }
    }
  }
}

TEST_CASE("EF-SignSGD's scale per tensor: a layer of scale 1e-3 next to one of scale 1", "[codec][per_tensor]") {
  const std::int64_t m = 4096;
  const tensor_layout layout = {{64, m / 64}, {64, m / 64}};
  auto v = commpact_test::normal(5, 2 * m);
  for (std::int64_t i = m; i < 2 * m; ++i) v[static_cast<std::size_t>(i)] *= 1e-3f;
  auto small_layer_error = [&](auto codec) {
    std::vector<std::byte> msg(codec.max_encoded_bytes(v.size()));
    std::vector<float> approx(v.size());
    codec.encode(v, msg, approx);
    double err = 0, norm = 0;
    for (std::size_t i = m; i < v.size(); ++i) {
      err += (static_cast<double>(approx[i]) - v[i]) * (approx[i] - v[i]);
      norm += static_cast<double>(v[i]) * v[i];
    }
    return std::sqrt(err / norm);
  };
  const double whole = small_layer_error(commpact::sign_codec{});
  const double each = small_layer_error(per_tensor{layout, commpact::sign_codec{}});
  CAPTURE(whole, each);
  CHECK(whole > 10);  // about 400: the flat vector's mean |v| is the large layer's
  CHECK(each < 1);    // about 0.6: sqrt(1 - 2/pi) for a normal layer
  CHECK(whole > 100 * each);
}

TEST_CASE("per_tensor rejects malformed frames with wire_error and leaves acc untouched", "[codec][per_tensor]") {
  per_tensor<commpact::sign_codec> pt{kLayout};
  const std::size_t n = total(kLayout);
  const auto v = gradient(3, kLayout);
  std::vector<std::byte> msg(pt.max_encoded_bytes(n));
  msg.resize(pt.encode(v, msg, {}));
  const auto acc0 = commpact_test::normal(4, n);
  auto expect_rejected = [&](std::vector<std::byte> bad) {
    auto acc = acc0;
    CHECK_THROWS_AS(pt.decode_add(bad, acc), commpact::wire_error);
    CHECK(same_bits(acc, acc0));
  };
  auto set_length = [&](std::vector<std::byte> m, std::size_t at, std::uint32_t len) {
    std::memcpy(m.data() + at, &len, 4);
    return m;
  };
  const std::size_t len0 = 4 + (15 + 7) / 8, at1 = 4 + len0;  // tensor 0: 15 values; tensor 1 starts at at1
  SECTION("the valid message decodes") {
    auto acc = acc0;
    pt.decode_add(msg, acc);
    CHECK(!same_bits(acc, acc0));
  }
  SECTION("truncated") {
    expect_rejected({msg.begin(), msg.end() - 1});                                    // in the last message
    expect_rejected({msg.begin(), msg.begin() + static_cast<std::ptrdiff_t>(at1 + 2)});  // inside a length
    expect_rejected({msg.begin(), msg.begin() + static_cast<std::ptrdiff_t>(at1)});      // before a length
    expect_rejected({});
  }
  SECTION("a length beyond the remaining bytes") { expect_rejected(set_length(msg, at1, 0xFFFFFFFFu)); }
  SECTION("a length beyond the codec's max for that tensor, within the message") {
    expect_rejected(set_length(msg, 0, static_cast<std::uint32_t>(len0 + 4)));
  }
  SECTION("a length below the codec's message (the rest misread as the next length)") {
    expect_rejected(set_length(msg, 0, static_cast<std::uint32_t>(len0 - 1)));
  }
  SECTION("trailing bytes") {
    auto bad = msg;
    bad.push_back(std::byte{0});
    expect_rejected(bad);
  }
  SECTION("a bad message in the last tensor undoes the tensors decoded before it") {
    auto bad = msg;
    const float nan = std::nanf("");
    std::memcpy(bad.data() + bad.size() - (4 + 1), &nan, 4);  // tensor 3 (4 values): scale, 1 byte of signs
    expect_rejected(bad);
  }
  SECTION("top-k: a bad entry in a later tensor undoes the earlier ones") {
    per_tensor<commpact::topk_codec> tk{kLayout, commpact::topk_codec{0.2}};
    std::vector<std::byte> m(tk.max_encoded_bytes(n));
    m.resize(tk.encode(v, m, {}));
    auto acc = acc0;
    auto bad = m;
    const std::int32_t out_of_range = 1000;
    std::memcpy(bad.data() + bad.size() - 8, &out_of_range, 4);  // tensor 3 has k = 1: its index
    CHECK_THROWS_AS(tk.decode_add(bad, acc), commpact::wire_error);
    CHECK(same_bits(acc, acc0));
    tk.decode_add(m, acc);
    CHECK(!same_bits(acc, acc0));
  }
}

TEST_CASE("per_tensor rejects a layout that does not fit the gradient", "[codec][per_tensor]") {
  const std::size_t n = total(kLayout);
  per_tensor<commpact::sign_codec> pt{kLayout};
  CHECK(pt.check(n).empty());
  CHECK(!pt.check(n + 1).empty());
  CHECK(!pt.check(n - 1).empty());
  std::vector<float> v(n + 1, 1.0f), acc(n + 1);
  std::vector<std::byte> msg(pt.max_encoded_bytes(n) + 64);
  CHECK_THROWS_AS(pt.encode(v, msg, {}), commpact::invalid_argument);
  CHECK_THROWS_AS(pt.decode_add(msg, acc), commpact::invalid_argument);
  CHECK_THROWS_AS(per_tensor<commpact::sign_codec>(tensor_layout{}), commpact::invalid_argument);
  CHECK_THROWS_AS(per_tensor<commpact::sign_codec>(tensor_layout{{3, 0}}), commpact::invalid_argument);

  // Through CodecCompressor: check(n) rejects, on every rank, before anything changes.
  const int P = 3;
  std::vector<int> outcome(P, -1);
  commpact::run_threads(P, [&](commpact::ThreadComm& comm) {
    Comp<commpact::sign_codec> c{comm, per_tensor<commpact::sign_codec>{kLayout}};
    std::vector<float> g(n + 1, 1.0f);
    try {
      c.reduce(std::span<float>(g));
      outcome[comm.rank()] = 0;
    } catch (const commpact::invalid_argument&) {
      outcome[comm.rank()] = 1;
    }
    std::vector<float> ok(n, 1.0f);
    if (c.steps() == 0 && c.residual().empty() && c.reduce(std::span<float>(ok))) outcome[comm.rank()] += 10;
  });
  CHECK(outcome == std::vector<int>(P, 11));  // every rank raised, then a good step runs
  // A tensor that K itself rejects (top-k with k above the tensor's length).
  commpact::sparse_options o;
  o.k = 3;
  per_tensor<commpact::topk_codec> tk{{{2}, {5}}, commpact::topk_codec{o}};
  CHECK(tk.check(7).find("tensor 0") != std::string::npos);
}

TEST_CASE("ranks with other layouts of the same length disagree through the agreement value", "[codec][per_tensor]") {
  const tensor_layout a = {{2, 3}, {4}}, b = {{4}, {2, 3}};
  CHECK(per_tensor<commpact::sign_codec>{a}.agreement(10) != per_tensor<commpact::sign_codec>{b}.agreement(10));
  CHECK(per_tensor<commpact::sign_codec>{a}.agreement(10) == per_tensor<commpact::sign_codec>{a}.agreement(10));
  int raised = 0;
  std::mutex mu;
  CHECK_THROWS_AS(commpact::run_threads(2,
                                        [&](commpact::ThreadComm& comm) {
                                          Comp<commpact::sign_codec> c{
                                              comm, per_tensor<commpact::sign_codec>{comm.rank() ? b : a}};
                                          std::vector<float> g(10, 1.0f);
                                          try {
                                            c.reduce(std::span<float>(g));
                                          } catch (const commpact::mismatch_error&) {
                                            std::lock_guard lock(mu);
                                            ++raised;
                                            throw;
                                          }
                                        }),
                  commpact::mismatch_error);
  CHECK(raised == 2);
}

TEST_CASE("CodecCompressor<per_tensor<topk_codec>> allocates nothing after the first step", "[codec][per_tensor]") {
  std::vector<char> same(2, 0);
  commpact::run_threads(2, [&](commpact::ThreadComm& comm) {
    Comp<commpact::topk_codec> c{comm, per_tensor{kLayout, commpact::topk_codec{0.2}}};
    std::vector<std::pair<const void*, std::size_t>> first;
    for (int s = 0; s < 4; ++s) {
      auto g = gradient(50 + static_cast<std::uint64_t>(s) + 7 * static_cast<std::uint64_t>(comm.rank()), kLayout);
      c.reduce(std::span<float>(g));
      if (s == 0) first = c.workspace_signature();
    }
    same[comm.rank()] = c.workspace_signature() == first;
  });
  CHECK(same == std::vector<char>{1, 1});
}

TEST_CASE("split_rows gives every row of a matrix its own tensor; vectors stay whole", "[codec][per_tensor]") {
  const tensor_layout l = {{3, 4}, {1, 5}, {6}, {2, 2}};
  const tensor_layout want = {{1, 4}, {1, 4}, {1, 4}, {1, 5}, {6}, {1, 2}, {1, 2}};
  CHECK(commpact::split_rows(l) == want);
  CHECK_THROWS_AS(commpact::split_rows(tensor_layout{}), commpact::invalid_argument);
  // A scale per row: a row of scale 1e-3 in a matrix of scale 1 keeps its own scale.
  per_tensor pt{commpact::split_rows({{2, 64}}), commpact::sign_codec{}};
  auto v = commpact_test::normal(8, 128);
  for (std::size_t i = 64; i < 128; ++i) v[i] *= 1e-3f;
  std::vector<std::byte> msg(pt.max_encoded_bytes(128));
  std::vector<float> approx(128);
  CHECK(pt.encode(v, msg, approx) == 2 * (4 + 4 + 8));
  double a = 0;
  for (std::size_t i = 64; i < 128; ++i) a += std::abs(v[i]);
  CHECK(std::abs(approx[64]) == static_cast<float>(a / 64));
}
