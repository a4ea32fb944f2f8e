// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file concepts.hpp
//! The four concepts of commpact: Communicator, Topology, Compressor and SyncPolicy.
//!
//! Each concept is built from small named requirements. Each has a `diagnose_*`
//! helper whose static_assert chain says, in one sentence, which requirement a type
//! misses; class templates call it so that a bad type fails with that sentence rather
//! than a page of template errors:
//!
//! \code
//! template <class C> class MyAlgorithm {
//!   static_assert(commpact::diagnose_point_to_point<C>());
//! };
//! \endcode

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace commpact {

//! Element-wise reduction applied by Communicator::allreduce.
enum class reduce_op { sum, min, max };

// ---------------------------------------------------------------------------
// Communicator: how bytes move between ranks.
// ---------------------------------------------------------------------------
namespace req {
template <class C>
concept has_rank_and_size = requires(const C& c) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
};
template <class C>
concept has_allreduce = requires(C& c, std::span<float> f, std::span<double> d, std::span<std::int64_t> i) {
  c.allreduce(f, reduce_op::sum);
  c.allreduce(d, reduce_op::sum);
  c.allreduce(i, reduce_op::max);
};
template <class C>
concept has_allgather = requires(C& c, std::span<const float> in, std::span<float> out) {
  c.allgather(in, out);
};
template <class C>
concept has_broadcast = requires(C& c, std::span<float> f, int root) { c.broadcast(f, root); };
template <class C>
concept has_barrier = requires(C& c) { c.barrier(); };
template <class C>
concept has_abort = requires(C& c, std::string_view why) { c.abort(why); };
template <class C>
concept has_send_recv = requires(C& c, int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) {
  c.send(peer, msg);
  c.recv(peer, buf);
  c.sendrecv(peer, msg, buf);
};
//! A handle of a nonblocking operation: `wait()` blocks until it completed, `test()`
//! says whether it has (and completes it when it has).
template <class H>
concept waitable = requires(H& h) {
  h.wait();
  { h.test() } -> std::convertible_to<bool>;
};
template <class C>
concept has_nonblocking_collectives =
    requires(C& c, std::span<float> f, std::span<const float> in, std::span<float> out, int root) {
      { c.iallreduce(f, reduce_op::sum) } -> waitable;
      { c.iallgather(in, out) } -> waitable;
      { c.ibroadcast(f, root) } -> waitable;
    };
template <class C>
concept has_nonblocking_send_recv = requires(C& c, int peer, std::span<const std::byte> msg, std::span<std::byte> buf) {
  { c.isend(peer, msg) } -> waitable;
  { c.irecv(peer, buf) } -> waitable;
};
}  // namespace req

//! A group of `size()` ranks with collectives. `allreduce(span<T>, op)` reduces in
//! place (bit-identical on every rank), `allgather(in, out)` concatenates equal-sized
//! blocks in rank order, `broadcast(data, root)`, `barrier()`, and `abort(why)` marks
//! the group failed so that every other rank raises instead of waiting.
template <class C>
concept Communicator = req::has_rank_and_size<C> && req::has_allreduce<C> && req::has_allgather<C> &&
                       req::has_broadcast<C> && req::has_barrier<C> && req::has_abort<C>;

//! A Communicator that also exchanges variable-length byte messages with one peer:
//! `send(peer, bytes)` (does not wait for the receiver), `recv(peer, buffer)` (buffer is
//! resized to the message) and `sendrecv(peer, bytes, buffer)`, a pairwise exchange that
//! may wait until the peer has taken the message (MpiComm does, like MPI_Sendrecv): the
//! peer must be in a matching sendrecv or receive without first waiting on another rank.
template <class C>
concept PointToPoint = Communicator<C> && req::has_send_recv<C>;

template <class C>
constexpr bool diagnose_communicator() {
  static_assert(req::has_rank_and_size<C>,
                "commpact: this type is not a Communicator: it needs `int rank() const` and `int size() const`.");
  static_assert(req::has_allreduce<C>,
                "commpact: this type is not a Communicator: it needs `allreduce(std::span<T>, commpact::reduce_op)` "
                "for float, double and std::int64_t.");
  static_assert(req::has_allgather<C>,
                "commpact: this type is not a Communicator: it needs `allgather(std::span<const T> in, std::span<T> out)`.");
  static_assert(req::has_broadcast<C>,
                "commpact: this type is not a Communicator: it needs `broadcast(std::span<T>, int root)`.");
  static_assert(req::has_barrier<C>, "commpact: this type is not a Communicator: it needs `barrier()`.");
  static_assert(req::has_abort<C>,
                "commpact: this type is not a Communicator: it needs `abort(std::string_view why)` so that a failure "
                "reaches the other ranks.");
  return Communicator<C>;
}

