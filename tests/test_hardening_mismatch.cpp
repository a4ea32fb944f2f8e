// One rank's differing argument, over every compressor the library ships (host memory
// and the deferred space; add a new compressor to `every_compressor` (tests/common/every_compressor.hpp) and it is held to
// the same rule): a gradient of another length on one rank, longer or shorter (at the
// first step, or after one), or one rank built with another option (density, approximation rank, layout,
// levels, momentum, bucket cap), raises the same error class on every rank, each rank's
// message naming it; every rank's state is unchanged and, after a differing length, the
// next step with the right length works on every rank, with the same result on every rank.
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
#include <commpact/kernels/deferred/ops.hpp>

#include <atomic>
#include <cctype>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "common/every_compressor.hpp"
#include "common/random.hpp"
#include "common/rank_checks.hpp"
#include "common/space_copies.hpp"

using namespace commpact;
using commpact_test::normal;

namespace {
const tensor_layout kLayout = {{12, 10}, {10}, {6, 8}, {3}};
const tensor_layout kOtherLayout = {{10, 12}, {10}, {8, 6}, {3}};  // the same length, other shapes
const std::vector<std::size_t> kLayers = {120, 10, 48, 3};
constexpr std::size_t kN = 120 + 10 + 48 + 3;
constexpr int kP = 3;
using TC = ThreadComm;
using DC = DeferredComm<ThreadComm>;

//! The communicator of compressor C (ThreadComm or DeferredComm<ThreadComm>) from a ThreadComm.
template <class C>
auto comm_for(TC& comm) {
  if constexpr (std::is_same_v<space_of_t<C>, deferred_space>) return DC{comm};
  else return comm;
}

//! Builds C; `odd` builds it with one option that differs (has_option: C has one).
template <class C>
struct maker {
  static constexpr bool has_option = false;
  static C make(TC& comm, bool) { return C{comm_for<C>(comm)}; }
};
template <class Comm>
struct maker<TopK<Comm>> {
  static constexpr bool has_option = true;
  static TopK<Comm> make(TC& comm, bool odd) { return TopK<Comm>{comm_for<TopK<Comm>>(comm), {.density = odd ? 0.2 : 0.1}}; }
};
template <class Comm>
struct maker<gTopK<TreeComm<Comm>>> {
  using C = gTopK<TreeComm<Comm>>;
  static constexpr bool has_option = true;
  static C make(TC& comm, bool odd) { return C{comm_for<C>(comm), {.density = odd ? 0.2 : 0.1}}; }
};
template <class Comm>
struct maker<OkTopK<Comm>> {
  static constexpr bool has_option = true;
  static OkTopK<Comm> make(TC& comm, bool odd) {
    return OkTopK<Comm>{comm_for<OkTopK<Comm>>(comm), {.density = odd ? 0.2 : 0.1}};
  }
};
template <class S>
struct maker<PowerCompressor<2, S>> {
  using C = PowerCompressor<2, S>;
  static constexpr bool has_option = true;
  static C make(TC& comm, bool odd) {
    power_options o;
    if (odd && comm.rank() == 1) o.approximation_rank = 1;
    return C{comm_for<C>(comm), odd && comm.rank() == 2 ? kOtherLayout : kLayout, o};
  }
};
template <class Comm>
struct maker<LinearCompressor<randomk_codec, Comm>> {
  using C = LinearCompressor<randomk_codec, Comm>;
  static constexpr bool has_option = true;
  static C make(TC& comm, bool odd) { return C{comm_for<C>(comm), randomk_codec{odd ? 0.3 : 0.2, 7}}; }
};
template <class Comm>
struct maker<CodecCompressor<qsgd_codec, Allgather<Comm>>> {
  using C = CodecCompressor<qsgd_codec, Allgather<Comm>>;
  static constexpr bool has_option = true;
  static C make(TC& comm, bool odd) { return C{comm_for<C>(comm), qsgd_codec{odd ? 16u : 256u}}; }
};
template <class Comm>
struct maker<MajorityVote<Comm>> {
  static constexpr bool has_option = true;
  static MajorityVote<Comm> make(TC& comm, bool odd) {
    return MajorityVote<Comm>{comm_for<MajorityVote<Comm>>(comm), {.momentum = odd ? 0.5f : 0.0f}};
  }
};
template <class C>
struct maker<Bucketed<C>> {
  static constexpr bool has_option = true;
  static Bucketed<C> make(TC& comm, bool odd) {
    return Bucketed<C>{kLayers, [&](const bucket_info&) { return maker<C>::make(comm, false); },
                       {.cap_bytes = odd ? 400u : 200u}};
  }
};

using every_compressor = commpact_test::every_compressor<TC, DC>;

//! body(grad) on a host vector g, as a span of c's space (copied to and from the deferred
//! space where c runs there).
template <class C, class F>
void on_space(C& c, std::vector<float>& g, F&& body) {
  if constexpr (std::is_same_v<space_of_t<C>, deferred_space>) {
    const auto e = comm_exec(c.comm());
    auto d = commpact_test::device_copy(e, g);
    body(d.view());
    g = commpact_test::host_copy(e, d.cview());
  } else {
    body(std::span<float>(g));
  }
}
//! One step of c on a host vector g.
template <class C>
void step(C& c, std::vector<float>& g) {
  on_space(c, g, [&](auto grad) { c.reduce(grad); });
}
template <class C>
std::vector<std::byte> saved(const C& c) {
  std::vector<std::byte> b;
  c.save_state(b);
  return b;
}

struct outcome {
  std::string cls = "none", what;
  bool same_state = false;
  std::string next = "not run";
  std::vector<float> next_result;  // grad after the next step
};
template <class F>
void run_into(outcome& o, F&& f) {
  try {
    f();
    o.cls = "none";
  } catch (const commpact::error& e) {
    o.cls = typeid(e).name(), o.what = e.what();
  } catch (const std::exception& e) {
    o.cls = "std::exception", o.what = e.what();
  }
}

//! True when `what` names rank r ("rank r" not followed by a digit).
bool names_rank(const std::string& what, int r) {
  const std::string key = commpact::detail::cat("rank ", r);
  for (auto at = what.find(key); at != std::string::npos; at = what.find(key, at + 1)) {
    const auto next = at + key.size();
    if (next == what.size() || !std::isdigit(static_cast<unsigned char>(what[next]))) return true;
  }
  return false;
}

//! True when `what` is a communicator's check that the ranks called collectives of other
//! kinds or sizes (ThreadComm's, or the signature check of comm/signature.hpp).
bool from_the_communicator(const std::string& what) {
  return what.find("commpact::ThreadComm") != std::string::npos || what.find(": ranks disagree on the collective") != std::string::npos ||
         what.find(": ranks disagree on the size") != std::string::npos;
}

//! kind 0: rank 1's gradient is `delta` floats longer (shorter, for a negative delta) at
//! the first step; 1: the same after a good step; 2: rank 1 (and for PowerCompressor
//! rank 2) built with another option.
template <class C>
std::vector<outcome> differing(int kind, int delta = 1) {
  std::vector<outcome> out(kP);
  run_threads(kP, [&](TC& comm) {
    const int r = comm.rank();
    auto c = maker<C>::make(comm, kind == 2 && r != 0);
    outcome& o = out[static_cast<std::size_t>(r)];
    if (kind == 1) {
      std::vector<float> g = normal(10 + r, kN);
      run_into(o, [&] { step(c, g); });
      if (o.cls != "none") return;
    }
    const auto before = saved(c);
    const auto odd = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(kN) + delta);
    std::vector<float> g = normal(20 + r, kind != 2 && r == 1 ? odd : kN);
    run_into(o, [&] { step(c, g); });
    o.same_state = saved(c) == before;
    if (kind != 2) {
      outcome n;
      std::vector<float> g2 = normal(30 + r, kN);
      run_into(n, [&] { step(c, g2); });
      o.next = n.cls == "none" ? "ok" : n.what;
      o.next_result = g2;
    }
  });
  return out;
}
}  // namespace

