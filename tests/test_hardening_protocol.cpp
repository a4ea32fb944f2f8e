// The step protocol of every compressor the library ships, checked over one type list
// (add a new compressor to `every_compressor` (tests/common/every_compressor.hpp) and it is held to the same rules):
// - ranks that disagree on commit and cancel, or a rank that retries a step the others
//   kept, raise the same error class on every rank at the next step;
// - a step that raises changes no state, and the retry equals a twin that never saw it;
// - Bucketed refuses a second start() and commit() without finish(), and recovers by
//   cancel() after a failed finish();
// - a compressor with a step in flight refuses to be moved;
// - DataParallel's backward_scope ends the buckets in flight before the gradient it
//   names is destroyed, when an exception unwinds the scope;
// - on the deferred space, an error in the update's queued work raises device_error in
//   the same step (wait_for_update), before the step is kept.
#include <catch2/catch.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/randomk.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/compressors/bucketed.hpp>
#include <commpact/compress/compressors/cast_allreduce.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/compressors/majority.hpp>
#include <commpact/compress/compressors/oktopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/compress/transaction.hpp>
#include <commpact/kernels/deferred/ops.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "common/every_compressor.hpp"
#include "common/random.hpp"
#include "common/space_copies.hpp"
#include "common/state_blobs.hpp"

using namespace commpact;
using commpact_test::normal;
using commpact_test::saved;

namespace {
const tensor_layout kLayout = {{12, 10}, {10}, {6, 8}, {3}};
const std::vector<std::size_t> kLayers = {120, 10, 48, 3};
constexpr std::size_t kN = 120 + 10 + 48 + 3;
using TC = ThreadComm;
using DC = DeferredComm<ThreadComm>;

//! Builds compressor C on comm (one place that knows every constructor).
template <class C>
struct maker {
  static C make(TC& comm) { return C{comm}; }
};
template <>
struct maker<TopK<TC>> {
  static TopK<TC> make(TC& comm) { return TopK<TC>{comm, {.density = 0.1}}; }
};
template <>
struct maker<gTopK<TreeComm<TC>>> {
  static gTopK<TreeComm<TC>> make(TC& comm) { return gTopK<TreeComm<TC>>{comm, {.density = 0.1}}; }
};
template <>
struct maker<PowerCompressor<2>> {
  static PowerCompressor<2> make(TC& comm) { return PowerCompressor<2>{comm, kLayout}; }
};
template <>
struct maker<LinearCompressor<randomk_codec, TC>> {
  static LinearCompressor<randomk_codec, TC> make(TC& comm) {
    return LinearCompressor<randomk_codec, TC>{comm, randomk_codec{0.2, 7}};
  }
};
template <>
struct maker<OkTopK<TC>> {
  static OkTopK<TC> make(TC& comm) { return OkTopK<TC>{comm, {.density = 0.1}}; }
};
template <class C>
struct maker<Bucketed<C>> {
  static Bucketed<C> make(TC& comm) {
    return Bucketed<C>{kLayers, [&](const bucket_info&) { return maker<C>::make(comm); }, {.cap_bytes = 200}};
  }
};
template <>
struct maker<Dense<DC>> {
  static Dense<DC> make(TC& comm) { return Dense<DC>{DC{comm}}; }
};
template <>
struct maker<TopK<DC>> {
  static TopK<DC> make(TC& comm) { return TopK<DC>{DC{comm}, {.density = 0.1}}; }
};
template <>
struct maker<PowerCompressor<2, deferred_space>> {
  static PowerCompressor<2, deferred_space> make(TC& comm) { return PowerCompressor<2, deferred_space>{DC{comm}, kLayout}; }
};
template <>
struct maker<gTopK<TreeComm<DC>>> {
  static gTopK<TreeComm<DC>> make(TC& comm) { return gTopK<TreeComm<DC>>{DC{comm}, {.density = 0.1}}; }
};
template <>
struct maker<MajorityVote<DC>> {
  static MajorityVote<DC> make(TC& comm) { return MajorityVote<DC>{DC{comm}}; }
};
template <>
struct maker<OkTopK<DC>> {
  static OkTopK<DC> make(TC& comm) { return OkTopK<DC>{DC{comm}, {.density = 0.1}}; }
};
template <>
struct maker<CodecCompressor<qsgd_codec, Allgather<DC>>> {
  static CodecCompressor<qsgd_codec, Allgather<DC>> make(TC& comm) {
    return CodecCompressor<qsgd_codec, Allgather<DC>>{DC{comm}};
  }
};
template <>
struct maker<Fp16Allreduce<DC>> {
  static Fp16Allreduce<DC> make(TC& comm) { return Fp16Allreduce<DC>{DC{comm}}; }
};
template <>
struct maker<LinearCompressor<randomk_codec, DC>> {
  static LinearCompressor<randomk_codec, DC> make(TC& comm) {
    return LinearCompressor<randomk_codec, DC>{DC{comm}, randomk_codec{0.2, 7}};
  }
};

using every_compressor = commpact_test::every_compressor<TC, DC>;

//! A gradient in C's space: a host vector, or a deferred buffer and its span.
template <class C, bool = std::is_same_v<space_of_t<C>, deferred_space>>
struct grad_of {
  std::vector<float> v;
  grad_of(const C&, std::vector<float> h) : v(std::move(h)) {}
  std::span<float> view() { return std::span<float>(v); }
  std::vector<float> host(const C&) const { return v; }
};
template <class C>
struct grad_of<C, true> {
  deferred_space::buffer<float> b;
  grad_of(C& c, const std::vector<float>& h) : b(commpact_test::device_copy(comm_exec(c.comm()), h)) {}
  deferred_span<float> view() { return b.view(); }
  std::vector<float> host(C& c) const { return commpact_test::host_copy(comm_exec(c.comm()), b.cview()); }
};

template <class C>
std::vector<float> input(int rank, int step) {
  return normal(1000 * step + rank, kN);
}

//! The dynamic class of the commpact::error `f` raises, or "none".
template <class F>
std::string raised_class(F&& f) {
  try {
    f();
  } catch (const commpact::error& e) {
    return typeid(e).name();
  }
  return "none";
}
}  // namespace

