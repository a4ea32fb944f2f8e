// Device top-k (commpact::cuda_kernels::topk_abs, select.cuh's radix select) against a
// plain CUB sort-based top-k (stable descending DeviceRadixSort of all n keys, then a sort
// of the first k indices and a gather: the previous kernels/cuda/topk.cuh), at
// n = 1e6, 1e7, 1e8 and density 0.001 and 0.01; times are medians of CUDA-event timings.
// Columns: time, effective bandwidth (4n bytes read once / time), ratio to the
// read-once floor (4n bytes at the measured device-to-device copy rate, read + write
// counted), and whether both results are bit-identical. With NCCL (nccl.h found), also
// the whole gTop-k step on the device at n = 25M, density 0.001, one NCCL rank
// (gTopK<TreeComm<NcclComm>>::reduce: accumulate, select, scatter, residual; it
// synchronises once per step) against ncclAllReduce of the same tensor.
//
// NOT YET RUN ON A GPU at the time of writing; scripts/device-check runs it. Output lines
// start with "row" so that the script can pick them out. Exits 77 without a device.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include <cub/device/device_radix_sort.cuh>

#include "commpact/kernels/cuda/topk.cuh"

#if __has_include(<nccl.h>) && defined(COMMPACT_BENCH_NCCL)
#include "commpact/comm/nccl_comm.hpp"
#include "commpact/comm/tree_comm.hpp"
#include "commpact/compress/compressors/gtopk.hpp"
#include "commpact/kernels/cuda/ops.cuh"
#define HAVE_NCCL 1
#endif

namespace ck = commpact::cuda_kernels;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("FAILED: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <class F>
double median_ms(F&& f, int reps) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event"), check(cudaEventCreate(&b), "event");
  f();  // warm-up
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(a), "record");
    f();
    check(cudaEventRecord(b), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a), cudaEventDestroy(b);
  return t[t.size() / 2];
}

__global__ void abs_keys(const float* x, std::uint32_t n, std::uint32_t* keys, std::int32_t* idx) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    keys[i] = __float_as_uint(x[i]) & 0x7fffffffu;
    idx[i] = static_cast<std::int32_t>(i);
  }
}
__global__ void gather(const float* x, const std::int32_t* idx, std::uint32_t k, float* val) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < k; i += gridDim.x * blockDim.x) val[i] = x[idx[i]];
}

