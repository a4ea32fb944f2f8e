// cost_model.hpp: every algorithm's byte and message counts equal what CountingComm counts
// when the library's own compressors run (first step and steady state, P powers of two and
// not), and the fits recover known parameters from synthetic measurements.
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/topology/ring.hpp>
#include <commpact/train/cost_fit.hpp>
#include <commpact/train/cost_model.hpp>

#include <algorithm>
#include <mutex>
#include <random>

using namespace commpact;
using Counted = CountingComm<ThreadComm>;

namespace {

std::vector<float> random_grad(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// The most bytes and messages any rank sent in each of `steps` calls of step(counted, grad).
template <class Make, class Step>
std::vector<std::pair<std::uint64_t, std::uint64_t>> measure(int P, std::size_t n, int steps, Make make, Step step) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> most(steps);
  std::mutex m;
  run_threads(P, [&](ThreadComm& tc) {
    Counted counted{tc};
    auto algo = make(counted);
    for (int s = 0; s < steps; ++s) {
      auto g = random_grad(n, 1000u * s + tc.rank());
      const auto before = counted.stats();
      step(algo, g);
      const auto d = counted.stats() - before;
      std::lock_guard lock(m);
      most[s].first = std::max(most[s].first, d.bytes_sent);
      most[s].second = std::max(most[s].second, d.messages_sent);
    }
  });
  return most;
}

void check(const std::pair<std::uint64_t, std::uint64_t>& counted, const cost::step_cost& model) {
  CHECK(counted.first == model.bytes_sent);
  CHECK(counted.second == model.messages_sent);
}

}  // namespace

TEST_CASE("cost model: dense, Top-k and gTop-k bytes equal CountingComm's", "[cost_model]") {
  const int P = GENERATE(1, 2, 3, 4, 5, 7, 8);
  const std::size_t n = GENERATE(std::size_t{1000}, std::size_t{4099});
  const std::size_t k = GENERATE(std::size_t{1}, std::size_t{13}, std::size_t{64});
  CAPTURE(P, n, k);
  auto step = [](auto& algo, std::vector<float>& g) { algo.reduce(std::span(g)); };

  auto d = measure(P, n, 2, [](Counted c) { return Dense<Counted>{c}; }, step);
  // Dense also sends its step check (compress/step_check.hpp) every step.
  check(d[0], cost::dense(P, n, /*first_step=*/true) + cost::step_check(P));
  check(d[1], cost::dense(P, n) + cost::step_check(P));

  auto t = measure(P, n, 2, [k](Counted c) { return TopK<Counted>{c, {.k = k}}; }, step);
  check(t[0], cost::topk(P, n, k, /*first_step=*/true));
  check(t[1], cost::topk(P, n, k));

  auto g = measure(P, n, 2, [k](Counted c) { return gTopK<TreeComm<Counted>>{c, {.k = k}}; }, step);
  check(g[0], cost::gtopk(P, n, k, /*first_step=*/true));
  check(g[1], cost::gtopk(P, n, k));
}

TEST_CASE("cost model: PowerSGD, D-PSGD and PowerGossip bytes equal CountingComm's", "[cost_model]") {
  const int P = GENERATE(2, 3, 4, 6);
  CAPTURE(P);
  // matrices compressed at rank 2, one too small to compress ((4+3)*2*2 >= 4*3), vectors
  const tensor_layout layout = {{32, 27}, {32}, {4, 3}, {10, 64}, {10}, {48, 16}};
  std::vector<cost::shape> shapes;
  for (const auto& s : layout) shapes.push_back({static_cast<std::uint64_t>(s.rows), static_cast<std::uint64_t>(s.cols)});
  const auto n = static_cast<std::size_t>(detail::check_layout(layout, "test"));

  auto reduce = [](auto& algo, std::vector<float>& g) { algo.reduce(std::span(g)); };
  auto p = measure(P, n, 2, [&](Counted c) { return PowerCompressor<2>{c, layout}; }, reduce);
  check(p[0], cost::powersgd(P, shapes, 2, 2.0, /*first_step=*/true) + cost::step_check(P));
  check(p[1], cost::powersgd(P, shapes, 2) + cost::step_check(P));

  const int degree = P == 2 ? 1 : 2;
  auto mix = [](auto& algo, std::vector<float>& x) { algo.mix(std::span(x)); };
  auto e = measure(P, n, 2, [&](Counted c) { return GossipMixer{c, Ring(P), layout, exact_mixing{}}; }, mix);
  check(e[1], cost::dpsgd(degree, n) + cost::gossip_check(P));
  auto setup = cost::allreduce(P, 2, 8);  // the first mix() agrees on the setup
  check(e[0], cost::dpsgd(degree, n) + setup + cost::gossip_check(P));

  auto w = measure(P, n, 3, [&](Counted c) { return GossipMixer{c, Ring(P), layout, power_gossip<1>{}}; }, mix);
  check(w[0], cost::power_gossip(degree, shapes, 1, 0) + setup + cost::gossip_check(P));
  check(w[1], cost::power_gossip(degree, shapes, 1, 1) + cost::gossip_check(P));
  check(w[2], cost::power_gossip(degree, shapes, 1, 0) + cost::gossip_check(P));
}

