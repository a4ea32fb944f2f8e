// DataParallel and Sgd over an execution space: the training driver runs in
// its compressor's space (parameters, gradients, the parameters at a period's start and
// the averaged deltas are the space's buffers; the update is queued), so the same
// training loop runs over host_space and deferred_space. Checked against host_space, bit
// for bit on every rank: Dense under EveryStep, Local SGD (with and without the optimizer
// state averaged) and QSR; TopK and gTopK; compressed parameter deltas; a NaN in a
// parameter round raises alike on every rank and leaves the driver as it was; an update
// that raises is retried as if it had never run; a checkpoint taken inside a parameter
// period resumes exactly; and the deferred space shows the step's result only after a
// fence.
#include <catch2/catch.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <typeinfo>
#include <type_traits>
#include <vector>

#include "common/random.hpp"
#include "common/rank_checks.hpp"
#include "common/space_copies.hpp"

using namespace commpact;
using commpact_test::normal;
using commpact_test::same_bits;

namespace {

constexpr std::size_t n = 301;
using DC = DeferredComm<ThreadComm>;

// The rank's communicator in either space; every deferred communicator of a rank shares
// its one executor (as device work shares a stream).
template <bool Deferred>
auto make_comm(ThreadComm& c, const deferred_space::exec& e) {
  if constexpr (Deferred) return DC{c, e};
  else return c;
}

struct dense_case {
  template <class C>
  static auto make(C comm) {
    return Dense<C>{std::move(comm)};
  }
};
struct topk_case {
  template <class C>
  static auto make(C comm) {
    return TopK<C>{std::move(comm), {.density = 0.05}};
  }
};
struct gtopk_case {
  template <class C>
  static auto make(C comm) {
    return gTopK<TreeComm<C>>{std::move(comm), {.density = 0.05}};
  }
};

struct run_spec {
  int P = 2;
  std::int64_t steps = 12;
  data_parallel_options opt{};
  double momentum = 0.9;
  int nan_rank = -1;          // this rank's gradient holds a NaN at nan_step
  std::int64_t nan_step = -1;
  std::int64_t throw_step = -1;  // the update raises the first time it runs at this step
  std::int64_t save_at = -1;     // save before this step, then continue in a fresh driver
};

struct rank_result {
  std::vector<float> params, state;
  std::int64_t rounds = 0, skipped = 0, steps = 0;
  std::vector<std::string> errors;  // one entry per step that raised
};

double lr_at(std::int64_t t, std::int64_t T) { return 0.2 * (1.0 - 0.8 * static_cast<double>(t) / static_cast<double>(T)); }

// Trains spec.steps steps on every rank of a ThreadComm world, in host_space or the
// deferred space, with DataParallel<Case's compressor, Policy> and BasicSgd.
template <bool Deferred, class Case, class Policy>
std::vector<rank_result> train(const run_spec& spec, Policy policy) {
  std::vector<rank_result> out(static_cast<std::size_t>(spec.P));
  run_threads(spec.P, [&](ThreadComm& c) {
    auto& res = out[static_cast<std::size_t>(c.rank())];
    const auto ex = deferred_space::make_exec();
    using Driver = DataParallel<decltype(Case::make(make_comm<Deferred>(c, ex))), Policy>;
    using S = typename Driver::space_type;
    static_assert(std::is_same_v<S, std::conditional_t<Deferred, deferred_space, host_space>>);
    std::optional<Driver> dp;
    dp.emplace(Case::make(make_comm<Deferred>(c, ex)), policy, spec.steps, spec.opt);
    const auto e = comm_exec(dp->comm());
    BasicSgd<S> sgd{n, {.momentum = spec.momentum, .weight_decay = 1e-3}, e};
    typename S::template buffer<float> params, grads;
    params.resize(n);
    grads.resize(n);
    const auto x0 = normal(7, n);  // the same start on every rank
    ops<S>::from_host(e, std::span<const float>(x0), params.view());
    bool thrown = false, stop = false;
    for (std::int64_t t = 0; t < spec.steps && !stop; ++t) {
      if (t == spec.save_at) {  // checkpoint, then resume in a fresh driver
        std::vector<std::byte> blob;
        dp->save_state(blob);
        dp.emplace(Case::make(make_comm<Deferred>(c, ex)), policy, spec.steps, spec.opt);
        dp->load_state(blob);
      }
      auto g = normal(1000 + static_cast<std::uint64_t>(c.rank()) * 977 + static_cast<std::uint64_t>(t), n);
      if (c.rank() == spec.nan_rank && t == spec.nan_step) g[17] = std::numeric_limits<float>::quiet_NaN();
      for (int attempt = 0; attempt < 2; ++attempt) {
        ops<S>::from_host(e, std::span<const float>(g), grads.view());
        S::fence(e, no_deadline());  // g is a host temporary: the copy must run before it goes
        auto update = [&](typename S::template span<float> x, typename S::template span<const float> gr, double lr) {
          if (t == spec.throw_step && !thrown) {
            thrown = true;
            throw std::runtime_error("the user's update failed");
          }
          sgd(x, gr, lr);
        };
        struct with_state {  // the update with Sgd's state(), so the driver can average it
          decltype(update)& f;
          BasicSgd<S>& s;
          void operator()(typename S::template span<float> x, typename S::template span<const float> gr, double lr) {
            f(x, gr, lr);
          }
          auto state() { return s.state(); }
        } u{update, sgd};
        try {
          dp->step(params.view(), grads.view(), lr_at(t, spec.steps), u);
          break;
        } catch (const std::exception& ex) {
          S::fence(e, no_deadline());
          res.errors.push_back(std::string(typeid(ex).name()) + ": " + ex.what());
          stop = t == spec.nan_step;  // this rank's parameters hold the NaN now: the run ends
          if (stop) break;
        }
      }
    }
    res.params.resize(n);
    ops<S>::to_host(e, params.cview(), std::span<float>(res.params));
    const auto st = sgd.state();
    res.state.resize(st.size());
    ops<S>::to_host(e, typename S::template span<const float>(st), std::span<float>(res.state));
    S::fence(e, no_deadline());
    res.rounds = dp->rounds();
    res.skipped = dp->skipped_steps();
    res.steps = dp->steps();
  });
  return out;
}

// Host and deferred runs agree bit for bit, and every rank holds the same parameters
// after a run that ends with a synchronisation.
void check_same(const std::vector<rank_result>& h, const std::vector<rank_result>& d, bool ranks_equal = true) {
  REQUIRE(h.size() == d.size());
  for (std::size_t r = 0; r < h.size(); ++r) {
    INFO("rank " << r);
    CHECK(same_bits(h[r].params, d[r].params));
    CHECK(same_bits(h[r].state, d[r].state));
    CHECK(h[r].rounds == d[r].rounds);
    CHECK(h[r].skipped == d[r].skipped);
    CHECK(h[r].steps == d[r].steps);
    CHECK(h[r].errors.size() == d[r].errors.size());
    if (ranks_equal) CHECK(same_bits(h[r].params, h[0].params));
  }
  for (float x : h[0].params) REQUIRE(std::isfinite(x));
}

}  // namespace

