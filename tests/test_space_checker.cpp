// The deferred space as a device checker: each rule a GPU punishes without a word is
// broken here on purpose and must raise (or read poison), so removing a check fails a
// test. Then every compressor over the deferred space: start() only queues (nothing has
// run when it returns, and the host has not waited), and a communicator that withholds
// one rank's message makes every rank raise within its deadline plus a second.
#include <catch2/catch.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/compressors/cast_allreduce.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/compressors/majority.hpp>
#include <commpact/compress/compressors/oktopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/compress/codecs/per_tensor.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/step_status.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/kernels/deferred/ops.hpp>
#include <commpact/topology/ring.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/matchers.hpp"
#include "common/space_copies.hpp"

using namespace commpact;
using namespace commpact_test::deferred_twins;

namespace {
using DC = DeferredComm<ThreadComm>;
using ops_d = ops<deferred_space>;

deferred_span<const float> span_of(const deferred_space::buffer<float>& b) { return b.cview(); }

template <class T>
deferred_space::buffer<T> filled(const deferred_space::exec& e, std::size_t n, T x) {
  deferred_space::buffer<T> b;
  b.resize(n);
  ops_d::fill(e, b.view(), x);
  deferred_space::fence(e, no_deadline());
  return b;
}
}  // namespace

TEST_CASE("checker: a host copy read before its fence reads poison, never stale or final data", "[space][checker]") {
  auto e = deferred_space::make_exec();
  auto b = filled(e, 4, 7.0f);
  SECTION("floats read NaN") {
    std::vector<float> h(4, 1.0f);  // what a stale read would show
    ops_d::to_host(e, b.cview(), std::span<float>(h));
    for (float x : h) CHECK(std::isnan(x));
    deferred_space::fence(e, no_deadline());
    CHECK(h == std::vector<float>(4, 7.0f));
  }
  SECTION("a status word reads 'not fenced', and reading it raises") {
    detail::status_word<deferred_space> st;
    st.clear(e);
    st.fetch(e);
    CHECK_THROWS_AS(st.bits("test"), usage_error);
    deferred_space::fence(e, no_deadline());
    CHECK(st.bits("test") == 0u);  // after the fence: healthy
    // A set bit survives the fence as itself, and the not-fenced bit is never a kernel's.
    st.clear(e);
    ops_d::mean(e, b.view().first(1), 0, st.view());  // 7 / 0: Inf, so status_nonfinite
    st.fetch(e);
    CHECK_THROWS_AS(st.bits("test"), usage_error);
    deferred_space::fence(e, no_deadline());
    CHECK(st.bits("test") == status_nonfinite);
  }
  SECTION("integers and structs read all-ones bytes") {
    deferred_space::buffer<std::int64_t> w;
    w.resize(2);
    ops_d::fill(e, w.view(), std::int64_t{5});
    std::int64_t h[2] = {0, 0};
    ops_d::to_host(e, w.cview(), std::span<std::int64_t>(h));
    CHECK(h[0] == -1);
    CHECK((static_cast<std::uint32_t>(h[1]) & status_unfenced) != 0u);
    deferred_space::fence(e, no_deadline());
    CHECK((h[0] == 5 && h[1] == 5));
  }
}

