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
//! Messages (known-size point-to-point): reduce-scatter: a 40-byte header (u32 magic "CPOK", u32 flags: bit 0
//! non-finite input, bit 1 rejected input; u64 count; i64 n, k, step), then count int32
//! indices (ascending, in the receiver's region) and count float32 values, sent as two
//! messages (the header, then the 8 count bytes of entries when count > 0). Allgather
//! blocks: u32 origin rank, u32 count, count int32 indices (ascending, in the origin's
//! region) and count float32 values, sent as the 8-byte header (a ring of P - 1 rounds)
//! and then the entries (a second ring). Bytes per rank per step: sum over peers j of
//! (40 + 8 c_j) (c_j: this rank's local entries in region j) plus (P - 1) 8 + 8 (the
//! selected entries of every region except the next rank's), at most about 8k + 16k; plus
//! (P - 1) 4c (about 8k) on a threshold step: flat in P, where TopK's allgather is (P - 1) 8k. Every rank reads every peer's header in the reduce-scatter, so a
//! rejected or non-finite input anywhere raises (or skips) on every rank alike.
//! load_state restores the residual and the counters; the regions and theta restart.
//!
//! Space (v3): the data plane runs in the communicator's space (host_space for ThreadComm
//! and MpiComm, deferred_space for DeferredComm<C>) through the oktopk_ rows of ops<Space>
//! (kernels/host/oktopk.hpp): accumulate, local top-k, frames, region sums, theta,
//! selection, output, residual clear and rebalance. A message's size is known when it is
//! posted (no probe): the entries of a frame follow its header, whose count the host reads
//! at a fence. So start() fences twice (after the headers of the reduce-scatter, and after
//! the selection and the allgather's headers; the regions and theta are host state), and
//! finish() once. Two-phase: `start(grad)` (grad untouched), `finish()` writes grad and
//! raises the same error on every rank (grad untouched), `commit()` installs the residual
//! (a swap), the regions, theta and the counters; `cancel()` drops the step, which then
//! changed nothing. `reduce` = start + finish + commit. Bytes are as above: splitting a
//! message in two moves no byte; the messages per peer double at most.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../comm/known_size.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../kernels/host/oktopk.hpp"
#include "../../kernels/host/ops.hpp"
#include "../../kernels/status.hpp"
#include "../../nonfinite.hpp"
#include "../../state.hpp"
#include "../codecs/sparse_options.hpp"
#include "../error_feedback.hpp"
#include "../step_phase.hpp"

namespace commpact {

struct oktopk_options {
  double density = 0.01;       //!< k = clamp(floor(density n), 1, n): the one rule (sparse_options.hpp)
  std::int64_t period = 32;    //!< steps between threshold re-estimations
  nonfinite on_nonfinite = nonfinite::raise;
};

template <class C>
class OkTopK {
  static_assert(diagnose_point_to_point<C>());
  static constexpr std::size_t header = host::oktopk::header_bytes;

 public:
  using options = oktopk_options;
  using space_type = comm_space_t<C>;
  template <class T>
  using span = typename space_type::template span<T>;
  template <class T>
  using buffer = typename space_type::template buffer<T>;

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

  //! The same sparse average on every rank, in place: start + finish + commit. Returns
  //! false for a skipped step (grad zeroed). A step that raises changes nothing.
  bool reduce(span<float> grad) { return detail::reduce_now(*this, grad); }

