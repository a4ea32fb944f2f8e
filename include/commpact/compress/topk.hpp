#pragma once
//! \file topk.hpp
//! TopK<Comm>: Top-k S-SGD with error feedback. Each rank selects the k entries of
//! largest |g + residual| (ties: the smaller index), all ranks all-gather every rank's
//! set (exactly k entries each, in the sparse wire format), add the sets in rank order
//! and divide by P. What a rank did not send stays in its residual. Traffic per rank per
//! step: (P - 1) * (48 + 8k) bytes by the ring allgather, O(kP).
//!
//! \code
//! commpact::TopK<commpact::ThreadComm> topk{comm, {.density = 0.01}};
//! topk.reduce(std::span(grad));   // grad = (1/P) sum_r topk_r(grad_r + residual_r), identical on every rank
//! \endcode
//!
//! This file also holds what TopK and gTopK share: `sparse_options` (density or k, a
//! density warm-up schedule, DGC momentum correction and local gradient clipping,
//! non-finite handling) and the error-feedback state with its save/restore format.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/host/topk.hpp"
#include "dense.hpp"  // nonfinite
#include "sparse_wire.hpp"

namespace commpact {

//! Options of TopK and gTopK.
struct sparse_options {
  //! Fraction of the entries each rank selects, in (0, 1]: k = clamp(round(density * n), 1, n).
  double density = 0.001;
  //! An explicit k (1 <= k <= n) instead of the density; not combined with a warm-up.
  std::optional<std::size_t> k{};
  //! Density warm-up: (step, density) pairs, steps strictly increasing; from step s on
  //! the density of the last pair with step <= s applies, before the first pair
  //! `density`. E.g. {{0, 0.25}, {100, 0.0625}, {200, 0.015625}, {300, 0.004}, {400, 0.001}}.
  std::vector<std::pair<std::int64_t, double>> density_warmup{};
  //! DGC momentum correction: u = momentum * u + g, v = v + u; v is sparsified and the
  //! delivered entries of u and v are zeroed. 0 (the default) turns it off; in [0, 1).
  float momentum = 0.0f;
  //! DGC local gradient clipping: before accumulation, g is scaled so that
  //! ||g||_2 <= clip_norm / sqrt(P). 0 (the default) turns it off.
  float clip_norm = 0.0f;
  //! NaN or Inf in a gradient: raise numeric_error on every rank (default) or skip the
  //! step on every rank (gradient zeroed, state untouched).
  nonfinite on_nonfinite = nonfinite::raise;
};

namespace detail {

inline bool density_ok(double d) { return d > 0.0 && d <= 1.0; }  // false for NaN

//! Checks options that do not depend on the gradient; throws invalid_argument.
inline void validate_sparse_options(const sparse_options& o, const char* who) {
  if (o.k) {
    require(*o.k >= 1, "commpact::", who, ": k = 0 selects nothing; pass k >= 1 or leave k unset and give a density.");
    require(o.density_warmup.empty(), "commpact::", who,
            ": an explicit k and a density warm-up were both given; give either k or densities.");
  } else {
    require(density_ok(o.density), "commpact::", who, ": density = ", o.density,
            " is outside (0, 1]; pass the fraction of entries to keep, e.g. 0.001.");
  }
  for (std::size_t i = 0; i < o.density_warmup.size(); ++i) {
    const auto& [s, d] = o.density_warmup[i];
    require(density_ok(d), "commpact::", who, ": warm-up density ", d, " at step ", s,
            " is outside (0, 1]; every density must be a fraction in (0, 1].");
    require(s >= 0 && (i == 0 || s > o.density_warmup[i - 1].first), "commpact::", who, ": warm-up step ", s,
            " at position ", i, " is negative or not after the previous step; list (step, density) pairs with "
            "strictly increasing steps >= 0.");
  }
  require(o.momentum >= 0.0f && o.momentum < 1.0f, "commpact::", who, ": momentum = ", o.momentum,
          " is outside [0, 1); use 0 to turn momentum correction off.");
  require(o.clip_norm >= 0.0f && std::isfinite(o.clip_norm), "commpact::", who, ": clip_norm = ", o.clip_norm,
          " must be finite and >= 0; use 0 to turn clipping off.");
}

inline std::int64_t k_of_density(double d, std::int64_t n) {
  if (n <= 0) return 0;
  const auto k = static_cast<std::int64_t>(std::llround(d * static_cast<double>(n)));
  return std::clamp<std::int64_t>(k, 1, n);
}

//! The density in force at `step`.
inline double density_at(const sparse_options& o, std::int64_t step) {
  double d = o.density;
  for (const auto& [s, dd] : o.density_warmup)
    if (s <= step) d = dd;
  return d;
}

//! k at `step` for a gradient of length n (may be 0 or above n for an explicit k; the
//! caller reports that).
inline std::int64_t k_at(const sparse_options& o, std::int64_t step, std::int64_t n) {
  if (o.k) return static_cast<std::int64_t>(*o.k);
  return k_of_density(density_at(o, step), n);
}

//! The largest k any step can use for length n (workspaces are sized for it once).
inline std::int64_t k_max(const sparse_options& o, std::int64_t n) {
  if (o.k) return std::min<std::int64_t>(static_cast<std::int64_t>(*o.k), n);
  std::int64_t k = k_of_density(o.density, n);
  for (const auto& [s, d] : o.density_warmup) k = std::max(k, k_of_density(d, n));
  return k;
}

//! True when a warm-up entry starts exactly at `step` (k may change there).
inline bool warmup_boundary(const sparse_options& o, std::int64_t step) {
  for (const auto& [s, d] : o.density_warmup)
    if (s == step) return true;
  return false;
}

//! Problems with this rank's gradient that make the step impossible (empty string: none).
inline std::string local_problem(const char* who, std::int64_t n, std::int64_t k, std::int64_t state_n) {
  if (n <= 0)
    return cat("commpact::", who, "::reduce: the gradient is empty; pass a gradient with at least one entry.");
  if (n > std::numeric_limits<std::int32_t>::max())
    return cat("commpact::", who, "::reduce: the gradient has n = ", n,
               " entries; sparse indices are int32, so n must be below 2^31: split the gradient into buckets.");
  if (k < 1 || k > n)
    return cat("commpact::", who, "::reduce: k = ", k, " is outside [1, n = ", n,
               "]; pass k <= the gradient length, or a density in (0, 1].");
  if (state_n > 0 && state_n != n)
    return cat("commpact::", who, "::reduce: the gradient length changed from ", state_n, " to ", n,
               " between steps; the residual is kept per index. Keep the length fixed, or call reset() on every rank.");
  return {};
}

//! Error-feedback state: the residual (DGC's v) and, with momentum, the velocity u; plus
//! the workspaces acc (the candidate new residual) and u_next. Nothing is changed until
//! commit(), so a step that raises or is skipped leaves the state as it was.
class error_feedback {
 public:
  //! Sizes the buffers for length n (zero residual/velocity); no-op when already sized.
  void ensure(std::size_t n, bool momentum) {
    if (residual_.size() != n) {
      residual_.assign(n, 0.0f);
      velocity_.assign(momentum ? n : 0, 0.0f);
    }
    acc_.resize(n);
    u_next_.resize(momentum ? n : 0);
  }

