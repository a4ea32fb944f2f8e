// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file device_codecs.cuh
//! device_codec<Codec> (kernels/device_codec.hpp) for every codec of compress/codecs/:
//! the kernels behind ops<cuda_space>'s codec rows (codec_encode_frame, codec_decode_sum,
//! codec_clear_delivered), so that CodecCompressor and TopK run over a communicator of
//! the CUDA space (NcclComm). Only nvcc compiles this file; include it from a .cu file
//! after (or instead of) codec_compressor.hpp.
//!
//! Checked against the host codecs by tests/cuda/test_cuda_codec_leaves*.cu and
//! test_cuda_codecs*.cu (docs/cuda.md, "Status", says where they have run).
//!
//! | codec | encode_frame | decode_sum | clear_delivered | equal to the host |
//! |---|---|---|---|---|
//! | topk_codec | ops<cuda_space>::topk_abs's radix select written straight into the payload, then frame_finish | topk_validate, topk_add per rank in rank order, poison_on_wire | zero_delivered at the payload's indices | frames byte for byte; sum, mean and residual bits |
//! | threshold_codec | device_codecs_threshold.cuh: mask, topk_abs of the cap, compaction (count on the device), frame_finish with the device's length | as topk_codec (cap = capacity(n)) | the delivered count's indices | frames byte for byte; sum, mean and residual bits |
//! | fp16_codec, bf16_codec | cast16_encode (detail::to_half / to_bf16), frame_finish | cast16_validate, cast16_add, poison_on_wire | nothing (approx) | frames byte for byte; sum bits |
//! | terngrad_codec | terngrad_absmax (atomicMax on the bits), terngrad_encode (random_stream replayed), frame_finish | terngrad_validate, terngrad_add, poison_on_wire | nothing (approx) | frames byte for byte; sum bits |
//! | qsgd_codec | device_codecs_qsgd.cuh: qsgd_norms (each bucket's sum of squares in kernels/fixed_sum.hpp's shape, a block per node), qsgd_pack (random_stream replayed), frame_finish | qsgd_validate, qsgd_add, poison_on_wire | nothing (approx) | frames byte for byte; sum bits |
//! | sign_codec | sign_l1 (||v||_1 in double in kernels/fixed_sum.hpp's shape, as the host), sign_bits, frame_finish | sign_validate, sign_add (every rank's value per element, in rank order), poison_on_wire | nothing (approx) | frames byte for byte; sum bits |
//! | natural_codec | device_codecs_natural.cuh: one thread per payload byte of the 9-bit fields (detail::natural_field, random_stream replayed), frame_finish | natural_validate, natural_add, poison_on_wire | nothing (approx) | frames byte for byte; sum bits |
//! | onebit_codec | device_codecs_onebit.cuh: the two sums by chunks of 4096 (the host's order), the side bits, frame_finish | onebit_validate, onebit_add, poison_on_wire | nothing (approx) | frames byte for byte; sum bits |
//! | gaussiank_codec, dgc_codec | device_codecs_estimated.cuh: the threshold estimated on the device with the host's arithmetic (Gaussian-k: the moments in kernels/fixed_sum.hpp's shape, as the host; DGC: the sample replayed), counts and decisions on the device, then threshold_codec's selection | as threshold_codec | as threshold_codec | frames byte for byte; sum, mean and residual bits |
//! | per_tensor<K> (any K above) | device_codecs_per_tensor.cuh: K's kernels per tensor into aligned temp frames, a scan of the lengths and a byte-packing kernel | the framing walked per rank, K's decode_sum per tensor | K's per tensor | frames byte for byte; sum bits |
//!
//! Differences from the host kernels: a malformed payload sets status_wire (and NaN in
//! sum[0], so that the mean leaves out untouched) where the host raises wire_error;
//! CodecCompressor::finish reads the status after its fence and raises the same
//! wire_error. The kernels of topk_codec and threshold_codec hold state (workspaces, where
//! the delivered indices are): the device_codec object is the rows' workspace
//! (ops<cuda_space>::codec_workspace<Codec>), one per compressor. The dense codecs'
//! objects are empty.
//!
//! Every codec of compress/codecs/ has device kernels. A user's codec without them fails
//! to compile on the CUDA space with a sentence (device_codec's primary template,
//! kernels/device_codec.hpp; the compiler's note on the instantiation names the codec).
//! random-k is no Codec of this table (LinearCompressor's linear_encode / linear_decode
//! rows).

