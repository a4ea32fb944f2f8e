// Steps and state, each a defect found by a hostile run:
// 1. a user's update that raises leaves every compressor (and the driver) as before the
//    step, plain and overlapped, so a retry equals a run that never saw the failure;
// 2. a backward that raises after some grad_ready calls can be abandoned and begun again;
// 3. a crafted DataParallel state with a valid checksum that is inconsistent raises;
// 4. counters near INT64_MAX in a loaded state raise;
// 5. finite inputs whose mean overflows raise numeric_error (or skip) in every compressor;
// 7. the same misuse (one rank changes its length) raises the same class on every rank;
// 8. a malformed block leaves the caller's gradient untouched;
// 9. a parameter round that raises puts params, the optimizer state and grads back.
#include <catch2/catch.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/compressors/bucketed.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/state.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "common/random.hpp"
#include "common/rank_checks.hpp"
#include "common/state_blobs.hpp"

using namespace commpact;
using commpact_test::normal;
using commpact_test::craft;
using commpact_test::craft_i64;
using commpact_test::saved;
using bytes = std::vector<std::byte>;

namespace {
const tensor_layout kLayout = {{12, 10}, {10}, {6, 8}, {3}};
const std::vector<std::size_t> kLayers = {120, 10, 48, 3};
constexpr std::size_t kN = 120 + 10 + 48 + 3;

struct update_failed : std::runtime_error {
  update_failed() : std::runtime_error("the user's update failed") {}
};

template <class C>
C make(ThreadComm& comm) {
  if constexpr (std::is_same_v<C, TopK<ThreadComm>> || std::is_same_v<C, gTopK<TreeComm<ThreadComm>>>)
    return C{comm, {.density = 0.1}};
  else if constexpr (std::is_same_v<C, PowerCompressor<2>>)
    return C{comm, kLayout};
  else
    return C{comm};
}

void sgd(std::span<float> p, std::span<const float> g, double lr) {
  for (std::size_t i = 0; i < p.size(); ++i) p[i] -= static_cast<float>(lr) * g[i];
}
}  // namespace

