// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file complete.hpp
//! Complete: every rank talks to every other; all weights are 1/P (exact averaging in
//! one gossip step, spectral gap 1).

#include <vector>

#include "graph.hpp"

namespace commpact {

class Complete : public Graph {
 public:
  explicit Complete(int P) : Graph(check(P), build(P), "Complete") {}

 private:
  static int check(int P) {
    require(P >= 1, "commpact::Complete: needs at least one rank, got P = ", P, ".");
    return P;
  }
  static std::vector<std::vector<int>> build(int P) {
    std::vector<std::vector<int>> adj(P > 0 ? P : 0);  // check(P) may run after build(P)
    for (int i = 0; i < P; ++i)
      for (int j = i + 1; j < P; ++j) adj[i].push_back(j);
    return adj;
  }
};

}  // namespace commpact