TEST_CASE("checker: work on one executor that uses what another produced needs a join", "[space][checker]") {
  auto producer = deferred_space::make_exec();
  auto consumer = deferred_space::make_exec();
  auto a = filled(producer, 8, 0.0f);
  deferred_space::buffer<float> out;
  out.resize(8);
  ops_d::fill(producer, a.view(), 3.0f);  // queued on the producer, not run
  SECTION("without a join: usage_error, and nothing is queued") {
    CHECK_THROWS_AS(ops_d::copy(consumer, a.cview(), out.view()), usage_error);
    CHECK(consumer.pending() == 0);
    // A write that races a pending read is caught as well.
    ops_d::copy(producer, a.cview(), out.view());
    CHECK_THROWS_AS(ops_d::fill(consumer, a.view(), 1.0f), usage_error);
    deferred_space::fence(producer, no_deadline());
  }
  SECTION("two readers need no join") {
    ops_d::copy(producer, a.cview(), out.view());
    deferred_space::buffer<float> out2;
    out2.resize(8);
    deferred_space::fence(producer, no_deadline());
    ops_d::copy(producer, a.cview(), out.view());
    CHECK_NOTHROW(ops_d::copy(consumer, a.cview(), out2.view()));
    deferred_space::fence(producer, no_deadline());
    deferred_space::fence(consumer, no_deadline());
    CHECK(host_copy(consumer, out2.cview()) == std::vector<float>(8, 3.0f));
  }
  SECTION("with a join: the consumer's fence runs the producer's work first and sees its result") {
    deferred_space::wait(consumer, deferred_space::record(producer));
    ops_d::copy(consumer, a.cview(), out.view());
    deferred_space::fence(consumer, no_deadline());  // the producer was never fenced
    CHECK(producer.pending() == 0);
    CHECK(host_copy(consumer, out.cview()) == std::vector<float>(8, 3.0f));
  }
  SECTION("a join covers only the work recorded before it") {
    deferred_space::wait(consumer, deferred_space::record(producer));
    ops_d::fill(producer, a.view(), 4.0f);  // after the record: not joined
    CHECK_THROWS_AS(ops_d::copy(consumer, a.cview(), out.view()), usage_error);
    deferred_space::fence(producer, no_deadline());
    deferred_space::fence(consumer, no_deadline());
  }
}

TEST_CASE("checker: a buffer regrown or destroyed with work queued on it", "[space][checker]") {
  auto e = deferred_space::make_exec();
  SECTION("regrowing past its capacity raises and keeps the work") {
    deferred_space::buffer<float> b;
    b.resize(4);
    ops_d::fill(e, b.view(), 2.0f);
    CHECK_THROWS_AS(b.resize(b.capacity() + 1), usage_error);
    CHECK_THROWS_AS(b.reserve(b.capacity() * 4 + 64), usage_error);
    CHECK(b.size() == 4);
    deferred_space::fence(e, no_deadline());
    CHECK(host_copy(e, b.cview()) == std::vector<float>(4, 2.0f));
    b.resize(b.capacity() + 1);  // nothing queued: fine
    CHECK(b.size() == 5);
  }
  SECTION("copying raises while work is queued") {
    deferred_space::buffer<float> b;
    b.resize(4);
    ops_d::fill(e, b.view(), 2.0f);
    CHECK_THROWS_AS(deferred_space::buffer<float>(b), usage_error);
    deferred_space::fence(e, no_deadline());
  }
  SECTION("destroying makes the next fence raise and drops the work unrun") {
    std::vector<float> h(4, 5.0f);
    auto keep = filled(e, 4, 1.0f);
    {
      deferred_space::buffer<float> b;
      b.resize(4);
      ops_d::fill(e, b.view(), 9.0f);
      ops_d::copy(e, b.cview(), keep.view());  // would read freed memory on a GPU
    }
    CHECK_THROWS_AS(deferred_space::fence(e, no_deadline()), usage_error);
    CHECK(e.pending() == 0);
    CHECK(host_copy(e, keep.cview()) == std::vector<float>(4, 1.0f));  // the copy never ran
  }
  SECTION("growing within its capacity over elements queued work uses raises (they are poisoned now); over "
          "others it does not, nor does shrinking") {
    deferred_space::buffer<float> b;
    b.reserve(16);
    b.resize(8);
    ops_d::fill(e, b.view(), 3.0f);
    std::vector<float> h(8);
    ops_d::to_host(e, b.cview(), std::span<float>(h));
    CHECK_NOTHROW(b.resize(9));  // element 8: no queued work uses it
    CHECK_NOTHROW(b.resize(4));
    CHECK_THROWS_AS(b.resize(8), usage_error);  // regrowing over what the queued fill and copy use
    b.clear();
    CHECK_THROWS_AS(b.resize(1), usage_error);
    deferred_space::fence(e, no_deadline());
    CHECK(h == std::vector<float>(8, 3.0f));  // the queued read saw its data, not poison
    CHECK_NOTHROW(b.resize(8));
    ops_d::fill(e, b.view().first(2), 5.0f);
    CHECK_NOTHROW(b.resize(10));  // [8, 10): untouched by the queued fill
    deferred_space::fence(e, no_deadline());
    const auto got = host_copy(e, b.cview());
    CHECK((got[0] == 5.0f && got[1] == 5.0f && std::isnan(got[2]) && std::isnan(got[9])));  // cleared, then poisoned
  }
  SECTION("assigning over it raises at once, and leaves it as it was") {
    deferred_space::buffer<float> b, other;
    b.resize(4);
    other.resize(2);
    ops_d::fill(e, b.view(), 2.0f);
    CHECK_THROWS_AS(b = other, usage_error);
    CHECK(b.size() == 4);
    deferred_space::fence(e, no_deadline());
    CHECK(host_copy(e, b.cview()) == std::vector<float>(4, 2.0f));
  }
  SECTION("after a fence, destroying is fine") {
    {
      deferred_space::buffer<float> b;
      b.resize(4);
      ops_d::fill(e, b.view(), 9.0f);
      deferred_space::fence(e, no_deadline());
    }
    CHECK_NOTHROW(deferred_space::fence(e, no_deadline()));
  }
}

