// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file ring.hpp
//! Ring: rank i talks to i-1 and i+1 (mod P). Weights 1/3 each for P >= 3.

#include <vector>

#include "graph.hpp"

namespace commpact {

class Ring : public Graph {
 public:
  explicit Ring(int P) : Graph(check(P), build(P), "Ring") {}

 private:
  static int check(int P) {
    require(P >= 1, "commpact::Ring: a ring needs at least one rank, got P = ", P, ".");
    return P;
  }
  static std::vector<std::vector<int>> build(int P) {
    std::vector<std::vector<int>> adj(P > 0 ? P : 0);
    for (int i = 0; i < P; ++i) {
      adj[i].push_back((i + 1) % P);
      adj[i].push_back((i + P - 1) % P);
    }
    return adj;
  }
};

}  // namespace commpact
