// DataParallel on ThreadComm, P in {1, 2, 3, 4, 8}: the rounds it performs equal the
// policy's schedule (QSR's from the hand table), LocalSgd{1} equals EveryStep with Dense
// bit for bit, Local SGD equals a serial reference written here, PostLocal switches at
// its step, every rank decides alike and holds the same parameters after each round,
// the bytes counted by CountingComm follow the ring formula, bad input is an error.
//
// Catch2 is not thread-safe, so ranks record what they see and the main thread checks.
// The checks that run on any communicator live in tests/common/data_parallel_checks.hpp
// and run under MPI too (tests/mpi/test_train_data_parallel_mpi.cpp).
// Multi-rank cases run under CheckedComm<ThreadComm> (tests/common/checked_runs.hpp).
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/sync/lr_schedule.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/sync/schedule.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <vector>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

#include "common/checked_runs.hpp"
#include "common/data_parallel_checks.hpp"
#include "common/matchers.hpp"

using namespace commpact;
using commpact_test::MessageContains;

namespace {

using commpact_test::bitwise_equal;
using commpact_test::gradient;
using commpact_test::hash_floats;
using commpact_test::initial_params;
using commpact_test::rank_result;
using commpact_test::run_config;
const thread_options quick{std::chrono::seconds(60)};

// Trains on every rank of a ThreadComm world of P ranks; returns each rank's record.
template <class Policy, class Lr>
std::vector<rank_result> train(int P, const Policy& policy, const Lr& lr, const run_config& cfg) {
  std::vector<rank_result> out(P);
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    out[comm.rank()] = commpact_test::train_rank(comm, policy, lr, cfg);
  });
  return out;
}

void check_consistent(const std::vector<rank_result>& rs) {
  for (const auto& r : rs) {
    CHECK(r.round_steps == rs[0].round_steps);  // every rank decided alike
    CHECK(bitwise_equal(r.params, rs[0].params));
    for (char same : r.same_after_round) CHECK(same);
    CHECK(r.same_after_round.size() == r.round_steps.size());
  }
}

}  // namespace

TEST_CASE("DataParallel performs the rounds of QSR's hand-computed schedule", "[train][data_parallel][qsr]") {
  const int P = GENERATE(1, 2, 3, 4, 8);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_qsr_hand_schedule(comm); }, quick));
}

TEST_CASE("DataParallel's rounds equal the policy's schedule", "[train][data_parallel]") {
  const int P = GENERATE(1, 2, 3, 4, 8);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_rounds_equal_schedule(comm); }, quick));
}

TEST_CASE("LocalSgd{1} equals EveryStep with Dense bit for bit", "[train][data_parallel][bitwise]") {
  const int P = GENERATE(1, 2, 3, 4, 8);
  const bool average_state = GENERATE(false, true);
  const double momentum = GENERATE(0.0, 0.9);
  CAPTURE(P, average_state, momentum);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P,
      [&](commpact_test::checked_thread_comm& comm) {
        commpact_test::check_localsgd1_equals_everystep(comm, average_state, momentum);
      },
      quick));
}

TEST_CASE("Local SGD and QSR equal a serial reference of Local SGD", "[train][data_parallel]") {
  const int P = GENERATE(1, 2, 3, 4, 8);
  const bool average_state = GENERATE(false, true);
  run_config cfg;
  cfg.T = 40;
  cfg.opt.average_optimizer_state = average_state;
  const WarmupCosineLr lr{0.1, 4, 40};
  SECTION("LocalSgd{4}") {
    const auto rs = train(P, LocalSgd{4}, lr, cfg);
    check_consistent(rs);
    CHECK(bitwise_equal(rs[0].params, commpact_test::serial_local_sgd(P, plan_run(LocalSgd{4}, lr, 40), lr, cfg)));
    CHECK(rs[0].state_rounds == (average_state ? 10 : 0));
  }
  SECTION("QSR (periods 3 in the warm-up, then growing)") {
    const QSRPolicy q{0.3, 3, 4};
    const auto periods = plan_run(q, lr, 40);
    REQUIRE(periods.size() >= 4);
    const auto rs = train(P, q, lr, cfg);
    check_consistent(rs);
    CHECK(bitwise_equal(rs[0].params, commpact_test::serial_local_sgd(P, periods, lr, cfg)));
  }
  SECTION("compress_deltas through Dense gives the same bits as dense averaging") {
    run_config c2 = cfg;
    c2.opt.compress_deltas = true;
    const auto dense = train(P, LocalSgd{4}, lr, cfg);
    const auto through = train(P, LocalSgd{4}, lr, c2);
    check_consistent(through);
    CHECK(bitwise_equal(dense[0].params, through[0].params));
    CHECK(through[0].compressor_steps == 10);
    CHECK(dense[0].compressor_steps == 0);
  }
}

