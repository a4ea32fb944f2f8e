// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file deferred_check.hpp
//! The deferred space's checker: the registry of every deferred buffer's storage and the
//! queued items that use it, and queue_state, one executor's FIFO queue, which refuses
//! work that touches another executor's queued work without a join. Part of
//! deferred_space (include commpact/space/deferred.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "deferred_span.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define COMMPACT_DEFERRED_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COMMPACT_DEFERRED_ASAN 1
#endif
#endif
#if defined(COMMPACT_DEFERRED_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace commpact {

namespace detail::deferred_check {

struct queue_state;

//! A from_host copy's source as it was when the copy was queued. When the source is
//! pinned memory and a to_host queued after the copy lands in the same bytes, that later
//! copy poisons them at once (a host read before its fence must see poison), while stream
//! order makes the earlier copy read them first: it reads the bytes recorded here, and
//! `overlaid` lists the ranges a later to_host poisoned (that copy checks them at its own
//! fence). Guarded by reg().m once registered.
struct host_source {
  const std::byte* lo = nullptr;
  const std::byte* hi = nullptr;
  const std::byte* as_queued = nullptr;  // hi - lo bytes, owned by the copy
  std::vector<std::pair<const std::byte*, const std::byte*>> overlaid;
};

//! One queued item's use of bytes [lo, hi) of a buffer's storage, until the item runs or
//! is dropped.
struct access {
  const queue_state* q;
  std::uint64_t seq;
  bool write;
  const std::byte* lo;
  const std::byte* hi;
  //! Whether this access uses some of [from, to).
  bool overlaps(const std::byte* from, const std::byte* to) const { return lo < to && from < hi; }
};

//! What the checker knows of one buffer's storage: its address range and the queued
//! items that use it. Held by the buffer and by every queued item that touches it, so
//! storage destroyed with work queued lives on here (never freed under queued work).
struct record {
  const std::byte* lo = nullptr;
  const std::byte* hi = nullptr;
  const char* kind = "deferred_buffer";  // or "pinned host buffer" (deferred_space::pinned)
  const char* type = "";
  std::vector<access> pending;
  std::vector<std::weak_ptr<host_source>> sources;  // queued from_host copies from this storage
  std::shared_ptr<void> orphan;  // the storage, once its buffer died (or reallocated it)
  //! The buffer destroyed this storage, or reallocated away from it (retired): the record
  //! stays in the registry while the storage is quarantined, so that work queued later
  //! through a span taken before raises (a GPU kernel would use freed memory).
  bool retired = false;
  const char* retired_how = "";
  //! Under ASan, quarantined storage no queued work uses is poisoned, so that a host read
  //! through a stale span of pinned memory still shows as a use after free.
  bool poisoned = false;

