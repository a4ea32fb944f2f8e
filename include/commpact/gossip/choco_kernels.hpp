// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file choco_kernels.hpp
//! choco_kernels<Codec, Space>: where CHOCO-SGD's codec runs (gossip/choco.hpp), as
//! ops<Space>'s codec rows do for CodecCompressor: host_space calls the codec at once,
//! deferred_space queues the same host calls until the fence, cuda_space runs the codec's
//! device kernels (choco_kernels_cuda.cuh, nvcc only). CHOCO keeps one object per mixer
//! (the CUDA space's holds scratch); the host spaces' are stateless.
//!
//! | operation | specification |
//! |---|---|
//! | `encode(e, codec, x, hat, diff, msg, q, words, framed)` | when words[0] is 0: diff = x - hat; the codec encodes diff into msg (after a u32 length when `framed`) and writes q (what the receivers decode); the rest of msg is zeroed. Unframed, a length other than msg.size() sets words[0] = 2. When words[0] is not 0 (this model is not finite): msg is zeroed |
//! | `decode(e, codec, recv, msg_bytes, framed, q_nb, words, why)` | when words[0] = words[2] = 0: q_nb[k] = 0, then decode_add of neighbour k's message (the k-th msg_bytes of recv), k ascending; a malformed one sets words[2] = 1 + k and why = the codec's sentence (host memory, read after the fence; cuda_space: a fixed sentence naming the codec, set when queued) |
//!
//! Messages have a known size (the Codec's max_encoded_bytes(n)), so the exchange needs
//! no probe. A codec whose messages vary in length (threshold_codec, gaussiank_codec,
//! dgc_codec, per_tensor of those, or a user's codec that says so by specialising
//! `commpact::variable_length_codec`) travels behind a 4-byte length ("framed").

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include "../error.hpp"
#include "../kernels/deferred/ops.hpp"
#include "../kernels/host/gossip.hpp"
#include "../space/deferred.hpp"
#include "../space/host.hpp"

namespace commpact {

namespace detail {
class threshold_base;
}
template <class K>
class per_tensor;

//! True for a Codec whose encode() may write fewer than max_encoded_bytes(n) bytes:
//! CHOCO-SGD then sends a 4-byte length before each message. Specialise it (as
//! std::true_type) for such a codec of your own.
template <class Q>
struct variable_length_codec : std::bool_constant<std::is_base_of_v<detail::threshold_base, Q>> {};
template <class K>
struct variable_length_codec<per_tensor<K>> : variable_length_codec<K> {};

template <class Codec, class Space>
struct choco_kernels {
  static_assert(sizeof(Space) == 0,
                "commpact: CHOCO-SGD's codec has no kernels in this execution space (host_space and deferred_space; "
                "cuda_space: include commpact/gossip/choco_kernels_cuda.cuh from your .cu file); specialise "
                "commpact::choco_kernels<YourCodec, Space> with encode and decode.");
};

template <class Codec>
struct choco_kernels<Codec, host_space> {
  using exec = host_space::exec;

  static void encode(exec, Codec& codec, std::span<const float> x, std::span<const float> hat, std::span<float> diff,
                     std::span<std::byte> msg, std::span<float> q, std::span<std::int64_t> words, bool framed) {
    std::size_t len = 0;
    const auto payload = framed ? msg.subspan(4) : msg;
    if (words[0] == 0) {
      for (std::size_t i = 0; i < x.size(); ++i) diff[i] = x[i] - hat[i];
      len = codec.encode(std::span<const float>(diff), payload, q);
      require(len <= payload.size(), "commpact::GossipMixer (CHOCO): the codec wrote ", len,
              " bytes, above its max_encoded_bytes ", payload.size(), "; fix the codec's max_encoded_bytes().");
      if (!framed && len != payload.size()) words[0] = 2;
    }
    if (framed) {
      const auto l = static_cast<std::uint32_t>(len);
      std::memcpy(msg.data(), &l, 4);
    }
    std::fill(payload.begin() + static_cast<std::ptrdiff_t>(len), payload.end(), std::byte{0});
  }

  static void decode(exec, const Codec& codec, std::span<const std::byte> recv, std::size_t msg_bytes, bool framed,
                     std::span<float> q_nb, std::span<std::int64_t> words, std::string& why) {
    if (!host::gossip::clear(words)) return;
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
};

template <class Codec>
struct choco_kernels<Codec, deferred_space> {
  using exec = deferred_space::exec;
  using H = choco_kernels<Codec, host_space>;
  template <class T>
  using span = deferred_span<T>;

  static void encode(const exec& e, Codec& codec, span<const float> x, span<const float> hat, span<float> diff,
                     span<std::byte> msg, span<float> q, span<std::int64_t> words, bool framed) {
    deferred_row(e, [](auto&&... a) { H::encode({}, a...); }, codec, x, hat, diff, msg, q, words, framed);
  }
  static void decode(const exec& e, const Codec& codec, span<const std::byte> recv, std::size_t msg_bytes, bool framed,
                     span<float> q_nb, span<std::int64_t> words, std::string& why) {
    deferred_row(e, [](auto&&... a) { H::decode({}, a...); }, codec, recv, msg_bytes, framed, q_nb, words, why);
  }
};

}  // namespace commpact