//! The sort-based baseline; scratch from *tmp (grown here, outside the timed region).
struct sort_topk {
  std::uint32_t *ka = nullptr, *kb = nullptr;
  std::int32_t *ia = nullptr, *ib = nullptr;
  void* tmp = nullptr;
  std::size_t tmp_bytes = 0;
  std::size_t n = 0;
  void setup(std::size_t nn, std::size_t k) {
    n = nn;
    check(cudaMalloc(&ka, 4 * n), "malloc"), check(cudaMalloc(&kb, 4 * n), "malloc");
    check(cudaMalloc(&ia, 4 * n), "malloc"), check(cudaMalloc(&ib, 4 * n), "malloc");
    std::size_t s1 = 0, s2 = 0;
    cub::DoubleBuffer<std::uint32_t> keys(ka, kb);
    cub::DoubleBuffer<std::int32_t> vals(ia, ib);
    check(cub::DeviceRadixSort::SortPairsDescending(nullptr, s1, keys, vals, static_cast<int>(n), 0, 31), "size");
    check(cub::DeviceRadixSort::SortKeys(nullptr, s2, ia, ib, static_cast<int>(k), 0, 31), "size");
    tmp_bytes = std::max(s1, s2);
    check(cudaMalloc(&tmp, tmp_bytes), "malloc");
  }
  void run(const float* x, std::size_t k, std::int32_t* idx, float* val) {
    abs_keys<<<1024, 256>>>(x, static_cast<std::uint32_t>(n), ka, ia);
    cub::DoubleBuffer<std::uint32_t> keys(ka, kb);
    cub::DoubleBuffer<std::int32_t> vals(ia, ib);
    std::size_t b = tmp_bytes;
    check(cub::DeviceRadixSort::SortPairsDescending(tmp, b, keys, vals, static_cast<int>(n), 0, 31), "sort");
    b = tmp_bytes;
    check(cub::DeviceRadixSort::SortKeys(tmp, b, vals.Current(), idx, static_cast<int>(k), 0, 31), "sort");
    gather<<<256, 256>>>(x, idx, static_cast<std::uint32_t>(k), val);
  }
  ~sort_topk() { cudaFree(ka), cudaFree(kb), cudaFree(ia), cudaFree(ib), cudaFree(tmp); }
};

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("device %s\n", prop.name);
  const std::size_t nmax = 100000000;
  float *x = nullptr, *y = nullptr;
  check(cudaMalloc(&x, 4 * nmax), "malloc"), check(cudaMalloc(&y, 4 * nmax), "malloc");
  {  // random normal data (not zeros: METHOD.md), generated on the host once
    std::vector<float> h(nmax);
    std::mt19937_64 rng(42);
    std::normal_distribution<float> d;
    for (auto& v : h) v = d(rng);
    check(cudaMemcpy(x, h.data(), 4 * nmax, cudaMemcpyHostToDevice), "upload");
  }
  const double copy_ms = median_ms([&] { cudaMemcpyAsync(y, x, 4 * nmax, cudaMemcpyDeviceToDevice); }, 10);
  const double rate = 2.0 * 4 * nmax / (copy_ms * 1e-3);  // bytes/s, read + write
  std::printf("row copy rate_GBps=%.1f\n", rate * 1e-9);
  ck::topk_workspace ws;
  for (std::size_t n : {std::size_t{1000000}, std::size_t{10000000}, nmax}) {
    for (double dens : {0.001, 0.01}) {
      const std::size_t k = static_cast<std::size_t>(n * dens);
      std::int32_t *i1, *i2;
      float *v1, *v2;
      check(cudaMalloc(&i1, 4 * k), "malloc"), check(cudaMalloc(&i2, 4 * k), "malloc");
      check(cudaMalloc(&v1, 4 * k), "malloc"), check(cudaMalloc(&v2, 4 * k), "malloc");
      ws.run(x, n, k, i1, v1);  // grows the workspace outside the timing
      const double t_cp = median_ms([&] { ws.run(x, n, k, i1, v1); }, 20);
      sort_topk st;
      st.setup(n, k);
      const double t_sort = median_ms([&] { st.run(x, k, i2, v2); }, 10);
      check(cudaDeviceSynchronize(), "sync");
      std::vector<std::int32_t> h1(k), h2(k);
      std::vector<float> w1(k), w2(k);
      cudaMemcpy(h1.data(), i1, 4 * k, cudaMemcpyDeviceToHost), cudaMemcpy(h2.data(), i2, 4 * k, cudaMemcpyDeviceToHost);
      cudaMemcpy(w1.data(), v1, 4 * k, cudaMemcpyDeviceToHost), cudaMemcpy(w2.data(), v2, 4 * k, cudaMemcpyDeviceToHost);
      const bool same = h1 == h2 && std::memcmp(w1.data(), w2.data(), 4 * k) == 0;
      const double floor_ms = 4.0 * n / rate * 1e3;
      std::printf("row topk n=%zu density=%g commpact_ms=%.4f cub_sort_ms=%.4f floor_ms=%.4f ratio_to_floor=%.2f "
                  "eff_GBps=%.1f speedup_vs_sort=%.2f identical=%s\n",
                  n, dens, t_cp, t_sort, floor_ms, t_cp / floor_ms, 4.0 * n / (t_cp * 1e-3) * 1e-9, t_sort / t_cp,
                  same ? "yes" : "NO");
      cudaFree(i1), cudaFree(i2), cudaFree(v1), cudaFree(v2);
      if (!same) return 1;
    }
  }
#ifdef HAVE_NCCL
  {
    namespace cp = commpact;
    const std::size_t n = 25000000;
    auto comm = cp::NcclComm::create(1, cp::NcclComm::unique_id(), 0, cp::cuda_space::make_exec(), true);  // blocking
    const auto e = comm.exec();
    cp::gTopK<cp::TreeComm<cp::NcclComm>> g{comm, {.density = 0.001}};
    cp::cuda_buffer<float> grad;
    grad.resize(n);
    auto step = [&] {
      cudaMemcpyAsync(cp::cuda_access::ptr(grad.view()), x, 4 * n, cudaMemcpyDeviceToDevice, e.stream());
      g.reduce(grad.view());
    };
    step();
    step();
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    std::vector<float> t;
    for (int r = 0; r < 20; ++r) {
      cudaEventRecord(a, e.stream());
      step();
      cudaEventRecord(b, e.stream());
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    const double copy_part = 4.0 * n * 2 / rate * 1e3;
    auto ar = [&] {
      ncclAllReduce(x, y, n, ncclFloat32, ncclSum, comm.handle(), e.stream());
    };
    ar();
    cudaStreamSynchronize(e.stream());
    std::vector<float> t2;
    for (int r = 0; r < 20; ++r) {
      cudaEventRecord(a, e.stream());
      ar();
      cudaEventRecord(b, e.stream());
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      t2.push_back(ms);
    }
    std::sort(t2.begin(), t2.end());
    std::printf("row gtopk_step n=%zu density=0.001 ranks=1 step_ms=%.4f (includes a %.4f ms input copy) "
                "dense_allreduce_ms=%.4f\n",
                n, t[t.size() / 2], copy_part, t2[t2.size() / 2]);
  }
#else
  std::printf("row gtopk_step skipped (built without NCCL)\n");
#endif
  cudaFree(x), cudaFree(y);
  return 0;
}