TEST_CASE("checker: work queued through a span of a buffer destroyed or reallocated before raises",
          "[space][checker]") {
  // No work is queued on the buffer when it goes, so its destructor has nothing to report:
  // the work comes after, through a span taken before (on a GPU, a kernel on freed memory).
  auto e = deferred_space::make_exec();
  auto keep = filled(e, 4, 1.0f);
  SECTION("destroyed: a write and a read through the old span raise, queueing nothing") {
    std::optional<deferred_space::buffer<float>> b;
    b.emplace();
    b->resize(64);
    const auto w = b->view();
    const auto r = b->cview();
    b.reset();
    CHECK_THROWS_MATCHES(ops_d::fill(e, w, 1.0f), usage_error,
                         commpact_test::MessageContains({"through a span taken before that buffer was destroyed"}));
    CHECK_THROWS_AS(ops_d::copy(e, r.first(4), keep.view()), usage_error);
    CHECK(e.pending() == 0);
    CHECK_NOTHROW(deferred_space::fence(e, no_deadline()));
    CHECK(host_copy(e, keep.cview()) == std::vector<float>(4, 1.0f));
  }
  SECTION("reallocated (grown past its capacity): the old span raises, a new one works") {
    deferred_space::buffer<float> b;
    b.resize(4);
    ops_d::fill(e, b.view(), 2.0f);
    deferred_space::fence(e, no_deadline());
    const auto old = b.view();
    b.resize(b.capacity() + 1);
    CHECK_THROWS_MATCHES(ops_d::fill(e, old, 3.0f), usage_error,
                         commpact_test::MessageContains({"reallocated (grown past its capacity)"}));
    ops_d::fill(e, b.view().first(4), 4.0f);
    deferred_space::fence(e, no_deadline());
    const auto got = host_copy(e, b.cview());
    CHECK((got[0] == 4.0f && got[3] == 4.0f && std::isnan(got[4])));  // the contents moved, then the new fill
  }
  SECTION("a gradient the user frees between start() and finish() (OkTopK fences inside start())") {
    std::vector<int> raised(2, 0);
    run_threads(2, [&](ThreadComm& tc) {
      DC comm{tc};
      auto x = comm.exec();
      OkTopK<DC> c{comm, {.density = 0.05}};
      std::vector<float> h(1003);
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = std::sin(1.3f * static_cast<float>(i) + 0.7f * tc.rank());
      std::optional<deferred_space::buffer<float>> g;
      g.emplace();
      copy_from_host<deferred_space>(x, std::span<const float>(h), *g);
      c.start(g->view());
      g.reset();  // every rank: finish() would write the mean into freed memory
      try {
        c.finish();
      } catch (const usage_error&) {
        raised[static_cast<std::size_t>(tc.rank())] = 1;
        c.cancel();
      }
    });
    CHECK(raised == std::vector<int>{1, 1});
  }
}

TEST_CASE("checker: work on disjoint parts of one buffer needs no join; overlapping parts do", "[space][checker]") {
  auto e1 = deferred_space::make_exec();
  auto e2 = deferred_space::make_exec();
  deferred_space::buffer<float> a;
  a.resize(8);
  ops_d::fill(e1, a.view().first(4), 1.0f);
  CHECK_NOTHROW(ops_d::fill(e2, a.view().subspan(4), 2.0f));          // another bucket of one gradient
  CHECK_THROWS_AS(ops_d::fill(e2, a.view().subspan(3, 2), 5.0f), usage_error);  // one element in common
  CHECK_THROWS_AS(ops_d::copy(e2, a.cview().first(1), a.view().subspan(7)), usage_error);  // reads e1's write
  deferred_space::fence(e1, no_deadline());
  deferred_space::fence(e2, no_deadline());
  CHECK(host_copy(e1, a.cview()) == std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2});
}

