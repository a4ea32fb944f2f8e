// DataParallel on ThreadComm, P in {1, 2, 3, 4, 8}: the rounds it performs equal the
// policy's schedule (QSR's from the hand table), LocalSgd{1} equals EveryStep with Dense
// bit for bit, Local SGD equals a serial reference written here, PostLocal switches at
// its step, every rank decides alike and holds the same parameters after each round,
// the bytes counted by CountingComm follow the ring formula, bad input is an error.
//
// Catch2 is not thread-safe, so ranks record what they see and the main thread checks.
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/dense.hpp>
#include <commpact/sync/lr_schedule.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/sync/schedule.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

using namespace commpact;
namespace {
// Matches an exception whose what() contains every given piece.
class MessageContains : public Catch::MatcherBase<std::exception> {
 public:
  MessageContains(std::initializer_list<const char*> pieces) : pieces_(pieces.begin(), pieces.end()) {}
  bool match(const std::exception& e) const override {
    const std::string what = e.what();
    for (const auto& p : pieces_)
      if (what.find(p) == std::string::npos) return false;
    return true;
  }
  std::string describe() const override {
    std::string d = "message contains";
    for (const auto& p : pieces_) d += " \"" + p + "\"";
    return d;
  }

 private:
  std::vector<std::string> pieces_;
};
}  // namespace

namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Gradient of a per-rank quadratic plus step noise: a function of (rank, step, i, x) only.
void gradient(std::span<const float> x, std::span<float> g, int rank, std::int64_t step) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float target = std::sin(0.7f * static_cast<float>(i) + 1.3f * static_cast<float>(rank));
    const auto h = mix((static_cast<std::uint64_t>(rank) << 48) ^ (static_cast<std::uint64_t>(step) << 20) ^ i);
    const float noise = static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-53 - 0.5) * 0.2f;
    g[i] = (1.0f + 0.25f * static_cast<float>(i % 5)) * (x[i] - target) + noise;
  }
}

std::vector<float> initial_params(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = 0.5f * std::cos(0.3f * static_cast<float>(i));
  return x;
}

std::uint64_t hash_floats(std::span<const float> v) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size_bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// True on every rank when all ranks hold the same bytes.
template <class Comm>
bool identical_on_all_ranks(Comm& comm, std::span<const float> v) {
  std::uint64_t h = hash_floats(v);
  std::vector<std::uint64_t> all(comm.size());
  comm.allgather(std::span<const std::uint64_t>(&h, 1), std::span<std::uint64_t>(all));
  for (auto a : all)
    if (a != h) return false;
  return true;
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
  sgd_options sgd{.momentum = 0.9, .weight_decay = 1e-3};
  data_parallel_options opt{};
  bool check_identical = true;
};

// Trains on every rank of a ThreadComm world of P ranks; returns each rank's record.
template <class Policy, class Lr>
std::vector<rank_result> train(int P, const Policy& policy, const Lr& lr, const run_config& cfg) {
  std::vector<rank_result> out(P);
  run_threads(P, [&](ThreadComm& comm) {
    auto& me = out[comm.rank()];
    DataParallel dp{Dense<ThreadComm>{comm}, policy, cfg.T, cfg.opt};
    Sgd sgd{cfg.n, cfg.sgd};
    auto x = initial_params(cfg.n);
    std::vector<float> g(cfg.n);
    for (std::int64_t t = 0; t < cfg.T; ++t) {
      gradient(x, g, comm.rank(), t);
      if (dp.step(x, g, lr(t), sgd)) {
        me.round_steps.push_back(t);
        if (cfg.check_identical) me.same_after_round.push_back(identical_on_all_ranks(comm, x));
      }
    }
    me.params = x;
    me.rounds = dp.rounds();
    me.gradient_rounds = dp.gradient_rounds();
    me.parameter_rounds = dp.parameter_rounds();
    me.shortcuts = dp.gradient_shortcuts();
    me.state_rounds = dp.state_rounds();
    me.compressor_steps = dp.compressor().steps();
  });
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
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
  // The table of test_sync_policies.cpp (alpha 0.25, h_base 2, warm-up 10, cosine 0.1 over 100 steps):
  // periods start at 0 2 4 6 8 10 16 22 28 35 44 57 85; each round ends a period.
  const std::vector<std::int64_t> hand{1, 3, 5, 7, 9, 15, 21, 27, 34, 43, 56, 84, 99};
  run_config cfg;
  cfg.T = 100;
  const WarmupCosineLr lr{0.1, 10, 100};
  const QSRPolicy qsr{0.25, 2, 10};
  const auto rs = train(P, qsr, lr, cfg);
  check_consistent(rs);
  CHECK(rs[0].round_steps == hand);
  CHECK(rs[0].round_steps == round_steps(plan_run(qsr, lr, 100)));
  CHECK(rs[0].rounds == 13);
  CHECK(rs[0].parameter_rounds == 13);
  CHECK(rs[0].gradient_rounds == 0);
  CHECK(rs[0].compressor_steps == 0);  // parameters are averaged densely through the communicator
}

