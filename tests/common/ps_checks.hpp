#pragma once
// Checks of the parameter server (include/commpact/ps/), written once over any
// communicator and run on every rank: on ThreadComm (tests/test_ps.cpp) and under
// mpiexec (tests/mpi/test_ps_mpi.cpp). Every reference is computed serially on every rank.
#include <commpact/comm/counting_comm.hpp>
#include <commpact/compress/codecs/per_tensor.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/ps/parameter_server.hpp>

#include <catch2/catch.hpp>

#include "bits.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

namespace commpact_test {

namespace ps = commpact::ps;

// Catch2 is not thread-safe: the checks run inside ranks report a failure by throwing
// (the parameter server then makes every other rank raise, and the caller's
// REQUIRE_NOTHROW-like wrapper reports the message).
struct ps_check_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};
#define PS_EXPECT(cond, ...)                                                                                  \
  do {                                                                                                        \
    if (!(cond))                                                                                              \
      throw ::commpact_test::ps_check_failed(                                                                 \
          ::commpact::detail::cat("check failed: " #cond " (", __FILE__, ":", __LINE__, ") " __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

inline std::vector<float> ps_init(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// A gradient that depends on the parameters (so that any difference in the trajectory
// shows), different per worker: g_i = c_wi (x_i - t_wi) + 0.1 x_{i+1}.
inline void ps_grad(int w, std::span<const float> x, std::span<float> g) {
  const std::size_t n = x.size();
  for (std::size_t i = 0; i < n; ++i) {
    const float c = 0.5f + 0.25f * float((i * 7 + static_cast<std::size_t>(w) * 3) % 5);
    const float t = float(int((i * 13 + static_cast<std::size_t>(w) * 5) % 11) - 5) * 0.3f;
    g[i] = c * (x[i] - t) + 0.1f * x[(i + 1) % n];
  }
}
inline double ps_lr(std::int64_t t) { return 0.1 / (1.0 + 0.25 * double(t)); }

// The serial all-reduce S-SGD reference: at each clock the W gradients at the same x,
// summed in worker order as ThreadComm's allreduce does (g_0, then + g_1, ...), divided
// by W (mean_of), one Sgd step.
inline std::vector<float> ps_reference(std::size_t n, int W, int T, double momentum, std::uint64_t seed) {
  auto x = ps_init(n, seed);
  commpact::Sgd opt(n, {.momentum = momentum});
  std::vector<float> g(n), sum(n);
  for (int t = 0; t < T; ++t) {
    for (int w = 0; w < W; ++w) {
      ps_grad(w, x, g);
      for (std::size_t i = 0; i < n; ++i) sum[i] = w == 0 ? g[i] : sum[i] + g[i];
    }
    for (auto& s : sum) s = commpact::mean_of(s, W);
    opt(x, sum, ps_lr(t));
  }
  return x;
}

// Runs the worker loop of ps_reference on the parameter server and returns the final
// parameters (every rank).
template <class Model, class C>
std::vector<float> ps_train(C& comm, const ps::roles& r, std::size_t n, int T, double momentum, std::uint64_t seed,
                            Model model = {}, int delay_seed = -1) {
  auto init = ps_init(n, seed);
  ps::ParameterServer<C, ps::dense_codec, Model> server{comm, r, init, model, {.momentum = momentum}};
  std::vector<float> x(n), g(n);
  if (server.is_worker()) {
    const int w = static_cast<int>(std::find(r.workers.begin(), r.workers.end(), comm.rank()) - r.workers.begin());
    std::mt19937 rng(static_cast<unsigned>(delay_seed + 17 * w));
    for (int t = 0; t < T; ++t) {
      server.pull(x);
      ps_grad(w, x, g);
      if (delay_seed >= 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1500));
      server.push(g, ps_lr(t));
    }
  }
  server.finish();
  server.final_params(x);
  return x;
}

// BSP equals all-reduce S-SGD bit for bit: against the serial reference, and (colocated,
// every rank a worker) against Dense's allreduce + Sgd on the same communicator.
// `rank_order_allreduce`: the communicator's allreduce sums in rank order (ThreadComm;
// MpiComm's recursive doubling pairs ranks differently, so there only the serial
// reference, which is ThreadComm's order, is compared).
template <class C>
void check_bsp_equals_allreduce(C& comm, const ps::roles& r, double momentum, bool rank_order_allreduce = true) {
  const std::size_t n = 61;
  const int T = 7, W = static_cast<int>(r.workers.size());
  const auto ref = ps_reference(n, W, T, momentum, 5);
  const auto got = ps_train<ps::Bsp>(comm, r, n, T, momentum, 5);
  PS_EXPECT(same_bits(got, ref));
  if (rank_order_allreduce && W == comm.size()) {  // every rank works: the all-reduce run on the same ranks
    auto x = ps_init(n, 5);
    std::vector<float> g(n);
    commpact::Dense<C> dense{comm};
    commpact::Sgd opt(n, {.momentum = momentum});
    for (int t = 0; t < T; ++t) {
      ps_grad(comm.rank(), x, g);
      dense.reduce(g);
      opt(x, g, ps_lr(t));
    }
    PS_EXPECT(same_bits(x, ref));
  }
}

// Ssp{0} is Bsp: the same parameters bit for bit, under random delays.
template <class C>
void check_ssp0_equals_bsp(C& comm, const ps::roles& r) {
  const std::size_t n = 29;
  const auto bsp = ps_train<ps::Bsp>(comm, r, n, 6, 0.9, 11, {}, 3);
  const auto ssp = ps_train<ps::Ssp>(comm, r, n, 6, 0.9, 11, ps::Ssp{0}, 4);
  PS_EXPECT(same_bits(bsp, ssp));
}

// The counting model: n = S * W, coordinate s * W + w belongs to worker w in shard s;
// worker w's gradient is -1 on its coordinates, the learning rate W, so every applied
// clock (or, under Asp, every applied push of w) adds exactly 1 to w's coordinates. A
// read's values say which updates it holds.
struct count_result {
  std::int64_t max_staleness = 0;  // the largest c - (a coordinate's value) seen in a read
  std::int64_t violations = 0;     // reads older than the bound, or newer than possible
  std::vector<float> final_x;
};

template <class Model, class C>
count_result run_counting(C& comm, const ps::roles& r, Model model, int T, int seed, int slow_worker, int slow_us) {
  const int W = static_cast<int>(r.workers.size()), S = static_cast<int>(r.servers.size());
  const std::size_t n = static_cast<std::size_t>(S * W);
  std::vector<float> init(n, 0.0f), x(n), g(n, 0.0f);
  ps::ParameterServer<C, ps::dense_codec, Model> server{comm, r, init, model, {.record_reads = true}};
  PS_EXPECT(server.shard_lo(1 % S) == static_cast<std::size_t>((1 % S) * W));
  count_result res;
  const std::int64_t s = model.staleness();
  if (server.is_worker()) {
    const int w = static_cast<int>(std::find(r.workers.begin(), r.workers.end(), comm.rank()) - r.workers.begin());
    for (int sh = 0; sh < S; ++sh) g[static_cast<std::size_t>(sh * W + w)] = -1.0f;
    std::mt19937 rng(static_cast<unsigned>(seed * 101 + w));
    for (int c = 0; c < T; ++c) {
      server.pull(x);
      for (int sh = 0; sh < S; ++sh)
        for (int v = 0; v < W; ++v) {
          const float val = x[static_cast<std::size_t>(sh * W + v)];
          const auto cnt = static_cast<std::int64_t>(val);
          if (float(cnt) != val) ++res.violations;              // not a whole number of updates
          if (v == w && cnt != c && Model::per_push) ++res.violations;  // Asp: its own pushes, all of them
          if (cnt > c && !Model::per_push) ++res.violations;    // a clock this worker has not pushed
          if (s >= 0 && cnt < c - s) ++res.violations;          // older than the bound
          res.max_staleness = std::max(res.max_staleness, c - cnt);
        }
      const auto& rec = server.reads().back();
      if (rec.clock != c || (s >= 0 && rec.min_version < c - s)) ++res.violations;
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 800 + (w == slow_worker ? slow_us : 0)));
      server.push(g, double(W));
    }
  }
  server.finish();
  res.final_x.resize(n);
  server.final_params(res.final_x);
  return res;
}

// SSP's bound holds under seeded random delays, with one worker slower so that the fast
// ones run into the bound: no read is older than s clocks, and the bound is reached
// (the server does not make a worker wait longer than it must). Every update is applied.
template <class C>
void check_ssp_bound(C& comm, const ps::roles& r, std::int64_t s, int seed) {
  const int T = 10;
  auto res = run_counting(comm, r, ps::Ssp{s}, T, seed, 0, 12000);
  PS_EXPECT(res.violations == 0, "s = ", s, ", seed ", seed, ": ", res.violations, " bad reads");
  for (float v : res.final_x) PS_EXPECT(v == float(T));
  // With servers of their own (separate roles) the fast workers hit the bound exactly:
  // the server does not make them wait longer than it must. (A colocated server answers
  // only when its rank calls into the server, so a read may come later and be fresher.)
  std::int64_t m = res.max_staleness;
  comm.allreduce(std::span<std::int64_t>(&m, 1), commpact::reduce_op::max);
  PS_EXPECT(m <= s, "largest staleness ", m, ", s = ", s);
  const bool separate = std::find(r.workers.begin(), r.workers.end(), r.servers.back()) == r.workers.end();
  if (separate) PS_EXPECT(m == s, "largest staleness ", m, ", s = ", s);
}

// The fast workers' "finished" signal for check_asp_progress, shared by threads:
// arrive() when a fast worker has finished its clocks; ready() once all of them have;
// join() (every other rank, first) and close() (every rank, last) are for a signal between
// processes (an MPI_Ibarrier).
struct threads_done {
  explicit threads_done(int fast) : fast(fast) {}
  int fast;
  std::atomic<int> arrived{0};
  void join() {}
  void arrive() { ++arrived; }
  bool ready() { return arrived.load() >= fast; }
  void close() {}
};

// ASP: a worker that stalls (at least stall_ms after its first push, and until every fast
// worker has finished, at most 20 s) does not stop the others: they finish all their
// clocks while it stalls (without ASP they would wait for its pushes until the 20 s cap),
// each read holds all of the reader's own pushes, and every push of every worker is
// applied once. The signal, not a sleep, orders the fast workers before the stalled one:
// a loaded machine slowed their 20 clocks past 0.6 s.
template <class C, class Done>
void check_asp_progress(C& comm, const ps::roles& r, int stall_ms, Done& done) {
  const int W = static_cast<int>(r.workers.size()), S = static_cast<int>(r.servers.size());
  const int T = 20;
  const std::size_t n = static_cast<std::size_t>(S * W);
  std::vector<float> init(n, 0.0f), x(n), g(n, 0.0f);
  ps::ParameterServer<C, ps::dense_codec, ps::Asp> server{comm, r, init, {}, {.record_reads = true}};
  const int stalled = W - 1;
  double fast_seconds = 0, stall_seconds = 0;
  std::int64_t violations = 0, stalled_seen_max = 0;
  const bool fast = server.is_worker() && std::find(r.workers.begin(), r.workers.end(), comm.rank()) -
                                                   r.workers.begin() != stalled;
  if (!fast) done.join();
  if (server.is_worker()) {
    const int w = static_cast<int>(std::find(r.workers.begin(), r.workers.end(), comm.rank()) - r.workers.begin());
    for (int sh = 0; sh < S; ++sh) g[static_cast<std::size_t>(sh * W + w)] = -1.0f;
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < T; ++c) {
      server.pull(x);
      for (int sh = 0; sh < S; ++sh) {
        if (x[static_cast<std::size_t>(sh * W + w)] != float(c)) ++violations;
        stalled_seen_max = std::max(stalled_seen_max, static_cast<std::int64_t>(x[static_cast<std::size_t>(sh * W + stalled)]));
      }
      if (w == stalled && c == 1) {
        // A colocated rank serves its shard only inside the server's calls: while its
        // worker stalls it keeps polling (as a training loop's hook would); a worker-only
        // rank just sleeps.
        const auto now = std::chrono::steady_clock::now();
        const auto least = now + std::chrono::milliseconds(stall_ms), most = now + std::chrono::seconds(20);
        for (auto t = now; t < most && (t < least || !done.ready()); t = std::chrono::steady_clock::now()) {
          if (server.is_server()) server.poll();
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
      server.push(g, double(W));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (w == stalled ? stall_seconds : fast_seconds) = secs;
    if (w != stalled) {
      done.arrive();
      PS_EXPECT(stalled_seen_max <= 1);  // they ran while it slept
    }
  }
  server.finish();
  done.close();
  std::vector<float> fin(n);
  server.final_params(fin);
  PS_EXPECT(violations == 0);
  for (float v : fin) PS_EXPECT(v == float(T));
  double t[2] = {fast_seconds, stall_seconds};
  comm.allreduce(std::span<double>(t, 2), commpact::reduce_op::max);
  PS_EXPECT(t[1] >= stall_ms / 1000.0, "stalled worker took ", t[1], " s");
  // That the fast workers never waited for the stalled one is stalled_seen_max <= 1
  // above (they finished while it stalled), not a wall-clock bound, which a loaded machine
  // misses (0.37 s against 0.36 s was seen).
}

// Bytes per push and pull equal the formula (wire.hpp), counted by CountingComm under
// the parameter server and by its own counters: per remote server s, a push is a
// 40-byte header and e_s payload bytes (2 messages), a reply 40 + 4 n_s; a pull request,
// done, bye are 40 bytes each.
template <class K, class C>
void check_ps_bytes(C& base, const ps::roles& r, K codec, std::size_t n, int T) {
  commpact::CountingComm<C> comm{base};
  const int S = static_cast<int>(r.servers.size());
  auto init = ps_init(n, 3);
  ps::ParameterServer<commpact::CountingComm<C>, K, ps::Bsp> server{comm, r, init, {}, {}, codec};
  comm.reset_stats();  // the construction's agreement allreduce is not the server's traffic
  std::vector<float> x(n), g(n);
  const int me = comm.rank();
  std::uint64_t want_bytes = 0, want_msgs = 0, want_recv = 0;
  const auto is = [&](const std::vector<int>& v, int q) { return std::find(v.begin(), v.end(), q) != v.end(); };
  std::vector<std::size_t> e(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) {
    const std::size_t len = server.shard_lo(s + 1) - server.shard_lo(s);
    K k = codec;
    e[s] = k.max_encoded_bytes(len);  // dense, top-k and 1-bit messages have exactly this length
  }
  if (server.is_worker()) {
    for (int t = 0; t < T; ++t) {
      server.pull(x);
      ps_grad(0, x, g);
      server.push(g, 0.01);
    }
    server.pull(x);
    for (int s = 0; s < S; ++s) {
      if (r.servers[s] == me) continue;
      const std::size_t len = server.shard_lo(s + 1) - server.shard_lo(s);
      want_bytes += 40 + T * (40 + e[s]) + 40 + 40;  // first pull request, T pushes, done, bye
      want_msgs += 1 + T * (e[s] > 0 ? 2 : 1) + 2;
      // replies and bye; CountingComm counts a receive when it is posted, and the first
      // header receive was posted at construction, before reset_stats()
      want_recv += (T + 1) * (40 + 4 * len) + 40 - 40;
    }
  }
  server.finish();
  const auto st = comm.stats();
  if (server.is_server()) {
    const int sidx = static_cast<int>(std::find(r.servers.begin(), r.servers.end(), me) - r.servers.begin());
    const std::size_t len = server.shard_lo(sidx + 1) - server.shard_lo(sidx);
    for (int w : r.workers) {
      if (w == me) continue;
      want_bytes += (T + 1) * (40 + 4 * len) + (is(r.servers, w) && is(r.workers, me) ? 0 : 40);
      want_msgs += (T + 1) * 2 + (is(r.servers, w) && is(r.workers, me) ? 0 : 1);
    }
  }
  PS_EXPECT(server.stats().bytes() == want_bytes, "rank ", me, ": ", server.stats().bytes(), " != ", want_bytes);
  PS_EXPECT(server.stats().messages() == want_msgs, "rank ", me, ": ", server.stats().messages(), " != ", want_msgs);
  PS_EXPECT(st.bytes_sent == want_bytes, "rank ", me, ": ", st.bytes_sent, " != ", want_bytes);
  PS_EXPECT(st.messages_sent == want_msgs, "rank ", me, ": ", st.messages_sent, " != ", want_msgs);
  if (server.is_worker() && !server.is_server())
    PS_EXPECT(st.bytes_received == want_recv, "rank ", me, ": ", st.bytes_received, " != ", want_recv);
}

// Error feedback through the server: with Bsp, one server, lr 1 and no momentum, the
// server's parameters move by exactly what the codecs delivered, and what they did not
// deliver is in the workers' residuals: W (x_0 - x_T) + sum_w residual_w = sum_w,t g_wt
// (up to float rounding). Gradients do not depend on x here.
template <class K, class C>
void check_ps_error_feedback(C& comm, const ps::roles& r, typename ps::ParameterServer<C, K, ps::Bsp>::codec_factory make,
                             double tol) {
  const std::size_t n = 157;
  const int T = 6, W = static_cast<int>(r.workers.size());
  std::vector<float> init(n, 0.0f), x(n);
  ps::ParameterServer<C, K, ps::Bsp> server{comm, r, init, {}, {}, make};
  std::vector<double> lhs(n, 0.0);
  if (server.is_worker()) {
    const int w = static_cast<int>(std::find(r.workers.begin(), r.workers.end(), comm.rank()) - r.workers.begin());
    for (int t = 0; t < T; ++t) {
      server.pull(x);
      auto g = ps_init(n, 1000 + 31 * w + t);
      server.push(g, 1.0);
    }
    server.pull(x);
    for (std::size_t i = 0; i < n; ++i) lhs[i] = server.residual()[i];
  }
  server.finish();
  server.final_params(x);
  comm.allreduce(std::span<double>(lhs), commpact::reduce_op::sum);
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double sum_g = 0;
    for (int w = 0; w < W; ++w)
      for (int t = 0; t < T; ++t) sum_g += ps_init(n, 1000 + 31 * w + t)[i];
    worst = std::max(worst, std::abs(W * (0.0 - double(x[i])) + lhs[i] - sum_g));
  }
  PS_EXPECT(worst < tol, "worst conservation error ", worst);
  // And the codec did compress: the residual is not zero (for a lossy codec).
}

}  // namespace commpact_test