  //! acc = residual + (momentum ? (u_next = m * u + s * g) : s * g), s the clipping
  //! scale (exactly g when clipping is off). Returns false when acc is not finite.
  bool accumulate(std::span<const float> g, float momentum, std::optional<float> scale) {
    const std::size_t n = g.size();
    bool finite = true;
    const bool mom = !velocity_.empty();
    for (std::size_t i = 0; i < n; ++i) {
      float gi = g[i];
      if (scale) gi = gi * *scale;
      if (mom) {
        const float mu = momentum * velocity_[i];
        u_next_[i] = mu + gi;
        gi = u_next_[i];
      }
      const float a = residual_[i] + gi;
      acc_[i] = a;
      finite &= std::isfinite(a);
    }
    return finite;
  }

  std::span<const float> acc() const { return acc_; }

  //! Makes acc the residual (and u_next the velocity), then zeroes the delivered entries.
  template <class Delivered>
  void commit(Delivered&& delivered) {
    std::swap(residual_, acc_);
    if (!velocity_.empty()) std::swap(velocity_, u_next_);
    delivered([&](std::int32_t i) {
      residual_[static_cast<std::size_t>(i)] = 0.0f;
      if (!velocity_.empty()) velocity_[static_cast<std::size_t>(i)] = 0.0f;
    });
  }