TEST_CASE("DataParallel over the deferred space equals host_space bit for bit", "[space][train]") {
  {
    const int P = GENERATE(1, 2, 3, 4);
    INFO("P = " << P);
    run_spec s;
    s.P = P;
    SECTION("Dense, EveryStep") {
      check_same(train<false, dense_case>(s, EveryStep{}), train<true, dense_case>(s, EveryStep{}));
    }
    SECTION("Dense, Local SGD H = 3 (the run ends on a period boundary)") {
      check_same(train<false, dense_case>(s, LocalSgd{3}), train<true, dense_case>(s, LocalSgd{3}));
      s.opt.average_optimizer_state = true;
      check_same(train<false, dense_case>(s, LocalSgd{3}), train<true, dense_case>(s, LocalSgd{3}));
    }
    SECTION("Dense, QSR") {
      s.steps = 15;
      const QSRPolicy q{0.6, 2};
      const auto h = train<false, dense_case>(s, q);
      check_same(h, train<true, dense_case>(s, q), false);
      CHECK(h[0].rounds < s.steps);  // QSR took periods longer than one step
    }
    SECTION("TopK and gTopK, EveryStep") {
      check_same(train<false, topk_case>(s, EveryStep{}), train<true, topk_case>(s, EveryStep{}));
      check_same(train<false, gtopk_case>(s, EveryStep{}), train<true, gtopk_case>(s, EveryStep{}));
    }
    SECTION("TopK on compressed parameter deltas, Local SGD H = 2") {
      s.opt.compress_deltas = true;
      check_same(train<false, topk_case>(s, LocalSgd{2}), train<true, topk_case>(s, LocalSgd{2}));
    }
  }
}

