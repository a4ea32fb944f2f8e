// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file quantizers.hpp
//! Quantising codecs (the `Codec` concept, concepts.hpp). Each composes with
//! `CodecCompressor<codec, Allgather<C>>` (error feedback included) and GossipMixer.
//!
//! | codec | paper | message for n floats | delivered value of v_i |
//! |---|---|---|---|
//! | `qsgd_codec{s, seed, d}` | Alistarh et al., NeurIPS 2017 | ceil(n/d) f32 bucket norms, n fields of 1 + bit_width(s) bits: 4 ceil(n/d) + ceil(n (1 + bit_width(s)) / 8) | ||v_B||_2 sign(v_i) l_i / s per bucket B of d = 512 values, l_i stochastically rounded, unbiased |
//! | `terngrad_codec{seed}` | Wen et al., NeurIPS 2017 | f32 max, n 2-bit fields: 4 + ceil(n / 4) | max|v| sign(v_i) b_i, b_i ~ Bernoulli(|v_i| / max|v|), unbiased |
//! | `onebit_codec` | Seide et al., Interspeech 2014 | f32 mean of the v_i >= 0, f32 mean of the v_i < 0, n sign bits: 8 + ceil(n / 8) | the mean of v_i's side (use with error feedback) |
//! | `natural_codec{seed}` | Horvath et al., 2019 | n 9-bit fields (sign, exponent): ceil(9 n / 8) | a neighbouring power of two, stochastically, unbiased (casts.hpp) |
//! | `fp16_codec`, `bf16_codec` | IEEE 754 half, bfloat16 | 2n | round to nearest even, saturated at the largest finite value (casts.hpp) |
//! | `sign_codec` (codecs.hpp) | EF-SignSGD, Karimireddy et al., ICML 2019 | 4 + ceil(n / 8) | ||v||_1 / n sign(v_i) |
//!
//! Fields are packed by kernels/formulas/bits.hpp (little-endian bit stream, zero
//! padding); the per-element formulas are kernels/formulas/quantizers.hpp's, shared with
//! the device kernels. Stochastic rounding draws `random_stream{seed, step,
//! rank}.uniform(i)` for element i: the step comes from `begin_step` and the rank from
//! `bind_rank` (CodecCompressor calls both), so a run is reproducible and ranks draw
//! independent streams. Every decoder checks
//! the exact length, every header value and every field before it adds anything, and
//! raises commpact::wire_error on a malformed message.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

#include "../../config.hpp"
#include "../../detail/hash.hpp"
#include "../../error.hpp"
#include "../../kernels/exact.hpp"
#include "../../kernels/fixed_sum.hpp"
#include "../../kernels/formulas/bits.hpp"
#include "../../kernels/formulas/quantizers.hpp"
#include "casts.hpp"

namespace commpact {

namespace detail {
inline void check_length(const char* who, std::span<const std::byte> msg, std::size_t want, std::size_t n) {
  require<wire_error>(msg.size() == want, "commpact::", who, ": the message has ", msg.size(),
                      " bytes; a vector of ", n, " values needs exactly ", want,
                      "; the sender uses other options or the message is truncated or corrupt.");
}
inline void check_capacity(const char* who, std::span<std::byte> msg, std::size_t want, std::size_t n) {
  require(msg.size() >= want, "commpact::", who, "::encode: the message buffer holds ", msg.size(), " bytes; ", n,
          " values need ", want, " (size it with max_encoded_bytes(n)).");
}
inline float read_f32(const std::byte* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
//! A float's magnitude as the finite float scale of a message (saturated).
inline float finite_scale(double x) {
  return static_cast<float>(std::min(x, static_cast<double>(std::numeric_limits<float>::max())));
}
}  // namespace detail

//! QSGD with s levels, per bucket of d values (the paper's bucketing; d = 0: one bucket):
//! q_i = ||v_B||_2 sign(v_i) l_i / s, l_i = floor(r) or floor(r) + 1 with probability
//! r - floor(r), r = |v_i| s / ||v_B||_2, B the bucket of i. Message: ceil(n / d) f32 norms,
//! then n fields: l_i in the low bit_width(s) bits, the sign (1: negative; 0 when l_i = 0)
//! above them.
class qsgd_codec {
 public:
  static constexpr std::uint32_t max_levels = 65535;
  //! s levels (1 <= s <= 65535), the seed of the stochastic rounding, the bucket size d.
  explicit qsgd_codec(std::uint32_t levels = 256, std::uint64_t seed = 0, std::size_t bucket = 512)
      : s_(levels), seed_(seed), d_(bucket) {
    require(levels >= 1 && levels <= max_levels, "commpact::qsgd_codec: levels = ", levels,
            " is outside [1, ", max_levels, "]; QSGD needs at least one level (s = 1 is ternary).");
  }
  void begin_step(std::int64_t step) { step_ = step; }
  void bind_rank(int rank) { rank_ = rank; }
  //! What every rank must share to decode the others' messages: a hash (62 bits) of the
  //! levels and the bucket size for length n (two bucket sizes with as many buckets give
  //! messages of one size, each decoded with the reader's own bucket bounds).
  std::int64_t agreement(std::size_t n) const {
    const std::int64_t w[] = {static_cast<std::int64_t>(s_), static_cast<std::int64_t>(bucket(n))};
    return detail::hash_words(w);
  }
  std::uint32_t levels() const { return s_; }
  //! Values per bucket (n for d = 0).
  std::size_t bucket(std::size_t n) const { return d_ ? d_ : std::max<std::size_t>(n, 1); }
  std::size_t buckets(std::size_t n) const { return (n + bucket(n) - 1) / bucket(n); }
  //! Bits of one field: sign and level.
  unsigned field_bits() const { return 1 + static_cast<unsigned>(std::bit_width(s_)); }
  std::size_t max_encoded_bytes(std::size_t n) const { return 4 * buckets(n) + detail::packed_bytes(n, field_bits()); }

