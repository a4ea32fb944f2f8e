// commpact::cuda_kernels PowerSGD kernels (kernels/cuda/power.cuh) against a host reference on
// the same random inputs: one full local step per matrix (M += e, P = M Q,
// orthonormalise P, Q = M^T P, e = M - P Q^T, M = P Q^T) for several shapes and ranks,
// and the orthonormalisation on degenerate input (zero matrix, duplicate columns).
// The host reference is the algorithm of commpact::host::orthonormalize_columns written
// out here with plain loops, and the host kernel itself is compared too (CUDA code is
// always built as C++20: the commpact::cuda target and scripts/device-check say so).
// Exits 77 (CTest: skipped) when no GPU is present.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "commpact/kernels/cuda/power.cuh"
#include "commpact/kernels/host/orthogonalize.hpp"

#include "cuda_test_common.cuh"

using commpact_test::failures;

namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

std::vector<float> randn(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Host reference: modified Gram-Schmidt twice in double (the host kernel's algorithm).
void ref_orthonormalize(std::vector<float>& a, int rows, int cols) {
  for (int j = 0; j < cols; ++j) {
    float* cj = a.data() + static_cast<std::size_t>(j) * rows;
    for (int pass = 0; pass < 2; ++pass)
      for (int k = 0; k < j; ++k) {
        const float* ck = a.data() + static_cast<std::size_t>(k) * rows;
        double dot = 0;
        for (int i = 0; i < rows; ++i) dot += double(ck[i]) * double(cj[i]);
        if (dot == 0.0) continue;
        for (int i = 0; i < rows; ++i) cj[i] = float(double(cj[i]) - dot * double(ck[i]));
      }
    double n2 = 0;
    for (int i = 0; i < rows; ++i) n2 += double(cj[i]) * double(cj[i]);
    if (n2 > 0) {
      const double inv = 1.0 / std::sqrt(n2);
      for (int i = 0; i < rows; ++i) cj[i] = float(double(cj[i]) * inv);
    } else {
      for (int i = 0; i < rows; ++i) cj[i] = 0.0f;
    }
  }
}

double rel(const std::vector<float>& a, const std::vector<float>& b, double scale_sq = -1) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  if (scale_sq >= 0) den = scale_sq;
  return std::sqrt(num / (den > 0 ? den : 1));
}

struct dev_buf {
  float* p = nullptr;
  std::size_t n = 0;
  explicit dev_buf(const std::vector<float>& h) : n(h.size()) {
    ok(cudaMalloc(&p, n * sizeof(float)), "cudaMalloc");
    ok(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "H2D");
  }
  std::vector<float> get() const {
    std::vector<float> h(n);
    ok(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), "D2H");
    return h;
  }
  ~dev_buf() { cudaFree(p); }
};