  //! Runs the step up to the allgather of the selected entries (queued; fenced where a
  //! message's size depends on the data). grad is read, not written, until finish().
  void start(span<float> grad) {
    phase_.require_idle(who);
    const int P = comm_.size(), me = comm_.rank();
    const std::size_t n = grad.size(), kk = k(n);
    if (n == 0) problem_ = "commpact::OkTopK::reduce: the gradient is empty; pass at least one entry.";
    else if (n >= (std::size_t{1} << 31)) problem_ = detail::cat("commpact::OkTopK::reduce: n = ", n, " needs indices above int32.");
    else problem_ = detail::length_problem(who, static_cast<std::int64_t>(n), residual_len_);
    const std::uint32_t flags = problem_.empty() ? 0u : 2u;
    // This step's regions: the committed ones, or an even split (and a new theta).
    step_bounds_.assign(bounds_.begin(), bounds_.end());
    reset_ = step_bounds_.size() != static_cast<std::size_t>(P) + 1 || step_bounds_.back() != static_cast<std::int64_t>(n);
    if (reset_) {
      step_bounds_.resize(static_cast<std::size_t>(P) + 1);
      for (int j = 0; j <= P; ++j) step_bounds_[static_cast<std::size_t>(j)] = static_cast<std::int64_t>(n) * j / P;
    }
    estimate_ = reset_ || !theta_valid_ || steps_ % opt_.period == 0;
    n_ = n, kk_ = kk, cap_ = region_cap(kk, P), P_ = P;
    grad_ = grad;
    outcome_ = outcome::delivered;
    pending_ = nullptr;
    size_buffers(flags == 0);
    const auto e = exec();
    ops<space_type>::fill(e, status_.view(), std::uint32_t{0});
    ops<space_type>::from_host(e, std::span<const std::int64_t>(step_bounds_), dbounds_.view());
    if (!flags) {
      if (residual_len_ == 0) ops<space_type>::fill(e, residual_.view(), 0.0f);
      ops<space_type>::ef_accumulate(e, acc_.view(), span<float>{}, span<const float>{}, residual_.cview(),
                                     span<const float>(grad), 0.0f, span<const float>{}, status_.view());
      ops<space_type>::oktopk_local(e, acc_.cview(), kk, status_.cview(), lidx_.view(), lval_.view(), ws_);
    }
    ops<space_type>::oktopk_frames(e, flags ? span<const std::int32_t>{} : lidx_.cview(),
                                   flags ? span<const float>{} : lval_.cview(), dbounds_.cview(), status_.cview(),
                                   flags, static_cast<std::int64_t>(n), static_cast<std::int64_t>(kk), steps_,
                                   hdr_out_.view().first(static_cast<std::size_t>(P) * header),
                                   flags ? span<std::byte>{} : pay_out());
    phase_ = phase::started;
    try {
      run_exchange(P, me);
    } catch (...) {
      pending_ = std::current_exception();
    }
  }

  //! Writes grad (the selected sums / P; zero under a skipped step), fences once, then
  //! raises the step's error on every rank alike (grad untouched) or returns.
  bool finish() {
    phase_.require_started(who);
    const auto e = exec();
    const int me = comm_.rank();
    try {
      if (!pending_ && outcome_ == outcome::delivered) {
        ops<space_type>::oktopk_output(e, blocks(), dbounds_.cview(), me, grad_, status_.view());
        ops<space_type>::oktopk_clear_selected(e, acc_.view(), lidx_.cview(), blocks(), dbounds_.cview(),
                                               status_.cview(), dbounds_next_.view());
        ops<space_type>::to_host(e, status_.cview(), std::span<std::uint32_t>(status_host_));
        ops<space_type>::to_host(e, dbounds_next_.cview(), std::span<std::int64_t>(bounds_next_));
      }
      space_type::fence(e, no_deadline());
    } catch (...) {
      phase_ = phase::idle;
      throw;
    }
    phase_ = phase::idle;
    if (pending_) std::rethrow_exception(std::exchange(pending_, nullptr));
    if (outcome_ == outcome::delivered && (status_host_[0] & status_wire))
      wire_failure(detail::cat("the allgather block of rank ", status_host_[1], " has entries out of order, outside its "
                               "region or not finite"));
    if (outcome_ == outcome::skipped) {
      ops<space_type>::fill(e, grad_, 0.0f);
      space_type::fence(e, no_deadline());
    }
    phase_ = phase::finished;
    return outcome_ == outcome::delivered;
  }

  //! Installs a finished step: the residual (a swap), the rebalanced regions, theta and
  //! the counters.
  void commit() {
    phase_.require_finished(who);
    if (outcome_ == outcome::delivered) {
      residual_.swap(acc_);
      residual_len_ = static_cast<std::int64_t>(n_);
      bounds_.assign(bounds_next_.begin(), bounds_next_.end());
      theta_ = theta_step_;
      theta_valid_ = true;
    } else {
      bounds_.assign(step_bounds_.begin(), step_bounds_.end());
      theta_valid_ = theta_valid_ && !reset_;
      ++skipped_;
    }
    ++steps_;
    phase_ = phase::idle;
  }

  //! Drops a started or finished step (queued work is completed first): the residual,
  //! the regions, theta and the counters stay as before it.
  void cancel() noexcept {
    phase_.drop([&] { space_type::fence(exec(), no_deadline()); });
    pending_ = nullptr;
  }

