// Synchronisation rounds and bytes per rank of EveryStep, LocalSgd{h_base} and QSR over a
// cosine schedule, as a table (pure: the policies are simulated with plan_run), then a
// short real DataParallel run on ThreadComm under CountingComm that checks the counted
// bytes against the same formula, then Google Benchmark timings of DataParallel::step.
//
//   ./build-sync/bench/bench_sync_rounds --benchmark_min_time=0.05
//
// Bytes per round: one ring allreduce of the n float32 parameters (or gradients), as
// charged by wire::ring_allreduce: 2 (P - 1) messages and about 2 (P - 1) / P * 4n bytes
// sent per rank. The real run counts what the table leaves out: the one-time checks (the
// driver's allreduce of four int64, length and step, before parameter rounds; Dense's
// agreement of three int64 on the first gradient step) and, on every gradient step,
// Dense's step check (an allreduce of 6 floats, compress/step_check.hpp).
#include <benchmark/benchmark.h>

#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/wire_model.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/sync/lr_schedule.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/sync/schedule.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

using namespace commpact;

namespace {

struct setting {
  const char* name;
  double peak;
  double alpha;
  std::int64_t h_base;
};

constexpr std::int64_t kSteps = 10000;
constexpr std::int64_t kWarmup = 500;             // 5% of the run
constexpr std::uint64_t kParams = 86'567'656;     // ViT-B/16
constexpr int kRanks = 16;                        // the paper's 16-GPU runs

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024.0 && u < 5) {
    b /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, unit[u]);
  return buf;
}

std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void print_table(const setting& s) {
  const WarmupCosineLr lr{s.peak, kWarmup, kSteps};
  const std::uint64_t per_round = wire::ring_allreduce(0, kRanks, kParams, 4).bytes_sent;
  struct row {
    std::string policy;
    std::int64_t rounds;
  };
  const std::vector<row> rows{
      {"EveryStep", count_rounds(plan_run(EveryStep{}, lr, kSteps))},
      {"LocalSgd{" + std::to_string(s.h_base) + "}", count_rounds(plan_run(LocalSgd{s.h_base}, lr, kSteps))},
      {"QSR{" + fmt_g(s.alpha) + ", " + std::to_string(s.h_base) + "}",
       count_rounds(plan_run(QSRPolicy{s.alpha, s.h_base, kWarmup}, lr, kSteps))},
  };
  std::printf("\n%s: cosine, peak lr %g, %" PRId64 " warm-up steps, T = %" PRId64 " steps; n = %" PRIu64
              " float32 parameters, P = %d, ring allreduce %s sent per rank per round\n\n",
              s.name, s.peak, kWarmup, kSteps, kParams, kRanks, human_bytes(static_cast<double>(per_round)).c_str());
  std::printf("| policy | rounds | rounds / EveryStep | bytes sent per rank | bytes / EveryStep |\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  const double base = static_cast<double>(rows[0].rounds);
  for (const auto& r : rows) {
    const double bytes = static_cast<double>(r.rounds) * static_cast<double>(per_round);
    std::printf("| %s | %" PRId64 " | %.4f | %s | %.4f |\n", r.policy.c_str(), r.rounds,
                static_cast<double>(r.rounds) / base, human_bytes(bytes).c_str(), static_cast<double>(r.rounds) / base);
  }
}

// A short real run: P ranks of ThreadComm, each under CountingComm; returns rank 0's counted
// bytes_sent and the DataParallel's rounds.
template <class Policy, class Lr>
std::pair<std::uint64_t, std::int64_t> counted_run(int P, std::size_t n, std::int64_t T, const Policy& policy,
                                                   const Lr& lr) {
  using Counted = CountingComm<ThreadComm>;
  std::uint64_t bytes = 0;
  std::int64_t rounds = 0;
  run_threads(P, [&](ThreadComm& comm) {
    DataParallel dp{Dense<Counted>{Counted{comm}}, policy, T};
    Sgd sgd{n, {.momentum = 0.9}};
    std::vector<float> x(n, 0.25f), g(n);
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::size_t i = 0; i < n; ++i) g[i] = x[i] - 0.01f * static_cast<float>((i + comm.rank() + t) % 7);
      dp.step(x, g, lr(t), sgd);
    }
    if (comm.rank() == 0) {
      bytes = dp.comm().stats().bytes_sent;
      rounds = dp.rounds();
    }
  });
  return {bytes, rounds};
}

