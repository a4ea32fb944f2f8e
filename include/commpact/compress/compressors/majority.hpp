// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file majority.hpp
//! signSGD with majority vote and Signum (Bernstein et al., ICML 2018 and ICLR 2019):
//! every rank sends the signs of its gradient (Signum: of its momentum), every rank
//! counts the votes and the update is the sign of their sum (a tie gives 0).
//!
//! \code
//! commpact::MajorityVote<commpact::MpiComm> vote{world};            // signSGD
//! commpact::MajorityVote<commpact::MpiComm> signum{world, {.momentum = 0.9f}};
//! vote.reduce(std::span(grad));   // grad = s * sign(sum_r sign(g_r)), the same bits on every rank
//! \endcode
//!
//! The votes move as bit vectors through Allgather<C>: each rank's block is the 48-byte
//! frame header of allgather.hpp, a float32 scale (the rank's ||m||_1 / n) and ceil(n / 8)
//! sign bytes (bit set: negative), so the bytes per rank per step are
//! (P - 1) (48 + 4 + ceil(n / 8) rounded up to 4): about (P - 1) n / 8. An allreduce of int8
//! vote counts would cost about 2 n bytes per rank (ring) whatever P, so bits win while
//! P - 1 < 16, the sizes data-parallel training of one model runs at; past that an
//! allreduce would be the better aggregation. s is the mean of the ranks' scales when
//! `scaled` (the default: the update keeps the gradient's size), else 1 (the paper's
//! sign, for a learning rate sized to it). No error feedback: the vote is the method.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../state.hpp"
#include "codec_compressor.hpp"
#include "../../nonfinite.hpp"
#include "../codecs/sparse_options.hpp"

namespace commpact {

struct majority_options {
  float momentum = 0.0f;  //!< Signum's beta: m = beta m + (1 - beta) g (m starts at the first g); 0 is signSGD
  bool scaled = true;     //!< the update's magnitude: the mean of ||m_r||_1 / n (true) or 1
  nonfinite on_nonfinite = nonfinite::raise;
};

template <class C>
class MajorityVote {
  static_assert(diagnose_communicator<C>());
  static_assert(std::is_same_v<comm_space_t<C>, host_space>,
                "commpact::MajorityVote runs on host memory (ThreadComm, MpiComm); it is not written over a space yet.");

 public:
  explicit MajorityVote(C comm, majority_options opt = {}) : agg_(std::move(comm)), opt_(opt) {
    require(opt.momentum >= 0.0f && opt.momentum < 1.0f, "commpact::MajorityVote: momentum = ", opt.momentum,
            " is outside [0, 1); Signum uses 0.9, signSGD 0.");
  }
  //! The payload of a vote for n values: the scale and the sign bits.
  static std::size_t payload_bytes(std::size_t n) { return 4 + (n + 7) / 8; }
  //! One rank's block: header and payload, rounded up to 4 bytes.
  static std::size_t block_bytes(std::size_t n) { return (frame::header_bytes + payload_bytes(n) + 3) / 4 * 4; }

