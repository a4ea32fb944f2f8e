// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file step_status.hpp
//! A step's status word (kernels/status.hpp's bits) in the compressor's space, and its
//! copy on the host: start() clears it (queued), the kernels set bits instead of
//! throwing, finish() queues fetch() before its fence and reads bits() after it.
//! Dense, CastAllreduce, LinearCompressor, CodecCompressor and MajorityVote hold one.

#include <cstddef>
#include <cstdint>
#include <span>

#include "../kernels/ops.hpp"

namespace commpact::detail {

template <class Space>
class status_word {
 public:
  using span = typename Space::template span<std::uint32_t>;
  using cspan = typename Space::template span<const std::uint32_t>;

  //! One word, cleared on `e` (queued): call at the start of every step.
  void clear(const typename Space::exec& e) {
    buf_.resize(1);
    ops<Space>::fill(e, buf_.view(), std::uint32_t{0});
  }
  span view() { return buf_.view(); }
  cspan cview() const { return buf_.cview(); }
  //! Queues the copy of the word to the host; bits() holds it after the next fence.
  void fetch(const typename Space::exec& e) { ops<Space>::to_host(e, buf_.cview(), std::span<std::uint32_t>(&host_, 1)); }
  std::uint32_t bits() const { return host_; }
  //! Where the word lives (for a compressor's allocation signature).
  const void* data() const { return buf_.data(); }
  std::size_t capacity() const { return buf_.capacity(); }

 private:
  typename Space::template buffer<std::uint32_t> buf_;
  std::uint32_t host_ = 0;
};

}  // namespace commpact::detail