#if !defined(__CUDACC__)
#error "commpact/compress/device_codecs.cuh needs nvcc: include it from a .cu file only."
#endif

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../error.hpp"
#include "../kernels/cuda/codecs.cuh"
#include "../kernels/cuda/ops.cuh"
#include "../kernels/status.hpp"
#include "../space/cuda.hpp"
#include "../wire/codec_frame.hpp"
#include "codecs/casts.hpp"
#include "codecs/quantizers.hpp"
#include "codecs/topk_sign.hpp"

namespace commpact {

namespace detail {

inline void cuda_codec_check(cudaError_t err, const char* what) {
  cuda_kernels::detail::check(err, what, "commpact::device_codec");
}

//! The header h as 12 words (frame::write's bytes).
inline cuda_kernels::codec::header_words_t frame_words(const frame::header& h) {
  std::array<std::byte, frame::header_bytes> b{};
  frame::write(std::span<std::byte>(b), h);
  cuda_kernels::codec::header_words_t w{};
  std::memcpy(w.w, b.data(), frame::header_bytes);
  return w;
}

//! The end of encode_frame, as the host's: with `len` payload bytes written when h.flags
//! is 0 (none otherwise), the header goes in front (flag nonfinite_input and payload 0
//! when the status, read on the device, holds status_nonfinite) and the rest is zeroed.
inline void cuda_finish_frame(const cuda_space::exec& e, cuda_span<float> block, frame::header h, std::size_t len,
                              cuda_span<const std::uint32_t> status, const std::uint32_t* d_entries = nullptr,
                              std::uint32_t entry_bytes = 0) {
  require(block.size() * 4 >= frame::header_bytes && len <= block.size() * 4 - frame::header_bytes,
          "commpact::CodecCompressor: the codec wrote ", len, " bytes into a block of ", block.size() * 4,
          " bytes, above its max_encoded_bytes; fix the codec's max_encoded_bytes().");
  frame::header ok = h, bad = h;
  ok.payload = h.flags == 0 ? static_cast<std::uint32_t>(len) : 0u;
  bad.payload = 0;
  bad.flags = static_cast<std::uint16_t>(h.flags | frame::nonfinite_input);
  const std::size_t nw = block.size();
  cuda_kernels::codec::frame_finish<<<cuda_kernels::codec::grid_for(nw), cuda_kernels::codec::block_threads, 0,
                                      e.stream()>>>(reinterpret_cast<std::uint32_t*>(cuda_access::ptr(block)), nw,
                                                    frame_words(ok), frame_words(bad), ok.payload,
                                                    status.empty() ? nullptr : cuda_access::ptr(status),
                                                    h.flags == 0 ? d_entries : nullptr, entry_bytes);
  cuda_codec_check(cudaGetLastError(), "frame_finish");
}

//! decode_sum of a dense codec (sign, fp16, bf16, TernGrad, natural, 1-bit): sum = 0,
//! validate over `validate_threads` threads (status_wire for a malformed block), add (every
//! block's value per element, in rank order; nothing once status_wire is set), then NaN in
//! sum[0] when status_wire is set. Both kernels take (blocks, block words, P, n, ...).
inline void cuda_dense_decode_sum(const cuda_space::exec& e, const char* who, cuda_span<const float> blocks,
                                  std::size_t block_floats, cuda_span<float> sum, cuda_span<std::uint32_t> status,
                                  std::size_t validate_threads,
                                  void (*validate)(const std::uint32_t*, std::size_t, std::size_t, std::size_t,
                                                   std::uint32_t*),
                                  void (*add)(const std::uint32_t*, std::size_t, std::size_t, std::size_t, float*,
                                              const std::uint32_t*)) {
  namespace kc = cuda_kernels::codec;
  require(status.size() >= 1, "commpact::device_codec<", who, ">::decode_sum: pass the step status (one "
          "word); the device reports a malformed block there.");
  require(block_floats >= kc::header_words, "commpact::device_codec<", who, ">::decode_sum: blocks of ",
          block_floats, " floats cannot hold the frame header.");
  const std::size_t n = sum.size(), P = blocks.size() / block_floats;
  const cudaStream_t s = e.stream();
  const auto* b = reinterpret_cast<const std::uint32_t*>(cuda_access::ptr(blocks));
  std::uint32_t* st = cuda_access::ptr(status);
  if (n) cuda_codec_check(cudaMemsetAsync(cuda_access::ptr(sum), 0, n * sizeof(float), s), "decode_sum (zero)");
  validate<<<kc::grid_for(validate_threads), kc::block_threads, 0, s>>>(b, block_floats, P, n, st);
  if (n) add<<<kc::grid_for(n), kc::block_threads, 0, s>>>(b, block_floats, P, n, cuda_access::ptr(sum), st);
  cuda_kernels::decision_launch(kc::poison_on_wire, s, cuda_access::ptr(sum), n, st);
  cuda_codec_check(cudaGetLastError(), "decode_sum");
}

//! decode_sum of the sparse format (topk_codec, threshold_codec): sum = 0, then every
//! block's entries (at most max_count, validated as the host's decode_add) added in rank
//! order; a malformed block sets status_wire and NaN in sum[0] (nothing of it is added).
inline void cuda_sparse_decode_sum(const cuda_space::exec& e, const char* who, std::size_t max_count,
                                   cuda_span<const float> blocks, std::size_t block_floats, cuda_span<float> sum,
                                   cuda_span<std::uint32_t> status) {
  namespace kc = cuda_kernels::codec;
  require(status.size() >= 1, "commpact::device_codec<", who, ">::decode_sum: pass the step status "
                              "(one word); the device reports a malformed block there.");
  require(block_floats >= kc::header_words, "commpact::device_codec<", who, ">::decode_sum: blocks of ",
          block_floats, " floats cannot hold the frame header.");
  const std::size_t n = sum.size(), P = blocks.size() / block_floats, cmax = (block_floats - kc::header_words) / 2;
  const cudaStream_t s = e.stream();
  if (n) cuda_codec_check(cudaMemsetAsync(cuda_access::ptr(sum), 0, n * sizeof(float), s), "decode_sum (zero)");
  const auto* b = reinterpret_cast<const std::uint32_t*>(cuda_access::ptr(blocks));
  std::uint32_t* st = cuda_access::ptr(status);
  kc::topk_validate<<<kc::grid_for(P * (cmax ? cmax : 1)), kc::block_threads, 0, s>>>(b, block_floats, P, cmax, n,
                                                                                    max_count, st);
  cuda_codec_check(cudaGetLastError(), "topk_validate");
  for (std::size_t r = 0; r < P; ++r) {  // rank order: the same float additions on every rank
    kc::topk_add<<<kc::grid_for(cmax), kc::block_threads, 0, s>>>(b + r * block_floats, cmax, cuda_access::ptr(sum), st);
    cuda_codec_check(cudaGetLastError(), "topk_add");
  }
  cuda_kernels::decision_launch(kc::poison_on_wire, s, cuda_access::ptr(sum), n, st);
  cuda_codec_check(cudaGetLastError(), "poison_on_wire");
}

}  // namespace detail

//! topk_codec on the CUDA space (see the file comment). One object per compressor: it
//! owns the top-k workspace and remembers where the last encode put its indices (this
//! rank's block, untouched until the next encode).
template <>
struct device_codec<topk_codec> {
  static constexpr bool payload_entries = true;  // k int32 indices, then k float32 values; approx unwritten
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  void encode_frame(const exec& e, topk_codec& codec, span<const float> acc, span<float> block, frame::header h,
                    span<float> /*approx: topk delivers indices*/, span<const std::uint32_t> status) {
    const std::size_t n = acc.size(), kk = h.flags == 0 ? codec.k(n) : 0;
    require(block.size() >= frame::header_bytes / 4 + 2 * kk, "commpact::TopK: a block of ", block.size() * 4,
            " bytes cannot hold k = ", kk, " entries behind the frame header.");
    delivered_ = {};
    if (h.flags == 0 && kk > 0) {
      auto* idx = reinterpret_cast<std::int32_t*>(cuda_access::ptr(block)) + frame::header_bytes / 4;
      float* val = cuda_access::ptr(block) + frame::header_bytes / 4 + kk;
      ops<cuda_space>::topk_abs(e, acc, kk, cuda_access::wrap(idx, kk), cuda_access::wrap(val, kk), ws_);
      delivered_ = cuda_access::wrap(static_cast<const std::int32_t*>(idx), kk);
    }
    detail::cuda_finish_frame(e, block, h, 8 * kk, status);
  }