TEMPLATE_LIST_TEST_CASE("one rank's differing length or option raises mismatch_error on every rank, naming it",
                        "[hardening][mismatch]", every_compressor) {
  const int kind = GENERATE(0, 1, 2);
  const int delta = GENERATE(1, -1, -7, 100);  // rank 1's gradient longer or shorter (kinds 0 and 1)
  if (kind == 2 && (!maker<TestType>::has_option || delta != 1)) return;
  CAPTURE(kind, delta);
  const auto out = differing<TestType>(kind, delta);
  for (int r = 0; r < kP; ++r) {
    const auto& o = out[static_cast<std::size_t>(r)];
    CAPTURE(r, o.what);
    CHECK(o.cls == typeid(mismatch_error).name());
    CHECK((names_rank(o.what, r) || names_rank(o.what, 1)));  // itself (and its value), or the odd rank
    CHECK(o.same_state);
    if (kind != 2) CHECK(o.next == "ok");
    if (kind != 2) CHECK(o.next_result == out[0].next_result);  // the next step agrees across the ranks
    // After a good step the compressor itself sees the odd length (every rank makes the
    // same calls), not the communicator's size check: over one that checks nothing (an
    // unchecked MpiComm, NcclComm) the calls would not match.
    if (kind == 1) CHECK_FALSE(from_the_communicator(o.what));
  }
}

namespace {
//! Rank 1 built by make(comm, true), the others by make(comm, false): the first step
//! raises mismatch_error on every rank, naming `setting`, and changes no state.
template <class Make>
void one_rank_built_otherwise(Make make, const char* setting) {
  std::vector<outcome> out(kP);
  run_threads(kP, [&](TC& comm) {
    const int r = comm.rank();
    auto c = make(comm, r == 1);
    outcome& o = out[static_cast<std::size_t>(r)];
    const auto before = saved(c);
    std::vector<float> g = normal(20 + r, kN);
    run_into(o, [&] { step(c, g); });
    o.same_state = saved(c) == before;
  });
  for (int r = 0; r < kP; ++r) {
    const auto& o = out[static_cast<std::size_t>(r)];
    CAPTURE(r, setting, o.what);
    CHECK(o.cls == typeid(mismatch_error).name());
    CHECK(o.what.find(setting) != std::string::npos);
    CHECK(o.same_state);
  }
}
}  // namespace

TEST_CASE("ranks that disagree on random-k's seed or scaling, or on MajorityVote's scaling, raise mismatch_error",
          "[hardening][mismatch]") {
  // Random-k: another seed (each rank would decode the sum onto its own indices) or
  // scaling (scaled and unscaled values summed); the same k on every rank.
  SECTION("random-k, another seed") {
    one_rank_built_otherwise(
        [](TC& comm, bool odd) {
          return LinearCompressor<randomk_codec, TC>{comm, randomk_codec{0.2, odd ? 8u : 7u}};
        },
        "the codec's settings");
  }
  SECTION("random-k, scaled on one rank") {
    one_rank_built_otherwise(
        [](TC& comm, bool odd) {
          return LinearCompressor<randomk_codec, TC>{comm, randomk_codec{0.2, 7, odd}};
        },
        "the codec's settings");
  }
  SECTION("random-k over the deferred space, another seed") {
    one_rank_built_otherwise(
        [](TC& comm, bool odd) {
          return LinearCompressor<randomk_codec, DC>{DC{comm}, randomk_codec{0.2, odd ? 8u : 7u}};
        },
        "the codec's settings");
  }
  SECTION("QSGD, another bucket size with as many buckets (messages of one size)") {
    // Bucket sizes d and d + 1 cut kN values into as many buckets, so the messages have one
    // size and only the codec's agreement value (levels and bucket size) tells them apart:
    // each rank would decode the others' norms over its own bucket bounds.
    static constexpr std::size_t d = (kN + 1) / 2;
    REQUIRE((kN + d - 1) / d == (kN + d) / (d + 1));
    one_rank_built_otherwise(
        [](TC& comm, bool odd) {
          return CodecCompressor<qsgd_codec, Allgather<TC>>{comm, qsgd_codec{16, 3, odd ? d + 1 : d}};
        },
        "the codec's parameter");
  }
  SECTION("MajorityVote, scaled on one rank only") {
    one_rank_built_otherwise(
        [](TC& comm, bool odd) { return MajorityVote<TC>{comm, {.scaled = !odd}}; }, "`scaled`");
  }
}