TEST_CASE("checker: pinned host memory is watched as device buffers are", "[space][checker]") {
  auto e = deferred_space::make_exec();
  auto b = filled(e, 4, 6.0f);
  SECTION("destroying it with a copy queued into it makes the next fence raise; the copy never runs") {
    {
      deferred_space::pinned<float> h;
      h.resize(4);
      ops_d::to_host(e, b.cview(), h.view());
    }  // on a GPU the copy would land in freed memory
    CHECK_THROWS_AS(deferred_space::fence(e, no_deadline()), usage_error);
    CHECK(e.pending() == 0);
  }
  SECTION("another executor reading it without a join raises; with one it reads the copy") {
    deferred_space::pinned<float> h;
    h.resize(4);
    ops_d::to_host(e, b.cview(), h.view());
    auto e2 = deferred_space::make_exec();
    deferred_space::buffer<float> c;
    c.resize(4);
    CHECK_THROWS_AS(ops_d::from_host(e2, std::span<const float>(h.view()), c.view()), usage_error);
    deferred_space::wait(e2, deferred_space::record(e));
    ops_d::from_host(e2, std::span<const float>(h.view()), c.view());
    deferred_space::fence(e2, no_deadline());
    CHECK(host_copy(e2, c.cview()) == std::vector<float>(4, 6.0f));
  }
  SECTION("growing it while a copy is queued into it raises") {
    deferred_space::pinned<float> h;
    h.resize(4);
    ops_d::to_host(e, b.cview(), h.view());
    CHECK_THROWS_AS(h.resize(5), usage_error);
    deferred_space::fence(e, no_deadline());
    CHECK(std::vector<float>(h.view().begin(), h.view().end()) == std::vector<float>(4, 6.0f));
  }
  SECTION("a host write to it while a copy is queued into it raises at the fence") {
    deferred_space::pinned<float> h;
    h.resize(4);
    deferred_space::pinned<std::uint32_t> w;
    w.resize(2);
    auto words = filled(e, 2, std::uint32_t{7});
    ops_d::to_host(e, b.cview(), h.view());
    ops_d::to_host(e, words.cview(), w.view());
    SECTION("a float") {
      h.view()[2] = 1.0f;  // on a GPU the copy overwrites it, or not
    }
    SECTION("a word") {
      w.view()[1] = 0;
    }
    CHECK_THROWS_WITH(deferred_space::fence(e, no_deadline()), Catch::Contains("the host wrote the pinned memory"));
  }
  SECTION("two copies into it before one fence: the later one wins, no false alarm") {
    deferred_space::pinned<float> h;
    h.resize(4);
    auto c = filled(e, 4, 9.0f);
    ops_d::to_host(e, b.cview(), h.view());
    ops_d::to_host(e, c.cview().first(2), h.view().first(2));
    deferred_space::fence(e, no_deadline());
    CHECK(std::vector<float>(h.view().begin(), h.view().end()) == std::vector<float>{9, 9, 6, 6});
  }
}

TEST_CASE("checker: a from_host source that changes before the fence raises there", "[space][checker]") {
  auto e = deferred_space::make_exec();
  deferred_space::buffer<float> d;
  d.resize(3);
  std::vector<float> src{1, 2, 3};
  ops_d::from_host(e, std::span<const float>(src), d.view());
  SECTION("changed: usage_error at the fence, the copy not made") {
    src[1] = 20;  // on a GPU the copy could read 2 or 20
    CHECK_THROWS_AS(deferred_space::fence(e, no_deadline()), usage_error);
  }
  SECTION("unchanged: copied") {
    deferred_space::fence(e, no_deadline());
    CHECK(host_copy(e, d.cview()) == src);
  }
}

