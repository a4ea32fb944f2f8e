// SyncPolicy models: the rules, QSR's periods against tables worked out by hand, the
// saturation of huge periods, and the errors for bad parameters.
#include <catch2/catch.hpp>
#include <commpact/sync/lr_schedule.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/sync/schedule.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "common/matchers.hpp"

using namespace commpact;
using commpact_test::MessageContains;
using mode = sync_plan::mode;

namespace {
std::vector<std::pair<std::int64_t, std::int64_t>> starts_and_lengths(const std::vector<sync_period>& ps) {
  std::vector<std::pair<std::int64_t, std::int64_t>> v;
  for (const auto& p : ps) v.emplace_back(p.start, p.length);
  return v;
}
constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
}  // namespace

TEST_CASE("EveryStep, LocalSgd and PostLocal follow their rules", "[sync]") {
  for (std::int64_t s : {0, 1, 7, 1000000}) {
    CHECK(EveryStep{}.plan(s, 0.1).what == mode::gradients);
    CHECK(EveryStep{}.plan(s, 0.1).period == 1);
    CHECK(LocalSgd{5}.plan(s, 0.1).what == mode::parameters);
    CHECK(LocalSgd{5}.plan(s, 0.1).period == 5);
  }
  const PostLocal pl{10, 4};
  for (std::int64_t s = 0; s < 10; ++s) {
    CHECK(pl.plan(s, 0.1).what == mode::gradients);
    CHECK(pl.plan(s, 0.1).period == 1);
  }
  for (std::int64_t s : {10, 11, 50}) {
    CHECK(pl.plan(s, 0.1).what == mode::parameters);
    CHECK(pl.plan(s, 0.1).period == 4);
  }
  // Over a run: 10 BSP steps, then periods of 4 from step 10, the last one cut at 23.
  const auto ps = plan_run(pl, ConstantLr{0.1}, 23);
  using P = std::pair<std::int64_t, std::int64_t>;
  CHECK(starts_and_lengths(ps) == std::vector<P>{{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1},
                                                  {8, 1}, {9, 1}, {10, 4}, {14, 4}, {18, 4}, {22, 1}});
  CHECK(count_rounds(ps) == 10 + 4);
  CHECK(round_steps(ps) == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17, 21, 22});
  CHECK(count_rounds(plan_run(EveryStep{}, ConstantLr{0.1}, 37)) == 37);
  CHECK(count_rounds(plan_run(LocalSgd{4}, ConstantLr{0.1}, 37)) == 10);  // 9 full periods and one of 1 step
  CHECK(plan_run(LocalSgd{4}, ConstantLr{0.1}, 0).empty());
}