namespace {
//! C built with on_nonfinite = on (its other options the defaults, density 0.1).
template <class C>
C built_with(TC& comm, nonfinite on) {
  auto c = comm_for<C>(comm);
  if constexpr (requires { C{c, sparse_options{}}; }) return C{c, sparse_options{.density = 0.1, .on_nonfinite = on}};
  else if constexpr (requires { C{c, oktopk_options{}}; }) return C{c, oktopk_options{.density = 0.1, .on_nonfinite = on}};
  else if constexpr (requires { C{c, dense_options{}}; }) return C{c, dense_options{.on_nonfinite = on}};
  else if constexpr (requires { C{c, cast_allreduce_options{}}; }) return C{c, cast_allreduce_options{.on_nonfinite = on}};
  else if constexpr (requires { C{c, majority_options{}}; }) return C{c, majority_options{.on_nonfinite = on}};
  else if constexpr (requires { C{c, randomk_codec{}, on}; }) return C{c, randomk_codec{0.2, 7}, on};
  else return C{c, typename C::codec_type{}, codec_options{.on_nonfinite = on}};
}
}  // namespace

TEMPLATE_TEST_CASE("ranks built with another on_nonfinite raise mismatch_error on every rank at the first step, "
                   "naming it (no rank would skip a non-finite step that the others raise on)",
                   "[hardening][mismatch][nonfinite]", Dense<TC>, TopK<TC>, gTopK<TreeComm<TC>>, OkTopK<TC>,
                   (CodecCompressor<qsgd_codec, Allgather<TC>>), Fp16Allreduce<TC>, MajorityVote<TC>,
                   (LinearCompressor<randomk_codec, TC>), Dense<DC>, gTopK<TreeComm<DC>>, OkTopK<DC>,
                   (CodecCompressor<qsgd_codec, Allgather<DC>>)) {
  one_rank_built_otherwise(
      [](TC& comm, bool odd) { return built_with<TestType>(comm, odd ? nonfinite::skip_step : nonfinite::raise); },
      "on_nonfinite");
}

// The same through Bucketed's overlap path: begin() agrees at the first step, and at a
// later step the worker runs bucket 0 on the odd rank's longer workspace, whose length
// bucket 0's compressor checks (over every kind of bucket compressor but
// PowerCompressor, whose layout is per bucket).
TEMPLATE_TEST_CASE("Bucketed with overlap (begin, ready): one rank's gradient of another length raises "
                   "mismatch_error on every rank",
                   "[hardening][mismatch]", Bucketed<Dense<TC>>, Bucketed<TopK<TC>>, Bucketed<gTopK<TreeComm<TC>>>,
                   Bucketed<OkTopK<TC>>, Bucketed<MajorityVote<TC>>, Bucketed<Fp16Allreduce<TC>>,
                   (Bucketed<LinearCompressor<randomk_codec, TC>>),
                   (Bucketed<CodecCompressor<qsgd_codec, Allgather<TC>>>), Bucketed<TopK<DC>>, Bucketed<OkTopK<DC>>) {
  const int kind = GENERATE(0, 1);  // at the first step, or after a good one
  const int delta = GENERATE(1, -1, -7);
  CAPTURE(kind, delta);
  std::vector<outcome> out(kP);
  run_threads(kP, [&](TC& comm) {
    const int r = comm.rank();
    auto c = maker<TestType>::make(comm, false);
    outcome& o = out[static_cast<std::size_t>(r)];
    auto overlapped = [&](std::vector<float>& g) {
      on_space(c, g, [&](auto grad) {
        c.begin(grad);
        for (std::size_t l = kLayers.size(); l-- > 0;) c.ready(l);  // backward: the last layer first
        c.reduce(grad);
      });
    };
    if (kind == 1) {
      std::vector<float> g = normal(10 + r, kN);
      run_into(o, [&] { overlapped(g); });
      if (o.cls != "none") return;
    }
    const auto before = saved(c);
    std::vector<float> g = normal(20 + r, r == 1 ? static_cast<std::size_t>(static_cast<int>(kN) + delta) : kN);
    run_into(o, [&] { overlapped(g); });
    o.same_state = saved(c) == before;
    outcome n;
    std::vector<float> g2 = normal(30 + r, kN);
    run_into(n, [&] { overlapped(g2); });
    o.next = n.cls == "none" ? "ok" : n.what;
    o.next_result = g2;
  });
  for (int r = 0; r < kP; ++r) {
    const auto& o = out[static_cast<std::size_t>(r)];
    CAPTURE(r, o.what);
    CHECK(o.cls == typeid(mismatch_error).name());
    CHECK((names_rank(o.what, r) || names_rank(o.what, 1)));
    CHECK(o.same_state);
    CHECK(o.next == "ok");
    CHECK(o.next_result == out[0].next_result);
  }
}

