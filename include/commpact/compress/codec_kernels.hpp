// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codec_kernels.hpp
//! codec_kernels<Codec, Space>: where a Codec's encode and decode run, so that
//! CodecCompressor (TopK, every codec, per-tensor codecs) is written once over a space.
//!
//! | operation | specification |
//! |---|---|
//! | `encode_frame(e, codec, acc, block, h, approx, status)` | when status holds no bit and h.flags is 0: the codec encodes acc into block's payload (after the 48-byte frame header, wire/codec_frame.hpp), h.payload = its length (above the block: status_wire); then the rest of the payload is zeroed and h written as block's header, with flag nonfinite_input when status holds status_nonfinite. The length stays in the space: the host never waits for it. |
//! | `decode_sum(e, codec, blocks, block_floats, sum, status)` | sum = 0, then decode_add of each block's payload in rank order (the headers were validated by the host). A malformed payload sets status_wire and a NaN in sum (so that the mean leaves out untouched) in every space, one code path (on the host: the decoder's error is caught; a call without a status word gets it) |
//! | `clear_delivered(e, codec, r, u)` | a sparse codec's delivered indices leave the residual (and velocity) |
//!
//! A specialisation may hold state (the CUDA space's top-k workspace): CodecCompressor
//! keeps one codec_kernels object and calls encode_frame and clear_delivered on it;
//! decode_sum is static.
//!
//! Blocks are float storage (the Communicator concept's allgather moves floats); the
//! kernels view them as bytes. host_space calls the codec at once; deferred_space queues
//! the same host calls until the fence (so a missing fence shows in CI); a codec has no
//! kernels in any other space until that space's issue writes them (CUDA:
//! codec_kernels_cuda*.cuh run every codec of compress/codecs/; a user's codec without
//! kernels fails there with a sentence), and using one elsewhere fails to compile here.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/deferred/ops.hpp"
#include "../kernels/host/ops.hpp"
#include "../kernels/status.hpp"
#include "../space/deferred.hpp"
#include "../space/host.hpp"
#include "../wire/codec_frame.hpp"

namespace commpact {

template <class Codec, class Space>
struct codec_kernels {
  static_assert(sizeof(Space) == 0,
                "commpact: this codec has no kernels in this execution space (host_space and deferred_space run "
                "every codec; cuda_space those of compress/codec_kernels_cuda.cuh, include it from your .cu file); "
                "specialise commpact::codec_kernels<YourCodec, Space> with encode_frame, decode_sum and "
                "clear_delivered, or run the compressor over a host communicator.");
};

//! The host spaces: the rows of ops<Space> (kernels/ops.hpp), which hold no state there.
template <class Codec, class Space>
  requires(std::is_same_v<Space, host_space> || std::is_same_v<Space, deferred_space>)
struct codec_kernels<Codec, Space> {
  using exec = typename Space::exec;
  template <class T>
  using span = typename ops<Space>::template span<T>;
  using ws = typename ops<Space>::template codec_workspace<Codec>;

  static void encode_frame(const exec& e, Codec& codec, span<const float> acc, span<float> block, frame::header h,
                           span<float> approx, span<const std::uint32_t> status) {
    static ws w;  // empty: nothing to keep
    ops<Space>::template codec_encode_frame<Codec>(e, w, codec, acc, block, h, approx, status);
  }
  static void decode_sum(const exec& e, const Codec& codec, span<const float> blocks, std::size_t block_floats,
                         span<float> sum, span<std::uint32_t> status = {}) {
    ops<Space>::template codec_decode_sum<Codec>(e, codec, blocks, block_floats, sum, status);
  }
  static void clear_delivered(const exec& e, const Codec& codec, span<float> residual, span<float> velocity) {
    static const ws w;
    ops<Space>::template codec_clear_delivered<Codec>(e, w, codec, residual, velocity);
  }
};

}  // namespace commpact
