// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file topk.hpp
//! TopK<Comm>: Top-k S-SGD with error feedback, the composition
//! CodecCompressor<topk_codec, Allgather<Comm>>. Each rank selects the k entries of
//! largest |g + residual| (ties: the smaller index), all ranks all-gather every rank's
//! set, add the sets in rank order and divide by P. What a rank did not send stays in its
//! residual. Traffic per rank per step: (P - 1) * (48 + 8k) bytes by the ring
//! allgather, O(kP).
//!
//! \code
//! commpact::TopK<commpact::ThreadComm> topk{comm, {.density = 0.01}};
//! topk.reduce(std::span(grad));   // grad = (1/P) sum_r topk_r(grad_r + residual_r), identical on every rank
//! \endcode
//!
//! sparse_options adds a density warm-up, DGC momentum correction and local gradient
//! clipping, and the non-finite policy (see sparse_options.hpp).

#include <cstdint>
#include <utility>

#include "codec_compressor.hpp"
#include "../codecs/topk_sign.hpp"
#include "../codecs/sparse_options.hpp"

namespace commpact {

template <class Comm>
class TopK : public CodecCompressor<topk_codec, Allgather<Comm>> {
  using base = CodecCompressor<topk_codec, Allgather<Comm>>;

 public:
  using options = sparse_options;

  explicit TopK(Comm comm, options opt = {})
      : base(std::move(comm), topk_codec{opt, "TopK"}, codec_options{opt.momentum, opt.clip_norm, opt.on_nonfinite},
             "TopK"),
        sopt_(std::move(opt)) {}

  //! k of the last agreed step.
  std::int64_t k() const { return this->block_bytes() < 48 ? 0 : static_cast<std::int64_t>(this->block_bytes() - 48) / 8; }
  const options& opts() const { return sopt_; }

 private:
  options sopt_;
};

}  // namespace commpact