TEST_CASE("QSR periods for a cosine schedule equal a table worked out by hand", "[sync][qsr]") {
  // lr: warm-up 0.1 (s+1)/10 for s < 10, then 0.05 (1 + cos(pi (s - 10) / 90)), 100 steps.
  // alpha = 0.25, so H = max(h_base, floor((0.25 / lr)^2)) after the warm-up.
  const WarmupCosineLr lr{0.1, 10, 100};
  using P = std::pair<std::int64_t, std::int64_t>;

  SECTION("h_base = 2: warm-up periods end at the warm-up's end") {
    // step  lr                                   (0.25/lr)^2      H
    //  0-8  warm-up                              -                2 (h_base)
    //  10   0.05 (1 + cos 0)        = 0.1        6.25             6
    //  16   0.05 (1 + cos 12 deg)   = 0.098907   6.3888           6
    //  22   0.05 (1 + cos 24 deg)   = 0.095677   6.8275           6
    //  28   0.05 (1 + cos 36 deg)   = 0.090451   7.6393           7
    //  35   0.05 (1 + cos 50 deg)   = 0.082139   9.2635           9
    //  44   0.05 (1 + cos 68 deg)   = 0.068730   13.2307          13
    //  57   0.05 (1 + cos 94 deg)   = 0.046512   28.8899          28
    //  85   0.05 (1 + cos 150 deg)  = 0.006699   1392.82          1392, cut to the 15 steps left
    const auto ps = plan_run(QSRPolicy{0.25, 2, 10}, lr, 100);
    CHECK(starts_and_lengths(ps) == std::vector<P>{{0, 2}, {2, 2}, {4, 2}, {6, 2}, {8, 2}, {10, 6}, {16, 6},
                                                    {22, 6}, {28, 7}, {35, 9}, {44, 13}, {57, 28}, {85, 15}});
    CHECK(count_rounds(ps) == 13);
    for (const auto& p : ps) CHECK(p.what == mode::parameters);
  }
  SECTION("h_base = 3: a warm-up period runs past the warm-up's end") {
    //  0-9  warm-up (9 < 10)                     -                3 (h_base): 9, 10, 11
    //  12   0.05 (1 + cos 4 deg)    = 0.099878   6.2653           6
    //  18   0.05 (1 + cos 16 deg)   = 0.098063   6.4993           6
    //  24   0.05 (1 + cos 28 deg)   = 0.094147   7.0512           7
    //  31   0.05 (1 + cos 42 deg)   = 0.087157   8.2276           8
    //  39   0.05 (1 + cos 58 deg)   = 0.076496   10.6808          10
    //  49   0.05 (1 + cos 78 deg)   = 0.060396   17.1344          17
    //  66   0.05 (1 + cos 112 deg)  = 0.031270   63.9195          63, cut to the 34 steps left
    const auto ps = plan_run(QSRPolicy{0.25, 3, 10}, lr, 100);
    CHECK(starts_and_lengths(ps) ==
          std::vector<P>{{0, 3}, {3, 3}, {6, 3}, {9, 3}, {12, 6}, {18, 6}, {24, 7}, {31, 8}, {39, 10}, {49, 17}, {66, 34}});
  }
  SECTION("a large h_base dominates the rule while the learning rate is high") {
    // h_base = 8, the run cut at 55 steps (the schedule still spans 100):
    //  0, 8 warm-up                                                 8 (h_base)
    //  16   0.05 (1 + cos 12 deg)   = 0.098907   6.3888           8 (h_base)
    //  24   0.05 (1 + cos 28 deg)   = 0.094147   7.0512           8 (h_base)
    //  32   0.05 (1 + cos 44 deg)   = 0.085967   8.4570           8
    //  40   0.05 (1 + cos 60 deg)   = 0.075      11.1111          11
    //  51   0.05 (1 + cos 82 deg)   = 0.056959   19.2646          19, cut to the 4 steps left
    const auto ps = plan_run(QSRPolicy{0.25, 8, 10}, lr, 55);
    CHECK(starts_and_lengths(ps) == std::vector<P>{{0, 8}, {8, 8}, {16, 8}, {24, 8}, {32, 8}, {40, 11}, {51, 4}});
  }
}

TEST_CASE("QSR: single decisions, warm-up and alpha = 0", "[sync][qsr]") {
  const QSRPolicy vit{0.0175, 4, 500};  // the paper's ViT-B setting
  CHECK(vit.plan(1000, 0.008).period == 4);   // (0.0175 / 0.008)^2 = 4.785
  CHECK(vit.plan(1000, 0.004).period == 19);  // 4.375^2 = 19.14
  CHECK(vit.plan(1000, 0.001).period == 306);  // 17.5^2 = 306.25
  CHECK(vit.plan(499, 1e-6).period == 4);     // warm-up: h_base whatever the rate
  CHECK(vit.plan(500, 1e-5).period == 3062500);  // 1750^2
  CHECK(QSRPolicy{0.0, 3, 0}.plan(5, 1e-9).period == 3);
  CHECK(QSRPolicy{0.25, 2}.warmup() == 0);
  // floor(q * q) in doubles, as Python's math.floor((alpha / lr) ** 2) (docs/sync.md):
  // 0.3 / 0.1 = 2.9999999999999996, so 8; 0.5 / 0.25 = 2 exactly, so 4.
  CHECK(QSRPolicy{0.3, 1, 0}.plan(0, 0.1).period == 8);
  CHECK(QSRPolicy{0.5, 1, 0}.plan(0, 0.25).period == 4);
}

