// PowerCompressor (PowerSGD) over the deferred space: the same step as
// host_space, with every product, the orthonormalisation, the Q draw, the means, the
// checks and the three allreduces queued until finish()'s one fence. Against host_space:
// the same output bits, residuals and Q factors over several steps at P = 1 ... 4 (a
// layout mixing compressed matrices, matrices sent dense and vectors; start_step > 0;
// warm start on and off; skipped steps, one by a bad P, one by a bad Q), the same error
// on every rank for NaN on one rank with nothing changed (grad included), cancel then
// retry equal to a clean run, no allocation after the first step, and a result read
// before finish() stale.
#include <catch2/catch.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/transaction.hpp>

#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "common/space_copies.hpp"

using namespace commpact;
using namespace commpact_test::deferred_twins;

namespace {

using DC = DeferredComm<ThreadComm>;
using host_p = PowerCompressor<3>;
using dev_p = PowerCompressor<3, deferred_space>;

// Compressed at min_compression_rate 1: {24, 18}, {30, 40}, {16, 16}; sent dense: {7, 5}
// (3 (7 + 5) > 35) and the vectors {18}, {1, 9}, {9}.
const tensor_layout kLayout = {{24, 18}, {18}, {7, 5}, {30, 40}, {1, 9}, {9}, {16, 16}};
const std::size_t kN = 24 * 18 + 18 + 35 + 1200 + 9 + 9 + 256;
constexpr std::size_t kBig = 0;  // tensor 0: where the Q overflow is staged

static_assert(req::two_phase_compressor<host_p>, "pending_step must hold PowerCompressor's step, not snapshot it");
static_assert(Compressor<host_p>);

//! Every residual and Q factor of c, on the host, in tensor order (with their lengths).
std::vector<float> state_of(host_p& c, const deferred_space::exec&) {
  std::vector<float> s;
  for (std::size_t i = 0; i < c.layout().size(); ++i) {
    const auto r = c.residual(i), q = c.q_factor(i);
    s.push_back(static_cast<float>(r.size()));
    s.insert(s.end(), r.begin(), r.end());
    s.insert(s.end(), q.begin(), q.end());
  }
  return s;
}
std::vector<float> state_of(dev_p& c, const deferred_space::exec& e) {
  std::vector<float> s;
  for (std::size_t i = 0; i < c.layout().size(); ++i) {
    const auto r = host_copy(e, c.residual(i)), q = host_copy(e, c.q_factor(i));
    s.push_back(static_cast<float>(r.size()));
    s.insert(s.end(), r.begin(), r.end());
    s.insert(s.end(), q.begin(), q.end());
  }
  return s;
}
template <class C>
std::vector<std::byte> blob(const C& c) {
  std::vector<std::byte> b;
  c.save_state(b);
  return b;
}

//! Makes Q of tensor 0 tiny in column 0's first row and M's column 0 huge on rank 0: P
//! stays finite, Q = M^T P overflows (a step skipped by its Q, which is then redrawn).
template <class C>
void stage_q_overflow(C& c, std::vector<float>& g, int rank, const deferred_space::exec& e) {
  std::vector<float> q;
  if constexpr (std::is_same_v<C, host_p>) q.assign(c.q_factor(kBig).begin(), c.q_factor(kBig).end());
  else q = host_copy(e, c.q_factor(kBig));
  for (std::size_t col = 0; col < 3; ++col) q[col * 18] = 1e-30f;
  c.set_q_factor(kBig, q);
  if (rank == 0)
    for (std::size_t i = 0; i < 24; ++i) g[i * 18] = 3e38f;
}

}  // namespace

