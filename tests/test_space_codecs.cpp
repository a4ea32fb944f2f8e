// CodecCompressor (so TopK, every codec and the per-tensor codecs) over the deferred space:
// the same object code path as host_space, with every kernel and the
// allgather queued until finish()'s fence. Against host_space, for every codec: the
// same output bits, residuals and velocities (with DGC momentum and clipping), the same
// error on every rank for NaN on one rank and for a malformed block, nothing changed by
// a failed step, and no allocation after the first step.
#include <catch2/catch.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/codecs/casts.hpp>
#include <commpact/compress/codecs/per_tensor.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/sparsifiers.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/compressors/topk.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "common/space_copies.hpp"

using namespace commpact;
using namespace commpact_test::deferred_twins;

namespace {

using DC = DeferredComm<ThreadComm>;
template <class K>
using host_c = CodecCompressor<K, Allgather<ThreadComm>>;
template <class K>
using dev_c = CodecCompressor<K, Allgather<DC>>;

const tensor_layout layout = {{20, 30}, {30}, {10, 30}, {10}};  // 940 values

// One codec per family, as the library's defaults build them.
struct topk_case {
  static topk_codec make() { return topk_codec{sparse_options{.density = 0.03}, "TopK"}; }
};
struct sign_case {
  static sign_codec make() { return sign_codec{}; }
};
struct qsgd_case {
  static qsgd_codec make() { return qsgd_codec{16, 5}; }
};
struct terngrad_case {
  static terngrad_codec make() { return terngrad_codec{5}; }
};
struct onebit_case {
  static onebit_codec make() { return onebit_codec{}; }
};
struct natural_case {
  static natural_codec make() { return natural_codec{5}; }
};
struct fp16_case {
  static fp16_codec make() { return fp16_codec{}; }
};
struct threshold_case {
  static threshold_codec make() { return threshold_codec{0.5f, 0.05}; }
};
struct gaussiank_case {
  static gaussiank_codec make() { return gaussiank_codec{0.02}; }
};
struct dgc_case {
  static dgc_codec make() { return dgc_codec{0.02, 0.1, 5}; }
};
struct per_row_sign_case {
  static per_tensor<sign_codec> make() { return per_tensor<sign_codec>{split_rows(layout)}; }
};

}  // namespace

