// Consensus distance against bytes sent for D-PSGD, CHOCO-SGD (top-k and sign) and
// PowerGossip (rank 1 and 2) on rings of 8 and 16 ranks (ThreadComm), with no
// gradients: every rank starts from its own random model (a shared N(0,1) component
// plus an own N(0,1) one; 4842 parameters shaped as matrices and bias vectors) and
// only gossips. Each method runs until it has sent the bytes D-PSGD sends in
// `--gossip_dpsgd_steps` steps (default 30) or `--gossip_max_steps` (default 4000).
//
// Writes <dir>/gossip_consensus.dat (one gnuplot index block per ring size and method:
// step, bytes sent per rank, consensus distance / initial) and <dir>/gossip_consensus.gp
// (renders gossip_consensus.png with `gnuplot gossip_consensus.gp` in <dir>); prints a
// summary table; then runs the Google Benchmark timings of one mixing step.
//
//   build-power/bench/bench_gossip --gossip_out=docs/img --benchmark_min_time=0.05
//   (cd docs/img && gnuplot gossip_consensus.gp)
//
// --gossip_skip_experiment=1 runs only the timings.
// --gossip_init=lowrank makes each rank's own deviation of every matrix a random rank-2
// matrix (the regime where PowerGossip pays off) and writes gossip_consensus_lowrank.*.
// Our flags (name=value or name value): --gossip_out DIR, --gossip_init gaussian|lowrank,
// --gossip_dpsgd_steps 1..1000000, --gossip_max_steps 1..10000000,
// --gossip_skip_experiment 0|1; any other --gossip_* is refused, every other argument
// goes to Google Benchmark. --help prints ours, then Google Benchmark's, and runs nothing.
//
// CHOCO's consensus step size gamma is tuned per run from {0.01, 0.03, 0.1, 0.3, 0.6, 1}
// (the best final distance is kept), as the papers tune it; PowerGossip and D-PSGD run
// untuned (gamma = 1, Metropolis weights).
#include <benchmark/benchmark.h>

#include <commpact/comm/thread_comm.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/topology/ring.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench_args.hpp"

using namespace commpact;

