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
//! commpact::ops<commpact::deferred_space>::to_host(e, b.cview(), std::span<float>(h));  // queued
//! // h is all NaN here (poisoned when the copy was queued): nothing has run
//! commpact::deferred_space::fence(e, commpact::no_deadline());            // runs both
//! \endcode
//!
//! Buffers are grow-only like the host's; size them before queueing work on them, as on
//! a GPU (growing one past its capacity while work uses it raises).
//!
//! The pieces: deferred_span.hpp (the span), deferred_check.hpp (the checker's records
//! and the executor queue) and deferred_buffer.hpp (the buffer).

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <utility>

#include "../error.hpp"
#include "deferred_buffer.hpp"
#include "deferred_check.hpp"
#include "deferred_span.hpp"
#include "host.hpp"

namespace commpact {

//! The work queue behind a deferred executor.
using deferred_queue = detail::deferred_check::queue_state;

//! The deferred space. Besides queueing, it checks the rules a GPU enforces by failing
//! silently, and raises usage_error where one is broken:
//! - a host copy (ops<deferred_space>::to_host) is poisoned when it is queued (NaN for
//!   floats, 0xFF bytes otherwise, so a status word reads status_unfenced): a read
//!   before the fence that covers the copy sees poison, never stale or final data; a
//!   host write to the pinned memory it lands in before that fence raises there;
//! - an operation that touches a buffer which work queued on another executor uses (one
//!   of the two writing) raises unless this executor waited for that work first
//!   (`wait(e, record(other))`);
//!   Only the bytes an operation touches count: work on disjoint parts of one buffer
//!   needs no join;
//! - growing a buffer past its capacity while queued work uses it raises, as does growing
//!   it within its capacity over elements queued work uses, or assigning over it;
//!   destroying it then makes the executor's next fence raise
//!   (and drops the work unrun). Pinned host memory (`pinned<T>`) is watched alike;
//! - an operation queued through a span of a buffer already destroyed or reallocated
//!   raises at once: the storage stays allocated in a quarantine (deferred_check.hpp's
//!   quarantine_bytes), so its address is not reused meanwhile (under ASan it is also
//!   poisoned, so a host read through a stale span of pinned memory still shows);
//! - a host source of from_host that changes between the call and the copy's run raises
//!   at the fence (on a GPU the copy could read either); a to_host queued later into the
//!   same memory is ordered after it, as on one stream;
//! - the fence takes a deadline (timeout_error) and raises a queued operation's error.
struct deferred_space {
  static constexpr const char* name = "deferred_space";
  static constexpr bool host_accessible = false;
  template <class T>
  using span = deferred_span<T>;
  template <class T>
  using buffer = deferred_buffer<T>;
  //! Host memory copies land in (poisoned when the copy is queued), watched by the
  //! checker as device buffers are (deferred_pinned).
  template <class T>
  using pinned = deferred_pinned<T>;

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