void check_step(int n, int m, int r, std::uint64_t seed) {
  auto M = randn(std::size_t(n) * m, seed), e = randn(std::size_t(n) * m, seed + 1), Q = randn(std::size_t(m) * r, seed + 2);
  for (auto& x : e) x *= 0.1f;
  // Host reference.
  std::vector<float> Mh = M;
  for (std::size_t i = 0; i < Mh.size(); ++i) Mh[i] += e[i];
  std::vector<float> P(std::size_t(n) * r), Q2(std::size_t(m) * r), A(std::size_t(n) * m), eh(std::size_t(n) * m);
  for (int c = 0; c < r; ++c)
    for (int i = 0; i < n; ++i) {
      double s = 0;
      for (int j = 0; j < m; ++j) s += double(Mh[std::size_t(i) * m + j]) * Q[std::size_t(c) * m + j];
      P[std::size_t(c) * n + i] = float(s);
    }
  ref_orthonormalize(P, n, r);
  for (int c = 0; c < r; ++c)
    for (int j = 0; j < m; ++j) {
      double s = 0;
      for (int i = 0; i < n; ++i) s += double(Mh[std::size_t(i) * m + j]) * P[std::size_t(c) * n + i];
      Q2[std::size_t(c) * m + j] = float(s);
    }
  double msq = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) {
      double s = 0;
      for (int c = 0; c < r; ++c) s += double(P[std::size_t(c) * n + i]) * Q2[std::size_t(c) * m + j];
      A[std::size_t(i) * m + j] = float(s);
      eh[std::size_t(i) * m + j] = Mh[std::size_t(i) * m + j] - float(s);
      msq += double(Mh[std::size_t(i) * m + j]) * Mh[std::size_t(i) * m + j];
    }
  // Device.
  dev_buf dM(M), de(e), dQ(Q), dP(std::vector<float>(std::size_t(n) * r, 0.f));
  commpact::cuda_kernels::power_handle h;
  commpact::cuda_kernels::power_compensate_project(h, dM.p, de.p, dQ.p, dP.p, n, m, r);
  commpact::cuda_kernels::orthonormalize_columns(h, dP.p, n, r);
  commpact::cuda_kernels::power_project_back(h, dM.p, dP.p, dQ.p, n, m, r);
  commpact::cuda_kernels::power_decompress(h, dM.p, de.p, dP.p, dQ.p, n, m, r);
  ok(cudaDeviceSynchronize(), "sync");
  const auto Pd = dP.get(), Qd = dQ.get(), Ad = dM.get(), ed = de.get();
  EXPECT(rel(Pd, P) < 1e-4, "n=%d m=%d r=%d: P differs from the host by %g", n, m, r, rel(Pd, P));
  EXPECT(rel(Qd, Q2) < 1e-4, "n=%d m=%d r=%d: Q differs by %g", n, m, r, rel(Qd, Q2));
  EXPECT(rel(Ad, A) < 1e-4, "n=%d m=%d r=%d: P Q^T differs by %g", n, m, r, rel(Ad, A));
  EXPECT(rel(ed, eh, msq) < 1e-4, "n=%d m=%d r=%d: residual differs by %g of |M|", n, m, r, rel(ed, eh, msq));
  // Conservation on the device itself: e + A == M + e_old to float rounding of e.
  double worst = 0;
  for (std::size_t i = 0; i < Ad.size(); ++i) {
    const float want = Mh[i] - Ad[i];
    worst = std::max(worst, double(std::fabs(want - ed[i])));
  }
  EXPECT(worst == 0.0, "n=%d m=%d r=%d: e != M - A on the device (max %g)", n, m, r, worst);
  auto Ph = P;  // the host kernel on the same input as the reference
  std::vector<float> P0(std::size_t(n) * r);
  for (int c = 0; c < r; ++c)
    for (int i = 0; i < n; ++i) {
      double s = 0;
      for (int j = 0; j < m; ++j) s += double(Mh[std::size_t(i) * m + j]) * Q[std::size_t(c) * m + j];
      P0[std::size_t(c) * n + i] = float(s);
    }
  commpact::host::orthonormalize_columns(P0.data(), n, r, n);
  EXPECT(P0 == Ph, "n=%d m=%d r=%d: the host kernel differs from the written-out reference", n, m, r);
}

void check_degenerate() {
  // Zero matrix: zero columns, no NaN, kept == 0.
  std::vector<float> z(50 * 3, 0.0f);
  dev_buf dz(z);
  int* dk = nullptr;
  ok(cudaMalloc(&dk, sizeof(int)), "cudaMalloc");
  commpact::cuda_kernels::power_handle h;
  commpact::cuda_kernels::orthonormalize_columns(h, dz.p, 50, 3, dk);
  int kept = -1;
  ok(cudaMemcpy(&kept, dk, sizeof(int), cudaMemcpyDeviceToHost), "D2H");
  const auto zr = dz.get();
  bool all_zero = true;
  for (float x : zr) all_zero = all_zero && x == 0.0f;
  EXPECT(all_zero && kept == 0, "zero matrix: kept %d, all zero %d", kept, int(all_zero));
  // Column 1 = 2 x column 0: becomes zero; column 2 stays a unit vector.
  std::vector<float> a(4 * 3, 0.0f);
  a[0] = 1;
  a[4] = 2;
  a[9] = 3;
  dev_buf da(a);
  commpact::cuda_kernels::orthonormalize_columns(h, da.p, 4, 3, dk);
  ok(cudaMemcpy(&kept, dk, sizeof(int), cudaMemcpyDeviceToHost), "D2H");
  const std::vector<float> want = {1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0};
  EXPECT(da.get() == want && kept == 2, "dependent columns: kept %d", kept);
  cudaFree(dk);
}

}  // namespace

int main() {
  if (!commpact_test::have_cuda_device()) return commpact_test::exit_skipped;
  const int shapes[][3] = {{64, 147, 1}, {128, 576, 4}, {33, 17, 2}, {5, 5, 5}, {512, 256, 8}, {1000, 512, 2}};
  std::uint64_t seed = 1;
  for (const auto& s : shapes) check_step(s[0], s[1], s[2], seed += 10);
  check_degenerate();
  try {
    commpact::cuda_kernels::power_handle h;
    commpact::cuda_kernels::power_project_back(h, nullptr, nullptr, nullptr, 4, 3, 4);  // r > min(n, m)
    EXPECT(false, "r > min(n, m) did not raise");
  } catch (const commpact::invalid_argument&) {
  }
  if (failures) {
    std::printf("%d failure(s)\n", failures);
    return 1;
  }
  std::printf("all PowerSGD device checks passed\n");
  return 0;
}
