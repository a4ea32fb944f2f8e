// SPDX-License-Identifier: Apache-2.0
// The PowerSGD step on the device for ResNet-18's 62 tensors (bench/resnet18_shapes.hpp,
// the list bench/bench_vs_torch uses; PyTorch's rule min_compression_rate = 2 decides
// which matrices travel as factors), at approximation ranks 1, 2 and 4:
//   commpact_ms      PowerCompressor<1, cuda_space> (rank set at run time) over
//                    NcclComm::single() with the default products = exact (the host's
//                    summation order, bit for bit): reduce() = the whole step (error
//                    feedback on, warm-start Q, the three allreduces of P, Q and the
//                    dense part, the status read and the commit; it synchronises once
//                    per step); exact_ms repeats it under the column's name;
//   blas_ms          the same step with power_options::products = power_products::blas
//                    (P = M Q, Q = M^T P and A = P Q^T as cuBLAS SGEMMs, kernels/cuda/blas.cuh);
//   cublas_local_ms  the floor of the products: for every compressed matrix the three
//                    SGEMMs a PowerSGD step must run (P = M Q, Q = M^T P, A = P Q^T),
//                    called on cuBLAS directly, back to back on one stream: no error
//                    feedback, orthonormalisation, allreduce or dense part.
// Each time is the median of CUDA-event timings on the step's stream after a warm-up;
// the input gradient is copied in before each timed step, outside the timing.
// bench/cuda/bench_power_torch.py times torch's powerSGD_hook on the same shapes;
// scripts/device-check prints the ratio.
//
// scripts/device-check runs it (docs/kernels.md's status table says where it has run).
// Output lines start with "row" and carry key=value fields. Exits 77 without a device.
// Without NCCL (built without COMMPACT_BENCH_NCCL) only the cuBLAS column is measured.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <vector>

#include "bench_common.cuh"
#include "commpact/compress/compressors/power_plan.hpp"
#include "../resnet18_shapes.hpp"

#if __has_include(<nccl.h>) && defined(COMMPACT_BENCH_NCCL)
#include "commpact/comm/nccl_comm.hpp"
#include "commpact/compress/compressors/power.hpp"
#include "commpact/kernels/cuda/ops.cuh"
#define HAVE_NCCL 1
#endif

namespace cp = commpact;

namespace {

constexpr int warm_steps = 5, timed_steps = 30;

using commpact_bench::check;

//! Median of CUDA-event timings of step() on stream s after warm_steps untimed steps;
//! before() runs ahead of each step, outside the timing.
template <class B, class F>
double median_ms(cudaStream_t s, B&& before, F&& step) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event"), check(cudaEventCreate(&b), "event");
  for (int i = 0; i < warm_steps; ++i) before(), step();
  check(cudaStreamSynchronize(s), "warm-up");
  std::vector<float> t;
  for (int i = 0; i < timed_steps; ++i) {
    before();
    check(cudaEventRecord(a, s), "record");
    step();
    check(cudaEventRecord(b, s), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a), cudaEventDestroy(b);
  return t[t.size() / 2];
}

std::vector<float> randn(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

float* upload(const std::vector<float>& h) {
  float* p = nullptr;
  check(cudaMalloc(&p, 4 * std::max<std::size_t>(h.size(), 1)), "malloc");
  check(cudaMemcpy(p, h.data(), 4 * h.size(), cudaMemcpyHostToDevice), "upload");
  return p;
}

void blas_ok(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "FAILED: %s: cuBLAS status %d\n", what, static_cast<int>(st));
    std::exit(1);
  }
}

