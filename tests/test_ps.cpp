// The parameter server (include/commpact/ps/) on in-process ranks: BSP equals all-reduce
// S-SGD bit for bit (one server and sharded, colocated and separate roles); SSP's bound
// holds under seeded random delays for s in {0, 1, 3} and is reached; Ssp{0} equals Bsp;
// ASP progresses past a stalled worker; bytes equal the formula (CountingComm and the
// server's own counters); error feedback conserves what top-k and 1-bit do not send;
// failures and bad input raise on every rank within the deadline and change no parameter.
#include <commpact/comm/thread_comm.hpp>

#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>

#include "common/ps_checks.hpp"

using namespace commpact_test;
using commpact::ThreadComm;
using namespace std::chrono_literals;

namespace {
const commpact::thread_options opts{.timeout = 20s};

// Runs fn on P ranks; a failed check (PS_EXPECT) on any rank fails the test with its message.
template <class F>
void on_threads(int P, F fn) {
  try {
    commpact::run_threads(P, fn, opts);
  } catch (const std::exception& e) {
    FAIL(e.what());
  }
}
}  // namespace

TEST_CASE("ps: BSP equals all-reduce S-SGD bit for bit", "[ps][bsp][bitwise]") {
  const double momentum = GENERATE(0.0, 0.9);
  SECTION("one server, three workers (separate roles)") {
    on_threads(4, [&](ThreadComm& c) { check_bsp_equals_allreduce(c, ps::roles::separate(4, 1), momentum); });
  }
  SECTION("colocated: every rank serves a shard and works, against Dense on the same ranks") {
    on_threads(3, [&](ThreadComm& c) { check_bsp_equals_allreduce(c, ps::roles::colocated(3), momentum); });
  }
  SECTION("two servers, three workers") {
    on_threads(5, [&](ThreadComm& c) { check_bsp_equals_allreduce(c, ps::roles::separate(5, 2), momentum); });
  }
  SECTION("one rank") {
    on_threads(1, [&](ThreadComm& c) { check_bsp_equals_allreduce(c, ps::roles::colocated(1), momentum); });
  }
}

TEST_CASE("ps: Ssp{0} equals Bsp bit for bit under random delays", "[ps][ssp][bitwise]") {
  on_threads(4, [&](ThreadComm& c) { check_ssp0_equals_bsp(c, ps::roles::separate(4, 1)); });
  on_threads(3, [&](ThreadComm& c) { check_ssp0_equals_bsp(c, ps::roles::colocated(3)); });
}

TEST_CASE("ps: SSP never returns parameters older than s clocks, and reaches the bound", "[ps][ssp]") {
  const std::int64_t s = GENERATE(0, 1, 3);
  const int seed = GENERATE(1, 2);
  SECTION("two servers, three workers") {
    on_threads(5, [&](ThreadComm& c) { check_ssp_bound(c, ps::roles::separate(5, 2), s, seed); });
  }
  SECTION("colocated, three ranks") {
    on_threads(3, [&](ThreadComm& c) { check_ssp_bound(c, ps::roles::colocated(3), s, seed); });
  }
}

TEST_CASE("ps: ASP makes progress while a worker is stalled", "[ps][asp]") {
  threads_done separate{2}, colocated{2};  // the fast workers of each run
  on_threads(4, [&](ThreadComm& c) { check_asp_progress(c, ps::roles::separate(4, 1), 600, separate); });
  on_threads(3, [&](ThreadComm& c) { check_asp_progress(c, ps::roles::colocated(3), 600, colocated); });
}

