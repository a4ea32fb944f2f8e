// Encode and decode time per element of every codec (quantizers.hpp, casts.hpp,
// sparsifiers.hpp, codecs.hpp, random-k of allreduce.hpp) on one core, for a vector of
// n = 2^20 normal floats (density 1% for the sparsifiers). items_per_second is elements
// per second; ns per element = 1e9 / items_per_second.
//
//   build/bench/bench_codecs --benchmark_min_time=0.2
//
// First it prints the bytes one rank sends per step (mean over ranks and 4 steps after the
// first, CountingComm over ThreadComm) for TopK, gTopK and OkTopK at density 1%,
// n = 2^18, P = 2 ... 64: Ok-Topk's stay flat, TopK's grow like P - 1, gTopK's like log2 P.
#include <benchmark/benchmark.h>

#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/oktopk.hpp>
#include <commpact/compress/compressors/topk.hpp>

#include <cstdio>

#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/sparsifiers.hpp>

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

namespace {
template <class Make>
double bytes_per_step(int P, Make make) {
  const std::size_t m = std::size_t{1} << 18;
  std::vector<double> b(static_cast<std::size_t>(P));
  run_threads(P, [&](ThreadComm& comm) {
    CountingComm<ThreadComm> counted{comm};
    auto c = make(counted);
    std::mt19937_64 g(static_cast<std::uint64_t>(comm.rank()));
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<float> x(m);
    comm_stats before;
    for (int t = 0; t < 5; ++t) {
      if (t == 1) before = counted.stats();
      for (auto& e : x) e = d(g);
      c.reduce(std::span<float>(x));
    }
    b[static_cast<std::size_t>(comm.rank())] = static_cast<double>((counted.stats() - before).bytes_sent) / 4;
  });
  double s = 0;
  for (double v : b) s += v;
  return s / P;
}
}  // namespace

int main(int argc, char** argv) {
  using CC = CountingComm<ThreadComm>;
  std::printf("bytes per rank per step, n = 2^18, density 1%% (k = 2621)\n%4s %12s %12s %12s\n", "P", "TopK", "gTopK",
              "OkTopK");
  for (int P : {2, 4, 8, 16, 32, 64}) {
    const double tk = bytes_per_step(P, [](CC c) { return TopK<CC>{c, {.density = 0.01}}; });
    const double gt = bytes_per_step(P, [](CC c) { return gTopK<TreeComm<CC>>{c, {.density = 0.01}}; });
    const double ok = bytes_per_step(P, [](CC c) { return OkTopK<CC>{c, {.density = 0.01}}; });
    std::printf("%4d %12.0f %12.0f %12.0f\n", P, tk, gt, ok);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