  void save_state(std::vector<std::byte>& out) const {
    require(phase_ == phase::idle, "commpact::OkTopK::save_state: a step is in flight; finish and commit it first.");
    state::writer w{out, kind};
    state::write_counters(w, steps_, skipped_);
    std::vector<float> h(static_cast<std::size_t>(residual_len_));
    ops<space_type>::to_host(exec(), residual(), std::span<float>(h));
    space_type::fence(exec(), no_deadline());
    w.f32s(10, h);
    w.f32s(11, std::vector<float>{});
    w.finish();
  }
  void load_state(std::span<const std::byte> in) {
    require(phase_ == phase::idle, "commpact::OkTopK::load_state: a step is in flight; finish and commit it first.");
    state::reader r{in, kind, who};
    const auto [s, k] = state::read_counters(r);
    auto l = error_feedback::load(r, state::reader::npos, false);
    r.fail_unless(l.residual.size() < (std::size_t{1} << 31), "a residual of ", l.residual.size(),
                  " values is longer than sparse indices allow.");
    r.done();
    residual_.resize(l.residual.size());
    ops<space_type>::from_host(exec(), std::span<const float>(l.residual), residual_.view());
    space_type::fence(exec(), no_deadline());
    residual_len_ = static_cast<std::int64_t>(l.residual.size());
    steps_ = s;
    skipped_ = k;
    bounds_.clear(), theta_valid_ = false;
  }
  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_; }
  //! The residual, in the space's memory (empty before the first step).
  span<const float> residual() const { return residual_.view().first(static_cast<std::size_t>(residual_len_)); }
  //! The region boundaries for the next step (P + 1 values) and the current threshold.
  std::span<const std::int64_t> bounds() const { return bounds_; }
  float theta() const { return theta_; }
  C& comm() { return comm_; }

  //! Address and capacity of every internal buffer, sorted, to check that steps after the
  //! first allocate nothing (tests compare it across steps).
  std::vector<std::pair<const void*, std::size_t>> workspace_signature() const {
    std::vector<std::pair<const void*, std::size_t>> s;
    auto add = [&](const auto& b) { s.emplace_back(static_cast<const void*>(b.data()), b.capacity()); };
    add(residual_), add(acc_), add(lidx_), add(lval_), add(hdr_out_), add(hdr_in_), add(pay_out_), add(pay_in_);
    add(reg_), add(touched_), add(mags_), add(allmags_), add(magws_), add(selws_), add(blocks_);
    add(status_), add(theta_dev_), add(dbounds_), add(dbounds_next_);
    add(step_bounds_), add(bounds_next_), add(hdr_out_host_), add(hdr_in_host_), add(block_hdr_host_);
    s.emplace_back(ws_.data(), ws_.capacity_bytes());
    std::sort(s.begin(), s.end());  // the residual and candidate swap roles at every commit
    return s;
  }

 private:
  using phase = detail::step_phase;
  enum class outcome { delivered, skipped };
  static constexpr const char* who = "OkTopK";
  static constexpr std::string_view kind = "commpact.OkTopK";

  auto exec() const { return comm_exec(const_cast<C&>(comm_)); }
  std::size_t pay_stride() const { return 8 * kk_; }
  std::size_t block_stride() const { return 8 + 8 * cap_; }
  span<std::byte> pay_out() { return pay_out_.view().first(P_ * pay_stride()); }
  span<const std::byte> blocks() const { return blocks_.view().first(P_ * block_stride()); }
  span<std::byte> block(std::size_t o, std::size_t off, std::size_t len) {
    return blocks_.view().subspan(o * block_stride() + off, len);
  }

  //! Grows every buffer to this step's sizes (n-sized ones only for an accepted input).
  void size_buffers(bool accepted) {
    const std::size_t P = static_cast<std::size_t>(P_);
    status_.resize(2), theta_dev_.resize(1), dbounds_.resize(P + 1), dbounds_next_.resize(P + 1);
    bounds_next_.resize(P + 1), hdr_out_host_.resize(P * header), hdr_in_host_.resize(P * header);
    block_hdr_host_.resize(P * 8);
    hdr_out_.resize(P * header), hdr_in_.resize(P * header);
    if (!accepted) return;
    if (residual_len_ == 0) residual_.resize(n_);
    acc_.resize(n_), reg_.resize(n_), touched_.resize(n_), magws_.resize(n_), selws_.resize(n_);
    lidx_.resize(kk_), lval_.resize(kk_);
    pay_out_.resize(P * pay_stride()), pay_in_.resize(P * pay_stride());
    mags_.resize(cap_), allmags_.resize(cap_ * P), blocks_.resize(P * block_stride());
  }

