// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file hash.hpp
//! FNV-1a hashes: of bytes (state checksums, kind names) and of 64-bit words (setup
//! signatures that every rank compares with one small allreduce).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace commpact::detail {

inline constexpr std::uint64_t fnv_offset = 1469598103934665603ull;
inline constexpr std::uint64_t fnv_prime = 1099511628211ull;

//! FNV-1a 64 over bytes, continuing from h.
inline std::uint64_t fnv1a(std::span<const std::byte> b, std::uint64_t h = fnv_offset) {
  for (std::byte x : b) {
    h ^= static_cast<std::uint64_t>(x);
    h *= fnv_prime;
  }
  return h;
}

inline std::uint64_t fnv1a(std::string_view s, std::uint64_t h = fnv_offset) {
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= fnv_prime;
  }
  return h;
}

//! FNV-1a over the little-endian bytes of 64-bit words, folded to 62 bits (so that
//! require_same may negate it).
inline std::int64_t hash_words(std::span<const std::int64_t> w) {
  std::uint64_t h = fnv_offset;
  for (auto x : w) {
    auto u = static_cast<std::uint64_t>(x);
    for (int b = 0; b < 8; ++b) {
      h ^= (u >> (8 * b)) & 0xffu;
      h *= fnv_prime;
    }
  }
  return static_cast<std::int64_t>(h & ((1ull << 62) - 1));
}

}  // namespace commpact::detail