namespace {

const tensor_layout kLayout = {{32, 64}, {32}, {64, 32}, {64}, {10, 64}, {10}};

std::size_t numel() {
  std::size_t n = 0;
  for (auto& s : kLayout) n += static_cast<std::size_t>(s.numel());
  return n;
}

// --gossip_init=lowrank: each rank's own deviation of every matrix is a random rank-2
// matrix u v^T (scaled to the same energy as the Gaussian one), vectors stay Gaussian.
bool g_lowrank = false;

std::vector<float> initial_model(int rank) {
  std::mt19937_64 shared(12345), own(777 + static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(numel());
  for (auto& x : v) x = d(shared);
  std::size_t off = 0;
  for (const auto& s : kLayout) {
    const auto n = static_cast<std::size_t>(s.rows), m = static_cast<std::size_t>(s.cols);
    if (!g_lowrank || s.is_vector()) {
      for (std::size_t i = 0; i < n * m; ++i) v[off + i] += d(own);
    } else {
      constexpr int k = 2;
      std::vector<float> u(n * k), w(m * k);
      for (auto& x : u) x = d(own);
      for (auto& x : w) x = d(own);
      const float sc = 1.0f / std::sqrt(static_cast<float>(k));
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < m; ++j) {
          float a = 0;
          for (int c = 0; c < k; ++c) a += u[i * k + c] * w[j * k + c];
          v[off + i * m + j] += sc * a;
        }
    }
    off += n * m;
  }
  return v;
}

struct curve {
  std::string name;
  double gamma = 0;
  std::vector<long long> step;
  std::vector<double> bytes, dist;
};

// Runs one method; records (step, bytes per rank, distance / initial) on a roughly
// logarithmic schedule of steps plus the last step.
template <class Mode>
curve run_curve(int P, Mode mode, double byte_budget, int max_steps) {
  curve c;
  run_threads(P, [&](ThreadComm& comm) {
    GossipMixer<Ring, Mode, ThreadComm> mixer{comm, Ring(P), kLayout, mode};
    auto x = initial_model(comm.rank());
    const double d0 = consensus_distance(comm, std::span<const float>(x));
    auto record = [&](long long s) {
      const double d = consensus_distance(comm, std::span<const float>(x));
      if (comm.rank() == 0) {
        c.step.push_back(s);
        c.bytes.push_back(static_cast<double>(mixer.stats().bytes_sent));
        c.dist.push_back(d / d0);
      }
    };
    record(0);
    long long next = 1;
    for (long long s = 1; s <= max_steps; ++s) {
      mixer.mix(std::span<float>(x));
      // Every rank on a ring sends the same bytes, so rank 0's count is every rank's;
      // the stop decision uses it on every rank alike.
      const bool last = static_cast<double>(mixer.stats().bytes_sent) >= byte_budget || s == max_steps;
      if (s == next || last) {
        record(s);
        next = std::max(next + 1, static_cast<long long>(next * 1.15));
      }
      if (last) break;
    }
  });
  return c;
}

template <class Q>
curve tuned_choco(int P, Q q, const char* name, double budget, int max_steps) {
  curve best;
  for (double g : {0.01, 0.03, 0.1, 0.3, 0.6, 1.0}) {
    auto c = run_curve(P, choco_gossip<Q>{q, g}, budget, max_steps);
    if (best.dist.empty() || (std::isfinite(c.dist.back()) && c.dist.back() < best.dist.back())) {
      best = c;
      best.gamma = g;
    }
  }
  best.name = std::string(name) + " (gamma " + std::to_string(best.gamma).substr(0, 4) + ")";
  return best;
}

// Bytes per rank at the first recorded point with distance <= target (linear in bytes
// between the two recorded points around the crossing, in log distance); -1 if never.
double bytes_to_reach(const curve& c, double target) {
  for (std::size_t i = 1; i < c.dist.size(); ++i) {
    if (c.dist[i] <= target) {
      const double a = std::log(c.dist[i - 1]), b = std::log(c.dist[i]), t = std::log(target);
      const double f = (a - t) / (a - b);
      return c.bytes[i - 1] + f * (c.bytes[i] - c.bytes[i - 1]);
    }
  }
  return -1;
}

void run_experiment(const std::string& dir, int dpsgd_steps, int max_steps) {
  const std::string base = g_lowrank ? "gossip_consensus_lowrank" : "gossip_consensus";
  std::ofstream dat(dir + "/" + base + ".dat");
  std::ofstream gp(dir + "/" + base + ".gp");
  if (!dat || !gp) {
    std::cerr << "bench_gossip: cannot write to " << dir << "\n";
    std::exit(1);
  }
  dat << "# consensus distance / initial against bytes sent per rank; rings of 8 and 16 ranks, "
      << numel() << " parameters; columns: step bytes_per_rank consensus_rel\n";
  gp << "# Generated by bench_gossip. Run: gnuplot " << base << ".gp (in this folder)\n"
     << "set terminal pngcairo size 1300,520 font ',11'\nset output '" << base << ".png'\n"
     << "set multiplot layout 1,2 title 'Gossip without gradients: consensus distance vs bytes sent per rank ("
     << numel() << " parameters" << (g_lowrank ? ", rank-2 deviations" : ", Gaussian deviations") << ")'\n"
     << "set logscale xy\nset format y '10^{%L}'\nset xlabel 'bytes sent per rank'\n"
     << "set ylabel 'consensus distance / initial'\nset grid\nset key bottom left\nset yrange [1e-6:2]\n";
  std::printf("%-4s %-28s %14s %8s %14s %14s %12s\n", "P", "method", "bytes/step", "steps", "bytes->1e-1",
              "bytes->1e-2", "final");
  int index = 0;
  for (int P : {8, 16}) {
    const double budget = static_cast<double>(dpsgd_steps) * 2 * 4 * static_cast<double>(numel());
    std::vector<curve> curves;
    curves.push_back(run_curve(P, exact_mixing{}, budget, max_steps));
    curves.back().name = "D-PSGD (exact)";
    curves.push_back(run_curve(P, power_gossip<1>{}, budget, max_steps));
    curves.back().name = "PowerGossip rank 1";
    curves.push_back(run_curve(P, power_gossip<2>{}, budget, max_steps));
    curves.back().name = "PowerGossip rank 2";
    curves.push_back(tuned_choco(P, topk_codec{0.01}, "CHOCO top-1%", budget, max_steps));
    curves.push_back(tuned_choco(P, sign_codec{}, "CHOCO sign", budget, max_steps));
    gp << "set title 'ring of " << P << " ranks'\nplot ";
    for (std::size_t m = 0; m < curves.size(); ++m) {
      const auto& c = curves[m];
      dat << "# P=" << P << " method=" << c.name << "\n";
      for (std::size_t i = 0; i < c.step.size(); ++i)
        dat << c.step[i] << " " << c.bytes[i] << " " << c.dist[i] << "\n";
      dat << "\n\n";
      gp << (m ? ", " : "") << "'" << base << ".dat' index " << index++ << " using 2:3 with linespoints pt " << m + 1
         << " ps 0.6 title '" << c.name << "'";
      const double per_step = c.bytes.back() / static_cast<double>(c.step.back());
      std::printf("%-4d %-28s %14.0f %8lld %14.0f %14.0f %12.3g\n", P, c.name.c_str(), per_step, c.step.back(),
                  bytes_to_reach(c, 1e-1), bytes_to_reach(c, 1e-2), c.dist.back());
    }
    gp << "\n";
  }
  gp << "unset multiplot\n";
  std::printf("(bytes->X: bytes sent per rank until the consensus distance fell to X times the initial; -1: not "
              "within the budget of %d D-PSGD steps)\n",
              dpsgd_steps);
}

// ---- timings: one mixing step on a ring of 8 ranks (wall time: 8 threads; us_per_step
// includes thread start-up amortised over 20 steps) ---------------------------------
template <class Mode>
void BM_gossip_ring8(benchmark::State& state, Mode mode) {
  constexpr int P = 8, steps = 20;
  std::uint64_t bytes = 0;
  for (auto _ : state) {
    run_threads(P, [&](ThreadComm& comm) {
      GossipMixer<Ring, Mode, ThreadComm> mixer{comm, Ring(P), kLayout, mode};
      auto x = initial_model(comm.rank());
      for (int s = 0; s < steps; ++s) mixer.mix(std::span<float>(x));
      if (comm.rank() == 0) bytes = mixer.stats().bytes_sent;
    });
  }
  state.counters["steps"] = benchmark::Counter(static_cast<double>(state.iterations() * steps));
  state.counters["us_per_step"] =
      benchmark::Counter(static_cast<double>(state.iterations() * steps), benchmark::Counter::kIsRate |
                                                                              benchmark::Counter::kInvert);
  state.counters["bytes_per_rank_step"] = static_cast<double>(bytes) / steps;
}

}  // namespace