TEST_CASE("checker: a to_host into pinned memory that a queued from_host reads is ordered after it",
          "[space][checker]") {
  // Legal on one GPU stream: the first copy reads the staging memory before the second
  // lands there. The second copy still poisons it at once.
  auto e = deferred_space::make_exec();
  deferred_space::pinned<float> h;
  h.resize(4);
  for (std::size_t i = 0; i < 4; ++i) h.view()[i] = static_cast<float>(i + 1);
  deferred_space::buffer<float> d;
  d.resize(4);
  auto b = filled(e, 4, 6.0f);
  ops_d::from_host(e, std::span<const float>(h.view()), d.view());
  SECTION("the first copy reads what the memory held, the second lands after it") {
    ops_d::to_host(e, b.cview(), h.view());
    CHECK(std::isnan(h.view()[0]));  // poisoned until the fence
    deferred_space::fence(e, no_deadline());
    CHECK(host_copy(e, d.cview()) == std::vector<float>{1, 2, 3, 4});
    CHECK(std::vector<float>(h.view().begin(), h.view().end()) == std::vector<float>(4, 6.0f));
  }
  SECTION("two later copies, one over part of it: no false alarm") {
    auto c = filled(e, 2, 9.0f);
    ops_d::to_host(e, c.cview(), h.view().subspan(1, 2));
    ops_d::to_host(e, b.cview(), h.view());
    deferred_space::fence(e, no_deadline());
    CHECK(host_copy(e, d.cview()) == std::vector<float>{1, 2, 3, 4});
    CHECK(std::vector<float>(h.view().begin(), h.view().end()) == std::vector<float>(4, 6.0f));
  }
  SECTION("the host changed the source before the later copy was queued: raises at that call") {
    h.view()[1] = 20;  // on a GPU the first copy could read 2 or 20
    CHECK_THROWS_WITH(ops_d::to_host(e, b.cview(), h.view()), Catch::Contains("changed the source of a queued from_host"));
    CHECK_THROWS_AS(deferred_space::fence(e, no_deadline()), usage_error);
  }
  SECTION("the host changed bytes the later copy does not cover: raises at the fence") {
    ops_d::to_host(e, b.cview().first(2), h.view().first(2));
    h.view()[3] = 40;
    CHECK_THROWS_WITH(deferred_space::fence(e, no_deadline()), Catch::Contains("changed between the call and the fence"));
  }
  SECTION("the host wrote what the later copy lands in: that copy raises at the fence") {
    ops_d::to_host(e, b.cview(), h.view());
    h.view()[0] = 1;
    CHECK_THROWS_WITH(deferred_space::fence(e, no_deadline()), Catch::Contains("the host wrote the pinned memory"));
  }
}

TEST_CASE("checker: a to_host into host memory that a queued from_host reads is ordered after it (not pinned)",
          "[space][checker]") {
  auto e = deferred_space::make_exec();
  std::vector<float> h{1, 2, 3, 4};
  deferred_space::buffer<float> d;
  d.resize(4);
  auto b = filled(e, 4, 6.0f);
  ops_d::from_host(e, std::span<const float>(h), d.view());
  SECTION("in order") {
    ops_d::to_host(e, b.cview(), std::span<float>(h));
    deferred_space::fence(e, no_deadline());
    CHECK(host_copy(e, d.cview()) == std::vector<float>{1, 2, 3, 4});
    CHECK(h == std::vector<float>(4, 6.0f));
  }
  SECTION("the host changed the source first: raises at the later copy's call") {
    h[0] = 10;
    CHECK_THROWS_AS(ops_d::to_host(e, b.cview(), std::span<float>(h)), usage_error);
    CHECK_THROWS_AS(deferred_space::fence(e, no_deadline()), usage_error);
  }
}

TEST_CASE("checker: a status word cleared for a new step reads 'not fenced' until that step's fetch is fenced",
          "[space][checker]") {
  auto e = deferred_space::make_exec();
  detail::status_word<deferred_space> st;
  CHECK_THROWS_AS(st.bits("test"), usage_error);  // never fetched
  st.clear(e);
  st.fetch(e);
  deferred_space::fence(e, no_deadline());
  CHECK(st.bits("test") == 0u);
  st.clear(e);  // the next step: the last step's healthy word is not this step's
  CHECK_THROWS_AS(st.bits("test"), usage_error);
  deferred_space::fence(e, no_deadline());
  CHECK_THROWS_AS(st.bits("test"), usage_error);  // fenced, but never fetched
  st.fetch(e);
  deferred_space::fence(e, no_deadline());
  CHECK(st.bits("test") == 0u);
}

