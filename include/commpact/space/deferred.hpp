// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file deferred.hpp
//! deferred_space: CI's stand-in for a GPU. Data lives in host memory behind a
//! device-style span that host code cannot index (a compile error, with a sentence
//! saying why), and every kernel and collective is queued on the executor and runs only
//! at the fence, in order. It is also a checker of the rules a GPU punishes without a
//! word (each raises usage_error; see deferred_space below): a host copy read before its
//! fence reads poison, work that uses another executor's results without a join, and a
//! buffer regrown or destroyed with work queued on it.
//!
//! \code
//! auto e = commpact::deferred_space::make_exec();
//! commpact::deferred_space::buffer<float> b;
//! b.resize(4);                                            // new storage is NaN-poisoned
//! commpact::ops<commpact::deferred_space>::fill(e, b.view(), 1.0f);   // queued
//! std::array<float, 4> h{};
//! commpact::ops<commpact::deferred_space>::to_host(e, b.cview(), std::span(h));  // queued
//! // h is all NaN here (poisoned when the copy was queued): nothing has run
//! commpact::deferred_space::fence(e, commpact::no_deadline());            // runs both
//! \endcode
//!
//! Buffers are grow-only like the host's; size them before queueing work on them, as on
//! a GPU (growing one past its capacity while work uses it raises).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <array>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "host.hpp"

namespace commpact {

namespace detail {
template <class>
inline constexpr bool always_false = false;
}

//! A view of device memory in the deferred space: a pointer and a length, with no
//! element access from host code. Kernels (ops<deferred_space>) unwrap it.
template <class T>
class deferred_span {
 public:
  using element_type = T;
  deferred_span() = default;
  //! A non-const span converts to a const one.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  deferred_span(deferred_span<U> o) : p_(o.p_), n_(o.n_) {}

  std::size_t size() const { return n_; }
  std::size_t size_bytes() const { return n_ * sizeof(T); }
  bool empty() const { return n_ == 0; }
  deferred_span subspan(std::size_t off, std::size_t count = std::size_t(-1)) const {
    require(off <= n_, "commpact::deferred_span::subspan: offset ", off, " is past the end (", n_, " elements).");
    const std::size_t c = count == std::size_t(-1) ? n_ - off : count;
    require(c <= n_ - off, "commpact::deferred_span::subspan: ", c, " elements from ", off, " run past the end (",
            n_, " elements).");
    return deferred_span(p_ + off, c);
  }
  deferred_span first(std::size_t count) const { return subspan(0, count); }
  //! Where the span starts, for identity checks only (never dereference it: device memory).
  const void* address() const { return p_; }

  //! Host code cannot read device memory: copy it with ops<deferred_space>::to_host and
  //! fence first.
  template <class I>
  T& operator[](I) const {
    static_assert(detail::always_false<I>,
                  "commpact: a deferred_span is device memory: host code cannot index it. Copy it to the host with "
                  "ops<deferred_space>::to_host(exec, span, host_span) and fence the executor first.");
    return *p_;
  }
  template <class I = void>
  T* begin() const {
    static_assert(detail::always_false<I>,
                  "commpact: a deferred_span is device memory: host code cannot iterate it. Copy it to the host with "
                  "ops<deferred_space>::to_host(exec, span, host_span) and fence the executor first.");
    return p_;
  }