TEST_CASE("One-step periods keep each rank's momentum: they average deltas unless the state is averaged",
          "[train][data_parallel]") {
  // QSR with h_base 1: periods of 1 during the warm-up, then longer ones. With momentum
  // per rank (Local SGD's definition) a one-step period is a local step and an average of
  // deltas, so the 3-step period after it starts from each rank's own momentum: the
  // serial reference, bit for bit. Synchronising it through the mean gradient would give
  // every rank the mean momentum (another run).
  // With average_optimizer_state every one-step period goes through the gradient.
  const int P = GENERATE(2, 3, 4);
  const bool average_state = GENERATE(false, true);
  CAPTURE(P, average_state);
  run_config cfg;
  cfg.T = 30;
  cfg.opt.average_optimizer_state = average_state;
  struct OneThreeOne {  // 1-step periods for steps < 5, then 3 steps, then 1-step periods again
    sync_plan plan(std::int64_t s, double) const {
      return {sync_plan::mode::parameters, (s >= 5 && s < 14) ? 3 : 1};
    }
  };
  const ConstantLr lr{0.05};
  const auto rs = train(P, OneThreeOne{}, lr, cfg);
  check_consistent(rs);
  CHECK(rs[0].parameter_rounds == 5 + 3 + 16);
  if (average_state) {
    CHECK(rs[0].shortcuts == 5 + 16);
  } else {
    CHECK(rs[0].shortcuts == 0);
    CHECK(bitwise_equal(rs[0].params, commpact_test::serial_local_sgd(P, plan_run(OneThreeOne{}, lr, 30), lr, cfg)));
  }
}

TEST_CASE("PostLocal switches to Local SGD exactly at its step", "[train][data_parallel]") {
  const int P = GENERATE(1, 2, 3, 4, 8);
  run_config cfg;
  cfg.T = 20;
  const ConstantLr lr{0.05};
  const auto rs = train(P, PostLocal{7, 3}, lr, cfg);
  check_consistent(rs);
  CHECK(rs[0].round_steps == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 9, 12, 15, 18, 19});
  CHECK(rs[0].gradient_rounds == 7);
  CHECK(rs[0].compressor_steps == 7);  // gradients go through the compressor until the switch
  CHECK(rs[0].parameter_rounds == 5);
  // Until the switch it is EveryStep: the same bits as EveryStep's first 7 steps.
  run_config seven = cfg;
  seven.T = 7;
  const auto bsp = train(P, EveryStep{}, lr, seven);
  run_config post7 = cfg;
  post7.T = 7;
  const auto pl = train(P, PostLocal{7, 3}, lr, post7);
  CHECK(bitwise_equal(pl[0].params, bsp[0].params));
}

TEST_CASE("Bytes counted by CountingComm follow the ring formula", "[train][data_parallel][bytes]") {
  const int P = GENERATE(1, 2, 3, 4, 8);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_data_parallel_bytes(comm); }, quick));
}

TEST_CASE("DataParallel with PowerCompressor keeps every rank identical (gradients and compressed deltas)",
          "[train][data_parallel][compress]") {
  const int P = GENERATE(1, 2, 3, 4, 8);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_data_parallel_powersgd(comm); }, quick));
}

