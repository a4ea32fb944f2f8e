// Error feedback that follows the parameters when DDP rebuilds its buckets.
//
// A hook keeps one compressor per DDP bucket, and a compressor keeps its residual (and
// velocity) by position in the bucket. After the first iteration DDP rebuilds its
// buckets in the order the gradients became ready: the same parameters in another
// order (a one-bucket model's order reverses), or in other groups. The residual must
// stay with its parameters, not its positions. So each bucket's compressor is known by
// the parameters it holds (their identity and length, in bucket order); when a bucket
// comes with other parameters than its compressor's, every compressor holding one of
// them gives its residual and velocity up, by parameter, and the bucket's new compressor
// starts from theirs (seed_feedback). Every rank sees the same rebuild (DDP takes rank
// 0's bucket assignment), so every rank makes the same compressors at the same step.
//
// Plain C++ (no torch): the CPU hooks (commpact_hooks.cpp) and the CUDA ones
// (commpact_hooks_cuda.cu, which settles the steps in flight first) use it.
#pragma once

#include <commpact/compress/error_feedback.hpp>
#include <commpact/state.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace commpact_hooks {

//! A parameter of a bucket: its identity (the tensor's implementation), its length and
//! its rows (dim 0: the hooks' layouts view a tensor as rows x numel / rows).
struct param_slot {
  std::uintptr_t id = 0;
  std::int64_t numel = 0;
  std::int64_t rows = 0;
  bool operator==(const param_slot&) const = default;
};
//! A bucket's parameters in the order of its flat buffer.
using bucket_params = std::vector<param_slot>;

inline std::int64_t total_numel(const bucket_params& ps) {
  std::int64_t n = 0;
  for (const auto& p : ps) n += p.numel;
  return n;
}

inline bool shares_a_parameter(const bucket_params& a, const bucket_params& b) {
  for (const auto& p : a)
    for (const auto& q : b)
      if (p.id == q.id) return true;
  return false;
}

//! Residuals and velocities by parameter, between a bucket's old compressors and its new one.
class feedback_by_parameter {
 public:
  //! Takes a bucket's residual and velocity (bucket order; velocity empty without
  //! momentum, both empty before the compressor's first step) apart by parameter.
  void keep(const bucket_params& ps, std::span<const float> residual, std::span<const float> velocity) {
    if (residual.empty() || static_cast<std::int64_t>(residual.size()) != total_numel(ps)) return;
    std::size_t off = 0;
    for (const auto& p : ps) {
      const auto n = static_cast<std::size_t>(p.numel);
      auto& s = kept_[p.id];
      s.residual.assign(residual.begin() + off, residual.begin() + off + n);
      if (velocity.size() == residual.size()) s.velocity.assign(velocity.begin() + off, velocity.begin() + off + n);
      else s.velocity.clear();
      off += n;
    }
  }

  //! The residual and velocity of a bucket of `ps` (zero where nothing was kept), and
  //! forgets what they used; both empty when nothing was kept for any of them.
  std::pair<std::vector<float>, std::vector<float>> take(const bucket_params& ps, bool momentum) {
    std::vector<float> r, v;
    bool any = false;
    for (const auto& p : ps) any = any || kept_.count(p.id) != 0;
    if (!any) return {};
    const auto n = static_cast<std::size_t>(total_numel(ps));
    r.assign(n, 0.0f);
    if (momentum) v.assign(n, 0.0f);
    std::size_t off = 0;
    for (const auto& p : ps) {
      const auto len = static_cast<std::size_t>(p.numel);
      if (const auto it = kept_.find(p.id); it != kept_.end()) {
        if (it->second.residual.size() == len)
          std::copy(it->second.residual.begin(), it->second.residual.end(), r.begin() + off);
        if (momentum && it->second.velocity.size() == len)
          std::copy(it->second.velocity.begin(), it->second.velocity.end(), v.begin() + off);
        kept_.erase(it);
      }
      off += len;
    }
    return {std::move(r), std::move(v)};
  }

  std::size_t size() const { return kept_.size(); }