TEST_CASE("ps: bytes per push and pull equal the formula", "[ps][bytes]") {
  SECTION("dense") {
    on_threads(5, [&](ThreadComm& c) { check_ps_bytes(c, ps::roles::separate(5, 2), ps::dense_codec{}, 101, 4); });
    on_threads(3, [&](ThreadComm& c) { check_ps_bytes(c, ps::roles::colocated(3), ps::dense_codec{}, 101, 4); });
  }
  SECTION("top-k") {
    on_threads(5, [&](ThreadComm& c) { check_ps_bytes(c, ps::roles::separate(5, 2), commpact::topk_codec{0.1}, 101, 4); });
  }
  SECTION("1-bit") {
    on_threads(3, [&](ThreadComm& c) { check_ps_bytes(c, ps::roles::colocated(3), commpact::onebit_codec{}, 101, 3); });
  }
}

TEST_CASE("ps: error feedback keeps what the codecs do not send", "[ps][codec]") {
  SECTION("top-k, two servers") {
    on_threads(5, [&](ThreadComm& c) {
      check_ps_error_feedback<commpact::topk_codec>(
          c, ps::roles::separate(5, 2), [](std::size_t, std::size_t, std::size_t) { return commpact::topk_codec{0.05}; },
          1e-4);
    });
  }
  SECTION("1-bit per tensor, each shard's pieces of a layout that a shard boundary cuts") {
    const commpact::tensor_layout layout{{10, 9}, {7, 1}, {6, 10}};  // 157 values
    on_threads(3, [&](ThreadComm& c) {
      check_ps_error_feedback<commpact::per_tensor<commpact::onebit_codec>>(
          c, ps::roles::colocated(3),
          [&](std::size_t, std::size_t lo, std::size_t hi) {
            return commpact::per_tensor<commpact::onebit_codec>{ps::shard_layout(layout, lo, hi)};
          },
          1e-3);
    });
  }
}

TEST_CASE("ps: shard_layout cuts tensors at shard boundaries", "[ps][codec]") {
  const commpact::tensor_layout layout{{2, 3}, {4, 1}, {1, 5}};  // [0,6) [6,10) [10,15)
  const auto a = ps::shard_layout(layout, 0, 8), b = ps::shard_layout(layout, 8, 15);
  REQUIRE(a == commpact::tensor_layout{{1, 6}, {1, 2}});
  REQUIRE(b == commpact::tensor_layout{{1, 2}, {1, 5}});
  for (std::size_t n : {1u, 7u, 100u})
    for (std::size_t S : {1u, 2u, 3u, 7u}) {
      if (S > n) continue;
      std::size_t prev = 0;
      for (std::size_t s = 1; s <= S; ++s) {
        const std::size_t len = ps::shard_begin(n, S, s) - ps::shard_begin(n, S, s - 1);
        REQUIRE((len == n / S || len == n / S + 1));
        prev = ps::shard_begin(n, S, s);
      }
      REQUIRE(prev == n);
    }
}

// ---- failures ------------------------------------------------------------------------

namespace {
struct outcome {
  std::string what;  // empty: returned normally
  bool own = false;  // raised invalid_argument / mismatch_error (its own error), not a peer's failure
  double seconds = 0;
};

// Runs body on P ranks (timeout `t`), recording what each rank raised and when.
template <class F>
std::vector<outcome> run_failing(int P, std::chrono::milliseconds t, F body) {
  std::vector<outcome> out(static_cast<std::size_t>(P));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    commpact::run_threads(
        P,
        [&](ThreadComm& c) {
          auto& o = out[static_cast<std::size_t>(c.rank())];
          try {
            body(c);
          } catch (const commpact::comm_error& e) {
            o.what = e.what();
          } catch (const std::exception& e) {
            o.what = e.what(), o.own = true;
          }
          o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (!o.what.empty()) throw std::runtime_error(o.what);
        },
        {.timeout = t});
  } catch (...) {
  }
  return out;
}

// Runs f on a rank of a failing run; when it raises there, a server rank first keeps
// its shard in `after` (under m), so that the test can check that nothing was applied.
template <class Server, class F>
void keeping_shard(Server& server, std::mutex& m, std::vector<float>& after, F f) {
  try {
    f();
  } catch (...) {
    if (server.is_server()) {
      std::lock_guard lk(m);
      after.assign(server.shard_params().begin(), server.shard_params().end());
    }
    throw;
  }
}
}  // namespace