  //! sum = 0, then every valid block's entries added in rank order; a malformed block
  //! sets status_wire and NaN in sum[0] (nothing of it is added).
  static void decode_sum(const exec& e, const topk_codec& codec, span<const float> blocks, std::size_t block_floats,
                         span<float> sum, span<std::uint32_t> status) {
    detail::cuda_sparse_decode_sum(e, "topk_codec", codec.k(sum.size()), blocks, block_floats, sum, status);
  }

  void clear_delivered(const exec& e, const topk_codec&, span<float> residual, span<float> velocity) const {
    require(velocity.empty() || velocity.size() == residual.size(), "commpact::TopK: the velocity holds ",
            velocity.size(), " values but the residual ", residual.size(), ".");
    detail::cuda_codec_check(
        cuda_kernels::zero_delivered(cuda_access::ptr(residual), velocity.empty() ? nullptr : cuda_access::ptr(velocity),
                                     residual.size(), cuda_access::ptr(delivered_), nullptr, delivered_.size(),
                                     e.stream()),
        "clear_delivered");
  }

  //! The top-k workspace (allocation checks: grown at the first step only).
  template <class Out>
  void add_signature(Out& s) const {
    s.emplace_back(ws_.data(), ws_.capacity_bytes());
  }

 private:
  ops<cuda_space>::topk_workspace ws_;
  span<const std::int32_t> delivered_{};
};

//! sign_codec on the CUDA space (EF-SignSGD; MajorityVote's encode): stateless, the
//! scratch of its scale's sum (above 2048 values) from the executor's.
template <>
struct device_codec<sign_codec> {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  static void encode_frame(const exec& e, const sign_codec& codec, span<const float> acc, span<float> block,
                           frame::header h, span<float> approx, span<const std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    const std::size_t n = acc.size(), len = h.flags == 0 ? codec.max_encoded_bytes(n) : 0;
    require(approx.empty() || approx.size() == n, "commpact::device_codec<sign_codec>: approx holds ",
            approx.size(), " values for ", n, "; pass n values or none.");
    if (h.flags == 0) {
      require(block.size() * 4 >= frame::header_bytes + len, "commpact::sign_codec: a block of ", block.size() * 4,
              " bytes cannot hold the ", len, "-byte message behind the frame header.");
      const cudaStream_t s = e.stream();
      // The levels of the sum above 2048 values in the executor's scratch (free between
      // kernels on its stream).
      const std::size_t scratch = kc::sign_l1_scratch(n);
      float* payload = cuda_access::ptr(block) + kc::header_words;  // the scale, then the bits
      detail::cuda_codec_check(
          kc::sign_l1(cuda_access::ptr(acc), n, payload,
                      scratch ? static_cast<double*>(e.scratch("sign_l1", sizeof(double) * scratch)) : nullptr, s),
          "sign scale");
      const std::size_t nb = (n + 7) / 8;
      if (nb)
        kc::sign_bits<<<kc::grid_for(nb), kc::block_threads, 0, s>>>(
            cuda_access::ptr(acc), n, reinterpret_cast<unsigned char*>(payload + 1), nb,
            approx.empty() ? nullptr : cuda_access::ptr(approx), payload);
      detail::cuda_codec_check(cudaGetLastError(), "sign encode");
    }
    detail::cuda_finish_frame(e, block, h, len, status);
  }