template <class C>
constexpr bool diagnose_point_to_point() {
  if constexpr (!Communicator<C>) {
    return diagnose_communicator<C>();
  } else {
    static_assert(req::has_send_recv<C>,
                  "commpact: this communicator has no point-to-point exchange: it needs `send(int peer, "
                  "std::span<const std::byte>)`, `recv(int peer, std::vector<std::byte>&)` and `sendrecv(...)`.");
    return PointToPoint<C>;
  }
}

//! A Communicator whose collectives also start without waiting: `iallreduce(data, op)`,
//! `iallgather(in, out)` and `ibroadcast(data, root)` return a handle with `wait()` and
//! `test()`; several may be in flight, completed in any order, started in the same order
//! on every rank. Buffers stay the caller's until the handle completed.
template <class C>
concept AsyncCommunicator = Communicator<C> && req::has_nonblocking_collectives<C>;

//! An AsyncCommunicator with nonblocking messages of a size both sides know:
//! `isend(peer, bytes)` and `irecv(peer, std::span<std::byte>)` (exactly that many bytes).
template <class C>
concept AsyncPointToPoint = AsyncCommunicator<C> && PointToPoint<C> && req::has_nonblocking_send_recv<C>;

template <class C>
constexpr bool diagnose_async_communicator() {
  if constexpr (!Communicator<C>) {
    return diagnose_communicator<C>();
  } else {
    static_assert(req::has_nonblocking_collectives<C>,
                  "commpact: this communicator has no nonblocking collectives: it needs `iallreduce(std::span<T>, "
                  "reduce_op)`, `iallgather(in, out)` and `ibroadcast(data, root)`, each returning a handle with "
                  "`wait()` and `bool test()`.");
    return AsyncCommunicator<C>;
  }
}

template <class C>
constexpr bool diagnose_async_point_to_point() {
  if constexpr (!AsyncCommunicator<C>) {
    return diagnose_async_communicator<C>();
  } else if constexpr (!PointToPoint<C>) {
    return diagnose_point_to_point<C>();
  } else {
    static_assert(req::has_nonblocking_send_recv<C>,
                  "commpact: this communicator has no nonblocking point to point: it needs `isend(int peer, "
                  "std::span<const std::byte>)` and `irecv(int peer, std::span<std::byte>)`, each returning a handle "
                  "with `wait()` and `bool test()`.");
    return AsyncPointToPoint<C>;
  }
}

// ---------------------------------------------------------------------------
// Topology: who talks to whom, with what weight.
// ---------------------------------------------------------------------------
namespace req {
template <class T>
concept has_topology_size = requires(const T& t) {
  { t.size() } -> std::convertible_to<int>;
};
template <class T>
concept has_neighbors = requires(const T& t, int r) {
  { t.neighbors(r) } -> std::ranges::input_range;
  requires std::convertible_to<std::ranges::range_value_t<decltype(t.neighbors(r))>, int>;
};
template <class T>
concept has_weight = requires(const T& t, int i, int j) {
  { t.weight(i, j) } -> std::convertible_to<double>;
};
}  // namespace req

//! A graph over `size()` ranks: `neighbors(r)` (excluding r, ascending) and the mixing
//! weight `weight(i, j)` of a symmetric doubly-stochastic matrix (`weight(i, i)` is the
//! self weight; rows sum to 1).
template <class T>
concept Topology = req::has_topology_size<T> && req::has_neighbors<T> && req::has_weight<T>;

template <class T>
constexpr bool diagnose_topology() {
  static_assert(req::has_topology_size<T>, "commpact: this type is not a Topology: it needs `int size() const`.");
  static_assert(req::has_neighbors<T>,
                "commpact: this type is not a Topology: it needs `neighbors(int rank) const` returning a range of int.");
  static_assert(req::has_weight<T>,
                "commpact: this type is not a Topology: it needs `double weight(int i, int j) const`.");
  return Topology<T>;
}

// ---------------------------------------------------------------------------
// Compressor: what crosses the network, and how it is aggregated.
// ---------------------------------------------------------------------------
namespace req {
template <class C>
concept has_reduce = requires(C& c, std::span<float> g) { c.reduce(g); };
template <class C>
concept has_state = requires(const C& cc, C& c, std::vector<std::byte>& out, std::span<const std::byte> in) {
  cc.save_state(out);
  c.load_state(in);
};
}  // namespace req

