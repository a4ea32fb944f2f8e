// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file torus.hpp
//! Torus2D: ranks on a rows x cols grid with wrap-around; rank r = i * cols + j talks
//! to (i +- 1 mod rows, j) and (i, j +- 1 mod cols). Metropolis-Hastings weights from
//! Graph: 1/5 each (self and four neighbours) when rows, cols >= 3. A side of 2 gives
//! one neighbour in that direction (both wrap-around links are the same edge), a side
//! of 1 none, so degenerate grids are a smaller torus or a ring.
//!
//! Torus2D(P) picks the most square factorisation rows x cols = P with rows <= cols
//! (a prime P gives 1 x P, a ring).

#include <utility>
#include <vector>

#include "graph.hpp"

namespace commpact {

class Torus2D : public Graph {
 public:
  Torus2D(int rows, int cols) : Graph(check(rows, cols), build(rows, cols), "Torus2D"), rows_(rows), cols_(cols) {}
  explicit Torus2D(int P) : Torus2D(square_rows(P), P / square_rows(P)) {}

  int rows() const { return rows_; }
  int cols() const { return cols_; }
  //! Grid coordinates of rank r: {r / cols, r % cols}.
  std::pair<int, int> coords(int r) const {
    check_rank(r);
    return {r / cols_, r % cols_};
  }

  //! The largest divisor of P that is <= sqrt(P): the rows of Torus2D(P).
  static int square_rows(int P) {
    require(P >= 1, "commpact::Torus2D: a torus needs at least one rank, got P = ", P, ".");
    int best = 1;
    for (int d = 1; static_cast<long long>(d) * d <= P; ++d)
      if (P % d == 0) best = d;
    return best;
  }

 private:
  static int check(int rows, int cols) {
    require(rows >= 1 && cols >= 1, "commpact::Torus2D: the grid ", rows, " x ", cols,
            " needs rows >= 1 and cols >= 1 (Torus2D(P) picks a near-square grid for P ranks).");
    return rows * cols;
  }
  static std::vector<std::vector<int>> build(int rows, int cols) {
    std::vector<std::vector<int>> adj(rows > 0 && cols > 0 ? static_cast<std::size_t>(rows) * cols : 0);  // check() may run after build()
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) {
        auto& a = adj[static_cast<std::size_t>(i) * cols + j];
        a.push_back(((i + 1) % rows) * cols + j);
        a.push_back(((i + rows - 1) % rows) * cols + j);
        a.push_back(i * cols + (j + 1) % cols);
        a.push_back(i * cols + (j + cols - 1) % cols);
      }
    return adj;
  }
  int rows_, cols_;
};

}  // namespace commpact