  [[noreturn]] void wire_failure(const std::string& what) {
    const auto why = detail::cat("OkTopK: rank ", comm_.rank(), " at step ", steps_, ": ", what, ".");
    comm_.abort(why);
    throw wire_error(detail::cat("commpact::", why, " Every rank must run the same commpact; the step is abandoned."));
  }

  //! The exchanges of start(): reduce-scatter, region sums, theta, selection, allgather.
  void run_exchange(int P, int me) {
    const auto e = exec();
    const auto up = static_cast<std::size_t>(P);
    auto slot = [&](auto& b, std::size_t j) { return b.view().subspan(j * header, header); };
    for (int j = 0; j < P; ++j)
      if (j != me) send_known(comm_, j, span<const std::byte>(slot(hdr_out_, static_cast<std::size_t>(j))));
    for (int j = 0; j < P; ++j)
      if (j != me) recv_known(comm_, j, slot(hdr_in_, static_cast<std::size_t>(j)));
    ops<space_type>::to_host(e, hdr_out_.cview().first(up * header), std::span<std::byte>(hdr_out_host_));
    ops<space_type>::to_host(e, hdr_in_.cview().first(up * header), std::span<std::byte>(hdr_in_host_));
    space_type::fence(e, no_deadline());
    if (!check_headers(P, me)) return;  // a skipped step
    // The entries of every frame, sized by the headers.
    auto count = [&](const std::vector<std::byte>& h, int j) {
      return static_cast<std::size_t>(host::oktopk::read_header(h.data() + static_cast<std::size_t>(j) * header).count);
    };
    for (int j = 0; j < P; ++j)
      if (const auto c = count(hdr_out_host_, j); j != me && c)
        send_known(comm_, j, span<const std::byte>(pay_out_.view().subspan(static_cast<std::size_t>(j) * pay_stride(), 8 * c)));
    for (int j = 0; j < P; ++j)
      if (const auto c = count(hdr_in_host_, j); j != me && c)
        recv_known(comm_, j, pay_in_.view().subspan(static_cast<std::size_t>(j) * pay_stride(), 8 * c));
    const auto lo = step_bounds_[static_cast<std::size_t>(me)], hi = step_bounds_[static_cast<std::size_t>(me) + 1];
    const auto len = static_cast<std::size_t>(hi - lo);
    const auto reg = reg_.view().first(len);
    const auto touched = touched_.view().first(len);
    ops<space_type>::oktopk_region_sum(e, hdr_out_.cview().first(up * header), pay_out_.cview().first(up * pay_stride()),
                                       hdr_in_.cview().first(up * header), pay_in_.cview().first(up * pay_stride()), me,
                                       lo, hi, reg, touched, status_.view());
    if (estimate_) {
      ops<space_type>::oktopk_mags(e, span<const float>(reg), span<const std::uint8_t>(touched), mags_.view().first(cap_),
                                   magws_.view());
      comm_.allgather(mags_.cview().first(cap_), allmags_.view().first(cap_ * up));
      ops<space_type>::oktopk_theta(e, allmags_.view().first(cap_ * up), kk_, theta_dev_.view());
    } else {
      ops<space_type>::fill(e, theta_dev_.view(), theta_);
    }
    ops<space_type>::oktopk_select(e, span<const float>(reg), span<const std::uint8_t>(touched), theta_dev_.cview(), lo,
                                   me, block(static_cast<std::size_t>(me), 0, block_stride()), selws_.view());
    // The allgather's headers (origin, count): a ring of P - 1 rounds of 8 bytes.
    auto mod = [P](int x) { return static_cast<std::size_t>(((x % P) + P) % P); };
    for (int s = 0; s < P - 1; ++s) {
      send_known(comm_, static_cast<int>(mod(me + 1)), span<const std::byte>(block(mod(me - s), 0, 8)));
      recv_known(comm_, static_cast<int>(mod(me - 1)), block(mod(me - s - 1), 0, 8));
    }
    ops<space_type>::to_host(e, status_.cview(), std::span<std::uint32_t>(status_host_));
    ops<space_type>::to_host(e, theta_dev_.cview(), std::span<float>(&theta_step_, 1));
    for (std::size_t o = 0; o < up; ++o)
      ops<space_type>::to_host(e, span<const std::byte>(block(o, 0, 8)), std::span<std::byte>(block_hdr_host_).subspan(8 * o, 8));
    space_type::fence(e, no_deadline());
    if (status_host_[0] & status_wire)
      wire_failure(detail::cat("the frame of rank ", status_host_[1], " has entries out of order, outside this region "
                               "or not finite"));
    auto bcount = [&](std::size_t o) { return static_cast<std::size_t>(host::oktopk::get<std::uint32_t>(block_hdr_host_.data() + 8 * o + 4)); };
    for (std::size_t o = 0; o < up; ++o) {
      const auto origin = host::oktopk::get<std::uint32_t>(block_hdr_host_.data() + 8 * o);
      if (origin != o || bcount(o) > cap_)
        wire_failure(detail::cat("the allgather block of rank ", o, " is malformed (origin ", origin, ", ", bcount(o),
                                 " entries, at most ", cap_, ")"));
    }
    // The selected entries: a second ring, sized by the headers.
    for (int s = 0; s < P - 1; ++s) {
      const auto so = mod(me - s), ro = mod(me - s - 1);
      if (bcount(so)) send_known(comm_, static_cast<int>(mod(me + 1)), span<const std::byte>(block(so, 8, 8 * bcount(so))));
      if (bcount(ro)) recv_known(comm_, static_cast<int>(mod(me - 1)), block(ro, 8, 8 * bcount(ro)));
    }
  }