//! Holds a communicator and its own state. `reduce(grad)` replaces grad, on every rank,
//! by the same (compressed) average over the ranks, keeping what it did not send in its
//! error-feedback residual. `save_state(bytes)` appends the state; `load_state(bytes)`
//! restores it.
template <class C>
concept Compressor = req::has_reduce<C> && req::has_state<C>;

template <class C>
constexpr bool diagnose_compressor() {
  static_assert(req::has_reduce<C>,
                "commpact: this type is not a Compressor: it needs `reduce(std::span<float> grad)`.");
  static_assert(req::has_state<C>,
                "commpact: this type is not a Compressor: it needs `save_state(std::vector<std::byte>&) const` and "
                "`load_state(std::span<const std::byte>)`.");
  return Compressor<C>;
}

// ---------------------------------------------------------------------------
// Codec: what one rank turns its vector into, and back (no ranks involved).
// ---------------------------------------------------------------------------
namespace req {
template <class K>
concept has_max_encoded_bytes = requires(const K& k, std::size_t n) {
  { k.max_encoded_bytes(n) } -> std::convertible_to<std::size_t>;
};
template <class K>
concept has_encode = requires(K& k, std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
  { k.encode(v, msg, approx) } -> std::convertible_to<std::size_t>;
};
template <class K>
concept has_decode_add = requires(const K& k, std::span<const std::byte> msg, std::span<float> acc) {
  k.decode_add(msg, acc);
};
// Optional members a codec may offer; the compressors use them when present.
template <class K>
concept codec_has_begin_step = requires(K& k, std::int64_t step) { k.begin_step(step); };
template <class K>
concept codec_has_bind_rank = requires(K& k, int rank) { k.bind_rank(rank); };
template <class K>
concept codec_has_check = requires(const K& k, std::size_t n) {
  { k.check(n) } -> std::convertible_to<std::string_view>;
};
template <class K>
concept codec_has_agreement = requires(const K& k, std::size_t n) {
  { k.agreement(n) } -> std::convertible_to<std::int64_t>;
};
template <class K>
concept codec_has_delivered = requires(const K& k) {
  { k.delivered() } -> std::convertible_to<std::span<const std::int32_t>>;
};
}  // namespace req

//! A codec turns a float vector into a message and back, for any rank:
//! - `max_encoded_bytes(n) const`: the largest message for a vector of n values;
//! - `encode(v, msg, approx) -> std::size_t`: writes v's message into msg (at least
//!   max_encoded_bytes(v.size()) bytes) and returns its length; writes into `approx`
//!   (length n, unless empty) what the receivers will decode, so that error feedback
//!   keeps v - approx;
//! - `decode_add(msg, acc) const`: validates a message for a vector of acc.size()
//!   values (raising commpact::wire_error when it is malformed, before writing) and adds
//!   what it decodes to acc.
//! Optional: `begin_step(step)` (schedules, random streams), `bind_rank(rank)` (called
//! once with the compressor's rank, so that stochastic codecs draw per-rank streams), `check(n) -> string` (why n cannot be
//! encoded; empty when it can), `agreement(n) -> int64` (a value every rank must share,
//! such as k), `delivered() -> span<const int32_t>` (a sparse codec's delivered indices,
//! so that error feedback needs no dense pass).
template <class K>
concept Codec = std::move_constructible<K> && req::has_max_encoded_bytes<K> && req::has_encode<K> &&
                req::has_decode_add<K>;

template <class K>
constexpr bool diagnose_codec() {
  static_assert(req::has_max_encoded_bytes<K>,
                "commpact: this type is not a Codec: it needs `std::size_t max_encoded_bytes(std::size_t n) const`.");
  static_assert(req::has_encode<K>,
                "commpact: this type is not a Codec: it needs `std::size_t encode(std::span<const float> v, "
                "std::span<std::byte> msg, std::span<float> approx)`.");
  static_assert(req::has_decode_add<K>,
                "commpact: this type is not a Codec: it needs `void decode_add(std::span<const std::byte> msg, "
                "std::span<float> acc) const`.");
  static_assert(std::move_constructible<K>, "commpact: this type is not a Codec: it must be move-constructible.");
  return Codec<K>;
}

// ---------------------------------------------------------------------------
// Aggregation: how ranks combine what their codecs produce (CodecCompressor's second part).
// ---------------------------------------------------------------------------
namespace req {
template <class A>
concept has_blocks = requires(A& a, const A& ca, std::size_t capacity, int r) {
  typename A::comm_type;
  { a.block(capacity) } -> std::convertible_to<std::span<std::byte>>;
  a.exchange();
  { ca.received(r) } -> std::convertible_to<std::span<const std::byte>>;
  { ca.sources() } -> std::convertible_to<int>;
};
template <class A>
concept has_aggregation_comm = requires(A& a) {
  a.comm();
  requires Communicator<std::remove_cvref_t<decltype(a.comm())>>;
};
}  // namespace req