TEST_CASE("ps: a worker that fails makes every rank raise at once", "[ps][failure]") {
  auto out = run_failing(4, 10s, [](ThreadComm& c) {
    const auto r = ps::roles::separate(4, 1);
    std::vector<float> init(40, 1.0f), x(40), g(40, 0.5f);
    ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Bsp> server{c, r, init};
    if (server.is_worker())
      for (int t = 0; t < 10; ++t) {
        server.pull(x);
        if (c.rank() == 2 && t == 3) throw commpact::invalid_argument("worker 2's data loader failed");
        server.push(g, 0.1);
      }
    server.finish();
  });
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r, out[r].what);
    REQUIRE(!out[r].what.empty());
    REQUIRE(out[r].seconds < 5.0);  // failure propagation, far inside the 10 s deadline
  }
  REQUIRE(out[2].what.find("data loader") != std::string::npos);
}

TEST_CASE("ps: a server that fails makes every worker raise at once", "[ps][failure]") {
  auto out = run_failing(5, 10s, [](ThreadComm& c) {
    const auto r = ps::roles::separate(5, 2);
    std::vector<float> init(40, 1.0f), x(40), g(40, 0.5f);
    ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Ssp> server{c, r, init, ps::Ssp{2}};
    if (c.rank() == 1) {
      std::this_thread::sleep_for(50ms);
      throw std::runtime_error("server 1 lost its disk");
    }
    if (server.is_worker())
      for (int t = 0; t < 1000; ++t) {
        server.pull(x);
        server.push(g, 0.1);
      }
    server.finish();
  });
  for (int r = 0; r < 5; ++r) {
    CAPTURE(r, out[r].what);
    REQUIRE(!out[r].what.empty());
    REQUIRE(out[r].seconds < 5.0);
  }
}

TEST_CASE("ps: a silent worker makes the others raise at the deadline, not hang", "[ps][failure]") {
  auto out = run_failing(3, 300ms, [](ThreadComm& c) {
    const auto r = ps::roles::colocated(3);
    std::vector<float> init(30, 1.0f), x(30), g(30, 0.5f);
    ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Bsp> server{c, r, init};
    for (int t = 0; t < 5; ++t) {
      server.pull(x);
      if (c.rank() == 1 && t == 2) std::this_thread::sleep_for(1500ms);
      server.push(g, 0.1);
    }
    server.finish();
  });
  for (int r : {0, 2}) {
    CAPTURE(r, out[r].what);
    REQUIRE(!out[r].what.empty());
    REQUIRE(out[r].seconds < 1.4);  // before the sleeper wakes
  }
}

TEST_CASE("ps: a push of the wrong length raises on every rank and changes no parameter", "[ps][failure][input]") {
  const std::size_t n = 33;
  const auto ref = ps_reference(n, 3, 2, 0.9, 9);  // the parameters after clocks 0 and 1
  std::vector<float> shard_after;
  std::mutex m;
  auto out = run_failing(4, 10s, [&](ThreadComm& c) {
    const auto r = ps::roles::separate(4, 1);
    auto init = ps_init(n, 9);
    ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Bsp> server{c, r, init, {}, {.momentum = 0.9}};
    keeping_shard(server, m, shard_after, [&] {
      if (server.is_worker()) {
        const int w = c.rank() - 1;
        std::vector<float> x(n), g(n);
        for (int t = 0; t < 4; ++t) {
          server.pull(x);
          ps_grad(w, x, g);
          if (w == 1 && t == 2) g.resize(n - 1);
          server.push(g, ps_lr(t));
        }
      }
      server.finish();
    });
  });
  REQUIRE(out[2].own);
  REQUIRE(out[2].what.find("pushed 32 values; the model has n = 33") != std::string::npos);
  for (int r : {0, 1, 3}) {
    CAPTURE(r, out[r].what);
    REQUIRE(!out[r].what.empty());
    REQUIRE(!out[r].own);
  }
  REQUIRE(same_bits(shard_after, ref));
}

