// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file device_codecs_onebit.cuh
//! device_codec<onebit_codec> (included by device_codecs.cuh): 1-bit SGD
//! on the device, its kernels in kernels/cuda/codecs_onebit.cuh. Stateless: the scratch
//! of its sums (above 2048 values) is the executor's.
//!
//! Frames byte for byte and sums bit for bit with the host: both add the two sums in
//! double and the count in kernels/fixed_sum.hpp's shape (a block per node of 2048 values
//! on the device, the same tree on the host).
//!
//! Checked against its host twin by tests/cuda/test_cuda_codecs_more.cu (docs/cuda.md, "Status",
//! says where it has run).

#if !defined(__CUDACC__)
#error "commpact/compress/device_codecs_onebit.cuh needs nvcc: include it from a .cu file only."
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "../error.hpp"
#include "../kernels/cuda/codecs_onebit.cuh"
#include "../kernels/cuda/ops.cuh"
#include "../space/cuda.hpp"
#include "../wire/codec_frame.hpp"
#include "device_codecs.cuh"
#include "codecs/quantizers.hpp"

namespace commpact {

//! onebit_codec on the CUDA space (see the file comment).
template <>
struct device_codec<onebit_codec> {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  static void encode_frame(const exec& e, const onebit_codec& codec, span<const float> acc, span<float> block,
                           frame::header h, span<float> approx, span<const std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    const std::size_t n = acc.size(), len = h.flags == 0 ? codec.max_encoded_bytes(n) : 0;
    require(approx.empty() || approx.size() == n, "commpact::device_codec<onebit_codec>: approx holds ",
            approx.size(), " values for ", n, "; pass n values or none.");
    if (h.flags == 0) {
      require(block.size() * 4 >= frame::header_bytes + len, "commpact::onebit_codec: a block of ", block.size() * 4,
              " bytes cannot hold the ", len, "-byte message behind the frame header.");
      const cudaStream_t s = e.stream();
      // The levels of the sums above 2048 values in the executor's scratch.
      const std::size_t scratch = kc::onebit_scratch(n);
      float* payload = cuda_access::ptr(block) + kc::header_words;  // the two means, then the bits
      detail::cuda_codec_check(
          kc::onebit_means(cuda_access::ptr(acc), n, payload,
                           scratch ? static_cast<detail::onebit_sums*>(e.scratch("onebit_means", sizeof(detail::onebit_sums) * scratch))
                                   : nullptr,
                           s),
          "onebit means");
      const std::size_t nb = (n + 7) / 8;
      if (nb)
        kc::onebit_bits<<<kc::grid_for(nb), kc::block_threads, 0, s>>>(
            cuda_access::ptr(acc), n, reinterpret_cast<unsigned char*>(payload + 2), nb,
            approx.empty() ? nullptr : cuda_access::ptr(approx), payload);
      detail::cuda_codec_check(cudaGetLastError(), "onebit encode");
    }
    detail::cuda_finish_frame(e, block, h, len, status);
  }

  //! sum = the blocks' values added in rank order; a malformed block sets status_wire and
  //! NaN in sum[0].
  static void decode_sum(const exec& e, const onebit_codec&, span<const float> blocks, std::size_t block_floats,
                         span<float> sum, span<std::uint32_t> status) {
    const std::size_t n = sum.size(), P = blocks.size() / block_floats;
    detail::cuda_dense_decode_sum(e, "onebit_codec", blocks, block_floats, sum, status, P,
                                  cuda_kernels::codec::onebit_validate, cuda_kernels::codec::onebit_add);
  }

  static void clear_delivered(const exec&, const onebit_codec&, span<float>, span<float>) {}
};

}  // namespace commpact
