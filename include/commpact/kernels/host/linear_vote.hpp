// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file linear_vote.hpp
//! The host kernels of the allreduce aggregation of linear codecs (LinearCompressor) and
//! of the majority vote (MajorityVote): rows of the ops table (kernels/ops.hpp) that
//! ops<host_space> runs at once and ops<deferred_space> queues. None throws on data:
//! they set bits of the step status (kernels/status.hpp).
//!
//! A linear block is m + 1 floats: A v (m floats, the LinearCodec's compress) and one
//! flag float, 1 when this rank's input was not finite (the allreduce sums the flags, so
//! every rank sees whether some rank had one). A vote block is the frame of wire/codec_frame.hpp
//! (48-byte header) and sign_codec's payload: a float32 scale and ceil(n / 8) sign bytes.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "../../config.hpp"
#include "../exact.hpp"
#include "../mean.hpp"
#include "../status.hpp"
#include "commit.hpp"

namespace commpact::host {

//! block[0, m) = A acc and block[m] = 0, or, when status holds status_nonfinite (acc is
//! not finite on this rank), block[0, m) = 0 and block[m] = 1.
template <class K>
void linear_encode(K& codec, std::span<const float> acc, std::span<float> block, std::span<const std::uint32_t> status) {
  const std::size_t m = block.size() - 1;
  if (status[0] & status_nonfinite) {
    std::fill(block.begin(), block.end(), 0.0f);
    block[m] = 1.0f;
    return;
  }
  codec.compress(acc, block.first(m));
  block[m] = 0.0f;
}

//! After the allreduce of the blocks: when the summed flag is 0, block[0, m) becomes the
//! mean mean_of(sum, P); when every mean is also finite, out = B (that mean) (out zeroed
//! first); else (some rank flagged its input, or finite inputs whose sum overflowed)
//! status |= status_nonfinite and out is untouched.
template <class K>
void linear_decode(const K& codec, std::span<float> block, std::span<float> out, int P,
                   std::span<std::uint32_t> status) {
  const std::size_t m = block.size() - 1;
  if (block[m] != 0.0f) {
    status[0] |= status_nonfinite;
    return;
  }
  bool finite = true;
  for (std::size_t j = 0; j < m; ++j) {
    block[j] = mean_of(block[j], P);
    finite = finite && std::isfinite(block[j]);
  }
  if (!finite) {
    status[0] |= status_nonfinite;
    return;
  }
  std::fill(out.begin(), out.end(), 0.0f);
  codec.decompress_add(std::span<const float>(block.first(m)), out);
}

//! Error feedback of a linear codec: acc -= B A acc, what this step delivered. A codec
//! with delivered() (B A a projection onto those indices) zeroes them; another one
//! computes approx = A acc (m floats) and dense = B approx (n floats) and subtracts.
template <class K>
void linear_feedback(K& codec, std::span<float> acc, std::span<float> approx, std::span<float> dense) {
  if constexpr (requires { codec.delivered(); }) {
    zero_delivered(acc, {}, codec.delivered(), {});
  } else {
    codec.compress(std::span<const float>(acc), approx);
    std::fill(dense.begin(), dense.end(), 0.0f);
    codec.decompress_add(std::span<const float>(approx), dense);
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] -= dense[i];
  }
}

//! One value of Signum's momentum: beta m + (1 - beta) g, each operation rounded on its
//! own (shared with the CUDA row, kernels/cuda/rows_cast_vote.cuh).
COMMPACT_HOST_DEVICE inline float signum_value(float beta, float m, float g) {
  return exact::add(exact::mul(beta, m), exact::mul(exact::sub(1.0f, beta), g));
}