TEST_CASE("ps: ranks that disagree on the model or the roles all raise at construction", "[ps][failure][input]") {
  SECTION("one rank's model is longer") {
    auto out = run_failing(3, 10s, [](ThreadComm& c) {
      std::vector<float> init(c.rank() == 2 ? 21 : 20, 0.0f);
      ps::ParameterServer<ThreadComm> server{c, ps::roles::colocated(3), init};
      server.finish();
    });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r, out[r].what);
      REQUIRE(out[r].what.find("ranks disagree on the model length n") != std::string::npos);
      // The constructor's error names the constructor and what every rank must build alike
      // (it said "ParameterServer::reduce" and gave a step's advice).
      REQUIRE(out[r].what.find("commpact::ps::ParameterServer::ParameterServer: ") == 0);
      REQUIRE(out[r].what.find("must build the ParameterServer with the same model length") != std::string::npos);
      REQUIRE(out[r].what.find("step count") == std::string::npos);
      REQUIRE(out[r].own);
    }
  }
  SECTION("one rank has other roles") {
    auto out = run_failing(3, 10s, [](ThreadComm& c) {
      std::vector<float> init(20, 0.0f);
      ps::ParameterServer<ThreadComm> server{c, c.rank() == 0 ? ps::roles::separate(3, 1) : ps::roles::colocated(3),
                                             init};
      server.finish();
    });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r, out[r].what);
      REQUIRE(out[r].what.find("ranks disagree on the roles") != std::string::npos);
    }
  }
  SECTION("one rank's roles name a rank that does not exist") {
    auto out = run_failing(3, 10s, [](ThreadComm& c) {
      std::vector<float> init(20, 0.0f);
      ps::roles r = ps::roles::colocated(3);
      r.workers.push_back(7);
      ps::ParameterServer<ThreadComm> server{c, r, init};
      server.finish();
    });
    for (int r = 0; r < 3; ++r) REQUIRE(out[r].what.find("worker rank 7 is outside [0, 3)") != std::string::npos);
  }
  SECTION("a staleness bound that differs") {
    auto out = run_failing(2, 10s, [](ThreadComm& c) {
      std::vector<float> init(20, 0.0f);
      ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Ssp> server{c, ps::roles::colocated(2), init,
                                                                       ps::Ssp{c.rank() + 1}};
      server.finish();
    });
    for (int r = 0; r < 2; ++r) REQUIRE(out[r].what.find("ranks disagree on the staleness bound") != std::string::npos);
  }
  SECTION("a momentum that differs, and one that is invalid") {
    auto out = run_failing(2, 10s, [](ThreadComm& c) {
      std::vector<float> init(20, 0.0f);
      ps::ParameterServer<ThreadComm> server{c, ps::roles::colocated(2), init, {}, {.momentum = 0.5 + 0.4 * c.rank()}};
      server.finish();
    });
    for (int r = 0; r < 2; ++r) REQUIRE(out[r].what.find("ranks disagree on the servers' momentum") != std::string::npos);
    out = run_failing(2, 10s, [](ThreadComm& c) {
      std::vector<float> init(20, 0.0f);
      ps::ParameterServer<ThreadComm> server{c, ps::roles::separate(2, 1), init, {}, {.momentum = 1.5}};
      server.finish();
    });
    for (int r = 0; r < 2; ++r) REQUIRE(out[r].what.find("momentum = 1.5 must lie in [0, 1)") != std::string::npos);
  }
  REQUIRE_THROWS_AS(ps::Ssp{-1}, commpact::invalid_argument);
}

