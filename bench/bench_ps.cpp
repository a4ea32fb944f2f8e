// Parameter server with a slow worker: the throughput of BSP, SSP (s = 1, 3) and ASP.
//
// One server and four workers on in-process ranks (ThreadComm, roles::separate(5, 1)),
// a dense model of 2^16 floats, SGD with momentum 0.9 on the server. Each worker's
// "compute" is a sleep: 2 ms, and 6 ms for worker 0 (3x slower). Every worker runs
// clocks (pull, compute, push) until 0.5 s have passed, then finishes. Throughput is the
// gradients pushed by all workers per second of that window (the ideal: BSP 4 / 6 ms =
// 667/s; ASP 3 / 2 ms + 1 / 6 ms = 1667/s). Each configuration runs 5 times; Google
// Benchmark reports the median, mean and standard deviation (run with
// --benchmark_report_aggregates_only=true for just those).
//
// The *_jitter runs have no slow worker but transient stragglers: at every clock each
// worker computes 6 ms with probability 1/3 (seeded), else 2 ms; this is where SSP's
// slack pays (a persistently slow worker paces SSP like BSP once the slack is used).
//
// Counters: grads_per_s (throughput), fast_clocks and slow_clocks (clocks of a fast worker
// and of the slow one), staleness (mean of clock - version over every read of every
// worker), wait_frac (share of the workers' time spent waiting inside pull()),
// KB_per_push (bytes one worker sends per push). The context reports the load average
// and the build.
//
//   build-ps/bench/bench_ps --benchmark_report_aggregates_only=true
//   build-ps/bench/bench_ps --trace docs/img/ps_clocks.dat && gnuplot docs/img/ps_clocks.gp
//
// --trace FILE (or --trace=FILE) takes no other argument; every other argument goes to
// Google Benchmark; --help prints ours, then Google Benchmark's.
#include <benchmark/benchmark.h>

#include <commpact/comm/thread_comm.hpp>
#include <commpact/ps/parameter_server.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.hpp"