  //! The value a receiver decodes for level l (sign apart) under norm `norm`.
  float value(float norm, std::uint32_t l) const { return detail::qsgd_value(norm, l, s_); }
  //! The random stream of the current step and rank (the CUDA kernels replay it).
  random_stream stream() const { return random_stream(seed_, step_, rank_); }

  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) const {
    const std::size_t n = v.size(), bytes = max_encoded_bytes(n), d = bucket(n), nb = buckets(n);
    detail::check_capacity("qsgd_codec", msg, bytes, n);
    const random_stream rng(seed_, step_, rank_);
    const unsigned bw = field_bits() - 1;
    detail::bit_writer w(msg.data() + 4 * nb);
    for (std::size_t b = 0; b < nb; ++b) {
      const std::size_t lo = b * d, hi = std::min(n, lo + d);
      const double ss = fixed_sum::host_sum<double>(hi - lo, detail::qsgd_sq_leaf{v.data() + lo},
                                                    fixed_sum::add_double{}, fixed_sum::levels(d));
      const float norm = detail::qsgd_norm(ss);
      std::memcpy(msg.data() + 4 * b, &norm, 4);
      const double scale = detail::qsgd_scale(norm, s_);
      for (std::size_t i = lo; i < hi; ++i) {
        const std::uint32_t l = detail::qsgd_level(v[i], scale, s_, rng.uniform(i));
        const bool neg = l > 0 && v[i] < 0.0f;
        w.put(l | (static_cast<std::uint32_t>(neg) << bw), bw + 1);
        if (!approx.empty()) approx[i] = neg ? -value(norm, l) : value(norm, l);
      }
    }
    w.flush();
    return bytes;
  }

  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    const std::size_t n = acc.size(), d = bucket(n), nb = buckets(n);
    detail::check_length("qsgd_codec", msg, max_encoded_bytes(n), n);
    for (std::size_t b = 0; b < nb; ++b) {
      const float norm = detail::read_f32(msg.data() + 4 * b);
      require<wire_error>(std::isfinite(norm) && norm >= 0.0f, "commpact::qsgd_codec: bucket ", b, " has norm ", norm,
                          "; a norm must be finite and >= 0.");
    }
    const unsigned bw = field_bits() - 1;
    const std::uint32_t lmask = (1u << bw) - 1;
    detail::bit_reader check(msg.data() + 4 * nb);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t f = check.get(bw + 1), l = f & lmask;
      if (l > s_ || (l == 0 && f != 0))
        throw wire_error(detail::cat("commpact::qsgd_codec: field ", i, " holds level ", l, " with sign bit ", f >> bw,
                                     "; levels are in [0, ", s_, "] and level 0 carries no sign."));
    }
    require<wire_error>(detail::padding_is_zero(msg.subspan(4 * nb), n, bw + 1),
                        "commpact::qsgd_codec: the message sets bits past its ", n, " fields.");
    detail::bit_reader r(msg.data() + 4 * nb);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t f = r.get(bw + 1), l = f & lmask;
      if (l) {
        const float q = value(detail::read_f32(msg.data() + 4 * (i / d)), l);
        acc[i] += (f >> bw) ? -q : q;
      }
    }
  }

 private:
  std::uint32_t s_;
  std::uint64_t seed_;
  std::size_t d_;
  std::int64_t step_ = 0;
  int rank_ = 0;
};