  std::span<const float> residual() const { return residual_; }
  std::span<const float> velocity() const { return velocity_; }
  std::int64_t size() const { return static_cast<std::int64_t>(residual_.size()); }

  void clear() {
    residual_.clear();
    velocity_.clear();
  }

  static constexpr std::uint32_t state_magic = 0x46455043u;  // "CPEF"
  static constexpr std::size_t state_header = 40;

  //! Appends: u32 magic, u16 version 1, u16 kind, u32 has_velocity, u32 0, i64 n,
  //! i64 steps, i64 skipped, f32 residual[n], f32 velocity[n if has_velocity].
  void save(std::vector<std::byte>& out, std::uint16_t kind, std::int64_t steps, std::int64_t skipped) const {
    const std::size_t n = residual_.size();
    const std::size_t at = out.size();
    out.resize(at + state_header + 4 * n + 4 * velocity_.size());
    std::byte* p = out.data() + at;
    sparse_wire::detail::put<std::uint32_t>(p, state_magic);
    sparse_wire::detail::put<std::uint16_t>(p + 4, 1);
    sparse_wire::detail::put<std::uint16_t>(p + 6, kind);
    sparse_wire::detail::put<std::uint32_t>(p + 8, velocity_.empty() ? 0u : 1u);
    sparse_wire::detail::put<std::uint32_t>(p + 12, 0u);
    sparse_wire::detail::put<std::int64_t>(p + 16, static_cast<std::int64_t>(n));
    sparse_wire::detail::put<std::int64_t>(p + 24, steps);
    sparse_wire::detail::put<std::int64_t>(p + 32, skipped);
    if (n) std::memcpy(p + state_header, residual_.data(), 4 * n);
    if (!velocity_.empty()) std::memcpy(p + state_header + 4 * n, velocity_.data(), 4 * n);
  }

  //! Validates and restores; returns (steps, skipped). Raises wire_error on a malformed
  //! state, invalid_argument when it was saved by another compressor or with(out) momentum.
  std::pair<std::int64_t, std::int64_t> load(std::span<const std::byte> in, std::uint16_t kind, bool momentum,
                                             const char* who) {
    require<wire_error>(in.size() >= state_header, "commpact::", who, "::load_state: ", in.size(),
                        " bytes is shorter than the ", state_header, "-byte state header; pass what save_state wrote.");
    const std::byte* p = in.data();
    using sparse_wire::detail::get;
    require<wire_error>(get<std::uint32_t>(p) == state_magic && get<std::uint16_t>(p + 4) == 1,
                        "commpact::", who, "::load_state: bad magic or version; pass what save_state wrote.");
    require<invalid_argument>(get<std::uint16_t>(p + 6) == kind, "commpact::", who,
                              "::load_state: the state was saved by another compressor (kind ",
                              get<std::uint16_t>(p + 6), ", expected ", kind, ").");
    const auto hv = get<std::uint32_t>(p + 8);
    require<wire_error>(hv <= 1 && get<std::uint32_t>(p + 12) == 0, "commpact::", who, "::load_state: corrupt header.");
    require<invalid_argument>((hv == 1) == momentum, "commpact::", who, "::load_state: the state was saved ",
                              hv ? "with" : "without", " momentum correction but this compressor has it ",
                              momentum ? "on" : "off", "; use the same options.");
    const auto n = get<std::int64_t>(p + 16), steps = get<std::int64_t>(p + 24), skipped = get<std::int64_t>(p + 32);
    require<wire_error>(n >= 0 && n < std::numeric_limits<std::int32_t>::max() && steps >= 0 && skipped >= 0 &&
                            skipped <= steps,
                        "commpact::", who, "::load_state: corrupt header (n = ", n, ", steps = ", steps,
                        ", skipped = ", skipped, ").");
    const std::uint64_t expect = state_header + 4ull * static_cast<std::uint64_t>(n) * (hv ? 2 : 1);
    require<wire_error>(in.size() == expect, "commpact::", who, "::load_state: the state of n = ", n, " needs ", expect,
                        " bytes, got ", in.size(), ".");
    std::vector<float> r(static_cast<std::size_t>(n)), v(hv ? static_cast<std::size_t>(n) : 0);
    if (n) std::memcpy(r.data(), p + state_header, 4 * r.size());
    if (!v.empty()) std::memcpy(v.data(), p + state_header + 4 * r.size(), 4 * v.size());
    for (float x : r) require<wire_error>(std::isfinite(x), "commpact::", who, "::load_state: a non-finite residual.");
    for (float x : v) require<wire_error>(std::isfinite(x), "commpact::", who, "::load_state: a non-finite velocity.");
    residual_ = std::move(r);
    velocity_ = std::move(v);
    return {steps, skipped};
  }

