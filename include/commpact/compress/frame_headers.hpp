// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file frame_headers.hpp
//! Every rank's frame header (frame.hpp) on the host, for the compressors that check
//! them alike on every rank (CodecCompressor, MajorityVote): queue() copies the 48-byte
//! header of each received block to the host after the exchange (the payloads stay in
//! the space); after the fence, check() is frame::check_headers on them.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "../kernels/ops.hpp"
#include "frame.hpp"

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
      ops<Space>::to_host(e, agg.received(static_cast<int>(r)).first(hf), std::span<float>(hdr_).subspan(r * hf, hf));
  }
  //! After the fence: mismatch_error alike on every rank, or the union of the flags.
  std::uint16_t check(int P, std::size_t block_bytes, std::string_view who) const {
    return check_headers(std::as_bytes(std::span<const float>(hdr_)), P, block_bytes, who);
  }
  //! Where the headers live (for a compressor's allocation signature).
  const void* data() const { return hdr_.data(); }
  std::size_t capacity() const { return hdr_.capacity(); }

 private:
  std::vector<float> hdr_;  // float storage, as the blocks
};

}  // namespace commpact::frame