//! TernGrad: q_i = m sign(v_i) b_i, m = max |v|, b_i = 1 with probability |v_i| / m.
//! Field i (2 bits): 0 zero, 1 +m, 2 -m (3 is malformed).
class terngrad_codec {
 public:
  explicit terngrad_codec(std::uint64_t seed = 0) : seed_(seed) {}
  void begin_step(std::int64_t step) { step_ = step; }
  void bind_rank(int rank) { rank_ = rank; }
  std::size_t max_encoded_bytes(std::size_t n) const { return 4 + detail::packed_bytes(n, 2); }
  //! The random stream of the current step and rank (the CUDA kernels replay it).
  random_stream stream() const { return random_stream(seed_, step_, rank_); }

  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) const {
    const std::size_t n = v.size(), bytes = max_encoded_bytes(n);
    detail::check_capacity("terngrad_codec", msg, bytes, n);
    float m = 0.0f;
    for (float x : v) m = detail::terngrad_max(m, x);
    std::memcpy(msg.data(), &m, 4);
    const random_stream rng(seed_, step_, rank_);
    detail::bit_writer w(msg.data() + 4);
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned f = detail::terngrad_field(v[i], m, rng.uniform(i));
      w.put(f, 2);
      if (!approx.empty()) approx[i] = detail::terngrad_value(f, m);
    }
    w.flush();
    return bytes;
  }

  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    const std::size_t n = acc.size();
    detail::check_length("terngrad_codec", msg, max_encoded_bytes(n), n);
    const float m = detail::read_f32(msg.data());
    require<wire_error>(std::isfinite(m) && m >= 0.0f, "commpact::terngrad_codec: the message has scale ", m,
                        "; a scale must be finite and >= 0.");
    detail::bit_reader check(msg.data() + 4);
    for (std::size_t i = 0; i < n; ++i)
      if (check.get(2) == 3u)
        throw wire_error(detail::cat("commpact::terngrad_codec: field ", i,
                                     " holds 3; a ternary field is 0 (zero), 1 (+) or 2 (-)."));
    require<wire_error>(detail::padding_is_zero(msg.subspan(4), n, 2), "commpact::terngrad_codec: the message sets "
                        "bits past its ", n, " fields.");
    detail::bit_reader r(msg.data() + 4);
    for (std::size_t i = 0; i < n; ++i) {
      const auto f = r.get(2);
      if (f) acc[i] += detail::terngrad_value(f, m);
    }
  }

 private:
  std::uint64_t seed_;
  std::int64_t step_ = 0;
  int rank_ = 0;
};

//! 1-bit SGD: one bit per value (set: v_i < 0); the receiver reconstructs the mean of
//! the entries on v_i's side (a >= 0, b <= 0). Biased: use it with error feedback. The
//! sums run in kernels/fixed_sum.hpp's shape (the device's order).
struct onebit_codec {
  std::size_t max_encoded_bytes(std::size_t n) const { return 8 + (n + 7) / 8; }

  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) const {
    const std::size_t n = v.size(), bytes = max_encoded_bytes(n);
    detail::check_capacity("onebit_codec", msg, bytes, n);
    const auto s = fixed_sum::host_sum<detail::onebit_sums>(n, detail::onebit_leaf{v.data()}, detail::onebit_add{});
    float a, b;
    detail::onebit_means(s, n, &a, &b);
    std::memcpy(msg.data(), &a, 4);
    std::memcpy(msg.data() + 4, &b, 4);
    for (std::size_t j = 0; 8 + j < bytes; ++j) msg[8 + j] = std::byte{detail::onebit_byte(v.data(), n, j)};
    if (!approx.empty())
      for (std::size_t i = 0; i < n; ++i) approx[i] = detail::onebit_negative(v[i]) ? b : a;
    return bytes;
  }

  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    const std::size_t n = acc.size();
    detail::check_length("onebit_codec", msg, max_encoded_bytes(n), n);
    const float a = detail::read_f32(msg.data()), b = detail::read_f32(msg.data() + 4);
    require<wire_error>(detail::onebit_means_ok(a, b), "commpact::onebit_codec: the message has reconstruction values ",
                        a, " and ", b, "; they must be finite, the first >= 0 and the second <= 0.");
    require<wire_error>(detail::padding_is_zero(msg.subspan(8), n, 1), "commpact::onebit_codec: the message sets "
                        "bits past its ", n, " values.");
    for (std::size_t i = 0; i < n; ++i)
      acc[i] += ((static_cast<unsigned>(msg[8 + i / 8]) >> (i % 8)) & 1u) ? b : a;
  }
};

}  // namespace commpact