// A Bucketed rank that cancels its step after some buckets have started and retries it
// while the others go on: its retried bucket 0 meets the others' next bucket. Each
// bucket's compressor carries its bucket in its per-step check (check_tag), so with
// buckets of equal size (whose messages match) every rank raises mismatch_error in that
// step, no state changes, and the next step agrees; without the tag the others committed
// a step that mixed rank 1's bucket 0 into their bucket `started` (caught one step later).
template <class B>
struct bucket_type;
template <class C>
struct bucket_type<Bucketed<C>> {
  using type = C;
};
template <class C>
constexpr bool is_oktopk = false;
template <class Comm>
constexpr bool is_oktopk<OkTopK<Comm>> = true;
template <class C>
C bucket_compressor(TC& comm) {
  if constexpr (requires { C::default_rank; }) return C{comm_for<C>(comm), tensor_layout{{6, 8}}};
  else return maker<C>::make(comm, false);
}
// P = 3, four buckets of 48 floats (cap 0), each bucket's compressor from `make(comm)`:
// `pre` good overlapped steps, then `between(c)` on every rank, then a step in which
// (with `cancel`) rank 1 reports the layers of `started` buckets ready, cancels and
// retries it, then one more step. out[r]: that step's outcome (same_state: the state as
// before it) and the next's; step[r]: the gradient after it.
struct lone_cancel_result {
  std::vector<outcome> out = std::vector<outcome>(kP);
  std::vector<std::vector<float>> step = std::vector<std::vector<float>>(kP);
};
template <class B, class Make, class Between>
lone_cancel_result lone_cancel_run(Make make, int pre, Between between, bool cancel, int started) {
  const std::vector<std::size_t> layers = {48, 48, 48, 48};
  constexpr std::size_t n = 4 * 48;
  lone_cancel_result res;
  run_threads(kP, [&](TC& comm) {
    const int r = comm.rank();
    const auto i = static_cast<std::size_t>(r);
    B c{layers, [&](const bucket_info&) { return make(comm); }, {.cap_bytes = 0}};
    outcome& o = res.out[i];
    auto overlapped = [&](auto grad) {
      c.begin(grad);
      for (std::size_t l = layers.size(); l-- > 0;) c.ready(l);
      c.reduce(grad);
    };
    for (int t = 0; t < pre; ++t) {
      std::vector<float> g = normal(10 * (t + 1) + r, n);
      run_into(o, [&] { on_space(c, g, overlapped); });
      if (o.cls != "none") return;
    }
    between(c);
    const auto before = saved(c);
    res.step[i] = normal(100 + r, n);
    run_into(o, [&] {
      on_space(c, res.step[i], [&](auto grad) {
        if (cancel && r == 1) {  // backward raised after `started` buckets were ready: cancel, then retry
          c.begin(grad);
          for (int l = 0; l < started; ++l) c.ready(layers.size() - 1 - static_cast<std::size_t>(l));
          c.cancel();
        }
        overlapped(grad);
      });
    });
    o.same_state = saved(c) == before;
    outcome next;
    std::vector<float> g2 = normal(200 + r, n);
    run_into(next, [&] { on_space(c, g2, overlapped); });
    o.next = next.cls == "none" ? "ok" : next.what;
    o.next_result = g2;
  });
  return res;
}
// A lone cancel and retry caught in its step: mismatch_error on every rank from the step's
// own check with the check tag's hint (check_tag.hpp), not the communicator's; the state
// unchanged; the next step passes with one result on every rank.
namespace {
void require_caught_lone_cancel(const std::vector<outcome>& out) {
  for (int r = 0; r < kP; ++r) {
    const auto& o = out[static_cast<std::size_t>(r)];
    CAPTURE(r, o.what);
    CHECK(o.cls == typeid(mismatch_error).name());
    CHECK(!from_the_communicator(o.what));
    CHECK(o.what.find("met another bucket") != std::string::npos);
    CHECK(o.same_state);
    CHECK(o.next == "ok");
    CHECK(o.next_result == out[0].next_result);
  }
}
}  // namespace

TEMPLATE_TEST_CASE("Bucketed with overlap: a rank that cancels after some buckets started and retries while the "
                   "others go on raises mismatch_error on every rank in that step; at the first step, when no "
                   "bucket starts before reduce(), its retry is simply its first step",
                   "[hardening][mismatch]", Bucketed<Dense<TC>>, Bucketed<TopK<TC>>, Bucketed<gTopK<TreeComm<TC>>>,
                   Bucketed<OkTopK<TC>>, Bucketed<MajorityVote<TC>>, Bucketed<Fp16Allreduce<TC>>,
                   Bucketed<Bf16Allreduce<TC>>, Bucketed<PowerCompressor<2>>,
                   (Bucketed<LinearCompressor<randomk_codec, TC>>),
                   (Bucketed<CodecCompressor<qsgd_codec, Allgather<TC>>>), Bucketed<Dense<DC>>, Bucketed<TopK<DC>>,
                   Bucketed<gTopK<TreeComm<DC>>>, Bucketed<OkTopK<DC>>, Bucketed<MajorityVote<DC>>,
                   Bucketed<Fp16Allreduce<DC>>, (Bucketed<PowerCompressor<2, deferred_space>>),
                   (Bucketed<LinearCompressor<randomk_codec, DC>>),
                   (Bucketed<CodecCompressor<qsgd_codec, Allgather<DC>>>)) {
  const int started = GENERATE(1, 2, 3);  // buckets rank 1 had reported ready when it cancelled
  const bool warm = GENERATE(false, true);  // after a good step, or at the first
  CAPTURE(started, warm);
  using C = typename bucket_type<TestType>::type;
  const auto make = [](TC& comm) { return bucket_compressor<C>(comm); };
  const auto nothing = [](TestType&) {};
  if (!warm && !is_oktopk<C>) {
    // At the first step no bucket starts before reduce() (needs_agreement()), so rank 1
    // had sent nothing when it cancelled: every rank's first step and the next are those
    // of a run without the cancel, bit for bit. (Before, its retried bucket 0 met the
    // others' next bucket's first-step agreement, which only the communicator's call
    // check saw.) OkTopK has no first-step agreement, so it is not held back: its
    // headers raise at the first step as at any other.
    const auto with = lone_cancel_run<TestType>(make, 0, nothing, true, started);
    const auto plain = lone_cancel_run<TestType>(make, 0, nothing, false, started);
    for (int r = 0; r < kP; ++r) {
      const auto i = static_cast<std::size_t>(r);
      CAPTURE(r, with.out[i].what);
      CHECK(with.out[i].cls == "none");
      CHECK(plain.out[i].cls == "none");
      CHECK(!with.out[i].same_state);  // the step was kept
      CHECK(with.step[i] == plain.step[i]);
      CHECK(with.out[i].next == "ok");
      CHECK(with.out[i].next_result == plain.out[i].next_result);
    }
    return;
  }
  require_caught_lone_cancel(lone_cancel_run<TestType>(make, warm ? 1 : 0, nothing, true, started).out);
}

// (No ": " far into a test name: Catch2 2.13's console reporter indents wrapped lines
// by its position and throws on a failure's header when that passes the line width.)
TEST_CASE("Bucketed holds back a step whose buckets agree first, so a rank that cancels during its backward and "
          "retries gets the run without the cancel (a TopK density warm-up boundary)",
          "[hardening][mismatch]") {
  const int started = GENERATE(1, 2, 3);
  CAPTURE(started);
  auto same_as_plain = [&](auto tag, auto make, int pre, auto between) {
    using B = typename decltype(tag)::type;
    const auto with = lone_cancel_run<B>(make, pre, between, true, started);
    const auto plain = lone_cancel_run<B>(make, pre, between, false, started);
    for (int r = 0; r < kP; ++r) {
      const auto i = static_cast<std::size_t>(r);
      const std::string& what = with.out[i].what;
      CAPTURE(r, what);
      CHECK(with.out[i].cls == "none");
      CHECK(plain.out[i].cls == "none");
      CHECK(with.step[i] == plain.step[i]);
      CHECK(with.out[i].next == "ok");
      CHECK(with.out[i].next_result == plain.out[i].next_result);
    }
  };
  SECTION("TopK: the density drops at step 2, so the message's capacity changes and the buckets agree again") {
    using C = TopK<TC>;
    auto make = [](TC& comm) { return C{comm, {.density = 0.0625, .density_warmup = {{0, 0.25}, {2, 0.0625}}}}; };
    same_as_plain(std::type_identity<Bucketed<C>>{}, make, 2, [](auto&) {});
  }
}

