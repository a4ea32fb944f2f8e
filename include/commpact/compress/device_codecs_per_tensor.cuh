// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file device_codecs_per_tensor.cuh
//! device_codec<per_tensor<K>> (included by device_codecs.cuh): any K
//! with device kernels (device_codec<K>), tensor by tensor, inside the one
//! message of per_tensor.hpp (for each tensor a u32 length, then K's message of its
//! segment: byte-packed, so K's word-aligned frames are assembled by the kernels of
//! kernels/cuda/codecs_per_tensor.cuh).
//!
//! encode_frame: K's encode_frame of each tensor t (its own codec copy, codec.codec(t),
//! bound to its own stream) into temp block t of a grow-only workspace (a frame of
//! 48 + K::max_encoded_bytes(numel_t) bytes, rounded to words); per_tensor_scan adds up
//! the lengths K wrote (known on the device only for threshold_codec), per_tensor_pack
//! writes the message and frame_finish the header with the device's length.
//! decode_sum: per_tensor_walk checks every rank's framing as the host does, then for each
//! tensor per_tensor_unpack copies every rank's message of it into K's frame layout and
//! K's decode_sum adds them into the tensor's segment of the sum, in rank order (per
//! element the host's order: every element belongs to one tensor). A malformed message
//! sets status_wire and a NaN in sum[0], as every CUDA decoder does (segments decoded
//! before the failing one may have been added: the NaN makes the mean leave out untouched).
//! clear_delivered: K's, per tensor, on the tensor's segment of the residual and velocity.
//!
//! Frames byte for byte and sums bit for bit with the host (whatever K's kernels give:
//! bit-identical for every K of device_codecs.cuh). Costs: K's kernels run once per
//! tensor (launches grow with the layout: split_rows layouts of thousands of rows are
//! launch-bound), and the framing check walks each rank's lengths one after the other on
//! one thread (a dependent load per tensor). decode_sum is static (the CodecCompressor
//! contract), so its workspace (offsets, lengths, the temp blocks of one tensor for every
//! rank) is the executor's scratch slot "per_tensor_decode"; K's decode_sum has slots of
//! its own.
//!
//! Checked against its host twin by tests/cuda/test_cuda_codecs_more.cu (docs/cuda.md, "Status",
//! says where it has run).

#if !defined(__CUDACC__)
#error "commpact/compress/device_codecs_per_tensor.cuh needs nvcc: include it from a .cu file only."
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "../error.hpp"
#include "../kernels/cuda/codecs_per_tensor.cuh"
#include "../kernels/cuda/ops.cuh"
#include "../space/cuda.hpp"
#include "../wire/codec_frame.hpp"
#include "device_codecs.cuh"
#include "codecs/per_tensor.hpp"

namespace commpact {

//! per_tensor<K> on the CUDA space (see the file comment). One object per compressor: K's
//! kernels objects (one per tensor: top-k's workspaces and delivered indices), the temp
//! blocks and the scan's offsets, grown at the first step only.
template <class K>
struct device_codec<per_tensor<K>> {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;
  using inner = device_codec<K>;

  //! Words of tensor t's temp block: a frame of K's largest message.
  static std::size_t temp_words(const per_tensor<K>& c, std::size_t t) {
    return (frame::header_bytes + c.codec(t).max_encoded_bytes(c.numel(t)) + 3) / 4;
  }

  void encode_frame(const exec& e, per_tensor<K>& codec, span<const float> acc, span<float> block, frame::header h,
                    span<float> approx, span<const std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    const std::size_t n = acc.size(), T = codec.tensors();
    require(h.flags != 0 || n == codec.size(), "commpact::device_codec<per_tensor>: the vector has ", n,
            " values but the layout holds ", codec.size(), "; pass the layout of this gradient.");
    require(approx.empty() || approx.size() == n, "commpact::device_codec<per_tensor>: approx holds ",
            approx.size(), " values for ", n, "; pass n values or none.");
    if (h.flags != 0) {
      detail::cuda_finish_frame(e, block, h, 0, status);
      return;
    }
    const std::size_t cap = codec.max_encoded_bytes(n);
    require(block.size() * 4 >= frame::header_bytes + cap, "commpact::per_tensor: a block of ", block.size() * 4,
            " bytes cannot hold the ", cap, "-byte message behind the frame header.");
    grow(e, codec);
    const cudaStream_t s = e.stream();
    std::size_t most = 0;
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t o = codec.offset(t), m = codec.numel(t);
      frame::header ht;
      ht.n = static_cast<std::int64_t>(m);
      kern_[t].encode_frame(e, codec.codec(t), acc.subspan(o, m), tmp_.view().subspan(tb_off_[t], temp_words(codec, t)),
                            ht, approx.empty() ? approx : approx.subspan(o, m), status);
      most = std::max(most, 4 + codec.codec(t).max_encoded_bytes(m));
    }
    auto* tmp = reinterpret_cast<const std::uint32_t*>(cuda_access::ptr(tmp_.cview()));
    std::uint32_t* out_off = cuda_access::ptr(out_off_.view());
    kc::per_tensor_scan<<<1, kc::per_tensor_scan_threads, 0, s>>>(tmp, cuda_access::ptr(tb_off_d_.cview()), T, out_off);
    const dim3 grid(std::min<unsigned>(kc::grid_for(most), 1024u), static_cast<unsigned>(std::min<std::size_t>(T, 65535)));
    kc::per_tensor_pack<<<grid, kc::block_threads, 0, s>>>(
        tmp, cuda_access::ptr(tb_off_d_.cview()), T, out_off,
        reinterpret_cast<unsigned char*>(cuda_access::ptr(block) + kc::header_words));
    detail::cuda_codec_check(cudaGetLastError(), "per_tensor encode");
    detail::cuda_finish_frame(e, block, h, cap, status, out_off + T, 1);
  }

