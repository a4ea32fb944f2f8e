// The O(n) kernels of kernels/host/vector_ops.hpp and commit.hpp against the plain scalar
// loops they replace and against the memory floor (streaming passes with the same
// traffic), n = 1M .. 16M floats.
//
//   build/bench/bench_vector_ops --benchmark_min_time=0.2
//   g++ -std=c++20 -O2 -Iinclude bench/bench_vector_ops.cpp -lbenchmark -lpthread   # the users' -O2
//
// bytes/s counts the bytes each pass must move (reads + writes, no read-for-ownership),
// so a kernel and its floor show the same bytes and their times compare directly.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "commpact/kernels/host/scatter.hpp"
#include "commpact/kernels/host/vector_ops.hpp"

namespace {

namespace h = commpact::host;

struct buffers {
  std::vector<float> a, b, c, d;
  std::vector<std::int32_t> idx;
  std::vector<float> val;
};

// Data per size, made once: Gaussian a, b, c, d, and k = n / 1000 sorted indices.
buffers& data(std::size_t n) {
  static std::map<std::size_t, buffers> sets;
  auto& s = sets[n];
  if (s.a.size() != n) {
    std::mt19937_64 rng(42);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (auto* v : {&s.a, &s.b, &s.c, &s.d}) {
      v->resize(n);
      for (auto& x : *v) x = g(rng);
    }
    const std::size_t k = n / 1000;
    s.idx.resize(k);
    for (std::size_t j = 0; j < k; ++j) s.idx[j] = static_cast<std::int32_t>(j * 1000 + rng() % 1000);
    s.val.assign(s.idx.size(), 1.5f);
  }
  return s;
}

// 1.0f that the compiler cannot see (x * 1.0f would be folded away).
float one() {
  static volatile float v = 1.0f;
  return v;
}

void bytes(benchmark::State& st, std::size_t per_element) {
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * st.range(0) *
                       static_cast<std::int64_t>(per_element));
}

// ---- floors -------------------------------------------------------------------------
void BM_floor_read(benchmark::State& st) {  // one read pass (an OR of the bits, explicit vectors)
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    using h::simd::vu;
    constexpr std::size_t L = h::simd::lanes;
    vu a{}, b{};
    for (std::size_t i = 0; i + 2 * L <= s.a.size(); i += 2 * L) {  // n is a multiple of 2 L
      a |= h::simd::load<vu>(s.a.data() + i);
      b |= h::simd::load<vu>(s.a.data() + i + L);
    }
    a |= b;
    benchmark::DoNotOptimize(a);
  }
  bytes(st, 4);
}
void BM_floor_memcpy(benchmark::State& st) {  // one read + one write stream
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    std::memcpy(s.b.data(), s.a.data(), s.a.size() * sizeof(float));
    benchmark::ClobberMemory();
  }
  bytes(st, 8);
}
void BM_floor_memset(benchmark::State& st) {  // one write stream
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    std::memset(s.d.data(), 0, s.d.size() * sizeof(float));
    benchmark::ClobberMemory();
  }
  bytes(st, 4);
}

// ---- finiteness ----------------------------------------------------------------------
void BM_first_nonfinite(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) benchmark::DoNotOptimize(h::first_nonfinite(s.a));
  bytes(st, 4);
}
void BM_first_nonfinite_scalar(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    std::size_t bad = s.a.size();
    for (std::size_t i = 0; i < s.a.size(); ++i)
      if (!std::isfinite(s.a[i])) {
        bad = i;
        break;
      }
    benchmark::DoNotOptimize(bad);
  }
  bytes(st, 4);
}

// ---- scaling (in place: one read and one write stream) --------------------------------
void BM_scale(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    h::scale(s.a, one());
    benchmark::ClobberMemory();
  }
  bytes(st, 8);
}
void BM_scale_scalar(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    for (auto& x : s.a) x *= one();
    benchmark::ClobberMemory();
  }
  bytes(st, 8);
}
void BM_scale_checked(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) benchmark::DoNotOptimize(h::scale_checked(s.a, one()));
  bytes(st, 8);
}
void BM_scale_checked_scalar(benchmark::State& st) {  // today's Dense: check, then scale
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    std::size_t bad = s.a.size();
    for (std::size_t i = 0; i < s.a.size(); ++i)
      if (!std::isfinite(s.a[i])) {
        bad = i;
        break;
      }
    for (auto& x : s.a) x *= one();
    benchmark::DoNotOptimize(bad);
    benchmark::ClobberMemory();
  }
  bytes(st, 8);
}