TEMPLATE_LIST_TEST_CASE("ranks out of step (commit on some, cancel on one, or a retry there) raise alike at the "
                        "next step",
                        "[protocol][hardening]", every_compressor) {
  const int P = 3;
  // 0: rank 0 cancels a step the others commit; 1: rank 0's update raised, so it
  // cancels and retries the same step while the others go on with the next.
  const int scenario = GENERATE(0, 1);
  CAPTURE(scenario);
  std::vector<std::string> cls(P);
  run_threads(P, [&](TC& comm) {
    const int r = comm.rank();
    auto c = maker<TestType>::make(comm);
    grad_of<TestType> g0(c, input<TestType>(r, 0)), g1(c, input<TestType>(r, 1));
    c.reduce(g0.view());
    pending_step<TestType> tx;
    tx.run(c, g1.view());
    if (r == 0) tx.cancel(c);
    else tx.commit(c);
    grad_of<TestType> g2(c, input<TestType>(r, r == 0 && scenario == 1 ? 1 : 2));
    cls[r] = raised_class([&] { c.reduce(g2.view()); });
  });
  INFO("rank 0 raised " << cls[0]);
  CHECK(cls[0] == typeid(mismatch_error).name());
  for (int r = 1; r < P; ++r) CHECK(cls[r] == cls[0]);
}