  record() = default;
  record(const record&) = delete;
  record& operator=(const record&) = delete;
  ~record() { unpoison(); }  // before `orphan` frees the storage
  void poison() noexcept {
#if defined(COMMPACT_DEFERRED_ASAN)
    if (!poisoned && orphan && hi > lo) ASAN_POISON_MEMORY_REGION(lo, static_cast<std::size_t>(hi - lo));
    poisoned = orphan && hi > lo;
#endif
  }
  void unpoison() noexcept {
#if defined(COMMPACT_DEFERRED_ASAN)
    if (poisoned) ASAN_UNPOISON_MEMORY_REGION(lo, static_cast<std::size_t>(hi - lo));
    poisoned = false;
#endif
  }
};

//! How much retired storage the checker keeps allocated at most (oldest released first),
//! so that a span of a destroyed or reallocated buffer is caught when work is queued on
//! it, and its address cannot be reused meanwhile: up to quarantine_bytes of storage and
//! quarantine_records records. Storage larger than quarantine_bytes is released at once,
//! leaving the others quarantined (a span of it is then not caught).
inline constexpr std::size_t quarantine_bytes = std::size_t{64} << 20;
inline constexpr std::size_t quarantine_records = std::size_t{1} << 16;

//! Every buffer's storage by its first byte (all ranks' threads share it): the live ones,
//! and the retired ones still quarantined; and the queued from_host sources in host
//! memory no buffer owns.
struct registry {
  std::mutex m;
  std::map<const std::byte*, std::shared_ptr<record>> by_lo;
  std::vector<std::weak_ptr<host_source>> loose;
  std::deque<std::shared_ptr<record>> quarantine;  // retired records, oldest first
  std::size_t quarantined = 0;                     // their storage's bytes
};
inline registry& reg() {
  static registry r;
  return r;
}

//! The record whose storage holds [p, p + bytes), or nullptr (memory no buffer owns,
//! such as a host span wrapped by a communicator test). Caller holds reg().m.
inline std::shared_ptr<record> find_locked(const void* p, std::size_t bytes) {
  if (p == nullptr || bytes == 0) return nullptr;
  auto& r = reg();
  const auto* b = static_cast<const std::byte*>(p);
  auto it = r.by_lo.upper_bound(b);
  if (it == r.by_lo.begin()) return nullptr;
  --it;
  const auto& rec = it->second;
  return b >= rec->lo && b + bytes <= rec->hi ? rec : nullptr;
}

//! Takes r's storage out of the registry (when it is still r's). Caller holds reg().m.
inline void erase_locked(const std::shared_ptr<record>& r) {
  auto& by = reg().by_lo;
  auto it = by.find(r->lo);
  if (it != by.end() && it->second == r) by.erase(it);
}

//! Retires r: its buffer destroyed it or reallocated away from it, handing over the
//! storage (`storage`, kept allocated). r stays registered, marked retired, while it is
//! quarantined; the oldest retired records leave (their storage freed, unless queued work
//! still uses it: then it goes with the last such item) once more than quarantine_bytes
//! are kept. Caller holds reg().m.
inline void retire_locked(const std::shared_ptr<record>& r, std::shared_ptr<void> storage, const char* how) noexcept {
  auto& g = reg();
  r->retired = true;
  r->retired_how = how;
  r->orphan = std::move(storage);
  // Leaves the registry now: the storage is freed unless queued work still uses it (then
  // it goes with the last such item, which the fence drops unrun).
  auto release = [](const std::shared_ptr<record>& x) noexcept {
    erase_locked(x);
    if (x->pending.empty()) {
      x->unpoison();
      x->orphan.reset();
    }
  };
  const auto bytes = static_cast<std::size_t>(r->hi - r->lo);
  if (bytes > quarantine_bytes) return release(r);  // too large to keep: the others stay
  try {
    g.quarantine.push_back(r);
  } catch (...) {  // no room to remember it: release it now (not caught later)
    return release(r);
  }
  g.quarantined += bytes;
  if (r->pending.empty()) r->poison();  // storage queued work uses stays readable for its drop
  while ((g.quarantined > quarantine_bytes || g.quarantine.size() > quarantine_records) && !g.quarantine.empty()) {
    auto old = std::move(g.quarantine.front());
    g.quarantine.pop_front();
    g.quarantined -= static_cast<std::size_t>(old->hi - old->lo);
    release(old);
  }
}

inline std::string describe(const record& r) {
  return cat("a ", r.kind, "<", r.type, "> of ", static_cast<std::size_t>(r.hi - r.lo), " bytes at ",
             static_cast<const void*>(r.lo));
}

}  // namespace detail::deferred_check

namespace detail::deferred_check {

//! One queued operation: its order on the queue, its work, and the storage it touches.
struct item {
  std::uint64_t seq = 0;
  std::function<void()> run;
  std::vector<std::pair<std::shared_ptr<record>, bool>> touches;  // record, writes
};

//! The state of one deferred executor: its FIFO queue and what the checker needs.
struct queue_state {
  std::deque<item> work;
  std::uint64_t enqueued = 0, fences = 0, ran = 0;
  //! Another queue's work this one joined: accesses there with seq < bound are ordered
  //! before everything queued here since the join (made when this queue's seq was at).
  struct join_entry {
    const queue_state* q;
    std::uint64_t bound, at;
  };
  std::vector<join_entry> joined;
  //! Set when a buffer used by this queue's work was destroyed: the next fence raises it.
  std::string violation;

  queue_state() = default;
  queue_state(const queue_state&) = delete;
  queue_state& operator=(const queue_state&) = delete;
  ~queue_state() { drop(); }