TEST_CASE("DataParallel over the deferred space: failures and checkpoints as on the host", "[space][train]") {
  run_spec s;
  s.P = 3;
  SECTION("a NaN in a parameter round raises numeric_error on every rank and changes nothing") {
    s.nan_rank = 1;
    s.nan_step = 5;  // the last step of the second period: the delta's mean is not finite
    const auto h = train<false, dense_case>(s, LocalSgd{3});
    const auto d = train<true, dense_case>(s, LocalSgd{3});
    for (const auto* run : {&h, &d})
      for (const auto& r : *run) {
        REQUIRE(r.errors.size() == 1);
        CHECK(r.errors[0].find("not finite") != std::string::npos);
        CHECK(r.steps == s.nan_step);  // the failed step was not counted
        CHECK(r.rounds == 1);          // the first period's average only
      }
    check_same(h, d, false);
  }
  SECTION("an update that raises is retried as if it had never run") {
    s.throw_step = 4;
    const auto clean = train<false, dense_case>(run_spec{.P = 3}, LocalSgd{3});
    const auto h = train<false, dense_case>(s, LocalSgd{3});
    const auto d = train<true, dense_case>(s, LocalSgd{3});
    check_same(h, d);
    for (std::size_t r = 0; r < h.size(); ++r) {
      CHECK(h[r].errors.size() == 1);
      CHECK(same_bits(h[r].params, clean[r].params));
    }
    s.throw_step = 2;  // the step that closes a period (parameter average) and TopK's gradients
    check_same(train<false, topk_case>(s, EveryStep{}), train<true, topk_case>(s, EveryStep{}));
    const auto clean_topk = train<true, topk_case>(run_spec{.P = 3}, EveryStep{});
    const auto d_topk = train<true, topk_case>(s, EveryStep{});
    for (std::size_t r = 0; r < d_topk.size(); ++r) CHECK(same_bits(d_topk[r].params, clean_topk[r].params));
  }
  SECTION("a checkpoint inside a parameter period resumes exactly") {
    s.save_at = 4;  // inside the period [3, 6): the parameters at its start are in the state
    const auto clean = train<true, dense_case>(run_spec{.P = 3}, LocalSgd{3});
    const auto d = train<true, dense_case>(s, LocalSgd{3});
    check_same(train<false, dense_case>(s, LocalSgd{3}), d);
    for (std::size_t r = 0; r < d.size(); ++r) CHECK(same_bits(d[r].params, clean[r].params));
  }
}

TEST_CASE("DataParallel over the deferred space: the step's result shows only after a fence", "[space][train]") {
  run_threads(2, [](ThreadComm& c) {
    DataParallel dp{Dense<DC>{DC{c}}, EveryStep{}, 1};
    const auto e = comm_exec(dp.comm());
    BasicSgd<deferred_space> sgd{4, {}, e};
    const std::vector<float> x{1, 2, 3, 4}, g{1, 1, 1, 1};
    auto params = commpact_test::device_copy(e, x);
    auto grads = commpact_test::device_copy(e, g);
    dp.step(params.view(), grads.view(), 0.5, sgd);  // Dense's finish fenced; the update is queued
    std::vector<float> seen(4, -1.0f);
    ops<deferred_space>::to_host(e, params.cview(), std::span<float>(seen));
    for (float v : seen) RANK_REQUIRE(std::isnan(v));  // read before the fence: poison (nothing ran)
    deferred_space::fence(e, no_deadline());
    RANK_REQUIRE(seen == std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f});
  });
}