BENCHMARK_CAPTURE(BM_gossip_ring8, dpsgd, exact_mixing{})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_gossip_ring8, powergossip_r1, power_gossip<1>{})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_gossip_ring8, choco_top1pct, choco_gossip<topk_codec>{topk_codec{0.01}, 0.1})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_gossip_ring8, sign_codec, choco_gossip<sign_codec>{{}, 0.4})->Unit(benchmark::kMillisecond)->UseRealTime();

namespace {

void usage() {
  std::printf(
      "bench_gossip: consensus distance against bytes sent for D-PSGD, CHOCO-SGD and PowerGossip on rings of 8 and "
      "16 ranks (writes <dir>/gossip_consensus.{dat,gp}), then Google Benchmark timings of one mixing step\n"
      "Options (name=value or name value):\n"
      "  --gossip_out DIR               where the .dat and .gp files go (default .)\n"
      "  --gossip_init gaussian|lowrank each rank's own deviation (default gaussian; lowrank writes "
      "gossip_consensus_lowrank.*)\n"
      "  --gossip_dpsgd_steps N         byte budget: what D-PSGD sends in N steps, 1 to 1000000 (default 30)\n"
      "  --gossip_max_steps N           at most N steps per method, 1 to 10000000 (default 4000)\n"
      "  --gossip_skip_experiment 0|1   1: only the timings (default 0)\n"
      "  --help                         this text, then Google Benchmark's options (every other argument goes to "
      "it)\n\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = ".";
  int dpsgd_steps = 30, max_steps = 4000;
  bool skip_experiment = false, help = false;
  std::vector<char*> rest{argv[0]};  // Google Benchmark's
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") help = true;
      else if (auto v = bench_args::flag_value(argc, argv, i, "--gossip_out")) {
        if (v->empty()) throw bench_args::error("--gossip_out needs a folder");
        dir = *v;
      } else if (auto v = bench_args::flag_value(argc, argv, i, "--gossip_init")) {
        if (*v != "gaussian" && *v != "lowrank")
          throw bench_args::error("--gossip_init " + *v + " is not gaussian or lowrank");
        g_lowrank = *v == "lowrank";
      } else if (auto v = bench_args::flag_value(argc, argv, i, "--gossip_dpsgd_steps"))
        dpsgd_steps = static_cast<int>(bench_args::integer("--gossip_dpsgd_steps", *v, 1, 1000000));
      else if (auto v = bench_args::flag_value(argc, argv, i, "--gossip_max_steps"))
        max_steps = static_cast<int>(bench_args::integer("--gossip_max_steps", *v, 1, 10000000));
      else if (auto v = bench_args::flag_value(argc, argv, i, "--gossip_skip_experiment"))
        skip_experiment = bench_args::integer("--gossip_skip_experiment", *v, 0, 1) == 1;
      else if (a.rfind("--gossip", 0) == 0)
        throw bench_args::error("unknown option " + a + " (ours: --gossip_out, --gossip_init, --gossip_dpsgd_steps, "
                                "--gossip_max_steps, --gossip_skip_experiment)");
      else rest.push_back(argv[i]);
    }
  } catch (const bench_args::error& e) {
    return bench_args::usage_error("bench_gossip", e.what());
  }
  if (help) {  // ours, then Google Benchmark's (it prints them and exits 0)
    usage();
    return bench_args::google_benchmark_help(argv[0], [](int* c, char** v) { benchmark::Initialize(c, v); });
  }
  if (!skip_experiment) run_experiment(dir, dpsgd_steps, max_steps);
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
