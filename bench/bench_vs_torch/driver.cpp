// The C++ side of bench/bench_vs_torch/run.py: times one case with commpact's host
// kernels on one thread and prints "<case> <median wall ms> <median CPU ms>". Built by run.py with
// g++ -O2 and -O3 (the flags a user compiles the header-only library with); not part of
// the CMake build (the bench/ glob takes bench_*.cpp only).
//
//   driver topk  <n> <k> <reps>      topk_abs(g, k)
//   driver power <r> <reps>          one PowerSGD step (P = 1) on ResNet-18's shapes
//   driver scale <n> <reps>          Dense at P = 1: finiteness check + scale by 1/P, one pass
//   driver gtopk <n> <k> <reps>      gTopK's local phase: accumulate, select, commit
//   driver floor <n> <reps>          one streaming read pass over n floats (x 4 = the floor)
//   driver power_class <r> <reps>    the same step through PowerCompressor<1> (rank r), P = 1
//   driver dense_class <n> <reps>    Dense<ThreadComm>::reduce at P = 1
//   driver gtopk_class <n> <k> <reps> gTopK<TreeComm<ThreadComm>>::reduce at P = 1 (its local phase)

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <ctime>
#include <vector>

#include "commpact/comm/thread_comm.hpp"
#include "commpact/comm/tree_comm.hpp"
#include "commpact/compress/compressors/dense.hpp"
#include "commpact/compress/compressors/gtopk.hpp"
#include "commpact/compress/compressors/power.hpp"
#include "commpact/kernels/host/commit.hpp"
#include "commpact/kernels/host/lowrank.hpp"
#include "commpact/kernels/host/orthogonalize.hpp"
#include "commpact/kernels/host/topk.hpp"
#include "commpact/kernels/host/vector_ops.hpp"
#include "../resnet18_shapes.hpp"