TEST_CASE("An empty optimizer state is not averaged: no check, no collective", "[train][data_parallel][bytes]") {
  // Sgd without momentum has an empty state(): average_optimizer_state has nothing to
  // send, so the run's bytes and messages are those of the run without it.
  const int P = GENERATE(2, 3);
  CAPTURE(P);
  using Counted = CountingComm<ThreadComm>;
  auto run = [&](bool average_state) {
    std::vector<std::uint64_t> out(2 * P);
    std::vector<std::int64_t> state_rounds(P);
    run_threads(P, [&](ThreadComm& comm) {
      DataParallel dp{Dense<Counted>{Counted{comm}}, LocalSgd{4}, 12, {.average_optimizer_state = average_state}};
      Sgd sgd{37};
      auto x = initial_params(37);
      std::vector<float> g(37);
      for (std::int64_t t = 0; t < 12; ++t) {
        gradient(x, g, comm.rank(), t);
        dp.step(x, g, 0.05, sgd);
      }
      out[2 * comm.rank()] = dp.comm().stats().bytes_sent;
      out[2 * comm.rank() + 1] = dp.comm().stats().messages_sent;
      state_rounds[comm.rank()] = dp.state_rounds();
    });
    return std::pair{out, state_rounds};
  };
  REQUIRE(Sgd{37}.state().empty());
  const auto [with, with_rounds] = run(true);
  const auto [without, without_rounds] = run(false);
  CHECK(with == without);
  CHECK(with_rounds == std::vector<std::int64_t>(P, 0));
}

TEST_CASE("verify_plans catches ranks that decide differently; none hangs", "[train][data_parallel][errors]") {
  const int P = GENERATE(2, 3, 4);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_verify_plans_mismatch(comm); }, quick));
}

TEST_CASE("Ranks whose policies differ raise at their first round without verify_plans; none hangs",
          "[train][data_parallel][errors]") {
  const int P = GENERATE(2, 3, 4);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_first_round_mismatch(comm); }, quick));
}

