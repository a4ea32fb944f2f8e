// CastAllreduce (fp16/bf16 summed in the 16-bit type by the ring) and OkTopK over the
// deferred space (issue 18): DeferredComm<ThreadComm> against host_space, bit for bit
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

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "common/random.hpp"
#include "common/space_copies.hpp"

using namespace commpact;
using commpact_test::device_copy;
using commpact_test::host_copy;
using commpact_test::normal;
using commpact_test::same_bits;

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
    const auto w = wire::ring_allreduce(comm.rank(), P, n, 2);
    for (int s = 1; s < 4; ++s) {
      auto x = device_copy(e, cast_grad(s, comm.rank(), n));
      const auto before = counted.stats();
      d.reduce(x.view());
      const auto sent = counted.stats() - before;
      good = good && d.workspace_signature() == sig;
      good = good && sent.bytes_sent == w.bytes_sent && sent.messages_sent == w.messages_sent;
      good = good && sent.messages_sent == 2 * static_cast<std::uint64_t>(P - 1);
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}
