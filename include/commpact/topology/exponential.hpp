// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file exponential.hpp
//! Exponential: rank i talks to i + 2^k and i - 2^k (mod P) for every 2^k < P (the
//! static exponential graph of SGP / Ying et al. 2021, symmetrised). Degree about
//! 2 log2(P); Metropolis-Hastings weights from Graph.

#include <vector>

#include "graph.hpp"

namespace commpact {

class Exponential : public Graph {
 public:
  explicit Exponential(int P) : Graph(check(P), build(P), "Exponential") {}

 private:
  static int check(int P) {
    require(P >= 1, "commpact::Exponential: needs at least one rank, got P = ", P, ".");
    return P;
  }
  static std::vector<std::vector<int>> build(int P) {
    std::vector<std::vector<int>> adj(P > 0 ? P : 0);  // check(P) may run after build(P)
    for (int i = 0; i < P; ++i)
      for (long long d = 1; d < P; d *= 2) {
        adj[i].push_back(static_cast<int>((i + d) % P));
        adj[i].push_back(static_cast<int>(((i - d) % P + P) % P));
      }
    return adj;
  }
};

}  // namespace commpact