// A state saved before the first step has an empty residual, which fits: the buckets keep
// their agreement through the load, are not held back, and a lone cancel and retry is
// caught as at any later step (gTopK used to clear its agreement there, so the step was
// held back on ranks that loaded and not on one that did not).
TEST_CASE("Bucketed of gTopK keeps its agreement through a load of a state saved before the first step",
          "[hardening][mismatch]") {
  const int started = GENERATE(1, 2, 3);
  CAPTURE(started);
  using C = gTopK<TreeComm<TC>>;
  auto make = [](TC& comm) { return C{comm, {.density = 0.1}}; };
  // The blob of a fresh Bucketed of the same plan, saved on each rank.
  std::vector<std::vector<std::byte>> fresh(kP);
  run_threads(kP, [&](TC& comm) {
    Bucketed<C> c{{48, 48, 48, 48}, [&](const bucket_info&) { return make(comm); }, {.cap_bytes = 0}};
    c.save_state(fresh[static_cast<std::size_t>(comm.rank())]);
  });
  const auto load = [&](Bucketed<C>& c) { c.load_state(fresh[static_cast<std::size_t>(c.comm().rank())]); };
  require_caught_lone_cancel(lone_cancel_run<Bucketed<C>>(make, 2, load, true, started).out);
}

template <class C>
constexpr bool is_gtopk = false;
template <class Comm>
constexpr bool is_gtopk<gTopK<TreeComm<Comm>>> = true;
template <class C>
constexpr bool is_power = false;
template <class S>
constexpr bool is_power<PowerCompressor<2, S>> = true;

TEMPLATE_TEST_CASE("needs_agreement: true before a compressor's first step and after what clears its agreement, "
                   "false after a step and after a load of a state that fits (OkTopK: never)",
                   "[hardening][mismatch]", Dense<TC>, TopK<TC>, gTopK<TreeComm<TC>>, OkTopK<TC>, MajorityVote<TC>,
                   Fp16Allreduce<TC>, PowerCompressor<2>, (LinearCompressor<randomk_codec, TC>)) {
  run_threads(1, [&](TC& comm) {
    auto c = bucket_compressor<TestType>(comm);
    const bool agrees = !is_oktopk<TestType>;
    RANK_REQUIRE_EQ(c.needs_agreement(), agrees);
    const auto fresh = saved(c);
    std::vector<float> g = normal(1, 48);
    step(c, g);
    RANK_REQUIRE(!c.needs_agreement());
    c.load_state(saved(c));  // a state that fits keeps the agreement
    RANK_REQUIRE(!c.needs_agreement());
    c.load_state(fresh);  // an empty residual fits too
    RANK_REQUIRE(!c.needs_agreement());
    if constexpr (is_gtopk<TestType>) {
      c.reset();
      RANK_REQUIRE(c.needs_agreement());
    }
    if constexpr (is_power<TestType>) {
      c.set_layout(tensor_layout{{6, 8}});
      RANK_REQUIRE(c.needs_agreement());
    }
    if constexpr (std::is_same_v<TestType, Fp16Allreduce<TC>> || std::is_same_v<TestType, TopK<TC>> ||
                  is_gtopk<TestType> || std::is_same_v<TestType, LinearCompressor<randomk_codec, TC>>) {
      std::vector<float> g2 = normal(5, 48);  // agreed at 48 (gTopK: again, after its reset())
      step(c, g2);
      RANK_REQUIRE(!c.needs_agreement());
      auto other = bucket_compressor<TestType>(comm);  // a residual of another length
      std::vector<float> h = normal(3, 96);
      step(other, h);
      c.load_state(saved(other));
      RANK_REQUIRE(c.needs_agreement());
      h = normal(4, 96);  // the next step agrees on that length
      step(c, h);
      RANK_REQUIRE(!c.needs_agreement());
    }
  });
}

TEMPLATE_TEST_CASE("set_check_tag takes tags below 2^20 and refuses larger ones with invalid_argument",
                   "[hardening][mismatch]", Dense<TC>, TopK<TC>, gTopK<TreeComm<TC>>, OkTopK<TC>, MajorityVote<TC>,
                   Fp16Allreduce<TC>, PowerCompressor<2>, (LinearCompressor<randomk_codec, TC>)) {
  run_threads(1, [&](TC& comm) {
    auto c = bucket_compressor<TestType>(comm);
    RANK_REQUIRE_EQ(c.check_tag(), 0u);
    c.set_check_tag((1u << 20) - 1);
    RANK_REQUIRE_EQ(c.check_tag(), (1u << 20) - 1);
    RANK_REQUIRE_THROWS_AS(c.set_check_tag(1u << 20), invalid_argument);
    RANK_REQUIRE_EQ(c.check_tag(), (1u << 20) - 1);  // unchanged
  });
}

TEST_CASE("k > n on one rank only: mismatch_error on every rank, and that rank's message names its k",
          "[hardening][mismatch]") {
  // Its n and k differ from the others', so the agreement reports the mismatch (on every
  // rank, alike); the rank whose own input is invalid also says why, so k = 257 is seen.
  const int P = 3;
  const std::size_t n = 256;
  auto run = [&](auto make) {
    std::vector<std::string> msg(P);
    std::vector<int> mismatch(P, 0);
    run_threads(P, [&](TC& comm) {
      auto c = make(comm, comm.rank() == 1 ? sparse_options{.k = static_cast<std::int64_t>(n) + 1}
                                            : sparse_options{.k = 8});
      auto g = normal(static_cast<std::uint64_t>(comm.rank()), n);
      try {
        c.reduce(std::span<float>(g));
      } catch (const mismatch_error& e) {
        mismatch[comm.rank()] = 1;
        msg[comm.rank()] = e.what();
      }
    });
    for (int r = 0; r < P; ++r) CHECK(mismatch[r] == 1);
    INFO(msg[1]);
    CHECK(msg[1].find("k = 257") != std::string::npos);
    CHECK(msg[0].find("k = 257") == std::string::npos);
  };
  SECTION("gTopK") {
    run([](TC& comm, sparse_options o) { return gTopK<TreeComm<TC>>{comm, o}; });
  }
  SECTION("TopK") {
    run([](TC& comm, sparse_options o) { return TopK<TC>{comm, o}; });
  }
}