TEST_CASE("DataParallel rejects bad input", "[train][data_parallel][errors]") {
  auto comms = ThreadComm::make_world(1);
  std::vector<float> x(8, 1.f), g(8, 0.1f), short_g(7, 0.f);
  Sgd sgd{8};
  SECTION("a step past the run") {
    DataParallel dp{Dense<ThreadComm>{comms[0]}, EveryStep{}, 2};
    dp.step(x, g, 0.1, sgd);
    dp.step(x, g, 0.1, sgd);
    CHECK_THROWS_MATCHES(dp.step(x, g, 0.1, sgd), invalid_argument, MessageContains({"past the run of 2 steps"}));
  }
  SECTION("parameters and gradients of different lengths") {
    DataParallel dp{Dense<ThreadComm>{comms[0]}, EveryStep{}, 2};
    CHECK_THROWS_MATCHES(dp.step(x, short_g, 0.1, sgd), invalid_argument, MessageContains({"8 parameters but 7"}));
  }
  SECTION("a parameter buffer that changes length") {
    DataParallel dp{Dense<ThreadComm>{comms[0]}, LocalSgd{2}, 4};
    dp.step(x, g, 0.1, sgd);
    std::vector<float> x7(7), g7(7);
    CHECK_THROWS_AS(dp.step(x7, g7, 0.1, sgd), invalid_argument);
  }
  SECTION("averaging optimizer state that the update does not expose") {
    DataParallel dp{Dense<ThreadComm>{comms[0]}, LocalSgd{2}, 4, {.average_optimizer_state = true}};
    auto plain = [](std::span<float> p, std::span<const float> gr, double lr) {
      for (std::size_t i = 0; i < p.size(); ++i) p[i] -= static_cast<float>(lr) * gr[i];
    };
    CHECK_THROWS_MATCHES(dp.step(x, g, 0.1, plain), invalid_argument, MessageContains({"state()"}));
  }
  SECTION("a warm-up longer than the run") {
    CHECK_THROWS_MATCHES((DataParallel{Dense<ThreadComm>{comms[0]}, QSRPolicy{0.1, 2, 50}, 40}), invalid_argument,
                         MessageContains({"warmup = 50"}));
  }
  SECTION("a non-finite or negative learning rate under QSR (0 is a schedule's end, and allowed)") {
    DataParallel dp{Dense<ThreadComm>{comms[0]}, QSRPolicy{0.1, 2, 0}, 4};
    CHECK_THROWS_AS(dp.step(x, g, std::nan(""), sgd), invalid_argument);
    CHECK_THROWS_MATCHES(dp.step(x, g, -0.1, sgd), invalid_argument, MessageContains({"lr >= 0"}));
  }
  SECTION("a negative run length") {
    CHECK_THROWS_AS((DataParallel{Dense<ThreadComm>{comms[0]}, EveryStep{}, -1}), invalid_argument);
  }
  SECTION("non-finite parameters in an averaging round raise numeric_error") {
    DataParallel dp{Dense<ThreadComm>{comms[0]}, LocalSgd{2}, 4};
    dp.step(x, g, 0.1, sgd);
    std::vector<float> bad_g(8, std::numeric_limits<float>::infinity());
    CHECK_THROWS_AS(dp.step(x, bad_g, 0.1, sgd), numeric_error);
  }
  SECTION("a NaN gradient at a local step reaches the next round, which says that a retry cannot clear that") {
    DataParallel dp{Dense<ThreadComm>{comms[0]}, LocalSgd{2}, 4};
    std::vector<float> nan_g(8, std::numeric_limits<float>::quiet_NaN());
    CHECK_FALSE(dp.step(x, nan_g, 0.1, sgd));  // a local step: the user's update writes the NaN
    const auto before = x;
    for (int attempt = 0; attempt < 2; ++attempt) {
      CHECK_THROWS_MATCHES(dp.step(x, g, 0.1, sgd), numeric_error,
                           MessageContains({"summed parameter delta is not finite",
                                            "from a local step earlier in the period, which a retry cannot clear",
                                            "reload a checkpoint"}));
      CHECK(dp.steps() == 1);
      CHECK(std::equal(x.begin(), x.end(), before.begin(), before.end(),
                       [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }));
    }
  }
  SECTION("a NaN gradient at a gradient round is this step's input: the message says to call step() again") {
    DataParallel dp{Dense<ThreadComm>{comms[0]}, LocalSgd{1}, 4};  // a one-step period goes through the gradient
    std::vector<float> nan_g(8, std::numeric_limits<float>::quiet_NaN());
    CHECK_THROWS_MATCHES(dp.step(x, nan_g, 0.1, sgd), numeric_error,
                         MessageContains({"summed gradient is not finite", "call step() again"}));
  }
}

TEST_CASE("A user update function without state works and matches Sgd without momentum",
          "[train][data_parallel]") {
  const int P = GENERATE(1, 3);
  const std::size_t n = 16;
  std::vector<std::vector<float>> with_lambda(P), with_sgd(P);
  for (int variant = 0; variant < 2; ++variant) {
    run_threads(P, [&](ThreadComm& comm) {
      DataParallel dp{Dense<ThreadComm>{comm}, LocalSgd{3}, 12};
      Sgd sgd{n};
      auto plain = [](std::span<float> p, std::span<const float> gr, double lr) {
        const float a = static_cast<float>(lr);
        for (std::size_t i = 0; i < p.size(); ++i) p[i] -= a * (gr[i] + 0.0f * p[i]);
      };
      auto x = initial_params(n);
      std::vector<float> g(n);
      for (std::int64_t t = 0; t < 12; ++t) {
        gradient(x, g, comm.rank(), t);
        if (variant == 0) dp.step(x, g, 0.05, plain);
        else dp.step(x, g, 0.05, sgd);
      }
      (variant == 0 ? with_lambda : with_sgd)[comm.rank()] = x;
    });
  }
  for (int r = 0; r < P; ++r) CHECK(bitwise_equal(with_lambda[r], with_sgd[0]));
}