 private:
  std::vector<float> residual_, velocity_, acc_, u_next_;
};

//! The clipping scale of DGC's local gradient clipping, or nullopt when no scaling
//! applies (off, within the bound, or a non-finite norm that the finiteness check reports).
inline std::optional<float> clip_scale(std::span<const float> g, float clip_norm, int P) {
  if (clip_norm <= 0.0f) return std::nullopt;
  double s = 0;
  for (float x : g) s += static_cast<double>(x) * x;
  const double norm = std::sqrt(s);
  const double bound = static_cast<double>(clip_norm) / std::sqrt(static_cast<double>(P));
  if (!std::isfinite(norm) || norm <= bound) return std::nullopt;
  return static_cast<float>(bound / norm);
}

//! One rank rejected its gradient (the flag reached every rank): that rank raises its own
//! error `mine`, every other rank peer_failure.
[[noreturn]] inline void raise_rejected(const char* who, const std::string& mine, std::int64_t step) {
  if (!mine.empty()) throw invalid_argument(mine);
  throw peer_failure(cat("commpact::", who, "::reduce: another rank rejected its gradient at step ", step,
                         " (its own error says why); every rank abandons the step."));
}

//! Ends a step that met NaN or Inf, alike on every rank: raises numeric_error under
//! nonfinite::raise; under nonfinite::skip_step zeroes grad and counts the step as
//! skipped (the error-feedback state stays as it was). `cause` completes the message's
//! first sentence (empty, or what else can produce a non-finite value).
inline void end_nonfinite_step(nonfinite policy, const char* who, const char* cause, std::span<float> grad,
                                std::int64_t& steps, std::int64_t& skipped) {
  if (policy == nonfinite::raise)
    throw numeric_error(cat("commpact::", who,
                            "::reduce: a rank's gradient (with its residual) is not finite (NaN or Inf)", cause,
                            "; every rank raises this error at step ", steps,
                            ". Fix the gradient, or set on_nonfinite = nonfinite::skip_step to drop such steps."));
  std::fill(grad.begin(), grad.end(), 0.0f);
  ++steps;
  ++skipped;
}

}  // namespace detail

template <class Comm>
class TopK {
  static_assert(diagnose_communicator<Comm>());

 public:
  using options = sparse_options;
  static constexpr std::uint16_t state_kind = 1;

  explicit TopK(Comm comm, options opt = {}) : comm_(std::move(comm)), opt_(std::move(opt)) {
    detail::validate_sparse_options(opt_, "TopK");
  }