TEST_CASE("a CodecCompressor's state loads only into the same codec and options, on the rank and with the ranks "
          "that saved it; a refused state changes nothing",
          "[hardening][state]") {
  using Q = CodecCompressor<qsgd_codec, Allgather<ThreadComm>>;
  using S = CodecCompressor<sign_codec, Allgather<ThreadComm>>;
  constexpr std::size_t n = 300;
  // Every rank saves after two steps of each compressor (P = 2 and 3).
  auto saved = [&](int P, auto make) {
    std::vector<std::vector<std::byte>> blobs(static_cast<std::size_t>(P));
    run_threads(P, [&](ThreadComm& comm) {
      auto c = make(comm);
      for (int s = 0; s < 2; ++s) {
        auto g = normal(10 * s + comm.rank(), n);
        c.reduce(std::span<float>(g));
      }
      c.save_state(blobs[static_cast<std::size_t>(comm.rank())]);
    });
    return blobs;
  };
  auto qsgd = [](ThreadComm& c) { return Q{c, qsgd_codec{16, 5, 64}}; };
  const auto q2 = saved(2, qsgd);
  const auto q3 = saved(3, qsgd);
  const auto t2 = saved(2, [](ThreadComm& c) { return TopK<ThreadComm>{c, {.density = 0.05}}; });
  std::atomic<int> good{0};
  run_threads(2, [&](ThreadComm& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    int ok = 0;
    auto refused = [&](auto& c, const std::vector<std::byte>& blob, const char* says) {
      std::vector<std::byte> before;
      c.save_state(before);
      try {
        c.load_state(blob);
        return;  // loaded: not counted
      } catch (const mismatch_error& e) {
        std::vector<std::byte> after;
        c.save_state(after);
        ok += std::string(e.what()).find(says) != std::string::npos && after == before;  // nothing changed
      }
    };
    S sign{comm};
    refused(sign, q2[r], "with other options");  // QSGD's state into EF-SignSGD
    Q q4{comm, qsgd_codec{4, 5, 64}};
    refused(q4, q2[r], "with other options");  // other levels
    TopK<ThreadComm> dense_k{comm, {.density = 0.1}};
    refused(dense_k, t2[r], "with other options");  // another density
    Q q{comm, qsgd_codec{16, 5, 64}};
    refused(q, q2[1 - r], "Load each rank's own state");  // the other rank's
    refused(q, q3[r], "Load each rank's own state");      // saved with 3 ranks
    q.load_state(q2[r]);                                 // its own: loads, and steps on
    auto g = normal(99 + comm.rank(), n);
    q.reduce(std::span<float>(g));
    ok += q.steps() == 3;
    good += ok == 6 ? 1 : 0;
  });
  CHECK(good == 2);
}

namespace {
//! Compressors whose state differs by rank (a residual, a momentum): another rank's state
//! is refused. Dense keeps counters only, the same on every rank (the casts keep their
//! error feedback's residual: refused since they write section 20; they had loaded another
//! rank's residual silently).
template <class C>
constexpr bool per_rank_state = true;
template <class Comm>
constexpr bool per_rank_state<Dense<Comm>> = false;
template <class Comm>
constexpr bool per_rank_state<Bucketed<Dense<Comm>>> = false;
//! The option maker<C> varies changes what a state holds on rank 0 (PowerCompressor's
//! differs on ranks 1 and 2 only; Bucketed's bucket size is its own check).
template <class C>
constexpr bool option_in_state = maker<C>::has_option;
template <class S>
constexpr bool option_in_state<PowerCompressor<2, S>> = false;
template <class C>
constexpr bool option_in_state<Bucketed<C>> = false;
}  // namespace

TEMPLATE_LIST_TEST_CASE("a state saved by another rank, or with another option, is refused with mismatch_error and "
                        "changes nothing; each rank's own state loads",
                        "[hardening][state]", every_compressor) {
  using C = TestType;
  std::vector<std::vector<std::byte>> blobs(kP);
  run_threads(kP, [&](TC& comm) {
    auto c = maker<C>::make(comm, false);
    for (int s = 0; s < 2; ++s) {
      auto g = normal(40 + 10 * s + comm.rank(), kN);
      step(c, g);
    }
    blobs[static_cast<std::size_t>(comm.rank())] = saved(c);
  });
  std::vector<int> refused_rank(kP, 0), refused_option(kP, 0), own(kP, 0);
  run_threads(kP, [&](TC& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    auto refuses = [&](auto& c, const std::vector<std::byte>& blob) {
      const auto before = saved(c);
      try {
        c.load_state(blob);
      } catch (const mismatch_error&) {
        return saved(c) == before ? 1 : 0;
      } catch (const commpact::error&) {
        return 0;
      }
      return 0;
    };
    auto c = maker<C>::make(comm, false);
    refused_rank[r] = refuses(c, blobs[(r + 1) % kP]);
    if constexpr (option_in_state<C>) {
      auto odd = maker<C>::make(comm, true);
      refused_option[r] = refuses(odd, blobs[r]);
    }
    try {
      c.load_state(blobs[r]);
      own[r] = saved(c) == blobs[r] ? 1 : 0;
    } catch (const commpact::error&) {
    }
  });
  INFO(typeid(C).name());
  CHECK(own == std::vector<int>(kP, 1));
  if constexpr (per_rank_state<C>) CHECK(refused_rank == std::vector<int>(kP, 1));
  if constexpr (option_in_state<C>) CHECK(refused_option == std::vector<int>(kP, 1));
}

TEST_CASE("an fp16 cast's state is refused by a bf16 one; a state without a residual loads into either",
          "[hardening][state]") {
  std::atomic<int> refused{0}, empty_loads{0}, own{0};
  run_threads(2, [&](TC& comm) {
    Fp16Allreduce<TC> h{comm};
    auto g = normal(7 + comm.rank(), 64);
    h.reduce(std::span<float>(g));
    Bf16Allreduce<TC> b{comm};
    const auto before = saved(b);
    try {
      b.load_state(saved(h));
    } catch (const mismatch_error& e) {
      refused += std::string(e.what()).find("with other options") != std::string::npos && saved(b) == before;
    }
    Fp16Allreduce<TC> twin{comm};
    twin.load_state(saved(h));
    own += saved(twin) == saved(h) ? 1 : 0;
    Fp16Allreduce<TC> fresh{comm, {.error_feedback = false}};
    fresh.reduce(std::span<float>(g));
    Bf16Allreduce<TC> no_residual{comm, {.error_feedback = false}};
    no_residual.load_state(saved(fresh));  // counters only: nothing format-bound to compare
    empty_loads += no_residual.steps() == 1 ? 1 : 0;
  });
  CHECK(refused == 2);
  CHECK(own == 2);
  CHECK(empty_loads == 2);
}