TEST_CASE("cost model: structure of the formulas", "[cost_model]") {
  // The ring's per-rank bytes approach 2 (P-1)/P of the buffer, its time is flat in P.
  const std::uint64_t n = 1 << 20;
  const auto r8 = cost::allreduce(8, n, 4, cost::allreduce_algorithm::ring);
  CHECK(r8.bytes_sent == 2 * 7 * (n / 8) * 4);
  CHECK(r8.latency_rounds == 14);
  const auto b2 = cost::allreduce(2, n, 4);  // OpenMPI: binomial below 4 ranks
  CHECK(b2.path_bytes == 2.0 * 4 * n);
  // gTop-k: log2 P rounds, and the fold/unfold for P not a power of two.
  CHECK(cost::gtopk(8, n, 100).latency_rounds == 3);
  CHECK(cost::gtopk(12, n, 100).latency_rounds == 5);
  CHECK(cost::gtopk(12, n, 100).bytes_sent == 3 * 848 + 848 + 13);
  // Local SGD amortises the dense round.
  CHECK(cost::local_sgd(8, n, 4).path_bytes == Approx(r8.path_bytes / 4));
  // Hierarchical: only the leaders' ring crosses the slow links.
  const auto ring = cost::allreduce_algorithm::ring;
  const auto h = cost::hierarchical(2, 4, n, ring);
  CHECK(h.inter.bytes_sent == n);          // a quarter of the buffer, half of it each way
  CHECK(h.inter.path_bytes == 4.0 * n);     // four shards share the uplink
  const cost::link fast = cost::link_from_rate(10e9, 1e-4), slow = cost::link_from_rate(1e9, 1e-4);
  CHECK(h.time(fast, slow) < cost::comm_time(cost::dense(8, n, false, ring), slow));
  // OpenMPI's binomial allreduce between 2 nodes sends the whole shard both ways, twice
  CHECK(cost::hierarchical(2, 4, n).inter.path_bytes == 8.0 * n);
  CHECK(cost::scaling_efficiency(1.0, 1.0) == 0.5);
  CHECK_THROWS_AS(cost::allreduce(0, n), invalid_argument);
  CHECK_THROWS_AS(cost::scaling_efficiency(0.0, 1.0), invalid_argument);
}

