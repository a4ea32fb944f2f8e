// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codec_frame.hpp
//! The one frame protocol of the codec compressors (CodecCompressor over any
//! aggregation, MajorityVote): every rank's message starts with this 48-byte header
//! (namespace commpact::frame). It sits below the kernels, which write it in the space.
//!
//! Frame header (48 bytes): u32 magic 0x47415043 ("CPAG"), u16 version 1, u16 flags
//! (bit 0 non-finite input, bit 1 input rejected), u32 payload bytes, u32 0, then i64
//! n, i64 the codec's agreement value (k for top-k), i64 step (plus the compressor's check
//! tag times 2^40: Bucketed's bucket, detail/check_tag.hpp), i64 block capacity.
//! Every rank sees every header, so disagreement on n, k, the step or the capacity, a
//! rejected input or NaN/Inf on any rank is seen by every rank, and every rank raises
//! the same error (or skips the step) without an extra message.
//!
//! Why a second 48-byte header exists beside sparse_frame.hpp's ("CPSW"): this frame carries
//! single values (n, the agreement value, the step) because every rank reads every
//! rank's header and compares them; sparse_frame.hpp's sets are merged along a tree, where a
//! rank sees only its partners' merged subtrees, so that header carries ranges (min/max
//! of n and k) and a survival mask instead. The magics differ, so neither decoder accepts
//! the other's message.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "../config.hpp"
#include "../detail/check_tag.hpp"
#include "../error.hpp"