TEMPLATE_TEST_CASE("an update that raises leaves the compressor as before; the retry equals a clean run",
                   "[transactional]", Dense<ThreadComm>, TopK<ThreadComm>, gTopK<TreeComm<ThreadComm>>,
                   PowerCompressor<2>, (CodecCompressor<sign_codec, Allgather<ThreadComm>>)) {
  const int P = 3;
  const bool overlap = GENERATE(false, true);
  CAPTURE(overlap);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    auto bucketed = [&] {
      return Bucketed<TestType>{kLayers, [&](const bucket_info& b) {
                                  if constexpr (std::is_same_v<TestType, PowerCompressor<2>>) {
                                    tensor_layout l(kLayout.begin() + b.first_layer, kLayout.begin() + b.end_layer);
                                    return TestType{comm, l};
                                  } else {
                                    return make<TestType>(comm);
                                  }
                                },
                                {.cap_bytes = 200}};
    };
    DataParallel dp{bucketed(), EveryStep{}, 6}, ref{bucketed(), EveryStep{}, 6};
    std::vector<float> p(kN, 1.0f), q = p;
    bool good = true;
    for (int t = 0; t < 6; ++t) {
      auto g = normal(t + 10 * comm.rank(), kN), h = g;
      if (t == 3) {  // the update raises on every rank (user code), after the reduction
        auto g2 = g, p2 = p;
        const bytes before = saved(dp);
        if (overlap) {
          dp.begin_backward(std::span<float>(g2), 0.1);
          for (std::size_t l = kLayers.size(); l-- > 0;) dp.grad_ready(l);
        }
        try {
          dp.step(std::span<float>(p2), std::span<float>(g2), 0.1,
                  [](std::span<float>, std::span<const float>, double) { throw update_failed{}; });
          good = false;
        } catch (const update_failed&) {
        }
        good = good && saved(dp) == before && dp.steps() == 3;
      }
      if (overlap) {
        dp.begin_backward(std::span<float>(g), 0.1);
        for (std::size_t l = kLayers.size(); l-- > 0;) dp.grad_ready(l);
      }
      dp.step(std::span<float>(p), std::span<float>(g), 0.1, sgd);
      ref.step(std::span<float>(q), std::span<float>(h), 0.1, sgd);
      good = good && p == q;
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("a backward that raises after some grad_ready calls can be abandoned and begun again",
          "[transactional]") {
  const int P = 3;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    auto bucketed = [&] {
      return Bucketed<gTopK<TreeComm<ThreadComm>>>{
          kLayers, [&](const bucket_info&) { return gTopK<TreeComm<ThreadComm>>{comm, {.density = 0.1}}; },
          {.cap_bytes = 100}};
    };
    DataParallel dp{bucketed(), EveryStep{}, 4}, ref{bucketed(), EveryStep{}, 4};
    RANK_REQUIRE(dp.compressor().buckets() > 1);
    std::vector<float> p(kN, 1.0f), q = p;
    bool good = true;
    for (int t = 0; t < 4; ++t) {
      auto g = normal(t + 10 * comm.rank(), kN), h = g;
      if (t == 1) {  // backward reports the last two layers, then raises
        auto g2 = g;
        const bytes before = saved(dp);
        dp.begin_backward(std::span<float>(g2), 0.1);
        dp.grad_ready(3);
        dp.grad_ready(2);
        dp.cancel_backward();
        good = good && saved(dp) == before && !dp.compressor().in_flight();
      }
      dp.begin_backward(std::span<float>(g), 0.1);
      for (std::size_t l = kLayers.size(); l-- > 0;) dp.grad_ready(l);
      dp.step(std::span<float>(p), std::span<float>(g), 0.1, sgd);
      ref.step(std::span<float>(q), std::span<float>(h), 0.1, sgd);
      good = good && p == q;
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("a crafted DataParallel<Dense, LocalSgd{4}> state with a valid checksum is rejected",
          "[state]") {
  run_threads(1, [&](ThreadComm& comm) {
    DataParallel dp{Dense<ThreadComm>{comm}, LocalSgd{4}, 16};
    std::vector<float> p(kN, 1.0f);
    auto g = normal(3, kN);
    dp.step(std::span<float>(p), std::span<float>(g), 0.1, sgd);  // inside the first period
    const bytes good = saved(dp);
    DataParallel fresh{Dense<ThreadComm>{comm}, LocalSgd{4}, 16};
    const bytes fresh_state = saved(fresh);
    CHECK_NOTHROW(fresh.load_state(good));
    DataParallel other{Dense<ThreadComm>{comm}, LocalSgd{4}, 16};
    auto empty_x0 = craft(good, "commpact.DataParallel", [](std::uint32_t t, std::uint32_t, bytes& pl) {
      if (t == 2) pl.clear();
    });
    CHECK_THROWS_AS(other.load_state(empty_x0), commpact::error);
    for (std::int64_t n : {std::int64_t{-1}, std::int64_t{10}}) {
      auto bad_n = craft(good, "commpact.DataParallel", [n](std::uint32_t t, std::uint32_t type, bytes& pl) {
        if (t == 1 && type == 1) std::memcpy(pl.data() + 8, &n, 8);
      });
      CHECK_THROWS_AS(other.load_state(bad_n), commpact::error);
    }
    CHECK(saved(other) == fresh_state);  // nothing changed by the rejected loads
    // The valid state resumes: the next steps run (no crash in the parameter average).
    for (int t = 1; t < 4; ++t) {
      auto gg = normal(t, kN);
      CHECK_NOTHROW(fresh.step(std::span<float>(p), std::span<float>(gg), 0.1, sgd));
    }
  });
}

TEMPLATE_TEST_CASE("counters near INT64_MAX in a loaded state are rejected", "[state]", Dense<ThreadComm>,
                   TopK<ThreadComm>, gTopK<TreeComm<ThreadComm>>) {
  run_threads(1, [&](ThreadComm& comm) {
    auto c = make<TestType>(comm);
    auto g = normal(1, kN);
    c.reduce(std::span<float>(g));
    const bytes good = saved(c);
    const char* kind = std::is_same_v<TestType, Dense<ThreadComm>> ? "commpact.Dense"
                       : std::is_same_v<TestType, TopK<ThreadComm>> ? "commpact.TopK"
                                                                    : "commpact.gTopK";
    for (std::int64_t steps : {std::numeric_limits<std::int64_t>::max(), (std::int64_t{1} << 62) + 1}) {
      auto bad = craft(good, kind, [steps](std::uint32_t t, std::uint32_t type, bytes& pl) {
        if (t == 1 && type == 1) std::memcpy(pl.data(), &steps, 8);
      });
      CHECK_THROWS_AS(c.load_state(bad), wire_error);
    }
    CHECK(saved(c) == good);
  });
}

TEMPLATE_TEST_CASE("finite inputs whose mean overflows raise numeric_error, or skip, in every compressor",
                   "[nonfinite]", Dense<ThreadComm>, TopK<ThreadComm>, gTopK<TreeComm<ThreadComm>>,
                   (CodecCompressor<sign_codec, Allgather<ThreadComm>>),
                   (CodecCompressor<qsgd_codec, Allgather<ThreadComm>>),
                   (CodecCompressor<natural_codec, Allgather<ThreadComm>>)) {
  const int P = 4;
  const bool everywhere = GENERATE(false, true);  // 3e38 at one index, or FLT_MAX everywhere
  CAPTURE(everywhere);
  // The mean of 3e38 at one index over 4 ranks overflows for every compressor that sends
  // that value (Dense, TopK, gTopK, QSGD, natural); a scaled sign sends mean |v| and does
  // not overflow there. So: either numeric_error (skip_step: a skipped step), or a finite
  // output; FLT_MAX everywhere overflows for every compressor. Never Inf in the output.
  // Dense reduces in place: on a raise its gradient holds the sum (documented).
  constexpr bool in_place = std::is_same_v<TestType, Dense<ThreadComm>>;
  std::vector<int> raised(P, 0), skipped(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    auto input = [&] {
      std::vector<float> g = normal(comm.rank(), kN);
      if (everywhere) std::fill(g.begin(), g.end(), FLT_MAX);
      else g[7] = 3e38f;
      return g;
    };
    {
      auto c = make<TestType>(comm);
      auto g = input();
      const auto before = g;
      try {
        c.reduce(std::span<float>(g));
        raised[comm.rank()] = !everywhere && std::all_of(g.begin(), g.end(), [](float x) { return std::isfinite(x); });
      } catch (const numeric_error&) {
        raised[comm.rank()] = (in_place || g == before) && c.steps() == 0;
      }
    }
    {
      auto c = make<TestType>(comm);
      if constexpr (requires { c.opts().on_nonfinite; }) {
        auto opt = c.opts();
        opt.on_nonfinite = nonfinite::skip_step;
        if constexpr (std::is_same_v<TestType, TopK<ThreadComm>> || std::is_same_v<TestType, gTopK<TreeComm<ThreadComm>>>)
          c = TestType{comm, opt};
        else if constexpr (std::is_same_v<TestType, Dense<ThreadComm>>)
          c = TestType{comm, opt};
        else
          c = TestType{comm, typename TestType::codec_type(), opt};
        auto g = input();
        const bool kept = c.reduce(std::span<float>(g));
        const bool finite = std::all_of(g.begin(), g.end(), [](float x) { return std::isfinite(x); });
        skipped[comm.rank()] = kept ? !everywhere && finite && c.skipped_steps() == 0
                                    : g == std::vector<float>(kN, 0.0f) && c.skipped_steps() == 1;
      } else {
        skipped[comm.rank()] = 1;
      }
    }
  });
  for (int r = 0; r < P; ++r) {
    CHECK(raised[r] == 1);
    CHECK(skipped[r] == 1);
  }
}

TEMPLATE_TEST_CASE("one rank changing its gradient length raises mismatch_error on every rank",
                   "[errors]", TopK<ThreadComm>, gTopK<TreeComm<ThreadComm>>, Dense<ThreadComm>,
                   (CodecCompressor<sign_codec, Allgather<ThreadComm>>)) {
  const int P = 4;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    auto c = make<TestType>(comm);
    auto g = normal(comm.rank(), kN);
    c.reduce(std::span<float>(g));
    auto h = normal(9 + comm.rank(), comm.rank() == 2 ? kN + 5 : kN);
    try {
      c.reduce(std::span<float>(h));
    } catch (const mismatch_error&) {
      ok[comm.rank()] = 1;
    } catch (const commpact::error&) {
    }
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

namespace {
//! A codec whose decoder rejects rank 1's block (its payload byte is 13): a malformed
//! message as every rank sees it.
struct picky_codec {
  int rank = -1;
  void bind_rank(int r) { rank = r; }
  std::size_t max_encoded_bytes(std::size_t) const { return 4; }
  std::size_t encode(std::span<const float>, std::span<std::byte> msg, std::span<float> approx) const {
    msg[0] = std::byte{static_cast<unsigned char>(rank == 1 ? 13 : 1)};
    std::fill(approx.begin(), approx.end(), 0.0f);
    return 1;
  }
  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    if (msg.size() != 1 || msg[0] == std::byte{13}) throw wire_error("picky_codec: malformed block");
    for (auto& x : acc) x += 1.0f;
  }
};
}  // namespace

TEST_CASE("a malformed block raises wire_error on every rank and leaves the gradient untouched",
          "[errors]") {
  const int P = 3;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    CodecCompressor<picky_codec, Allgather<ThreadComm>> c{comm};
    auto g = normal(comm.rank(), kN);
    const auto before = g;
    try {
      c.reduce(std::span<float>(g));
    } catch (const wire_error&) {
      ok[comm.rank()] = g == before && c.steps() == 0;
    }
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("a parameter round that raises puts params, the optimizer state and grads back; the retry equals a "
          "clean run",
          "[transactional][data_parallel]") {
  // Rank 1's gradient holds a NaN at a round step: the average raises numeric_error on
  // every rank after the local update has written params and the momentum (Local SGD,
  // QSR), or after the one-step shortcut's sum has written grads (LocalSgd{1}). Every
  // rank retries: rank 1 with its clean gradient, the others with the buffer they passed.
  const int P = 3;
  const std::size_t n = 40;
  const std::int64_t steps = 8;
  const double lr = 0.1;
  const int which = GENERATE(0, 1, 2);
  const std::int64_t fail_at = which == 0 ? 1 : which == 1 ? 3 : 2;  // the last step of a period
  CAPTURE(which);
  auto run = [&](bool fail) {
    std::vector<std::vector<float>> out(P);
    run_threads(P, [&](ThreadComm& comm) {
      auto go = [&](auto policy) {
        DataParallel dp{Dense<ThreadComm>{comm}, policy, steps};
        Sgd opt{n, {.momentum = 0.9}};
        std::vector<float> x(n, 0.5f), g(n);
        for (std::int64_t t = 0; t < steps; ++t) {
          const auto clean = normal(static_cast<std::uint64_t>(100 * t + comm.rank()), n);
          g = clean;
          if (fail && t == fail_at) {
            if (comm.rank() == 1) g[7] = std::numeric_limits<float>::quiet_NaN();
            const auto x_before = x;
            const std::vector<float> v_before(opt.state().begin(), opt.state().end());
            RANK_REQUIRE_THROWS_AS_WITH(dp.step(x, g, lr, opt), numeric_error, "call step() again");
            RANK_REQUIRE(dp.steps() == t);
            if (comm.rank() == 1) {
              g = clean;
            } else {
              RANK_REQUIRE(g == clean);  // put back, so the buffer passed is retried as it is
            }
            RANK_REQUIRE(x == x_before);
            RANK_REQUIRE(std::equal(v_before.begin(), v_before.end(), opt.state().begin(), opt.state().end()));
          }
          dp.step(x, g, lr, opt);
        }
        out[comm.rank()] = x;
        out[comm.rank()].insert(out[comm.rank()].end(), opt.state().begin(), opt.state().end());
      };
      if (which == 0) go(LocalSgd{2});
      if (which == 1) go(QSRPolicy{0.2, 2, 0});  // H = max(2, floor((0.2 / 0.1)^2)) = 4
      if (which == 2) go(LocalSgd{1});           // one-step periods through the gradient
    });
    return out;
  };
  const auto clean = run(false), retried = run(true);
  for (int r = 0; r < P; ++r) CHECK(retried[r] == clean[r]);
}