  //! Reads every peer's header (after the fence): raises the same error on every rank for
  //! a malformed header, another n, k or step, a rejected input or (unless skip_step) a
  //! non-finite one. Returns false for a step to skip.
  bool check_headers(int P, int me) {
    const auto own = host::oktopk::read_header(hdr_out_host_.data() + static_cast<std::size_t>(me) * header);
    std::uint32_t all = own.flags;
    for (int j = 0; j < P; ++j) {
      if (j == me) continue;
      const auto h = host::oktopk::read_header(hdr_in_host_.data() + static_cast<std::size_t>(j) * header);
      if (h.magic != host::oktopk::magic || h.flags > 3u)
        wire_failure(detail::cat("rank ", j, "'s reduce-scatter header is malformed (magic or flags)"));
      if (h.flags) {
        all |= h.flags;
        continue;
      }
      if (h.n != static_cast<std::int64_t>(n_) || h.k != static_cast<std::int64_t>(kk_) || h.step != steps_)
        throw mismatch_error(detail::cat("commpact::OkTopK::reduce: rank ", j, " has n = ", h.n, ", k = ", h.k,
                                         " at step ", h.step, "; this rank n = ", n_, ", k = ", kk_, " at step ", steps_,
                                         ". Every rank must pass the same lengths with the same options."));
      if (h.count > kk_) wire_failure(detail::cat("rank ", j, " announced ", h.count, " entries, above k = ", kk_));
    }
    if (all & 2u) detail::raise_rejected(who, problem_, steps_);
    if (all & 1u) {
      if (opt_.on_nonfinite == nonfinite::raise)
        detail::raise_nonfinite("OkTopK::reduce", "gradient (with its residual) of some rank",
                                static_cast<std::size_t>(-1), steps_);
      outcome_ = outcome::skipped;
      return false;
    }
    return true;
  }

  C comm_;
  oktopk_options opt_;
  typename ops<space_type>::topk_workspace ws_;
  buffer<float> residual_, acc_, lval_, reg_, mags_, allmags_, magws_, theta_dev_;
  buffer<std::int32_t> lidx_, selws_;
  buffer<std::uint8_t> touched_;
  buffer<std::byte> hdr_out_, hdr_in_, pay_out_, pay_in_, blocks_;
  buffer<std::uint32_t> status_;
  buffer<std::int64_t> dbounds_, dbounds_next_;
  std::vector<std::int64_t> bounds_, step_bounds_, bounds_next_;
  std::vector<std::byte> hdr_out_host_, hdr_in_host_, block_hdr_host_;
  std::uint32_t status_host_[2] = {0, 0};
  span<float> grad_{};
  std::string problem_;
  std::exception_ptr pending_;
  phase phase_;
  outcome outcome_ = outcome::delivered;
  bool reset_ = false, estimate_ = false;
  std::size_t n_ = 0, kk_ = 1, cap_ = 1;
  int P_ = 1;
  float theta_ = 0.0f, theta_step_ = 0.0f;
  bool theta_valid_ = false;
  std::int64_t residual_len_ = 0;
  std::int64_t steps_ = 0, skipped_ = 0;
};

}  // namespace commpact