  //! sum = the blocks' values added in rank order; a malformed block sets status_wire and
  //! NaN in sum[0].
  static void decode_sum(const exec& e, const sign_codec&, span<const float> blocks, std::size_t block_floats,
                         span<float> sum, span<std::uint32_t> status) {
    detail::cuda_dense_decode_sum(e, "sign_codec", blocks, block_floats, sum, status, blocks.size() / block_floats,
                                  cuda_kernels::codec::sign_validate, cuda_kernels::codec::sign_add);
  }

  static void clear_delivered(const exec&, const sign_codec&, span<float>, span<float>) {}
};

namespace detail {
//! fp16_codec (Bf16 false) and bf16_codec on the CUDA space: stateless, one thread per value.
template <class Codec, bool Bf16>
struct cuda_cast16_kernels {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  static void encode_frame(const exec& e, const Codec& codec, span<const float> acc, span<float> block,
                           frame::header h, span<float> approx, span<const std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    const std::size_t n = acc.size(), len = h.flags == 0 ? codec.max_encoded_bytes(n) : 0;
    require(approx.empty() || approx.size() == n, "commpact::device_codec<", codec.who, ">: approx holds ",
            approx.size(), " values for ", n, "; pass n values or none.");
    if (h.flags == 0 && n) {
      require(block.size() * 4 >= frame::header_bytes + len, "commpact::", codec.who, ": a block of ", block.size() * 4,
              " bytes cannot hold the ", len, "-byte message behind the frame header.");
      kc::cast16_encode<Bf16><<<kc::grid_for(n), kc::block_threads, 0, e.stream()>>>(
          cuda_access::ptr(acc), n, reinterpret_cast<std::uint16_t*>(cuda_access::ptr(block) + kc::header_words),
          approx.empty() ? nullptr : cuda_access::ptr(approx));
      cuda_codec_check(cudaGetLastError(), "cast16_encode");
    }
    cuda_finish_frame(e, block, h, len, status);
  }

