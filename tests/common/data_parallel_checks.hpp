#pragma once
// Checks of the DataParallel driver written once over any communicator, run from the
// ThreadComm tests (tests/test_train_data_parallel.cpp) and the MPI tests
// (tests/mpi/test_train_data_parallel_mpi.cpp).
//
// Each rank trains with Dense<Comm> on a per-rank quadratic (train_rank) and records the
// steps that ended a round and whether the parameters were identical on every rank after
// each one (an allgather of a hash). Cross-rank agreement is checked with allgather too.
// Failures are collected in a `verdict` and `settle`d (tests/common/sparse_checks.hpp):
// wrap a check in REQUIRE_NOTHROW(run_threads(...)) or REQUIRE_NOTHROW(mpi_guard(...)).
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/sync/lr_schedule.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/sync/schedule.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "sparse_checks.hpp"  // verdict, settle, throws_as

namespace commpact_test {

inline std::uint64_t dp_mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Gradient of a per-rank quadratic plus step noise: a function of (rank, step, i, x) only.
inline void gradient(std::span<const float> x, std::span<float> g, int rank, std::int64_t step) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float target = std::sin(0.7f * static_cast<float>(i) + 1.3f * static_cast<float>(rank));
    const auto h = dp_mix((static_cast<std::uint64_t>(rank) << 48) ^ (static_cast<std::uint64_t>(step) << 20) ^ i);
    const float noise = static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-53 - 0.5) * 0.2f;
    g[i] = (1.0f + 0.25f * static_cast<float>(i % 5)) * (x[i] - target) + noise;
  }
}

inline std::vector<float> initial_params(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = 0.5f * std::cos(0.3f * static_cast<float>(i));
  return x;
}

inline std::uint64_t hash_bytes(const void* data, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

inline std::uint64_t hash_floats(std::span<const float> v) { return hash_bytes(v.data(), v.size_bytes()); }

// True on every rank when all ranks hold the same bytes (and the same number of elements).
template <class Comm, class T>
bool identical_on_all_ranks(Comm& comm, std::span<const T> v) {
  std::uint64_t h = hash_bytes(v.data(), v.size_bytes()) ^ (v.size() * 0x9E3779B97F4A7C15ull);
  std::vector<std::uint64_t> all(comm.size());
  comm.allgather(std::span<const std::uint64_t>(&h, 1), std::span<std::uint64_t>(all));
  for (auto a : all)
    if (a != h) return false;
  return true;
}

//! The largest |a[i] - b[i]| (in double), over a's length; b is at least as long.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return worst;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct rank_result {
  std::vector<float> params;
  std::vector<std::int64_t> round_steps;
  std::vector<char> same_after_round;  // params identical on all ranks after each round
  std::int64_t rounds = 0, gradient_rounds = 0, parameter_rounds = 0, shortcuts = 0, state_rounds = 0;
  std::int64_t compressor_steps = 0;
};

struct run_config {
  std::size_t n = 37;
  std::int64_t T = 40;
  commpact::sgd_options sgd{.momentum = 0.9, .weight_decay = 1e-3};
  commpact::data_parallel_options opt{};
  bool check_identical = true;
};

// Trains on this rank with Dense<Comm>; returns this rank's record.
template <class Comm, class Policy, class Lr>
rank_result train_rank(Comm& comm, const Policy& policy, const Lr& lr, const run_config& cfg) {
  rank_result me;
  commpact::DataParallel dp{commpact::Dense<Comm>{comm}, policy, cfg.T, cfg.opt};
  commpact::Sgd sgd{cfg.n, cfg.sgd};
  auto x = initial_params(cfg.n);
  std::vector<float> g(cfg.n);
  for (std::int64_t t = 0; t < cfg.T; ++t) {
    gradient(x, g, comm.rank(), t);
    if (dp.step(x, g, lr(t), sgd)) {
      me.round_steps.push_back(t);
      if (cfg.check_identical) me.same_after_round.push_back(identical_on_all_ranks(comm, std::span<const float>(x)));
    }
  }
  me.params = x;
  me.rounds = dp.rounds();
  me.gradient_rounds = dp.gradient_rounds();
  me.parameter_rounds = dp.parameter_rounds();
  me.shortcuts = dp.gradient_shortcuts();
  me.state_rounds = dp.state_rounds();
  me.compressor_steps = dp.compressor().steps();
  return me;
}

