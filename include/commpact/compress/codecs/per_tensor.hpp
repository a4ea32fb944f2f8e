// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file per_tensor.hpp
//! `per_tensor<K>`: any Codec applied to each tensor of a layout on its own (its own
//! scale, its own k from the density), inside one message, as GRACE and PyTorch's
//! per-tensor hooks do. It is itself a Codec, so one frame per rank and one collective
//! per step still carry the whole model:
//!
//! <!-- snippet: using C=commpact::ThreadComm -->
//! \code
//! commpact::tensor_layout layout = {{128, 784}, {1, 128}, {10, 128}, {1, 10}};
//! commpact::CodecCompressor<commpact::per_tensor<commpact::sign_codec>, commpact::Allgather<C>> ef_sign{
//!     comm, commpact::per_tensor{layout, commpact::sign_codec{}}};
//! \endcode
//!
//! Why: a scale (sign's mean |v|, TernGrad's max, 1-bit's means, QSGD's norm) taken over
//! the flat vector of a whole model mixes layers of very different magnitudes. With
//! two layers of gradient scales 1 and 1e-3, EF-SignSGD over the flat vector sends the
//! small layer about 400 times its own size; scaled per tensor, about 0.6 of it.
//! `split_rows(layout)` refines a layout to one tensor per matrix row (a scale per output
//! unit), which the Fashion-MNIST demo uses for EF-SignSGD, TernGrad and 1-bit SGD.
//!
//! Wire (for a vector of n = the layout's total): for each tensor t in layout order, a
//! u32 length L_t (little-endian, as the host writes it) then tensor t's message of
//! L_t bytes, as K encodes the segment [offset_t, offset_t + numel_t). Nothing else:
//! no padding, no trailing bytes. max_encoded_bytes = sum_t (4 + K::max_encoded_bytes(numel_t)).
//!
//! Each tensor has its own copy of the prototype K, so codecs with per-step state
//! (random streams, a density warm-up, top-k's delivered indices) work. The optional
//! Codec members are forwarded: begin_step to every tensor; bind_rank(rank) binds
//! tensor t to stream `stream_id(rank, t, tensors())` = rank * tensors() + t (distinct
//! for every rank and tensor, deterministic; with one tensor it is the rank itself, so
//! a one-tensor layout gives K's own bits); check(n) (n must equal the layout's total,
//! then every tensor's check); agreement(n) (a hash of the layout and every tensor's
//! agreement value, so ranks with other layouts or options disagree); delivered() when
//! K has it (every tensor's indices offset into the flat vector, ascending).
//!
//! decode_add validates the framing of the whole message (every length against the
//! bytes that remain and against K's max for that tensor, no trailing bytes) before it
//! writes anything; a tensor whose own message K rejects after earlier tensors were
//! added is undone (earlier segments are restored from a copy taken before decoding),
//! so a malformed message leaves acc untouched. That copy lives in the object: use one
//! per_tensor per thread (CodecCompressor holds its own).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../detail/hash.hpp"
#include "topk_sign.hpp"
#include "tensor_layout.hpp"

namespace commpact {

//! The layout with every matrix split into its rows (`{r, c}` with r, c > 1 becomes r
//! tensors `{1, c}`; vectors stay whole), for a scale per row: per_tensor{split_rows(l), K}
//! gives each output unit's weights their own scale (1-bit SGD's paper quantises per matrix column).
//! Each row then costs 4 bytes of length and K's header (a scale) on the wire.
inline tensor_layout split_rows(const tensor_layout& l) {
  detail::check_layout(l, "commpact::split_rows");
  tensor_layout out;
  for (const auto& s : l) {
    if (s.is_vector()) out.push_back(s);
    else out.insert(out.end(), static_cast<std::size_t>(s.rows), tensor_shape{1, s.cols});
  }
  return out;
}

//! K applied tensor by tensor over a tensor_layout; a Codec itself (see the file comment).
template <class K>
class per_tensor {
  static_assert(diagnose_codec<K>());
  static_assert(std::copy_constructible<K>,
                "commpact::per_tensor<K>: K must be copy-constructible; every tensor gets its own copy of the "
                "prototype.");