  std::uint64_t joined_bound(const queue_state* o) const {
    for (const auto& j : joined)
      if (j.q == o) return j.bound;
    return 0;
  }
  void join_one(const queue_state* o, std::uint64_t bound) {
    if (o == this) return;
    for (auto& j : joined)
      if (j.q == o) {
        j.bound = std::max(j.bound, bound);
        return;
      }
    joined.push_back({o, bound, enqueued});
  }
  //! Joins o's work before `bound`, and (transitively) whatever o had joined before it.
  void join(const queue_state& o, std::uint64_t bound) {
    join_one(&o, bound);
    for (const auto& j : o.joined)
      if (j.at < bound) join_one(j.q, j.bound);
  }
  //! Forgets an item's accesses (it ran, or it is dropped).
  void release(item& it) noexcept {
    if (it.touches.empty()) return;
    std::lock_guard lk(reg().m);
    for (auto& [r, w] : it.touches) {
      auto& p = r->pending;
      for (auto a = p.begin(); a != p.end(); ++a)
        if (a->q == this && a->seq == it.seq && a->write == w) {
          p.erase(a);
          break;
        }
    }
    it.touches.clear();
  }
  //! Drops every queued item without running it.
  void drop() noexcept {
    while (!work.empty()) {
      release(work.front());
      work.pop_front();
    }
  }
  //! Runs the front item; its accesses are released once it has run (or raised).
  void run_front() {
    item it = std::move(work.front());
    work.pop_front();
    ++ran;
    try {
      it.run();
    } catch (...) {
      release(it);
      throw;
    }
    release(it);
  }
  //! Runs this queue's items with seq < bound (a join from another executor's fence).
  void run_until(std::uint64_t bound) {
    try {
      while (!work.empty() && work.front().seq < bound) {
        if (!violation.empty()) raise_violation();
        run_front();
      }
    } catch (...) {
      drop();
      throw;
    }
  }
  [[noreturn]] void raise_violation() {
    std::string why;
    why.swap(violation);
    drop();
    throw usage_error(why);
  }
};

//! The checker's view of one span an operation touches.
struct touch {
  const void* p;
  std::size_t bytes;
  bool write;
};

//! Registers an item's accesses, raising usage_error (and queueing nothing) when one
//! overlaps bytes that work queued on another executor, not joined by this one, uses
//! (one of the two writing). Disjoint parts of one buffer are independent, as on a GPU.
inline void check_and_register(queue_state& q, item& it, std::span<const touch> ts) {
  if (ts.empty()) return;
  std::lock_guard lk(reg().m);
  std::vector<std::pair<const std::byte*, const std::byte*>> ranges;
  for (const auto& t : ts) {
    auto r = find_locked(t.p, t.bytes);
    if (!r) continue;
    const record& rec = *r;
    if (rec.retired)
      throw usage_error(cat("commpact::deferred_space: an operation ", t.write ? "writes " : "reads ",
                            describe(rec), " through a span taken before that buffer was ", rec.retired_how,
                            "; on a GPU the work would use freed memory. Keep a buffer alive until the fence "
                            "that runs the work queued on it, and take its spans again after it grows past its "
                            "capacity."));
    const auto* lo = static_cast<const std::byte*>(t.p);
    const auto* hi = lo + t.bytes;
    it.touches.emplace_back(std::move(r), t.write);  // registered below, once all are checked
    ranges.emplace_back(lo, hi);
    for (const auto& a : rec.pending) {
      if (a.q == &q || !(a.write || t.write)) continue;
      if (!a.overlaps(lo, hi)) continue;
      if (a.seq < q.joined_bound(a.q)) continue;
      throw usage_error(cat("commpact::deferred_space: an operation queued on one executor ",
                            t.write ? "writes " : "reads ", describe(rec), " that an operation queued on another ",
                            "executor ", a.write ? "writes" : "reads", " with no join between them; make this "
                            "executor wait for the other (deferred_space::wait(exec, deferred_space::record(other))) "
                            "before queueing (on a GPU the two streams would race)."));
    }
  }
  for (std::size_t i = 0; i < it.touches.size(); ++i) {
    auto& [r, w] = it.touches[i];
    r->pending.push_back({&q, it.seq, w, ranges[i].first, ranges[i].second});
  }
}

//! Whether [p, p + bytes) lies in watched storage (a deferred buffer, or pinned host
//! memory: deferred_space::pinned).
inline bool watched(const void* p, std::size_t bytes) {
  std::lock_guard lk(reg().m);
  return find_locked(p, bytes) != nullptr;
}

//! Whether queued work (on any executor) writes some of [p, p + bytes).
inline bool written_by_queued_work(const void* p, std::size_t bytes) {
  std::lock_guard lk(reg().m);
  const auto r = find_locked(p, bytes);
  if (!r) return false;
  const auto* lo = static_cast<const std::byte*>(p);
  for (const auto& a : r->pending)
    if (a.write && a.overlaps(lo, lo + bytes)) return true;
  return false;
}

//! Whether bytes [lo, hi) of `now` equal those of `then` (both laid over [base, ...)),
//! ignoring the ranges in `skip`.
inline bool same_outside(const std::byte* base, const std::byte* now, const std::byte* then, const std::byte* lo,
                         const std::byte* hi,
                         const std::vector<std::pair<const std::byte*, const std::byte*>>& skip) {
  if (skip.empty()) return std::memcmp(now + (lo - base), then + (lo - base), static_cast<std::size_t>(hi - lo)) == 0;
  std::vector<char> skipped(static_cast<std::size_t>(hi - lo), 0);
  for (const auto& [a, b] : skip)
    for (const auto* x = std::max(a, lo); x < std::min(b, hi); ++x) skipped[static_cast<std::size_t>(x - lo)] = 1;
  for (const auto* x = lo; x < hi; ++x) {
    const auto i = static_cast<std::size_t>(x - base);
    if (!skipped[static_cast<std::size_t>(x - lo)] && now[i] != then[i]) return false;
  }
  return true;
}

//! The list of queued from_host sources that [p, p + bytes) would be found in: its
//! storage's, or the registry's list for memory no buffer owns. Caller holds reg().m.
inline std::vector<std::weak_ptr<host_source>>& sources_locked(const void* p, std::size_t bytes) {
  if (auto r = find_locked(p, bytes)) return r->sources;
  return reg().loose;
}

//! Registers a queued from_host copy's source, so that a to_host queued later into the
//! same memory finds it (sources_under).
inline void register_source(const std::shared_ptr<host_source>& s) {
  std::lock_guard lk(reg().m);
  auto& list = sources_locked(s->lo, static_cast<std::size_t>(s->hi - s->lo));
  std::erase_if(list, [](const auto& w) { return w.expired(); });
  list.push_back(s);
}

//! Whether the source still holds, outside the ranges later copies overlaid, what it held
//! when its copy was queued.
inline bool source_unchanged(const host_source& s) {
  std::lock_guard lk(reg().m);
  return same_outside(s.lo, s.lo, s.as_queued, s.lo, s.hi, s.overlaid);
}

//! The queued from_host sources that a to_host into [p, p + bytes) overlays. Raises
//! usage_error when the host changed one of them since its copy was queued (the later
//! copy's poison would hide that write; on a GPU the earlier copy could read either).
inline std::vector<std::shared_ptr<host_source>> sources_under(const void* p, std::size_t bytes) {
  std::vector<std::shared_ptr<host_source>> out;
  if (p == nullptr || bytes == 0) return out;
  std::lock_guard lk(reg().m);
  const auto* lo = static_cast<const std::byte*>(p);
  const auto* hi = lo + bytes;
  for (const auto& w : sources_locked(p, bytes)) {
    auto s = w.lock();
    if (!s || !(s->lo < hi && lo < s->hi)) continue;
    if (!same_outside(s->lo, s->lo, s->as_queued, std::max(lo, s->lo), std::min(hi, s->hi), s->overlaid))
      throw usage_error(cat("commpact::deferred_space: the host changed the source of a queued from_host copy (",
                            static_cast<std::size_t>(s->hi - s->lo), " bytes at ", static_cast<const void*>(s->lo),
                            ") before a to_host into the same memory was queued: on a GPU the first copy "
                            "could read either value. Keep a from_host source unchanged until the fence that "
                            "runs the copy."));
    out.push_back(std::move(s));
  }
  return out;
}

//! Records that a to_host queued into [p, p + bytes) overlays those bytes of `under`,
//! and runs poison() (the copy's poisoning) under the same lock, so that a source's
//! check on another thread sees both or neither.
template <class Poison>
void overlay(const std::vector<std::shared_ptr<host_source>>& under, const void* p, std::size_t bytes,
             Poison&& poison) {
  if (under.empty()) return poison();
  std::lock_guard lk(reg().m);
  const auto* lo = static_cast<const std::byte*>(p);
  for (const auto& s : under) s->overlaid.emplace_back(std::max(lo, s->lo), std::min(lo + bytes, s->hi));
  poison();
}

template <class T>
touch touch_of(deferred_span<T> s) {
  return {s.address(), s.size_bytes(), !std::is_const_v<T>};
}

}  // namespace detail::deferred_check

}  // namespace commpact