TEST_CASE("DataParallel's rounds equal the policy's schedule", "[train][data_parallel]") {
  const int P = GENERATE(1, 2, 3, 4, 8);
  run_config cfg;
  cfg.T = 30;
  const ConstantLr lr{0.05};
  SECTION("EveryStep") {
    const auto rs = train(P, EveryStep{}, lr, cfg);
    check_consistent(rs);
    CHECK(rs[0].round_steps == round_steps(plan_run(EveryStep{}, lr, 30)));
    CHECK(rs[0].gradient_rounds == 30);
    CHECK(rs[0].compressor_steps == 30);
  }
  SECTION("LocalSgd{7}: the last period is cut at the end of the run") {
    const auto rs = train(P, LocalSgd{7}, lr, cfg);
    check_consistent(rs);
    CHECK(rs[0].round_steps == std::vector<std::int64_t>{6, 13, 20, 27, 29});
    CHECK(rs[0].round_steps == round_steps(plan_run(LocalSgd{7}, lr, 30)));
  }
  SECTION("QSR with a learning rate that decays to almost nothing: one saturated period, cut") {
    const QSRPolicy q{1.0, 2, 0};
    const auto tiny = [](std::int64_t) { return 1e-30; };
    const auto rs = train(P, q, tiny, cfg);
    check_consistent(rs);
    CHECK(rs[0].round_steps == std::vector<std::int64_t>{29});
  }
}

TEST_CASE("LocalSgd{1} equals EveryStep with Dense bit for bit", "[train][data_parallel][bitwise]") {
  const int P = GENERATE(1, 2, 3, 4, 8);
  run_config cfg;
  cfg.T = 25;
  const bool average_state = GENERATE(false, true);
  const double momentum = GENERATE(0.0, 0.9);
  cfg.opt.average_optimizer_state = average_state;
  cfg.sgd.momentum = momentum;
  const WarmupCosineLr lr{0.2, 5, 25};
  const auto bsp = train(P, EveryStep{}, lr, cfg);
  const auto local = train(P, LocalSgd{1}, lr, cfg);
  check_consistent(bsp);
  check_consistent(local);
  CHECK(bitwise_equal(local[0].params, bsp[0].params));
  CHECK(local[0].round_steps == bsp[0].round_steps);
  CHECK(local[0].shortcuts == 25);
  CHECK(local[0].state_rounds == 0);
  // The baseline differs from a run without communication (the test can fail), unless P = 1.
  if (P > 1) {
    std::vector<float> alone = initial_params(cfg.n), g(cfg.n);
    Sgd sgd{cfg.n, cfg.sgd};
    for (std::int64_t t = 0; t < cfg.T; ++t) {
      gradient(alone, g, 0, t);
      sgd(alone, g, lr(t));
    }
    CHECK_FALSE(bitwise_equal(alone, bsp[0].params));
  }
}