 private:
  deferred_span(T* p, std::size_t n) : p_(p), n_(n) {}
  template <class>
  friend class deferred_span;
  template <class>
  friend class deferred_buffer;
  friend struct deferred_access;
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

//! The one door from a deferred span to its host storage: for kernels (ops) and
//! communicators of the deferred space, never for algorithm code.
struct deferred_access {
  template <class T>
  static std::span<T> host(deferred_span<T> s) {
    return {s.p_, s.n_};
  }
  template <class T>
  static deferred_span<T> wrap(std::span<T> s) {
    return {s.data(), s.size()};
  }
};

//! The bytes of a deferred span, still in the deferred space (for known-size
//! point-to-point of typed buffers; found by argument-dependent lookup, as std::as_bytes
//! is for std::span).
template <class T>
deferred_span<const std::byte> as_bytes(deferred_span<T> s) {
  return deferred_access::wrap(std::as_bytes(deferred_access::host(s)));
}
template <class T>
  requires(!std::is_const_v<T>)
deferred_span<std::byte> as_writable_bytes(deferred_span<T> s) {
  return deferred_access::wrap(std::as_writable_bytes(deferred_access::host(s)));
}

namespace detail::deferred_check {

struct queue_state;

//! One queued item's use of a buffer's storage, until the item runs or is dropped.
struct access {
  const queue_state* q;
  std::uint64_t seq;
  bool write;
};

//! What the checker knows of one buffer's storage: its address range and the queued
//! items that use it. Held by the buffer and by every queued item that touches it, so
//! storage destroyed with work queued lives on here (never freed under queued work).
struct record {
  const std::byte* lo = nullptr;
  const std::byte* hi = nullptr;
  const char* type = "";
  std::vector<access> pending;
  std::shared_ptr<void> orphan;  // the storage, once its buffer died with work queued
};

//! Every live buffer's storage by its first byte (all ranks' threads share it).
struct registry {
  std::mutex m;
  std::map<const std::byte*, std::shared_ptr<record>> by_lo;
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

inline std::string describe(const record& r) {
  return cat("a deferred_buffer<", r.type, "> of ", static_cast<std::size_t>(r.hi - r.lo), " bytes at ",
             static_cast<const void*>(r.lo));
}

}  // namespace detail::deferred_check

//! Grow-only device storage of the deferred space. New storage is poisoned (NaN bits
//! for floats, 0xA5 bytes otherwise), so a kernel that reads what nobody wrote shows.
//! The checker (see deferred_space) watches it: growing it past its capacity while
//! work queued on any executor still uses it raises usage_error, and destroying it
//! with work queued keeps its storage alive and makes that executor's next fence raise
//! usage_error (a destructor cannot throw) instead of running the work on freed memory.
template <class T>
class deferred_buffer {
 public:
  deferred_buffer() = default;
  deferred_buffer(const deferred_buffer& o) {
    o.require_idle("copied");
    if (o.v_) {
      v_ = std::make_shared<std::vector<T>>(*o.v_);
      enroll();
    }
  }
  deferred_buffer& operator=(const deferred_buffer& o) {
    if (this != &o) {
      deferred_buffer t(o);
      swap(t);
    }
    return *this;
  }
  deferred_buffer(deferred_buffer&& o) noexcept { swap(o); }
  deferred_buffer& operator=(deferred_buffer&& o) noexcept {
    swap(o);
    return *this;
  }
  ~deferred_buffer() { retire(); }

  void resize(std::size_t n) {
    const std::size_t old = size();
    if (n > capacity()) regrow(n);
    vec().resize(n);
    poison(old);
  }
  void reserve(std::size_t n) {
    if (n > capacity()) regrow(n);
  }
  //! The same, ordered on an executor (the CUDA space allocates on its stream).
  void resize(std::size_t n, const auto&) { resize(n); }
  void reserve(std::size_t n, const auto&) { reserve(n); }
  std::size_t size() const { return v_ ? v_->size() : 0; }
  std::size_t capacity() const { return v_ ? v_->capacity() : 0; }
  bool empty() const { return size() == 0; }
  void clear() {
    if (v_) v_->clear();
  }
  deferred_span<T> view() { return {ptr(), size()}; }
  deferred_span<const T> view() const { return {ptr(), size()}; }
  deferred_span<const T> cview() const { return view(); }
  const void* data() const { return ptr(); }
  void swap(deferred_buffer& o) noexcept {
    v_.swap(o.v_);
    rec_.swap(o.rec_);
  }