TEST_CASE("Signum whose every step so far was skipped (no momentum yet) reloads its own state; signSGD's state "
          "after kept steps is refused",
          "[hardening][state]") {
  std::atomic<int> own{0}, refused{0}, skipped{0};
  run_threads(2, [&](TC& comm) {
    const majority_options o{.momentum = 0.9f, .on_nonfinite = nonfinite::skip_step};
    MajorityVote<TC> a{comm, o};
    std::vector<float> g(16, 1.0f);
    if (comm.rank() == 0) g[3] = std::numeric_limits<float>::quiet_NaN();
    skipped += a.reduce(std::span<float>(g)) ? 0 : 1;  // skipped on every rank
    MajorityVote<TC> b{comm, o};
    b.load_state(saved(a));
    own += b.steps() == 1 ? 1 : 0;
    MajorityVote<TC> sign{comm, {}};
    std::vector<float> h(16, 1.0f);
    sign.reduce(std::span<float>(h));
    MajorityVote<TC> c{comm, o};
    try {
      c.load_state(saved(sign));
    } catch (const mismatch_error&) {
      ++refused;
    }
  });
  CHECK(skipped == 2);
  CHECK(own == 2);
  CHECK(refused == 2);
}

// The compressors without frame headers after a good step: every rank's gradient changes
// to one new length. Each rank runs the step idle (its length is not the agreed one), the
// step check sees every rank idle with one length, and finish() agrees on it and runs the
// step: the result is that of a twin that starts at the new length from the state saved
// before the step, bit for bit, and the step after goes on at the new length.
namespace {
template <class C>
struct length_maker {
  static C make(TC& comm) { return maker<C>::make(comm, false); }
};
template <class Comm>
struct length_maker<LinearCompressor<randomk_codec, Comm>> {  // scaled: keeps no residual
  using C = LinearCompressor<randomk_codec, Comm>;
  static C make(TC& comm) { return C{comm_for<C>(comm), randomk_codec{0.2, 7, true}}; }
};
}  // namespace

TEMPLATE_TEST_CASE("Dense, the casts, LinearCompressor, MajorityVote and CodecCompressor: every rank's gradient "
                   "changing to one new length after a step runs as in a compressor that starts there",
                   "[hardening][mismatch]", Dense<TC>, Dense<DC>, Fp16Allreduce<TC>, Fp16Allreduce<DC>,
                   (LinearCompressor<randomk_codec, TC>), (LinearCompressor<randomk_codec, DC>), MajorityVote<TC>,
                   MajorityVote<DC>, (CodecCompressor<qsgd_codec, Allgather<TC>>),
                   (CodecCompressor<qsgd_codec, Allgather<DC>>), TopK<TC>, TopK<DC>) {
  // kN + 40 and kN - 41 change MajorityVote's and CodecCompressor's message capacity
  // (their idle step and the agreement after it); kN + 5 does not (a plain step).
  const std::size_t n2 = GENERATE(kN + 5, kN + 40, kN - 41);
  CAPTURE(n2);
  std::vector<std::vector<float>> result(kP), after(kP);
  run_threads(kP, [&](TC& comm) {
    const int r = comm.rank();
    auto c = length_maker<TestType>::make(comm);
    std::vector<float> g = normal(10 + r, kN);
    step(c, g);
    if constexpr (requires { c.reset(); }) c.reset();  // a residual of the old length (the casts)
    const auto before = saved(c);
    auto twin = length_maker<TestType>::make(comm);
    twin.load_state(before);
    std::vector<float> g2 = normal(20 + r, n2), t2 = g2;
    RANK_REQUIRE_NOTHROW(step(c, g2));
    RANK_REQUIRE_NOTHROW(step(twin, t2));
    RANK_REQUIRE(g2 == t2);
    RANK_REQUIRE_EQ(c.steps(), 2);
    std::vector<float> g3 = normal(30 + r, n2), t3 = g3;
    RANK_REQUIRE_NOTHROW(step(c, g3));
    RANK_REQUIRE_NOTHROW(step(twin, t3));
    RANK_REQUIRE(g3 == t3);
    result[static_cast<std::size_t>(r)] = g2, after[static_cast<std::size_t>(r)] = g3;
  });
  for (int r = 1; r < kP; ++r) {
    CHECK(result[static_cast<std::size_t>(r)] == result[0]);
    CHECK(after[static_cast<std::size_t>(r)] == after[0]);
  }
}

TEMPLATE_TEST_CASE("Dense, the casts and LinearCompressor: a new length on every rank with a residual of the old one "
                   "raises invalid_argument on every rank, changing nothing; the old length goes on",
                   "[hardening][mismatch]", Fp16Allreduce<TC>, Fp16Allreduce<DC>, (LinearCompressor<randomk_codec, TC>),
                   (LinearCompressor<randomk_codec, DC>)) {
  std::vector<outcome> out(kP);
  std::vector<std::vector<float>> next(kP);
  run_threads(kP, [&](TC& comm) {
    const int r = comm.rank();
    auto c = maker<TestType>::make(comm, false);  // with error feedback (random-k unscaled)
    std::vector<float> g = normal(10 + r, kN);
    step(c, g);
    outcome& o = out[static_cast<std::size_t>(r)];
    const auto before = saved(c);
    std::vector<float> g2 = normal(20 + r, kN + 3);
    const auto g2_in = g2;
    run_into(o, [&] { step(c, g2); });
    o.same_state = saved(c) == before && g2 == g2_in;
    std::vector<float> g3 = normal(30 + r, kN);
    outcome n;
    run_into(n, [&] { step(c, g3); });
    o.next = n.cls == "none" ? "ok" : n.what;
    next[static_cast<std::size_t>(r)] = g3;
  });
  for (int r = 0; r < kP; ++r) {
    const auto& o = out[static_cast<std::size_t>(r)];
    CAPTURE(r, o.what);
    CHECK(o.cls == typeid(invalid_argument).name());
    CHECK(o.what.find("reset()") != std::string::npos);
    CHECK(o.same_state);
    CHECK(o.next == "ok");
    CHECK(next[static_cast<std::size_t>(r)] == next[0]);
  }
}

