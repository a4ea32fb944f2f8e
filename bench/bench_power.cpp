// PowerCompressor (PowerSGD) against dense allreduce, per layer shape of a
// ResNet-18-like model and for the whole model, on ThreadComm with P = 1 so that the
// times are the compute of compression plus decompression (the P = 1 allreduce is a
// copy). Each row reports, measured in the same run:
//   Time, CPU      Google Benchmark's timing of PowerCompressor<R>::reduce (P = M Q,
//                  orthonormalise, Q = M^T P, P Q^T, error feedback)
//   power_ns       thread CPU time of the same call, best of 3 batches, minus the copy
//                  of the input
//   dense_ns       the same for Dense::reduce of the same matrix (allreduce + scale)
//   ratio_vs_dense power_ns / dense_ns
//   bytes_power    bytes PowerSGD puts into allreduces per step: 4 (n + m) r
//   bytes_dense    4 n m
//   byte_ratio     bytes_dense / bytes_power
// Run: build-power/bench/bench_power --benchmark_min_time=0.05
#include <benchmark/benchmark.h>

#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/power.hpp>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <random>
#include <span>
#include <vector>

namespace {

using commpact::tensor_layout;
using commpact::tensor_shape;

std::vector<float> randn(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// The distinct weight shapes of ResNet-18 (conv weights flattened to out x in*kh*kw).
const std::vector<tensor_shape> kShapes = {
    {64, 3 * 7 * 7},   {64, 64 * 9},  {128, 64 * 9},  {128, 128 * 9}, {128, 64},    {256, 128 * 9},
    {256, 256 * 9},    {256, 128},    {512, 256 * 9}, {512, 512 * 9}, {512, 256},   {1000, 512}};

// ResNet-18 with BatchNorm vectors (weight and bias per conv) and the fc bias.
tensor_layout resnet18() {
  tensor_layout l;
  auto conv = [&](std::int64_t out, std::int64_t in, std::int64_t k) {
    l.push_back({out, in * k * k});
    l.push_back({out});
    l.push_back({out});
  };
  conv(64, 3, 7);
  for (int b = 0; b < 4; ++b) conv(64, 64, 3);
  std::int64_t in = 64;
  for (std::int64_t out : {128, 256, 512}) {
    conv(out, in, 3);
    conv(out, out, 3);
    conv(out, in, 1);  // downsample
    conv(out, out, 3);
    conv(out, out, 3);
    in = out;
  }
  l.push_back({1000, 512});
  l.push_back({1000});
  return l;
}

// Thread CPU time per call of f in ns: the best of three batches of `reps` calls. With
// P = 1 all work runs on the calling thread, so CPU time is the compute cost and is not
// inflated by other jobs on a shared machine (wall time is, by up to 4x here).
inline double thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

template <class F>
double time_ns(F&& f, int reps) {
  f();  // warm
  double best = 1e300;
  for (int b = 0; b < 3; ++b) {
    const double t0 = thread_cpu_ns();
    for (int i = 0; i < reps; ++i) f();
    best = std::min(best, (thread_cpu_ns() - t0) / reps);
  }
  return best;
}

// time_ns of one reduce by c of a fresh copy of g (written to x), the copy included.
template <class Compressor>
double reduce_ns(Compressor& c, const std::vector<float>& g, std::vector<float>& x, int reps) {
  return time_ns(
      [&] {
        std::copy(g.begin(), g.end(), x.begin());
        c.reduce(std::span<float>(x));
      },
      reps);
}

// Google Benchmark's timed loop: each iteration reduces a fresh copy of g (the copy untimed).
template <class Compressor>
void run_timed(benchmark::State& state, Compressor& c, const std::vector<float>& g, std::vector<float>& x) {
  for (auto _ : state) {
    state.PauseTiming();
    std::copy(g.begin(), g.end(), x.begin());
    state.ResumeTiming();
    c.reduce(std::span<float>(x));
    benchmark::DoNotOptimize(x.data());
  }
}

// The rows' ratio and byte counters, for `numel` floats of which PowerSGD allreduces `power_floats`.
void set_counters(benchmark::State& state, double power_ns, double dense_ns, std::int64_t numel,
                  std::int64_t power_floats) {
  state.counters["power_ns"] = power_ns;
  state.counters["dense_ns"] = dense_ns;
  state.counters["ratio_vs_dense"] = power_ns / dense_ns;
  state.counters["bytes_power"] = static_cast<double>(4 * power_floats);
  state.counters["bytes_dense"] = static_cast<double>(4 * numel);
  state.counters["byte_ratio"] = static_cast<double>(numel) / static_cast<double>(power_floats);
}

template <int R>
void BM_PowerSGD_layer(benchmark::State& state) {
  const auto s = kShapes[static_cast<std::size_t>(state.range(0))];
  auto comm = commpact::ThreadComm::make_world(1)[0];
  commpact::PowerCompressor<R> psgd{comm, {s}, {.min_compression_rate = 0.0}};
  commpact::Dense<commpact::ThreadComm> dense{comm};
  const auto g = randn(static_cast<std::size_t>(s.numel()), 1);
  auto x = g;
  auto y = g;
  const int reps = std::max(3, static_cast<int>(5e6 / static_cast<double>(s.numel())));
  const double dense_with_copy_ns = reduce_ns(dense, g, y, reps);
  const double copy_ns = time_ns([&] { std::copy(g.begin(), g.end(), y.begin()); }, reps);
  run_timed(state, psgd, g, x);
  state.SetLabel(std::to_string(s.rows) + "x" + std::to_string(s.cols));
  // PowerSGD timed with the same helper as Dense, for the ratio.
  const double power_ns = reduce_ns(psgd, g, x, reps) - copy_ns;
  set_counters(state, power_ns, dense_with_copy_ns - copy_ns, s.numel(),
               static_cast<std::int64_t>(psgd.floats_per_step()));
}

template <int R>
void BM_PowerSGD_resnet18(benchmark::State& state) {
  const auto l = resnet18();
  auto comm = commpact::ThreadComm::make_world(1)[0];
  commpact::PowerCompressor<R> psgd{comm, l};
  commpact::Dense<commpact::ThreadComm> dense{comm};
  const auto g = randn(psgd.numel(), 2);
  auto x = g;
  const double copy_ns = time_ns([&] { std::copy(g.begin(), g.end(), x.begin()); }, 3);
  const double dense_ns = reduce_ns(dense, g, x, 3) - copy_ns;
  const double power_ns = reduce_ns(psgd, g, x, 3) - copy_ns;
  run_timed(state, psgd, g, x);
  state.SetLabel("ResNet-18, " + std::to_string(psgd.numel()) + " params");
  set_counters(state, power_ns, dense_ns, static_cast<std::int64_t>(psgd.numel()),
               static_cast<std::int64_t>(psgd.floats_per_step()));
}

void layer_args(benchmark::internal::Benchmark* b) {
  for (int i = 0; i < static_cast<int>(kShapes.size()); ++i) b->Arg(i);
  b->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_PowerSGD_layer, 1)->Apply(layer_args);
BENCHMARK_TEMPLATE(BM_PowerSGD_layer, 4)->Apply(layer_args);
BENCHMARK_TEMPLATE(BM_PowerSGD_resnet18, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PowerSGD_resnet18, 2)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PowerSGD_resnet18, 4)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