 private:
  using record = detail::deferred_check::record;
  T* ptr() const { return v_ ? v_->data() : nullptr; }
  std::vector<T>& vec() {
    if (!v_) v_ = std::make_shared<std::vector<T>>();
    return *v_;
  }
  void require_idle(const char* what) const {
    if (!rec_) return;
    std::lock_guard lk(detail::deferred_check::reg().m);
    if (!rec_->pending.empty())
      throw usage_error(detail::cat("commpact::deferred_space: ", detail::deferred_check::describe(*rec_), " was ",
                                    what, " while ", rec_->pending.size(),
                                    " queued operations still use it; fence the executor first (on a GPU this "
                                    "would touch memory that queued kernels read or write)."));
  }
  //! New storage of n elements, the contents kept: only when no queued work uses the old.
  void regrow(std::size_t n) {
    require_idle("regrown (reallocated)");
    auto& v = vec();
    unenroll();
    v.reserve(n);
    enroll();
  }
  void enroll() {
    if (!v_ || v_->capacity() == 0) return;
    auto r = std::make_shared<record>();
    r->lo = reinterpret_cast<const std::byte*>(v_->data());
    r->hi = r->lo + v_->capacity() * sizeof(T);
    r->type = type_name();
    std::lock_guard lk(detail::deferred_check::reg().m);
    detail::deferred_check::reg().by_lo[r->lo] = r;
    rec_ = std::move(r);
  }
  void unenroll() {
    if (!rec_) return;
    std::lock_guard lk(detail::deferred_check::reg().m);
    detail::deferred_check::erase_locked(rec_);
    rec_.reset();
  }
  //! The destructor's half of the checker: storage still used by queued work is handed
  //! to the record (kept alive until that work is dropped) and its executors are told.
  void retire() noexcept;
  static const char* type_name() {
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, std::byte>) return "std::byte";
    else if constexpr (std::is_same_v<T, std::uint32_t>) return "std::uint32_t";
    else if constexpr (std::is_same_v<T, std::int32_t>) return "std::int32_t";
    else if constexpr (std::is_same_v<T, std::int64_t>) return "std::int64_t";
    else return "T";
  }
  void poison(std::size_t from) {
    if (from >= size()) return;
    auto& v = *v_;
    if constexpr (std::is_same_v<T, float>) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (std::size_t i = from; i < v.size(); ++i) v[i] = nan;
    } else {
      std::memset(static_cast<void*>(v.data() + from), 0xA5, (v.size() - from) * sizeof(T));
    }
  }
  std::shared_ptr<std::vector<T>> v_;
  std::shared_ptr<record> rec_;
};

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
//! conflicts with work queued on another executor that this one has not joined.
inline void check_and_register(queue_state& q, item& it, std::span<const touch> ts) {
  if (ts.empty()) return;
  std::lock_guard lk(reg().m);
  for (const auto& t : ts) {
    auto r = find_locked(t.p, t.bytes);
    if (!r) continue;
    const record& rec = *r;
    it.touches.emplace_back(std::move(r), t.write);  // registered below, once all are checked
    for (const auto& a : rec.pending) {
      if (a.q == &q || !(a.write || t.write)) continue;
      if (a.seq < q.joined_bound(a.q)) continue;
      throw usage_error(cat("commpact::deferred_space: an operation queued on one executor ",
                            t.write ? "writes " : "reads ", describe(rec), " that an operation queued on another ",
                            "executor ", a.write ? "writes" : "reads", " with no join between them; make this "
                            "executor wait for the other (deferred_space::wait(exec, deferred_space::record(other))) "
                            "before queueing (on a GPU the two streams would race)."));
    }
  }
  for (auto& [r, w] : it.touches) r->pending.push_back({&q, it.seq, w});
}

template <class T>
touch touch_of(deferred_span<T> s) {
  return {s.address(), s.size_bytes(), !std::is_const_v<T>};
}

}  // namespace detail::deferred_check

template <class T>
void deferred_buffer<T>::retire() noexcept {
  if (!rec_) return;
  std::lock_guard lk(detail::deferred_check::reg().m);
  detail::deferred_check::erase_locked(rec_);
  if (!rec_->pending.empty()) {
    try {
      const auto why = detail::cat("commpact::deferred_space: ", detail::deferred_check::describe(*rec_),
                                   " was destroyed while ", rec_->pending.size(),
                                   " queued operations still used it; the queued work is dropped (on a GPU it "
                                   "would run on freed memory). Fence before destroying a buffer.");
      for (const auto& a : rec_->pending) {
        auto* q = const_cast<detail::deferred_check::queue_state*>(a.q);
        if (q->violation.empty()) q->violation = why;
      }
    } catch (...) {
    }
    rec_->orphan = std::move(v_);  // lives until the last item that touches it is gone
  }
  rec_.reset();
}

//! The work queue behind a deferred executor.
using deferred_queue = detail::deferred_check::queue_state;

//! The deferred space. Besides queueing, it checks the rules a GPU enforces by failing
//! silently, and raises usage_error where one is broken:
//! - a host copy (ops<deferred_space>::to_host) is poisoned when it is queued (NaN for
//!   floats, 0xFF bytes otherwise, so a status word reads status_unfenced): a read
//!   before the fence that covers the copy sees poison, never stale or final data;
//! - an operation that touches a buffer which work queued on another executor uses (one
//!   of the two writing) raises unless this executor waited for that work first
//!   (`wait(e, record(other))`);
//! - growing a buffer past its capacity while queued work uses it raises; destroying it
//!   then makes the executor's next fence raise (and drops the work unrun);
//! - the fence takes a deadline (timeout_error) and raises a queued operation's error.
struct deferred_space {
  static constexpr const char* name = "deferred_space";
  static constexpr bool host_accessible = false;
  template <class T>
  using span = deferred_span<T>;
  template <class T>
  using buffer = deferred_buffer<T>;
  //! Host memory copies land in (poisoned when the copy is queued).
  template <class T>
  using pinned = host_buffer<T>;

