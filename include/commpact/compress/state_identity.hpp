// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file state_identity.hpp
//! Who saved a compressor's state: section 20 of its blob (state.hpp), three int64 —
//! a fingerprint of what the ranks agree on at the saved step (k, a codec's agreement
//! value and message size; 0: nothing to compare), the saving rank and the number of
//! ranks. load_state() refuses, with mismatch_error and changing nothing, a state that
//! another rank, another number of ranks or other options saved: such a state would
//! load and train on silently, with other results. Blobs without the section (saved
//! before it existed) load as before.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "../concepts/codec.hpp"
#include "../detail/hash.hpp"
#include "../error.hpp"
#include "../state.hpp"

namespace commpact {

//! What save_state writes into section 20.
struct state_identity {
  std::int64_t fingerprint = 0;  //!< 0: nothing to compare
  std::int64_t rank = 0;
  std::int64_t size = 1;
};

namespace state {
inline constexpr std::uint32_t identity_tag = 20;

inline void write_identity(writer& w, const state_identity& id) {
  w.i64s(identity_tag, std::array<std::int64_t, 3>{id.fingerprint, id.rank, id.size});
}

//! Reads section 20 when it is the next one. `fingerprint_now(n, step)` is the loading
//! object's fingerprint at the state's residual length n and step count; both
//! fingerprints non-zero and different, or another rank or number of ranks, raise
//! mismatch_error "commpact::<who>::load_state: ...".
template <class F>
void check_identity(reader& r, std::string_view who, std::int64_t rank, std::int64_t size, std::size_t n,
                    std::int64_t step, F&& fingerprint_now) {
  if (!r.next_is(identity_tag)) return;
  const auto id = r.i64s(identity_tag, 3);
  r.require_that<mismatch_error>(id[1] == rank && id[2] == size, "the state was saved by rank ", id[1], " of ", id[2],
                                 "; this is rank ", rank, " of ", size,
                                 ". Load each rank's own state, with as many ranks.");
  if (id[0] == 0) return;
  const std::int64_t now = fingerprint_now(n, step);
  r.require_that<mismatch_error>(now == 0 || now == id[0], "the state was saved by a ", who,
                                 " with other options (k or density, levels, bucket size, seed, period, 16-bit format, "
                                 "or another codec) than this one has at step ", step,
                                 "; load it into a compressor built the same way.");
}
//! The same for an object whose options its own state checks (no fingerprint): the
//! rank and the number of ranks only.
inline void check_identity(reader& r, std::string_view who, std::int64_t rank, std::int64_t size) {
  check_identity(r, who, rank, size, 0, 0, [](std::size_t, std::int64_t) { return std::int64_t{0}; });
}
//! Reads section 20 when it is the next one, and ignores it (the DDP hooks hand one
//! rank's residuals between its compressors by parameter).
inline void skip_identity(reader& r) {
  if (r.next_is(identity_tag)) (void)r.i64s(identity_tag, 3);
}
}  // namespace state

namespace detail {
//! A codec's fingerprint at length n and step `step` (0 for n = 0, or for a codec that
//! cannot be copied): its agreement value (k, the levels' hash, ...) and its message's
//! largest size there (a linear codec's: its size(n) floats), which tell the library's
//! codecs and their options apart. CodecCompressor and LinearCompressor use it.
template <class Codec>
std::int64_t codec_fingerprint(const Codec& codec, std::size_t n, std::int64_t step) {
  if constexpr (!std::is_copy_constructible_v<Codec>) {
    return 0;
  } else {
    if (n == 0) return 0;
    Codec at = codec;
    if constexpr (req::codec_has_begin_step<Codec>) at.begin_step(step);
    std::int64_t agreement = 0;
    if constexpr (req::codec_has_agreement<Codec>) agreement = at.agreement(n);
    std::int64_t message = 0;
    if constexpr (requires { at.max_encoded_bytes(n); }) message = static_cast<std::int64_t>(at.max_encoded_bytes(n));
    else message = static_cast<std::int64_t>(at.size(n));
    const std::array<std::int64_t, 3> w{static_cast<std::int64_t>(n), agreement, message};
    return hash_words(w);
  }
}
}  // namespace detail

}  // namespace commpact
