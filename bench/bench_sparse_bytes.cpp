// Bytes and messages per rank per step of Dense, TopK and gTopK on ThreadComm for
// P = 2..64, measured by CountingComm, beside the formulas of ALGORITHMS.md and the
// alpha-beta time model at 1 and 10 Gbit/s; then a Google Benchmark of gTopK steps.
//
//   build-gtopk/bench/bench_sparse_bytes                 # table + benchmark
//   build-gtopk/bench/bench_sparse_bytes --table-only    # table only
//   options: --n=100000 --density=0.01 --alpha-us=25   (or --n 100000; --help lists them)
//   --n: floats, 1 to 2^31 - 1, K, M, G meaning 2^10, 2^20, 2^30; --density: above 0, at
//   most 1; --alpha-us: at least 0. Other arguments go to Google Benchmark.
//
// Measured values are the maximum over ranks (the critical path). Formulas (bytes per
// rank per step, 8 bytes per sparse entry, headers not included):
//   dense ring allreduce 2 (P-1)/P * 4n, TopK 8k (P-1), gTopK 8k log2 P.
// Time model: dense 2(P-1) alpha + 2(P-1)/P 4n beta; TopK log2(P) alpha + 8k(P-1) beta;
// gTopK log2(P) (alpha + 8k beta); beta = 8 / bandwidth seconds per byte.
#include <benchmark/benchmark.h>

#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/topk.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_args.hpp"

using namespace commpact;
using CC = CountingComm<ThreadComm>;

