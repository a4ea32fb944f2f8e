// Encode and decode time per element of every codec (quantizers.hpp, casts.hpp,
// sparsifiers.hpp, codecs.hpp, random-k of allreduce.hpp) on one core, for a vector of
// n = 2^20 normal floats (density 1% for the sparsifiers). items_per_second is elements
// per second; ns per element = 1e9 / items_per_second.
//
//   build/bench/bench_codecs --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <commpact/compress/allreduce.hpp>
#include <commpact/compress/codecs.hpp>
#include <commpact/compress/quantizers.hpp>
#include <commpact/compress/sparsifiers.hpp>

#include <random>
#include <span>
#include <vector>

using namespace commpact;

namespace {
constexpr std::size_t n = std::size_t{1} << 20;

const std::vector<float>& input() {
  static const std::vector<float> v = [] {
    std::mt19937_64 g(1);
    std::normal_distribution<float> d(0.f, 0.01f);
    std::vector<float> x(n);
    for (auto& e : x) e = d(g);
    return x;
  }();
  return v;
}

template <class K>
void encode(benchmark::State& st, K k) {
  const auto& v = input();
  std::vector<std::byte> msg(k.max_encoded_bytes(n));
  std::vector<float> approx(n);
  std::int64_t step = 0;
  for (auto _ : st) {
    if constexpr (requires { k.begin_step(step); }) k.begin_step(step++);
    benchmark::DoNotOptimize(k.encode(v, msg, approx));
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(n));
  st.counters["bytes"] = static_cast<double>(k.max_encoded_bytes(n));
}

template <class K>
void decode(benchmark::State& st, K k) {
  const auto& v = input();
  std::vector<std::byte> msg(k.max_encoded_bytes(n));
  const std::size_t b = k.encode(v, msg, {});
  std::vector<float> acc(n, 0.0f);
  for (auto _ : st) {
    k.decode_add(std::span<const std::byte>(msg).first(b), acc);
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(n));
}

void randomk_encode(benchmark::State& st) {  // draw the indices and gather (compress)
  const auto& v = input();
  randomk_codec k{0.01, 1};
  std::vector<float> out(k.size(n));
  std::int64_t step = 0;
  for (auto _ : st) {
    k.begin_step(step++);
    k.compress(v, out);
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(n));
}
void randomk_decode(benchmark::State& st) {
  const auto& v = input();
  randomk_codec k{0.01, 1};
  std::vector<float> out(k.size(n)), acc(n, 0.0f);
  k.compress(v, out);
  for (auto _ : st) {
    k.decompress_add(out, acc);
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations() * static_cast<std::int64_t>(n));
}
}  // namespace

#define CODEC_BENCH(name, ...)                                                          \
  BENCHMARK_CAPTURE(encode, name, __VA_ARGS__)->Unit(benchmark::kMillisecond);          \
  BENCHMARK_CAPTURE(decode, name, __VA_ARGS__)->Unit(benchmark::kMillisecond)

CODEC_BENCH(topk, topk_codec{0.01});
CODEC_BENCH(sign, sign_codec{});
CODEC_BENCH(qsgd_s16, qsgd_codec{16, 1});
CODEC_BENCH(qsgd_s256, qsgd_codec{256, 1});
CODEC_BENCH(terngrad, terngrad_codec{1});
CODEC_BENCH(onebit, onebit_codec{});
CODEC_BENCH(natural, natural_codec{1});
CODEC_BENCH(fp16, fp16_codec{});
CODEC_BENCH(bf16, bf16_codec{});
CODEC_BENCH(threshold, threshold_codec{0.025f, 0.01});
CODEC_BENCH(gaussiank, gaussiank_codec{0.01});
CODEC_BENCH(dgc, dgc_codec{0.01, 0.01, 1});
BENCHMARK(randomk_encode)->Unit(benchmark::kMillisecond);
BENCHMARK(randomk_decode)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