TEST_CASE("DataParallel with a second compressor on another executor joins the two (no host wait) and equals the "
          "host run bit for bit",
          "[space][train][join]") {
  constexpr std::size_t n = 40;
  constexpr std::int64_t T = 6;
  auto run = [&](auto make_comm, std::vector<std::vector<float>>& out) {
    run_threads(2, [&](ThreadComm& c) {
      auto ca = make_comm(c);
      auto cb = make_comm(c);  // another executor over the deferred space
      using Comm = decltype(ca);
      using S = comm_space_t<Comm>;
      DataParallel dp{TopK<Comm>{ca, {.density = 0.2}}, TopK<Comm>{cb, {.density = 0.2}}, LocalSgd{2}, T};
      const auto e = comm_exec(dp.comm());
      BasicSgd<S> sgd{n, {}, e};
      typename S::template buffer<float> params, grads;
      params.resize(n);
      grads.resize(n);
      const auto x0 = normal(5, n);
      ops<S>::from_host(e, std::span<const float>(x0), params.view());
      for (std::int64_t t = 0; t < T; ++t) {
        const auto g = normal(300 + static_cast<std::uint64_t>(c.rank()) * 31 + static_cast<std::uint64_t>(t), n);
        ops<S>::from_host(e, std::span<const float>(g), grads.view());
        S::fence(e, no_deadline());
        dp.step(params.view(), grads.view(), 0.1, sgd);
      }
      out[static_cast<std::size_t>(c.rank())] = copy_to_host<S>(e, params.cview());
    });
  };
  std::vector<std::vector<float>> host(2), deferred(2);
  run([](ThreadComm& c) { return c; }, host);
  REQUIRE_NOTHROW(run([](ThreadComm& c) { return DC{c}; }, deferred));
  for (int r = 0; r < 2; ++r) CHECK(same_bits(host[static_cast<std::size_t>(r)], deferred[static_cast<std::size_t>(r)]));
  CHECK(same_bits(host[0], host[1]));  // the run ends on a period boundary
}

TEST_CASE("Sgd: the ops row sgd_step is the host loop, in both spaces", "[space][train]") {
  for (double mu : {0.0, 0.9}) {
    const auto x = normal(3, 257), g = normal(4, 257);
    std::vector<float> xr = x, vr(mu > 0 ? 257 : 0, 0.0f);
    const float a = 0.05f, m = static_cast<float>(mu), wd = 1e-2f;
    for (int it = 0; it < 3; ++it)
      for (std::size_t i = 0; i < xr.size(); ++i) {  // the reference: PyTorch's SGD, float
        const float d = g[i] + wd * xr[i];
        if (mu > 0) {
          vr[i] = m * vr[i] + d;
          xr[i] -= a * vr[i];
        } else {
          xr[i] -= a * d;
        }
      }
    Sgd host_opt{257, {.momentum = mu, .weight_decay = 1e-2}};
    std::vector<float> xh = x;
    for (int it = 0; it < 3; ++it) host_opt(std::span<float>(xh), std::span<const float>(g), 0.05);
    CHECK(same_bits(xh, xr));
    auto e = deferred_space::make_exec();
    BasicSgd<deferred_space> dev_opt{257, {.momentum = mu, .weight_decay = 1e-2}, e};
    auto xd = commpact_test::device_copy(e, x);
    auto gd = commpact_test::device_copy(e, g);
    for (int it = 0; it < 3; ++it) dev_opt(xd.view(), gd.cview(), 0.05);
    CHECK(same_bits(commpact_test::host_copy(e, xd.cview()), xr));
  }
  CHECK_THROWS_AS(Sgd(4, {.momentum = 1.0}), invalid_argument);
}