namespace {

namespace ps = commpact::ps;
using commpact::ThreadComm;
using clk = std::chrono::steady_clock;

constexpr int P = 5, S = 1;
constexpr std::size_t n = 1 << 16;
constexpr auto window = std::chrono::milliseconds(500);
constexpr auto fast_compute = std::chrono::microseconds(2000), slow_compute = std::chrono::microseconds(6000);

// slow_worker: worker 0 computes 6 ms, the others 2 ms. Otherwise (transient
// stragglers) every worker computes 6 ms with probability 1/3 at each clock, else 2 ms.
template <class Model>
void run(benchmark::State& state, Model model, bool slow_worker = true) {
  for (auto _ : state) {
    std::atomic<long> pushes{0}, fast_clocks{0}, slow_clocks{0}, reads{0};
    std::atomic<long long> stale_sum{0};
    std::atomic<long long> wait_us{0};
    std::atomic<long long> push_bytes{0};
    double seconds = 0;
    commpact::run_threads(P, [&](ThreadComm& comm) {
      std::vector<float> init(n, 0.01f), x(n), g(n, 0.001f);
      ps::ParameterServer<ThreadComm, ps::dense_codec, Model> server{
          comm, ps::roles::separate(P, S), init, model, {.momentum = 0.9, .record_reads = true}};
      comm.barrier();
      const auto t0 = clk::now();
      if (server.is_worker()) {
        const bool slow = comm.rank() == S;
        std::mt19937 rng(static_cast<unsigned>(comm.rank() * 7919 + 1));
        while (clk::now() - t0 < window) {
          server.pull(x);
          const bool long_step = slow_worker ? slow : rng() % 3 == 0;
          std::this_thread::sleep_for(long_step ? slow_compute : fast_compute);
          server.push(g, 0.01);
        }
        pushes += server.clock();
        (slow ? slow_clocks : fast_clocks) = server.clock();
        for (const auto& r : server.reads()) stale_sum += r.clock - r.min_version, ++reads;
        wait_us += static_cast<long long>(server.stats().wait_seconds * 1e6);
        push_bytes += static_cast<long long>(server.stats().push_bytes / std::max<std::int64_t>(1, server.clock()));
        if (slow) seconds = std::chrono::duration<double>(clk::now() - t0).count();
      }
      server.finish();
    });
    // The window plus the slow worker's last clock; every worker stops within a clock of it.
    const double win = std::max(seconds, std::chrono::duration<double>(window).count());
    state.SetIterationTime(win);
    state.counters["grads_per_s"] = double(pushes) / win;
    state.counters["fast_clocks"] = double(fast_clocks);
    state.counters["slow_clocks"] = double(slow_clocks);
    state.counters["staleness"] = reads ? double(stale_sum) / double(reads) : 0.0;
    state.counters["wait_frac"] = double(wait_us) / 1e6 / (win * (P - S));
    state.counters["KB_per_push"] = double(push_bytes) / (P - S) / 1024.0;
  }
}

void BM_bsp(benchmark::State& s) { run(s, ps::Bsp{}); }
void BM_ssp1(benchmark::State& s) { run(s, ps::Ssp{1}); }
void BM_ssp3(benchmark::State& s) { run(s, ps::Ssp{3}); }
void BM_asp(benchmark::State& s) { run(s, ps::Asp{}); }

void BM_bsp_jitter(benchmark::State& s) { run(s, ps::Bsp{}, false); }
void BM_ssp1_jitter(benchmark::State& s) { run(s, ps::Ssp{1}, false); }
void BM_ssp3_jitter(benchmark::State& s) { run(s, ps::Ssp{3}, false); }
void BM_asp_jitter(benchmark::State& s) { run(s, ps::Asp{}, false); }

#define PS_BENCH(f) BENCHMARK(f)->Iterations(1)->Repetitions(5)->UseManualTime()->Unit(benchmark::kMillisecond)
PS_BENCH(BM_bsp);
PS_BENCH(BM_ssp1);
PS_BENCH(BM_ssp3);
PS_BENCH(BM_asp);
PS_BENCH(BM_bsp_jitter);
PS_BENCH(BM_ssp1_jitter);
PS_BENCH(BM_ssp3_jitter);
PS_BENCH(BM_asp_jitter);

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace

// --trace FILE: instead of the benchmarks, one run of each model with the slow worker,
// writing "model worker seconds clock" per push (the data of docs/img/ps_clocks.png).
template <class Model>
void trace(std::FILE* f, int index, Model model) {  // f == nullptr: a warm-up run
  std::vector<std::vector<std::pair<double, long>>> rows(P);
  commpact::run_threads(P, [&](ThreadComm& comm) {
    std::vector<float> init(n, 0.01f), x(n), g(n, 0.001f);
    ps::ParameterServer<ThreadComm, ps::dense_codec, Model> server{comm, ps::roles::separate(P, S), init, model,
                                                                   {.momentum = 0.9}};
    comm.barrier();
    const auto t0 = clk::now();
    if (server.is_worker()) {
      const bool slow = comm.rank() == S;
      while (clk::now() - t0 < std::chrono::milliseconds(150)) {
        server.pull(x);
        std::this_thread::sleep_for(slow ? slow_compute : fast_compute);
        server.push(g, 0.01);
        rows[comm.rank()].emplace_back(std::chrono::duration<double>(clk::now() - t0).count(), server.clock());
      }
    }
    server.finish();
  });
  if (!f) return;
  for (int r = S; r < P; ++r) {
    std::fprintf(f, "%d %d 0 0\n", index, r - S);
    for (auto [t, c] : rows[r]) std::fprintf(f, "%d %d %.5f %ld\n", index, r - S, t, c);
    std::fprintf(f, "\n\n");
  }
}

int main(int argc, char** argv) {
  std::string trace_file;
  bool tracing = false, help = false;
  std::vector<char*> rest{argv[0]};  // Google Benchmark's
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") help = true;
      else if (auto v = bench_args::flag_value(argc, argv, i, "--trace")) {
        if (v->empty()) throw bench_args::error("--trace needs a file name");
        trace_file = *v, tracing = true;
      } else rest.push_back(argv[i]);
    }
    if (tracing && !help && rest.size() > 1)
      throw bench_args::error(std::string("--trace runs no benchmark and takes no other argument, not ") + rest[1]);
  } catch (const bench_args::error& e) {
    return bench_args::usage_error("bench_ps", e.what());
  }
  if (help) {  // ours, then Google Benchmark's (it prints them and exits 0)
    std::printf("bench_ps: parameter server throughput of BSP, SSP (s = 1, 3) and ASP with a slow worker\n"
                "Options:\n"
                "  --trace FILE  instead of the benchmarks, one 150 ms run of each model, each worker's clock after "
                "every push written to FILE (docs/img/ps_clocks.dat); no other argument\n"
                "  --help        this text, then Google Benchmark's options (every other argument goes to it)\n\n");
    std::fflush(stdout);
    return bench_args::google_benchmark_help(argv[0], [](int* c, char** v) { benchmark::Initialize(c, v); });
  }
  if (tracing) {
    std::FILE* f = std::fopen(trace_file.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "bench_ps: --trace %s: cannot open it for writing (%s)\n", trace_file.c_str(),
                   std::strerror(errno));
      return 1;
    }
    std::fprintf(f, "# bench_ps --trace: model (0 BSP, 1 SSP s=1, 2 SSP s=3, 3 ASP), worker (0 is 3x slower), "
                    "seconds, clock after the push; one block per (model, worker)\n");
    trace(nullptr, 0, ps::Bsp{});
    trace(f, 0, ps::Bsp{});
    trace(f, 1, ps::Ssp{1});
    trace(f, 2, ps::Ssp{3});
    trace(f, 3, ps::Asp{});
    if (std::fclose(f) != 0) {
      std::fprintf(stderr, "bench_ps: --trace %s: writing failed (%s)\n", trace_file.c_str(), std::strerror(errno));
      return 1;
    }
    return 0;
  }
  argc = static_cast<int>(rest.size());
  argv = rest.data();
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("load_avg_at_start", loadavg());
#ifdef NDEBUG
  benchmark::AddCustomContext("build", std::string("NDEBUG, ") + __VERSION__);
#else
  benchmark::AddCustomContext("build", std::string("assertions on, ") + __VERSION__);
#endif
  benchmark::AddCustomContext("setup", "1 server + 4 workers (ThreadComm), n = 65536 floats, compute 2 ms, "
                                       "worker 0: 6 ms, window 0.5 s");
  benchmark::RunSpecifiedBenchmarks();
  std::printf("load average at the end: %s\n", loadavg().c_str());
  benchmark::Shutdown();
  return 0;
}