TEMPLATE_TEST_CASE("CodecCompressor over the deferred space equals host_space bit for bit, residuals included",
                   "[space][codec]", topk_case, sign_case, qsgd_case, terngrad_case, onebit_case, natural_case,
                   fp16_case, threshold_case, gaussiank_case, dgc_case, per_row_sign_case) {
  using K = decltype(TestType::make());
  const int P = GENERATE(1, 2, 3, 5);
  const bool dgc = GENERATE(false, true);  // DGC momentum correction and clipping
  const std::size_t n = 940;
  CAPTURE(P, dgc);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    codec_options o;
    if (dgc) o.momentum = 0.9f, o.clip_norm = 3.0f;
    host_c<K> h{comm, TestType::make(), o};
    dev_c<K> d{DC{comm}, TestType::make(), o};
    const auto e = d.comm().exec();
    bool good = true;
    for (int step = 0; step < 4; ++step) {
      auto g = normal(1000 * step + comm.rank(), n);
      auto dg = device_copy(e, g);
      const bool a = h.reduce(std::span<float>(g));
      const bool b = d.reduce(dg.view());
      good = good && a && b && same_bits(g, host_copy(e, dg.cview()));
      good = good && same_bits(h.residual(), host_copy(e, d.residual()));
      good = good && same_bits(h.velocity(), host_copy(e, d.velocity()));
      good = good && h.steps() == d.steps() && h.block_bytes() == d.block_bytes();
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("TopK over the deferred space: the result is in grad only after finish()", "[space][codec]") {
  const int P = 2;
  const std::size_t n = 500;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    TopK<DC> d{DC{comm}, {.density = 0.05}};
    TopK<ThreadComm> h{comm, {.density = 0.05}};
    const auto e = d.comm().exec();
    auto g = normal(comm.rank(), n), hg = g;
    auto dg = device_copy(e, g);
    h.reduce(std::span<float>(hg));
    d.start(dg.view());
    // Read without a fence: on a GPU this is a race; here it is the input, every time.
    bool good = same_bits(deferred_access::host(dg.cview()), g);
    d.finish();
    d.commit();
    good = good && same_bits(host_copy(e, dg.cview()), hg);
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

namespace {
// A codec that corrupts its message on one rank at one step (for the wire_error path).
struct corrupting_codec {
  sign_codec inner{};
  int rank = 0, bad_rank = -1;
  std::int64_t step = 0, bad_step = -1;
  void bind_rank(int r) { rank = r; }
  void begin_step(std::int64_t s) { step = s; }
  std::size_t max_encoded_bytes(std::size_t n) const { return inner.max_encoded_bytes(n); }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
    const std::size_t len = inner.encode(v, msg, approx);
    if (rank == bad_rank && step == bad_step) return len - 1;  // one byte short: malformed
    return len;
  }
  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const { inner.decode_add(msg, acc); }
};
}  // namespace

TEST_CASE("CodecCompressor over the deferred space: NaN on one rank and a malformed block raise alike and change "
          "nothing",
          "[space][codec]") {
  const int P = 4;
  const std::size_t n = 700;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    using D = dev_c<corrupting_codec>;
    D d{DC{comm}, corrupting_codec{.inner = {}, .bad_rank = 2, .bad_step = 2}, {.momentum = 0.5f}};
    D ref{DC{comm}, corrupting_codec{}, {.momentum = 0.5f}};
    const auto e = d.comm().exec();
    const auto e2 = ref.comm().exec();
    auto g0 = normal(comm.rank(), n);
    auto a = device_copy(e, g0), b = device_copy(e2, g0);
    d.reduce(a.view());
    ref.reduce(b.view());
    bool good = true;
    // Step 1: NaN on rank 1 only; numeric_error everywhere, grad and state untouched.
    {
      const auto res = host_copy(e, d.residual()), vel = host_copy(e, d.velocity());
      auto bad = normal(50 + comm.rank(), n);
      if (comm.rank() == 1) bad[17] = std::numeric_limits<float>::quiet_NaN();
      auto dbad = device_copy(e, bad);
      bool raised = false;
      try {
        d.reduce(dbad.view());
      } catch (const numeric_error&) {
        raised = true;
      }
      good = good && raised && same_bits(host_copy(e, dbad.cview()), bad);
      good = good && same_bits(host_copy(e, d.residual()), res) && same_bits(host_copy(e, d.velocity()), vel);
      good = good && d.steps() == 1;
    }
    // Step "2" of d's codec counter is the corrupt one: d.steps() is still 1, so run one
    // good step on both, then the corrupt one on d.
    {
      auto g = normal(70 + comm.rank(), n);
      auto x = device_copy(e, g), y = device_copy(e2, g);
      d.reduce(x.view());
      ref.reduce(y.view());
      good = good && same_bits(host_copy(e, x.cview()), host_copy(e2, y.cview()));
    }
    {
      const auto res = host_copy(e, d.residual());
      auto g = normal(90 + comm.rank(), n);
      auto x = device_copy(e, g);
      bool raised = false;
      try {
        d.reduce(x.view());
      } catch (const wire_error&) {
        raised = true;
      }
      good = good && raised && same_bits(host_copy(e, x.cview()), g) && same_bits(host_copy(e, d.residual()), res);
      good = good && d.steps() == 2;
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

namespace {
// A codec whose decoder reads every byte of the message it is handed (no length check).
struct reads_all_codec {
  std::size_t max_encoded_bytes(std::size_t) const { return 4; }
  std::size_t encode(std::span<const float>, std::span<std::byte>, std::span<float>) const { return 0; }
  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    unsigned s = 0;
    for (const std::byte b : msg) s += static_cast<unsigned>(b);
    acc[0] += static_cast<float>(s & 1u);
  }
};
}  // namespace

TEST_CASE("codec_decode_sum: a header that announces more payload than its block holds is a wire error, not a read "
          "past the block",
          "[space][codec][gate]") {
  // The decode runs before the host has checked the headers, so the row bounds the length.
  const std::size_t P = 2, bw = 16;
  std::vector<float> b(P * bw, 0.0f);
  for (std::size_t r = 0; r < P; ++r)
    frame::write(std::as_writable_bytes(std::span<float>(b).subspan(r * bw, 12)),
                 frame::header{.payload = 4, .n = 3, .capacity = 64});
  const std::uint32_t huge = 1u << 20;
  std::memcpy(&b[bw + 2], &huge, 4);  // rank 1's payload word
  std::vector<float> sum(3, 5.0f);
  std::vector<std::uint32_t> st(1, 0u);
  ops<host_space>::codec_decode_sum({}, reads_all_codec{}, std::span<const float>(b), bw, std::span<float>(sum),
                                    std::span<std::uint32_t>(st));
  CHECK(st[0] == status_wire);
  CHECK(std::isnan(sum[0]));
}

TEST_CASE("frame_gate: a step's mean is written only when every frame header is clean", "[space][codec][gate]") {
  // P blocks of 16 words with clean headers; then each way a header can be unclean.
  const std::size_t P = 3, bw = 16;
  auto blocks = [&] {
    std::vector<float> b(P * bw, 0.0f);
    for (std::size_t r = 0; r < P; ++r)
      frame::write(std::as_writable_bytes(std::span<float>(b).subspan(r * bw, 12)),
                   frame::header{.payload = 8, .n = 40, .agreement = 3, .step = 7, .capacity = 64});
    return b;
  };
  auto set = [](std::vector<float>& b, std::size_t word, std::uint32_t v) { std::memcpy(&b[word], &v, 4); };
  auto gate = [&](const std::vector<float>& b) {
    std::vector<float> sum(5, 1.0f);
    std::vector<std::uint32_t> st(1, 0u);
    ops<host_space>::frame_gate({}, std::span<const float>(b), bw, std::span<float>(sum), std::span<std::uint32_t>(st));
    const bool passed = st[0] == 0u && sum[0] == 1.0f;
    CHECK((passed || (st[0] == status_wire && std::isnan(sum[0]))));
    return passed;
  };
  CHECK(gate(blocks()));
  for (std::size_t r = 0; r < P; ++r) {
    CAPTURE(r);
    auto b = blocks();
    set(b, r * bw + 1, 1u | (std::uint32_t{frame::nonfinite_input} << 16));  // a flag
    CHECK_FALSE(gate(b));
    b = blocks(), set(b, r * bw + 1, 1u | (std::uint32_t{frame::rejected_input} << 16));
    CHECK_FALSE(gate(b));
    b = blocks(), set(b, r * bw, 0x12345678u);  // magic
    CHECK_FALSE(gate(b));
    b = blocks(), set(b, r * bw + 3, 1u);  // the zero word
    CHECK_FALSE(gate(b));
    b = blocks(), set(b, r * bw + 2, 4 * bw - 48 + 1);  // payload past the block
    CHECK_FALSE(gate(b));
    b = blocks(), set(b, r * bw + 2, 4 * bw - 48);  // payload filling the block: clean
    CHECK(gate(b));
    for (std::size_t w = 4; w < 12; ++w) {  // n, agreement, step, capacity: one rank differs
      CAPTURE(w);
      b = blocks();
      set(b, r * bw + w, 99u);
      CHECK_FALSE(gate(b));
    }
  }
  CHECK_FALSE(gate(std::vector<float>(P * 8, 0.0f)));  // blocks too small for a header
}

TEMPLATE_TEST_CASE("CodecCompressor: ranks out of step raise mismatch_error alike with grad untouched", "[space][codec][gate]",
                   ThreadComm, DC) {
  // Rank 0 cancels a finished step the others commit: the next step's payloads decode, but
  // the headers disagree on the step, so every rank raises and no rank's grad changes
  // (the mean is queued before the host reads the headers; the space's gate keeps it out).
  const int P = 3;
  const std::size_t n = 400;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    CodecCompressor<qsgd_codec, Allgather<TestType>> c{TestType{comm}, qsgd_codec{16, 5}};
    auto read = [&](auto& buf) {
      if constexpr (std::is_same_v<TestType, DC>) return host_copy(c.comm().exec(), buf.cview());
      else return buf;
    };
    auto make = [&](const std::vector<float>& h) {
      if constexpr (std::is_same_v<TestType, DC>) return device_copy(c.comm().exec(), h);
      else return h;
    };
    auto view = [](auto& buf) {
      if constexpr (std::is_same_v<TestType, DC>) return buf.view();
      else return std::span<float>(buf);
    };
    auto g1 = make(normal(10 + comm.rank(), n));
    c.reduce(view(g1));
    auto g2 = make(normal(20 + comm.rank(), n));
    c.start(view(g2));
    c.finish();
    if (comm.rank() == 0) c.cancel();
    else c.commit();
    const auto in = normal(30 + comm.rank(), n);
    auto g3 = make(in);
    bool raised = false;
    try {
      c.reduce(view(g3));
    } catch (const mismatch_error&) {
      raised = true;
    }
    ok[static_cast<std::size_t>(comm.rank())] = raised && same_bits(read(g3), in);
  });
  for (int r = 0; r < P; ++r) CHECK(ok[static_cast<std::size_t>(r)] == 1);
}

TEST_CASE("CodecCompressor over the deferred space allocates nothing after the first step", "[space][codec][alloc]") {
  const int P = 3;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    TopK<DC> d{DC{comm}, {.density = 0.02, .momentum = 0.5f, .clip_norm = 2.0f}};
    const auto e = d.comm().exec();
    auto g = device_copy(e, normal(comm.rank(), 3000));
    d.reduce(g.view());
    d.reduce(g.view());
    const auto sig = d.workspace_signature();
    bool good = true;
    for (int s = 0; s < 3; ++s) {
      d.reduce(g.view());
      good = good && d.workspace_signature() == sig;
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}