//! Every rank decided alike (same round steps), holds the same parameters at the end, and
//! held the same parameters after every round.
template <class Comm>
void expect_consistent(Comm& comm, verdict& v, const rank_result& r, const char* what) {
  v.expect(identical_on_all_ranks(comm, std::span<const std::int64_t>(r.round_steps)), what,
           ": ranks synchronised at different steps");
  v.expect(identical_on_all_ranks(comm, std::span<const float>(r.params)), what, ": final parameters differ");
  for (std::size_t i = 0; i < r.same_after_round.size(); ++i)
    v.expect(r.same_after_round[i] != 0, what, ": parameters differ after round ", i, " (step ",
             r.round_steps[i], ")");
  v.expect(r.same_after_round.size() == r.round_steps.size(), what, ": ", r.same_after_round.size(),
           " identity checks for ", r.round_steps.size(), " rounds");
}

//! QSR (alpha 0.25, h_base 2, warm-up 10, cosine 0.1 over 100 steps): the rounds of the
//! hand-computed schedule of test_sync_policies.cpp, all parameter rounds, averaged
//! densely through the communicator.
template <class Comm>
void check_qsr_hand_schedule(Comm& comm) {
  using namespace commpact;
  verdict v;
  // Periods start at 0 2 4 6 8 10 16 22 28 35 44 57 85; each round ends a period.
  const std::vector<std::int64_t> hand{1, 3, 5, 7, 9, 15, 21, 27, 34, 43, 56, 84, 99};
  run_config cfg;
  cfg.T = 100;
  const WarmupCosineLr lr{0.1, 10, 100};
  const QSRPolicy qsr{0.25, 2, 10};
  const auto r = train_rank(comm, qsr, lr, cfg);
  expect_consistent(comm, v, r, "QSR");
  v.expect(r.round_steps == hand, "QSR rounds differ from the hand table");
  v.expect(r.round_steps == round_steps(plan_run(qsr, lr, 100)), "QSR rounds differ from plan_run");
  v.expect(r.rounds == 13, "rounds ", r.rounds);
  v.expect(r.parameter_rounds == 13, "parameter rounds ", r.parameter_rounds);
  v.expect(r.gradient_rounds == 0, "gradient rounds ", r.gradient_rounds);
  v.expect(r.compressor_steps == 0, "compressor steps ", r.compressor_steps);  // dense averaging of parameters
  settle(comm, v, "check_qsr_hand_schedule");
}

//! DataParallel's rounds equal the policy's schedule: EveryStep, LocalSgd{7} (the last
//! period cut at the end of the run), QSR with a vanishing learning rate (one saturated
//! period, cut).
template <class Comm>
void check_rounds_equal_schedule(Comm& comm) {
  using namespace commpact;
  verdict v;
  run_config cfg;
  cfg.T = 30;
  const ConstantLr lr{0.05};
  {
    const auto r = train_rank(comm, EveryStep{}, lr, cfg);
    expect_consistent(comm, v, r, "EveryStep");
    v.expect(r.round_steps == round_steps(plan_run(EveryStep{}, lr, 30)), "EveryStep rounds differ from plan_run");
    v.expect(r.gradient_rounds == 30, "EveryStep gradient rounds ", r.gradient_rounds);
    v.expect(r.compressor_steps == 30, "EveryStep compressor steps ", r.compressor_steps);
  }
  {
    const auto r = train_rank(comm, LocalSgd{7}, lr, cfg);
    expect_consistent(comm, v, r, "LocalSgd{7}");
    v.expect(r.round_steps == std::vector<std::int64_t>{6, 13, 20, 27, 29}, "LocalSgd{7} rounds");
    v.expect(r.round_steps == round_steps(plan_run(LocalSgd{7}, lr, 30)), "LocalSgd{7} rounds differ from plan_run");
  }
  {
    const QSRPolicy q{1.0, 2, 0};
    const auto tiny = [](std::int64_t) { return 1e-30; };
    const auto r = train_rank(comm, q, tiny, cfg);
    expect_consistent(comm, v, r, "QSR tiny lr");
    v.expect(r.round_steps == std::vector<std::int64_t>{29}, "QSR tiny lr rounds");
  }
  settle(comm, v, "check_rounds_equal_schedule");
}

