// One whole compressor step at P = 1 (ThreadComm, no network: the compressor's own work):
// TopK (density 1%, with and without DGC momentum and clipping), EF-SignSGD and QSGD
// through CodecCompressor, Dense and gTopK, n = 2^20 normal floats. This is the number
// v3's space-generic CodecCompressor must not regress (issue 18: within 5% of d0cb695);
// the same source builds against any commpact tree through the umbrella header:
//
//   build/bench/bench_compressor_step --benchmark_min_time=0.3 --benchmark_repetitions=5
//   g++ -std=c++20 -O2 -DNDEBUG -I<other tree>/include bench/bench_compressor_step.cpp
//       -lbenchmark -lpthread -o /tmp/step_other   # one line; then run both, interleaved
#include <benchmark/benchmark.h>

#include <commpact/commpact.hpp>

#include <random>
#include <span>
#include <vector>

using namespace commpact;

namespace {
constexpr std::size_t n = std::size_t{1} << 20;

std::vector<float> input() {
  std::mt19937_64 g(1);
  std::normal_distribution<float> d(0.f, 0.01f);
  std::vector<float> x(n);
  for (auto& e : x) e = d(g);
  return x;
}

// Runs `make(comm)`'s reduce on a fresh copy of the input each iteration (the copy is
// timed too: 4 MB, the same for every compressor and tree).
template <class Make>
void run(benchmark::State& st, Make make) {
  const auto x = input();
  run_threads(1, [&](ThreadComm& comm) {
    auto c = make(comm);
    std::vector<float> g = x;
    c.reduce(std::span<float>(g));  // the first step agrees and allocates
    for (auto _ : st) {
      g = x;
      c.reduce(std::span<float>(g));
      benchmark::DoNotOptimize(g.data());
    }
  });
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(n));
}

void BM_TopK(benchmark::State& st) {
  run(st, [](ThreadComm& c) { return TopK<ThreadComm>{c, {.density = 0.01}}; });
}
void BM_TopK_dgc(benchmark::State& st) {
  run(st, [](ThreadComm& c) { return TopK<ThreadComm>{c, {.density = 0.01, .momentum = 0.9f, .clip_norm = 1.0f}}; });
}
void BM_EFSign(benchmark::State& st) {
  run(st, [](ThreadComm& c) { return CodecCompressor<sign_codec, Allgather<ThreadComm>>{c}; });
}
void BM_QSGD(benchmark::State& st) {
  run(st, [](ThreadComm& c) { return CodecCompressor<qsgd_codec, Allgather<ThreadComm>>{c, qsgd_codec{16, 1}}; });
}
void BM_Dense(benchmark::State& st) {
  run(st, [](ThreadComm& c) { return Dense<ThreadComm>{c}; });
}
void BM_gTopK(benchmark::State& st) {
  run(st, [](ThreadComm& c) { return gTopK<TreeComm<ThreadComm>>{c, {.density = 0.01}}; });
}
}  // namespace

BENCHMARK(BM_TopK)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TopK_dgc)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EFSign)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_QSGD)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Dense)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gTopK)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