  //! The executor: a handle to a FIFO queue (copies share it), like a CUDA stream.
  struct exec {
    std::shared_ptr<deferred_queue> q;
    //! Queues f, which touches `spans` (deferred spans: const ones are read, the others
    //! written); raises usage_error, queueing nothing, when a span is in use by another
    //! executor's queued work that this one has not joined.
    template <class F, class... Spans>
    void enqueue(F&& f, Spans... spans) const {
      const std::array<detail::deferred_check::touch, sizeof...(Spans)> ts{detail::deferred_check::touch_of(spans)...};
      enqueue_touching(std::forward<F>(f), ts);
    }
    //! enqueue() with the touched storage listed (ops<deferred_space> finds it in its arguments).
    template <class F>
    void enqueue_touching(F&& f, std::span<const detail::deferred_check::touch> ts) const {
      require(q != nullptr, "commpact::deferred_space: this executor has no queue; make one with "
                            "deferred_space::make_exec().");
      detail::deferred_check::item it;
      it.seq = q->enqueued;
      it.run = std::function<void()>(std::forward<F>(f));
      detail::deferred_check::check_and_register(*q, it, ts);
      q->work.push_back(std::move(it));
      ++q->enqueued;
    }
    //! Work queued and not yet run.
    std::size_t pending() const { return q ? q->work.size() : 0; }
  };
  static exec make_exec() { return {std::make_shared<deferred_queue>()}; }
  //! Makes e's device current on the calling thread; the deferred space has none.
  static void activate(const exec&) {}

  //! A point in an executor's queue: everything queued on it before record().
  struct event {
    std::weak_ptr<deferred_queue> q;
    std::uint64_t seq = 0;
  };
  static event record(const exec& e) { return e.q ? event{e.q, e.q->enqueued} : event{}; }
  //! Work queued on e from now on runs after the work ev marks (at e's fence, that work
  //! runs first if its own executor has not been fenced), and may use what it produced.
  static void wait(const exec& e, const event& ev) {
    auto src = ev.q.lock();
    if (!src || !e.q || src == e.q) return;
    e.q->join(*src, ev.seq);
    e.enqueue([w = ev.q, seq = ev.seq] {
      if (auto s = w.lock()) s->run_until(seq);
    });
  }

  //! Runs the queued work in order. Raises timeout_error (leaving the rest queued) when
  //! the deadline passes between two items; an item that raises (a communicator's error,
  //! which is how the deferred space reports asynchronous errors) drops the rest of the
  //! queue and the error propagates (device_error when it is not a commpact error): the
  //! step is abandoned, as a failed stream is. A
  //! buffer destroyed with work queued here raises usage_error and drops the work unrun.
  static void fence(exec e, deadline until) {
    if (!e.q) return;
    auto& q = *e.q;
    ++q.fences;
    try {
      while (!q.work.empty()) {
        if (!q.violation.empty()) q.raise_violation();
        if (std::chrono::steady_clock::now() > until)
          throw timeout_error(detail::cat("commpact::deferred_space::fence: the deadline passed with ",
                                          q.work.size(), " queued operations left; they stay queued."));
        q.run_front();
      }
      if (!q.violation.empty()) q.raise_violation();
    } catch (const timeout_error&) {
      throw;
    } catch (const error&) {
      q.drop();
      throw;
    } catch (const std::exception& ex) {
      // Queued work that raises what is not a commpact error (a user's kernel, say) is
      // reported as device_error, as a failed stream is on a GPU.
      q.drop();
      throw device_error(detail::cat("commpact::deferred_space::fence: a queued operation raised \"", ex.what(),
                                     "\"; the rest of the queue is dropped (on a GPU the stream would be in error)."));
    } catch (...) {
      q.drop();
      throw device_error("commpact::deferred_space::fence: a queued operation raised an exception that is not a "
                         "std::exception; the rest of the queue is dropped.");
    }
  }
};

}  // namespace commpact
