// SPDX-License-Identifier: Apache-2.0
// Device top-k (commpact::cuda_kernels::topk_abs: select.cuh's sampled path, which every
// size here takes, its keyed variant, topk_method::sampled_keyed, as keyed_ms, and its
// radix path, topk_method::radix, as radix_ms, all timed in the same run) against two
// sort-based top-k baselines at n = 1e6, 1e7, 1e8 and density 0.001 and 0.01:
//   thrust   what a user writes with Thrust: keys = |g| (thrust::transform), indices =
//            0..n-1, thrust::sort_by_key(keys, indices, thrust::greater<float>()) (Thrust
//            dispatches arithmetic keys with greater<> to a stable radix sort, so equal
//            |g| keep the smaller index first: commpact's order), then thrust::sort of
//            the first k indices (index order, comparable bit for bit) and thrust::gather
//            of their values; temporary storage from a caching allocator (allocated in the
//            warm-up, outside the timing);
//   cub      a plain CUB sort-based top-k (stable descending DeviceRadixSort of all n
//            keys, then a sort of the first k indices and a gather: the previous
//            kernels/cuda/topk.cuh).
// Times are medians of CUDA-event timings after a warm-up. Columns: time, effective
// bandwidth (4n bytes read once / time), ratio to the read-once floor (4n bytes at the
// measured device-to-device copy rate, read + write counted), and whether the baselines'
// results are bit-identical to ours (indices and values). With NCCL (nccl.h found), also
// the whole gTop-k step on the device at n = 25M, density 0.001 and 0.01, one NCCL rank
// (gTopK<TreeComm<NcclComm>>::reduce: accumulate, select, scatter, residual; it
// synchronises once per step) against ncclAllReduce of the same tensor.
//
// scripts/device-check runs it (results: docs/cuda.md). Output lines
// start with "row" and carry key=value fields so that the script can pick them out and
// compute its ratios. Exits 77 without a device; 1 (after printing every row) when a
// baseline's result differs from ours.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>
#include <cub/device/device_radix_sort.cuh>
#include <thrust/copy.h>
#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/gather.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

#include "bench_common.cuh"
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

using commpact_bench::check;

// Median of reps CUDA-event timings of f() on stream s, after one warm-up call.
template <class F>
double median_ms(F&& f, int reps, cudaStream_t s = 0) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event"), check(cudaEventCreate(&b), "event");
  f();  // warm-up
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(a, s), "record");
    f();
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

struct abs_op {
  __host__ __device__ float operator()(float v) const { return fabsf(v); }
};

//! Thrust's temporary storage: blocks kept for reuse (Thrust's custom_temporary_allocation
//! example), so that the timed calls measure the sort, not cudaMalloc.
struct caching_allocator {
  using value_type = char;
  struct block {
    char* p;
    std::ptrdiff_t bytes;
    bool busy;
  };
  std::vector<block> blocks;
  char* allocate(std::ptrdiff_t bytes) {
    for (auto& b : blocks)
      if (!b.busy && b.bytes >= bytes) return b.busy = true, b.p;
    char* p = nullptr;
    check(cudaMalloc(&p, static_cast<std::size_t>(bytes)), "malloc (thrust)");
    blocks.push_back({p, bytes, true});
    return p;
  }
  void deallocate(char* p, std::size_t) {
    for (auto& b : blocks)
      if (b.p == p) b.busy = false;
  }
  ~caching_allocator() {
    for (auto& b : blocks) cudaFree(b.p);
  }
};

//! The Thrust baseline: sort |g| descending with the indices, keep the first k in index order.
struct thrust_topk {
  float* keys = nullptr;
  std::int32_t* idx = nullptr;
  std::size_t n = 0;
  caching_allocator alloc;
  void setup(std::size_t nn) {
    n = nn;
    check(cudaMalloc(&keys, 4 * n), "malloc"), check(cudaMalloc(&idx, 4 * n), "malloc");
  }
  void run(const float* x, std::size_t k, std::int32_t* out_idx, float* val) {
    const auto pol = thrust::cuda::par(alloc);
    thrust::transform(pol, x, x + n, keys, abs_op{});
    thrust::sequence(pol, idx, idx + n);
    thrust::sort_by_key(pol, keys, keys + n, idx, thrust::greater<float>());
    thrust::copy(pol, idx, idx + k, out_idx);
    thrust::sort(pol, out_idx, out_idx + k);
    thrust::gather(pol, out_idx, out_idx + k, x, val);
  }
  ~thrust_topk() { cudaFree(keys), cudaFree(idx); }
};

}  // namespace

