// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file device_codec.hpp
//! device_codec<Codec>: a codec's kernels on the CUDA space, the customisation point that
//! ops<cuda_space>'s codec rows (kernels/ops.hpp: codec_encode_frame, codec_decode_sum,
//! codec_clear_delivered) call. The host spaces need none: their rows call the codec.
//!
//! A specialisation is a struct whose object is the rows' workspace
//! (ops<cuda_space>::codec_workspace<Codec>, owned by the compressor), with
//!
//! | member | called by |
//! |---|---|
//! | `encode_frame(e, codec, acc, block, h, approx, status)` | codec_encode_frame (may keep where the encode put its indices) |
//! | `static decode_sum(e, codec, blocks, block_floats, sum, status)` | codec_decode_sum |
//! | `clear_delivered(e, codec, r, u) const` | codec_clear_delivered |
//! | `add_signature(s) const` (optional) | the compressor's workspace_signature |
//!
//! each to the specification of its row. The codecs of compress/codecs/ specialise it in
//! compress/device_codecs*.cuh (nvcc only), next to the codec types; a user's codec
//! specialises it in its own .cu file.

namespace commpact {

//! Every codec without device kernels: fails to compile with this sentence (the
//! compiler's note on this instantiation names the codec).
template <class Codec>
struct device_codec {
  static_assert(sizeof(Codec) == 0,
                "commpact: this codec has no kernels in this execution space: host_space and deferred_space run every "
                "codec; on cuda_space CodecCompressor runs every codec of compress/codecs/ (topk, threshold, "
                "Gaussian-k, DGC, sign, 1-bit, TernGrad, QSGD, natural, fp16, bf16 and per_tensor of those; include "
                "commpact/compress/device_codecs.cuh from your .cu file), not this one (the instantiation below names "
                "it): run it over a host communicator, or specialise commpact::device_codec<YourCodec> with "
                "encode_frame, decode_sum and clear_delivered.");
};

}  // namespace commpact
