// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file graph.hpp
//! An undirected graph over P ranks with Metropolis-Hastings mixing weights:
//! w_ij = 1 / (1 + max(deg_i, deg_j)) on edges, w_ii = 1 - sum_j w_ij. The matrix is
//! symmetric and doubly stochastic for any graph (a ring gets 1/3, a 2-D torus 1/5).
//! Topologies derive from it and only say which edges exist.

#include <algorithm>
#include <vector>

#include "../error.hpp"

namespace commpact {

class Graph {
 public:
  //! Builds from adjacency lists; edges are made symmetric, self loops and duplicates dropped.
  Graph(int P, std::vector<std::vector<int>> adj, const char* name = "Graph") : size_(P), adj_(std::move(adj)) {
    require(P >= 1, "commpact::", name, ": a topology needs at least one rank, got P = ", P, ".");
    require(static_cast<int>(adj_.size()) == P, "commpact::", name, ": ", adj_.size(),
            " adjacency lists for P = ", P, " ranks.");
    std::vector<std::vector<int>> sym(P);
    for (int i = 0; i < P; ++i)
      for (int j : adj_[i]) {
        require(j >= 0 && j < P, "commpact::", name, ": rank ", i, " lists neighbour ", j, " outside [0, ", P, ").");
        if (j == i) continue;
        sym[i].push_back(j);
        sym[j].push_back(i);
      }
    for (auto& v : sym) {
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
    }
    adj_ = std::move(sym);
    name_ = name;
  }

  int size() const { return size_; }

  //! The neighbours of rank r, ascending, r excluded.
  const std::vector<int>& neighbors(int r) const {
    check_rank(r);
    return adj_[r];
  }

  int degree(int r) const { return static_cast<int>(neighbors(r).size()); }

  bool adjacent(int i, int j) const {
    const auto& n = neighbors(i);
    return std::binary_search(n.begin(), n.end(), j);
  }

  //! Metropolis-Hastings weight; weight(i, i) is the self weight.
  double weight(int i, int j) const {
    check_rank(i);
    check_rank(j);
    if (i == j) {
      double s = 0;
      for (int k : adj_[i]) s += edge_weight(i, k);
      return 1.0 - s;
    }
    return adjacent(i, j) ? edge_weight(i, j) : 0.0;
  }

 protected:
  void check_rank(int r) const {
    require(r >= 0 && r < size_, "commpact::", name_, ": rank ", r, " is outside [0, ", size_, ").");
  }

 private:
  double edge_weight(int i, int j) const {
    return 1.0 / (1.0 + static_cast<double>(std::max(adj_[i].size(), adj_[j].size())));
  }

  int size_;
  std::vector<std::vector<int>> adj_;
  const char* name_ = "Graph";
};

}  // namespace commpact