namespace {

// Runs a second step of `c` (the first agreed on sizes) and reports whether start()
// returned with its work queued and unrun and the host never waiting in it.
template <class C>
struct start_probe {
  bool queued_only = false;
  std::uint64_t fences_in_start = 0, fences_in_finish = 0;
};

template <class C, class Grad>
start_probe<C> probe_start(C& c, const deferred_space::exec& e, Grad grad) {
  start_probe<C> p;
  const auto fences = e.q->fences, ran = e.q->ran;
  c.start(grad);
  p.fences_in_start = e.q->fences - fences;
  p.queued_only = e.q->ran == ran && e.pending() > 0;
  const auto before_finish = e.q->fences;
  c.finish();
  p.fences_in_finish = e.q->fences - before_finish;
  c.commit();
  return p;
}

//! On P ranks: a first step of make(comm), then a probed second step; pass(probe) on every rank.
template <class Make, class Pass>
void check_second_step(int P, std::size_t n, Make make, Pass pass) {
  std::vector<int> ok(static_cast<std::size_t>(P), 0);
  run_threads(P, [&](ThreadComm& comm) {
    DC dc{comm};
    auto c = make(dc);
    const auto e = dc.exec();
    auto g = device_copy(e, normal(100 + comm.rank(), n));
    c.reduce(g.view());  // the first step agrees on sizes (a control-plane wait)
    auto g2 = device_copy(e, normal(200 + comm.rank(), n));
    ok[static_cast<std::size_t>(comm.rank())] = pass(probe_start(c, e, g2.view())) ? 1 : 0;
  });
  for (int r : ok) CHECK(r == 1);
}

template <class Make>
void check_start_queues(int P, std::size_t n, Make make, std::uint64_t allowed_fences = 0) {
  check_second_step(P, n, make, [&](const auto& p) {
    return allowed_fences == 0 ? p.queued_only && p.fences_in_start == 0 : p.fences_in_start <= allowed_fences;
  });
}

const tensor_layout kLayout = {{24, 18}, {18}, {30, 40}, {9}};
constexpr std::size_t kN = 24 * 18 + 18 + 1200 + 9;

}  // namespace

TEST_CASE("every compressor over the deferred space: start() only queues", "[space][checker][async]") {
  const int P = GENERATE(2, 3);
  CAPTURE(P);
  SECTION("Dense") {
    check_start_queues(P, 300, [](DC c) { return Dense<DC>{c}; });
  }
  SECTION("gTopK") {
    check_start_queues(P, 600, [](DC c) { return gTopK<TreeComm<DC>>{c, {.density = 0.05}}; });
  }
  SECTION("TopK") {
    check_start_queues(P, 600, [](DC c) { return TopK<DC>{c, {.density = 0.05}}; });
  }
  SECTION("a codec (QSGD) through CodecCompressor") {
    check_start_queues(P, 500, [](DC c) {
      return CodecCompressor<qsgd_codec, Allgather<DC>>{c, qsgd_codec{}};
    });
  }
  SECTION("LinearCompressor<randomk_codec>") {
    check_start_queues(P, 500, [](DC c) { return LinearCompressor<randomk_codec, DC>{c, randomk_codec{0.05, 9}}; });
  }
  SECTION("MajorityVote") {
    check_start_queues(P, 500, [](DC c) { return MajorityVote<DC>{c, {}}; });
  }
  SECTION("Fp16Allreduce") {
    check_start_queues(P, 500, [](DC c) { return Fp16Allreduce<DC>{c}; });
  }
  SECTION("PowerCompressor") {
    check_start_queues(P, kN, [](DC c) { return PowerCompressor<2, deferred_space>{c, kLayout}; });
  }
  SECTION("OkTopK: its regions' sizes are read on the host mid-step, in two documented waits") {
    check_start_queues(P, 800, [](DC c) { return OkTopK<DC>{c, {.density = 0.02}}; }, 2);
  }
}