TEST_CASE("QSR saturates huge periods instead of overflowing", "[sync][qsr]") {
  const QSRPolicy q{1.0, 1, 0};
  CHECK(q.plan(0, std::ldexp(1.0, -31)).period == (std::int64_t{1} << 62));  // 2^62, exact
  CHECK(q.plan(0, std::ldexp(1.0, -32)).period == kMax);                      // 2^64 does not fit
  CHECK(q.plan(0, 1e-10).period == kMax);                                     // 1e20
  CHECK(q.plan(0, std::numeric_limits<double>::denorm_min()).period == kMax);  // alpha / lr = inf
  CHECK(QSRPolicy{1e300, 1, 0}.plan(0, 1e-300).period == kMax);
  // The caller cuts a saturated period at the end of the run.
  const auto ps = plan_run(q, [](std::int64_t) { return 1e-30; }, 1000);
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].length == 1000);
  // A learning rate of 0 (a schedule that ends there): the period runs to the end of the
  // run; h_base during the warm-up and for alpha = 0.
  CHECK(q.plan(7, 0.0).period == kMax);
  CHECK(QSRPolicy{0.1, 2, 10}.plan(5, 0.0).period == 2);
  CHECK(QSRPolicy{0.0, 3, 0}.plan(5, 0.0).period == 3);
  // A schedule that drops to 0 at step 300 of 400: periods of 2 ((0.15 / 0.1)^2 = 2.25)
  // until then, and one period of the last 100 steps.
  const std::int64_t T = 400;
  const auto drop = plan_run(QSRPolicy{0.15, 2, 0}, [](std::int64_t s) { return s < 300 ? 0.1 : 0.0; }, T);
  REQUIRE(drop.size() == 151);
  std::int64_t at = 0;
  for (std::size_t i = 0; i < 150; ++i) {
    CHECK(drop[i].start == at);
    CHECK(drop[i].length == 2);
    at += 2;
  }
  CHECK(drop[150].start == 300);
  CHECK(drop[150].length == 100);
  at += drop[150].length;
  CHECK(at == T);
}

TEST_CASE("Policies are pure: copies decide alike", "[sync]") {
  const QSRPolicy a{0.25, 2, 10};
  const QSRPolicy b = a;
  const WarmupCosineLr lr{0.1, 10, 100};
  for (std::int64_t s = 0; s < 100; ++s) {
    CHECK(a.plan(s, lr(s)).period == b.plan(s, lr(s)).period);
    CHECK(a.plan(s, lr(s)).period == a.plan(s, lr(s)).period);
  }
}

TEST_CASE("Bad policy parameters are errors that name the value and the rule", "[sync][errors]") {
  CHECK_THROWS_MATCHES(QSRPolicy(-0.1, 4, 0), invalid_argument, MessageContains({"alpha = -0.1", ">= 0"}));
  CHECK_THROWS_AS(QSRPolicy(std::nan(""), 4, 0), invalid_argument);
  CHECK_THROWS_AS(QSRPolicy(HUGE_VAL, 4, 0), invalid_argument);
  CHECK_THROWS_MATCHES(QSRPolicy(0.1, 0, 0), invalid_argument, MessageContains({"h_base = 0", "at least 1"}));
  CHECK_THROWS_MATCHES(QSRPolicy(0.1, 2, -5), invalid_argument, MessageContains({"warmup = -5"}));
  const QSRPolicy q{0.1, 2, 10};
  CHECK_THROWS_MATCHES(q.plan(20, -0.5), invalid_argument, MessageContains({"-0.5", "lr >= 0"}));
  CHECK_THROWS_AS(q.plan(20, std::nan("")), invalid_argument);
  CHECK_THROWS_AS(q.plan(20, HUGE_VAL), invalid_argument);
  CHECK_THROWS_AS(q.plan(5, -1e-9), invalid_argument);  // also in the warm-up
  CHECK_THROWS_MATCHES(q.plan(-1, 0.1), invalid_argument, MessageContains({"step -1"}));
  // Warm-up beyond the run, when the run's length is known.
  CHECK_THROWS_MATCHES(q.check_run(9), invalid_argument, MessageContains({"warmup = 10", "9 steps"}));
  CHECK_NOTHROW(q.check_run(10));
  CHECK_THROWS_AS(plan_run(q, ConstantLr{0.1}, 9), invalid_argument);
  CHECK_THROWS_AS(check_run(q, -1), invalid_argument);

  CHECK_THROWS_MATCHES(LocalSgd(0), invalid_argument, MessageContains({"H = 0", "at least 1"}));
  CHECK_THROWS_AS(LocalSgd(-3), invalid_argument);
  CHECK_THROWS_MATCHES(PostLocal(-1, 4), invalid_argument, MessageContains({"switch_step = -1"}));
  CHECK_THROWS_MATCHES(PostLocal(5, 0), invalid_argument, MessageContains({"H = 0"}));
  CHECK_THROWS_MATCHES(PostLocal(50, 4).check_run(49), invalid_argument,
                       MessageContains({"switch_step = 50", "EveryStep"}));
  CHECK_NOTHROW(PostLocal(50, 4).check_run(50));
  CHECK_THROWS_AS(EveryStep{}.plan(-2, 0.1), invalid_argument);
}

