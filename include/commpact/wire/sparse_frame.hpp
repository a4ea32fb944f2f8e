// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sparse_frame.hpp
//! The wire format of a sparse gradient set, as gTopK's tree and TreeMerge send it and
//! SparseReduceScatter's block holds it, and its validating decoder (namespace
//! commpact::sparse_wire). It sits below the kernels, which write and check these frames
//! on the host and the device.
//!
//! Layout (host byte order; all ranks of one job share it), 48-byte header then the body:
//!
//! | offset | type     | field      | meaning                                                   |
//! |--------|----------|------------|-----------------------------------------------------------|
//! | 0      | u32      | magic      | 0x57535043 ("CPSW")                                       |
//! | 4      | u16      | version    | 1                                                         |
//! | 6      | u16      | flags      | bit 0 `nonfinite`: a rank of the sender's subtree saw NaN/Inf; bit 1 `failed`: a rank of the subtree rejected its input; bits 2-3 reserved (zero); bits 4-15: the subtree's step counts, six pairs of bits (gTopK; a pair with both bits set: ranks out of step; see step_flag) |
//! | 8      | u32      | count      | entries that follow                                       |
//! | 12     | u32      | mask_bits  | bits of the trailing survival mask (gTopK's unfold only)  |
//! | 16     | i64 x 2  | n_min, n_max | range of the dense gradient length over the subtree     |
//! | 32     | i64 x 2  | k_min, k_max | range of k over the subtree                             |
//! | 48     | i32[count] | indices  | strictly increasing, in [0, n)                            |
//! | ...    | f32[count] | values   | finite                                                   |
//! | ...    | u8[ceil(mask_bits/8)] | mask | bit e (LSB first) set: entry e of the receiver's own set survived |
//!
//! So a set of `count` entries costs 8 * count bytes plus the 48-byte header.
//!
//! The ranges (rather than one n and one k) let a tree reduction carry an agreement
//! check for free: merged with min/max at every exchange, they reach every rank, so
//! every rank sees the same global ranges at the end and every rank raises the same
//! mismatch_error when ranks disagree, without an extra message. (codec_frame.hpp's header,
//! "CPAG", is the other 48-byte header: the codec compressors' messages, which every rank
//! reads from every rank, so it carries single values to compare instead of ranges.)
//!
//! `decode_header` checks the structure (size, magic, version, flags, ranges, the byte
//! count implied by count and mask_bits). `decode` also checks the body against what the
//! receiver expects (its own n, the largest count k it accepts, the mask length) and
//! raises commpact::wire_error on any violation, before writing anything it has not
//! validated; it never reads or writes out of bounds.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "../config.hpp"
#include "../detail/bytes.hpp"
#include "../error.hpp"

namespace commpact::sparse_wire {

inline constexpr std::uint32_t magic = 0x57535043u;  // "CPSW" read as little-endian u32
inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t header_bytes = 48;
inline constexpr std::size_t entry_bytes = 8;  //!< int32 index + float32 value

//! Header flag bits.
enum flag : std::uint16_t {
  flag_nonfinite = 1u << 0,  //!< some rank of the sender's subtree saw a non-finite value
  flag_failed = 1u << 1,     //!< some rank of the sender's subtree rejected its input
};
//! Bits 4 to 15: the step counts of the sender's subtree (gTopK sets its own with
//! step_flag, of its step plus its check tag, detail/check_tag.hpp), merged by OR: six
//! pairs of bits, pair j at bits 4 + 2j and 5 + 2j, set to 01 when the step bit it
//! carries is 0 and to 10 when it is 1. Pairs 0 to 3 carry step bits 0 to 3 at every
//! step; pairs 4 and 5 carry step bits 4 + 2w and 5 + 2w, where the window w = step mod
//! 16 (the same window on ranks whose counts agree modulo 16). A pair with both bits set
//! means ranks out of step: a difference not a multiple of 16 shows at once, any
//! difference below 2^36 within 16 steps. Bits 2 and 3 are reserved (zero).
inline constexpr std::uint16_t step_bits = 0xFFF0u;
//! The step bits of step `step`.
constexpr std::uint16_t step_flag(std::int64_t step) {
  const auto s = static_cast<std::uint64_t>(step);
  const unsigned w = static_cast<unsigned>(s & 15u);
  unsigned f = 0;
  for (unsigned j = 0; j < 6; ++j) {
    const unsigned bit = j < 4 ? j : 4 + 2 * w + (j - 4);
    f |= (((s >> bit) & 1u) != 0 ? 2u : 1u) << (4 + 2 * j);
  }
  return static_cast<std::uint16_t>(f);
}
//! True when no pair of step bits has both bits set (every rank of the subtree in step).
COMMPACT_HOST_DEVICE constexpr bool one_step(std::uint16_t flags) {
  const unsigned s = static_cast<unsigned>(flags & step_bits) >> 4;
  return (s & (s >> 1) & 0x555u) == 0;
}
inline constexpr std::uint16_t known_flags = flag_nonfinite | flag_failed | step_bits;

struct header {
  std::uint16_t flags = 0;
  std::uint32_t count = 0;
  std::uint32_t mask_bits = 0;
  std::int64_t n_min = 0, n_max = 0;
  std::int64_t k_min = 0, k_max = 0;

