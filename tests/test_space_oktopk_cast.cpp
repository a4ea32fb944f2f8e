// CastAllreduce (fp16/bf16 summed in the 16-bit type by the ring) and OkTopK over the
// deferred space: DeferredComm<ThreadComm> against host_space, bit for bit
// (results and residuals) over several steps at P = 1, 2, 3, 5; NaN on one rank raises
// alike on every rank and changes nothing (grad, residual, counters); cancel then retry
// equals a clean run; no allocation after the first step; the bytes on the wire are the
// documented formula (CountingComm under DeferredComm).
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/wire_model.hpp>
#include <commpact/compress/compressors/cast_allreduce.hpp>
#include <commpact/compress/compressors/oktopk.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "common/space_copies.hpp"

using namespace commpact;
using namespace commpact_test::deferred_twins;

namespace {
using DC = DeferredComm<ThreadComm>;

//! A gradient with a few large entries (saturation and rounding both matter).
std::vector<float> cast_grad(int step, int rank, std::size_t n) {
  auto g = normal(1000 * step + rank, n);
  for (std::size_t i = 0; i < n; i += 37) g[i] *= 300.0f;
  return g;
}
}  // namespace

TEMPLATE_TEST_CASE("CastAllreduce over the deferred space equals host_space bit for bit, residuals included",
                   "[space][cast_allreduce]", fp16_codec, bf16_codec) {
  const int P = GENERATE(1, 2, 3, 5);
  const bool ef = GENERATE(true, false);
  const std::size_t n = 517;  // chunks of unequal length
  CAPTURE(P, ef);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    CastAllreduce<TestType, ThreadComm> h{comm, {.error_feedback = ef}};
    CastAllreduce<TestType, DC> d{DC{comm}, {.error_feedback = ef}};
    const auto e = d.comm().exec();
    bool good = true;
    for (int step = 0; step < 4; ++step) {
      auto g = cast_grad(step, comm.rank(), n);
      auto dg = device_copy(e, g);
      const bool a = h.reduce(std::span<float>(g));
      const bool b = d.reduce(dg.view());
      good = good && a && b && same_bits(g, host_copy(e, dg.cview()));
      good = good && same_bits(h.residual(), host_copy(e, d.residual())) && h.residual().size() == (ef ? n : 0);
      good = good && h.steps() == d.steps();
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEMPLATE_TEST_CASE("CastAllreduce over the deferred space: NaN on one rank raises alike and changes nothing; cancel "
                   "then retry equals a clean run",
                   "[space][cast_allreduce]", fp16_codec, bf16_codec) {
  const int P = GENERATE(2, 3);
  const std::size_t n = 300;
  CAPTURE(P);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    CastAllreduce<TestType, DC> d{DC{comm}};
    CastAllreduce<TestType, ThreadComm> h{comm};  // the clean run
    const auto e = d.comm().exec();
    bool good = true;
    auto step = [&](int s) {
      auto g = cast_grad(s, comm.rank(), n);
      auto dg = device_copy(e, g);
      good = good && h.reduce(std::span<float>(g)) && d.reduce(dg.view());
      good = good && same_bits(g, host_copy(e, dg.cview())) && same_bits(h.residual(), host_copy(e, d.residual()));
    };
    step(0);
    // NaN on the last rank: numeric_error on every rank; grad, residual and steps unchanged.
    {
      const auto res = host_copy(e, d.residual());
      auto bad = cast_grad(50, comm.rank(), n);
      if (comm.rank() == P - 1) bad[17] = std::numeric_limits<float>::quiet_NaN();
      auto dbad = device_copy(e, bad);
      bool raised = false;
      try {
        d.reduce(dbad.view());
      } catch (const numeric_error&) {
        raised = true;
      }
      good = good && raised && same_bits(host_copy(e, dbad.cview()), bad);
      good = good && same_bits(host_copy(e, d.residual()), res) && d.steps() == 1 && d.skipped_steps() == 0;
    }
    // A started step cancelled, and one finished then cancelled: both leave no trace.
    {
      auto x = device_copy(e, cast_grad(60, comm.rank(), n));
      d.start(x.view());
      d.cancel();
      auto y = device_copy(e, cast_grad(61, comm.rank(), n));
      d.start(y.view());
      good = good && d.finish();
      d.cancel();
    }
    step(1);
    step(2);
    good = good && d.steps() == h.steps();
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("CastAllreduce over the deferred space allocates nothing after the first step; its bytes are the ring's",
          "[space][cast_allreduce][alloc]") {
  const int P = GENERATE(1, 2, 3, 5);
  const std::size_t n = 1001;
  CAPTURE(P);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    CountingComm<ThreadComm> counted{comm};
    Fp16Allreduce<DeferredComm<CountingComm<ThreadComm>>> d{DeferredComm{counted}};
    const auto e = d.comm().exec();
    auto g = device_copy(e, cast_grad(0, comm.rank(), n));
    d.reduce(g.view());
    const auto sig = d.workspace_signature();
    bool good = true;
    // The 16-bit ring and the step count (6 floats, compress/step_check.hpp).
    const auto w = wire::ring_allreduce(comm.rank(), P, n, 2), a = wire::ring_allreduce(comm.rank(), P, 6, 4);
    for (int s = 1; s < 4; ++s) {
      auto x = device_copy(e, cast_grad(s, comm.rank(), n));
      const auto before = counted.stats();
      d.reduce(x.view());
      const auto sent = counted.stats() - before;
      good = good && d.workspace_signature() == sig;
      good = good && sent.bytes_sent == w.bytes_sent + a.bytes_sent &&
             sent.messages_sent == w.messages_sent + a.messages_sent;
      good = good && w.messages_sent == 2 * static_cast<std::uint64_t>(P - 1);
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

// ---- OkTopK ---------------------------------------------------------------------------

namespace {
//! Gradients with denser regions, so that the regions move (as test_compress_oktopk's).
std::vector<float> ok_grad(int step, int rank, std::size_t n) {
  auto g = normal(7919 * step + rank, n);
  for (std::size_t i = 0; i < n; ++i) g[i] *= (i % 97 < 20 ? 3.f : 1.f);
  return g;
}
bool same_state(const OkTopK<ThreadComm>& h, const OkTopK<DC>& d, const deferred_space::exec& e) {
  return same_bits(h.residual(), host_copy(e, d.residual())) &&
         std::vector<std::int64_t>(h.bounds().begin(), h.bounds().end()) ==
             std::vector<std::int64_t>(d.bounds().begin(), d.bounds().end()) &&
         std::bit_cast<std::uint32_t>(h.theta()) == std::bit_cast<std::uint32_t>(d.theta()) && h.steps() == d.steps() &&
         h.skipped_steps() == d.skipped_steps();
}
}  // namespace

TEST_CASE("OkTopK over the deferred space equals host_space bit for bit across threshold periods",
          "[space][oktopk]") {
  const int P = GENERATE(1, 2, 3, 5);
  const std::size_t n = 1500;
  CAPTURE(P);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const oktopk_options o{.density = 0.03, .period = 3};  // estimates at steps 0, 3 and 6
    OkTopK<ThreadComm> h{comm, o};
    OkTopK<DC> d{DC{comm}, o};
    const auto e = d.comm().exec();
    bool good = true, moved = false;
    float theta0 = 0;
    for (int step = 0; step < 7; ++step) {
      auto g = ok_grad(step, comm.rank(), n);
      auto dg = device_copy(e, g);
      good = good && h.reduce(std::span<float>(g)) && d.reduce(dg.view());
      good = good && same_bits(g, host_copy(e, dg.cview())) && same_state(h, d, e);
      if (step == 0) theta0 = h.theta();
      moved = moved || (P > 1 && h.bounds()[1] != std::int64_t(n) / P);
    }
    good = good && (P == 1 || (moved && h.theta() != theta0));  // the regions and theta did change
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("OkTopK over the deferred space: NaN on one rank raises alike and changes nothing; skip_step skips alike; "
          "cancel then retry equals a clean run",
          "[space][oktopk]") {
  const int P = GENERATE(2, 3, 5);
  const std::size_t n = 900;
  CAPTURE(P);
  std::vector<int> ok(P, 0);
  std::vector<std::vector<float>> last(P);  // each rank's result of the last step
  run_threads(P, [&](ThreadComm& comm) {
    const oktopk_options o{.density = 0.04, .period = 2};
    OkTopK<DC> d{DC{comm}, o};
    OkTopK<DC> s{DC{comm}, {.density = 0.04, .period = 2, .on_nonfinite = nonfinite::skip_step}};
    OkTopK<ThreadComm> h{comm, o};  // the clean run
    const auto e = d.comm().exec();
    const auto es = s.comm().exec();
    bool good = true;
    auto step = [&](int t) {
      auto g = ok_grad(t, comm.rank(), n);
      auto dg = device_copy(e, g);
      good = good && h.reduce(std::span<float>(g)) && d.reduce(dg.view());
      good = good && same_bits(g, host_copy(e, dg.cview())) && same_state(h, d, e);
      last[static_cast<std::size_t>(comm.rank())] = g;
    };
    step(0);
    step(1);
    // NaN on the last rank: numeric_error on every rank; grad, residual, regions, theta, steps unchanged.
    {
      auto bad = ok_grad(50, comm.rank(), n);
      if (comm.rank() == P - 1) bad[17] = std::numeric_limits<float>::quiet_NaN();
      auto dbad = device_copy(e, bad);
      bool raised = false;
      try {
        d.reduce(dbad.view());
      } catch (const numeric_error&) {
        raised = true;
      }
      good = good && raised && same_bits(host_copy(e, dbad.cview()), bad) && same_state(h, d, e);
    }
    // A shorter, then a longer gradient on rank 1 (its residual has n values): that rank
    // flags its input rejected, and its header carries its length, so every rank raises
    // mismatch_error. The host run raises the same; nothing changes.
    for (const std::size_t odd : {n - 1, n + 1}) {
      auto kind = [&](auto& c, auto grad) {
        try {
          c.reduce(grad);
        } catch (const mismatch_error&) {
          return 1;
        } catch (const peer_failure&) {
          return 2;
        }
        return 0;
      };
      auto g = ok_grad(52, comm.rank(), comm.rank() == 1 ? odd : n), hg = g;
      auto dg = device_copy(e, g);
      const int a = kind(h, std::span<float>(hg)), b = kind(d, dg.view());
      good = good && a == 1 && a == b && same_bits(host_copy(e, dg.cview()), g) && same_bits(hg, g) &&
             same_state(h, d, e);
    }
    // skip_step: every rank skips; grad zeroed, the residual kept, the step counted.
    {
      auto g0 = device_copy(es, ok_grad(0, comm.rank(), n));
      good = good && s.reduce(g0.view());
      const auto res = host_copy(es, s.residual());
      auto bad = ok_grad(51, comm.rank(), n);
      if (comm.rank() == 0) bad[3] = std::numeric_limits<float>::infinity();
      auto dbad = device_copy(es, bad);
      good = good && !s.reduce(dbad.view()) && host_copy(es, dbad.cview()) == std::vector<float>(n, 0.0f);
      good = good && same_bits(host_copy(es, s.residual()), res) && s.steps() == 2 && s.skipped_steps() == 1;
    }
    // A started step cancelled, and a finished one cancelled: no trace.
    {
      auto x = device_copy(e, ok_grad(60, comm.rank(), n));
      d.start(x.view());
      d.cancel();
      auto y = device_copy(e, ok_grad(61, comm.rank(), n));
      d.start(y.view());
      good = good && d.finish();
      d.cancel();
      good = good && same_state(h, d, e);
    }
    step(2);  // a threshold step (period 2)
    step(3);
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
  for (int r = 1; r < P; ++r) CHECK(same_bits(last[static_cast<std::size_t>(r)], last[0]));  // the ranks agree
}

TEST_CASE("OkTopK over the deferred space allocates nothing after the first step; its bytes are the documented "
          "formula",
          "[space][oktopk][alloc]") {
  const int P = GENERATE(1, 2, 3, 5);
  const std::size_t n = 2000;
  CAPTURE(P);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    CountingComm<ThreadComm> counted{comm};
    OkTopK<DeferredComm<CountingComm<ThreadComm>>> d{DeferredComm{counted}, {.density = 0.02, .period = 3}};
    const auto e = d.comm().exec();
    const std::size_t k = d.k(n);
    bool good = true;
    std::vector<std::pair<const void*, std::size_t>> sig;
    for (int t = 0; t < 6; ++t) {
      const auto g = ok_grad(t, comm.rank(), n);
      // The formula (file comment of oktopk.hpp) from what the step will do: this rank's
      // local top-k of g + residual split by the regions, then every region's selection.
      auto acc = host_copy(e, d.residual());
      if (acc.empty()) acc.assign(n, 0.0f);
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] + g[i];
      std::vector<std::size_t> order(n);
      for (std::size_t i = 0; i < n; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return std::abs(acc[a]) > std::abs(acc[b]); });
      const std::vector<std::int64_t> bounds(d.bounds().begin(), d.bounds().end());
      auto region = [&](std::size_t i) {
        int j = 0;
        if (bounds.empty()) {
          while (std::int64_t(i) >= std::int64_t(n) * (j + 1) / P) ++j;
        } else {
          while (std::int64_t(i) >= bounds[std::size_t(j) + 1]) ++j;
        }
        return j;
      };
      std::vector<std::uint64_t> local(P, 0), sel(P, 0);
      for (std::size_t e2 = 0; e2 < k; ++e2) ++local[region(order[e2])];
      auto x = device_copy(e, g);
      const auto before = counted.stats();
      good = good && d.reduce(x.view());
      const auto sent = (counted.stats() - before).bytes_sent;
      const auto out = host_copy(e, x.cview());
      for (std::size_t i = 0; i < n; ++i)
        if (out[i] != 0.0f) ++sel[region(i)];
      std::uint64_t want = t % 3 == 0 ? std::uint64_t(P - 1) * 4 * k : 0;
      for (int j = 0; j < P; ++j)
        if (j != comm.rank()) want += 40 + 8 * local[j];
      for (int s = 0; s < P - 1; ++s) want += 8 + 8 * sel[((comm.rank() - s) % P + P) % P];
      good = good && sent == want;
      if (t == 1) sig = d.workspace_signature();
      if (t > 1) good = good && d.workspace_signature() == sig;
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}