//! An aggregation moves one block per rank: `block(capacity)` is this rank's block to
//! fill, `exchange()` (collective) delivers, `received(r)` is source r's block, in the
//! same order on every rank, `sources()` how many there are; `comm()` is its
//! Communicator (the compressor agrees on sizes through it). Allgather<C> is one.
template <class A>
concept Aggregation = req::has_blocks<A> && req::has_aggregation_comm<A>;

template <class A>
constexpr bool diagnose_aggregation() {
  static_assert(req::has_blocks<A>,
                "commpact: this type is not an Aggregation: it needs `comm_type`, `std::span<std::byte> "
                "block(std::size_t capacity)`, `exchange()`, `std::span<const std::byte> received(int) const` and "
                "`int sources() const` (write commpact::Allgather<YourComm>).");
  static_assert(req::has_aggregation_comm<A>,
                "commpact: this type is not an Aggregation: it needs `comm()` returning its Communicator.");
  return Aggregation<A>;
}

// ---------------------------------------------------------------------------
// TreeSchedule: the exchange pattern of a tree all-reduce (gTopK's merge).
// ---------------------------------------------------------------------------
struct tree_step;

namespace req {
//! A reducer as TreeSchedule::reduce() drives it (tests and gTopK provide one).
struct tree_reducer_archetype {
  std::span<const std::byte> payload(const tree_step&);
  void absorb(const tree_step&, std::span<const std::byte>);
};
template <class T>
concept has_tree_reduce = requires(T& t, tree_reducer_archetype& r, std::vector<std::byte>& buf) { t.reduce(r, buf); };
}  // namespace req

//! A tree schedule moves variable-length payloads between ranks in the order of a tree
//! all-reduce: `reduce(reducer, buffer)` asks `reducer.payload(step)` for what to send
//! and hands what arrives to `reducer.absorb(step, bytes)`; it is also a Communicator
//! (rank, size, abort...). TreeComm<C> (recursive doubling) is one.
template <class T>
concept TreeSchedule = Communicator<T> && req::has_tree_reduce<T>;

template <class T>
constexpr bool diagnose_tree_schedule() {
  if constexpr (!Communicator<T>) {
    return diagnose_communicator<T>();
  } else {
    static_assert(req::has_tree_reduce<T>,
                  "commpact: this type is not a TreeSchedule: it needs `reduce(reducer, std::vector<std::byte>& "
                  "buffer)` that walks a tree all-reduce (write gTopK<commpact::TreeComm<YourComm>>).");
    return TreeSchedule<T>;
  }
}

// ---------------------------------------------------------------------------
// SyncPolicy: when ranks synchronise.
// ---------------------------------------------------------------------------

//! What a SyncPolicy decides at a round boundary.
struct sync_plan {
  enum class mode { gradients, parameters };
  mode what = mode::gradients;  //!< gradients: reduce gradients every step (BSP); parameters: Local SGD
  std::int64_t period = 1;      //!< steps until the next synchronisation (>= 1)
};

namespace req {
template <class S>
concept has_plan = requires(const S& s, std::int64_t step, double lr) {
  { s.plan(step, lr) } -> std::same_as<sync_plan>;
};
//! Optional: `check_run(total_steps) const` validates the policy against the length of
//! a run (for example a warm-up longer than the run) and throws commpact::invalid_argument.
template <class S>
concept has_check_run = requires(const S& s, std::int64_t total_steps) { s.check_run(total_steps); };
}  // namespace req

//! A pure rule: `plan(step, lr)`, asked at the first step and after each period, says
//! whether the next period synchronises gradients (every step of it) or parameters (once,
//! after its last step) and how many steps it lasts. `lr` is the learning rate of `step`,
//! the period's first step. It sees the step and the learning rate only, so every rank
//! makes the same decisions without communicating. The caller (DataParallel,
//! plan_run) cuts a period that would run past the last step. A policy may also offer
//! `check_run(total_steps) const` (req::has_check_run), which the driver calls once.
template <class S>
concept SyncPolicy = req::has_plan<S> && std::copy_constructible<S>;

template <class S>
constexpr bool diagnose_sync_policy() {
  static_assert(req::has_plan<S>,
                "commpact: this type is not a SyncPolicy: it needs `commpact::sync_plan plan(std::int64_t step, "
                "double lr) const`.");
  static_assert(std::copy_constructible<S>, "commpact: this type is not a SyncPolicy: it must be copy-constructible.");
  return SyncPolicy<S>;
}

}  // namespace commpact