  static void decode_sum(const exec& e, const Codec& codec, span<const float> blocks, std::size_t block_floats,
                         span<float> sum, span<std::uint32_t> status) {
    const std::size_t n = sum.size(), P = blocks.size() / block_floats;
    cuda_dense_decode_sum(e, codec.who, blocks, block_floats, sum, status, P * (n ? n : 1),
                          cuda_kernels::codec::cast16_validate<Bf16>, cuda_kernels::codec::cast16_add<Bf16>);
  }

  static void clear_delivered(const exec&, const Codec&, span<float>, span<float>) {}
};
}  // namespace detail

//! fp16_codec on the CUDA space (detail::to_half / from_half, shared with the host).
template <>
struct device_codec<fp16_codec> : detail::cuda_cast16_kernels<fp16_codec, false> {};
//! bf16_codec on the CUDA space (detail::to_bf16 / from_bf16, shared with the host).
template <>
struct device_codec<bf16_codec> : detail::cuda_cast16_kernels<bf16_codec, true> {};

//! terngrad_codec on the CUDA space: the scale by an atomic maximum (the executor's scratch),
//! the fields from random_stream replayed on the device.
template <>
struct device_codec<terngrad_codec> {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  static void encode_frame(const exec& e, const terngrad_codec& codec, span<const float> acc, span<float> block,
                           frame::header h, span<float> approx, span<const std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    const std::size_t n = acc.size(), len = h.flags == 0 ? codec.max_encoded_bytes(n) : 0;
    require(approx.empty() || approx.size() == n, "commpact::device_codec<terngrad_codec>: approx holds ",
            approx.size(), " values for ", n, "; pass n values or none.");
    if (h.flags == 0) {
      require(block.size() * 4 >= frame::header_bytes + len, "commpact::terngrad_codec: a block of ",
              block.size() * 4, " bytes cannot hold the ", len, "-byte message behind the frame header.");
      const cudaStream_t s = e.stream();
      auto* m = static_cast<std::uint32_t*>(e.scratch("terngrad_scale", sizeof(std::uint32_t)));
      detail::cuda_codec_check(cudaMemsetAsync(m, 0, sizeof(std::uint32_t), s), "terngrad (zero the scale)");
      if (n) kc::terngrad_absmax<<<kc::grid_for(n), kc::block_threads, 0, s>>>(cuda_access::ptr(acc), n, m);
      kc::terngrad_encode<<<kc::grid_for((2 * n + 7) / 8), kc::block_threads, 0, s>>>(
          cuda_access::ptr(acc), n, m, codec.stream(),
          reinterpret_cast<std::uint32_t*>(cuda_access::ptr(block)) + kc::header_words,
          approx.empty() ? nullptr : cuda_access::ptr(approx));
      detail::cuda_codec_check(cudaGetLastError(), "terngrad encode");
    }
    detail::cuda_finish_frame(e, block, h, len, status);
  }

  static void decode_sum(const exec& e, const terngrad_codec&, span<const float> blocks, std::size_t block_floats,
                         span<float> sum, span<std::uint32_t> status) {
    const std::size_t n = sum.size(), P = blocks.size() / block_floats, nb = (2 * n + 7) / 8;
    detail::cuda_dense_decode_sum(e, "terngrad_codec", blocks, block_floats, sum, status, P * (nb ? nb : 1),
                                  cuda_kernels::codec::terngrad_validate, cuda_kernels::codec::terngrad_add);
  }

  static void clear_delivered(const exec&, const terngrad_codec&, span<float>, span<float>) {}
};

}  // namespace commpact

#include "device_codecs_qsgd.cuh"
#include "device_codecs_threshold.cuh"
#include "device_codecs_estimated.cuh"
#include "device_codecs_natural.cuh"
#include "device_codecs_onebit.cuh"
#include "device_codecs_per_tensor.cuh"