namespace {

std::size_t g_n = 100000;
double g_density = 0.01;
double g_alpha = 25e-6;

std::vector<float> grad(int rank, int step, std::size_t n) {
  std::mt19937_64 gen(1234567u + static_cast<std::uint64_t>(rank) * 1000003u + static_cast<std::uint64_t>(step));
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> g(n);
  for (auto& x : g) x = d(gen);
  return g;
}

struct per_rank {
  std::uint64_t bytes = 0, msgs = 0;
};
struct row {
  per_rank dense, topk, gtopk;
};

// Measures the second step (the first includes one-off agreements), max over ranks.
row measure(int P, std::size_t n, double density) {
  std::vector<row> r(P);
  run_threads(P, [&](ThreadComm& comm) {
    const int me = comm.rank();
    auto step2 = [&](auto& comp, auto& counted) {
      for (int s = 0; s < 2; ++s) {
        auto g = grad(me, s, n);
        const auto before = counted.stats();
        comp.reduce(std::span<float>(g));
        const auto d = counted.stats() - before;
        if (s == 1) return per_rank{d.bytes_sent, d.messages_sent};
      }
      return per_rank{};
    };
    Dense<CC> dense{CC(comm)};
    r[me].dense = step2(dense, dense.comm());
    TopK<CC> topk{CC(comm), {.density = density}};
    r[me].topk = step2(topk, topk.comm());
    gTopK<TreeComm<CC>> gt{CC(comm), {.density = density}};
    r[me].gtopk = step2(gt, gt.comm().inner());
  });
  row m;
  for (const auto& x : r) {
    m.dense.bytes = std::max(m.dense.bytes, x.dense.bytes);
    m.dense.msgs = std::max(m.dense.msgs, x.dense.msgs);
    m.topk.bytes = std::max(m.topk.bytes, x.topk.bytes);
    m.topk.msgs = std::max(m.topk.msgs, x.topk.msgs);
    m.gtopk.bytes = std::max(m.gtopk.bytes, x.gtopk.bytes);
    m.gtopk.msgs = std::max(m.gtopk.msgs, x.gtopk.msgs);
  }
  return m;
}

void print_table() {
  const std::size_t n = g_n;
  const auto k = static_cast<double>(commpact::detail::k_of_density(g_density, static_cast<std::int64_t>(n)));
  std::printf("# bytes and messages per rank per step (max over ranks), ThreadComm + CountingComm\n");
  std::printf("# n = %zu, density = %g, k = %.0f; formulas without the 48-byte headers; alpha = %g us\n", n, g_density,
              k, g_alpha * 1e6);
  std::printf("%4s | %10s %10s %4s | %9s %9s %4s | %8s %8s %4s | %8s %8s %8s | %8s %8s %8s\n", "P", "dense B",
              "2(P-1)/P4n", "msg", "TopK B", "8k(P-1)", "msg", "gTopK B", "8klog2P", "msg", "D@1G ms", "T@1G ms",
              "G@1G ms", "D@10G ms", "T@10G ms", "G@10G ms");
  for (int P : {2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64}) {
    const row m = measure(P, n, g_density);
    const double lg = std::log2(static_cast<double>(P));
    const double fd = 2.0 * (P - 1) / P * 4.0 * n, ft = 8.0 * k * (P - 1), fg = 8.0 * k * lg;
    auto model = [&](double bw_bits) {
      const double beta = 8.0 / bw_bits;
      return std::array<double, 3>{(2.0 * (P - 1) * g_alpha + fd * beta) * 1e3, (lg * g_alpha + ft * beta) * 1e3,
                                   (lg * (g_alpha + 8.0 * k * beta)) * 1e3};
    };
    const auto m1 = model(1e9), m10 = model(1e10);
    std::printf("%4d | %10llu %10.0f %4llu | %9llu %9.0f %4llu | %8llu %8.0f %4llu | %8.3f %8.3f %8.3f | %8.3f %8.3f %8.3f\n",
                P, (unsigned long long)m.dense.bytes, fd, (unsigned long long)m.dense.msgs,
                (unsigned long long)m.topk.bytes, ft, (unsigned long long)m.topk.msgs,
                (unsigned long long)m.gtopk.bytes, fg, (unsigned long long)m.gtopk.msgs, m1[0], m1[1], m1[2], m10[0],
                m10[1], m10[2]);
  }
  std::fflush(stdout);
}

// Wall time of gTopK steps on P threads (n = g_n), all ranks together.
void BM_gtopk_step(benchmark::State& state) {
  const int P = static_cast<int>(state.range(0));
  constexpr int steps = 5;
  std::vector<std::vector<std::vector<float>>> gs(P);
  for (int r = 0; r < P; ++r)
    for (int s = 0; s < steps; ++s) gs[r].push_back(grad(r, s, g_n));
  for (auto _ : state) {
    run_threads(P, [&](ThreadComm& comm) {
      gTopK<TreeComm<ThreadComm>> gt{comm, {.density = g_density}};
      for (int s = 0; s < steps; ++s) {
        auto g = gs[comm.rank()][s];
        gt.reduce(std::span<float>(g));
        benchmark::DoNotOptimize(g.data());
      }
    });
  }
  state.SetItemsProcessed(state.iterations() * steps);
  state.counters["steps/s"] = benchmark::Counter(static_cast<double>(state.iterations() * steps), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_gtopk_step)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

static void usage() {
  std::printf(
      "bench_sparse_bytes: bytes and messages per rank per step of Dense, TopK and gTopK (a table), then a Google "
      "Benchmark of gTopK steps\n"
      "Options (name=value or name value):\n"
      "  --n N           gradient size in floats, 1 to 2^31 - 1; K, M, G = 2^10, 2^20, 2^30 (default 100000)\n"
      "  --density D     TopK / gTopK density, above 0 and at most 1 (default 0.01)\n"
      "  --alpha-us A    latency of the time model in microseconds, at least 0 (default 25)\n"
      "  --table-only    print the table, run no benchmark\n"
      "  --help          this text, then Google Benchmark's options (every other argument goes to it)\n\n");
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  bool table_only = false, help = false;
  std::vector<char*> rest{argv[0]};
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--table-only") table_only = true;
      else if (a == "--help" || a == "-h") help = true;
      else if (auto v = bench_args::flag_value(argc, argv, i, "--n"))
        g_n = static_cast<std::size_t>(bench_args::size("--n", *v, (std::uint64_t{1} << 31) - 1));
      else if (auto v = bench_args::flag_value(argc, argv, i, "--density"))
        g_density = bench_args::real("--density", *v, 0.0, false, 1.0, true);
      else if (auto v = bench_args::flag_value(argc, argv, i, "--alpha-us"))
        g_alpha = bench_args::real("--alpha-us", *v, 0.0, true, INFINITY, true) * 1e-6;
      else rest.push_back(argv[i]);
    }
  } catch (const bench_args::error& e) {
    return bench_args::usage_error("bench_sparse_bytes", e.what());
  }
  if (help) {  // ours, then Google Benchmark's (it prints them and exits 0)
    usage();
    return bench_args::google_benchmark_help(argv[0], [](int* c, char** v) { benchmark::Initialize(c, v); });
  }
  print_table();
  if (table_only) return 0;
  int rc = static_cast<int>(rest.size());
  benchmark::Initialize(&rc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
