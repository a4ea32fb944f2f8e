// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file oktopk.hpp
//! Ok-Topk (Li and Hoefler, PPoPP 2022): a sparse allreduce whose bytes per rank stay
//! about 2k (P - 1)/P entries whatever P, over any PointToPoint communicator.
//!
//! \code
//! commpact::OkTopK<commpact::MpiComm> ok{world, {.density = 0.01}};
//! ok.reduce(std::span(grad));   // the same sparse average on every rank, error feedback kept
//! \endcode
//!
//! Per step, every rank: acc = g + residual; its local top-k of acc (exact, host::topk_abs);
//! - sparse reduce-scatter: the index space is cut into P contiguous regions; each rank
//!   sends the entries of region j to rank j, which sums what it receives in rank order;
//! - global selection: region owners keep the summed entries with |sum| >= theta, at most
//!   c = ceil(2k / P) each (the largest; the regions are balanced, so the global top-k
//!   is spread about evenly). theta is re-estimated every `period` steps (and at the
//!   first): every owner allgathers its c largest |sum| (c floats) and theta is the k-th
//!   largest of them all, so about k entries pass over all regions;
//! - allgather of the selected entries by a ring of P - 1 point-to-point rounds;
//! - output: the selected sums / P; the residual clears the local entries that were
//!   selected globally; the regions are rebalanced so that each held as many of this
//!   step's selected entries (the previous step's distribution sets the next split).
//!
//! Messages: reduce-scatter: a 40-byte header (u32 magic "CPOK", u32 flags: bit 0
//! non-finite input, bit 1 rejected input; u64 count; i64 n, k, step), then count int32
//! indices (ascending, in the receiver's region) and count float32 values. Allgather
//! blocks: u32 origin rank, u32 count, count int32 indices (ascending, in the origin's
//! region) and count float32 values. Bytes per rank per step: sum over peers j of
//! (40 + 8 c_j) (c_j: this rank's local entries in region j) plus (P - 1) 8 + 8 (the
//! selected entries of every region except the next rank's), at most about 8k + 16k; plus
//! (P - 1) 4c (about 8k) on a threshold step: flat in P, where TopK's allgather is (P - 1) 8k. Every rank reads every peer's header in the reduce-scatter, so a
//! rejected or non-finite input anywhere raises (or skips) on every rank alike.
//! load_state restores the residual and the counters; the regions and theta restart.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../kernels/host/topk.hpp"
#include "../../state.hpp"
#include "../error_feedback.hpp"
#include "../../nonfinite.hpp"
#include "../codecs/sparse_options.hpp"

namespace commpact {

struct oktopk_options {
  double density = 0.01;       //!< k = clamp(floor(density n), 1, n): the one rule (sparse_options.hpp)
  std::int64_t period = 32;    //!< steps between threshold re-estimations
  nonfinite on_nonfinite = nonfinite::raise;
};

template <class C>
class OkTopK {
  static_assert(diagnose_point_to_point<C>());
  static constexpr std::uint32_t magic = 0x4B4F5043u;  // "CPOK"
  static constexpr std::size_t header = 40;

 public:
  explicit OkTopK(C comm, oktopk_options opt = {}) : comm_(std::move(comm)), opt_(opt) {
    require(opt.density > 0.0 && opt.density <= 1.0, "commpact::OkTopK: density = ", opt.density,
            " is outside (0, 1]; pass the fraction of entries to send, such as 0.01.");
    require(opt.period >= 1, "commpact::OkTopK: period = ", opt.period, " must be >= 1 (steps between re-estimations).");
  }
  //! What one region may select, and the magnitudes it contributes to theta: ceil(2k / P), at most k.
  static std::size_t region_cap(std::size_t kk, int P) {
    return std::min(kk, (2 * kk + static_cast<std::size_t>(P) - 1) / static_cast<std::size_t>(P));
  }
  std::size_t k(std::size_t n) const {
    return static_cast<std::size_t>(std::max<std::int64_t>(detail::k_of_density(opt_.density, static_cast<std::int64_t>(n)), 1));
  }

