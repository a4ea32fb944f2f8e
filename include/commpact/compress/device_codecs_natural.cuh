// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file device_codecs_natural.cuh
//! device_codec<natural_codec> (included by device_codecs.cuh): natural
//! compression on the device, its kernels in kernels/cuda/codecs_natural.cuh. Stateless:
//! each field is detail::natural_field (kernels/formulas/casts.hpp, on the float's bits, shared with the
//! host) of its value and random_stream::uniform(i) of the codec's stream (counter-based,
//! so the device draws element i's number without the ones before it).
//!
//! Frames byte for byte and sums bit for bit with the host. One difference in the host
//! codec that this file brought: +-Inf now saturates to code 254 (2^127) on both sides,
//! where std::frexp's unspecified exponent used to give the host code 127; CodecCompressor
//! never encodes a non-finite value (the frame is flagged instead), so no result changed.
//!
//! Checked against its host twin by tests/cuda/test_cuda_codecs_more.cu (docs/cuda.md, "Status",
//! says where it has run).

#if !defined(__CUDACC__)
#error "commpact/compress/device_codecs_natural.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cstddef>
#include <cstdint>

#include "../error.hpp"
#include "../kernels/cuda/codecs_natural.cuh"
#include "../space/cuda.hpp"
#include "../wire/codec_frame.hpp"
#include "device_codecs.cuh"
#include "codecs/casts.hpp"

namespace commpact {

//! natural_codec on the CUDA space (see the file comment).
template <>
struct device_codec<natural_codec> {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  static void encode_frame(const exec& e, const natural_codec& codec, span<const float> acc, span<float> block,
                           frame::header h, span<float> approx, span<const std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    const std::size_t n = acc.size(), len = h.flags == 0 ? codec.max_encoded_bytes(n) : 0;
    require(approx.empty() || approx.size() == n, "commpact::device_codec<natural_codec>: approx holds ",
            approx.size(), " values for ", n, "; pass n values or none.");
    if (h.flags == 0 && n) {
      require(block.size() * 4 >= frame::header_bytes + len, "commpact::natural_codec: a block of ", block.size() * 4,
              " bytes cannot hold the ", len, "-byte message behind the frame header.");
      kc::natural_pack<<<kc::grid_for(len), kc::block_threads, 0, e.stream()>>>(
          cuda_access::ptr(acc), n, codec.stream(), reinterpret_cast<unsigned char*>(cuda_access::ptr(block) + kc::header_words),
          approx.empty() ? nullptr : cuda_access::ptr(approx));
      detail::cuda_codec_check(cudaGetLastError(), "natural encode");
    }
    detail::cuda_finish_frame(e, block, h, len, status);
  }

  //! sum = 0, then every block's non-zero codes in rank order; a malformed block sets
  //! status_wire and NaN in sum[0].
  static void decode_sum(const exec& e, const natural_codec&, span<const float> blocks, std::size_t block_floats,
                         span<float> sum, span<std::uint32_t> status) {
    const std::size_t n = sum.size(), P = blocks.size() / block_floats;
    detail::cuda_dense_decode_sum(e, "natural_codec", blocks, block_floats, sum, status, P * (n + 1),
                                  cuda_kernels::codec::natural_validate, cuda_kernels::codec::natural_add);
  }

  static void clear_delivered(const exec&, const natural_codec&, span<float>, span<float>) {}
};

}  // namespace commpact