// ---- y += x (two reads, one write) ---------------------------------------------------
void BM_add(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    h::add(s.a, s.b);
    h::sub(s.a, s.b);
    benchmark::ClobberMemory();
  }
  bytes(st, 24);
}
void BM_add_scalar(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  float* y = s.a.data();
  const float* x = s.b.data();
  const std::size_t n = s.a.size();
  for (auto _ : st) {
    for (std::size_t i = 0; i < n; ++i) y[i] += x[i];
    for (std::size_t i = 0; i < n; ++i) y[i] -= x[i];
    benchmark::ClobberMemory();
  }
  bytes(st, 24);
}

// ---- error feedback: acc = r + s g (two reads, one write); with momentum 3 reads, 2 writes
void BM_ef_accumulate(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) benchmark::DoNotOptimize(h::ef_accumulate(s.d, s.a, s.b, 0.5f));
  bytes(st, 12);
}
void BM_ef_accumulate_scalar(benchmark::State& st) {  // the plain scalar loop the vectorised pass replaces
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    bool finite = true;
    for (std::size_t i = 0; i < s.a.size(); ++i) {
      const float gi = s.b[i] * 0.5f;
      const float a = s.a[i] + gi;
      s.d[i] = a;
      finite &= std::isfinite(a);
    }
    benchmark::DoNotOptimize(finite);
    benchmark::ClobberMemory();
  }
  bytes(st, 12);
}
void BM_ef_accumulate_momentum(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) benchmark::DoNotOptimize(h::ef_accumulate_momentum(s.d, s.c, s.c, s.a, s.b, 0.0f, 0.5f));
  bytes(st, 20);
}
void BM_ef_accumulate_momentum_scalar(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    bool finite = true;
    for (std::size_t i = 0; i < s.a.size(); ++i) {
      const float gi = s.b[i] * 0.5f;
      const float mu = 0.0f * s.c[i];
      s.c[i] = mu + gi;
      const float a = s.a[i] + s.c[i];
      s.d[i] = a;
      finite &= std::isfinite(a);
    }
    benchmark::DoNotOptimize(finite);
    benchmark::ClobberMemory();
  }
  bytes(st, 20);
}

// ---- commit: dense = 0, dense[idx] = val / P (k = n / 1000), one write stream ----------
void BM_scatter_into_zeroed(benchmark::State& st) {
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    h::scatter_into_zeroed(s.d, s.idx, s.val, 4.0f);
    benchmark::ClobberMemory();
  }
  bytes(st, 4);
}
void BM_fill_then_scatter(benchmark::State& st) {  // today's gTopK commit
  auto& s = data(static_cast<std::size_t>(st.range(0)));
  for (auto _ : st) {
    std::fill(s.d.begin(), s.d.end(), 0.0f);
    for (std::size_t j = 0; j < s.idx.size(); ++j) s.d[static_cast<std::size_t>(s.idx[j])] = s.val[j] / 4.0f;
    benchmark::ClobberMemory();
  }
  bytes(st, 4);
}

#define COMMPACT_SIZES ->RangeMultiplier(4)->Range(1 << 20, 1 << 24)->Unit(benchmark::kMillisecond)
BENCHMARK(BM_floor_read) COMMPACT_SIZES;
BENCHMARK(BM_floor_memcpy) COMMPACT_SIZES;
BENCHMARK(BM_floor_memset) COMMPACT_SIZES;
BENCHMARK(BM_first_nonfinite) COMMPACT_SIZES;
BENCHMARK(BM_first_nonfinite_scalar) COMMPACT_SIZES;
BENCHMARK(BM_scale) COMMPACT_SIZES;
BENCHMARK(BM_scale_scalar) COMMPACT_SIZES;
BENCHMARK(BM_scale_checked) COMMPACT_SIZES;
BENCHMARK(BM_scale_checked_scalar) COMMPACT_SIZES;
BENCHMARK(BM_add) COMMPACT_SIZES;
BENCHMARK(BM_add_scalar) COMMPACT_SIZES;
BENCHMARK(BM_ef_accumulate) COMMPACT_SIZES;
BENCHMARK(BM_ef_accumulate_scalar) COMMPACT_SIZES;
BENCHMARK(BM_ef_accumulate_momentum) COMMPACT_SIZES;
BENCHMARK(BM_ef_accumulate_momentum_scalar) COMMPACT_SIZES;
BENCHMARK(BM_scatter_into_zeroed) COMMPACT_SIZES;
BENCHMARK(BM_fill_then_scatter) COMMPACT_SIZES;

}  // namespace

BENCHMARK_MAIN();