TEMPLATE_LIST_TEST_CASE("one rank loading an earlier checkpoint raises mismatch_error alike at the next step, not at "
                        "the deadline",
                        "[protocol][hardening]", every_compressor) {
  // Rank 0 alone goes back two steps (load_state of its state after step 1) while the
  // others go on: every rank must see ranks out of step, not wait for a collective that
  // only one rank called (a re-agreement after load_state, say) until the deadline.
  const int P = 3;
  std::vector<std::string> cls(P);
  const auto t0 = std::chrono::steady_clock::now();
  run_threads(
      P,
      [&](TC& comm) {
        const int r = comm.rank();
        auto c = maker<TestType>::make(comm);
        grad_of<TestType> g0(c, input<TestType>(r, 0)), g1(c, input<TestType>(r, 1)), g2(c, input<TestType>(r, 2));
        c.reduce(g0.view());
        const auto earlier = saved(c);
        c.reduce(g1.view());
        c.reduce(g2.view());
        if (r == 0) c.load_state(earlier);
        grad_of<TestType> g3(c, input<TestType>(r, 3));
        cls[r] = raised_class([&] { c.reduce(g3.view()); });
      },
      thread_options{std::chrono::seconds(20)});
  const auto waited = std::chrono::steady_clock::now() - t0;
  INFO("rank 0 raised " << cls[0]);
  CHECK(cls[0] == typeid(mismatch_error).name());
  for (int r = 1; r < P; ++r) CHECK(cls[r] == cls[0]);
  CHECK(waited < std::chrono::seconds(10));
}

