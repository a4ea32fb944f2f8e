// basic_error_feedback<Space> (compress/error_feedback.hpp), the one residual of every
// compressor that keeps one, over host_space and the deferred space against a plain loop,
// bit for bit: zeros before the first step, accumulate (with and without DGC momentum, with
// a clipping scale), subtract, commit (a swap), cancel (nothing installed changes), a
// non-finite input in the status, forget, install_zeros, and the state round trip
// (sections 10 and 11; a blob saved with the other momentum setting raises).
#include <catch2/catch.hpp>
#include <commpact/compress/error_feedback.hpp>
#include <commpact/kernels/deferred/ops.hpp>
#include <commpact/space/deferred.hpp>

#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "common/space_copies.hpp"

using namespace commpact;
using commpact_test::normal;
using commpact_test::same_bits;

namespace {
using vec = std::vector<float>;

template <class S>
typename S::exec make_exec() {
  if constexpr (requires { S::make_exec(); }) return S::make_exec();
  else return typename S::exec{};
}

template <class S, class T>
std::vector<T> host_of(const typename S::exec& e, typename S::template span<const T> s) {
  return copy_to_host<S>(e, s);
}

// One step of the plain loop: u' = m u + s g (s g without momentum), acc = r + u'.
void reference_accumulate(const vec& r, vec& u, const vec& g, float m, float s, bool momentum, vec& acc) {
  acc.resize(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    volatile float sg = s * g[i];
    float x = sg;
    if (momentum) {
      volatile float mu = m * (u.empty() ? 0.0f : u[i]);
      x = mu + sg;
      u.resize(g.size());
      u[i] = x;
    }
    acc[i] = (r.empty() ? 0.0f : r[i]) + x;
  }
}
}  // namespace

TEMPLATE_TEST_CASE("error feedback: accumulate, subtract, commit and cancel give the plain loop's bits",
                   "[error_feedback]", host_space, deferred_space) {
  using S = TestType;
  const bool momentum = GENERATE(false, true);
  const std::size_t n = 37;
  const float m = 0.9f, s = 0.75f;
  const auto e = make_exec<S>();
  basic_error_feedback<S> ef{momentum};
  typename S::template buffer<float> scale, g, delivered;
  typename S::template buffer<std::uint32_t> status;
  copy_from_host<S>(e, std::span<const float>(vec{s}), scale);
  copy_from_host<S>(e, std::span<const std::uint32_t>(std::vector<std::uint32_t>{0}), status);

  vec r, u, acc;  // the reference residual, velocity and candidate
  REQUIRE(ef.size() == 0);
  REQUIRE(ef.residual().empty());
  for (int step = 0; step < 4; ++step) {
    const vec gh = normal(100 + static_cast<std::uint64_t>(step), n);
    copy_from_host<S>(e, std::span<const float>(gh), g);
    ef.begin(e, n, true);
    ef.accumulate(e, g.cview(), m, scale.cview(), status.view());
    vec u_ref = u;
    reference_accumulate(r, u_ref, gh, m, s, momentum, acc);
    REQUIRE(same_bits(host_of<S, float>(e, std::as_const(ef).candidate()), acc));
    if (step == 1) {  // a cancelled step leaves what was installed
      const vec before = host_of<S, float>(e, ef.residual());
      ef.cancel();
      REQUIRE(same_bits(host_of<S, float>(e, ef.residual()), before));
      continue;
    }
    // Half of each value is delivered; the rest stays.
    vec d(n);
    for (std::size_t i = 0; i < n; ++i) d[i] = acc[i] * 0.5f;
    copy_from_host<S>(e, std::span<const float>(d), delivered);
    ef.subtract(e, delivered.cview());
    ef.commit();
    for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] - d[i];
    r = acc;
    u = u_ref;
    REQUIRE(ef.size() == static_cast<std::int64_t>(n));
    REQUIRE(same_bits(host_of<S, float>(e, ef.residual()), r));
    REQUIRE(same_bits(host_of<S, float>(e, ef.velocity()), momentum ? u : vec{}));
  }
  REQUIRE(host_of<S, std::uint32_t>(e, status.cview())[0] == 0u);

  SECTION("a non-finite input sets the status and installs nothing") {
    vec gh = normal(7, n);
    gh[5] = std::numeric_limits<float>::quiet_NaN();
    copy_from_host<S>(e, std::span<const float>(gh), g);
    ef.begin(e, n, true);
    ef.accumulate(e, g.cview(), m, scale.cview(), status.view());
    REQUIRE((host_of<S, std::uint32_t>(e, status.cview())[0] & status_nonfinite) != 0u);
    ef.cancel();
    REQUIRE(same_bits(host_of<S, float>(e, ef.residual()), r));
  }

  SECTION("the state round trip: sections 10 and 11, all or nothing") {
    std::vector<std::byte> blob;
    save_feedback_state(blob, "commpact.test", ef, e, 4, 1);
    basic_error_feedback<S> back{momentum};
    auto st = load_feedback_state(blob, "commpact.test", "test", momentum);
    REQUIRE(st.steps == 4);
    REQUIRE(st.skipped == 1);
    back.install(e, std::move(st.ef));
    REQUIRE(same_bits(host_of<S, float>(e, back.residual()), r));
    REQUIRE(same_bits(host_of<S, float>(e, back.velocity()), momentum ? u : vec{}));
    REQUIRE_THROWS_AS(load_feedback_state(blob, "commpact.test", "test", !momentum), invalid_argument);
  }

  SECTION("forget and install_zeros") {
    ef.forget();
    REQUIRE(ef.size() == 0);
    REQUIRE(ef.residual().empty());
    ef.install_zeros(e, 5);
    REQUIRE(same_bits(host_of<S, float>(e, ef.residual()), vec(5, 0.0f)));
  }
}
