// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codecs.hpp
//! Codecs: what one rank turns its vector into, and back (the `Codec` concept in
//! concepts.hpp). A codec knows nothing of ranks; an aggregation (Allgather, the gossip
//! exchange) moves its messages and a compressor adds error feedback.
//!
//! | codec | message for a vector of n floats | delivered approximation |
//! |---|---|---|
//! | `topk_codec` | k int32 indices (strictly ascending), then k float32 values: 8k bytes | the k entries of largest magnitude (ties: smaller index) |
//! | `sign_codec` | float32 scale, then ceil(n/8) bytes of sign bits: 4 + ceil(n/8) bytes | scale * sign(v), scale = ||v||_1 / n (EF-SignSGD, CHOCO's sign; the sum in double in kernels/fixed_sum.hpp's shape, the device's order) |
//!
//! Every decoder validates the whole message before it adds anything and raises
//! commpact::wire_error on a malformed or hostile one (never reads or writes out of
//! bounds).
//!
//! A codec of your own models `Codec` with three members (see concepts.hpp):
//! `max_encoded_bytes(n)`, `encode(v, msg, approx) -> bytes` and `decode_add(msg, acc)`.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../../config.hpp"
#include "../../error.hpp"
#include "../../kernels/fixed_sum.hpp"
#include "../../kernels/formulas/sign.hpp"
#include "../../kernels/host/topk.hpp"
#include "sparse_options.hpp"

namespace commpact {

//! Top-k by magnitude with a fixed density or k, and an optional density warm-up
//! (begin_step). Indices are int32, so n < 2^31.
class topk_codec {
 public:
  //! Keeps clamp(floor(density * n), 1, n) entries (detail::k_of_density, the one rule).
  explicit topk_codec(double density = 0.01) { opt_.density = density, validate(); }
  //! Reads density, k and density_warmup of the options.
  //! `who` names the owner in error messages (TopK passes "TopK").
  explicit topk_codec(const sparse_options& o, const char* who = "topk_codec") : who_(who) {
    opt_.density = o.density;
    opt_.k = o.k;
    opt_.density_warmup = o.density_warmup;
    validate();
  }

  //! Copies take the options and the step; workspaces are not shared.
  topk_codec(const topk_codec& o) : who_(o.who_), opt_(o.opt_), step_(o.step_) {}
  topk_codec& operator=(const topk_codec& o) {
    who_ = o.who_, opt_ = o.opt_, step_ = o.step_;
    return *this;
  }
  topk_codec(topk_codec&&) noexcept = default;
  topk_codec& operator=(topk_codec&&) noexcept = default;

  //! The density warm-up's step (compressors call it before each step).
  void begin_step(std::int64_t step) { step_ = step; }
  //! k for a vector of n values at the current step.
  std::size_t k(std::size_t n) const { return static_cast<std::size_t>(detail::k_at(opt_, step_, static_cast<std::int64_t>(n))); }
  //! Why a vector of n values cannot be encoded (empty: it can).
  std::string check(std::size_t n) const {
    return detail::sparse_problem(who_, static_cast<std::int64_t>(n), static_cast<std::int64_t>(k(n)));
  }
  //! The value every rank must share (k), carried in an aggregation's frame header.
  std::int64_t agreement(std::size_t n) const { return static_cast<std::int64_t>(k(n)); }
  std::size_t max_encoded_bytes(std::size_t n) const { return 8 * k(n); }

  //! Selects the top-k of v into msg (8k bytes); writes the dense approximation into
  //! `approx` unless it is empty. Returns the bytes written.
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
    const std::size_t n = v.size(), kk = k(n);
    require(msg.size() >= 8 * kk, "commpact::topk_codec::encode: the message buffer holds ", msg.size(),
            " bytes; k = ", kk, " entries need ", 8 * kk, ".");
    idx_.resize(kk);
    val_.resize(kk);
    host::topk_abs(v, kk, std::span<std::int32_t>(idx_), std::span<float>(val_), ws_);
    if (kk) {
      std::memcpy(msg.data(), idx_.data(), 4 * kk);
      std::memcpy(msg.data() + 4 * kk, val_.data(), 4 * kk);
    }
    if (!approx.empty()) {
      std::fill(approx.begin(), approx.end(), 0.0f);
      for (std::size_t i = 0; i < kk; ++i) approx[static_cast<std::size_t>(idx_[i])] = val_[i];
    }
    return 8 * kk;
  }