namespace {
// Local SGD written out serially: P models, each with its own Sgd; after each period
// x = x0 + (sum over ranks in rank order of (x_r - x0)) * (1/P), and with state
// averaging v = (sum of v_r) * (1/P).
std::vector<float> serial_local_sgd(int P, const std::vector<sync_period>& periods, const WarmupCosineLr& lr,
                                    const run_config& cfg) {
  std::vector<float> x0 = initial_params(cfg.n), g(cfg.n);
  std::vector<Sgd> opt(P, Sgd{cfg.n, cfg.sgd});
  std::vector<std::vector<float>> x(P);
  const float inv = 1.0f / static_cast<float>(P);
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
      sum[i] = s * inv;
    }
    for (std::size_t i = 0; i < cfg.n; ++i) x0[i] = x0[i] + sum[i];
    if (cfg.opt.average_optimizer_state && cfg.sgd.momentum > 0) {
      for (std::size_t i = 0; i < cfg.n; ++i) {
        float s = opt[0].state()[i];
        for (int r = 1; r < P; ++r) s += opt[r].state()[i];
        for (int r = 0; r < P; ++r) opt[r].state()[i] = s * inv;
      }
    }
  }
  return x0;
}
}  // namespace

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
    CHECK(bitwise_equal(rs[0].params, serial_local_sgd(P, plan_run(LocalSgd{4}, lr, 40), lr, cfg)));
    CHECK(rs[0].state_rounds == (average_state ? 10 : 0));
  }
  SECTION("QSR (periods 3 in the warm-up, then growing)") {
    const QSRPolicy q{0.3, 3, 4};
    const auto periods = plan_run(q, lr, 40);
    REQUIRE(periods.size() >= 4);
    const auto rs = train(P, q, lr, cfg);
    check_consistent(rs);
    CHECK(bitwise_equal(rs[0].params, serial_local_sgd(P, periods, lr, cfg)));
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

TEST_CASE("One-step periods after local periods average deltas, not gradients", "[train][data_parallel]") {
  // QSR with h_base 1 and a large alpha late: periods of 1 during the warm-up (through the gradient), then
  // longer ones; once momentum has diverged, a period of 1 must average deltas to keep ranks identical.
  const int P = GENERATE(2, 3, 4);
  run_config cfg;
  cfg.T = 30;
  struct OneThreeOne {  // 1-step periods for steps < 5, then 3 steps, then 1-step periods again
    sync_plan plan(std::int64_t s, double) const {
      return {sync_plan::mode::parameters, (s >= 5 && s < 14) ? 3 : 1};
    }
  };
  const ConstantLr lr{0.05};
  const auto rs = train(P, OneThreeOne{}, lr, cfg);
  check_consistent(rs);
  CHECK(rs[0].shortcuts == 5);  // only before the first local period
  CHECK(rs[0].parameter_rounds == 5 + 3 + 16);
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
  const std::size_t n = 1000;
  const std::int64_t T = 12;
  using Counted = CountingComm<ThreadComm>;
  std::vector<comm_stats> every(P), local(P), local_state(P);
  auto run = [&](auto policy, data_parallel_options opt, std::vector<comm_stats>& stats) {
    run_threads(P, [&](ThreadComm& comm) {
      DataParallel dp{Dense<Counted>{Counted{comm}}, policy, T, opt};
      Sgd sgd{n, {.momentum = 0.9}};
      auto x = initial_params(n);
      std::vector<float> g(n);
      for (std::int64_t t = 0; t < T; ++t) {
        gradient(x, g, comm.rank(), t);
        dp.step(x, g, 0.05, sgd);
      }
      stats[comm.rank()] = dp.comm().stats();
    });
  };
  run(EveryStep{}, {}, every);
  run(LocalSgd{4}, {}, local);
  run(LocalSgd{4}, {.average_optimizer_state = true}, local_state);
  for (int r = 0; r < P; ++r) {
    const auto round = wire::ring_allreduce(r, P, n, 4);
    const auto check = wire::ring_allreduce(r, P, 2, 8);  // a one-time length check
    CHECK(every[r].bytes_sent == 12 * round.bytes_sent + check.bytes_sent);
    CHECK(every[r].messages_sent == 12 * round.messages_sent + check.messages_sent);
    CHECK(every[r].collectives == 12 + 1);
    CHECK(local[r].bytes_sent == 3 * round.bytes_sent + check.bytes_sent);
    CHECK(local[r].bytes_received == 3 * round.bytes_received + check.bytes_received);
    CHECK(local[r].collectives == 3 + 1);
    CHECK(local_state[r].bytes_sent == 6 * round.bytes_sent + 2 * check.bytes_sent);
  }
}

TEST_CASE("verify_plans catches ranks that decide differently; none hangs", "[train][data_parallel][errors]") {
  const int P = GENERATE(2, 3, 4);
  struct RankDependent {  // wrong on purpose: the period depends on the rank
    std::int64_t h;
    sync_plan plan(std::int64_t, double) const { return {sync_plan::mode::parameters, h}; }
  };
  std::vector<char> caught(P, 0);
  REQUIRE_THROWS_AS(run_threads(P,
                                [&](ThreadComm& comm) {
                                  DataParallel dp{Dense<ThreadComm>{comm}, RankDependent{1 + comm.rank()}, 10,
                                                  {.verify_plans = true}};
                                  Sgd sgd{4};
                                  std::vector<float> x(4, 1.f), g(4, 0.5f);
                                  try {
                                    for (int t = 0; t < 10; ++t) dp.step(x, g, 0.1, sgd);
                                  } catch (const mismatch_error&) {
                                    caught[comm.rank()] = 1;
                                    throw;
                                  }
                                }),
                    mismatch_error);
  for (char c : caught) CHECK(c);
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
  SECTION("a non-finite or non-positive learning rate under QSR") {
    DataParallel dp{Dense<ThreadComm>{comms[0]}, QSRPolicy{0.1, 2, 0}, 4};
    CHECK_THROWS_AS(dp.step(x, g, std::nan(""), sgd), invalid_argument);
    CHECK_THROWS_MATCHES(dp.step(x, g, 0.0, sgd), invalid_argument, MessageContains({"lr > 0"}));
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