  //! Replaces grad by the Top-k S-SGD average, identical on every rank. Returns false
  //! when the step was skipped (non-finite gradient with nonfinite::skip_step).
  bool reduce(std::span<float> grad) {
    const int P = comm_.size();
    const auto n = static_cast<std::int64_t>(grad.size());
    const std::int64_t k = detail::k_at(opt_, steps_, n);
    std::string problem = detail::local_problem("TopK", n, k, ef_.size());

    // Agree on (n, k) whenever they may change: the first step and warm-up boundaries.
    // Every rank decides this from the step counter alone, so all call it together.
    if (!agreed_ || detail::warmup_boundary(opt_, steps_)) {
      std::int64_t v[5] = {n, -n, k, -k, problem.empty() ? 0 : 1};
      comm_.allreduce(std::span<std::int64_t>(v, 5), reduce_op::max);
      if (v[0] != -v[1])
        throw mismatch_error(detail::cat("commpact::TopK::reduce: ranks disagree on the gradient length: rank ",
                                         comm_.rank(), " has n = ", n, ", the lengths range over [", -v[1], ", ", v[0],
                                         "]; every rank must pass gradients of the same length."));
      if (v[2] != -v[3])
        throw mismatch_error(detail::cat("commpact::TopK::reduce: ranks disagree on k: rank ", comm_.rank(), " has k = ",
                                         k, ", k ranges over [", -v[3], ", ", v[2],
                                         "]; every rank must use the same options."));
      if (v[4]) detail::raise_rejected("TopK", problem, steps_);
      setup(n, k);
    } else if (problem.empty() && (n != n_ || k != k_)) {
      problem = detail::cat("commpact::TopK::reduce: the gradient length changed from ", n_, " to ", n,
                            " between steps; keep it fixed, or call reset() on every rank.");
    }

    // This rank's block: its k entries, or an empty set carrying a flag.
    sparse_wire::header h{};
    h.n_min = h.n_max = n;
    h.k_min = h.k_max = k_;
    std::size_t count = 0;
    if (!problem.empty()) {
      h.flags = sparse_wire::flag_failed;
    } else {
      ef_.ensure(static_cast<std::size_t>(n), opt_.momentum > 0.0f);
      const bool finite = ef_.accumulate(grad, opt_.momentum, detail::clip_scale(grad, opt_.clip_norm, P));
      if (!finite) {
        h.flags = sparse_wire::flag_nonfinite;
      } else {
        host::topk_abs(ef_.acc(), static_cast<std::size_t>(k_), std::span(idx_).first(k_),
                       std::span(val_).first(k_), ws_);
        count = static_cast<std::size_t>(k_);
      }
    }
    auto block = std::as_writable_bytes(std::span<float>(block_));
    std::fill(block.begin(), block.end(), std::byte{0});
    sparse_wire::encode_into(block.first(sparse_wire::encoded_size(count)), h,
                             std::span<const std::int32_t>(idx_).first(count), std::span<const float>(val_).first(count));
    comm_.allgather(std::span<const float>(block_), std::span<float>(gathered_));

    // Every rank sees the same blocks, so every rank takes the same decision.
    const auto all = std::as_bytes(std::span<const float>(gathered_));
    const std::size_t bb = block.size();
    std::uint16_t flags = 0;
    for (int r = 0; r < P; ++r) flags |= block_header(all.subspan(r * bb, bb), r).flags;
    if (flags & sparse_wire::flag_failed) detail::raise_rejected("TopK", problem, steps_);
    if (flags & sparse_wire::flag_nonfinite) {
      detail::end_nonfinite_step(opt_.on_nonfinite, "TopK", "", grad, steps_, skipped_);
      return false;
    }
    std::fill(grad.begin(), grad.end(), 0.0f);
    const sparse_wire::expect e{n, static_cast<std::size_t>(k_), 0};
    for (int r = 0; r < P; ++r) {  // rank order: the same float additions on every rank
      const auto msg = all.subspan(r * bb, bb);
      const auto hr = sparse_wire::decode(msg, e, std::span(tmp_idx_), std::span(tmp_val_));
      require<wire_error>(hr.count == k_, "commpact::TopK::reduce: rank ", r, " sent ", hr.count,
                          " entries; every rank sends exactly k = ", k_, ".");
      for (std::size_t j = 0; j < hr.count; ++j) grad[static_cast<std::size_t>(tmp_idx_[j])] += tmp_val_[j];
    }
    const auto fP = static_cast<float>(P);
    for (auto& x : grad) x = x / fP;
    ef_.commit([&](auto&& zero) {
      for (std::int64_t j = 0; j < k_; ++j) zero(idx_[static_cast<std::size_t>(j)]);
    });
    ++steps_;
    return true;
  }