bool confirm_with_real_run() {
  const int P = 4;
  const std::size_t n = 10000;
  const std::int64_t T = 400, warm = 20;
  const WarmupCosineLr lr{0.008, warm, T};
  const std::uint64_t per_round = wire::ring_allreduce(0, P, n, 4).bytes_sent;
  const std::uint64_t check = wire::ring_allreduce(0, P, 4, 8).bytes_sent;       // the driver's, parameters
  const std::uint64_t agree = wire::ring_allreduce(0, P, 3, 8).bytes_sent;       // Dense's, first step
  const std::uint64_t step_check = wire::ring_allreduce(0, P, 6, 4).bytes_sent;  // Dense's, every step
  std::printf("\nReal DataParallel run: ThreadComm, P = %d, n = %zu, T = %" PRId64
              ", cosine peak 0.008 with %" PRId64 " warm-up steps, Sgd momentum 0.9, CountingComm on rank 0\n\n",
              P, n, T, warm);
  std::printf("| policy | rounds (table) | bytes (table) | rounds (run) | bytes (counted) | match |\n");
  std::printf("|---|---:|---:|---:|---:|---|\n");
  bool ok = true;
  auto line = [&](const char* name, const auto& policy) {
    const auto periods = plan_run(policy, lr, T);
    const auto planned = count_rounds(periods);
    // Gradient rounds go through Dense; parameter rounds through the driver's allreduce
    // (a one-step period too: sent through the gradient, with the driver's mean).
    std::uint64_t grad_rounds = 0;
    for (const auto& p : periods)
      if (p.what == sync_plan::mode::gradients) grad_rounds += static_cast<std::uint64_t>(p.rounds());
    const std::uint64_t param_rounds = static_cast<std::uint64_t>(planned) - grad_rounds;
    const std::uint64_t expect = grad_rounds * (per_round + step_check) + (grad_rounds > 0 ? agree : 0) +
                                 param_rounds * per_round + (param_rounds > 0 ? check : 0);
    const auto [bytes, rounds] = counted_run(P, n, T, policy, lr);
    const bool m = bytes == expect && rounds == planned;
    ok = ok && m;
    std::printf("| %s | %" PRId64 " | %" PRIu64 " | %" PRId64 " | %" PRIu64 " | %s |\n", name, planned, expect, rounds,
                bytes, m ? "yes" : "NO");
  };
  line("EveryStep", EveryStep{});
  line("LocalSgd{4}", LocalSgd{4});
  line("QSR{0.0175, 4}", QSRPolicy{0.0175, 4, warm});
  std::printf("\n(table bytes = gradient rounds x (ring allreduce of n float32 + Dense's step check of 6 float32 = %"
              PRIu64 " bytes) + Dense's first-step agreement of 3 int64 (%" PRIu64
              " bytes), or parameter rounds x the ring allreduce + the driver's one-time check of 4 int64 (%" PRIu64
              " bytes))\n\n",
              step_check, agree, check);
  return ok;
}

// ---- timings -------------------------------------------------------------------
void BM_plan_run_qsr(benchmark::State& state) {
  const WarmupCosineLr lr{0.008, kWarmup, kSteps};
  const QSRPolicy q{0.0175, 4, kWarmup};
  for (auto _ : state) benchmark::DoNotOptimize(count_rounds(plan_run(q, lr, kSteps)));
  state.SetItemsProcessed(state.iterations() * kSteps);
}
BENCHMARK(BM_plan_run_qsr)->Unit(benchmark::kMicrosecond);

// 200 steps of DataParallel on 2 ThreadComm ranks, n = 2^16 parameters.
template <class Policy>
void BM_data_parallel(benchmark::State& state, Policy policy) {
  const std::size_t n = 1 << 16;
  const std::int64_t T = 200;
  for (auto _ : state) {
    run_threads(2, [&](ThreadComm& comm) {
      DataParallel dp{Dense<ThreadComm>{comm}, policy, T};
      Sgd sgd{n, {.momentum = 0.9}};
      std::vector<float> x(n, 0.5f), g(n);
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::size_t i = 0; i < n; ++i) g[i] = x[i] * 0.5f + 0.001f * static_cast<float>(comm.rank());
        dp.step(x, g, 0.01, sgd);
      }
      benchmark::DoNotOptimize(x.data());
    });
  }
  state.SetItemsProcessed(state.iterations() * T);
}
BENCHMARK_CAPTURE(BM_data_parallel, every_step, EveryStep{})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_data_parallel, local_sgd_4, LocalSgd{4})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_data_parallel, qsr, QSRPolicy{0.0175, 4, 0})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  print_table({"Setting A (illustrative alpha and h_base)", 0.1, 0.2, 2});
  print_table({"Setting B (the QSR paper's ViT-B setting)", 0.008, 0.0175, 4});
  const bool ok = confirm_with_real_run();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (!ok) {
    std::fprintf(stderr, "bench_sync_rounds: counted bytes differ from the table's formula\n");
    return 1;
  }
  return 0;
}