TEST_CASE("cost model: fits recover known alpha, beta and gamma", "[cost_model]") {
  const std::uint64_t seed = GENERATE(1u, 2u, 3u);
  const double noise = GENERATE(0.0, 0.01);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  const cost::link truth{std::uniform_real_distribution<double>(20e-6, 500e-6)(rng),
                         8.0 / std::uniform_real_distribution<double>(1e8, 1e10)(rng)};
  const double gamma = std::uniform_real_distribution<double>(1e-10, 1e-8)(rng);
  std::vector<cost::comm_sample> comm, comp;
  for (int P : {2, 4, 8})
    for (std::uint64_t n : {1u << 16, 1u << 20, 1u << 24}) {
      for (const auto& c : {cost::dense(P, n), cost::topk(P, n, n / 1000), cost::gtopk(P, n, n / 1000)}) {
        comm.push_back({c, cost::comm_time(c, truth) * (1 + noise * u(rng))});
        comp.push_back({c, cost::compute_time(c, gamma) * (1 + noise * u(rng))});
      }
    }
  const auto fit = cost::fit_link(comm);
  const double tol = noise == 0 ? 1e-6 : 0.05;
  CHECK(fit.beta == Approx(truth.beta).epsilon(tol));
  CHECK(fit.alpha == Approx(truth.alpha).epsilon(noise == 0 ? 1e-6 : 0.5));
  CHECK(cost::fit_gamma(comp) == Approx(gamma).epsilon(tol));
  // a floor changes the weights only: exact data is still fitted exactly
  const auto floored = cost::fit_link(comm, 0.02);
  if (noise == 0) {
    CHECK(floored.beta == Approx(truth.beta).epsilon(1e-6));
    CHECK(floored.alpha == Approx(truth.alpha).epsilon(1e-6));
  } else {
    CHECK(floored.beta == Approx(truth.beta).epsilon(0.05));
  }
  CHECK_THROWS_AS(cost::fit_link(comm, -1.0), invalid_argument);
  for (const auto& s : comm)
    CHECK(std::abs(cost::relative_error(cost::comm_time(s.cost, fit), s.seconds)) < (noise == 0 ? 1e-6 : 0.05));
  CHECK_THROWS_AS(cost::fit_link(std::span<const cost::comm_sample>{}), invalid_argument);
}

TEST_CASE("cost model: the host terms against a hand computation", "[cost_model]") {
  const std::uint64_t n = 1 << 24, k = 16777;
  const std::uint64_t msg = cost::sparse_header_bytes + cost::sparse_entry_bytes * k;  // 134264 bytes
  // bursts: one stream for the ring and the allgather, one per dependent round otherwise
  CHECK(cost::allreduce(8, n, 4, cost::allreduce_algorithm::ring).bursts == 1);
  CHECK(cost::allreduce(8, n, 4, cost::allreduce_algorithm::binomial).bursts == 6);
  CHECK(cost::topk(8, n, k).bursts == 1);
  CHECK(cost::gtopk(8, n, k).bursts == 3);
  CHECK(cost::gtopk(12, n, k).bursts == 5);
  CHECK(cost::local_sgd(8, n, 4).bursts == Approx(0.25));
  // A plain link (host terms 0) is the alpha-beta model, whatever the ranks per core.
  const auto g = cost::gtopk(8, n, k), t = cost::topk(8, n, k);
  const cost::link plain{2e-4, 8e-9};
  CHECK(cost::comm_time(g, plain) == Approx(3 * 2e-4 + 3.0 * msg * 8e-9));
  CHECK(cost::comm_time(g, plain, 4.0) == cost::comm_time(g, plain));
  // Host-aware: alpha L + beta max(0, B - bursts burst) + host_beta B + sched L max(0, rho - 1)
  const cost::link h{.alpha = 1e-5, .beta = 8e-9, .host_beta = 2e-9, .burst = 262144, .sched = 9e-4};
  // gTop-k at P = 8: three rounds of 134264 bytes, each inside the 256 KiB burst
  CHECK(cost::comm_time(g, h, 4.0) == Approx(3 * 1e-5 + 0 + 2e-9 * 3 * msg + 9e-4 * 3 * 3));
  // Top-k at P = 8: one allgather of 7 x 134264 bytes, 262144 of them in the burst
  CHECK(cost::comm_time(t, h, 4.0) == Approx(1e-5 + 8e-9 * (7.0 * msg - 262144) + 2e-9 * 7 * msg + 9e-4 * 3));
  CHECK(cost::comm_time(t, h, 1.0) == Approx(1e-5 + 8e-9 * (7.0 * msg - 262144) + 2e-9 * 7 * msg));
  CHECK(cost::comm_time(t, h, 0.5) == cost::comm_time(t, h, 1.0));  // fewer ranks than cores: no delay
  CHECK(cost::rate_bytes(g, 262144) == 0);
  CHECK(cost::rate_bytes(t, 0) == 7.0 * msg);
  const auto hc = cost::hierarchical(2, 4, n, cost::allreduce_algorithm::ring);
  CHECK(hc.time(h, h, 4.0) == Approx(cost::comm_time(hc.intra, h, 4.0) + cost::comm_time(hc.inter, h, 4.0)));
  CHECK_THROWS_AS(cost::comm_time(g, h, 0.0), invalid_argument);
}

