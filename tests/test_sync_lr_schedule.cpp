// Learning-rate schedules: values worked out by hand, shape over a run, bad parameters.
#include <catch2/catch.hpp>
#include <commpact/sync/lr_schedule.hpp>

#include <cmath>
#include <cstdint>

#include "common/matchers.hpp"

using namespace commpact;
using commpact_test::MessageContains;

namespace {
Approx exact(double v) { return Approx(v).epsilon(1e-12).margin(1e-15); }
}  // namespace

TEST_CASE("Constant", "[sync][lr]") {
  const ConstantLr lr{0.05};
  CHECK(lr(0) == 0.05);
  CHECK(lr(123456789) == 0.05);
}

TEST_CASE("Linear warm-up then cosine decay", "[sync][lr]") {
  const WarmupCosineLr lr{0.1, 10, 100};
  CHECK(lr(0) == exact(0.01));  // 0.1 * 1 / 10
  CHECK(lr(4) == exact(0.05));
  CHECK(lr(9) == exact(0.1));
  CHECK(lr(10) == exact(0.1));   // cos 0
  CHECK(lr(40) == exact(0.075));  // t = 1/3: 0.05 (1 + cos 60 deg)
  CHECK(lr(55) == exact(0.05));  // t = 1/2: cos 90 deg = 0
  CHECK(lr(70) == exact(0.025));  // t = 2/3: 0.05 (1 + cos 120 deg)
  CHECK(lr(99) == exact(0.05 * (1 - std::cos(3.14159265358979323846 / 90))));  // 1 - cos 2 deg
  CHECK(lr(99) > 0);
  CHECK(lr(100) == 0.0);
  CHECK(lr(1000) == 0.0);
  for (std::int64_t s = 10; s < 99; ++s) CHECK(lr(s + 1) < lr(s));
  for (std::int64_t s = 0; s < 9; ++s) CHECK(lr(s + 1) > lr(s));

  const WarmupCosineLr floor{0.1, 0, 100, 0.001};
  CHECK(floor(0) == exact(0.1));
  CHECK(floor(50) == exact(0.001 + 0.5 * 0.099));
  CHECK(floor(100) == exact(0.001));
  CHECK(floor.peak() == 0.1);
  CHECK(floor.total() == 100);
}

TEST_CASE("Linear warm-up then linear decay", "[sync][lr]") {
  const WarmupLinearLr lr{0.2, 20, 120, 0.0};
  CHECK(lr(0) == exact(0.01));
  CHECK(lr(19) == exact(0.2));
  CHECK(lr(20) == exact(0.2));
  CHECK(lr(70) == exact(0.1));
  CHECK(lr(119) == exact(0.002));
  CHECK(lr(120) == 0.0);
  const WarmupLinearLr to_floor{1.0, 0, 10, 0.5};
  CHECK(to_floor(5) == exact(0.75));
}

TEST_CASE("Step decay", "[sync][lr]") {
  const StepDecayLr lr{0.1, 0.1, 30};
  CHECK(lr(0) == exact(0.1));
  CHECK(lr(29) == exact(0.1));
  CHECK(lr(30) == exact(0.01));
  CHECK(lr(89) == exact(0.001));
  CHECK(lr(90) == exact(0.0001));
  const StepDecayLr warm{0.4, 0.5, 10, 4};
  CHECK(warm(0) == exact(0.1));
  CHECK(warm(3) == exact(0.4));
  CHECK(warm(13) == exact(0.4));
  CHECK(warm(14) == exact(0.2));
}

TEST_CASE("Bad schedule parameters are errors", "[sync][lr][errors]") {
  CHECK_THROWS_MATCHES(ConstantLr(0.0), invalid_argument, MessageContains({"lr = 0", "> 0"}));
  CHECK_THROWS_AS(ConstantLr(std::nan("")), invalid_argument);
  CHECK_THROWS_MATCHES(WarmupCosineLr(-0.1, 0, 10), invalid_argument, MessageContains({"peak = -0.1"}));
  CHECK_THROWS_MATCHES(WarmupCosineLr(0.1, 10, 10), invalid_argument, MessageContains({"total = 10", "warmup = 10"}));
  CHECK_THROWS_MATCHES(WarmupCosineLr(0.1, -1, 10), invalid_argument, MessageContains({"warmup = -1"}));
  CHECK_THROWS_MATCHES(WarmupCosineLr(0.1, 0, 10, 0.2), invalid_argument, MessageContains({"final = 0.2"}));
  CHECK_THROWS_AS(WarmupCosineLr(0.1, 0, 10, -0.01), invalid_argument);
  CHECK_THROWS_AS(WarmupLinearLr(0.1, 5, 3), invalid_argument);
  CHECK_THROWS_AS(WarmupLinearLr(HUGE_VAL, 0, 3), invalid_argument);
  CHECK_THROWS_MATCHES(StepDecayLr(0.1, 1.5, 10), invalid_argument, MessageContains({"gamma = 1.5"}));
  CHECK_THROWS_AS(StepDecayLr(0.1, 0.0, 10), invalid_argument);
  CHECK_THROWS_MATCHES(StepDecayLr(0.1, 0.1, 0), invalid_argument, MessageContains({"every = 0"}));
  CHECK_THROWS_AS(StepDecayLr(0.1, 0.1, 10, -2), invalid_argument);
  CHECK_THROWS_MATCHES(WarmupCosineLr(0.1, 0, 10)(-1), invalid_argument, MessageContains({"step -1"}));
  CHECK_THROWS_AS(ConstantLr(0.1)(-1), invalid_argument);
  CHECK_THROWS_AS(StepDecayLr(0.1, 0.1, 10)(-1), invalid_argument);
}