TEST_CASE("GossipMixer::start() only queues the round (D-PSGD, CHOCO, PowerGossip); finish() fences once and "
          "equals mix()",
          "[space][checker][async]") {
  const int P = GENERATE(2, 3);
  CAPTURE(P);
  auto check = [&](auto make) {
    std::vector<int> ok(static_cast<std::size_t>(P), 0);
    run_threads(P, [&](ThreadComm& comm) {
      DC dc{comm}, dc2{comm};
      auto split = make(dc);
      auto whole = make(dc2);
      const auto e = dc.exec();
      auto x = device_copy(e, normal(300 + comm.rank(), kN));
      auto y = device_copy(e, normal(300 + comm.rank(), kN));
      bool good = true;
      for (int round = 0; round < 3; ++round) {
        const auto fences = e.q->fences, ran = e.q->ran;
        split.start(x.view());
        // After the first round (its one-time setup check is a host wait), start() only queues.
        if (round > 0) good = good && e.q->fences == fences && e.q->ran == ran && e.pending() > 0;
        // (Catch's assertions are not thread-safe: each rank keeps its verdict in `good`.)
        bool refused = false;  // one round in flight at a time
        try {
          split.start(x.view());
        } catch (const usage_error&) {
          refused = true;
        }
        const auto before_finish = e.q->fences;
        const bool mixed = split.finish();
        good = good && refused && mixed && e.q->fences - before_finish == 1;
        good = good && whole.mix(y.view());
        good = good && same_bits(host_copy(e, x.cview()), host_copy(dc2.exec(), y.cview()));
      }
      bool refused = false;  // nothing in flight
      try {
        split.finish();
      } catch (const usage_error&) {
        refused = true;
      }
      ok[static_cast<std::size_t>(comm.rank())] = good && refused ? 1 : 0;
    });
    for (int r : ok) CHECK(r == 1);
  };
  SECTION("D-PSGD") { check([&](DC c) { return GossipMixer<Ring, exact_mixing, DC>{c, Ring(P), kLayout}; }); }
  SECTION("CHOCO (top-k)") {
    check([&](DC c) {
      return GossipMixer<Ring, choco_gossip<topk_codec>, DC>{c, Ring(P), kLayout,
                                                             choco_gossip<topk_codec>{topk_codec{0.1}, 0.5f}};
    });
  }
  SECTION("PowerGossip") {
    check([&](DC c) { return GossipMixer<Ring, power_gossip<1>, DC>{c, Ring(P), kLayout}; });
  }
}

TEST_CASE("the compressors whose finish() may run a step later: start() queues the whole step, finish() fences once",
          "[space][checker][async]") {
  // finish() may then run a step later (commpact_hooks' CUDA hooks): everything that writes
  // grad is queued by start(), and finish() only waits and reads the status.
  const int P = GENERATE(2, 3);
  CAPTURE(P);
  auto once = [&](std::size_t n, auto make) {
    check_second_step(P, n, make, [](const auto& p) {
      return p.queued_only && p.fences_in_start == 0 && p.fences_in_finish == 1;
    });
  };
  SECTION("gTopK") { once(600, [](DC c) { return gTopK<TreeComm<DC>>{c, {.density = 0.05}}; }); }
  SECTION("TopK") { once(600, [](DC c) { return TopK<DC>{c, {.density = 0.05}}; }); }
  SECTION("QSGD through CodecCompressor") {
    once(500, [](DC c) { return CodecCompressor<qsgd_codec, Allgather<DC>>{c, qsgd_codec{}}; });
  }
  SECTION("MajorityVote (Signum)") { once(500, [](DC c) { return MajorityVote<DC>{c, {.momentum = 0.9f}}; }); }
  SECTION("EF-SignSGD per row (per_tensor<sign_codec>) through CodecCompressor") {
    once(kN, [](DC c) {
      return CodecCompressor<per_tensor<sign_codec>, Allgather<DC>>{c, per_tensor<sign_codec>{split_rows(kLayout)}};
    });
  }
}

namespace {
// A ThreadComm whose rank `victim` stops delivering its point-to-point messages once armed.
struct withholding_comm : ThreadComm {
  withholding_comm(ThreadComm c, int victim, std::shared_ptr<std::atomic<bool>> armed)
      : ThreadComm(c), victim(victim), armed(std::move(armed)) {}
  void send(int peer, std::span<const std::byte> msg) {
    if (rank() == victim && armed->load()) return;  // withheld: never arrives
    ThreadComm::send(peer, msg);
  }
  int victim;
  std::shared_ptr<std::atomic<bool>> armed;
};
}  // namespace