TEST_CASE("cost model: fit_host_link recovers known coefficients", "[cost_model]") {
  const std::uint64_t seed = GENERATE(1u, 2u, 3u);
  const double noise = GENERATE(0.0, 0.01);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  auto in = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  const double burst = 262144;
  const cost::link truth{.alpha = in(1e-5, 1e-4), .beta = in(7e-9, 1e-8), .host_beta = in(1e-9, 3e-9), .burst = burst,
                         .sched = in(1e-4, 2e-3)};
  std::vector<cost::comm_sample> s;
  for (int P : {2, 4, 8, 16})
    for (double cores : {2.0, 4.0, 16.0})
      for (std::uint64_t n : {1u << 16, 1u << 20, 1u << 24})
        for (const auto& c : {cost::dense(P, n), cost::topk(P, n, n / 1000), cost::gtopk(P, n, n / 1000)})
          s.push_back({c, cost::comm_time(c, truth, P / cores) * (1 + noise * u(rng)), P / cores});
  const auto fit = cost::fit_host_link(s, burst);
  CHECK(fit.burst == burst);
  if (noise == 0) {
    CHECK(fit.alpha == Approx(truth.alpha).epsilon(1e-6));
    CHECK(fit.beta == Approx(truth.beta).epsilon(1e-6));
    CHECK(fit.host_beta == Approx(truth.host_beta).epsilon(1e-6));
    CHECK(fit.sched == Approx(truth.sched).epsilon(1e-6));
  } else {  // the large terms are well determined; alpha is small beside sched
    CHECK(fit.beta == Approx(truth.beta).epsilon(0.1));
    CHECK(fit.host_beta == Approx(truth.host_beta).epsilon(0.3));
    CHECK(fit.sched == Approx(truth.sched).epsilon(0.1));
  }
  for (const auto& x : s)
    CHECK(std::abs(cost::relative_error(cost::comm_time(x.cost, fit, x.ranks_per_core), x.seconds)) <
          (noise == 0 ? 1e-6 : 0.05));
  // Without a burst beta and host_beta multiply the same bytes: one of them carries both.
  std::vector<cost::comm_sample> plain;
  const cost::link ab{3e-5, 9e-9};
  for (int P : {2, 4, 8})
    for (std::uint64_t n : {1u << 16, 1u << 24}) {
      const auto c = cost::dense(P, n);
      plain.push_back({c, cost::comm_time(c, ab)});
    }
  const auto f0 = cost::fit_host_link(plain, 0);
  CHECK(f0.alpha == Approx(ab.alpha).epsilon(1e-6));
  CHECK(f0.beta + f0.host_beta == Approx(ab.beta).epsilon(1e-6));
  CHECK(f0.beta * f0.host_beta == 0);
  CHECK(f0.sched == 0);
  // No negative coefficient, even where data would prefer one.
  std::vector<cost::comm_sample> odd = {{cost::gtopk(8, 1 << 20, 1000), 1e-3, 4.0},
                                        {cost::gtopk(2, 1 << 20, 1000), 5e-3, 1.0}};
  const auto fn = cost::fit_host_link(odd, burst);
  CHECK(fn.alpha >= 0);
  CHECK(fn.beta >= 0);
  CHECK(fn.host_beta >= 0);
  CHECK(fn.sched >= 0);
  CHECK_THROWS_AS(cost::fit_host_link(std::span<const cost::comm_sample>{}, burst), invalid_argument);
  CHECK_THROWS_AS(cost::fit_host_link(s, -1.0), invalid_argument);
  const std::vector<cost::comm_sample> empty_cost = {{cost::step_cost{}, 1e-3, 1.0}};
  CHECK_THROWS_AS(cost::fit_host_link(empty_cost, burst), invalid_argument);
}
