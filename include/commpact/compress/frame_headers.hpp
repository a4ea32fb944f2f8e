// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file frame_headers.hpp
//! Every rank's frame header (wire/codec_frame.hpp) on the host, for the compressors that check
//! them alike on every rank (CodecCompressor, MajorityVote): queue() copies the 48-byte
//! header of each received block into pinned host memory after the exchange (the payloads stay in
//! the space); after the fence, check() is frame::check_headers on them.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "../error.hpp"
#include "../kernels/ops.hpp"
#include "../space/host.hpp"
#include "../wire/codec_frame.hpp"

namespace commpact::frame {

template <class Space>
class host_headers {
 public:
  //! Queues the copy of every source's header out of `agg.received(r)` (a BlockAggregation).
  template <class Agg>
  void queue(typename Space::exec e, const Agg& agg) {
    constexpr std::size_t hf = header_bytes / 4;
    const auto P = static_cast<std::size_t>(agg.sources());
    hdr_.resize(P * hf);
    for (std::size_t r = 0; r < P; ++r)
      ops<Space>::to_host(e, agg.received(static_cast<int>(r)).first(hf), hdr_.view().subspan(r * hf, hf));
  }
  //! After the fence: mismatch_error alike on every rank, or the union of the flags.
  std::uint16_t check(int P, std::size_t block_bytes, std::string_view who) const {
    const auto h = std::span<const float>(hdr_.view());
    // A header starts with the magic word, never a NaN: a NaN there is the poison of a
    // copy read before its fence (the deferred space's check).
    for (std::size_t i = 0; i < h.size(); i += header_bytes / 4)
      if (std::isnan(h[i]))
        throw usage_error(detail::cat("commpact::", who, ": the frame headers were read on the host before the fence "
                                      "that covers their copy; fence the executor first."));
    return check_headers(std::as_bytes(h), P, block_bytes, who);
  }
  //! Where the headers live (for a compressor's allocation signature).
  const void* data() const { return hdr_.data(); }
  std::size_t capacity() const { return hdr_.capacity(); }

 private:
  pinned_t<Space, float> hdr_;  // float storage, as the blocks; pinned on CUDA
};

}  // namespace commpact::frame
