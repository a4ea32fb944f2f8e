// The CUDA kernels live in namespace commpact::cuda_kernels, so `cuda::std`
// names inside namespace commpact resolve to libcu++ (a commpact::cuda namespace used to
// shadow ::cuda and break this file's compilation). The v3 space headers and the
// space-generic compressors also compile under nvcc (C++20). On a GPU, a kernel written
// inside namespace commpact over cuda::std::span runs; without one, the test exits 77.
//
// It is its own program under COMMPACT_CUDA_TESTS_UNITY too: there each test sits in a
// namespace of its own, and this file's point is what names mean at global scope.
// commpact-cuda-standalone

#include <cuda/std/span>
#include <cuda_runtime.h>

#include "commpact/compress/compressors/dense.hpp"
#include "commpact/compress/compressors/gtopk.hpp"
#include "commpact/kernels/cuda/topk.cuh"
#include "commpact/kernels/deferred/ops.hpp"
#include "commpact/kernels/mean.hpp"
#include "commpact/space/cuda.hpp"
// The CUDA umbrella compiles next to the headers above; it brings NcclComm's header where
// nccl.h is found, which this test uses only in sizeof (nothing of NCCL is linked).
#include "commpact/cuda.cuh"

#include "cuda_test_common.cuh"

// What the umbrella promises a .cu file: the device rows, CudaStagedComm, NcclComm.
static_assert(commpact::diagnose_space<commpact::cuda_space>());
static_assert(sizeof(commpact::ops<commpact::cuda_space>) > 0);
static_assert(sizeof(commpact::CudaStagedComm<commpact::ThreadComm>) > 0);
#if __has_include(<nccl.h>)
static_assert(sizeof(commpact::NcclComm) > 0);
#endif

namespace commpact {
namespace test_names {
// Inside namespace commpact, `cuda::std::span` must name libcu++'s span.
__global__ void mean_kernel(cuda::std::span<float> v, int P) {
  const auto i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < v.size()) v[i] = mean_of(v[i], P);
}
}  // namespace test_names
}  // namespace commpact

int main() {
  if (!commpact_test::have_cuda_device()) return commpact_test::exit_skipped;
  constexpr int n = 1000, P = 3;
  float* d = nullptr;
  cudaMalloc(&d, n * sizeof(float));
  float h[n];
  for (int i = 0; i < n; ++i) h[i] = static_cast<float>(i) * 0.7f - 11.0f;
  cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
  commpact::test_names::mean_kernel<<<(n + 255) / 256, 256>>>(cuda::std::span<float>(d, n), P);
  float out[n];
  cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost);
  cudaFree(d);
  for (int i = 0; i < n; ++i)  // the device's mean is the host's, bit for bit
    EXPECT(out[i] == commpact::mean_of(h[i], P), "index %d: %a vs %a", i, out[i], commpact::mean_of(h[i], P));
  std::printf("%d failures\n", commpact_test::failures);
  return commpact_test::failures ? 1 : 0;
}