  //! sum = 0, then every rank's tensors decoded by K into their segments in rank order; a
  //! malformed block sets status_wire and NaN in sum[0].
  static void decode_sum(const exec& e, const per_tensor<K>& codec, span<const float> blocks, std::size_t block_floats,
                         span<float> sum, span<std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    require(status.size() >= 1, "commpact::device_codec<per_tensor>::decode_sum: pass the step status "
                                "(one word); the device reports a malformed block there.");
    require(block_floats >= kc::header_words, "commpact::device_codec<per_tensor>::decode_sum: blocks "
            "of ", block_floats, " floats cannot hold the frame header.");
    require(sum.size() == codec.size(), "commpact::device_codec<per_tensor>::decode_sum: the sum has ",
            sum.size(), " values but the layout holds ", codec.size(), ".");
    const std::size_t n = sum.size(), T = codec.tensors(), P = blocks.size() / block_floats;
    const cudaStream_t s = e.stream();
    std::size_t most = 0;
    for (std::size_t t = 0; t < T; ++t) most = std::max(most, temp_words(codec, t));
    const std::size_t table = (2 * P * T * 4 + 255) / 256 * 256;
    auto* base = static_cast<unsigned char*>(e.scratch("per_tensor_decode", table + 4 * P * most));
    auto* off = reinterpret_cast<std::uint32_t*>(base);
    auto* len = off + P * T;
    auto* tmp = reinterpret_cast<std::uint32_t*>(base + table);
    const auto* b = reinterpret_cast<const std::uint32_t*>(cuda_access::ptr(blocks));
    std::uint32_t* st = cuda_access::ptr(status);
    if (n) detail::cuda_codec_check(cudaMemsetAsync(cuda_access::ptr(sum), 0, n * sizeof(float), s), "decode_sum (zero)");
    kc::per_tensor_walk<<<kc::grid_for(P), kc::block_threads, 0, s>>>(b, block_floats, P, T, off, len, st);
    detail::cuda_codec_check(cudaGetLastError(), "per_tensor_walk");
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t m = codec.numel(t), tbf = temp_words(codec, t);
      kc::per_tensor_unpack<<<kc::grid_for(P * tbf), kc::block_threads, 0, s>>>(
          b, block_floats, P, T, t, off, len, codec.codec(t).max_encoded_bytes(m), tmp, tbf, st);
      detail::cuda_codec_check(cudaGetLastError(), "per_tensor_unpack");
      inner::decode_sum(e, codec.codec(t), cuda_access::wrap(static_cast<const float*>(static_cast<void*>(tmp)), P * tbf),
                        tbf, sum.subspan(codec.offset(t), m), status);
    }
    cuda_kernels::decision_launch(kc::poison_on_wire, s, cuda_access::ptr(sum), n, st);
    detail::cuda_codec_check(cudaGetLastError(), "per_tensor decode");
  }

  void clear_delivered(const exec& e, const per_tensor<K>& codec, span<float> residual, span<float> velocity) const {
    if (!kern_) return;  // nothing encoded yet
    for (std::size_t t = 0; t < codec.tensors(); ++t) {
      const std::size_t o = codec.offset(t), m = codec.numel(t);
      kern_[t].clear_delivered(e, codec.codec(t), residual.subspan(o, m),
                               velocity.empty() ? velocity : velocity.subspan(o, m));
    }
  }

  //! The temp blocks, the offsets and every tensor's K workspaces (allocation checks).
  template <class Out>
  void add_signature(Out& s) const {
    s.emplace_back(tmp_.data(), tmp_.capacity());
    s.emplace_back(tb_off_d_.data(), tb_off_d_.capacity());
    s.emplace_back(out_off_.data(), out_off_.capacity());
    if constexpr (requires(const inner& k) { k.add_signature(s); })
      for (std::size_t t = 0; t < tensors_; ++t) kern_[t].add_signature(s);
  }

 private:
  //! Sizes everything for `codec`'s layout (the first step; a per_tensor's layout is fixed).
  void grow(const exec& e, const per_tensor<K>& codec) {
    const std::size_t T = codec.tensors();
    if (kern_ && tensors_ == T) return;
    kern_ = std::make_unique<inner[]>(T);
    tensors_ = T;
    tb_off_.assign(T, 0);
    std::size_t words = 0;
    for (std::size_t t = 0; t < T; ++t) tb_off_[t] = words, words += temp_words(codec, t);
    tmp_.resize(words, e);
    tb_off_d_.resize(T, e);
    out_off_.resize(T + 1, e);
    ops<cuda_space>::from_host(e, std::span<const std::uint64_t>(tb_off_), tb_off_d_.view());
  }

  std::unique_ptr<inner[]> kern_;
  std::size_t tensors_ = 0;
  std::vector<std::uint64_t> tb_off_;  // word of temp block t (host copy, kept: the upload reads it)
  cuda_buffer<float> tmp_;
  cuda_buffer<std::uint64_t> tb_off_d_;
  cuda_buffer<std::uint32_t> out_off_;  // tensors + 1: the message's offsets, then its length
};

}  // namespace commpact
