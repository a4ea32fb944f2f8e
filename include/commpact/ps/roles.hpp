// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file roles.hpp
//! Who serves and who works, and which contiguous shard each server owns.
//!
//! `roles::colocated(P)`: every rank is a server and a worker (BytePS's layout: a
//! worker's own shard never crosses the network). `roles::separate(P, S)`: ranks
//! 0 .. S-1 serve, S .. P-1 work. Any other split: fill `servers` and `workers` (rank
//! lists, each strictly increasing; a rank may be in both). Server s owns
//! [shard_begin(n, S, s), shard_begin(n, S, s + 1)): the first n % S shards hold one
//! value more than the others.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../compress/codecs/tensor_layout.hpp"
#include "../error.hpp"

namespace commpact::ps {

struct roles {
  std::vector<int> servers;  //!< ranks that own a shard, in shard order
  std::vector<int> workers;  //!< ranks that push gradients, in worker order (the reduction order)

  //! Every rank serves and works.
  static roles colocated(int P) {
    require(P >= 1, "commpact::ps::roles::colocated: P = ", P, "; pass the number of ranks (>= 1).");
    roles r;
    for (int i = 0; i < P; ++i) r.servers.push_back(i), r.workers.push_back(i);
    return r;
  }
  //! Ranks [0, S) serve, [S, P) work.
  static roles separate(int P, int S) {
    require(S >= 1 && S < P, "commpact::ps::roles::separate: S = ", S, " servers among P = ", P,
            " ranks; use 1 <= S < P so that at least one rank works (or roles::colocated).");
    roles r;
    for (int i = 0; i < S; ++i) r.servers.push_back(i);
    for (int i = S; i < P; ++i) r.workers.push_back(i);
    return r;
  }

  //! Why these roles cannot run on P ranks (empty when they can).
  std::string problem(int P) const {
    auto check = [&](const std::vector<int>& v, const char* what) -> std::string {
      if (v.empty()) return detail::cat("commpact::ps::roles: the ", what, " list is empty; name at least one rank.");
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (v[i] < 0 || v[i] >= P)
          return detail::cat("commpact::ps::roles: ", what, " rank ", v[i], " is outside [0, ", P, ").");
        if (i > 0 && v[i] <= v[i - 1])
          return detail::cat("commpact::ps::roles: the ", what, " list must be strictly increasing; ", v[i],
                             " follows ", v[i - 1], ".");
      }
      return {};
    };
    auto s = check(servers, "server");
    return s.empty() ? check(workers, "worker") : s;
  }

  //! A hash of both lists (every rank must hold the same roles).
  std::int64_t fingerprint() const {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(servers.size());
    for (int s : servers) mix(static_cast<std::uint64_t>(s) + 1);
    mix(workers.size() + 7);
    for (int w : workers) mix(static_cast<std::uint64_t>(w) + 1);
    return static_cast<std::int64_t>(h >> 1);
  }
};

//! Where shard s of S starts in a vector of n values (shard_begin(n, S, S) == n).
inline std::size_t shard_begin(std::size_t n, std::size_t S, std::size_t s) {
  return s * (n / S) + (s < n % S ? s : n % S);
}

//! The pieces of `layout`'s tensors that fall in [lo, hi), each a vector {1, len}: the
//! layout a per_tensor codec of one shard takes (a tensor cut by a shard boundary
//! becomes two tensors, one on each server).
inline tensor_layout shard_layout(const tensor_layout& layout, std::size_t lo, std::size_t hi) {
  detail::check_layout(layout, "commpact::ps::shard_layout");
  tensor_layout out;
  std::size_t at = 0;
  for (const auto& t : layout) {
    const std::size_t b = at, e = at + static_cast<std::size_t>(t.numel());
    at = e;
    const std::size_t x = b > lo ? b : lo, y = e < hi ? e : hi;
    if (x < y) out.push_back({1, static_cast<std::int64_t>(y - x)});
  }
  require(at >= hi, "commpact::ps::shard_layout: the layout holds ", at, " values but the shard ends at ", hi,
          "; pass the layout of the whole model.");
  return out;
}

}  // namespace commpact::ps