  bool reduce(std::span<float> grad) {
    const int P = comm_.size(), me = comm_.rank();
    const std::size_t n = grad.size(), kk = k(n);
    std::string problem;
    if (n == 0) problem = "commpact::OkTopK::reduce: the gradient is empty; pass at least one entry.";
    else if (n >= (std::size_t{1} << 31)) problem = detail::cat("commpact::OkTopK::reduce: n = ", n, " needs indices above int32.");
    else problem = detail::length_problem("OkTopK", static_cast<std::int64_t>(n), ef_.size());
    std::uint32_t flags = problem.empty() ? 0u : 2u;
    lidx_.clear(), lval_.clear();
    if (!flags) {
      if (!ef_.accumulate(grad)) flags = 1u;
      else {
        lidx_.resize(kk), lval_.resize(kk);
        host::topk_abs(ef_.acc(), kk, std::span<std::int32_t>(lidx_), std::span<float>(lval_), ws_);
      }
    }
    if (bounds_.size() != static_cast<std::size_t>(P) + 1 || bounds_.back() != static_cast<std::int64_t>(n)) {
      bounds_.resize(static_cast<std::size_t>(P) + 1);
      for (int j = 0; j <= P; ++j) bounds_[static_cast<std::size_t>(j)] = static_cast<std::int64_t>(n) * j / P;
      theta_valid_ = false;
    }
    // Sparse reduce-scatter: send every region's entries to its owner, then receive all.
    std::size_t at = 0;
    for (int j = 0; j < P; ++j) {
      std::size_t end = at;
      while (end < lidx_.size() && lidx_[end] < bounds_[static_cast<std::size_t>(j) + 1]) ++end;
      if (j != me) comm_.send(j, rs_message(flags, n, kk, at, end));
      else mine_[0] = at, mine_[1] = end;
      at = end;
    }
    in_.resize(static_cast<std::size_t>(P));
    for (int j = 0; j < P; ++j)
      if (j != me) comm_.recv(j, in_[static_cast<std::size_t>(j)]);
    std::uint32_t all = flags;
    for (int j = 0; j < P; ++j)
      if (j != me) all |= check_header(in_[static_cast<std::size_t>(j)], j, n, kk);
    if (all & 2u) detail::raise_rejected("OkTopK", problem, steps_);
    if (all & 1u) {
      detail::end_nonfinite_step(opt_.on_nonfinite, "OkTopK::reduce", "gradient (with its residual) of some rank",
                                 static_cast<std::size_t>(-1), steps_, grad);
      ++steps_, ++skipped_;
      return false;
    }
    const std::int64_t lo = bounds_[static_cast<std::size_t>(me)], hi = bounds_[static_cast<std::size_t>(me) + 1];
    for (int j = 0; j < P; ++j)
      if (j != me) check_entries(std::span<const std::byte>(in_[static_cast<std::size_t>(j)]).subspan(header), j, lo, hi, kk);
    // Sum the region in rank order (the same float additions as a serial reference).
    reg_.assign(static_cast<std::size_t>(hi - lo), 0.0f);
    touched_.assign(static_cast<std::size_t>(hi - lo), 0);
    for (int j = 0; j < P; ++j) {
      if (j == me) {
        for (std::size_t e = mine_[0]; e < mine_[1]; ++e) add(lidx_[e] - lo, lval_[e]);
      } else {
        const auto body = std::span<const std::byte>(in_[static_cast<std::size_t>(j)]).subspan(header);
        const std::size_t c = body.size() / 8;
        for (std::size_t e = 0; e < c; ++e) add(get<std::int32_t>(body, e) - lo, get<float>(body, c + e));
      }
    }
    const std::size_t cap = region_cap(kk, P);
    if (!theta_valid_ || steps_ % opt_.period == 0) estimate_theta(kk, cap, P);
    select_region(lo, cap);
    ring_allgather(P, me, cap);
    // Output and error feedback.
    std::fill(grad.begin(), grad.end(), 0.0f);
    gsel_.clear();
    for (int o = 0; o < P; ++o) {
      const auto& b = blocks_[static_cast<std::size_t>(o)];
      const std::size_t c = (b.size() - 8) / 8;
      const auto body = std::span<const std::byte>(b).subspan(8);
      for (std::size_t e = 0; e < c; ++e) {
        const auto i = get<std::int32_t>(body, e);
        grad[static_cast<std::size_t>(i)] = mean_of(get<float>(body, c + e), P);
        gsel_.push_back(i);
      }
    }
    ef_.commit();
    for (std::size_t e = 0, g = 0; e < lidx_.size(); ++e) {  // both ascending
      while (g < gsel_.size() && gsel_[g] < lidx_[e]) ++g;
      if (g < gsel_.size() && gsel_[g] == lidx_[e]) ef_.clear_delivered(std::span<const std::int32_t>(&lidx_[e], 1));
    }
    if (gsel_.size() >= static_cast<std::size_t>(P))  // rebalance by this step's selection
      for (int j = 1; j < P; ++j)
        bounds_[static_cast<std::size_t>(j)] = std::max(bounds_[static_cast<std::size_t>(j) - 1],
                                                        static_cast<std::int64_t>(gsel_[gsel_.size() * j / P]));
    ++steps_;
    return true;
  }