//! Signum's momentum: next = beta m + (1 - beta) g, or g when m is empty (the first
//! step, or signSGD); status |= status_nonfinite when a value of next is not finite.
inline void signum_update(std::span<float> next, std::span<const float> m, std::span<const float> g, float beta,
                          std::span<std::uint32_t> status) {
  bool finite = true;
  if (m.empty()) {
    for (std::size_t i = 0; i < g.size(); ++i) next[i] = g[i];
  } else {
    for (std::size_t i = 0; i < g.size(); ++i) next[i] = signum_value(beta, m[i], g[i]);
  }
  for (float x : next) finite = finite && std::isfinite(x);
  if (!finite) status[0] |= status_nonfinite;
}

//! The bytes of a vote block: the frame header (frame::header_bytes), then sign_codec's
//! payload (a float32 scale, then the sign bits).
inline constexpr std::size_t vote_header_bytes = 48;

//! Whether one rank's vote block is well formed (shared with the CUDA row): the payload
//! length in the header (bytes 8..12, little-endian) is 4 + ceil(n / 8) and fits in
//! `avail` (the bytes from the payload to the end of all blocks), the scale is finite and
//! >= 0 (then written to `scale`), and no bit is set past n.
COMMPACT_HOST_DEVICE inline bool vote_block_valid(const unsigned char* blk, std::size_t avail, std::size_t n,
                                                  float& scale) {
  auto word = [](const unsigned char* p) {
    return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
           (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
  };
  const std::size_t payload = 4 + (n + 7) / 8;
  const unsigned char* msg = blk + vote_header_bytes;
  if (word(blk + 8) != payload || avail < payload) return false;
  const float s = exact::from_bits(word(msg));
  if (!exact::finite(s) || !(s >= 0.0f)) return false;
  if (n % 8 != 0 && (static_cast<unsigned>(msg[4 + n / 8]) >> (n % 8)) != 0u) return false;
  scale = s;
  return true;
}

//! One output of the vote: s when more ranks voted + than -, -s in the other case, 0 on a tie.
COMMPACT_HOST_DEVICE inline float vote_value(int votes, float s) { return votes > 0 ? s : (votes < 0 ? -s : 0.0f); }

//! The majority vote over P blocks of block_floats floats (frame header + sign_codec's
//! payload; the headers were checked by the host): first every block's payload is
//! validated (length 4 + ceil(n / 8), a finite scale >= 0, no bit set past n); a
//! malformed one sets status_wire and leaves out untouched. Else out[i] = s sign(sum_r
//! sign_r[i]) (a tie gives 0), s = the mean of the scales summed in double in rank order
//! when `scaled`, else 1.
inline void sign_vote(std::span<const float> blocks, std::size_t block_floats, bool scaled, std::span<float> out,
                      std::span<std::uint32_t> status) {
  constexpr std::size_t hb = vote_header_bytes;
  const std::size_t n = out.size();
  const std::size_t P = block_floats == 0 ? 0 : blocks.size() / block_floats;
  const auto bytes = std::as_bytes(blocks);
  const auto* base = reinterpret_cast<const unsigned char*>(bytes.data());
  auto msg = [&](std::size_t r) { return bytes.subspan(r * block_floats * 4 + hb); };
  double scales = 0.0;
  for (std::size_t r = 0; r < P; ++r) {  // validate every block before anything changes
    float s = 0.0f;
    if (!vote_block_valid(base + r * block_floats * 4, msg(r).size(), n, s)) {
      status[0] |= status_wire;
      return;
    }
    scales = exact::add(scales, static_cast<double>(s));
  }
  const float s = scaled ? static_cast<float>(scales / static_cast<double>(P)) : 1.0f;
  for (std::size_t b = 0; b < (n + 7) / 8; ++b) {  // 8 values at a time: no workspace
    int votes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (std::size_t r = 0; r < P; ++r) {
      const auto v = static_cast<unsigned>(msg(r)[4 + b]);
      for (unsigned j = 0; j < 8; ++j) votes[j] += ((v >> j) & 1u) ? -1 : 1;
    }
    for (std::size_t j = 0; j < 8 && 8 * b + j < n; ++j) out[8 * b + j] = vote_value(votes[j], s);
  }
}

}  // namespace commpact::host
