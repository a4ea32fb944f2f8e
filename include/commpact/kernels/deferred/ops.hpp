// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file ops.hpp
//! ops<deferred_space>: every row of the kernel table (kernels/ops.hpp) queued on the
//! executor and run by the next fence, as the host kernel on the spans' host storage.
//! So the deferred space computes exactly the host's bits, only later. Every row tells
//! the checker which buffers it touches, and to_host poisons its host side when queued.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>
#include <functional>
#include <span>
#include <type_traits>

#include "../../space/deferred.hpp"
#include "../../wire/codec_frame.hpp"
#include "../host/ops.hpp"

namespace commpact {

namespace detail::deferred {
// What a queued kernel captures: spans, scalars and frame headers by value; codecs,
// workspaces and other objects by reference (they outlive the fence, as device
// workspaces do); views as views.
template <class T>
inline constexpr bool by_value = std::is_arithmetic_v<T> || std::is_enum_v<T>;
template <>
inline constexpr bool by_value<frame::header> = true;

template <class T>
deferred_span<T> cap(deferred_span<T> s) {
  return s;
}
template <class T>
std::span<T> cap(std::span<T> s) {
  return s;
}
template <class T>
  requires by_value<T>
T cap(T v) {
  return v;
}
inline sparse_tree_views<deferred_span> cap(const sparse_tree_views<deferred_span>& v) { return v; }
template <class T>
  requires(!by_value<std::remove_const_t<T>> &&
           !std::is_same_v<std::remove_const_t<T>, sparse_tree_views<deferred_span>>)
std::reference_wrapper<T> cap(T& v) {
  return std::ref(v);
}

template <class T>
std::span<T> un(deferred_span<T> s) {
  return deferred_access::host(s);
}
template <class T>
std::span<T> un(std::span<T> s) {
  return s;
}
template <class T>
T un(T v) {
  return v;
}
template <class T>
T& un(std::reference_wrapper<T> r) {
  return r.get();
}
inline host_tree_views un(const sparse_tree_views<deferred_span>& v) {
  return v.map<host_span>([](auto s) { return deferred_access::host(s); });
}

// The storage an argument touches, for the checker (space/deferred.hpp): a deferred
// span (const: read; otherwise written), every span of a tree's views (written), and a
// host span (the host side of a copy: the checker watches it when it is pinned memory).
template <class T>
void touches(std::vector<deferred_check::touch>& ts, deferred_span<T> s) {
  ts.push_back(deferred_check::touch_of(s));
}
template <class T>
void touches(std::vector<deferred_check::touch>& ts, std::span<T> s) {
  ts.push_back({s.data(), s.size_bytes(), !std::is_const_v<T>});
}
inline void touches(std::vector<deferred_check::touch>& ts, const sparse_tree_views<deferred_span>& v) {
  (void)v.map<deferred_span>([&](auto s) {
    ts.push_back(deferred_check::touch_of(s));
    return s;
  });
}
template <class T>
void touches(std::vector<deferred_check::touch>&, const T&) {}

//! What a host copy holds until the fence that covers it: NaN for floats, 0xFF bytes
//! otherwise (so a status word reads status_unfenced, kernels/status.hpp).
template <class T>
void poison_host(std::span<T> h) {
  if constexpr (std::is_same_v<std::remove_cv_t<T>, float>) {
    for (auto& x : h) x = std::numeric_limits<float>::quiet_NaN();
  } else {
    std::memset(static_cast<void*>(h.data()), 0xFF, h.size_bytes());
  }
}
//! Whether h still holds what poison_host wrote.
template <class T>
bool poisoned(std::span<T> h) {
  if constexpr (std::is_same_v<std::remove_cv_t<T>, float>) {
    const auto nan = std::bit_cast<std::uint32_t>(std::numeric_limits<float>::quiet_NaN());
    return std::all_of(h.begin(), h.end(), [&](float x) { return std::bit_cast<std::uint32_t>(x) == nan; });
  } else {
    const auto* b = reinterpret_cast<const unsigned char*>(h.data());
    return std::all_of(b, b + h.size_bytes(), [](unsigned char c) { return c == 0xFF; });
  }
}
}  // namespace detail::deferred

//! Queues host_row(host storage of args...) on e, to run at the next fence, and tells the
//! checker (space/deferred.hpp) what it touches: every deferred span (a const one is
//! read, any other written) and every span of a tree's views. Spans, scalars and frame
//! headers are captured by value, anything else (a codec, a workspace, a string the row
//! writes) by reference: it must outlive the fence. A row of ops<deferred_space> is
//! `deferred_row(e, [](auto&&... x) { H::row({}, x...); }, args...)`, H = ops<host_space>.
template <class F, class... A>
void deferred_row(const deferred_space::exec& e, F host_row, A&&... a) {
  std::vector<detail::deferred_check::touch> ts;
  (detail::deferred::touches(ts, a), ...);
  e.enqueue_touching([host_row, ... c = detail::deferred::cap(a)]() mutable { host_row(detail::deferred::un(c)...); },
                     ts);
}

template <>
struct ops<deferred_space> {
  using exec = deferred_space::exec;
  template <class T>
  using span = deferred_span<T>;
  using tree_views = sparse_tree_views<deferred_span>;
  using H = ops<host_space>;
  using topk_workspace = host::topk_workspace;
  using merge_workspace = host::merge_workspace;
  template <class Codec>
  using codec_workspace = H::codec_workspace<Codec>;
  template <class Codec>
  using choco_workspace = H::choco_workspace<Codec>;

#define COMMPACT_DEFERRED_OP(name)                                                               \
  template <class... A>                                                                          \
  static void name(const exec& e, A&&... a) {                                                    \
    deferred_row(e, [](auto&&... x) { H::name({}, x...); }, std::forward<A>(a)...);              \
  }
  COMMPACT_DEFERRED_OP(fill)
  COMMPACT_DEFERRED_OP(copy)
  //! Queued like every row, and the host side is poisoned now: a read before the fence
  //! that covers the copy sees poison, never stale or final data. When the host side is
  //! pinned memory (deferred_space::pinned) that no earlier queued work writes, a host
  //! write to it before the copy runs raises usage_error at the fence (on a GPU the copy
  //! would overwrite it, or not, depending on timing).
  //! A from_host copy from the same memory queued before this one (and not yet fenced)
  //! reads what the memory held when it was queued, as stream order gives on a GPU.
  template <class Src, class T>
  static void to_host(const exec& e, Src src, std::span<T> host) {
    const bool watch = !host.empty() && detail::deferred_check::watched(host.data(), host.size_bytes()) &&
                       !detail::deferred_check::written_by_queued_work(host.data(), host.size_bytes());
    const auto under = detail::deferred_check::sources_under(host.data(), host.size_bytes());
    deferred_row(
        e,
        [watch](auto s, auto h) {
          if (watch && !detail::deferred::poisoned(h))
            throw usage_error(detail::cat(
                "commpact::deferred_space: the host wrote the pinned memory a queued to_host copy lands in (",
                h.size_bytes(), " bytes at ", static_cast<const void*>(h.data()),
                ") before the fence that ran the copy: on a GPU the copy overwrites that write, or not, "
                "depending on timing. Fence first, or write elsewhere."));
          H::to_host({}, s, h);
        },
        src, host);
    detail::deferred_check::overlay(under, host.data(), host.size_bytes(),
                                    [&] { detail::deferred::poison_host(host); });
  }
  //! Queued like every row; the host side is read when the copy runs (kernels/ops.hpp),
  //! so the host must not change it before the fence: a source that changed in between
  //! raises usage_error there (on a GPU the copy could read either value). A source that
  //! queued work writes (pinned memory a copy lands in first) is ordered by the checker's
  //! rules instead. A to_host queued later into the same memory is no change: the copy
  //! reads what the source held when it was queued (stream order).
  template <class U, class T>
  static void from_host(const exec& e, std::span<U> host, deferred_span<T> dst) {
    using V = std::remove_cv_t<U>;
    struct source : detail::deferred_check::host_source {
      std::vector<V> v;
    };
    std::shared_ptr<source> as_queued;
    if (!host.empty() && !detail::deferred_check::written_by_queued_work(host.data(), host.size_bytes())) {
      as_queued = std::make_shared<source>();
      as_queued->v.assign(host.begin(), host.end());
      as_queued->lo = reinterpret_cast<const std::byte*>(host.data());
      as_queued->hi = as_queued->lo + host.size_bytes();
      as_queued->as_queued = reinterpret_cast<const std::byte*>(as_queued->v.data());
      detail::deferred_check::register_source(as_queued);
    }
    deferred_row(
        e,
        [as_queued](std::span<U> h, std::span<T> d) {
          if (!as_queued) return H::from_host({}, h, d);
          if (!detail::deferred_check::source_unchanged(*as_queued))
            throw usage_error(detail::cat(
                "commpact::deferred_space: the host source of a from_host copy (", h.size_bytes(), " bytes at ",
                static_cast<const void*>(h.data()), ") changed between the call and the fence that ran the copy: "
                "the host wrote it, or a to_host queued before it lands there (host memory is read and written "
                "when the work runs, kernels/ops.hpp; fence first, or copy through pinned memory). Keep it "
                "unchanged (and alive) until that fence (on a GPU the copy could read either value)."));
          H::from_host({}, std::span<const V>(as_queued->v), d);
        },
        host, dst);
  }
  COMMPACT_DEFERRED_OP(mean)
  COMMPACT_DEFERRED_OP(mean_into)
  COMMPACT_DEFERRED_OP(frame_gate)
  COMMPACT_DEFERRED_OP(ef_accumulate)
  COMMPACT_DEFERRED_OP(sub)
  COMMPACT_DEFERRED_OP(clip_scale)
  COMMPACT_DEFERRED_OP(topk_abs)
  COMMPACT_DEFERRED_OP(scatter_mean)
  COMMPACT_DEFERRED_OP(zero_delivered)
  COMMPACT_DEFERRED_OP(tree_local)
  COMMPACT_DEFERRED_OP(tree_payload)
  COMMPACT_DEFERRED_OP(tree_absorb)
  COMMPACT_DEFERRED_OP(tree_scatter)
  COMMPACT_DEFERRED_OP(tree_zero_delivered)
  // training (DataParallel, Sgd)
  COMMPACT_DEFERRED_OP(add)
  COMMPACT_DEFERRED_OP(sgd_step)
  // PowerCompressor
  COMMPACT_DEFERRED_OP(check_finite)
  COMMPACT_DEFERRED_OP(copy_if_clear)
  // Nothing to prepare on the host (power_products.hpp): not queued.
  static void lowrank_prepare(const exec&, std::size_t, std::size_t, std::size_t, power_products) {}
  COMMPACT_DEFERRED_OP(lowrank_project)
  COMMPACT_DEFERRED_OP(lowrank_back_project)
  COMMPACT_DEFERRED_OP(lowrank_approx_residual)
  COMMPACT_DEFERRED_OP(orthonormalize)
  COMMPACT_DEFERRED_OP(gaussian)
  COMMPACT_DEFERRED_OP(redraw_zero_columns)
  // GossipMixer
  COMMPACT_DEFERRED_OP(gossip_check)
  COMMPACT_DEFERRED_OP(gossip_agree_begin)
  COMMPACT_DEFERRED_OP(gossip_agree_end)
  COMMPACT_DEFERRED_OP(gossip_pack)
  COMMPACT_DEFERRED_OP(gossip_mix)
  COMMPACT_DEFERRED_OP(choco_update)
  COMMPACT_DEFERRED_OP(oktopk_local)  // OkTopK
  COMMPACT_DEFERRED_OP(oktopk_begin)  // SparseReduceScatter
  COMMPACT_DEFERRED_OP(oktopk_frames)  // OkTopK
  COMMPACT_DEFERRED_OP(oktopk_region_sum)  // OkTopK
  COMMPACT_DEFERRED_OP(oktopk_mags)  // OkTopK
  COMMPACT_DEFERRED_OP(oktopk_theta)  // OkTopK
  COMMPACT_DEFERRED_OP(oktopk_select)  // OkTopK
  COMMPACT_DEFERRED_OP(oktopk_output)  // OkTopK
  COMMPACT_DEFERRED_OP(oktopk_clear_selected)  // OkTopK
  // LinearCompressor (Allreduce<C>) and MajorityVote (Vote<C>)
  COMMPACT_DEFERRED_OP(linear_encode)
  COMMPACT_DEFERRED_OP(linear_decode)
  COMMPACT_DEFERRED_OP(linear_feedback)
  COMMPACT_DEFERRED_OP(signum_update)
  COMMPACT_DEFERRED_OP(sign_vote)
  COMMPACT_DEFERRED_OP(power_gossip_orthonormalize)  // PowerGossip
  COMMPACT_DEFERRED_OP(power_gossip_update)  // PowerGossip
  COMMPACT_DEFERRED_OP(power_gossip_vectors)  // PowerGossip
  COMMPACT_DEFERRED_OP(tree_begin)  // TreeMerge
  COMMPACT_DEFERRED_OP(tree_status)  // TreeMerge
#undef COMMPACT_DEFERRED_OP
  // A row templated on a codec type K: ops<deferred_space>::name<K>(e, args...).
#define COMMPACT_DEFERRED_OP_T(name)                                                                       \
  template <class K, class... A>                                                                           \
  static void name(const exec& e, A&&... a) {                                                              \
    deferred_row(e, [](auto&&... x) { H::template name<K>({}, x...); }, std::forward<A>(a)...);            \
  }
  COMMPACT_DEFERRED_OP_T(cast_encode)       // CastAllreduce
  COMMPACT_DEFERRED_OP_T(cast_add)          // CastAllreduce
  COMMPACT_DEFERRED_OP_T(cast_decode_mean)  // CastAllreduce
  COMMPACT_DEFERRED_OP_T(codec_encode_frame)     // CodecCompressor, MajorityVote
  COMMPACT_DEFERRED_OP_T(codec_decode_sum)       // Allgather<C>
  COMMPACT_DEFERRED_OP_T(codec_clear_delivered)  // CodecCompressor
  COMMPACT_DEFERRED_OP_T(choco_encode)           // GossipMixer (CHOCO)
  COMMPACT_DEFERRED_OP_T(choco_decode)           // GossipMixer (CHOCO)
#undef COMMPACT_DEFERRED_OP_T
};

}  // namespace commpact