  void save_state(std::vector<std::byte>& out) const { save_feedback_state(out, "commpact.OkTopK", ef_, steps_, skipped_); }
  void load_state(std::span<const std::byte> in) {
    load_feedback_state(in, "commpact.OkTopK", "OkTopK", false, ef_, steps_, skipped_);
    bounds_.clear(), theta_valid_ = false;
  }
  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_; }
  std::span<const float> residual() const { return ef_.residual(); }
  //! The region boundaries for the next step (P + 1 values) and the current threshold.
  std::span<const std::int64_t> bounds() const { return bounds_; }
  float theta() const { return theta_; }
  C& comm() { return comm_; }

 private:
  template <class T>
  static T get(std::span<const std::byte> b, std::size_t e) {
    T v;
    std::memcpy(&v, b.data() + 4 * e, 4);
    return v;
  }
  void add(std::int64_t r, float v) {
    reg_[static_cast<std::size_t>(r)] += v;
    touched_[static_cast<std::size_t>(r)] = 1;
  }
  std::span<const std::byte> rs_message(std::uint32_t flags, std::size_t n, std::size_t kk, std::size_t a, std::size_t b) {
    const std::size_t c = b - a;
    msg_.assign(header + 8 * c, std::byte{0});
    const std::uint64_t cnt = c;
    const std::int64_t v[3] = {static_cast<std::int64_t>(n), static_cast<std::int64_t>(kk), steps_};
    std::memcpy(msg_.data(), &magic, 4);
    std::memcpy(msg_.data() + 4, &flags, 4);
    std::memcpy(msg_.data() + 8, &cnt, 8);
    std::memcpy(msg_.data() + 16, v, 24);
    if (c) {
      std::memcpy(msg_.data() + header, lidx_.data() + a, 4 * c);
      std::memcpy(msg_.data() + header + 4 * c, lval_.data() + a, 4 * c);
    }
    return msg_;
  }
  std::uint32_t check_header(const std::vector<std::byte>& m, int from, std::size_t n, std::size_t kk) const {
    require<wire_error>(m.size() >= header, "commpact::OkTopK: rank ", from, "'s message of ", m.size(),
                        " bytes is shorter than its ", header, "-byte header.");
    std::uint32_t mg, fl;
    std::uint64_t cnt;
    std::int64_t v[3];
    std::memcpy(&mg, m.data(), 4), std::memcpy(&fl, m.data() + 4, 4), std::memcpy(&cnt, m.data() + 8, 8);
    std::memcpy(v, m.data() + 16, 24);
    require<wire_error>(mg == magic && fl <= 3u && cnt <= (m.size() - header) / 8 && m.size() == header + 8 * cnt,
                        "commpact::OkTopK: rank ", from, "'s message is malformed (magic, flags or count); every rank "
                        "must run the same commpact.");
    if (fl) return fl;
    if (v[0] != static_cast<std::int64_t>(n) || v[1] != static_cast<std::int64_t>(kk) || v[2] != steps_)
      throw mismatch_error(detail::cat("commpact::OkTopK::reduce: rank ", from, " has n = ", v[0], ", k = ", v[1],
                                       " at step ", v[2], "; this rank n = ", n, ", k = ", kk, " at step ", steps_,
                                       ". Every rank must pass the same lengths with the same options."));
    return 0u;
  }
  //! count <= k entries, indices strictly ascending in [lo, hi), finite values.
  static void check_entries(std::span<const std::byte> body, int from, std::int64_t lo, std::int64_t hi, std::size_t kk) {
    const std::size_t c = body.size() / 8;
    require<wire_error>(c <= kk, "commpact::OkTopK: rank ", from, " sent ", c, " entries, above k = ", kk, ".");
    std::int64_t prev = lo - 1;
    for (std::size_t e = 0; e < c; ++e) {
      const auto i = get<std::int32_t>(body, e);
      const auto v = get<float>(body, c + e);
      if (!(i > prev && i < hi && std::isfinite(v)))
        throw wire_error(detail::cat("commpact::OkTopK: rank ", from, "'s entry ", e, " (index ", i, ", value ", v,
                                     ") is out of order, outside its region [", lo, ", ", hi, ") or not finite."));
      prev = i;
    }
  }
  void estimate_theta(std::size_t kk, std::size_t cap, int P) {
    mags_.assign(cap, 0.0f);
    cand_.clear();
    for (std::size_t r = 0; r < reg_.size(); ++r)
      if (touched_[r]) cand_.push_back(std::abs(reg_[r]));
    const std::size_t m = std::min(cap, cand_.size());
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(m), cand_.end(), std::greater<>());
    std::copy(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(m), mags_.begin());
    allmags_.resize(cap * static_cast<std::size_t>(P));
    comm_.allgather(std::span<const float>(mags_), std::span<float>(allmags_));
    std::nth_element(allmags_.begin(), allmags_.begin() + static_cast<std::ptrdiff_t>(kk - 1), allmags_.end(),
                     std::greater<>());
    theta_ = allmags_[kk - 1];
    theta_valid_ = true;
  }
  //! This rank's selected entries (|sum| >= theta, nonzero, at most k: the largest).
  void select_region(std::int64_t lo, std::size_t kk) {
    sidx_.clear();
    for (std::size_t r = 0; r < reg_.size(); ++r)
      if (touched_[r] && reg_[r] != 0.0f && std::abs(reg_[r]) >= theta_) sidx_.push_back(static_cast<std::int32_t>(r));
    if (sidx_.size() > kk) {
      std::stable_sort(sidx_.begin(), sidx_.end(), [&](auto a, auto b) { return std::abs(reg_[a]) > std::abs(reg_[b]); });
      sidx_.resize(kk);
      std::sort(sidx_.begin(), sidx_.end());
    }
    const auto c = static_cast<std::uint32_t>(sidx_.size());
    auto& b = mine_block_;
    b.assign(8 + 8 * std::size_t{c}, std::byte{0});
    const auto me = static_cast<std::uint32_t>(comm_.rank());
    std::memcpy(b.data(), &me, 4), std::memcpy(b.data() + 4, &c, 4);
    for (std::uint32_t e = 0; e < c; ++e) {
      const auto i = static_cast<std::int32_t>(sidx_[e] + lo);
      std::memcpy(b.data() + 8 + 4 * e, &i, 4);
      std::memcpy(b.data() + 8 + 4 * (c + e), &reg_[static_cast<std::size_t>(sidx_[e])], 4);
    }
  }
  //! P - 1 rounds: pass the block that arrived last round to the next rank.
  void ring_allgather(int P, int me, std::size_t kk) {
    blocks_.resize(static_cast<std::size_t>(P));
    blocks_[static_cast<std::size_t>(me)] = mine_block_;
    for (int s = 0; s < P - 1; ++s) {
      const int send_origin = ((me - s) % P + P) % P, recv_origin = ((me - s - 1) % P + P) % P;
      comm_.send((me + 1) % P, blocks_[static_cast<std::size_t>(send_origin)]);
      auto& b = blocks_[static_cast<std::size_t>(recv_origin)];
      comm_.recv((me - 1 + P) % P, b);
      std::uint32_t o = 0, c = 0;
      if (b.size() >= 8) std::memcpy(&o, b.data(), 4), std::memcpy(&c, b.data() + 4, 4);
      require<wire_error>(b.size() >= 8 && o == static_cast<std::uint32_t>(recv_origin) && b.size() == 8 + 8 * std::size_t{c},
                          "commpact::OkTopK: the allgather block from rank ", (me - 1 + P) % P, " is malformed (origin ",
                          o, ", expected ", recv_origin, ", ", b.size(), " bytes).");
      check_entries(std::span<const std::byte>(b).subspan(8), recv_origin, bounds_[static_cast<std::size_t>(recv_origin)],
                    bounds_[static_cast<std::size_t>(recv_origin) + 1], kk);
    }
  }

  C comm_;
  oktopk_options opt_;
  error_feedback ef_;
  host::topk_workspace ws_;
  std::vector<std::int32_t> lidx_, sidx_, gsel_;
  std::vector<float> lval_, reg_, mags_, allmags_, cand_;
  std::vector<unsigned char> touched_;
  std::vector<std::int64_t> bounds_;
  std::vector<std::byte> msg_, mine_block_;
  std::vector<std::vector<std::byte>> in_, blocks_;
  std::size_t mine_[2] = {0, 0};
  float theta_ = 0.0f;
  bool theta_valid_ = false;
  std::int64_t steps_ = 0, skipped_ = 0;
};

}  // namespace commpact