namespace {

namespace h = commpact::host;
using clock_type = std::chrono::steady_clock;

std::vector<float> gaussian(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

double cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

// Runs f once to warm up, then reps times; prints the median wall and CPU times in ms.
template <class F>
void time_it(const char* name, int reps, F&& f) {
  f();
  std::vector<double> wall, cpu;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clock_type::now();
    const double c0 = cpu_ms();
    f();
    cpu.push_back(cpu_ms() - c0);
    wall.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  std::printf("%s %.4f %.4f\n", name, wall[wall.size() / 2], cpu[cpu.size() / 2]);
}

using commpact_bench::resnet18;  // ResNet-18's 62 tensors as (rows, cols): bench/resnet18_shapes.hpp

void power(std::size_t r, int reps) {
  struct mat {
    std::size_t off, n, m;
    bool compressed;
    std::size_t p_off, q_off;
  };
  std::vector<mat> mats;
  std::size_t total = 0, np = 0, nq = 0;
  for (auto [n, m] : resnet18()) {
    // PyTorch's rule (min_compression_rate = 2): compress a matrix when 2 (n + m) r < n m.
    const bool comp = m > 1 && n > 1 && 2 * (n + m) * std::min({r, n, m}) < n * m;
    mats.push_back({total, n, m, comp, np, nq});
    total += n * m;
    if (comp) {
      np += n * r;
      nq += m * r;
    }
  }
  auto g = gaussian(total, 1);
  std::vector<float> e(total, 0.0f), P(np), Q = gaussian(nq, 2);
  const float inv_ranks = 1.0f;  // P = 1
  time_it("power", reps, [&] {
    for (const auto& t : mats) {
      std::span<float> gt(g.data() + t.off, t.n * t.m);
      if (!t.compressed) {
        if (h::scale_checked(gt, inv_ranks) != gt.size()) std::abort();  // the dense part's mean
        continue;
      }
      h::lowrank_project_ef(gt, std::span<const float>(e.data() + t.off, t.n * t.m), t.n, t.m,
                            std::span<const float>(Q.data() + t.q_off, t.m * r), r,
                            std::span<float>(P.data() + t.p_off, t.n * r));
    }
    if (h::first_nonfinite(P) != P.size()) std::abort();  // (allreduce of P: nothing to do at P = 1)
    for (const auto& t : mats) {
      if (!t.compressed) continue;
      h::orthonormalize_columns(P.data() + t.p_off, t.n, r, t.n);
      h::lowrank_back_project(std::span<const float>(g.data() + t.off, t.n * t.m), t.n, t.m,
                              std::span<const float>(P.data() + t.p_off, t.n * r), r,
                              std::span<float>(Q.data() + t.q_off, t.m * r));
    }
    if (h::scale_checked(Q, inv_ranks) != Q.size()) std::abort();  // allreduce-mean of Q
    for (const auto& t : mats) {
      if (!t.compressed) continue;
      h::lowrank_approx_residual(std::span<float>(g.data() + t.off, t.n * t.m),
                                 std::span<float>(e.data() + t.off, t.n * t.m), t.n, t.m,
                                 std::span<const float>(P.data() + t.p_off, t.n * r),
                                 std::span<const float>(Q.data() + t.q_off, t.m * r), r);
    }
  });
  std::fprintf(stderr, "power: %zu floats, %zu in P, %zu in Q\n", total, np, nq);
}

void topk(std::size_t n, std::size_t k, int reps) {
  const auto g = gaussian(n, 3);
  std::vector<std::int32_t> idx(k);
  std::vector<float> val(k);
  h::topk_workspace ws;
  time_it("topk", reps, [&] { h::topk_abs(g, k, idx, val, ws); });
}

void scale(std::size_t n, int reps) {
  auto g = gaussian(n, 4);
  time_it("scale", reps, [&] {
    if (h::scale_checked(g, 1.0f) != n) std::abort();
  });
}

// gTopK's local phase at P = 1 with the compressor's buffers: acc = residual + g, the k
// largest |acc|, grad = the selection / P, residual = acc minus the delivered entries
// (acc and residual swap roles, as basic_error_feedback::commit does).
void gtopk(std::size_t n, std::size_t k, int reps) {
  auto g = gaussian(n, 5);
  const auto g0 = g;
  std::vector<float> residual(n, 0.0f), acc(n);
  std::vector<std::int32_t> idx(k);
  std::vector<float> val(k);
  h::topk_workspace ws;
  time_it("gtopk", reps, [&] {
    if (h::ef_accumulate(acc, residual, g) != n) std::abort();
    h::topk_abs(acc, k, idx, val, ws);
    h::scatter_into_zeroed(g, idx, val, 1.0f);
    std::swap(acc, residual);
    h::zero_delivered(residual, {}, idx);
  });
}

// OR of all bits, vectorised explicitly (GCC -O2 leaves a plain loop scalar).
std::uint32_t read_pass(const float* p, std::size_t n) {
  using commpact::host::simd::vu;
  constexpr std::size_t L = commpact::host::simd::lanes;
  vu a{}, b{};
  std::size_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    a |= commpact::host::simd::load<vu>(p + i);
    b |= commpact::host::simd::load<vu>(p + i + L);
  }
  a |= b;
  std::uint32_t r = 0;
  for (std::size_t l = 0; l < L; ++l) r |= a[l];
  for (; i < n; ++i) r |= std::bit_cast<std::uint32_t>(p[i]);
  return r;
}

void floor_pass(std::size_t n, int reps) {
  const auto g = gaussian(n, 6);
  volatile std::uint32_t sink = 0;
  time_it("floor", reps, [&] {
    sink = read_pass(g.data(), n);
  });
}

// The same cases through the library's classes, as a user calls them (P = 1: ThreadComm
// moves nothing, so these time the compressors' own passes).
void power_class(std::size_t r, int reps) {
  auto comm = commpact::ThreadComm::make_world(1)[0];
  commpact::tensor_layout layout;
  for (auto [n, m] : resnet18()) layout.push_back({static_cast<std::int64_t>(n), static_cast<std::int64_t>(m)});
  commpact::PowerCompressor<1> psgd{comm, layout, {.approximation_rank = static_cast<int>(r)}};
  auto g = gaussian(psgd.numel(), 1);
  const auto g0 = g;
  time_it("power_class", reps, [&] {
    std::copy(g0.begin(), g0.end(), g.begin());
    psgd.reduce(g);
  });
}

void dense_class(std::size_t n, int reps) {
  auto comm = commpact::ThreadComm::make_world(1)[0];
  commpact::Dense<commpact::ThreadComm> dense{comm};
  auto g = gaussian(n, 4);
  time_it("dense_class", reps, [&] { dense.reduce(g); });
}

void gtopk_class(std::size_t n, std::size_t k, int reps) {
  auto comm = commpact::ThreadComm::make_world(1)[0];
  commpact::gTopK<commpact::TreeComm<commpact::ThreadComm>> gt{comm, {.k = k}};
  // Each step reduces the previous step's output (g is overwritten by the sparse result):
  // the same passes over the same lengths as a fresh gradient (acc = residual + g stays
  // dense), without restoring g between steps, which is not part of the local phase.
  auto g = gaussian(n, 5);
  gt.reduce(g);
  time_it("gtopk_class", reps, [&] { gt.reduce(g); });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: driver topk|power|scale|gtopk|floor args... reps\n");
    return 2;
  }
  const std::string what = argv[1];
  auto num = [&](int i) { return static_cast<std::size_t>(std::strtod(argv[i], nullptr)); };
  if (what == "topk" && argc == 5) topk(num(2), num(3), static_cast<int>(num(4)));
  else if (what == "power" && argc == 4) power(num(2), static_cast<int>(num(3)));
  else if (what == "scale" && argc == 4) scale(num(2), static_cast<int>(num(3)));
  else if (what == "gtopk" && argc == 5) gtopk(num(2), num(3), static_cast<int>(num(4)));
  else if (what == "floor" && argc == 4) floor_pass(num(2), static_cast<int>(num(3)));
  else if (what == "power_class" && argc == 4) power_class(num(2), static_cast<int>(num(3)));
  else if (what == "dense_class" && argc == 4) dense_class(num(2), static_cast<int>(num(3)));
  else if (what == "gtopk_class" && argc == 5) gtopk_class(num(2), num(3), static_cast<int>(num(4)));
  else {
    std::fprintf(stderr, "driver: bad arguments\n");
    return 2;
  }
  return 0;
}