namespace {
// A compressor with error feedback for the compressed-delta path: round k sends the entries
// with i % 2 == k % 2 of (input + residual), averaged over the ranks, and keeps the others in
// its residual. It records its last input and output.
template <class Comm>
class AlternatingHalf {
 public:
  explicit AlternatingHalf(Comm comm) : comm_(std::move(comm)) {}
  bool reduce(std::span<float> v) {
    residual.resize(v.size());
    last_in.assign(v.begin(), v.end());
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float acc = v[i] + residual[i];
      const bool send = static_cast<std::int64_t>(i % 2) == calls % 2;
      v[i] = send ? acc : 0.0f;
      residual[i] = send ? 0.0f : acc;
    }
    comm_.allreduce(v, reduce_op::sum);
    for (auto& x : v) x /= static_cast<float>(comm_.size());
    last_out.assign(v.begin(), v.end());
    ++calls;
    return true;
  }
  void save_state(std::vector<std::byte>&) const {}
  void load_state(std::span<const std::byte>) {}
  Comm& comm() { return comm_; }

  std::vector<float> residual, last_in, last_out;
  std::int64_t calls = 0;

 private:
  Comm comm_;
};
}  // namespace

TEST_CASE("compress_deltas: x = x0 + reduce(x - x0), and what is not sent stays in the residual",
          "[train][data_parallel][compress]") {
  const int P = GENERATE(1, 2, 3, 4, 8);
  const std::size_t n = 10;
  const std::int64_t T = 12, H = 3;
  struct record {
    std::vector<char> ok;
    std::vector<std::uint64_t> hashes;
  };
  std::vector<record> recs(P);
  run_threads(P, [&](ThreadComm& comm) {
    auto& me = recs[comm.rank()];
    DataParallel dp{AlternatingHalf<ThreadComm>{comm}, LocalSgd{H}, T, {.compress_deltas = true}};
    Sgd sgd{n, {.momentum = 0.5}};
    auto x = initial_params(n);
    std::vector<float> g(n), x0, local;
    for (std::int64_t t = 0; t < T; ++t) {
      if (t % H == 0) x0 = x;
      gradient(x, g, comm.rank(), t);
      if (t % H == H - 1) {
        // What this rank's local step gives, computed on copies, so the delta can be checked.
        Sgd probe = sgd;
        local = x;
        std::vector<float> g2 = g;
        probe(local, g2, 0.05);
      }
      const auto residual_before = dp.compressor().residual;
      const bool synced = dp.step(x, g, 0.05, sgd);
      if (!synced) continue;
      const auto& c = dp.compressor();
      bool ok = c.last_out.size() == n && c.last_in.size() == n;
      for (std::size_t i = 0; ok && i < n; ++i) {
        ok = x[i] == x0[i] + c.last_out[i] && c.last_in[i] == local[i] - x0[i];
        // Conservation on this rank: residual_after + sent = delta + residual_before.
        const bool sent = static_cast<std::int64_t>(i % 2) == (c.calls - 1) % 2;
        const float before = residual_before.empty() ? 0.0f : residual_before[i];
        ok = ok && (sent ? c.residual[i] == 0.0f : c.residual[i] == c.last_in[i] + before);
      }
      me.ok.push_back(ok);
      me.hashes.push_back(hash_floats(x));
    }
    me.ok.push_back(dp.compressor().calls == T / H);
  });
  for (const auto& r : recs) {
    CHECK(r.ok.size() == static_cast<std::size_t>(T / H + 1));
    for (char ok : r.ok) CHECK(ok);
    CHECK(r.hashes == recs[0].hashes);  // identical parameters on every rank after each round
  }
}

