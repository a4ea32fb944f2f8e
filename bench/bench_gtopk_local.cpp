// The local phase of gTop-k (accumulate the residual, select the top k, scatter into the
// zeroed gradient) unfused and fused, against its memory floor: streaming passes that move
// the 16 n bytes the phase cannot avoid (read residual, read g, write acc, write grad).
// Issue 18's target: fused within 1.2x of the floor at n = 16M, k = n / 1000, -O2.
//
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG"
//   cmake --build build --target bench_gtopk_local
//   build/bench/bench_gtopk_local --benchmark_repetitions=5
//
// Two floors, both 16 n bytes: separate streaming passes (read r and g; memset acc; memset
// grad) and the fused kernel's shape (one pass reading r and g and streaming acc; memset
// grad); the faster of the two is "the floor". BM_interleaved runs both floors, unfused
// and fused one after the other in every iteration and reports the ratios of their summed
// times as counters (wall clock, and the thread's CPU time: *_cpu), so that a load that
// drifts during the run hits all alike; with repetitions, Google Benchmark adds their mean,
// median and stddev. The separate benchmarks are there for the absolute times. bytes/s
// counts 16 n bytes for all of them.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <new>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "commpact/kernels/host/commit.hpp"
#include "commpact/kernels/host/topk.hpp"
#include "commpact/kernels/host/topk_fused.hpp"
#include "commpact/kernels/host/vector_ops.hpp"

namespace {

namespace h = commpact::host;

// 64-byte aligned storage, so that the streaming stores apply at every -march.
template <class T>
struct aligned64 {
  using value_type = T;
  aligned64() = default;
  template <class U>
  aligned64(const aligned64<U>&) noexcept {}
  T* allocate(std::size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }
  friend bool operator==(const aligned64&, const aligned64&) { return true; }
};
using fvec = std::vector<float, aligned64<float>>;

struct buffers {
  fvec r, g, acc, grad;
  std::vector<std::int32_t> idx;
  std::vector<float> val;
  h::topk_workspace ws;
};

// Gaussian residual and gradient per size, made once.
buffers& data(std::size_t n) {
  static std::map<std::size_t, buffers> sets;
  auto& s = sets[n];
  if (s.r.size() != n) {
    std::mt19937_64 rng(42);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto* v : {&s.r, &s.g, &s.acc, &s.grad}) {
      v->resize(n);
      for (auto& x : *v) x = d(rng);
    }
    const std::size_t k = n / 1000;
    s.idx.resize(k);
    s.val.resize(k);
  }
  return s;
}

constexpr float P = 4.0f;  // the scatter divides by the rank count

// Floor 1, separate passes: read residual and g (one pass, an OR of their bits), write acc
// and grad (memset: glibc streams large ones with non-temporal stores): 16 n bytes.
void floor_passes(buffers& s) {
  using h::simd::vu;
  constexpr std::size_t L = h::simd::lanes;
  const std::size_t n = s.r.size();
  vu a{}, b{};
  for (std::size_t i = 0; i + L <= n; i += L) {  // n is a multiple of L
    a |= h::simd::load<vu>(s.r.data() + i);
    b |= h::simd::load<vu>(s.g.data() + i);
  }
  a |= b;
  benchmark::DoNotOptimize(a);
  std::memset(s.acc.data(), 0, n * sizeof(float));
  std::memset(s.grad.data(), 0, n * sizeof(float));
  benchmark::ClobberMemory();
}

// Floor 2, the fused kernel's shape: one pass that reads residual and g and streams
// (r | g) bits into acc, then a memset of grad: 16 n bytes.
void floor_stream(buffers& s) {
  using h::simd::vf;
  using h::simd::vu;
  constexpr std::size_t L = h::simd::lanes;
  const std::size_t n = s.r.size();
  float* acc = s.acc.data();
  for (std::size_t i = 0; i + L <= n; i += L) {  // n is a multiple of L
    const vu v = h::simd::load<vu>(s.r.data() + i) | h::simd::load<vu>(s.g.data() + i);
#if COMMPACT_HOST_STREAM
    h::simd::stream_store(acc + i, (vf)v);
#else
    h::simd::store(acc + i, (vf)v);
#endif
  }
#if COMMPACT_HOST_STREAM
  h::simd::stream_fence();
#endif
  std::memset(s.grad.data(), 0, n * sizeof(float));
  benchmark::ClobberMemory();
}

// Today's three passes: ef_accumulate, topk_abs, scatter_into_zeroed.
void unfused(buffers& s) {
  const std::size_t k = s.idx.size();
  benchmark::DoNotOptimize(h::ef_accumulate(s.acc, s.r, s.g));
  h::topk_abs(s.acc, k, s.idx, s.val, s.ws);
  h::scatter_into_zeroed(s.grad, s.idx, s.val, P);
  benchmark::ClobberMemory();
}

void fused(buffers& s) {
  const std::size_t k = s.idx.size();
  benchmark::DoNotOptimize(h::ef_accumulate_topk_abs(s.acc, s.r, s.g, std::nullopt, k, s.idx, s.val, s.ws));
  h::scatter_into_zeroed(s.grad, s.idx, s.val, P);
  benchmark::ClobberMemory();
}

void bytes(benchmark::State& st) {
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * st.range(0) * 16);
}

void BM_floor_passes(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) floor_passes(s);
  bytes(st);
}
void BM_floor_stream(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) floor_stream(s);
  bytes(st);
}
void BM_unfused(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) unfused(s);
  bytes(st);
}
void BM_fused(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) fused(s);
  st.counters["sampled"] = s.ws.last_path() == h::topk_path::sampled;
  bytes(st);
}

// The thread's CPU time in seconds: what a preempted thread does not get is not counted.
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

void BM_interleaved(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  using clock = std::chrono::steady_clock;
  auto wall = [] { return std::chrono::duration<double>(clock::now().time_since_epoch()).count(); };
  // [0] floor_passes, [1] floor_stream, [2] unfused, [3] fused; wall and thread CPU time.
  double w[4] = {}, c[4] = {};
  void (*const fns[4])(buffers&) = {floor_passes, floor_stream, unfused, fused};
  for (auto _ : st) {
    for (int f = 0; f < 4; ++f) {
      const double w0 = wall(), c0 = thread_seconds();
      fns[f](s);
      w[f] += wall() - w0;
      c[f] += thread_seconds() - c0;
    }
  }
  const double fl_w = std::min(w[0], w[1]), fl_c = std::min(c[0], c[1]);  // the faster floor
  st.counters["unfused/floor"] = w[2] / fl_w;
  st.counters["fused/floor"] = w[3] / fl_w;
  st.counters["unfused/floor_cpu"] = c[2] / fl_c;
  st.counters["fused/floor_cpu"] = c[3] / fl_c;
  st.counters["stream/passes"] = w[1] / w[0];
  st.counters["floor_GBps"] = 16.0 * static_cast<double>(st.range(0)) * static_cast<double>(st.iterations()) / fl_w / 1e9;
}

#define COMMPACT_SIZES ->Arg(1 << 24)->Unit(benchmark::kMillisecond)
BENCHMARK(BM_floor_passes) COMMPACT_SIZES;
BENCHMARK(BM_floor_stream) COMMPACT_SIZES;
BENCHMARK(BM_unfused) COMMPACT_SIZES;
BENCHMARK(BM_fused) COMMPACT_SIZES;
BENCHMARK(BM_interleaved) COMMPACT_SIZES;

}  // namespace

BENCHMARK_MAIN();
