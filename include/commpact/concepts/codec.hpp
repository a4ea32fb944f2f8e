// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codec.hpp
//! Codec: what one rank turns its vector into, and back (no ranks involved): the concept, its named requirements and its diagnose_ sentence (part of
//! concepts.hpp, the umbrella).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace commpact {

// ---------------------------------------------------------------------------
// Codec: what one rank turns its vector into, and back (no ranks involved).
// ---------------------------------------------------------------------------
namespace req {
template <class K>
concept has_max_encoded_bytes = requires(const K& k, std::size_t n) {
  { k.max_encoded_bytes(n) } -> std::convertible_to<std::size_t>;
};
template <class K>
concept has_encode = requires(K& k, std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
  { k.encode(v, msg, approx) } -> std::convertible_to<std::size_t>;
};
template <class K>
concept has_decode_add = requires(const K& k, std::span<const std::byte> msg, std::span<float> acc) {
  k.decode_add(msg, acc);
};
// Optional members a codec may offer; the compressors use them when present.
template <class K>
concept codec_has_begin_step = requires(K& k, std::int64_t step) { k.begin_step(step); };
template <class K>
concept codec_has_bind_rank = requires(K& k, int rank) { k.bind_rank(rank); };
template <class K>
concept codec_has_check = requires(const K& k, std::size_t n) {
  { k.check(n) } -> std::convertible_to<std::string_view>;
};
template <class K>
concept codec_has_agreement = requires(const K& k, std::size_t n) {
  { k.agreement(n) } -> std::convertible_to<std::int64_t>;
};
template <class K>
concept codec_has_delivered = requires(const K& k) {
  { k.delivered() } -> std::convertible_to<std::span<const std::int32_t>>;
};
}  // namespace req

//! A codec turns a float vector into a message and back, for any rank:
//! - `max_encoded_bytes(n) const`: the largest message for a vector of n values;
//! - `encode(v, msg, approx) -> std::size_t`: writes v's message into msg (at least
//!   max_encoded_bytes(v.size()) bytes) and returns its length; writes into `approx`
//!   (length n, unless empty) what the receivers will decode, so that error feedback
//!   keeps v - approx;
//! - `decode_add(msg, acc) const`: validates a message for a vector of acc.size()
//!   values (raising commpact::wire_error when it is malformed, before writing) and adds
//!   what it decodes to acc.
//! Optional: `begin_step(step)` (schedules, random streams; it sets the step the next
//! calls use and nothing else, and may be called more than once for one step), `bind_rank(rank)` (called
//! once with the compressor's rank, so that stochastic codecs draw per-rank streams), `check(n) -> string` (why n cannot be
//! encoded; empty when it can), `agreement(n) -> int64` (a value every rank must share,
//! such as k), `delivered() -> span<const int32_t>` (a sparse codec's delivered indices,
//! so that error feedback needs no dense pass).
template <class K>
concept Codec = std::move_constructible<K> && req::has_max_encoded_bytes<K> && req::has_encode<K> &&
                req::has_decode_add<K>;

template <class K>
constexpr bool diagnose_codec() {
  static_assert(req::has_max_encoded_bytes<K>,
                "commpact: this type is not a Codec: it needs `std::size_t max_encoded_bytes(std::size_t n) const`.");
  static_assert(req::has_encode<K>,
                "commpact: this type is not a Codec: it needs `std::size_t encode(std::span<const float> v, "
                "std::span<std::byte> msg, std::span<float> approx)`.");
  static_assert(req::has_decode_add<K>,
                "commpact: this type is not a Codec: it needs `void decode_add(std::span<const std::byte> msg, "
                "std::span<float> acc) const`.");
  static_assert(std::move_constructible<K>, "commpact: this type is not a Codec: it must be move-constructible.");
  return Codec<K>;
}

//! A linear codec (reduced by an allreduce: LinearCompressor): `size(n)` (m, the floats of
//! the compressed form, the same on every rank), `compress(v, out)` (out = A v, A depending
//! on the step but not on the rank) and `decompress_add(in, acc) const` (acc += B in).
//! Optional, as for a Codec: `begin_step(step)`, `agreement(n) -> int64` (a value every
//! rank must share, such as a hash of a shared seed), and `keeps_residual()`, `delivered()`
//! (compress/compressors/linear.hpp).
template <class K>
concept LinearCodec = std::move_constructible<K> && requires(K& k, const K& ck, std::size_t n, std::span<const float> v,
                                                               std::span<float> out) {
  { ck.size(n) } -> std::convertible_to<std::size_t>;
  k.compress(v, out);
  ck.decompress_add(v, out);
};

}  // namespace commpact