int main() {
  commpact_bench::require_device();
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
  ck::topk_workspace ws, ws_radix, ws_keyed;  // automatic (the sampled path here), radix, keyed
  ws_radix.set_method(ck::topk_method::radix);
  ws_keyed.set_method(ck::topk_method::sampled_keyed);
  bool all_same = true;
  for (std::size_t n : {std::size_t{1000000}, std::size_t{10000000}, nmax}) {
    for (double dens : {0.001, 0.01}) {
      const std::size_t k = static_cast<std::size_t>(n * dens);
      std::int32_t *i1, *i2, *i3;
      float *v1, *v2, *v3;
      check(cudaMalloc(&i1, 4 * k), "malloc"), check(cudaMalloc(&i2, 4 * k), "malloc");
      check(cudaMalloc(&i3, 4 * k), "malloc"), check(cudaMalloc(&v3, 4 * k), "malloc");
      check(cudaMalloc(&v1, 4 * k), "malloc"), check(cudaMalloc(&v2, 4 * k), "malloc");
      // One method's median time; its first run grows the workspace outside the timing.
      auto time_run = [&](ck::topk_workspace& w, std::int32_t* di, float* dv) {
        w.run(x, n, k, di, dv);
        return median_ms([&] { w.run(x, n, k, di, dv); }, 20);
      };
      std::int32_t *i4, *i5;
      float *v4, *v5;
      check(cudaMalloc(&i4, 4 * k), "malloc"), check(cudaMalloc(&v4, 4 * k), "malloc");
      check(cudaMalloc(&i5, 4 * k), "malloc"), check(cudaMalloc(&v5, 4 * k), "malloc");
      const double t_cp = time_run(ws, i1, v1), t_radix = time_run(ws_radix, i4, v4);
      const double t_keyed = time_run(ws_keyed, i5, v5);
      double t_sort = 0, t_thrust = 0;
      {
        sort_topk st;
        st.setup(n, k);
        t_sort = median_ms([&] { st.run(x, k, i2, v2); }, 10);
        check(cudaDeviceSynchronize(), "sync");
      }
      {
        thrust_topk tt;
        tt.setup(n);
        t_thrust = median_ms([&] { tt.run(x, k, i3, v3); }, 10);  // the warm-up fills the allocator's cache
        check(cudaDeviceSynchronize(), "sync");
      }
      // Bit identity of indices and values against ours.
      auto same_as_ours = [&](const std::int32_t* di, const float* dv) {
        std::vector<std::int32_t> ha(k), hb(k);
        std::vector<float> wa(k), wb(k);
        check(cudaMemcpy(ha.data(), i1, 4 * k, cudaMemcpyDeviceToHost), "download");
        check(cudaMemcpy(hb.data(), di, 4 * k, cudaMemcpyDeviceToHost), "download");
        check(cudaMemcpy(wa.data(), v1, 4 * k, cudaMemcpyDeviceToHost), "download");
        check(cudaMemcpy(wb.data(), dv, 4 * k, cudaMemcpyDeviceToHost), "download");
        return ha == hb && std::memcmp(wa.data(), wb.data(), 4 * k) == 0;
      };
      const bool same_cub = same_as_ours(i2, v2), same_thrust = same_as_ours(i3, v3), same_radix = same_as_ours(i4, v4);
      const bool same_keyed = same_as_ours(i5, v5);
      all_same = all_same && same_cub && same_thrust && same_radix && same_keyed;
      const double floor_ms = 4.0 * n / rate * 1e3;
      std::printf("row topk n=%zu density=%g path=%s commpact_ms=%.4f radix_ms=%.4f keyed_ms=%.4f "
                  "thrust_sort_ms=%.4f cub_sort_ms=%.4f floor_ms=%.4f ratio_to_floor=%.2f keyed_ratio_to_floor=%.2f "
                  "eff_GBps=%.1f speedup_vs_thrust=%.2f speedup_vs_sort=%.2f identical=%s identical_thrust=%s "
                  "identical_radix=%s identical_keyed=%s\n",
                  n, dens, ck::detail::plan_for(n, k, ck::topk_method::automatic).use ? "sampled" : "radix", t_cp,
                  t_radix, t_keyed, t_thrust, t_sort, floor_ms, t_cp / floor_ms, t_keyed / floor_ms,
                  4.0 * n / (t_cp * 1e-3) * 1e-9, t_thrust / t_cp, t_sort / t_cp, same_cub ? "yes" : "NO",
                  same_thrust ? "yes" : "NO", same_radix ? "yes" : "NO", same_keyed ? "yes" : "NO");
      cudaFree(i1), cudaFree(i2), cudaFree(i3), cudaFree(v1), cudaFree(v2), cudaFree(v3);
      cudaFree(i4), cudaFree(v4), cudaFree(i5), cudaFree(v5);
    }
  }
#ifdef HAVE_NCCL
  {
    namespace cp = commpact;
    const std::size_t n = 25000000;
    auto comm = cp::NcclComm::create(1, cp::NcclComm::unique_id(), 0, cp::cuda_space::make_exec(), true);  // blocking
    const auto e = comm.exec();
    cp::cuda_buffer<float> grad;
    grad.resize(n);
    // density 0.001 (the kernel target) and 0.01 (the DDP hook's default: its compression
    // at 25M parameters, docs/pytorch.md)
    std::vector<std::pair<double, double>> steps;  // density, median step ms
    for (double dens : {0.001, 0.01}) {
      cp::gTopK<cp::TreeComm<cp::NcclComm>> g{comm, {.density = dens}};
      auto step = [&] {
        cudaMemcpyAsync(cp::cuda_access::ptr(grad.view()), x, 4 * n, cudaMemcpyDeviceToDevice, e.stream());
        g.reduce(grad.view());
      };
      step();  // the first step sizes the workspaces; median_ms warms up once more
      steps.emplace_back(dens, median_ms(step, 20, e.stream()));
    }
    const double copy_part = 4.0 * n * 2 / rate * 1e3;
    auto ar = [&] {
      ncclAllReduce(x, y, n, ncclFloat32, ncclSum, comm.handle(), e.stream());
    };
    const double ar_ms = median_ms(ar, 20, e.stream());
    for (const auto& [dens, ms] : steps)
      std::printf("row gtopk_step n=%zu density=%g ranks=1 step_ms=%.4f input_copy_ms=%.4f dense_allreduce_ms=%.4f\n",
                  n, dens, ms, copy_part, ar_ms);
  }
#else
  std::printf("row gtopk_step skipped (built without NCCL)\n");
#endif
  cudaFree(x), cudaFree(y);
  if (!all_same) std::printf("FAILED: a baseline's top-k differs from commpact's (identical=NO above)\n");
  return all_same ? 0 : 1;
}