TEST_CASE("a withheld message: every rank raises within the deadline plus a second", "[space][checker][deadline]") {
  // Fp16Allreduce's ring needs every rank's message: one withheld message stalls every
  // rank, and each must raise (timeout_error, or peer_failure once a peer timed out)
  // within the communicator's timeout plus a second, never hang.
  const int P = 3;
  const auto timeout = std::chrono::milliseconds(700);
  std::vector<int> raised(P, 0);
  std::vector<double> waited(P, 0.0);
  auto armed = std::make_shared<std::atomic<bool>>(false);
  run_threads(
      P,
      [&](ThreadComm& comm) {
        using W = DeferredComm<withholding_comm>;
        W dc{withholding_comm{comm, 0, armed}};
        Fp16Allreduce<W> c{dc};
        const auto e = dc.exec();
        auto g = device_copy(e, normal(10 + comm.rank(), 400));
        c.reduce(g.view());
        comm.barrier();
        armed->store(true);
        comm.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        try {
          c.start(g.view());
          c.finish();
          c.commit();
        } catch (const comm_error&) {
          raised[static_cast<std::size_t>(comm.rank())] = 1;
          c.cancel();
        }
        waited[static_cast<std::size_t>(comm.rank())] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      thread_options{.timeout = timeout});
  for (int r = 0; r < P; ++r) {
    CAPTURE(r, waited[static_cast<std::size_t>(r)]);
    CHECK(raised[static_cast<std::size_t>(r)] == 1);
    CHECK(waited[static_cast<std::size_t>(r)] < std::chrono::duration<double>(timeout).count() + 1.0);
  }
}

TEST_CASE("a step joins its producer and its consumer through events, with no host wait", "[space][checker][join]") {
  // The framework's backward writes the gradient on its own executor (stream); the step
  // must wait for it, and the optimiser (a third executor) must wait for the step.
  const int P = 2;
  const std::size_t n = 256;
  const bool joined = GENERATE(false, true);
  CAPTURE(joined);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    DC dc{comm};
    Dense<DC> d{dc};
    auto backward = deferred_space::make_exec();
    auto optimiser = deferred_space::make_exec();
    const auto e = dc.exec();
    auto g = device_copy(e, normal(comm.rank(), n));
    d.reduce(g.view());  // agreement step
    deferred_space::buffer<float> params;
    params.resize(n);
    ops_d::fill(e, params.view(), 0.0f);
    deferred_space::fence(e, no_deadline());
    bool good = true;
    const float mine = static_cast<float>(comm.rank() + 1);
    if (!joined) {  // the checker refuses both hand-overs
      ops_d::fill(backward, g.view(), mine);  // backward's write, not yet run
      try {
        d.start(g.view());
        good = false;  // the step read a gradient another executor is still writing
      } catch (const usage_error&) {
      }
      deferred_space::fence(backward, no_deadline());
      comm.barrier();
      d.start(g.view());
      good = good && e.pending() > 0;
      try {
        ops_d::sub(optimiser, params.view(), span_of(g));
        good = false;  // the optimiser read a gradient the step is still writing
      } catch (const usage_error&) {
      }
      good = good && d.finish();
      d.commit();
    } else {  // with joins: one fence per executor, no host wait between them
      ops_d::fill(backward, g.view(), mine);
      comm_wait(dc, deferred_space::record(backward));
      const auto fences = e.q->fences;
      d.start(g.view());  // queued behind backward's write
      good = good && e.q->fences == fences && backward.pending() == 1;
      deferred_space::wait(optimiser, comm_record(dc));
      ops_d::sub(optimiser, params.view(), span_of(g));  // params = -mean
      good = good && d.finish();
      d.commit();
      const auto h = host_copy(optimiser, params.cview());
      const float mean = (1.0f + 2.0f) / 2.0f;
      for (float x : h) good = good && x == -mean;
    }
    ok[static_cast<std::size_t>(comm.rank())] = good ? 1 : 0;
  });
  for (int r : ok) CHECK(r == 1);
}