// Local SGD written out serially: P models, each with its own Sgd (momentum per rank);
// after each period x = x0 + (sum over ranks in rank order of (x_r - x0)) / P, and with
// state averaging v = (sum of v_r) / P (divided in float, as kernels/mean.hpp).
template <class Lr>
std::vector<float> serial_local_sgd(int P, const std::vector<commpact::sync_period>& periods, const Lr& lr,
                                    const run_config& cfg) {
  std::vector<float> x0 = initial_params(cfg.n), g(cfg.n);
  std::vector<commpact::Sgd> opt(P, commpact::Sgd{cfg.n, cfg.sgd});
  std::vector<std::vector<float>> x(P);
  const auto fP = static_cast<float>(P);
  for (const auto& p : periods) {
    for (int r = 0; r < P; ++r) {
      x[r] = x0;
      for (std::int64_t t = p.start; t <= p.last(); ++t) {
        gradient(x[r], g, r, t);
        opt[r](x[r], g, lr(t));
      }
    }
    std::vector<float> sum(cfg.n);
    for (std::size_t i = 0; i < cfg.n; ++i) {
      float s = x[0][i] - x0[i];
      for (int r = 1; r < P; ++r) s += x[r][i] - x0[i];
      sum[i] = s / fP;
    }
    for (std::size_t i = 0; i < cfg.n; ++i) x0[i] = x0[i] + sum[i];
    if (cfg.opt.average_optimizer_state && cfg.sgd.momentum > 0) {
      for (std::size_t i = 0; i < cfg.n; ++i) {
        float s = opt[0].state()[i];
        for (int r = 1; r < P; ++r) s += opt[r].state()[i];
        for (int r = 0; r < P; ++r) opt[r].state()[i] = s / fP;
      }
    }
  }
  return x0;
}

//! LocalSgd{1} equals EveryStep with Dense bit for bit (25 steps, warm-up cosine), and
//! with P > 1 both differ from a run without communication (the check can fail).
template <class Comm>
void check_localsgd1_equals_everystep(Comm& comm, bool average_state, double momentum, bool rank_order_sums = true) {
  using namespace commpact;
  verdict v;
  run_config cfg;
  cfg.T = 25;
  cfg.opt.average_optimizer_state = average_state;
  cfg.sgd.momentum = momentum;
  const WarmupCosineLr lr{0.2, 5, 25};
  const auto bsp = train_rank(comm, EveryStep{}, lr, cfg);
  const auto local = train_rank(comm, LocalSgd{1}, lr, cfg);
  expect_consistent(comm, v, bsp, "EveryStep");
  expect_consistent(comm, v, local, "LocalSgd{1}");
  v.expect(local.round_steps == bsp.round_steps, "LocalSgd{1} and EveryStep round at different steps");
  v.expect(local.state_rounds == 0, "state rounds ", local.state_rounds);
  if (average_state || momentum == 0) {
    // The momentum is the same on every rank after each step either way: the one-step
    // period goes through the gradient, bit for bit EveryStep's step.
    v.expect(bitwise_equal(local.params, bsp.params), "LocalSgd{1} and EveryStep differ");
    v.expect(local.shortcuts == 25, "shortcuts ", local.shortcuts);
  } else {
    // Momentum per rank (Local SGD's definition): each step is a local step and an average
    // of deltas, the serial reference (bit for bit where the communicator sums in rank
    // order, as ThreadComm; MpiComm's recursive doubling associates otherwise); the
    // parameters equal EveryStep's in exact arithmetic, so they differ by rounding only.
    std::vector<commpact::sync_period> ones;
    for (std::int64_t t = 0; t < cfg.T; ++t) ones.push_back({t, 1, commpact::sync_plan::mode::parameters});
    const auto ref = serial_local_sgd(comm.size(), ones, lr, cfg);
    const double off_ref = max_abs_diff(local.params, ref);
    v.expect(rank_order_sums ? bitwise_equal(local.params, ref) : off_ref <= 1e-6,
             "LocalSgd{1} with per-rank momentum differs from the serial Local SGD reference by ", off_ref);
    v.expect(local.shortcuts == 0, "shortcuts ", local.shortcuts);
    const double worst = max_abs_diff(local.params, bsp.params);
    v.expect(worst <= 1e-6, "LocalSgd{1} with per-rank momentum is ", worst, " from EveryStep");
  }
  if (comm.size() > 1) {
    std::vector<float> alone = initial_params(cfg.n), g(cfg.n);
    Sgd sgd{cfg.n, cfg.sgd};
    for (std::int64_t t = 0; t < cfg.T; ++t) {
      gradient(alone, g, 0, t);
      sgd(alone, g, lr(t));
    }
    v.expect(!bitwise_equal(alone, bsp.params), "EveryStep equals a run without communication");
  }
  settle(comm, v, "check_localsgd1_equals_everystep");
}