  void save_state(std::vector<std::byte>& out) const { ef_.save(out, state_kind, steps_, skipped_); }
  void load_state(std::span<const std::byte> in) {
    auto [s, k] = ef_.load(in, state_kind, opt_.momentum > 0.0f, "TopK");
    steps_ = s;
    skipped_ = k;
    agreed_ = false;
  }
  //! Forgets the residual and velocity (e.g. when the gradient length changes); every rank must call it.
  void reset() {
    ef_.clear();
    agreed_ = false;
  }

  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_; }
  std::span<const float> residual() const { return ef_.residual(); }
  std::span<const float> velocity() const { return ef_.velocity(); }
  //! k of the last agreed step.
  std::int64_t k() const { return k_; }
  //! Bytes of one rank's block: 48 + 8k.
  std::size_t block_bytes() const { return block_.size() * sizeof(float); }
  const options& opts() const { return opt_; }
  Comm& comm() { return comm_; }

  //! Address and capacity of every internal buffer, sorted, to check that steps after the
  //! first allocate nothing (tests compare it across steps).
  std::vector<std::pair<const void*, std::size_t>> workspace_signature() const {
    std::vector<std::pair<const void*, std::size_t>> s;
    auto add = [&](const auto& v) { s.emplace_back(static_cast<const void*>(v.data()), v.capacity()); };
    add(idx_), add(tmp_idx_), add(val_), add(tmp_val_), add(block_), add(gathered_);
    s.emplace_back(ws_.data(), ws_.capacity_bytes());
    std::sort(s.begin(), s.end());
    return s;
  }

 private:
  //! The header of rank r's fixed-size block, whose message is a prefix of the block.
  sparse_wire::header block_header(std::span<const std::byte> blk, int r) const {
    const auto count = sparse_wire::detail::get<std::uint32_t>(blk.data() + 8);
    require<wire_error>(count <= static_cast<std::uint64_t>(k_), "commpact::TopK::reduce: rank ", r, "'s block announces ",
                        count, " entries, above k = ", k_, ".");
    auto h = sparse_wire::decode_header(blk.first(sparse_wire::encoded_size(count)));
    require<wire_error>(h.k_min == k_ && h.k_max == k_ && h.mask_bits == 0, "commpact::TopK::reduce: rank ", r,
                        "'s block has k = ", h.k_min, " where ", k_, " was agreed.");
    return h;
  }

  void setup(std::int64_t n, std::int64_t k) {
    const int P = comm_.size();
    const auto kmax = static_cast<std::size_t>(std::max(k, detail::k_max(opt_, n)));
    idx_.resize(kmax);
    val_.resize(kmax);
    tmp_idx_.resize(kmax);
    tmp_val_.resize(kmax);
    block_.reserve(sparse_wire::encoded_size(kmax) / 4);
    gathered_.reserve(static_cast<std::size_t>(P) * block_.capacity());
    block_.resize(sparse_wire::encoded_size(static_cast<std::size_t>(k)) / 4);
    gathered_.resize(static_cast<std::size_t>(P) * block_.size());
    n_ = n;
    k_ = k;
    agreed_ = true;
  }

  Comm comm_;
  options opt_;
  detail::error_feedback ef_;
  host::topk_workspace ws_;
  std::vector<std::int32_t> idx_, tmp_idx_;
  std::vector<float> val_, tmp_val_;
  std::vector<float> block_, gathered_;  // wire bytes in float storage (allgather moves floats)
  bool agreed_ = false;
  std::int64_t n_ = 0, k_ = 0;
  std::int64_t steps_ = 0, skipped_ = 0;
};

}  // namespace commpact