TEMPLATE_LIST_TEST_CASE("a step that raises changes no state; the retry equals a twin that never saw it",
                        "[protocol][hardening]", every_compressor) {
  const int P = 3;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](TC& comm) {
    const int r = comm.rank();
    auto c = maker<TestType>::make(comm);
    auto twin = maker<TestType>::make(comm);
    bool good = true;
    for (int t = 0; t < 4; ++t) {
      if (t == 2) {  // rank 1's gradient holds a NaN: numeric_error on every rank
        auto bad = input<TestType>(r, t);
        if (r == 1) bad[17] = std::numeric_limits<float>::quiet_NaN();
        grad_of<TestType> gb(c, bad);
        const auto before = saved(c);
        const auto cl = raised_class([&] { c.reduce(gb.view()); });
        good = good && cl == typeid(numeric_error).name() && saved(c) == before;
      }
      grad_of<TestType> g(c, input<TestType>(r, t)), h(twin, input<TestType>(r, t));
      c.reduce(g.view());
      twin.reduce(h.view());
      good = good && commpact_test::same_bits(g.host(c), h.host(twin)) && saved(c) == saved(twin);
    }
    ok[r] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

namespace {
struct backward_failed : std::runtime_error {
  backward_failed() : std::runtime_error("the user's backward failed") {}
};
void sgd(std::span<float> p, std::span<const float> g, double lr) {
  for (std::size_t i = 0; i < p.size(); ++i) p[i] -= static_cast<float>(lr) * g[i];
}
}  // namespace

TEST_CASE("Bucketed: a second start() and commit() without finish() are refused; cancel() recovers a failed finish()",
          "[protocol][hardening][bucketed]") {
  const int P = 3;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](TC& comm) {
    const int r = comm.rank();
    using B = Bucketed<TopK<TC>>;
    auto b = maker<B>::make(comm), twin = maker<B>::make(comm);
    bool good = true;
    auto refused = [&](auto&& f) { return raised_class(f) == typeid(invalid_argument).name(); };
    // commit() with no step, and with a step started but not finished.
    good = good && refused([&] { b.commit(); });
    auto g = input<B>(r, 0), h = g;
    b.start(std::span<float>(g));
    good = good && refused([&] { b.commit(); });
    // A second start() is refused and leaves the first step to finish and commit.
    auto g2 = input<B>(r, 9);
    good = good && refused([&] { b.start(std::span<float>(g2)); });
    good = good && b.finish();
    b.commit();
    twin.reduce(std::span<float>(h));
    good = good && g == h && saved(b) == saved(twin);
    // A finish() that raises (a NaN on rank 1), then cancel(): the next steps equal the twin's.
    auto bad = input<B>(r, 1);
    if (r == 1) bad[3] = std::numeric_limits<float>::quiet_NaN();
    b.start(std::span<float>(bad));
    good = good && raised_class([&] { b.finish(); }) == typeid(numeric_error).name();
    b.cancel();
    good = good && refused([&] { b.commit(); });
    for (int t = 1; t < 4; ++t) {
      auto x = input<B>(r, t), y = x;
      b.reduce(std::span<float>(x));
      twin.reduce(std::span<float>(y));
      good = good && x == y && saved(b) == saved(twin);
    }
    ok[r] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("a compressor whose step is started refuses to be moved; after finish() it moves", "[protocol][hardening]") {
  const int P = 2;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](TC& comm) {
    auto d = maker<Dense<DC>>::make(comm);
    grad_of<Dense<DC>> g(d, input<Dense<DC>>(comm.rank(), 0));
    d.start(g.view());  // the allreduce is queued and refers to d's communicator
    bool good = raised_class([&] { Dense<DC> m(std::move(d)); }) == typeid(usage_error).name();
    good = good && d.finish();  // d still holds its step
    d.commit();
    Dense<DC> moved(std::move(d));
    grad_of<Dense<DC>> g1(moved, input<Dense<DC>>(comm.rank(), 1));
    good = good && moved.reduce(g1.view()) && moved.steps() == 2;
    // Bucketed: buckets in flight on the worker refer to the object.
    using B = Bucketed<Dense<TC>>;
    auto b = maker<B>::make(comm);
    auto x0 = input<B>(comm.rank(), 1);
    good = good && b.reduce(std::span<float>(x0));  // buckets start during backward from the second step on
    auto x = input<B>(comm.rank(), 2);
    b.begin(std::span<float>(x));
    for (std::size_t l = kLayers.size(); l-- > 1;) b.ready(l);
    good = good && raised_class([&] { B m(std::move(b)); }) == typeid(usage_error).name();
    good = good && b.reduce(std::span<float>(x));
    B b2(std::move(b));
    good = good && b2.reduce(std::span<float>(x));
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("backward_scope: an exception that unwinds the gradient ends the buckets in flight first",
          "[protocol][hardening][train]") {
  const int P = 3;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](TC& comm) {
    const int r = comm.rank();
    using B = Bucketed<Dense<TC>>;
    DataParallel dp{maker<B>::make(comm), EveryStep{}, 5}, twin{maker<B>::make(comm), EveryStep{}, 5};
    std::vector<float> p(kN, 1.0f), q = p;
    {  // a first step: buckets start during backward from the second step on
      std::vector<float> g = input<B>(r, 5), h = g;
      dp.step(std::span<float>(p), std::span<float>(g), 0.1, sgd);
      twin.step(std::span<float>(q), std::span<float>(h), 0.1, sgd);
    }
    try {
      std::vector<float> g = input<B>(r, 0);  // declared after the driver: destroyed first
      backward_scope scope{dp, std::span<float>(g), 0.1};
      for (std::size_t l = kLayers.size(); l-- > 1;) dp.grad_ready(l);  // buckets start on the worker
      throw backward_failed{};
    } catch (const backward_failed&) {
    }
    bool good = true;
    for (int t = 0; t < 4; ++t) {
      std::vector<float> g = input<B>(r, t), h = g;
      {
        backward_scope scope{dp, std::span<float>(g), 0.1};
        for (std::size_t l = kLayers.size(); l-- > 0;) dp.grad_ready(l);
        dp.step(std::span<float>(p), std::span<float>(g), 0.1, sgd);
      }
      twin.step(std::span<float>(q), std::span<float>(h), 0.1, sgd);
      good = good && p == q;
    }
    ok[r] = good && dp.steps() == 5;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("deferred step: an error in the update's queued work raises device_error in that step; the retry equals a "
          "twin",
          "[protocol][hardening][deferred]") {
  const int P = 3;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](TC& comm) {
    const int r = comm.rank();
    using C = TopK<DC>;
    DataParallel dp{maker<C>::make(comm), EveryStep{}, 4, {.wait_for_update = true}};
    DataParallel twin{maker<C>::make(comm), EveryStep{}, 4, {.wait_for_update = true}};
    const auto e = comm_exec(dp.comm()), et = comm_exec(twin.comm());
    BasicSgd<deferred_space> sgd{kN, {}, e}, sgd_twin{kN, {}, et};
    bool fail = false;
    auto update = [&](deferred_span<float> x, deferred_span<const float> g, double lr) {
      // The kernel fails before it writes anything: its error shows at the fence.
      if (fail) e.enqueue([] { throw std::runtime_error("the update's kernel failed"); });
      sgd(x, g, lr);
    };
    auto update_twin = [&](deferred_span<float> x, deferred_span<const float> g, double lr) { sgd_twin(x, g, lr); };
    auto p = commpact_test::device_copy(e, std::vector<float>(kN, 1.0f));
    auto q = commpact_test::device_copy(et, std::vector<float>(kN, 1.0f));
    bool good = true;
    for (int t = 0; t < 4; ++t) {
      const auto host_g = input<C>(r, t);
      if (t == 2) {
        auto g = commpact_test::device_copy(e, host_g);
        const auto before = saved(dp);
        fail = true;
        const auto cl = raised_class([&] { dp.step(p.view(), g.view(), 0.1, update); });
        fail = false;
        good = good && cl == typeid(device_error).name() && saved(dp) == before && dp.steps() == 2;
      }
      auto g = commpact_test::device_copy(e, host_g), h = commpact_test::device_copy(et, host_g);
      dp.step(p.view(), g.view(), 0.1, update);
      twin.step(q.view(), h.view(), 0.1, update_twin);
      good = good && commpact_test::same_bits(commpact_test::host_copy(e, p.cview()), commpact_test::host_copy(et, q.cview())) &&
             saved(dp) == saved(twin);
    }
    ok[r] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

// gTopK carries its step count in the frames' flags (sparse_wire::step_flag). Two objects
// per rank, one kept 8, 16 or 48 steps ahead; rank 0 steps the one ahead, the others the
// one behind: a difference not a multiple of 16 raises at once, any other within 16 steps,
// the same class on every rank at every step.
TEST_CASE("gTopK: ranks whose step counts differ by a multiple of 8 raise mismatch_error alike",
          "[protocol][hardening][gtopk]") {
  const int P = 3;
  const int diff = GENERATE(8, 16, 48);
  CAPTURE(diff);
  std::vector<std::vector<std::string>> cls(P);
  run_threads(P, [&](TC& comm) {
    const int r = comm.rank();
    auto ahead = maker<gTopK<TreeComm<TC>>>::make(comm);
    auto behind = maker<gTopK<TreeComm<TC>>>::make(comm);
    for (int t = 0; t < diff + 1; ++t) {
      std::vector<float> g = input<void>(r, t);
      ahead.reduce(std::span<float>(g));
    }
    std::vector<float> g0 = input<void>(r, 0);
    behind.reduce(std::span<float>(g0));
    if (ahead.steps() != behind.steps() + diff) cls[r].push_back("setup failed");
    auto& mine = r == 0 ? ahead : behind;
    for (int t = 0; t < 16; ++t) {
      std::vector<float> g = input<void>(r, 100 + t);
      cls[r].push_back(raised_class([&] { mine.reduce(std::span<float>(g)); }));
      if (cls[r].back() != "none") break;
    }
  });
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    CHECK(cls[r] == cls[0]);
  }
  REQUIRE(!cls[0].empty());
  CHECK(cls[0].back() == typeid(mismatch_error).name());
  if (diff % 16 != 0) CHECK(cls[0].size() == 1);  // at once
}