//! Bytes counted by CountingComm<Comm> under DataParallel follow the ring formula:
//! EveryStep, LocalSgd{4}, LocalSgd{4} with optimizer state averaging (12 steps, n = 1000).
template <class Comm>
void check_data_parallel_bytes(Comm& comm) {
  using namespace commpact;
  using Counted = CountingComm<Comm>;
  const int P = comm.size(), r = comm.rank();
  const std::size_t n = 1000;
  const std::int64_t T = 12;
  verdict v;
  auto run = [&](auto policy, data_parallel_options opt) {
    DataParallel dp{Dense<Counted>{Counted{comm}}, policy, T, opt};
    Sgd sgd{n, {.momentum = 0.9}};
    auto x = initial_params(n);
    std::vector<float> g(n);
    for (std::int64_t t = 0; t < T; ++t) {
      gradient(x, g, comm.rank(), t);
      dp.step(x, g, 0.05, sgd);
    }
    return dp.comm().stats();
  };
  const auto every = run(EveryStep{}, {});
  const auto local = run(LocalSgd{4}, {});
  const auto local_state = run(LocalSgd{4}, {.average_optimizer_state = true});
  const auto round = wire::ring_allreduce(r, P, n, 4);
  const auto check = wire::ring_allreduce(r, P, 4, 8);        // DataParallel's one-time check: length, step
  const auto dense_check = wire::ring_allreduce(r, P, 3, 8);  // Dense's first-step agreement (comm/agree.hpp)
  const auto step_check = wire::ring_allreduce(r, P, 6, 4);   // Dense's step count, every step (step_check.hpp)
  v.expect(every.bytes_sent == 12 * (round.bytes_sent + step_check.bytes_sent) + dense_check.bytes_sent,
           "EveryStep bytes ", every.bytes_sent);
  v.expect(every.messages_sent == 12 * (round.messages_sent + step_check.messages_sent) + dense_check.messages_sent,
           "EveryStep messages ", every.messages_sent);
  v.expect(every.collectives == 12 + 12 + 1, "EveryStep collectives ", every.collectives);
  v.expect(local.bytes_sent == 3 * round.bytes_sent + check.bytes_sent, "LocalSgd bytes ", local.bytes_sent);
  v.expect(local.bytes_received == 3 * round.bytes_received + check.bytes_received, "LocalSgd bytes received ",
           local.bytes_received);
  v.expect(local.collectives == 3 + 1, "LocalSgd collectives ", local.collectives);
  v.expect(local_state.bytes_sent == 6 * round.bytes_sent + 2 * check.bytes_sent, "LocalSgd+state bytes ",
           local_state.bytes_sent);
  settle(comm, v, "check_data_parallel_bytes");
}

//! DataParallel with PowerCompressor<2> (a compressor with error feedback): under
//! EveryStep every step is a gradient round through PowerSGD, and under LocalSgd{3} with
//! compress_deltas every third step sends the parameter deltas through it; either way
//! the parameters are identical on every rank after each round, and the compressor ran
//! once per round.
template <class Comm>
void check_data_parallel_powersgd(Comm& comm) {
  using namespace commpact;
  verdict v;
  const tensor_layout layout = {{8, 12}, {5}};
  const std::size_t n = 8 * 12 + 5;
  const std::int64_t T = 12;
  auto run = [&](auto policy, data_parallel_options opt, const char* name, std::int64_t want_rounds) {
    DataParallel dp{PowerCompressor<2>{comm, layout}, policy, T, opt};
    Sgd sgd{n, {.momentum = 0.9}};
    auto x = initial_params(n);
    std::vector<float> g(n);
    std::int64_t rounds = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      gradient(x, g, comm.rank(), t);
      if (dp.step(x, g, 0.05, sgd)) {
        ++rounds;
        v.expect(identical_on_all_ranks(comm, std::span<const float>(x)), name, ": parameters differ after step ", t);
      }
    }
    v.expect(rounds == want_rounds, name, ": ", rounds, " rounds, expected ", want_rounds);
    v.expect(dp.compressor().steps() == want_rounds, name, ": the compressor ran ", dp.compressor().steps(),
             " times, expected ", want_rounds);
    // The run moved the parameters (the check can fail).
    v.expect(!bitwise_equal(x, initial_params(n)), name, ": parameters did not move");
  };
  run(EveryStep{}, {}, "EveryStep + PowerSGD", T);
  run(LocalSgd{3}, {.compress_deltas = true}, "LocalSgd{3} + PowerSGD deltas", T / 3);
  settle(comm, v, "check_data_parallel_powersgd");
}

