// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file choco.hpp
//! CHOCO-SGD's codec on the host (ops<host_space>'s choco_encode and choco_decode,
//! kernels/ops.hpp): the codec called at once on the mixer's vectors.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "../../error.hpp"
#include "gossip.hpp"

namespace commpact::host::choco {

//! When words[0] is 0: diff = x - hat, the codec encodes diff into msg (after a u32 length
//! when framed) and writes q; unframed, a length other than the payload's sets words[0] =
//! gossip::flag_short.
//! The rest of msg is zeroed (all of it when words[0] is not 0).
template <class Codec>
void encode(Codec& codec, std::span<const float> x, std::span<const float> hat, std::span<float> diff,
            std::span<std::byte> msg, std::span<float> q, std::span<std::int64_t> words, bool framed) {
  std::size_t len = 0;
  const auto payload = framed ? msg.subspan(4) : msg;
  if (words[0] == 0) {
    for (std::size_t i = 0; i < x.size(); ++i) diff[i] = x[i] - hat[i];
    len = codec.encode(std::span<const float>(diff), payload, q);
    require(len <= payload.size(), "commpact::GossipMixer (CHOCO): the codec wrote ", len,
            " bytes, above its max_encoded_bytes ", payload.size(), "; fix the codec's max_encoded_bytes().");
    if (!framed && len != payload.size()) words[0] = gossip::flag_short;
  }
  if (framed) {
    const auto l = static_cast<std::uint32_t>(len);
    std::memcpy(msg.data(), &l, 4);
  }
  std::fill(payload.begin() + static_cast<std::ptrdiff_t>(len), payload.end(), std::byte{0});
}

//! When words[0] = words[2] = 0: q_nb[k] = 0, then decode_add of neighbour k's message, k
//! ascending; a malformed one sets words[2] = 1 + k and why = the codec's sentence.
template <class Codec>
void decode(const Codec& codec, std::span<const std::byte> recv, std::size_t msg_bytes, bool framed,
            std::span<float> q_nb, std::span<std::int64_t> words, std::string& why) {
  if (!gossip::clear(words)) return;
  const std::size_t deg = msg_bytes == 0 ? 0 : recv.size() / msg_bytes;
  const std::size_t n = deg == 0 ? 0 : q_nb.size() / deg;
  for (std::size_t k = 0; k < deg; ++k) {
    auto m = recv.subspan(k * msg_bytes, msg_bytes);
    const auto q = q_nb.subspan(k * n, n);
    std::fill(q.begin(), q.end(), 0.0f);
    try {
      if (framed) {
        std::uint32_t len;
        std::memcpy(&len, m.data(), 4);
        require<wire_error>(len <= msg_bytes - 4, "the message claims ", len, " bytes, above its capacity ",
                            msg_bytes - 4);
        m = m.subspan(4, len);
      }
      codec.decode_add(m, q);
    } catch (const wire_error& e) {
      words[2] = static_cast<std::int64_t>(k) + 1;
      why = e.what();
      return;
    }
  }
}

}  // namespace commpact::host::choco