// The agreement the constructor runs (commpact::agree with a call that is not a step):
// one rank alone rejects its arguments, with values that agree, so the others raise
// peer_failure naming the constructor, not a step of reduce.
TEST_CASE("ps: agree() under a constructor's name: one rank's rejected arguments reach the others as that call's",
          "[ps][failure][input]") {
  auto out = run_failing(3, 10s, [](ThreadComm& c) {
    commpact::agree(c, "ps::ParameterServer", {{"the model length n", 20}},
                    c.rank() == 1 ? std::string("rank 1's own reason") : std::string(), 0, "ParameterServer",
                    "every rank must build the ParameterServer alike.");
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r, out[r].what);
    if (r == 1) {
      REQUIRE(out[r].what == "rank 1's own reason");
      REQUIRE(out[r].own);
    } else {
      REQUIRE(out[r].what ==
              "commpact::ps::ParameterServer::ParameterServer: another rank rejected its arguments (its own error "
              "says why); every rank raises here.");
      REQUIRE_FALSE(out[r].own);
    }
  }
  // A mismatch ends with the given advice, under the same name.
  out = run_failing(2, 10s, [](ThreadComm& c) {
    commpact::agree(c, "ps::ParameterServer", {{"the model length n", 20 + c.rank()}}, std::string(), 0,
                    "ParameterServer", "every rank must build the ParameterServer alike.");
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r, out[r].what);
    REQUIRE(out[r].what.find("commpact::ps::ParameterServer::ParameterServer: ranks disagree on the model length n") ==
            0);
    REQUIRE(out[r].what.find("; every rank must build the ParameterServer alike.") != std::string::npos);
  }
}

TEST_CASE("ps: a malformed or out-of-order message raises wire_error on the server and fails every rank",
          "[ps][failure][wire]") {
  const std::size_t n = 24;
  const int kind = GENERATE(0, 1, 2);  // 0: not a header; 1: a push of the wrong clock; 2: of the wrong length
  std::vector<float> shard_after;
  auto out = run_failing(3, 10s, [&](ThreadComm& c) {
    const auto r = ps::roles::separate(3, 1);
    std::vector<float> init(n, 1.0f), x(n), g(n, 0.5f);
    ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Bsp> server{c, r, init};
    try {
      if (c.rank() == 2) {  // a rogue worker writes to the server behind the parameter server's back
        std::array<std::byte, ps::wire::header_bytes> h{};
        std::vector<std::byte> payload(4 * n, std::byte{0});
        if (kind == 0) {
          h.fill(std::byte{0x5a});
          c.send(0, h);
        } else {
          ps::wire::header w{ps::wire::kind::push, ps::wire::pull_after, 0, static_cast<std::uint32_t>(4 * n),
                             kind == 1 ? 5 : 0, static_cast<std::int64_t>(kind == 2 ? n + 1 : n), 0.1};
          ps::wire::write(h, w);
          c.send(0, h);
          c.send(0, payload);
        }
      }
      if (server.is_worker())
        for (int t = 0; t < 3; ++t) {
          server.pull(x);
          server.push(g, 0.1);
        }
      server.finish();
    } catch (...) {
      if (server.is_server()) shard_after.assign(server.shard_params().begin(), server.shard_params().end());
      throw;
    }
  });
  CAPTURE(kind, out[0].what);
  REQUIRE(out[0].own);
  const char* want[] = {"is not a parameter-server header", "received the push of clock 5 from worker 1",
                        "for 25 values with 96 bytes"};
  REQUIRE(out[0].what.find(want[kind]) != std::string::npos);
  for (int r : {1, 2}) REQUIRE(!out[r].what.empty());
  // No step was applied: worker 1's first push never completed clock 0 (the server
  // rejected the rogue message before or instead of it).
  REQUIRE(shard_after == std::vector<float>(n, 1.0f));
}

// ---- values a server applies ------------------------------------------------------------