//! The three SGEMMs of every compressed matrix of the plan, on cuBLAS directly (FP32,
//! CUBLAS_DEFAULT_MATH, as power_products::blas). Layouts as PowerCompressor's: M row-major
//! n x m (column-major M^T, ld m), P n x r and Q m x r column-major.
double cublas_local_ms(const cp::detail::power_plan& plan, cudaStream_t s) {
  float* M = upload(randn(plan.e, 1));
  float* Q = upload(randn(plan.q, 2));
  float *P = nullptr, *Q2 = nullptr, *A = nullptr;  // Q2: the new Q, so every step starts from the same Q
  std::size_t a_max = 1;
  for (const auto& en : plan.entries)
    if (en.compressed) a_max = std::max<std::size_t>(a_max, std::size_t(en.rows) * en.cols);
  check(cudaMalloc(&P, 4 * std::max<std::size_t>(plan.p, 1)), "malloc");
  check(cudaMalloc(&Q2, 4 * std::max<std::size_t>(plan.q, 1)), "malloc");
  check(cudaMalloc(&A, 4 * a_max), "malloc");
  cublasHandle_t h = nullptr;
  blas_ok(cublasCreate(&h), "cublasCreate");
  blas_ok(cublasSetStream(h, s), "cublasSetStream");
  const float one = 1.0f, zero = 0.0f;
  const double ms = median_ms(s, [] {}, [&] {
    for (const auto& en : plan.entries) {
      if (!en.compressed) continue;
      const int n = static_cast<int>(en.rows), m = static_cast<int>(en.cols), r = static_cast<int>(en.r);
      const float* Me = M + en.e_off;
      const float* Qe = Q + en.q_off;
      float *Pe = P + en.p_off, *Q2e = Q2 + en.q_off;
      blas_ok(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, n, r, m, &one, Me, m, Qe, m, &zero, Pe, n), "P = M Q");
      blas_ok(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, r, n, &one, Me, m, Pe, n, &zero, Q2e, m), "Q = M^T P");
      blas_ok(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, m, n, r, &one, Q2e, m, Pe, n, &zero, A, m), "A = P Q^T");
    }
  });
  cublasDestroy(h);
  cudaFree(M), cudaFree(Q), cudaFree(P), cudaFree(Q2), cudaFree(A);
  return ms;
}

}  // namespace

int main() {
  commpact_bench::require_device();
  cp::tensor_layout layout;
  for (auto [n, m] : commpact_bench::resnet18())
    layout.push_back({static_cast<std::int64_t>(n), static_cast<std::int64_t>(m)});
  bool ok = true;
  try {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
#ifdef HAVE_NCCL
    auto nc = cp::NcclComm::single();
    const auto ex = nc.exec();
    const std::vector<float> g_host = randn(cp::detail::plan_power(layout, 1, {}).total, 42);
    float* g0 = upload(g_host);
#endif
    for (int rank : {1, 2, 4}) {
      cp::power_options opt;  // min_compression_rate 2 (PyTorch's), warm start, start_step 0
      opt.approximation_rank = rank;
      const auto plan = cp::detail::plan_power(layout, rank, opt);
      std::size_t compressed = 0;
      for (const auto& en : plan.entries) compressed += en.compressed;
      const double t_blas = cublas_local_ms(plan, s);
#ifdef HAVE_NCCL
      // The whole step with products = exact (the default) and with products = blas.
      std::size_t numel = 0, floats = 0;
      const auto step_ms = [&](cp::power_products products) {
        auto o = opt;
        o.products = products;
        cp::PowerCompressor<1, cp::cuda_space> psgd{cp::any_space_communicator<cp::cuda_space>(nc), layout, o};
        cp::cuda_buffer<float> grad;
        grad.resize(psgd.numel());
        float* gp = cp::cuda_access::ptr(grad.view());
        const cudaStream_t st = ex.stream();
        std::int64_t skipped = 0;
        const double t = median_ms(
            st, [&] { check(cudaMemcpyAsync(gp, g0, 4 * psgd.numel(), cudaMemcpyDeviceToDevice, st), "copy"); },
            [&] { skipped += psgd.reduce(grad.view()) ? 0 : 1; });
        if (skipped)
          ok = false, std::printf("FAILED: rank %d products=%d: %lld steps skipped\n", rank, static_cast<int>(products),
                                  static_cast<long long>(skipped));
        numel = psgd.numel(), floats = psgd.floats_per_step();
        return t;
      };
      const double t_exact = step_ms(cp::power_products::exact);
      const double t_gemm = step_ms(cp::power_products::blas);
      std::printf("row power rank=%d tensors=%zu compressed=%zu numel=%zu floats_per_step=%zu commpact_ms=%.4f "
                  "exact_ms=%.4f blas_ms=%.4f cublas_local_ms=%.4f\n",
                  rank, layout.size(), compressed, numel, floats, t_exact, t_exact, t_gemm, t_blas);
#else
      std::printf("row power rank=%d tensors=%zu compressed=%zu numel=%lld cublas_local_ms=%.4f commpact skipped "
                  "(built without NCCL)\n",
                  rank, layout.size(), compressed, static_cast<long long>(plan.total), t_blas);
#endif
      std::fflush(stdout);
    }
#ifdef HAVE_NCCL
    cudaFree(g0);
#endif
    cudaStreamDestroy(s);
  } catch (const std::exception& ex) {
    std::printf("FAILED with exception: %s\n", ex.what());
    return 1;
  }
  return ok ? 0 : 1;
}