 private:
  struct saved {
    std::vector<float> residual, velocity;
  };
  std::map<std::uintptr_t, saved> kept_;
};

//! Installs residual r and velocity v (empty without momentum) into a compressor that
//! has made no step: the blob save_feedback_state writes for them with counters 0,
//! through its load_state.
template <class C>
void seed_feedback(C& c, std::string_view kind, std::vector<float> r, std::vector<float> v) {
  const commpact::host_space::exec e{};
  commpact::error_feedback ef{!v.empty()};
  ef.install(e, {std::move(r), std::move(v)});
  std::vector<std::byte> blob;
  commpact::save_feedback_state(blob, kind, ef, e, 0, 0);
  c.load_state(blob);
}

//! One compressor per DDP bucket index, known by its parameters (see the file comment).
//! Any space: the feedback moves through the compressors' state blobs (host copies).
template <class C>
class bucket_compressors {
 public:
  struct entry {
    bucket_params params;
    std::int64_t n = -1;
    std::unique_ptr<C> c;
  };

  //! The compressor of bucket `index` holding `ps` (n floats): the one it has, or a new
  //! one from make() (a std::unique_ptr<C>), when the bucket is new or holds other
  //! parameters (or shapes) or another length, that starts from the residual and
  //! velocity its parameters had in their earlier buckets. `settle()` runs first when
  //! compressors are to give their feedback up (their steps must not be in flight).
  template <class Make, class Settle>
  C& get(std::int64_t index, const bucket_params& ps, std::int64_t n, Make&& make, Settle&& settle) {
    auto& b = buckets_[index];
    if (b.c && b.params == ps && b.n == n) return *b.c;
    // Every compressor that holds one of these parameters (this index's old one too)
    // gives up its feedback by parameter.
    bool settled = false;
    for (auto& [i, e] : buckets_) {
      if (!e.c || !(i == index || shares_a_parameter(e.params, ps))) continue;
      if (!settled) settle();
      settled = true;
      auto [r, v] = feedback_of(*e.c);
      kept_.keep(e.params, r, v);
      e.c.reset();
    }
    b.c = make();
    b.params = ps;
    b.n = n;
    if (total_numel(ps) == n) {
      auto [r, v] = kept_.take(ps, momentum_of(*b.c));
      if (!r.empty()) seed_feedback(*b.c, kind_of(*b.c), std::move(r), std::move(v));
    }
    return *b.c;
  }
  template <class Make>
  C& get(std::int64_t index, const bucket_params& ps, std::int64_t n, Make&& make) {
    return get(index, ps, n, std::forward<Make>(make), [] {});
  }

  //! Parameters whose feedback is kept for a bucket still to come (tests).
  std::size_t kept() const { return kept_.size(); }

 private:
  static bool momentum_of(const C& c) { return c.opts().momentum > 0.0f; }
  //! The kind its save_state writes: the first section of the blob (state.hpp's layout:
  //! a 24-byte header, then tag, type and count before the kind's bytes).
  static std::string kind_of(const std::vector<std::byte>& blob) {
    std::uint64_t count = 0;
    std::memcpy(&count, blob.data() + commpact::state::header_bytes + 8, sizeof count);
    return std::string(reinterpret_cast<const char*>(blob.data()) + commpact::state::header_bytes +
                           commpact::state::section_header_bytes,
                       static_cast<std::size_t>(count));
  }
  static std::string kind_of(const C& c) {
    std::vector<std::byte> blob;
    c.save_state(blob);
    return kind_of(blob);
  }
  //! Its residual and velocity as host copies, read back from its state blob.
  static std::pair<std::vector<float>, std::vector<float>> feedback_of(const C& c) {
    std::vector<std::byte> blob;
    c.save_state(blob);
    auto st = commpact::load_feedback_state(blob, kind_of(blob), "commpact_hooks", momentum_of(c));
    return {std::move(st.ef.residual), std::move(st.ef.velocity)};
  }
  std::map<std::int64_t, entry> buckets_;
  feedback_by_parameter kept_;
};

}  // namespace commpact_hooks