namespace {
// A user policy with a bad answer: the caller names it.
struct ZeroPeriod {
  sync_plan plan(std::int64_t, double) const { return {mode::parameters, 0}; }
};
}  // namespace

TEST_CASE("A policy that answers a period below 1 is an error", "[sync][errors]") {
  CHECK_THROWS_MATCHES(plan_run(ZeroPeriod{}, ConstantLr{0.1}, 10), invalid_argument,
                       MessageContains({"period 0", "at least 1"}));
}

TEST_CASE("QSR takes its warm-up from the learning-rate schedule, or rejects one that disagrees",
          "[sync][qsr][warmup]") {
  const WarmupCosineLr cosine{0.008, 500, 10000};
  const WarmupLinearLr linear{0.1, 37, 400};
  const StepDecayLr steps{0.4, 0.5, 10, 4};
  // Built from the schedule: the warm-ups agree by construction.
  CHECK(QSRPolicy(0.0175, 4, cosine).warmup() == 500);
  CHECK(QSRPolicy(0.0175, 4, linear).warmup() == 37);
  CHECK(QSRPolicy(0.0175, 4, steps).warmup() == 4);
  CHECK(QSRPolicy(0.0175, 4, cosine).alpha() == 0.0175);
  CHECK(QSRPolicy(0.0175, 4, cosine).h_base() == 4);
  // ... and plan exactly as the explicit warm-up does.
  CHECK(plan_run(QSRPolicy(0.0175, 4, cosine), cosine, 10000) == plan_run(QSRPolicy{0.0175, 4, 500}, cosine, 10000));
  CHECK(plan_run(QSRPolicy(0.3, 2, linear), linear, 400) == plan_run(QSRPolicy{0.3, 2, 37}, linear, 400));

  // A disagreement: QSR warm-up 0 under a 500-step learning-rate warm-up. Unchecked, the
  // first period would be decided at lr(0) = 0.008 / 500 and last (0.0175 / 1.6e-5)^2 steps.
  const QSRPolicy no_warmup{0.0175, 4, 0};
  CHECK(no_warmup.plan(0, cosine(0)).period > 10000);
  CHECK_THROWS_MATCHES(plan_run(no_warmup, cosine, 10000), invalid_argument,
                       MessageContains({"warmup = 0", "over 500 steps", "QSRPolicy{alpha, h_base, lr}"}));
  CHECK_THROWS_MATCHES(check_schedule(no_warmup, cosine), invalid_argument, MessageContains({"warmup = 0"}));
  CHECK_THROWS_AS(check_schedule(QSRPolicy{0.0175, 4, 501}, cosine), invalid_argument);
  CHECK_THROWS_AS(check_schedule(QSRPolicy{0.0175, 4, 36}, linear), invalid_argument);
  CHECK_THROWS_AS(plan_run(QSRPolicy{0.25, 2, 5}, steps, 100), invalid_argument);
  CHECK_NOTHROW(check_schedule(QSRPolicy{0.0175, 4, 500}, cosine));
  // A schedule that does not say its warm-up (a lambda, ConstantLr) is not checked, and
  // policies without a warm-up accept any schedule.
  CHECK_NOTHROW(plan_run(QSRPolicy{0.25, 2, 3}, [](std::int64_t) { return 0.1; }, 20));
  CHECK_NOTHROW(plan_run(QSRPolicy{0.25, 2, 3}, ConstantLr{0.1}, 20));
  CHECK_NOTHROW(plan_run(LocalSgd{4}, cosine, 1000));
  CHECK_NOTHROW(plan_run(PostLocal{100, 4}, cosine, 1000));
}