 public:
  using codec_type = K;
  //! Bytes of the length that precedes each tensor's message.
  static constexpr std::size_t length_bytes = 4;

  //! One copy of `prototype` per tensor of `layout`. Raises invalid_argument on an empty
  //! or malformed layout (check_layout), or, for a codec with delivered() (int32
  //! indices), when the layout holds 2^31 values or more.
  explicit per_tensor(tensor_layout layout, const K& prototype = K{}) : layout_(std::move(layout)) {
    const std::int64_t total = detail::check_layout(layout_, "commpact::per_tensor");
    if constexpr (req::codec_has_delivered<K>)
      require(total <= std::numeric_limits<std::int32_t>::max(), "commpact::per_tensor: the layout holds ", total,
              " values; a codec with int32 indices (delivered()) needs fewer than 2^31; split the model into "
              "buckets (Bucketed) of per_tensor codecs.");
    offset_.reserve(layout_.size() + 1);
    offset_.push_back(0);
    for (const auto& s : layout_) offset_.push_back(offset_.back() + static_cast<std::size_t>(s.numel()));
    codecs_.assign(layout_.size(), prototype);
  }

  const tensor_layout& layout() const { return layout_; }
  std::size_t tensors() const { return layout_.size(); }
  //! The layout's total: the only n this codec encodes.
  std::size_t size() const { return offset_.back(); }
  //! Where tensor t starts in the flat vector, and its length.
  std::size_t offset(std::size_t t) const { return offset_[t]; }
  std::size_t numel(std::size_t t) const { return offset_[t + 1] - offset_[t]; }
  //! Tensor t's codec.
  K& codec(std::size_t t) { return codecs_[t]; }
  const K& codec(std::size_t t) const { return codecs_[t]; }

  //! The stream tensor t of rank `rank` is bound to: rank * tensors + t (as an int,
  //! modulo 2^32 as random_stream reads it; distinct while ranks * tensors < 2^32).
  static int stream_id(int rank, std::size_t t, std::size_t tensors) {
    const auto id = static_cast<std::uint64_t>(static_cast<std::int64_t>(rank)) * tensors + t;
    return static_cast<int>(static_cast<std::uint32_t>(id));
  }

  //! Forwards the step to every tensor's codec (schedules, random streams).
  void begin_step(std::int64_t step) {
    if constexpr (req::codec_has_begin_step<K>)
      for (auto& k : codecs_) k.begin_step(step);
  }
  //! Binds tensor t's codec to stream_id(rank, t, tensors()).
  void bind_rank(int rank) {
    if constexpr (req::codec_has_bind_rank<K>)
      for (std::size_t t = 0; t < codecs_.size(); ++t) codecs_[t].bind_rank(stream_id(rank, t, codecs_.size()));
  }

  //! Why a vector of n values cannot be encoded (empty: it can): n must be the layout's
  //! total, and every tensor must pass K's own check.
  std::string check(std::size_t n) const {
    if (n != size())
      return detail::cat("commpact::per_tensor: the vector has n = ", n, " values but the layout of ", tensors(),
                         " tensors holds ", size(), "; pass the layout of this gradient (or bucket).");
    for (std::size_t t = 0; t < codecs_.size(); ++t) {
      if constexpr (req::codec_has_check<K>) {
        std::string why(codecs_[t].check(numel(t)));
        if (!why.empty())
          return detail::cat("commpact::per_tensor: tensor ", t, " (", layout_[t].rows, " x ", layout_[t].cols,
                             "): ", why);
      }
      const std::size_t m = codecs_[t].max_encoded_bytes(numel(t));
      if (m > std::numeric_limits<std::uint32_t>::max())
        return detail::cat("commpact::per_tensor: tensor ", t, "'s message may take ", m,
                           " bytes, more than its u32 length can state; split the tensor.");
    }
    return {};
  }

