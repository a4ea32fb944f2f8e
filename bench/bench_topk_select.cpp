// Top-k selection by |x|: commpact::host::topk_abs against two std baselines and the
// read-once floor, on Gaussian data (a stand-in for gradients).
//
//   ./bench_topk_select --benchmark_min_time=0.2
//   COMMPACT_BENCH_LARGE=1 ./bench_topk_select      # adds n = 1e8 (1.2 GB of memory)
//
// Arguments of every benchmark: n, density in parts per million (ppm 1000 = 0.001). items/s counts entries
// of x read per second. All outputs are index-sorted (idx, val) of exactly k entries, so
// every variant does the same job; buffers are allocated outside the timed loop.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "commpact/kernels/host/topk.hpp"

namespace {

using commpact::host::abs_key;

// One data set per size, made once (kept for the whole run, so that interleaved
// repetitions do not regenerate it).
const std::vector<float>& data(std::size_t n) {
  static std::map<std::size_t, std::vector<float>> sets;
  auto& x = sets[n];
  if (x.size() != n) {
    x.assign(n, 0.0f);
    std::mt19937_64 rng(42);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : x) v = d(rng);
  }
  return x;
}

std::size_t k_of(const benchmark::State& st) {
  return static_cast<std::size_t>(static_cast<double>(st.range(0)) * static_cast<double>(st.range(1)) * 1e-6);
}

void finish(benchmark::State& st, std::size_t n) {
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(n));
  st.counters["k"] = static_cast<double>(k_of(st));
}

// Ours.
void BM_topk_abs(benchmark::State& st) {
  const std::size_t n = static_cast<std::size_t>(st.range(0));
  const std::size_t k = k_of(st);
  const auto& x = data(n);
  std::vector<std::int32_t> idx(k);
  std::vector<float> val(k);
  commpact::host::topk_workspace ws;
  for (auto _ : st) {
    commpact::host::topk_abs(x, k, idx, val, ws);
    benchmark::DoNotOptimize(idx.data());
    benchmark::DoNotOptimize(val.data());
    benchmark::ClobberMemory();
  }
  st.counters["sampled"] = ws.last_path() == commpact::host::topk_path::sampled ? 1.0 : 0.0;
  finish(st, n);
}

// (a) |x| copy, std::nth_element for the k-th largest, then one collect pass (ties by index).
void BM_nth_element(benchmark::State& st) {
  const std::size_t n = static_cast<std::size_t>(st.range(0));
  const std::size_t k = k_of(st);
  const auto& x = data(n);
  std::vector<float> a(n);
  std::vector<std::int32_t> idx(k);
  std::vector<float> val(k);
  for (auto _ : st) {
    for (std::size_t i = 0; i < n; ++i) a[i] = std::fabs(x[i]);
    std::nth_element(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(k - 1), a.end(), std::greater<>());
    const float t = a[k - 1];
    std::size_t above = 0;
    for (std::size_t i = 0; i < k; ++i) above += a[i] > t;
    std::size_t ties = k - above, c = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float m = std::fabs(x[i]);
      if (m > t || (m == t && ties > 0)) {
        ties -= m == t;
        idx[c] = static_cast<std::int32_t>(i);
        val[c] = x[i];
        ++c;
      }
    }
    benchmark::DoNotOptimize(idx.data());
    benchmark::DoNotOptimize(val.data());
    benchmark::ClobberMemory();
  }
  finish(st, n);
}

// (b) std::partial_sort of an index array by (|x| desc, index asc), then sort the k by index.
void BM_partial_sort(benchmark::State& st) {
  const std::size_t n = static_cast<std::size_t>(st.range(0));
  const std::size_t k = k_of(st);
  const auto& x = data(n);
  std::vector<std::int32_t> order(n);
  std::vector<std::int32_t> idx(k);
  std::vector<float> val(k);
  for (auto _ : st) {
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [&](std::int32_t p, std::int32_t q) {
                        const float a = std::fabs(x[p]), b = std::fabs(x[q]);
                        return a > b || (a == b && p < q);
                      });
    std::copy(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), idx.begin());
    std::sort(idx.begin(), idx.end());
    for (std::size_t i = 0; i < k; ++i) val[i] = x[idx[i]];
    benchmark::DoNotOptimize(idx.data());
    benchmark::DoNotOptimize(val.data());
    benchmark::ClobberMemory();
  }
  finish(st, n);
}

// (c) The read-once floor: the threshold is already known (computed outside the loop);
// one pass writes the entries above it (and the first ties) to idx/val, with the same
// block filter the kernel uses.
void BM_floor_known_threshold(benchmark::State& st) {
  const std::size_t n = static_cast<std::size_t>(st.range(0));
  const std::size_t k = k_of(st);
  const auto& x = data(n);
  std::vector<std::int32_t> idx(k);
  std::vector<float> val(k);
  commpact::host::topk_workspace ws;
  const auto t = commpact::host::topk_abs_threshold(x, k, ws);
  for (auto _ : st) {
    const std::size_t c =
        commpact::host::detail::collect_selected(x.data(), n, t.key, t.ties_taken, idx.data(), val.data());
    benchmark::DoNotOptimize(c);
    benchmark::DoNotOptimize(idx.data());
    benchmark::ClobberMemory();
  }
  finish(st, n);
}

// The floor written as the plainest loop (what a first implementation would do).
void BM_floor_plain_loop(benchmark::State& st) {
  const std::size_t n = static_cast<std::size_t>(st.range(0));
  const std::size_t k = k_of(st);
  const auto& x = data(n);
  std::vector<std::int32_t> idx(k);
  std::vector<float> val(k);
  commpact::host::topk_workspace ws;
  const auto t = commpact::host::topk_abs_threshold(x, k, ws);
  for (auto _ : st) {
    std::size_t c = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (abs_key(x[i]) > t.key && c < k) {
        idx[c] = static_cast<std::int32_t>(i);
        val[c] = x[i];
        ++c;
      }
    }
    benchmark::DoNotOptimize(c);
    benchmark::DoNotOptimize(idx.data());
    benchmark::ClobberMemory();
  }
  finish(st, n);
}

}  // namespace

// Registered size by size, so that the variants of one size run close together in time
// (the ratios are less exposed to load changes on a shared machine).
int main(int argc, char** argv) {
  std::vector<std::int64_t> sizes = {1'000'000, 10'000'000};
  if (const char* e = std::getenv("COMMPACT_BENCH_LARGE"); e && std::string(e) == "1") sizes.push_back(100'000'000);
  const std::pair<const char*, void (*)(benchmark::State&)> variants[] = {
      {"topk_abs", BM_topk_abs},
      {"nth_element", BM_nth_element},
      {"partial_sort", BM_partial_sort},
      {"floor_known_threshold", BM_floor_known_threshold},
      {"floor_plain_loop", BM_floor_plain_loop}};
  for (auto n : sizes)
    for (std::int64_t ppm : {1000, 10000})
      for (const auto& [name, fn] : variants) {
        auto* b = benchmark::RegisterBenchmark(name, fn);
        b->Args({n, ppm})->ArgNames({"n", "ppm"})->Unit(benchmark::kMillisecond);
        // With --benchmark_repetitions=R, also report the fastest repetition: on a shared
        // machine the minimum is the least disturbed estimate.
        b->ComputeStatistics("min", [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); });
      }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
