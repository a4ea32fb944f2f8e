// The host hot passes against memory floors measured in the same run, at every
// instruction-set level this CPU runs (kernels/host/isa.hpp).
//
//   g++ -std=c++20 -O2 -Iinclude bench/bench_host_passes.cpp -o /tmp/bench_host_passes   # the users' flags
//   /tmp/bench_host_passes [--n N] [--rounds R] [--topk-n N]   # --help: the options (CLI11)
//
// --n: floats per stream (default 2^24), --topk-n: the top-k input (default 25000000),
// both whole numbers from 1 to 2^31 - 1; --rounds: 1 to 1000000 (default 7).
//
// Floors. Five access patterns, each written with the widest vectors the CPU has (AVX-512
// or AVX2, chosen as the library's passes are) and timed in the same rounds as the
// passes: read (an OR over one stream), rw (x[i] = x[i] * s in place), copy (one stream
// in, one out), two_in_one_out (c = a + b), and the same with non-temporal stores
// (copy_nt, two_in_one_out_nt: no read-for-ownership). A pass's "pattern floor" is the
// floor of its own access pattern; "bw floor" is its bytes (reads + writes, no
// read-for-ownership) at the fastest bandwidth any floor reached in that round, the
// tightest bound the machine showed. Every line gives the median over the rounds of
// time / floor (each ratio from one round) with the spread (min..max) and the bandwidth
// the pass moves its bytes at. The rounds interleave every pass, so load from other
// processes reaches all of them alike.
//
// Passes: the vector_ops passes (Dense at P = 1 is scale_checked(g, 1): one rw pass, as
// torch's g.div_(1)); topk_abs at n = --topk-n with k = n / 1000 (floor: one read of
// its input); the fused gTop-k local phase ef_accumulate_topk_abs (floor: two in, one
// out, non-temporal: what it must move); CastAllreduce's fp16 and bf16 passes
// (cast_encode with error feedback, cast_add, cast_decode_mean) and fp16 / bf16 ratios.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_args.hpp"
#include "commpact/compress/codecs/casts.hpp"
#include "commpact/kernels/host/cast.hpp"
#include "commpact/kernels/host/isa.hpp"
#include "commpact/kernels/host/topk.hpp"
#include "commpact/kernels/host/topk_fused.hpp"
#include "commpact/kernels/host/vector_ops.hpp"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace {

namespace h = commpact::host;
namespace isa = commpact::host::isa;
namespace simd = commpact::host::simd;