namespace {
// dense_codec whose messages carry `poison` at index 0 instead of the value (a worker
// whose push was corrupted after push() checked its gradient).
struct poisoned_codec {
  float poison = 0.0f;
  bool active = false;
  std::size_t max_encoded_bytes(std::size_t n) const { return 4 * n; }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) const {
    const std::size_t b = ps::dense_codec{}.encode(v, msg, approx);
    if (active && !v.empty()) std::memcpy(msg.data(), &poison, 4);
    return b;
  }
  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const { ps::dense_codec{}.decode_add(msg, acc); }
};

}  // namespace

TEST_CASE("ps: a push whose payload holds NaN or Inf raises wire_error on its server, naming the worker, and applies nothing",
          "[ps][failure][wire][values]") {
  const std::size_t n = 24;
  const float poison = GENERATE(std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity());
  std::vector<float> shard_after;
  std::mutex m;
  auto out = run_failing(3, 10s, [&](ThreadComm& c) {
    const auto r = ps::roles::separate(3, 1);
    std::vector<float> init(n, 1.0f), x(n), g(n, 0.5f);
    ps::ParameterServer<ThreadComm, poisoned_codec, ps::Bsp> server{
        c, r, init, {}, {}, [&](std::size_t, std::size_t, std::size_t) { return poisoned_codec{poison, c.rank() == 2}; }};
    keeping_shard(server, m, shard_after, [&] {
      if (server.is_worker())
        for (int t = 0; t < 3; ++t) {
          server.pull(x);
          server.push(g, 0.1);
        }
      server.finish();
    });
  });
  CAPTURE(poison, out[0].what);
  REQUIRE(out[0].own);
  REQUIRE(out[0].what.find("from worker 1 (rank 2) that decodes to the non-finite value") != std::string::npos);
  for (int r : {1, 2}) REQUIRE(!out[r].what.empty());
  REQUIRE(shard_after == std::vector<float>(n, 1.0f));
}

TEST_CASE("ps: a push header whose lr is not a finite float > 0 raises wire_error on the server and applies nothing",
          "[ps][failure][wire][values]") {
  const std::size_t n = 24;
  const double lr = GENERATE(1e39, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                             -1.0, 0.0);
  std::vector<float> shard_after;
  std::mutex m;
  auto out = run_failing(3, 10s, [&](ThreadComm& c) {
    const auto r = ps::roles::separate(3, 1);
    std::vector<float> init(n, 1.0f), x(n), g(n, 0.5f);
    ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Bsp> server{c, r, init};
    keeping_shard(server, m, shard_after, [&] {
      if (c.rank() == 2) {  // a rogue worker: a well-formed push of clock 0 with a bad lr
        std::array<std::byte, ps::wire::header_bytes> h{};
        std::vector<float> payload(n, 0.5f);
        ps::wire::write(h, {ps::wire::kind::push, ps::wire::pull_after, 0, static_cast<std::uint32_t>(4 * n), 0,
                            static_cast<std::int64_t>(n), lr});
        c.send(0, h);
        c.send(0, std::as_bytes(std::span<const float>(payload)));
      }
      if (server.is_worker())
        for (int t = 0; t < 3; ++t) {
          server.pull(x);
          server.push(g, 0.1);
        }
      server.finish();
    });
  });
  CAPTURE(lr, out[0].what);
  REQUIRE(out[0].own);
  REQUIRE(out[0].what.find("received a push from rank 2 with lr = ") != std::string::npos);
  REQUIRE(out[0].what.find("not a finite float > 0") != std::string::npos);
  for (int r : {1, 2}) REQUIRE(!out[r].what.empty());
  REQUIRE(shard_after == std::vector<float>(n, 1.0f));
}

