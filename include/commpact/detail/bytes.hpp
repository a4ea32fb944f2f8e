// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file bytes.hpp
//! Unaligned reads and writes of trivially copyable values in byte buffers (wire formats
//! and saved states; host byte order).

#include <cstddef>
#include <cstring>

namespace commpact::detail {

template <class T>
void put(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <class T>
T get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace commpact::detail
