// Bit-for-bit comparison of float vectors, the one definition every test helper uses.
#pragma once

#include <cstring>
#include <span>

namespace commpact_test {

//! True when a and b have the same length and the same bits (NaN payloads included).
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

}  // namespace commpact_test
