// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file hypercube.hpp
//! Hypercube: ranks i and j are neighbours when i XOR j is a power of two. It also
//! carries the recursive-doubling schedule for any P:
//!
//! - p2 = the largest power of two <= P; the ranks r >= p2 are "extra".
//! - fold: extra rank r sends its data to r - p2 (its fold partner) and waits.
//! - rounds j = 0 .. log2(p2) - 1: each rank r < p2 exchanges with r XOR 2^j.
//! - unfold: rank r - p2 sends the result to extra rank r.
//!
//! With P a power of two there is no fold and log2(P) rounds.

#include <bit>
#include <vector>

#include "graph.hpp"

namespace commpact {

class Hypercube : public Graph {
 public:
  explicit Hypercube(int P) : Graph(check(P), build(P), "Hypercube"), p2_(std::bit_floor(static_cast<unsigned>(P))) {}

  //! Largest power of two <= P: the ranks that take part in the rounds.
  int core_size() const { return p2_; }
  //! Number of exchange rounds among the core ranks: log2(core_size()).
  int rounds() const { return std::countr_zero(static_cast<unsigned>(p2_)); }
  //! True for ranks >= core_size(), which fold into a core rank and wait.
  bool is_extra(int r) const {
    check_rank(r);
    return r >= p2_;
  }
  //! The fold partner of r: r - p2 for an extra rank, r + p2 for a core rank that has
  //! an extra partner, -1 otherwise.
  int fold_partner(int r) const {
    check_rank(r);
    if (r >= p2_) return r - p2_;
    return r + p2_ < size() ? r + p2_ : -1;
  }
  //! The partner of core rank r in round j: r XOR 2^j.
  int partner(int r, int round) const {
    check_rank(r);
    require(r < p2_, "commpact::Hypercube::partner: rank ", r, " is an extra rank (>= ", p2_,
            ") and takes no part in the rounds; it folds into rank ", r - p2_, ".");
    require(round >= 0 && round < rounds(), "commpact::Hypercube::partner: round ", round, " is outside [0, ", rounds(),
            ").");
    return r ^ (1 << round);
  }

 private:
  static int check(int P) {
    require(P >= 1, "commpact::Hypercube: needs at least one rank, got P = ", P, ".");
    return P;
  }
  static std::vector<std::vector<int>> build(int P) {
    std::vector<std::vector<int>> adj(P > 0 ? P : 0);
    for (int i = 0; i < P; ++i)
      for (int b = 1; b < P; b <<= 1)
        if ((i ^ b) < P) adj[i].push_back(i ^ b);
    return adj;
  }
  int p2_;
};

}  // namespace commpact