TEST_CASE("ps: under Bsp and Ssp, workers that push one clock at different learning rates raise mismatch_error "
          "on the server, every rank raises, nothing is applied", "[ps][failure][values]") {
  const std::size_t n = 24;
  const bool ssp = GENERATE(false, true);
  CAPTURE(ssp);
  std::vector<float> shard_after;
  std::mutex m;
  auto run = [&](auto model) {
    return run_failing(3, 10s, [&](ThreadComm& c) {
      const auto r = ps::roles::separate(3, 1);
      std::vector<float> init(n, 1.0f), x(n), g(n, 0.5f);
      ps::ParameterServer<ThreadComm, ps::dense_codec, decltype(model)> server{c, r, init, model};
      keeping_shard(server, m, shard_after, [&] {
        if (server.is_worker())
          for (int t = 0; t < 3; ++t) {
            server.pull(x);
            server.push(g, c.rank() == 2 ? 0.2 : 0.1);  // worker 1 (rank 2) at another rate
          }
        server.finish();
      });
    });
  };
  const auto out = ssp ? run(ps::Ssp{1}) : run(ps::Bsp{});
  CAPTURE(out[0].what);
  REQUIRE(out[0].own);
  REQUIRE(out[0].what.find("carry different learning rates (0.1 and 0.2 from worker 1, rank 2)") != std::string::npos);
  for (int r : {1, 2}) REQUIRE(!out[r].what.empty());
  REQUIRE(shard_after == std::vector<float>(n, 1.0f));
}

TEST_CASE("ps: push() refuses an lr that is not a finite float > 0 before sending anything", "[ps][failure][input][values]") {
  const std::size_t n = 20;
  const double lr = GENERATE(1e39, std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::infinity(),
                             -1.0, 0.0);
  std::vector<float> shard_after;
  std::mutex m;
  auto out = run_failing(3, 10s, [&](ThreadComm& c) {
    const auto r = ps::roles::separate(3, 1);
    std::vector<float> init(n, 1.0f), x(n), g(n, 0.5f);
    ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Bsp> server{c, r, init};
    keeping_shard(server, m, shard_after, [&] {
      if (server.is_worker()) {
        server.pull(x);
        server.push(g, c.rank() == 1 ? lr : 0.1);
      }
      server.finish();
    });
  });
  CAPTURE(lr, out[1].what);
  REQUIRE(out[1].own);
  REQUIRE(out[1].what.find("passed lr = ") != std::string::npos);
  REQUIRE(out[1].what.find("commpact::ps::ParameterServer::push") != std::string::npos);
  for (int r : {0, 2}) REQUIRE(!out[r].what.empty());
  REQUIRE(shard_after == std::vector<float>(n, 1.0f));
}

namespace {
//! What every rank of an overflow run ended with: its error class ("none",
//! "numeric_error", or another error's message) and its shard.
struct overflow_outcome {
  int P = 0;
  std::vector<std::vector<float>> shards;
  std::vector<std::string> cls;
};

//! Every worker runs 4 clocks of pull and push(g, lr) on n = 30 parameters, all 1.0 but
//! parameter 7 = init7; g is 0.25 everywhere except g[7] = g7 at clock 1. setup: 0 Bsp
//! separate(4, 1); 1 Ssp{1} separate(5, 2); 2 Bsp colocated(3); 3 Asp colocated(3).
overflow_outcome overflow_run(int setup, float g7, double lr, float init7) {
  const std::size_t n = 30;
  overflow_outcome out;
  out.P = setup == 1 ? 5 : setup == 0 ? 4 : 3;
  out.shards.resize(static_cast<std::size_t>(out.P));
  out.cls.resize(static_cast<std::size_t>(out.P));
  std::mutex m;
  auto body = [&](ThreadComm& c, auto& server) {
    std::vector<float> x(n), g(n, 0.25f);
    auto& cls = out.cls[static_cast<std::size_t>(c.rank())];
    try {
      if (server.is_worker())
        for (int t = 0; t < 4; ++t) {
          server.pull(x);
          g[7] = t == 1 ? g7 : 0.25f;
          server.push(g, lr);
        }
      server.finish();
      cls = "none";
    } catch (const commpact::numeric_error&) {
      cls = "numeric_error";
    } catch (const std::exception& e) {
      cls = e.what();
    }
    std::lock_guard lk(m);
    out.shards[static_cast<std::size_t>(c.rank())].assign(server.shard_params().begin(), server.shard_params().end());
  };
  commpact::run_threads(
      out.P,
      [&](ThreadComm& c) {
        std::vector<float> init(n, 1.0f);
        init[7] = init7;
        if (setup == 0) {
          ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Bsp> s{c, ps::roles::separate(4, 1), init};
          body(c, s);
        } else if (setup == 1) {
          ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Ssp> s{c, ps::roles::separate(5, 2), init, ps::Ssp{1}};
          body(c, s);
        } else if (setup == 2) {
          ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Bsp> s{c, ps::roles::colocated(3), init};
          body(c, s);
        } else {
          ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Asp> s{c, ps::roles::colocated(3), init};
          body(c, s);
        }
      },
      opts);
  return out;
}
}  // namespace