  //! Replaces grad by s sign(sum of the ranks' signs). Returns false when the step was
  //! skipped (NaN/Inf under nonfinite::skip_step). A step that raises changes nothing.
  bool reduce(std::span<float> grad) {
    const int P = agg_.sources();
    const std::size_t n = grad.size();
    std::string problem;
    if (n == 0) problem = "commpact::MajorityVote::reduce: the gradient is empty; pass at least one entry.";
    else if (opt_.momentum > 0.0f && !m_.empty() && m_.size() != n)
      problem = detail::length_problem("MajorityVote", static_cast<std::int64_t>(n), static_cast<std::int64_t>(m_.size()));
    const std::size_t cap = block_bytes(n);
    if (!agreed_ || cap != cap_) agree(static_cast<std::int64_t>(n), cap, problem);

    frame::header h;
    h.n = static_cast<std::int64_t>(n);
    h.step = steps_;
    h.capacity = static_cast<std::int64_t>(cap_);
    auto block = std::as_writable_bytes(agg_.block(cap_));
    auto payload = block.subspan(frame::header_bytes);
    std::fill(payload.begin(), payload.end(), std::byte{0});
    bool finite = true;
    next_.assign(grad.begin(), grad.end());
    if (opt_.momentum > 0.0f && !m_.empty())
      for (std::size_t i = 0; i < n; ++i) next_[i] = opt_.momentum * m_[i] + (1.0f - opt_.momentum) * grad[i];
    for (float x : next_) finite = finite && std::isfinite(x);
    if (!problem.empty()) {
      h.flags = frame::rejected_input;
    } else if (!finite) {
      h.flags = frame::nonfinite_input;
    } else {
      double l1 = 0.0;
      for (float x : next_) l1 += std::abs(static_cast<double>(x));
      const auto scale = static_cast<float>(l1 / static_cast<double>(n));
      std::memcpy(payload.data(), &scale, 4);
      for (std::size_t i = 0; i < n; ++i)
        if (next_[i] < 0.0f) payload[4 + i / 8] |= std::byte{static_cast<unsigned char>(1u << (i % 8))};
      h.payload = static_cast<std::uint32_t>(payload_bytes(n));
    }
    frame::write(block, h);
    agg_.exchange();

    std::uint16_t flags = 0;
    for (int r = 0; r < P; ++r) {
      const auto hr = frame::read(std::as_bytes(agg_.received(r)), r);
      flags = static_cast<std::uint16_t>(flags | hr.flags);
      if (hr.n != h.n || hr.step != h.step || hr.capacity != h.capacity)
        throw mismatch_error(detail::cat("commpact::MajorityVote::reduce: rank ", r, " is at step ", hr.step, " with n = ",
                                         hr.n, ", this rank at step ", h.step, " with n = ", h.n,
                                         "; every rank must pass gradients of the same length at the same step."));
    }
    if (flags & frame::rejected_input) detail::raise_rejected("MajorityVote", problem, steps_);
    if (flags & frame::nonfinite_input) {
      detail::end_nonfinite_step(opt_.on_nonfinite, "MajorityVote::reduce", "gradient (or momentum) of some rank",
                                 static_cast<std::size_t>(-1), steps_, grad);
      ++steps_, ++skipped_;
      return false;
    }
    votes_.assign(n, 0);
    double scales = 0.0;
    for (int r = 0; r < P; ++r) {  // validate every block before anything changes
      const auto blk = std::as_bytes(agg_.received(r));
      const auto hr = frame::read(blk, r);
      const auto msg = blk.subspan(frame::header_bytes, hr.payload);
      require<wire_error>(msg.size() == payload_bytes(n), "commpact::MajorityVote: rank ", r, "'s vote has ",
                          msg.size(), " bytes; n = ", n, " needs ", payload_bytes(n), ".");
      float s;
      std::memcpy(&s, msg.data(), 4);
      require<wire_error>(std::isfinite(s) && s >= 0.0f, "commpact::MajorityVote: rank ", r, "'s vote has scale ", s,
                          "; a scale must be finite and >= 0.");
      require<wire_error>(n % 8 == 0 || (static_cast<unsigned>(msg[4 + n / 8]) >> (n % 8)) == 0u,
                          "commpact::MajorityVote: rank ", r, "'s vote sets bits past its ", n, " values.");
      scales += s;
      for (std::size_t i = 0; i < n; ++i) votes_[i] += ((static_cast<unsigned>(msg[4 + i / 8]) >> (i % 8)) & 1u) ? -1 : 1;
    }
    const float s = opt_.scaled ? static_cast<float>(scales / P) : 1.0f;
    for (std::size_t i = 0; i < n; ++i) grad[i] = votes_[i] > 0 ? s : (votes_[i] < 0 ? -s : 0.0f);
    if (opt_.momentum > 0.0f) m_.swap(next_);
    ++steps_;
    return true;
  }

  //! Saves the counters and Signum's momentum (state.hpp, kind "commpact.MajorityVote").
  void save_state(std::vector<std::byte>& out) const {
    state::writer w{out, "commpact.MajorityVote"};
    state::write_counters(w, steps_, skipped_);
    w.f32s(10, m_);
    w.finish();
  }
  void load_state(std::span<const std::byte> in) {
    state::reader r{in, "commpact.MajorityVote", "MajorityVote"};
    const auto [s, k] = state::read_counters(r);
    auto m = r.f32s(10);
    r.done();
    m_ = std::move(m), steps_ = s, skipped_ = k, agreed_ = false;
  }

  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_; }
  std::span<const float> momentum() const { return m_; }
  auto& comm() { return agg_.comm(); }

 private:
  void agree(std::int64_t n, std::size_t cap, const std::string& problem) {
    std::int64_t v[3] = {n, -n, problem.empty() ? 0 : 1};
    agg_.comm().allreduce(std::span<std::int64_t>(v, 3), reduce_op::max);
    if (v[2]) detail::raise_rejected("MajorityVote", problem, steps_);
    if (v[0] != -v[1])
      throw mismatch_error(detail::cat("commpact::MajorityVote::reduce: ranks disagree on the gradient length: this rank "
                                       "has n = ", n, ", the lengths range over [", -v[1], ", ", v[0],
                                       "]; every rank must pass gradients of the same length."));
    cap_ = cap, agreed_ = true;
  }

  Allgather<C> agg_;
  majority_options opt_;
  std::vector<float> m_, next_;
  std::vector<int> votes_;
  bool agreed_ = false;
  std::size_t cap_ = 0;
  std::int64_t steps_ = 0, skipped_ = 0;
};

}  // namespace commpact