// A rank that loads a state alone (here its own, saved after the last step: what
// Bucketed's and DataParallel's rollback after a failed load does) keeps its agreement, so
// at the next step it makes the same calls as the others: the step runs on every rank with
// the same result as without the load.
TEMPLATE_LIST_TEST_CASE("a rank that reloads its own state alone steps on with the others", "[hardening][mismatch]",
                        every_compressor) {
  std::vector<std::vector<float>> with(kP), without(kP);
  for (int reload = 0; reload < 2; ++reload) {
    auto& out = reload ? with : without;
    run_threads(kP, [&](TC& comm) {
      const int r = comm.rank();
      auto c = maker<TestType>::make(comm, false);
      for (int s = 0; s < 3; ++s) {
        std::vector<float> g = normal(static_cast<std::uint64_t>(10 * s + r), kN);
        step(c, g);
      }
      if (reload && r == 1) {
        const auto st = saved(c);
        c.load_state(st);
      }
      std::vector<float> g = normal(static_cast<std::uint64_t>(40 + r), kN);
      RANK_REQUIRE_NOTHROW(step(c, g));
      out[static_cast<std::size_t>(r)] = g;
    });
  }
  for (int r = 0; r < kP; ++r) CHECK(with[static_cast<std::size_t>(r)] == without[static_cast<std::size_t>(r)]);
}

// A rank that loads alone a state saved before any step was kept (its own, saved at
// construction): an empty residual fits every compressor's agreement, so that rank makes
// the same calls as the others at the next step, where its step count differs: every
// rank raises mismatch_error from the step's own check, never from the communicator's
// check of the calls (gTopK used to count an empty residual as not fitting and agreed
// alone: an allreduce against the others' tree exchange).
TEMPLATE_LIST_TEST_CASE("a rank that loads alone a state saved before its first step is out of step on every rank",
                        "[hardening][mismatch]", every_compressor) {
  std::vector<outcome> out(kP);
  run_threads(kP, [&](TC& comm) {
    const int r = comm.rank();
    auto c = maker<TestType>::make(comm, false);
    const auto fresh = saved(c);
    for (int s = 0; s < 3; ++s) {
      std::vector<float> g = normal(static_cast<std::uint64_t>(10 * s + r), kN);
      step(c, g);
    }
    if (r == 1) c.load_state(fresh);
    const auto before = saved(c);
    std::vector<float> g = normal(static_cast<std::uint64_t>(40 + r), kN);
    auto& o = out[static_cast<std::size_t>(r)];
    run_into(o, [&] { step(c, g); });
    o.same_state = saved(c) == before;
  });
  for (int r = 0; r < kP; ++r) {
    const auto& o = out[static_cast<std::size_t>(r)];
    CAPTURE(r, o.what);
    CHECK(o.cls == typeid(mismatch_error).name());
    CHECK_FALSE(from_the_communicator(o.what));
    // the step check's words (detail::out_of_step; OkTopK's header check says the same)
    CHECK(o.what.find("commit or cancel each step alike") != std::string::npos);
    CHECK(o.same_state);
  }
}

// A random walk over the ways ranks can differ, the same plan on every rank: at each of 8
// steps every rank passes one length (kN, kN + 40 or kN - 41), or one rank passes another;
// now and then one rank reloads its own state alone, or every rank resets. Whatever
// happens, every rank takes the same decision at every step: no error, or one error class
// on every rank (a rejected input: invalid_argument on its rank, peer_failure on the
// others), never one the communicator's size check raised (the ranks' calls always
// match), and a step that raises nowhere gives every rank the same result.
TEMPLATE_LIST_TEST_CASE("a random walk of lengths, lone reloads and resets keeps every rank's decision and calls alike",
                        "[hardening][mismatch]", every_compressor) {
  constexpr int kSteps = 8;
  const std::size_t lengths[3] = {kN, kN + 40, kN - 41};
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    CAPTURE(seed);
    std::vector<std::vector<outcome>> out(kP, std::vector<outcome>(kSteps));
    std::vector<std::vector<std::vector<float>>> res(kP, std::vector<std::vector<float>>(kSteps));
    run_threads(kP, [&](TC& comm) {
      const int r = comm.rank();
      std::mt19937_64 plan(seed);  // the same plan on every rank
      auto pick = [&](std::uint64_t m) { return static_cast<std::size_t>(plan() % m); };
      auto c = maker<TestType>::make(comm, false);
      std::size_t common = kN;
      for (int t = 0; t < kSteps; ++t) {
        if (pick(4) == 0) common = lengths[pick(3)];
        const bool one_odd = pick(3) == 0;
        const int odd_rank = static_cast<int>(pick(kP));
        const std::size_t odd_len = lengths[pick(3)] + 1;
        const bool lone_reload = pick(6) == 0;
        const int reload_rank = static_cast<int>(pick(kP));
        const bool reset_all = pick(8) == 0;
        if (lone_reload && r == reload_rank) {
          const auto st = saved(c);
          c.load_state(st);
        }
        if constexpr (requires { c.reset(); })
          if (reset_all) c.reset();
        std::vector<float> g = normal(static_cast<std::uint64_t>(1000 * seed + 10 * t + r),
                                      one_odd && r == odd_rank ? odd_len : common);
        outcome& o = out[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)];
        run_into(o, [&] { step(c, g); });
        res[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)] = g;
      }
    });
    for (int t = 0; t < kSteps; ++t) {
      CAPTURE(t);
      bool all_none = true;
      for (int r = 0; r < kP; ++r) {
        const auto& o = out[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)];
        CAPTURE(r, o.cls, o.what);
        CHECK_FALSE(from_the_communicator(o.what));
        const auto& o0 = out[0][static_cast<std::size_t>(t)];
        const bool rejected_pair = (o.cls == typeid(invalid_argument).name() || o.cls == typeid(peer_failure).name()) &&
                                   (o0.cls == typeid(invalid_argument).name() || o0.cls == typeid(peer_failure).name());
        CHECK((o.cls == o0.cls || rejected_pair));
        all_none = all_none && o.cls == "none";
      }
      if (all_none)
        for (int r = 1; r < kP; ++r)
          CHECK(res[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)] == res[0][static_cast<std::size_t>(t)]);
    }
  }
}
