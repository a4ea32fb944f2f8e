// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file device_codecs_qsgd.cuh
//! device_codec<qsgd_codec> (included by device_codecs.cuh): QSGD on the
//! device, its kernels in kernels/cuda/codecs_qsgd.cuh. Stateless: the bucket norms are
//! written into the payload, where the packing reads them. Each bucket's squares are
//! summed in kernels/fixed_sum.hpp's shape, as the host sums them: a block per bucket up
//! to d = 2048 values, a level per launch above (a single bucket, d = 0, spreads over the
//! whole grid).
//!
//! Checked against its host twin by tests/cuda/test_cuda_codec_leaves.cu,
//! tests/cuda/test_cuda_codecs.cu (docs/cuda.md, "Status", says where it has run).

#if !defined(__CUDACC__)
#error "commpact/compress/device_codecs_qsgd.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cstddef>
#include <cstdint>

#include "../error.hpp"
#include "../kernels/cuda/codecs_qsgd.cuh"
#include "../space/cuda.hpp"
#include "../wire/codec_frame.hpp"
#include "device_codecs.cuh"
#include "codecs/quantizers.hpp"

namespace commpact {

//! qsgd_codec on the CUDA space (see the file comment).
template <>
struct device_codec<qsgd_codec> {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  static cuda_kernels::codec::qsgd_shape shape(const qsgd_codec& c, std::size_t n) {
    return {n, c.bucket(n), c.buckets(n), c.levels(), c.field_bits()};
  }

  static void encode_frame(const exec& e, const qsgd_codec& codec, span<const float> acc, span<float> block,
                           frame::header h, span<float> approx, span<const std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    const std::size_t n = acc.size(), len = h.flags == 0 ? codec.max_encoded_bytes(n) : 0;
    require(approx.empty() || approx.size() == n, "commpact::device_codec<qsgd_codec>: approx holds ",
            approx.size(), " values for ", n, "; pass n values or none.");
    if (h.flags == 0 && n) {
      require(block.size() * 4 >= frame::header_bytes + len, "commpact::qsgd_codec: a block of ", block.size() * 4,
              " bytes cannot hold the ", len, "-byte message behind the frame header.");
      const auto q = shape(codec, n);
      const cudaStream_t s = e.stream();
      float* norms = cuda_access::ptr(block) + kc::header_words;
      // Buckets above 2048 values sum in levels through the executor's scratch.
      const std::size_t scratch = kc::qsgd_norms_scratch(q);
      detail::cuda_codec_check(kc::qsgd_norms(cuda_access::ptr(acc), q, norms,
                                              scratch ? static_cast<double*>(e.scratch("qsgd_norms", sizeof(double) * scratch))
                                                      : nullptr,
                                              s),
                               "qsgd norms");
      kc::qsgd_pack<<<kc::grid_for((n * q.w + 7) / 8), kc::block_threads, 0, s>>>(
          cuda_access::ptr(acc), norms, q, codec.stream(), reinterpret_cast<unsigned char*>(norms + q.nb),
          approx.empty() ? nullptr : cuda_access::ptr(approx));
      detail::cuda_codec_check(cudaGetLastError(), "qsgd encode");
    }
    detail::cuda_finish_frame(e, block, h, len, status);
  }

  static void decode_sum(const exec& e, const qsgd_codec& codec, span<const float> blocks, std::size_t block_floats,
                         span<float> sum, span<std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    require(status.size() >= 1, "commpact::device_codec<qsgd_codec>::decode_sum: pass the step status "
                                "(one word); the device reports a malformed block there.");
    require(block_floats >= kc::header_words, "commpact::device_codec<qsgd_codec>::decode_sum: blocks "
            "of ", block_floats, " floats cannot hold the frame header.");
    const std::size_t n = sum.size(), P = blocks.size() / block_floats;
    const auto q = shape(codec, n);
    const cudaStream_t s = e.stream();
    const auto* b = reinterpret_cast<const std::uint32_t*>(cuda_access::ptr(blocks));
    std::uint32_t* st = cuda_access::ptr(status);
    if (n) detail::cuda_codec_check(cudaMemsetAsync(cuda_access::ptr(sum), 0, n * sizeof(float), s), "decode_sum (zero)");
    kc::qsgd_validate<<<kc::grid_for(P * (q.nb + n + 1)), kc::block_threads, 0, s>>>(b, block_floats, P, q, st);
    if (n) kc::qsgd_add<<<kc::grid_for(n), kc::block_threads, 0, s>>>(b, block_floats, P, q, cuda_access::ptr(sum), st);
    cuda_kernels::decision_launch(kc::poison_on_wire, s, cuda_access::ptr(sum), n, st);
    detail::cuda_codec_check(cudaGetLastError(), "qsgd decode");
  }

  static void clear_delivered(const exec&, const qsgd_codec&, span<float>, span<float>) {}
};

}  // namespace commpact