//! A policy that is wrong on purpose: parameter periods of h steps, h depending on the rank.
struct RankDependent {
  std::int64_t h;
  commpact::sync_plan plan(std::int64_t, double) const { return {commpact::sync_plan::mode::parameters, h}; }
};

//! verify_plans catches ranks that decide differently (a policy whose period depends on
//! the rank): every rank raises mismatch_error, none hangs. Needs P >= 2.
template <class Comm>
void check_verify_plans_mismatch(Comm& comm) {
  using namespace commpact;
  if (comm.size() < 2) return;
  verdict v;
  DataParallel dp{Dense<Comm>{comm}, RankDependent{1 + comm.rank()}, 10, {.verify_plans = true}};
  Sgd sgd{4};
  std::vector<float> x(4, 1.f), g(4, 0.5f);
  std::string what;
  const int got = throws_as<mismatch_error>(
      [&] {
        for (int t = 0; t < 10; ++t) dp.step(x, g, 0.1, sgd);
      },
      &what);
  v.expect(got == 1, "expected mismatch_error, got ", got, ": ", what);
  v.expect(what.find("sync period length") != std::string::npos, "message: ", what);
  settle(comm, v, "check_verify_plans_mismatch");
}

//! Without verify_plans: ranks whose policies differ reach their first round at different
//! steps, and the one-time check before the first average raises mismatch_error on every
//! rank there (the one-step shortcut through the gradient, H = 1 + rank, and plain
//! parameter periods, H = 3 + rank), and leaves the driver as it was (rounds and position).
//! The same with the deltas through the compressor (compress_deltas, and a second
//! compressor for the deltas), whose first round is checked alike.
template <class Comm>
void check_first_round_mismatch(Comm& comm) {
  using namespace commpact;
  if (comm.size() < 2) return;
  verdict v;
  auto expect_first_round_raises = [&](auto& dp, std::int64_t base, const char* how) {
    Sgd sgd{4};
    std::vector<float> x(4, 1.f), g(4, 0.5f);
    std::string what;
    std::int64_t t = 0;
    const int got = throws_as<mismatch_error>(
        [&] {
          for (; t < 10; ++t) dp.step(x, g, 0.1, sgd);
        },
        &what);
    v.expect(got == 1, how, ", H = ", base, " + rank: expected mismatch_error, got ", got, ": ", what);
    v.expect(what.find("for the first time at different steps") != std::string::npos, how, ": message: ", what);
    v.expect(t == base + comm.rank() - 1, how, ", H = ", base, " + rank: raised at step ", t,
             ", not at the first round");
    v.expect(dp.rounds() == 0 && dp.steps() == t, how, ", H = ", base, " + rank: the failed step moved the driver (",
             dp.rounds(), " rounds, at step ", dp.steps(), ")");
  };
  for (const std::int64_t base : {1, 3}) {
    DataParallel dense{Dense<Comm>{comm}, RankDependent{base + comm.rank()}, 10};
    expect_first_round_raises(dense, base, "dense average");
    DataParallel deltas{Dense<Comm>{comm}, RankDependent{base + comm.rank()}, 10, {.compress_deltas = true}};
    expect_first_round_raises(deltas, base, "compress_deltas");
    DataParallel two{Dense<Comm>{comm}, Dense<Comm>{comm}, RankDependent{base + comm.rank()}, 10};
    expect_first_round_raises(two, base, "a compressor for the deltas");
  }
  settle(comm, v, "check_first_round_mismatch");
}

}  // namespace commpact_test
