// commpact::cuda_kernels::topk_abs against a brute-force reference (stable sort by (abs_key desc,
// index asc)) and against its host twin commpact::host::topk_abs, on the same random and
// tied inputs: indices and value bits must be identical. Exits 77 (CTest: skipped) when
// no GPU is present. CUDA code is always built as C++20 (the commpact::cuda target and
// scripts/device-check say so), which the host kernels need.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "commpact/kernels/cuda/topk.cuh"
#include "commpact/kernels/host/topk.hpp"

#include "cuda_test_common.cuh"

using commpact_test::failures;

namespace {

std::uint32_t bits_of(float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Brute force: all indices stably sorted by abs key descending, first k, sorted by index.
void reference(const std::vector<float>& x, std::size_t k, std::vector<std::int32_t>& idx, std::vector<float>& val) {
  std::vector<std::int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return (bits_of(x[a]) & 0x7fffffffu) > (bits_of(x[b]) & 0x7fffffffu);
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  idx = order;
  val.resize(k);
  for (std::size_t i = 0; i < k; ++i) val[i] = x[idx[i]];
}

std::size_t count_diff(const std::vector<std::int32_t>& ia, const std::vector<float>& va,
                       const std::vector<std::int32_t>& ib, const std::vector<float>& vb) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < ia.size(); ++i) bad += ia[i] != ib[i] || bits_of(va[i]) != bits_of(vb[i]);
  return bad;
}

template <class T>
struct device_buffer {
  T* p = nullptr;
  explicit device_buffer(std::size_t n) {
    commpact::cuda_kernels::detail::check(cudaMalloc(&p, (n == 0 ? 1 : n) * sizeof(T)), "cudaMalloc");
  }
  ~device_buffer() { cudaFree(p); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
};

void compare(const char* what, const std::vector<float>& x, std::size_t k, commpact::cuda_kernels::topk_workspace& dws) {
  const std::size_t n = x.size();
  std::vector<std::int32_t> ridx;
  std::vector<float> rval;
  reference(x, k, ridx, rval);

  device_buffer<float> dx(n), dval(k);
  device_buffer<std::int32_t> didx(k);
  commpact::cuda_kernels::detail::check(cudaMemcpy(dx.p, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  dws.run(dx.p, n, k, didx.p, dval.p);
  commpact::cuda_kernels::detail::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<std::int32_t> gidx(k);
  std::vector<float> gval(k);
  commpact::cuda_kernels::detail::check(cudaMemcpy(gidx.data(), didx.p, k * sizeof(std::int32_t), cudaMemcpyDeviceToHost),
                                "cudaMemcpy");
  commpact::cuda_kernels::detail::check(cudaMemcpy(gval.data(), dval.p, k * sizeof(float), cudaMemcpyDeviceToHost),
                                "cudaMemcpy");
  const std::size_t bad = count_diff(gidx, gval, ridx, rval);
  EXPECT(bad == 0, "%s: n=%zu k=%zu: %zu of %zu entries differ from the reference", what, n, k, bad, k);
  std::vector<std::int32_t> hidx(k);
  std::vector<float> hval(k);
  commpact::host::topk_workspace hws;
  commpact::host::topk_abs(x, k, hidx, hval, hws);
  const std::size_t bad_host = count_diff(gidx, gval, hidx, hval);
  EXPECT(bad_host == 0, "%s: n=%zu k=%zu: %zu of %zu entries differ from the host kernel", what, n, k, bad_host, k);
}

}  // namespace

int main() {
  return commpact_test::run_checks("all device top-k checks passed\n", "%d device top-k checks failed\n", [] {
    commpact::cuda_kernels::topk_workspace dws;
    for (std::size_t n : {std::size_t{1}, std::size_t{17}, std::size_t{1000}, std::size_t{100003}, std::size_t{1} << 20,
                          std::size_t{3000017}}) {
      for (std::uint64_t seed : {1u, 2u}) {
        std::mt19937_64 rng(seed);
        std::normal_distribution<float> d(0.0f, 1.0f);
        std::vector<float> x(n);
        for (auto& v : x) v = d(rng);
        std::vector<std::size_t> ks = {0, 1, n, std::uniform_int_distribution<std::size_t>(0, n)(rng)};
        if (n >= 1000) ks.insert(ks.end(), {n / 1000, n / 100});
        for (std::size_t k : ks) compare("gaussian", x, k, dws);
        // ties: quantised magnitudes with random signs, zeros, +-Inf and a NaN
        for (auto& v : x) v = std::round(d(rng) * 2.0f) * 0.5f;
        for (std::size_t i = 0; i < n; i += 101) x[i] = (i % 2) ? std::numeric_limits<float>::infinity() : -0.0f;
        x[n / 2] = std::numeric_limits<float>::quiet_NaN();
        for (std::size_t k : ks) compare("tied", x, k, dws);
      }
    }
    // Workspace reuse: the same sizes do not allocate again.
    std::vector<float> x(100000, 1.0f);
    compare("reuse", x, 1000, dws);
    const std::size_t allocs = dws.allocations();
    compare("reuse", x, 1000, dws);
    EXPECT(dws.allocations() == allocs, "workspace allocated again for the same sizes");
  });
}
