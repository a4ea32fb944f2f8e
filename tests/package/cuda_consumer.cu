// A user's .cu file: commpact's CUDA headers compiled with no nvcc flag of commpact's
// (ctest cuda_headers_plain_nvcc: -std=c++20 and the include path only, nvcc's warnings
// as errors). The library's own tests build with --extended-lambda for their lambdas;
// the headers must need neither it nor --expt-relaxed-constexpr, and must not warn.
#include <commpact/cuda.cuh>