  //! A value ranks that agree share: a hash (62 bits) of the layout and of every
  //! tensor's agreement value (when K has one).
  std::int64_t agreement(std::size_t) const {
    std::uint64_t h = detail::fnv_offset;
    auto word = [&h](std::int64_t x) {
      const auto u = static_cast<std::uint64_t>(x);
      for (int b = 0; b < 8; ++b) h = (h ^ ((u >> (8 * b)) & 0xffu)) * detail::fnv_prime;
    };
    word(static_cast<std::int64_t>(layout_.size()));
    for (std::size_t t = 0; t < codecs_.size(); ++t) {
      word(layout_[t].rows);
      word(layout_[t].cols);
      if constexpr (req::codec_has_agreement<K>) word(codecs_[t].agreement(numel(t)));
    }
    return static_cast<std::int64_t>(h & ((1ull << 62) - 1));
  }

  //! sum_t (4 + K::max_encoded_bytes(numel_t)), for the layout's total (check(n) rejects other n).
  std::size_t max_encoded_bytes(std::size_t = 0) const {
    std::size_t b = 0;
    for (std::size_t t = 0; t < codecs_.size(); ++t) b += length_bytes + codecs_[t].max_encoded_bytes(numel(t));
    return b;
  }

  //! Encodes each tensor's segment of v with its codec behind its u32 length; writes each
  //! segment of `approx` (unless empty). Returns the bytes written.
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
    require(v.size() == size(), "commpact::per_tensor::encode: the vector has ", v.size(),
            " values but the layout holds ", size(), "; pass the layout of this gradient.");
    require(approx.empty() || approx.size() == v.size(), "commpact::per_tensor::encode: approx has ", approx.size(),
            " values for a vector of ", v.size(), "; pass an empty span or one of the vector's length.");
    const std::size_t cap = max_encoded_bytes(v.size());
    require(msg.size() >= cap, "commpact::per_tensor::encode: the message buffer holds ", msg.size(), " bytes; ",
            tensors(), " tensors of ", v.size(), " values need ", cap, " (size it with max_encoded_bytes(n)).");
    std::size_t at = 0;
    for (std::size_t t = 0; t < codecs_.size(); ++t) {
      const std::size_t o = offset(t), m = numel(t), mt = codecs_[t].max_encoded_bytes(m);
      const std::size_t len = codecs_[t].encode(v.subspan(o, m), msg.subspan(at + length_bytes, mt),
                                                approx.empty() ? approx : approx.subspan(o, m));
      require(len <= mt, "commpact::per_tensor::encode: tensor ", t, "'s codec wrote ", len,
              " bytes, above its max_encoded_bytes(", m, ") = ", mt, "; fix the codec's max_encoded_bytes().");
      const auto len32 = static_cast<std::uint32_t>(len);
      std::memcpy(msg.data() + at, &len32, length_bytes);
      at += length_bytes + len;
    }
    if constexpr (req::codec_has_delivered<K>) {
      delivered_.clear();
      for (std::size_t t = 0; t < codecs_.size(); ++t) {
        const auto o = static_cast<std::int32_t>(offset(t));
        for (std::int32_t i : std::span<const std::int32_t>(codecs_[t].delivered())) delivered_.push_back(i + o);
      }
    }
    return at;
  }