TEST_CASE("PowerCompressor over the deferred space equals host_space bit for bit: results, residuals, Q",
          "[space][power]") {
  const int P = GENERATE(1, 2, 3, 4);
  const bool warm = GENERATE(false, true);
  const std::int64_t start_step = GENERATE(0, 2);
  const bool skip = GENERATE(false, true);  // skip_step, with a NaN step and (warm) a Q-overflow step
  CAPTURE(P, warm, start_step, skip);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const power_options o{.min_compression_rate = 1.0,
                          .start_step = start_step,
                          .warm_start = warm,
                          .on_nonfinite = skip ? nonfinite::skip_step : nonfinite::raise};
    host_p h{comm, kLayout, o};
    dev_p d{DC{comm}, kLayout, o};
    const auto e = d.comm().exec();
    bool good = d.floats_per_step() == h.floats_per_step();
    int skipped = 0;
    for (int step = 0; step < 7; ++step) {
      auto g = normal(1000 * step + comm.rank(), kN);
      if (skip && step == 3 && comm.rank() == P - 1) g[5] = std::numeric_limits<float>::quiet_NaN();
      if (skip && warm && step == 5) {
        stage_q_overflow(h, g, comm.rank(), e);
        stage_q_overflow(d, g, comm.rank(), e);
      }
      auto dg = device_copy(e, g);
      const bool a = h.reduce(std::span<float>(g));
      const bool b = d.reduce(dg.view());
      skipped += !a;
      good = good && a == b && same_bits(g, host_copy(e, dg.cview()));
      good = good && same_bits(state_of(h, e), state_of(d, e)) && blob(h) == blob(d);
      good = good && h.steps() == d.steps() && h.skipped_steps() == d.skipped_steps();
    }
    // The skipped steps happened (step 3 at any start_step; step 5 by its Q).
    good = good && skipped == (skip ? (warm ? 2 : 1) : 0);
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("PowerCompressor over the deferred space: NaN on one rank raises alike and changes nothing, grad included",
          "[space][power]") {
  const int P = 3;
  const std::int64_t start_step = GENERATE(0, 1, 3);  // the NaN step is dense (start_step 3) or compressed
  CAPTURE(start_step);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const power_options o{.min_compression_rate = 1.0, .start_step = start_step};
    dev_p d{DC{comm}, kLayout, o}, ref{DC{comm}, kLayout, o};
    host_p h{comm, kLayout, o};
    const auto e = d.comm().exec();
    bool good = true;
    for (int step = 0; step < 5; ++step) {
      auto g = normal(70 + step * 10 + comm.rank(), kN);
      if (step == 2) {  // the failing step on d and h; ref never sees it
        auto bad = g;
        if (comm.rank() == 1) bad[kN - 3] = std::numeric_limits<float>::infinity();
        auto dbad = device_copy(e, bad);
        const auto before = state_of(d, e);
        const auto saved = blob(d);
        int raised = 0;
        try {
          d.reduce(dbad.view());
        } catch (const numeric_error&) {
          ++raised;
        }
        auto hbad = bad;
        try {
          h.reduce(std::span<float>(hbad));
        } catch (const numeric_error&) {
          ++raised;
        }
        good = good && raised == 2 && same_bits(host_copy(e, dbad.cview()), bad) && same_bits(hbad, bad);
        good = good && same_bits(state_of(d, e), before) && blob(d) == saved && d.steps() == 2 && h.steps() == 2;
      }
      auto x = device_copy(e, g), y = device_copy(e, g);
      auto hg = g;
      d.reduce(x.view());
      ref.reduce(y.view());
      h.reduce(std::span<float>(hg));
      good = good && same_bits(host_copy(e, x.cview()), host_copy(e, y.cview())) &&
             same_bits(hg, host_copy(e, x.cview()));
      good = good && same_bits(state_of(d, e), state_of(ref, e)) && same_bits(state_of(h, e), state_of(d, e));
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("PowerCompressor: cancel after start or after finish, then retry, equals a clean run", "[space][power]") {
  const int P = 2;
  const bool after_finish = GENERATE(false, true);
  CAPTURE(after_finish);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const power_options o{.min_compression_rate = 1.0, .start_step = 1};
    dev_p d{DC{comm}, kLayout, o}, ref{DC{comm}, kLayout, o};
    host_p h{comm, kLayout, o}, href{comm, kLayout, o};
    const auto e = d.comm().exec();
    bool good = true;
    for (int step = 0; step < 5; ++step) {
      const auto g = normal(300 + step * 7 + comm.rank(), kN);
      if (step == 1 || step == 3) {  // a cancelled attempt on another gradient first
        auto other = device_copy(e, normal(900 + step, kN));
        auto hother = normal(900 + step, kN);
        d.start(other.view());
        h.start(std::span<float>(hother));
        if (after_finish) {
          good = good && d.finish() && h.finish();
        }
        d.cancel();
        h.cancel();
      }
      auto x = device_copy(e, g), y = device_copy(e, g);
      auto hx = g, hy = g;
      d.reduce(x.view());
      ref.reduce(y.view());
      h.reduce(std::span<float>(hx));
      href.reduce(std::span<float>(hy));
      good = good && same_bits(host_copy(e, x.cview()), host_copy(e, y.cview())) && same_bits(hx, hy);
      good = good && same_bits(state_of(d, e), state_of(ref, e)) && same_bits(state_of(h, e), state_of(href, e));
      good = good && blob(d) == blob(ref) && blob(h) == blob(href) && same_bits(hx, host_copy(e, x.cview()));
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("PowerCompressor allocates nothing after the first step, dense warm-up steps included", "[space][power][alloc]") {
  const int P = 3;
  const std::int64_t start_step = GENERATE(0, 2);
  CAPTURE(start_step);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const power_options o{.min_compression_rate = 1.0, .start_step = start_step};
    dev_p d{DC{comm}, kLayout, o};
    host_p h{comm, kLayout, o};
    const auto e = d.comm().exec();
    auto g = normal(comm.rank(), kN);
    auto dg = device_copy(e, g);
    d.reduce(dg.view());
    h.reduce(std::span<float>(g));
    const auto ds = d.workspace_signature(), hs = h.workspace_signature();
    bool good = true;
    for (int s = 0; s < 5; ++s) {
      d.reduce(dg.view());
      h.reduce(std::span<float>(g));
      good = good && d.workspace_signature() == ds && h.workspace_signature() == hs;
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("PowerCompressor over the deferred space: the result is in grad only after finish()", "[space][power]") {
  const int P = 2;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    dev_p d{DC{comm}, kLayout, {.min_compression_rate = 1.0}};
    host_p h{comm, kLayout, {.min_compression_rate = 1.0}};
    const auto e = d.comm().exec();
    auto g = normal(comm.rank(), kN), hg = g;
    auto dg = device_copy(e, g);
    h.reduce(std::span<float>(hg));
    d.start(dg.view());
    // Read without a fence: on a GPU this is a race; here it is the input, every time.
    bool good = same_bits(deferred_access::host(dg.cview()), g) && e.pending() > 0;
    good = good && d.finish();
    d.commit();
    good = good && same_bits(host_copy(e, dg.cview()), hg) && !same_bits(hg, g);
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("PowerCompressor: a step out of order names the fix", "[space][power][errors]") {
  std::vector<std::string> msgs;
  run_threads(1, [&](ThreadComm& comm) {
    auto message = [](auto&& f) -> std::string {
      try {
        f();
      } catch (const std::exception& x) {
        return x.what();
      }
      return "no error";
    };
    host_p h{comm, kLayout};
    auto g = normal(1, kN);
    msgs.push_back(message([&] { h.finish(); }));
    h.start(std::span<float>(g));
    msgs.push_back(message([&] { h.start(std::span<float>(g)); }));
    std::vector<std::byte> b;
    msgs.push_back(message([&] { h.save_state(b); }));
    h.cancel();
    msgs.push_back(message([&] { h.reduce(std::span<float>(g)); }));
  });
  REQUIRE(msgs.size() == 4);
  CHECK_THAT(msgs[0], Catch::Contains("call start(grad) first"));
  CHECK_THAT(msgs[1], Catch::Contains("call finish() and commit()"));
  CHECK_THAT(msgs[2], Catch::Contains("a step is in flight"));
  CHECK(msgs[3] == "no error");
}