TEST_CASE("save_state and load_state resume a run bit for bit", "[train][data_parallel][state]") {
  const int P = GENERATE(1, 2, 3);
  const std::size_t n = 12;
  const std::int64_t T = 30;
  const WarmupCosineLr lr{0.1, 3, T};
  const QSRPolicy q{0.3, 2, 3};
  const std::int64_t cut = GENERATE(0, 7, 14);  // 7 and 14 fall inside parameter periods
  std::vector<std::vector<float>> straight(P), resumed(P);
  std::vector<std::int64_t> rounds_straight(P), rounds_resumed(P);
  std::vector<char> bad_rejected(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const int r = comm.rank();
    {
      DataParallel dp{Dense<ThreadComm>{comm}, q, T, {.average_optimizer_state = true}};
      Sgd sgd{n, {.momentum = 0.9}};
      auto x = initial_params(n);
      std::vector<float> g(n);
      for (std::int64_t t = 0; t < T; ++t) {
        gradient(x, g, r, t);
        dp.step(x, g, lr(t), sgd);
      }
      straight[r] = x;
      rounds_straight[r] = dp.rounds();
    }
    {
      std::vector<std::byte> saved;
      Sgd sgd{n, {.momentum = 0.9}};
      auto x = initial_params(n);
      std::vector<float> g(n);
      {
        DataParallel dp{Dense<ThreadComm>{comm}, q, T, {.average_optimizer_state = true}};
        for (std::int64_t t = 0; t < cut; ++t) {
          gradient(x, g, r, t);
          dp.step(x, g, lr(t), sgd);
        }
        dp.save_state(saved);
      }
      DataParallel dp{Dense<ThreadComm>{comm}, q, T, {.average_optimizer_state = true}};
      try {
        dp.load_state(std::span<const std::byte>(saved).first(40));
      } catch (const wire_error&) {
        bad_rejected[r] = 1;
      }
      // A driver made with another policy or options refuses the state (nothing changes).
      int refused = 0;
      auto refuse = [&](auto&& other) {
        try {
          other.load_state(saved);
        } catch (const invalid_argument& e) {
          refused += std::string(e.what()).find("another policy") != std::string::npos && other.steps() == 0;
        }
      };
      refuse(DataParallel{Dense<ThreadComm>{comm}, QSRPolicy{0.2, 2, 3}, T, {.average_optimizer_state = true}});
      refuse(DataParallel{Dense<ThreadComm>{comm}, QSRPolicy{0.3, 4, 3}, T, {.average_optimizer_state = true}});
      refuse(DataParallel{Dense<ThreadComm>{comm}, LocalSgd{4}, T, {.average_optimizer_state = true}});
      refuse(DataParallel{Dense<ThreadComm>{comm}, q, T});  // without average_optimizer_state
      bad_rejected[r] = bad_rejected[r] && refused == 4;
      dp.load_state(saved);
      for (std::int64_t t = dp.steps(); t < T; ++t) {
        gradient(x, g, r, t);
        dp.step(x, g, lr(t), sgd);
      }
      resumed[r] = x;
      rounds_resumed[r] = dp.rounds();
    }
  });
  for (int r = 0; r < P; ++r) {
    CHECK(bitwise_equal(resumed[r], straight[r]));
    CHECK(rounds_resumed[r] == rounds_straight[r]);
    CHECK(bad_rejected[r]);
  }
}