namespace commpact {

namespace frame {
inline constexpr std::uint32_t magic = 0x47415043u;  // "CPAG"
inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t header_bytes = 48;
//! The largest payload a header can announce (its length is 32-bit): CodecCompressor and
//! MajorityVote refuse a gradient whose message may be longer (payload_problem).
inline constexpr std::uint64_t max_payload = 0xFFFFFFFFu;
enum flag : std::uint16_t { nonfinite_input = 1, rejected_input = 2 };

struct header {
  std::uint16_t flags = 0;
  std::uint32_t payload = 0;
  std::int64_t n = 0, agreement = 0, step = 0, capacity = 0;
};

inline void write(std::span<std::byte> b, const header& h) {
  std::byte* p = b.data();
  const std::uint32_t zero = 0;
  std::memcpy(p, &magic, 4);
  std::memcpy(p + 4, &version, 2);
  std::memcpy(p + 6, &h.flags, 2);
  std::memcpy(p + 8, &h.payload, 4);
  std::memcpy(p + 12, &zero, 4);
  std::memcpy(p + 16, &h.n, 8);
  std::memcpy(p + 24, &h.agreement, 8);
  std::memcpy(p + 32, &h.step, 8);
  std::memcpy(p + 40, &h.capacity, 8);
}

//! Reads and checks a header (magic, version, flags, payload within a block of
//! `block_bytes`) from its first 48 bytes.
inline header read_header(std::span<const std::byte> b, std::size_t block_bytes, int from) {
  require<wire_error>(b.size() >= header_bytes && block_bytes >= header_bytes, "commpact::Allgather: rank ", from,
                      "'s block of ", block_bytes, " bytes cannot hold the ", header_bytes, "-byte frame header.");
  const std::byte* p = b.data();
  std::uint32_t m, zero;
  std::uint16_t v;
  header h;
  std::memcpy(&m, p, 4);
  std::memcpy(&v, p + 4, 2);
  std::memcpy(&h.flags, p + 6, 2);
  std::memcpy(&h.payload, p + 8, 4);
  std::memcpy(&zero, p + 12, 4);
  std::memcpy(&h.n, p + 16, 8);
  std::memcpy(&h.agreement, p + 24, 8);
  std::memcpy(&h.step, p + 32, 8);
  std::memcpy(&h.capacity, p + 40, 8);
  require<wire_error>(m == magic && v == version && zero == 0 && (h.flags & ~3u) == 0, "commpact::Allgather: rank ",
                      from, "'s block does not start with a version-", version,
                      " frame header; every rank must run the same commpact.");
  require<wire_error>(h.payload <= block_bytes - header_bytes, "commpact::Allgather: rank ", from,
                      "'s header announces ", h.payload, " payload bytes in a block of ", block_bytes,
                      "; the block is corrupt.");
  return h;
}

//! Why a message of up to `bytes` for a gradient of n entries cannot travel in a frame
//! (empty: it can): `who` names the compressor, `what` the message.
inline std::string payload_problem(std::string_view who, std::string_view what, std::size_t n, std::uint64_t bytes) {
  if (bytes <= max_payload) return {};
  return detail::cat("commpact::", who, "::reduce: the gradient has n = ", n, " entries, whose ", what,
                     " may take ", bytes, " bytes, above the frame's 32-bit payload length (", max_payload,
                     " bytes); split the gradient into buckets (Bucketed).");
}

//! The device-side gate of a step whose decode is queued before the host reads the
//! headers: true when the P headers at the start of P blocks of `block_words` 32-bit words
//! (word(i): the i-th word of the blocks, in rank order) are well formed (magic, version,
//! the zero word, payload within the block), carry no flag, and agree on n, the codec's
//! agreement value, the step and the capacity: what check_headers accepts with no flag
//! and read_header without raising. Anything else is an error or a skipped step that the
//! host raises from the headers after the fence (check_headers), so the gate's only job is
//! to keep the step from writing its result.
template <class Word>
COMMPACT_HOST_DEVICE bool headers_clean(Word word, std::size_t block_words, std::size_t P) {
  if (block_words < header_bytes / 4) return false;
  for (std::size_t r = 0; r < P; ++r) {
    const std::size_t b = r * block_words;
    // word 1 is the version in its low 16 bits and the flags in its high 16 bits
    if (word(b) != magic || word(b + 1) != version || word(b + 3) != 0u) return false;
    if (word(b + 2) > block_words * 4 - header_bytes) return false;
    for (std::size_t j = 4; j < header_bytes / 4; ++j)
      if (word(b + j) != word(j)) return false;
  }
  return true;
}

//! Reads and checks a whole block's header (read_header over the block).
inline header read(std::span<const std::byte> b, int from) { return read_header(b, b.size(), from); }

//! Reads every rank's header (`hdrs`: P headers of 48 bytes, in rank order, from blocks
//! of `block_bytes`) and raises mismatch_error, the same on every rank since every rank
//! reads the same headers, when ranks disagree on the gradient length, the codec's
//! agreement value (compared only when no rank rejected its input, which sends -1), the
//! step or the block capacity. Returns the union of the flags.
inline std::uint16_t check_headers(std::span<const std::byte> hdrs, int P, std::size_t block_bytes,
                                   std::string_view who) {
  std::uint16_t flags = 0;
  constexpr auto lowest = std::numeric_limits<std::int64_t>::min(), highest = std::numeric_limits<std::int64_t>::max();
  std::int64_t lo[4] = {highest, highest, highest, highest}, hi[4] = {lowest, lowest, lowest, lowest};
  int lo_rank[4] = {0, 0, 0, 0}, hi_rank[4] = {0, 0, 0, 0};  // the first rank at each end
  for (int r = 0; r < P; ++r) {
    const auto hr = read_header(hdrs.subspan(static_cast<std::size_t>(r) * header_bytes, header_bytes), block_bytes, r);
    flags = static_cast<std::uint16_t>(flags | hr.flags);
    const std::int64_t v[4] = {hr.n, hr.agreement, hr.step, hr.capacity};
    for (int j = 0; j < 4; ++j) {
      if (v[j] < lo[j]) lo[j] = v[j], lo_rank[j] = r;
      if (v[j] > hi[j]) hi[j] = v[j], hi_rank[j] = r;
    }
  }
  static constexpr const char* what[4] = {"the gradient length", "the codec's parameter (such as k)", "the step count",
                                          "the block capacity"};
  for (int j = 0; j < 4; ++j) {
    if (j == 1 && (flags & rejected_input)) continue;
    if (lo[j] == hi[j]) continue;
    if (j == 2)  // the step, with the check tag of a Bucketed bucket (detail/check_tag.hpp)
      throw detail::out_of_step(who, (lo[j] | hi[j]) >> detail::check_tag_shift != 0,
                                detail::cat("rank ", lo_rank[j], " is at ", detail::tagged_step_text(lo[j]), ", rank ",
                                            hi_rank[j], " at ", detail::tagged_step_text(hi[j])));
    throw mismatch_error(detail::cat("commpact::", who, "::reduce: ranks disagree on ", what[j],
                                     ": the values range over [", lo[j], ", ", hi[j], "] (rank ", lo_rank[j], " has ",
                                     lo[j], ", rank ", hi_rank[j], " has ", hi[j],
                                     "); every rank must pass the same lengths and use the same options and step "
                                     "count."));
  }
  return flags;
}
}  // namespace frame

}  // namespace commpact