  //! Validates msg (a multiple of 8 bytes, at most k entries, indices strictly ascending
  //! in [0, n), finite values), then adds its entries to acc (length n).
  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    const std::size_t n = acc.size();
    require<wire_error>(msg.size() % 8 == 0, "commpact::topk_codec: a message of ", msg.size(),
                        " bytes is not a whole number of 8-byte entries; it is truncated or corrupt.");
    const std::size_t c = msg.size() / 8;
    require<wire_error>(c <= k(n), "commpact::topk_codec: the message holds ", c, " entries, above k = ", k(n),
                        " for n = ", n, "; the sender uses another k or the message is corrupt.");
    const std::byte* pi = msg.data();
    const std::byte* pv = pi + 4 * c;
    std::int64_t prev = -1;
    for (std::size_t i = 0; i < c; ++i) {
      std::int32_t j;
      float v;
      std::memcpy(&j, pi + 4 * i, 4);
      std::memcpy(&v, pv + 4 * i, 4);
      require<wire_error>(detail::sparse_index_ok(j, prev, n), "commpact::topk_codec: entry ", i,
                          " has index ", j, "; indices must be strictly ascending and in [0, ", n, ").");
      require<wire_error>(detail::finite_bits(v), "commpact::topk_codec: entry ", i, " (index ", j,
                          ") has the non-finite value ", v, "; senders flag non-finite input instead of sending it.");
      prev = j;
    }
    for (std::size_t i = 0; i < c; ++i) {
      std::int32_t j;
      float v;
      std::memcpy(&j, pi + 4 * i, 4);
      std::memcpy(&v, pv + 4 * i, 4);
      acc[static_cast<std::size_t>(j)] += v;
    }
  }

  //! The indices the last encode() delivered (ascending).
  std::span<const std::int32_t> delivered() const { return idx_; }
  const sparse_options& options() const { return opt_; }

  //! Address and capacity of every buffer (allocation checks).
  template <class Out>
  void add_signature(Out& s) const {
    s.emplace_back(static_cast<const void*>(idx_.data()), idx_.capacity());
    s.emplace_back(static_cast<const void*>(val_.data()), val_.capacity());
    s.emplace_back(ws_.data(), ws_.capacity_bytes());
  }
  //! Sizes the buffers for the largest k of the schedule at length n.
  void reserve(std::size_t n) {
    const auto km = static_cast<std::size_t>(detail::k_max(opt_, static_cast<std::int64_t>(n)));
    idx_.reserve(km);
    val_.reserve(km);
  }

 private:
  void validate() const { detail::validate_sparse_options(opt_, who_); }

  const char* who_ = "topk_codec";
  sparse_options opt_;
  std::int64_t step_ = 0;
  std::vector<std::int32_t> idx_;
  std::vector<float> val_;
  host::topk_workspace ws_;
};

//! Scaled sign: q = (||v||_1 / n) sign(v), sign(0) = +1 (EF-SignSGD, CHOCO-SGD's sign).
struct sign_codec {
  std::size_t max_encoded_bytes(std::size_t n) const { return 4 + (n + 7) / 8; }

  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) const {
    const std::size_t n = v.size(), bytes = max_encoded_bytes(n);
    require(msg.size() >= bytes, "commpact::sign_codec::encode: the message buffer holds ", msg.size(),
            " bytes; ", n, " values need ", bytes, ".");
    const double l1 = fixed_sum::host_sum<double>(n, detail::sign_l1_leaf{v.data()}, fixed_sum::add_double{});
    const float scale = detail::sign_scale(l1, n);
    std::memcpy(msg.data(), &scale, 4);
    for (std::size_t b = 0; 4 + b < bytes; ++b) msg[4 + b] = std::byte{detail::sign_byte(v.data(), n, b)};
    if (!approx.empty())
      for (std::size_t i = 0; i < n; ++i) approx[i] = detail::sign_value(detail::sign_negative(v[i]), scale);
    return bytes;
  }

  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    const std::size_t n = acc.size();
    require<wire_error>(msg.size() == max_encoded_bytes(n), "commpact::sign_codec: the message has ", msg.size(),
                        " bytes; a vector of ", n, " values needs ", max_encoded_bytes(n), ".");
    float scale;
    std::memcpy(&scale, msg.data(), 4);
    require<wire_error>(detail::sign_scale_ok(scale), "commpact::sign_codec: the message has scale ", scale,
                        "; a scale must be finite and >= 0.");
    if (n % 8)
      require<wire_error>(detail::sign_tail_ok(static_cast<unsigned>(msg[4 + n / 8]), n),
                          "commpact::sign_codec: the message sets sign bits past the ", n, " values.");
    for (std::size_t i = 0; i < n; ++i) {
      const bool neg = (static_cast<unsigned>(msg[4 + i / 8]) >> (i % 8)) & 1u;
      acc[i] += detail::sign_value(neg, scale);
    }
  }
};

}  // namespace commpact
