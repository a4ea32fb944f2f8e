// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file wire.hpp
//! The parameter server's messages. Every message is a 40-byte header, followed, when
//! the header announces payload bytes, by a second message of exactly that many bytes
//! (the receiver knows its size from the header: no probe, as the house's frames).
//!
//! Header (40 bytes, little-endian host order): u32 magic 0x53505043 ("CPPS"), u16 kind,
//! u16 flags (bit 0: a push that also asks for the parameters of the next clock), u32
//! shard, u32 payload bytes, i64 clock (worker clock; a reply: the server's version),
//! i64 n (the shard's length), f64 lr (a push's learning rate).
//!
//! | kind | from -> to | payload |
//! |---|---|---|
//! | push | worker -> server | the codec's message for the shard (<= max_encoded_bytes(n)) |
//! | pull | worker -> server | none: asks for the parameters of clock `clock` |
//! | params | server -> worker | 4 n bytes: the shard's float32 parameters |
//! | done | worker -> server | none: the worker pushes no more (it leaves the clock count) |
//! | fence | any -> peer | none: barrier() |
//! | bye | any -> peer | none: the last message on this channel |
//! | failed | any -> peer | none: the run failed alike everywhere (n = the reason: 1, a server's aggregate of finite pushes, or its parameters after the Sgd step, overflowed); the receiver tells its own peers and raises the same error |
//!
//! Bytes per clock of one worker, over the servers R other than itself:
//! push sum_{s in R} (40 + e_s) (e_s the encoded bytes; 4 n_s for dense_codec),
//! reply sum_{s in R} (40 + 4 n_s); the pull request travels inside the push header.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "../error.hpp"

namespace commpact::ps::wire {

inline constexpr std::uint32_t magic = 0x53505043u;  // "CPPS"
inline constexpr std::size_t header_bytes = 40;
enum class kind : std::uint16_t { push = 1, pull = 2, params = 3, done = 4, fence = 5, bye = 6, failed = 7 };
//! The reasons a `failed` message carries in n.
enum failure : std::int64_t { overflow = 1 };
enum flag : std::uint16_t { pull_after = 1 };

inline const char* kind_name(kind k) {
  switch (k) {
    case kind::push: return "push";
    case kind::pull: return "pull";
    case kind::params: return "params";
    case kind::done: return "done";
    case kind::fence: return "fence";
    case kind::bye: return "bye";
    case kind::failed: return "failed";
  }
  return "unknown";
}

struct header {
  kind what = kind::push;
  std::uint16_t flags = 0;
  std::uint32_t shard = 0;
  std::uint32_t payload = 0;
  std::int64_t clock = 0;
  std::int64_t n = 0;
  double lr = 0;
};

inline void write(std::span<std::byte, header_bytes> b, const header& h) {
  std::byte* p = b.data();
  const auto k = static_cast<std::uint16_t>(h.what);
  std::memcpy(p, &magic, 4);
  std::memcpy(p + 4, &k, 2);
  std::memcpy(p + 6, &h.flags, 2);
  std::memcpy(p + 8, &h.shard, 4);
  std::memcpy(p + 12, &h.payload, 4);
  std::memcpy(p + 16, &h.clock, 8);
  std::memcpy(p + 24, &h.n, 8);
  std::memcpy(p + 32, &h.lr, 8);
}

//! Reads and checks a header (magic, kind, flags); `from` names the sender in errors.
inline header read(std::span<const std::byte, header_bytes> b, int from) {
  const std::byte* p = b.data();
  std::uint32_t m;
  std::uint16_t k;
  header h;
  std::memcpy(&m, p, 4);
  std::memcpy(&k, p + 4, 2);
  std::memcpy(&h.flags, p + 6, 2);
  std::memcpy(&h.shard, p + 8, 4);
  std::memcpy(&h.payload, p + 12, 4);
  std::memcpy(&h.clock, p + 16, 8);
  std::memcpy(&h.n, p + 24, 8);
  std::memcpy(&h.lr, p + 32, 8);
  require<wire_error>(m == magic && k >= 1 && k <= 7 && (h.flags & ~1u) == 0,
                      "commpact::ps: the message from rank ", from,
                      " is not a parameter-server header (magic, kind or flags wrong); every rank must run the "
                      "same commpact and build the same ParameterServer in the same order.");
  h.what = static_cast<kind>(k);
  return h;
}

}  // namespace commpact::ps::wire
