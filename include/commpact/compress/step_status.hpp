// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file step_status.hpp
//! A step's status word (kernels/status.hpp's bits) in the compressor's space, and its
//! copy in pinned host memory: start() clears it (queued), the kernels set bits instead
//! of throwing, start() queues fetch() last, and finish() reads bits() after its fence
//! (a read before it raises usage_error on the deferred space).
//! Dense, CastAllreduce, LinearCompressor, CodecCompressor and MajorityVote hold one.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "../kernels/ops.hpp"
#include "../kernels/status.hpp"
#include "../space/host.hpp"

namespace commpact::detail {

template <class Space>
class status_word {
 public:
  using span = typename Space::template span<std::uint32_t>;
  using cspan = typename Space::template span<const std::uint32_t>;

  //! One word, cleared on `e` (queued): call at the start of every step. The host copy
  //! reads "not fenced" until the step's fetch() has been fenced (the last step's word
  //! is not this step's).
  void clear(const typename Space::exec& e) {
    buf_.resize(1, e);
    ops<Space>::fill(e, buf_.view(), std::uint32_t{0});
    host_.resize(1);
    host_.view()[0] = status_unfenced;
  }
  span view() { return buf_.view(); }
  cspan cview() const { return buf_.cview(); }
  //! Queues the copy of the word into pinned host memory; bits() holds it after the next fence.
  void fetch(const typename Space::exec& e) {
    host_.resize(1);
    ops<Space>::to_host(e, buf_.cview(), host_.view());
  }
  //! The word as the last fenced fetch() left it; usage_error when read before that fence.
  std::uint32_t bits(std::string_view who = "a compressor") const {
    const std::uint32_t b = host_.size() ? host_.view()[0] : std::uint32_t{status_unfenced};
    require_fenced(b, who);
    return b;
  }
  //! Where the word lives (for a compressor's allocation signature).
  const void* data() const { return buf_.data(); }
  std::size_t capacity() const { return buf_.capacity(); }

 private:
  typename Space::template buffer<std::uint32_t> buf_;
  pinned_t<Space, std::uint32_t> host_;
};

}  // namespace commpact::detail
