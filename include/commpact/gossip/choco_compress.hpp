#pragma once
//! \file choco_compress.hpp
//! Local compressors for CHOCO-SGD's gossip (Koloskova, Stich and Jaggi, ICML 2019): each
//! rank compresses the difference between its model and its public copy, and sends the
//! result to its neighbours only. Two operators, each with an explicit wire format that
//! the decoder validates (a malformed message raises commpact::wire_error, never writes
//! out of bounds):
//!
//! - `choco_topk{.density}`: the k = max(1, round(density n)) entries of largest |v|
//!   (ties: the smaller index; commpact::host::topk_abs). Wire: uint32 k, then k int32
//!   indices (strictly ascending, < n), then k float32 values: 4 + 8k bytes.
//! - `choco_sign{}`: scaled sign, q = (|v|_1 / n) sign(v) (sign(0) = +1). Wire: float32
//!   scale, then ceil(n / 8) bytes of sign bits (bit i%8 of byte i/8 set when negative):
//!   4 + ceil(n/8) bytes.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../error.hpp"
#include "../kernels/host/topk.hpp"

namespace commpact {

//! CHOCO with local top-k: keeps `density` of the entries (0 < density <= 1).
struct choco_topk {
  double density = 0.01;

  std::size_t k(std::size_t n) const {
    const auto kk = static_cast<std::size_t>(std::llround(density * static_cast<double>(n)));
    return std::clamp<std::size_t>(kk, n ? 1 : 0, n);
  }
  void check() const {
    require(density > 0.0 && density <= 1.0, "commpact::choco_topk: density = ", density,
            " must be in (0, 1] (the kept fraction of the entries, e.g. 0.01).");
  }
  std::size_t max_message_bytes(std::size_t n) const { return 4 + 8 * k(n); }
};

//! CHOCO with the scaled sign compressor (1 bit per entry plus one float).
struct choco_sign {
  void check() const {}
  std::size_t max_message_bytes(std::size_t n) const { return 4 + (n + 7) / 8; }
};

namespace detail {

//! Encodes and decodes one local compressor's messages; holds its scratch.
template <class Q>
class choco_codec;

template <>
class choco_codec<choco_topk> {
 public:
  explicit choco_codec(choco_topk q) : q_(q) {}

  //! Compresses v into msg (resized); writes the decompressed q into out (dense, n).
  void encode(std::span<const float> v, std::vector<std::byte>& msg, std::span<float> out) {
    const std::size_t n = v.size(), k = q_.k(n);
    idx_.resize(k);
    val_.resize(k);
    host::topk_abs(v, k, std::span<std::int32_t>(idx_), std::span<float>(val_), ws_);
    msg.resize(4 + 8 * k);
    const auto kk = static_cast<std::uint32_t>(k);
    std::memcpy(msg.data(), &kk, 4);
    std::memcpy(msg.data() + 4, idx_.data(), 4 * k);
    std::memcpy(msg.data() + 4 + 4 * k, val_.data(), 4 * k);
    std::fill(out.begin(), out.end(), 0.0f);
    for (std::size_t i = 0; i < k; ++i) out[static_cast<std::size_t>(idx_[i])] = val_[i];
  }

  //! Adds the message's q to acc (length n); validates everything first.
  void decode_add(std::span<const std::byte> msg, std::span<float> acc, int from) const {
    const std::size_t n = acc.size();
    require<wire_error>(msg.size() >= 4, "commpact::GossipMixer (CHOCO top-k): the message from rank ", from,
                        " has ", msg.size(), " bytes, fewer than the 4-byte count.");
    std::uint32_t k;
    std::memcpy(&k, msg.data(), 4);
    require<wire_error>(k <= n && msg.size() == 4 + 8 * static_cast<std::size_t>(k),
                        "commpact::GossipMixer (CHOCO top-k): the message from rank ", from, " claims ", k,
                        " entries in ", msg.size(), " bytes for a model of ", n,
                        " values; a valid message has k <= n and 4 + 8k bytes.");
    const std::byte* ip = msg.data() + 4;
    const std::byte* vp = ip + 4 * static_cast<std::size_t>(k);
    std::int64_t prev = -1;
    for (std::uint32_t i = 0; i < k; ++i) {
      std::int32_t j;
      std::memcpy(&j, ip + 4 * i, 4);
      require<wire_error>(j > prev && static_cast<std::size_t>(j) < n,
                          "commpact::GossipMixer (CHOCO top-k): the message from rank ", from, " has index ", j,
                          " at position ", i, "; indices must be strictly ascending and in [0, ", n, ").");
      prev = j;
    }
    for (std::uint32_t i = 0; i < k; ++i) {
      std::int32_t j;
      float v;
      std::memcpy(&j, ip + 4 * i, 4);
      std::memcpy(&v, vp + 4 * i, 4);
      acc[static_cast<std::size_t>(j)] += v;
    }
  }

 private:
  choco_topk q_;
  std::vector<std::int32_t> idx_;
  std::vector<float> val_;
  host::topk_workspace ws_;
};

template <>
class choco_codec<choco_sign> {
 public:
  explicit choco_codec(choco_sign) {}

  void encode(std::span<const float> v, std::vector<std::byte>& msg, std::span<float> out) {
    const std::size_t n = v.size();
    double l1 = 0.0;
    for (float x : v) l1 += std::abs(static_cast<double>(x));
    const float scale = n ? static_cast<float>(l1 / static_cast<double>(n)) : 0.0f;
    msg.assign(4 + (n + 7) / 8, std::byte{0});
    std::memcpy(msg.data(), &scale, 4);
    for (std::size_t i = 0; i < n; ++i) {
      const bool neg = std::signbit(v[i]) && v[i] != 0.0f;
      if (neg) msg[4 + i / 8] |= std::byte{static_cast<unsigned char>(1u << (i % 8))};
      out[i] = neg ? -scale : scale;
    }
  }

  void decode_add(std::span<const std::byte> msg, std::span<float> acc, int from) const {
    const std::size_t n = acc.size();
    require<wire_error>(msg.size() == 4 + (n + 7) / 8, "commpact::GossipMixer (CHOCO sign): the message from rank ",
                        from, " has ", msg.size(), " bytes; a model of ", n, " values needs ", 4 + (n + 7) / 8, ".");
    float scale;
    std::memcpy(&scale, msg.data(), 4);
    require<wire_error>(std::isfinite(scale) && scale >= 0.0f, "commpact::GossipMixer (CHOCO sign): the message from rank ",
                        from, " has scale ", scale, "; a scale must be finite and >= 0.");
    if (n % 8) {
      const auto last = static_cast<unsigned>(msg[4 + n / 8]);
      require<wire_error>((last >> (n % 8)) == 0u, "commpact::GossipMixer (CHOCO sign): the message from rank ", from,
                          " sets sign bits past the ", n, " entries of the model.");
    }
    for (std::size_t i = 0; i < n; ++i) {
      const bool neg = (static_cast<unsigned>(msg[4 + i / 8]) >> (i % 8)) & 1u;
      acc[i] += neg ? -scale : scale;
    }
  }
};

}  // namespace detail
}  // namespace commpact