TEST_CASE("a saved DataParallel refuses policies that differ only at small learning rates or late steps; a run "
          "of INT64_MAX steps saves and loads",
          "[train][data_parallel][state]") {
  int refused = 0, loaded = 0;
  run_threads(1, [&](ThreadComm& comm) {
    const std::size_t n = 6;
    auto run_and_save = [&](auto policy, std::int64_t T, std::int64_t steps) {
      DataParallel dp{Dense<ThreadComm>{comm}, policy, T};
      Sgd sgd{n, {}};
      auto x = initial_params(n);
      std::vector<float> g(n);
      for (std::int64_t t = 0; t < steps; ++t) {
        gradient(x, g, 0, t);
        dp.step(x, g, 3e-4, sgd);
      }
      std::vector<std::byte> b;
      dp.save_state(b);
      return b;
    };
    auto refuses = [&](auto&& dp, const std::vector<std::byte>& b) {
      try {
        dp.load_state(b);
      } catch (const invalid_argument&) {
        ++refused;
      }
    };
    // QSR's periods at lr = 3e-4 are 11 and 25: they differ at the probes' 1e-4.
    const auto qsr = run_and_save(QSRPolicy{0.001, 2}, 100, 5);
    refuses(DataParallel{Dense<ThreadComm>{comm}, QSRPolicy{0.0015, 2}, 100}, qsr);
    // The switch at 101 or 110: every step below 1024 is probed.
    const auto post = run_and_save(PostLocal{101, 4}, 1000, 50);
    refuses(DataParallel{Dense<ThreadComm>{comm}, PostLocal{110, 4}, 1000}, post);
    const auto endless = run_and_save(EveryStep{}, std::numeric_limits<std::int64_t>::max(), 2);
    DataParallel again{Dense<ThreadComm>{comm}, EveryStep{}, std::numeric_limits<std::int64_t>::max()};
    again.load_state(endless);
    loaded = again.steps() == 2 ? 1 : 0;
  });
  CHECK(refused == 2);
  CHECK(loaded == 1);
}

TEST_CASE("compress_deltas keeps gradient and delta residuals apart", "[train][data_parallel][compress]") {
  const int P = GENERATE(1, 2, 4);
  const std::size_t n = 9;
  const std::int64_t T = 16;
  const PostLocal policy{5, 3};
  SECTION("one shared compressor: an error at the switch, on every rank") {
    std::vector<std::int64_t> failed_at(P, -1);
    REQUIRE_THROWS_AS(run_threads(P,
                                  [&](ThreadComm& comm) {
                                    DataParallel dp{Dense<ThreadComm>{comm}, policy, T, {.compress_deltas = true}};
                                    Sgd sgd{n};
                                    auto x = initial_params(n);
                                    std::vector<float> g(n);
                                    for (std::int64_t t = 0; t < T; ++t) {
                                      gradient(x, g, comm.rank(), t);
                                      try {
                                        dp.step(x, g, 0.05, sgd);
                                      } catch (const invalid_argument&) {
                                        failed_at[comm.rank()] = t;
                                        throw;
                                      }
                                    }
                                  }),
                      invalid_argument);
    for (auto t : failed_at) CHECK(t == 7);  // the end of the first local period [5, 8)
  }
  SECTION("a second compressor for the deltas: the same bits as dense averaging") {
    std::vector<std::vector<float>> two(P), dense(P);
    std::vector<std::int64_t> grad_calls(P), delta_calls(P);
    for (int variant = 0; variant < 2; ++variant) {
      run_threads(P, [&](ThreadComm& comm) {
        Sgd sgd{n, {.momentum = 0.9}};
        auto x = initial_params(n);
        std::vector<float> g(n);
        auto loop = [&](auto& dp) {
          for (std::int64_t t = 0; t < T; ++t) {
            gradient(x, g, comm.rank(), t);
            dp.step(x, g, 0.05, sgd);
          }
        };
        if (variant == 0) {
          DataParallel dp{Dense<ThreadComm>{comm}, Dense<ThreadComm>{comm}, policy, T};
          loop(dp);
          grad_calls[comm.rank()] = dp.compressor().steps();
          delta_calls[comm.rank()] = dp.delta_compressor().steps();
          two[comm.rank()] = x;
        } else {
          DataParallel dp{Dense<ThreadComm>{comm}, policy, T};
          loop(dp);
          dense[comm.rank()] = x;
        }
      });
    }
    for (int r = 0; r < P; ++r) {
      CHECK(bitwise_equal(two[r], dense[0]));
      CHECK(grad_calls[r] == 5);
      CHECK(delta_calls[r] == 4);  // [5, 8) [8, 11) [11, 14) [14, 16)
    }
  }
}
