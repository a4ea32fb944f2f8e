// Helpers for tests of saved states (state.hpp): a compressor's blob, and valid blobs
// rewritten section by section (the checksum stays valid, so the loaders' own checks are
// what must reject them).
#pragma once

#include <commpact/state.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace commpact_test {

using blob = std::vector<std::byte>;

//! t's saved state.
template <class T>
blob saved(const T& t) {
  blob b;
  t.save_state(b);
  return b;
}

//! Rewrites a valid blob of `kind`, letting `edit(tag, type, payload)` replace any
//! section's payload (type 1 i64, 2 f32, 3 bytes) after the kind; the checksum stays valid.
template <class Edit>
blob craft(const blob& good, const std::string& kind, Edit edit) {
  namespace state = commpact::state;
  blob out;
  state::writer w{out, kind};
  std::size_t at = state::header_bytes;
  std::uint32_t sections;
  std::memcpy(&sections, good.data() + 16, 4);
  for (std::uint32_t s = 0; s < sections; ++s) {
    std::uint32_t t, type;
    std::uint64_t count;
    std::memcpy(&t, good.data() + at, 4);
    std::memcpy(&type, good.data() + at + 4, 4);
    std::memcpy(&count, good.data() + at + 8, 8);
    const std::size_t esz = type == 3 ? 1 : type == 2 ? 4 : 8;
    blob payload(good.data() + at + 16, good.data() + at + 16 + count * esz);
    if (s > 0) {  // section 0 is the kind, written by the writer
      edit(t, type, payload);
      if (type == 1) w.i64s(t, std::span(reinterpret_cast<const std::int64_t*>(payload.data()), payload.size() / 8));
      else if (type == 2) w.f32s(t, std::span(reinterpret_cast<const float*>(payload.data()), payload.size() / 4));
      else w.bytes(t, payload);
    }
    at += 16 + ((count * esz + 7) & ~std::size_t{7});
  }
  w.finish();
  return out;
}

//! A valid blob of `kind` whose int64 section `tag` holds `values` instead.
inline blob craft_i64(const blob& good, const std::string& kind, std::uint32_t tag, std::vector<std::int64_t> values) {
  return craft(good, kind, [&](std::uint32_t t, std::uint32_t type, blob& payload) {
    if (t != tag || type != 1) return;
    payload.resize(values.size() * 8);
    std::memcpy(payload.data(), values.data(), payload.size());
  });
}

}  // namespace commpact_test
