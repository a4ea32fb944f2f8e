// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file tree_schedule.hpp
//! TreeSchedule: the exchange pattern of a tree all-reduce (gTopK's merge): the concept, its named requirements and its diagnose_ sentence (part of
//! concepts.hpp, the umbrella).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "communicator.hpp"
namespace commpact {

// ---------------------------------------------------------------------------
// TreeSchedule: the exchange pattern of a tree all-reduce (gTopK's merge).
// ---------------------------------------------------------------------------

//! What a rank does in one step of a tree schedule (recursive doubling with folds, as
//! TreeComm walks it; the sparse tree's kernels take it too).
enum class tree_stage {
  fold_send,    //!< extra rank: send the payload to the core rank rank - p2
  fold_recv,    //!< core rank: receive the payload of its extra rank rank + p2
  exchange,     //!< core rank: send to and receive from rank XOR 2^round
  unfold_send,  //!< core rank: send the result to its extra rank
  unfold_recv,  //!< extra rank: receive the result from its core rank
};

//! One step of a tree schedule: the stage, the peer, the exchange round.
struct tree_step {
  tree_stage stage = tree_stage::exchange;
  int peer = -1;
  int round = -1;  //!< the exchange round, -1 for fold/unfold steps
  bool sends() const { return stage != tree_stage::fold_recv && stage != tree_stage::unfold_recv; }
  bool receives() const { return stage != tree_stage::fold_send && stage != tree_stage::unfold_send; }
};

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

}  // namespace commpact