TEST_CASE("ps: finite pushes whose sum overflows raise numeric_error on every rank and apply nothing",
          "[ps][failure][values][overflow]") {
  const int setup = GENERATE(0, 1, 2, 3);  // overflow_run's setups
  // Every worker, at clock 1: 3e38 at one index.
  const auto [P, shards, cls] = overflow_run(setup, 3e38f, 0.1, 1.0f);
  CAPTURE(setup);
  if (setup == 3) {
    // Asp applies each push alone (push / W): 3e38 / 3 is finite, so nothing overflows.
    for (int r = 0; r < P; ++r) CHECK(cls[static_cast<std::size_t>(r)] == "none");
    return;
  }
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    CHECK(cls[static_cast<std::size_t>(r)] == "numeric_error");
    for (const float v : shards[static_cast<std::size_t>(r)]) CHECK(std::isfinite(v));
  }
  // Index 7 is in shard 0 (rank 0's): clock 0 was applied there (1 - 0.1 x 0.25), clock 1
  // was not (another shard may have applied clock 1 and later ones meanwhile).
  REQUIRE(!shards[0].empty());
  const float after_clock0 = 1.0f - static_cast<float>(0.1) * 0.25f;
  for (const float v : shards[0]) CHECK(v == after_clock0);
}

TEST_CASE("ps: finite pushes whose Sgd step overflows a parameter raise numeric_error on every rank and leave the "
          "shard unchanged",
          "[ps][failure][values][overflow]") {
  const int setup = GENERATE(0, 1, 2, 3);  // overflow_run's setups
  // Every worker, at clock 1: -1e38 at index 7, whose parameter is 3e38. The sum of the
  // pushes is finite; x - 10 (mean) is not (Asp: x - 10 (push / 3)).
  const auto [P, shards, cls] = overflow_run(setup, -1e38f, 10.0, 3e38f);
  CAPTURE(setup);
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    CHECK(cls[static_cast<std::size_t>(r)] == "numeric_error");
    for (const float v : shards[static_cast<std::size_t>(r)]) CHECK(std::isfinite(v));
  }
  // Index 7 is in shard 0 (rank 0's): its clock-1 step was not applied (3e38 - 10 x 0.25
  // rounds to 3e38, so clock 0 left it there).
  REQUIRE(!shards[0].empty());
  CHECK(shards[0][7] == 3e38f);
  if (setup != 3) {  // Bsp/Ssp: exactly clock 0 applied to shard 0 (1 - 10 x 0.25)
    const float after_clock0 = 1.0f - static_cast<float>(10.0) * 0.25f;
    for (std::size_t i = 0; i < shards[0].size(); ++i)
      if (i != 7) CHECK(shards[0][i] == after_clock0);
  }
}