// ---- floors: explicit vectors of W bytes, run at the widest level -----------------------
struct floor_read {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static std::uint32_t run(const float* p, std::size_t n) noexcept {
    using vu = simd::vu_w<W>;
    constexpr std::size_t L = W / 4;
    vu a0{}, a1{}, a2{}, a3{};
    for (std::size_t i = 0; i + 4 * L <= n; i += 4 * L) {
      a0 |= simd::load<vu>(p + i);
      a1 |= simd::load<vu>(p + i + L);
      a2 |= simd::load<vu>(p + i + 2 * L);
      a3 |= simd::load<vu>(p + i + 3 * L);
    }
    return simd::or_lanes<W>(a0 | a1 | a2 | a3);
  }
};
struct floor_rw {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static int run(float* p, std::size_t n, float s) noexcept {
    using vf = simd::vf_w<W>;
    for (std::size_t i = 0; i + W / 4 <= n; i += W / 4) simd::store(p + i, simd::load<vf>(p + i) * s);
    return 0;
  }
};
template <bool NT>
struct floor_copy {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static int run(const float* a, float* c, std::size_t n) noexcept {
    using vf = simd::vf_w<W>;
    for (std::size_t i = 0; i + W / 4 <= n; i += W / 4) {
      if constexpr (NT) simd::stream_store_w<W>(c + i, simd::load<vf>(a + i));
      else simd::store(c + i, simd::load<vf>(a + i));
    }
    if constexpr (NT) simd::stream_fence();
    return 0;
  }
};
template <bool NT>
struct floor_two_one {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static int run(const float* a, const float* b, float* c, std::size_t n) noexcept {
    using vf = simd::vf_w<W>;
    for (std::size_t i = 0; i + W / 4 <= n; i += W / 4) {
      const vf v = simd::load<vf>(a + i) + simd::load<vf>(b + i);
      if constexpr (NT) simd::stream_store_w<W>(c + i, v);
      else simd::store(c + i, v);
    }
    if constexpr (NT) simd::stream_fence();
    return 0;
  }
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct entry {
  std::string name;
  std::string pattern;  // the floor it divides by
  double bytes;
  std::function<void()> run;
  isa::level level = isa::level::base;
  std::vector<double> t;
  bool topk_size = false;  // runs over the top-k input (--topk-n values)
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::vector<float> gaussian(std::size_t n, std::uint64_t seed, float sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = std::size_t{1} << 24, topk_n = 25000000;
  int rounds = 7;
  {
    std::string n_text = std::to_string(n), rounds_text = std::to_string(rounds), topk_text = std::to_string(topk_n);
    CLI::App app{"bench_host_passes: the host hot passes against memory floors measured in the same run, at every "
                 "instruction-set level this CPU runs"};
    constexpr long long max_n = (1LL << 31) - 1;  // the kernels' limit (int32 indices)
    app.add_option("--n", n_text, "floats per stream, 1 to 2^31 - 1 (default 16777216 = 2^24)")->type_name("N");
    app.add_option("--rounds", rounds_text, "timed rounds, 1 to 1000000 (default 7)")->type_name("R");
    app.add_option("--topk-n", topk_text, "floats of the top-k input (k = n / 1000), 1 to 2^31 - 1 (default 25000000)")
        ->type_name("N");
    try {
      app.parse(argc, argv);
      n = static_cast<std::size_t>(bench_args::integer("--n", n_text, 1, max_n));
      rounds = static_cast<int>(bench_args::integer("--rounds", rounds_text, 1, 1000000));
      topk_n = static_cast<std::size_t>(bench_args::integer("--topk-n", topk_text, 1, max_n));
    } catch (const CLI::ParseError& e) {
      return bench_args::cli_failure(app, e, "bench_host_passes");
    } catch (const bench_args::error& e) {
      return bench_args::usage_error("bench_host_passes", e.what());
    }
  }
  const isa::level top = isa::detected();
  std::printf("n = %zu floats, top-k n = %zu, %d rounds; CPU levels up to %s\n", n, topk_n, rounds, isa::name(top));

  std::vector<float> a = gaussian(n, 1, 1.0f), b = gaussian(n, 2, 1.0f), c(n), d(n), u = gaussian(n, 3, 1.0f);
  std::vector<float> grad = gaussian(n, 4, 1e-4f), res = gaussian(n, 5, 1e-6f), cand(n);  // gradient-like magnitudes
  std::vector<std::uint16_t> codes(n), sums(n), dec16(n), decb16(n);
  h::cast_encode<commpact::fp16_codec>(grad, {}, dec16, {});
  h::cast_encode<commpact::bf16_codec>(grad, {}, decb16, {});
  std::vector<float> tk = gaussian(topk_n, 6, 1.0f);
  const std::size_t k = topk_n / 1000, kg = n / 1000;
  std::vector<std::int32_t> idx(std::max(k, kg));
  std::vector<float> val(std::max(k, kg));
  h::topk_workspace ws, wsg;
  const float one = 1.0f;
  volatile std::uint32_t sink = 0;

  const double F = 4.0 * static_cast<double>(n);  // bytes of one float stream
  std::vector<entry> es;
  auto at = [&](isa::level l, auto fn) {
    return [l, fn] {
      const isa::level was = isa::force(l);
      fn();
      isa::force(was);
    };
  };
  // Floors at the widest level.
  es.push_back({"floor read", "read", F, at(top, [&] { sink = h::detail::dispatch<floor_read>(a.data(), n); }), top, {}});
  es.push_back({"floor rw (in place)", "rw", 2 * F, at(top, [&] { h::detail::dispatch<floor_rw>(c.data(), n, one); }), top, {}});
  es.push_back({"floor copy", "copy", 2 * F, at(top, [&] { h::detail::dispatch<floor_copy<false>>(a.data(), c.data(), n); }), top, {}});
  es.push_back({"floor copy nt", "copy_nt", 2 * F,
                at(top, [&] { h::detail::dispatch<floor_copy<true>>(a.data(), c.data(), n); }), top, {}});
  es.push_back({"floor two_in_one_out", "two_in_one_out", 3 * F,
                at(top, [&] { h::detail::dispatch<floor_two_one<false>>(a.data(), b.data(), c.data(), n); }), top, {}});
  es.push_back({"floor two_in_one_out nt", "two_in_one_out_nt", 3 * F,
                at(top, [&] { h::detail::dispatch<floor_two_one<true>>(a.data(), b.data(), c.data(), n); }), top, {}});
  es.push_back({"floor read (top-k n)", "read", 4.0 * static_cast<double>(topk_n),
                at(top, [&] { sink = h::detail::dispatch<floor_read>(tk.data(), topk_n); }), top, {}, true});
  const std::size_t nfloors = es.size();
  for (isa::level l : {isa::level::base, isa::level::avx2, isa::level::avx512}) {
    if (l > top) break;
    auto add = [&](const char* name, const char* pattern, double bytes, auto fn, bool topk_size = false) {
      es.push_back({std::string(name) + " [" + isa::name(l) + "]", pattern, bytes, at(l, fn), l, {}, topk_size});
    };
    add("first_nonfinite", "read", F, [&] { sink = static_cast<std::uint32_t>(h::first_nonfinite(a)); });
    add("Dense P=1: scale_checked(g, 1)", "rw", 2 * F, [&] { sink = static_cast<std::uint32_t>(h::scale_checked(c, 1.0f)); });
    add("mean_checked(src, dst, 3)", "copy", 2 * F, [&] { sink = static_cast<std::uint32_t>(h::mean_checked(a, d, 3)); });
    add("ef_accumulate(acc, r, g)", "two_in_one_out_nt", 3 * F, [&] { sink = static_cast<std::uint32_t>(h::ef_accumulate(d, a, b)); });
    add("topk_abs (k = n/1000)", "read", 4.0 * static_cast<double>(topk_n), [&] { h::topk_abs(tk, k, idx, val, ws); }, true);
    add("gTop-k local: ef_accumulate_topk_abs", "two_in_one_out_nt", 3 * F, [&] {
      sink = static_cast<std::uint32_t>(h::ef_accumulate_topk_abs(d, a, b, std::nullopt, kg, idx, val, wsg));
    });
    add("fp16 cast_encode (ef)", "two_in_one_out_nt", 3.5 * F, [&] {
      h::cast_encode<commpact::fp16_codec>(grad, res, codes, cand);
    });
    add("bf16 cast_encode (ef)", "two_in_one_out_nt", 3.5 * F, [&] {
      h::cast_encode<commpact::bf16_codec>(grad, res, codes, cand);
    });
    add("fp16 cast_add", "rw", 1.5 * F, [&] { h::cast_add<commpact::fp16_codec>(codes, sums); });
    add("bf16 cast_add", "rw", 1.5 * F, [&] { h::cast_add<commpact::bf16_codec>(codes, sums); });
    add("fp16 cast_decode_mean", "copy", 1.5 * F,
        [&] { sink = h::cast_decode_mean<commpact::fp16_codec>(dec16, d, 2); });
    add("bf16 cast_decode_mean", "copy", 1.5 * F,
        [&] { sink = h::cast_decode_mean<commpact::bf16_codec>(decb16, d, 2); });
  }
  // Warm-up (first touch, workspaces), then interleaved rounds.
  for (auto& e : es) e.run();
  for (int r = 0; r < rounds; ++r)
    for (auto& e : es) {
      const double t0 = now();
      e.run();
      e.t.push_back(now() - t0);
    }
  auto floor_of = [&](const std::string& pattern, bool topk_size) -> const entry& {
    for (std::size_t i = 0; i < nfloors; ++i)
      if (es[i].pattern == pattern && es[i].topk_size == topk_size) return es[i];
    return es[0];
  };
  std::printf("\n%-44s %9s %8s  %-18s %-22s %-22s %s\n", "pass", "median ms", "GB/s", "pattern floor",
              "time / pattern floor", "time / bw floor", "best / best floor");
  for (std::size_t i = 0; i < es.size(); ++i) {
    const entry& e = es[i];
    const entry& f = floor_of(e.pattern, e.topk_size);
    // Ratios per round; a pass and its pattern floor may move different bytes (the
    // cast passes), so the pattern ratio compares seconds per byte.
    std::vector<double> rp, rb;
    for (std::size_t r = 0; r < static_cast<std::size_t>(rounds); ++r) {
      double best_bw = 0;  // the fastest floor of this round, bytes per second
      for (std::size_t j = 0; j < nfloors; ++j) best_bw = std::max(best_bw, es[j].bytes / es[j].t[r]);
      rp.push_back((e.t[r] / e.bytes) / (f.t[r] / f.bytes));
      rb.push_back(e.t[r] / (e.bytes / best_bw));
    }
    const double tm = median(e.t);
    // The best time over the best time of the pattern floor (seconds per byte): the
    // ratio least touched by preemption on a loaded machine.
    const double best = (*std::min_element(e.t.begin(), e.t.end()) / e.bytes) /
                        (*std::min_element(f.t.begin(), f.t.end()) / f.bytes);
    char pr[64], br[64];
    std::snprintf(pr, sizeof pr, "%.2f (%.2f..%.2f)", median(rp), *std::min_element(rp.begin(), rp.end()),
                  *std::max_element(rp.begin(), rp.end()));
    std::snprintf(br, sizeof br, "%.2f (%.2f..%.2f)", median(rb), *std::min_element(rb.begin(), rb.end()),
                  *std::max_element(rb.begin(), rb.end()));
    std::printf("%-44s %9.3f %8.1f  %-18s %-22s %-22s %.2f\n", e.name.c_str(), tm * 1e3, e.bytes / tm * 1e-9,
                i < nfloors ? "-" : f.pattern.c_str(), i < nfloors ? "-" : pr, br, best);
  }
  // fp16 / bf16 per pass and level.
  std::printf("\nfp16 / bf16 time (median of per-round ratios):\n");
  for (std::size_t i = nfloors; i < es.size(); ++i) {
    if (es[i].name.rfind("fp16", 0) != 0) continue;
    const std::string other = "bf16" + es[i].name.substr(4);
    for (const entry& o : es)
      if (o.name == other) {
        std::vector<double> q;
        for (int r = 0; r < rounds; ++r) q.push_back(es[i].t[static_cast<std::size_t>(r)] / o.t[static_cast<std::size_t>(r)]);
        std::printf("  %-42s %.2f (%.2f..%.2f)\n", es[i].name.c_str(), median(q), *std::min_element(q.begin(), q.end()),
                    *std::max_element(q.begin(), q.end()));
      }
  }
  return static_cast<int>(sink & 0u);
}