  //! Validates the framing (every u32 length within the remaining bytes and within K's
  //! max for its tensor, no trailing bytes; raises wire_error), then decodes each
  //! tensor's message into its segment of acc. A tensor's message that K rejects
  //! undoes the tensors added before it: acc is unchanged when this raises.
  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    require(acc.size() == size(), "commpact::per_tensor::decode_add: acc has ", acc.size(),
            " values but the layout holds ", size(), "; pass the layout of this gradient.");
    std::size_t at = 0;
    for (std::size_t t = 0; t < codecs_.size(); ++t) {
      const std::size_t left = msg.size() - at;
      require<wire_error>(left >= length_bytes, "commpact::per_tensor: the message of ", msg.size(),
                          " bytes ends before tensor ", t, "'s length (", tensors(),
                          " tensors); it is truncated, or the sender uses another layout.");
      const std::size_t len = read_length(msg, at), mt = codecs_[t].max_encoded_bytes(numel(t));
      require<wire_error>(len <= left - length_bytes, "commpact::per_tensor: tensor ", t, "'s length is ", len,
                          " bytes but only ", left - length_bytes,
                          " remain in the message; it is truncated or corrupt.");
      require<wire_error>(len <= mt, "commpact::per_tensor: tensor ", t, " (", numel(t), " values) has a ", len,
                          "-byte message, above its codec's max_encoded_bytes = ", mt,
                          "; the sender uses another layout or options, or the message is corrupt.");
      at += length_bytes + len;
    }
    require<wire_error>(at == msg.size(), "commpact::per_tensor: the message has ", msg.size() - at,
                        " bytes after the last of its ", tensors(), " tensors; it is corrupt or from another layout.");

    const std::size_t T = codecs_.size();
    if (T > 1) backup_.resize(offset(T - 1));  // every segment but the last (grows once)
    at = 0;
    std::size_t t = 0;
    try {
      for (; t < T; ++t) {
        const std::size_t o = offset(t), m = numel(t), len = read_length(msg, at);
        if (t + 1 < T) std::copy_n(acc.data() + o, m, backup_.data() + o);
        codecs_[t].decode_add(msg.subspan(at + length_bytes, len), acc.subspan(o, m));
        at += length_bytes + len;
      }
    } catch (...) {
      const std::size_t restored = std::min(t + 1, T - 1);  // the segments copied so far
      std::copy_n(backup_.data(), offset(restored), acc.data());
      throw;
    }
  }

  //! The flat indices every tensor's codec delivered in the last encode(), ascending.
  std::span<const std::int32_t> delivered() const
    requires req::codec_has_delivered<K>
  {
    return delivered_;
  }

  //! Sizes every tensor's buffers for its largest message (when K has reserve(n)).
  void reserve(std::size_t = 0)
    requires requires(K& k, std::size_t m) { k.reserve(m); }
  {
    for (std::size_t t = 0; t < codecs_.size(); ++t) codecs_[t].reserve(numel(t));
  }

  //! Address and capacity of every buffer (allocation checks).
  template <class Out>
  void add_signature(Out& s) const {
    s.emplace_back(static_cast<const void*>(delivered_.data()), delivered_.capacity());
    s.emplace_back(static_cast<const void*>(backup_.data()), backup_.capacity());
    if constexpr (requires(const K& k) { k.add_signature(s); })
      for (const auto& k : codecs_) k.add_signature(s);
  }

 private:
  static std::size_t read_length(std::span<const std::byte> msg, std::size_t at) {
    std::uint32_t len;
    std::memcpy(&len, msg.data() + at, length_bytes);
    return len;
  }

  tensor_layout layout_;
  std::vector<std::size_t> offset_;  // tensors() + 1 entries
  std::vector<K> codecs_;
  std::vector<std::int32_t> delivered_;
  mutable std::vector<float> backup_;  // decode_add's undo copy
};

static_assert(Codec<per_tensor<sign_codec>>);
static_assert(req::codec_has_delivered<per_tensor<topk_codec>> && !req::codec_has_delivered<per_tensor<sign_codec>>);
static_assert(req::codec_has_check<per_tensor<sign_codec>> && req::codec_has_agreement<per_tensor<sign_codec>>);

}  // namespace commpact