  //! Widens the ranges and ORs the flags with another subtree's header.
  void merge_meta(const header& o) {
    flags = static_cast<std::uint16_t>(flags | o.flags);
    n_min = std::min(n_min, o.n_min);
    n_max = std::max(n_max, o.n_max);
    k_min = std::min(k_min, o.k_min);
    k_max = std::max(k_max, o.k_max);
  }
  //! True when no flag but one step bit is set and the ranges are the single values (n, k).
  bool healthy_for(std::int64_t n, std::int64_t k) const {
    return (flags & ~step_bits) == 0 && one_step(flags) && n_min == n && n_max == n && k_min == k && k_max == k;
  }
};

//! Bytes of a message of `count` entries and `mask_bits` mask bits.
constexpr std::size_t encoded_size(std::size_t count, std::size_t mask_bits = 0) {
  return header_bytes + entry_bytes * count + (mask_bits + 7) / 8;
}

namespace detail {
using commpact::detail::get;
using commpact::detail::put;
}  // namespace detail

//! Writes header + entries (+ mask) into `out`, which must hold exactly
//! encoded_size(idx.size(), h.mask_bits) bytes. h.count is taken from idx.size();
//! mask holds one byte (0 or 1) per mask bit.
inline void encode_into(std::span<std::byte> out, header h, std::span<const std::int32_t> idx,
                        std::span<const float> val, std::span<const std::uint8_t> mask = {}) {
  require(idx.size() == val.size(), "commpact::sparse_wire::encode: ", idx.size(), " indices but ", val.size(),
          " values; a sparse set needs one value per index.");
  require(mask.size() == h.mask_bits, "commpact::sparse_wire::encode: mask_bits = ", h.mask_bits, " but ", mask.size(),
          " mask entries were given.");
  require(idx.size() <= std::numeric_limits<std::uint32_t>::max(), "commpact::sparse_wire::encode: ", idx.size(),
          " entries do not fit the 32-bit count.");
  h.count = static_cast<std::uint32_t>(idx.size());
  const std::size_t total = encoded_size(h.count, h.mask_bits);
  require(out.size() == total, "commpact::sparse_wire::encode: the output holds ", out.size(), " bytes; the message needs ",
          total, ".");
  std::byte* p = out.data();
  detail::put<std::uint32_t>(p + 0, magic);
  detail::put<std::uint16_t>(p + 4, version);
  detail::put<std::uint16_t>(p + 6, h.flags);
  detail::put<std::uint32_t>(p + 8, h.count);
  detail::put<std::uint32_t>(p + 12, h.mask_bits);
  detail::put<std::int64_t>(p + 16, h.n_min);
  detail::put<std::int64_t>(p + 24, h.n_max);
  detail::put<std::int64_t>(p + 32, h.k_min);
  detail::put<std::int64_t>(p + 40, h.k_max);
  p += header_bytes;
  if (!idx.empty()) {
    std::memcpy(p, idx.data(), idx.size_bytes());
    p += idx.size_bytes();
    std::memcpy(p, val.data(), val.size_bytes());
    p += val.size_bytes();
  }
  const std::size_t mask_bytes = (h.mask_bits + 7) / 8;
  if (mask_bytes) std::memset(p, 0, mask_bytes);
  for (std::size_t e = 0; e < mask.size(); ++e)
    if (mask[e]) p[e / 8] |= static_cast<std::byte>(1u << (e % 8));
}

//! Encodes into the front of a fixed-capacity frame (`out` holds at least
//! encoded_size(idx.size(), h.mask_bits) bytes) and zeroes the rest: the frames of
//! known-size point-to-point messages (no probe needed, as over NCCL).
inline void encode_frame(std::span<std::byte> out, const header& h, std::span<const std::int32_t> idx,
                         std::span<const float> val, std::span<const std::uint8_t> mask = {}) {
  const std::size_t used = encoded_size(idx.size(), h.mask_bits);
  require(used <= out.size(), "commpact::sparse_wire::encode_frame: the message needs ", used,
          " bytes; the frame holds ", out.size(), ".");
  encode_into(out.first(used), h, idx, val, mask);
  if (out.size() > used) std::memset(out.data() + used, 0, out.size() - used);
}

//! Resizes `out` (no allocation once its capacity suffices) and encodes into it.
inline void encode(std::vector<std::byte>& out, const header& h, std::span<const std::int32_t> idx,
                   std::span<const float> val, std::span<const std::uint8_t> mask = {}) {
  out.resize(encoded_size(idx.size(), h.mask_bits));
  encode_into(std::span<std::byte>(out), h, idx, val, mask);
}

//! Reads and checks the header: size, magic, version, known flags, ordered non-negative
//! ranges, and that the message is exactly encoded_size(count, mask_bits) bytes.
inline header decode_header(std::span<const std::byte> msg, bool framed = false) {
  require<wire_error>(msg.size() >= header_bytes, "commpact::sparse_wire: a message of ", msg.size(),
                      " bytes is shorter than the ", header_bytes,
                      "-byte header; the sender is not speaking this format or the message was truncated.");
  const std::byte* p = msg.data();
  const auto m = detail::get<std::uint32_t>(p);
  require<wire_error>(m == magic, "commpact::sparse_wire: bad magic 0x", std::hex, m, " (expected 0x", magic,
                      "); the message is not a sparse set.");
  const auto v = detail::get<std::uint16_t>(p + 4);
  require<wire_error>(v == version, "commpact::sparse_wire: version ", v, " is not the supported version ", version,
                      "; every rank must run the same commpact.");
  header h;
  h.flags = detail::get<std::uint16_t>(p + 6);
  h.count = detail::get<std::uint32_t>(p + 8);
  h.mask_bits = detail::get<std::uint32_t>(p + 12);
  h.n_min = detail::get<std::int64_t>(p + 16);
  h.n_max = detail::get<std::int64_t>(p + 24);
  h.k_min = detail::get<std::int64_t>(p + 32);
  h.k_max = detail::get<std::int64_t>(p + 40);
  require<wire_error>((h.flags & ~known_flags) == 0, "commpact::sparse_wire: unknown flag bits 0x", std::hex,
                      (h.flags & ~known_flags), " in the header; only 0x", known_flags, " are defined.");
  require<wire_error>(0 <= h.n_min && h.n_min <= h.n_max && 0 <= h.k_min && h.k_min <= h.k_max,
                      "commpact::sparse_wire: header ranges n = [", h.n_min, ", ", h.n_max, "], k = [", h.k_min, ", ",
                      h.k_max, "] are not ordered non-negative ranges; the message is corrupt.");
  // Compute the expected size without overflow: count and mask_bits are 32-bit.
  const std::uint64_t expect = header_bytes + entry_bytes * static_cast<std::uint64_t>(h.count) +
                               (static_cast<std::uint64_t>(h.mask_bits) + 7) / 8;
  if (!framed) {
    require<wire_error>(expect == msg.size(), "commpact::sparse_wire: the header announces ", h.count, " entries and ",
                        h.mask_bits, " mask bits (", expect, " bytes) but the message has ", msg.size(),
                        " bytes; it was truncated or padded.");
    return h;
  }
  require<wire_error>(expect <= msg.size(), "commpact::sparse_wire: the header announces ", h.count, " entries and ",
                      h.mask_bits, " mask bits (", expect, " bytes) but the frame holds only ", msg.size(),
                      " bytes; it was truncated or the sender uses a larger k.");
  for (std::size_t i = static_cast<std::size_t>(expect); i < msg.size(); ++i)
    require<wire_error>(msg[i] == std::byte{0}, "commpact::sparse_wire: byte ", i, " of the frame's padding (after ",
                        expect, " bytes of message) is not zero; the frame is corrupt.");
  return h;
}

//! What a receiver accepts.
struct expect {
  std::int64_t n = 0;           //!< the receiver's own dense length
  std::size_t max_count = 0;    //!< at most this many entries (k)
  std::size_t mask_bits = 0;    //!< exactly this many mask bits
};

//! Fully validates `msg` against `e` and writes its entries into idx/val (and its mask,
//! one 0/1 byte per bit, into mask). Raises wire_error on: a bad header, n different
//! from ours, count above max_count or above the outputs' size, an index outside [0, n),
//! indices not strictly increasing (unsorted or duplicate), a non-finite value, a mask
//! of the wrong length or with stray bits. Outputs are written only after validation.
inline header decode(std::span<const std::byte> msg, const expect& e, std::span<std::int32_t> idx,
                     std::span<float> val, std::span<std::uint8_t> mask = {}, bool framed = false) {
  const header h = decode_header(msg, framed);
  require<wire_error>(h.n_min == e.n && h.n_max == e.n, "commpact::sparse_wire: the sender's gradient length is n = [",
                      h.n_min, ", ", h.n_max, "] but ours is ", e.n,
                      "; ranks disagree on the gradient length: every rank must pass gradients of the same length.");
  require<wire_error>(h.count <= e.max_count, "commpact::sparse_wire: the message holds ", h.count,
                      " entries, above the limit k = ", e.max_count, "; the sender uses a different k or the message is corrupt.");
  require<wire_error>(h.count <= idx.size() && h.count <= val.size(), "commpact::sparse_wire: the message holds ",
                      h.count, " entries but the output has room for ", std::min(idx.size(), val.size()), ".");
  require<wire_error>(h.mask_bits == e.mask_bits, "commpact::sparse_wire: the message carries ", h.mask_bits,
                      " mask bits where ", e.mask_bits, " are expected.");
  require<wire_error>(h.mask_bits <= mask.size(), "commpact::sparse_wire: the mask output has room for ", mask.size(),
                      " bits, the message carries ", h.mask_bits, ".");
  const std::byte* pi = msg.data() + header_bytes;
  const std::byte* pv = pi + 4 * static_cast<std::size_t>(h.count);
  const std::byte* pm = pv + 4 * static_cast<std::size_t>(h.count);
  std::int64_t prev = -1;
  for (std::size_t i = 0; i < h.count; ++i) {
    const auto ix = detail::get<std::int32_t>(pi + 4 * i);
    require<wire_error>(ix >= 0 && ix < e.n, "commpact::sparse_wire: entry ", i, " has index ", ix,
                        " outside [0, n = ", e.n, "); the message is corrupt or hostile.");
    require<wire_error>(ix > prev, "commpact::sparse_wire: entry ", i, " has index ", ix, " after index ", prev,
                        "; indices must be strictly increasing (sorted, no duplicates).");
    const auto v = detail::get<float>(pv + 4 * i);
    require<wire_error>(std::isfinite(v), "commpact::sparse_wire: entry ", i, " (index ", ix, ") has the non-finite value ",
                        v, "; a sender flags non-finite gradients instead of sending them.");
    prev = ix;
  }
  const std::size_t mask_bytes = (h.mask_bits + 7) / 8;
  if (mask_bytes && (h.mask_bits % 8) != 0) {
    const auto last = std::to_integer<unsigned>(pm[mask_bytes - 1]);
    require<wire_error>((last >> (h.mask_bits % 8)) == 0,
                        "commpact::sparse_wire: the survival mask has bits set beyond its ", h.mask_bits, " bits.");
  }
  // Validated: now write.
  if (h.count) {
    std::memcpy(idx.data(), pi, 4 * static_cast<std::size_t>(h.count));
    std::memcpy(val.data(), pv, 4 * static_cast<std::size_t>(h.count));
  }
  for (std::size_t b = 0; b < h.mask_bits; ++b)
    mask[b] = static_cast<std::uint8_t>((std::to_integer<unsigned>(pm[b / 8]) >> (b % 8)) & 1u);
  return h;
}

}  // namespace commpact::sparse_wire
