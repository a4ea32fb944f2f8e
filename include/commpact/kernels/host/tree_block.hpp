// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file tree_block.hpp
//! The two host kernels that make gTop-k's tree merge an Aggregation (TreeMerge<Tree>,
//! compress/aggregations/tree_merge.hpp): `begin` starts the merge from a block that a
//! codec wrote (the same state the fused local phase, host::tree::local, leaves), and
//! `status` turns the merge's outcome into step_status bits. Like every tree kernel they
//! never throw on data.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "../../error.hpp"
#include "../../wire/sparse_frame.hpp"
#include "../status.hpp"
#include "sparse_tree.hpp"

namespace commpact::host::tree {

//! Starts a tree merge from this rank's block: a sparse_wire frame (no mask, zero
//! padding to the block's size) with n_min = n_max = n and k_min = k_max = k. A flagged
//! block (flag_nonfinite, flag_failed) enters the tree as flagged and empty; otherwise its
//! entries become this rank's original and current set, all alive (what host::tree::local
//! leaves). A malformed block (bad structure, n or k ranges that are not single values,
//! more than k entries, indices not strictly increasing in [0, n), a non-finite value)
//! sets status_wire with wire_peer = `self` and the failed flag, so that the other ranks
//! abandon the step.
inline void begin(sparse_tree_meta& m, std::span<const std::byte> block, int self, const host_tree_views& b) {
  m = {};
  auto malformed = [&] {
    m.status |= status_wire, m.wire_peer = self, m.cur.flags |= sparse_wire::flag_failed;
    m.cur_count = m.mine_count = m.extra_count = 0;
  };
  sparse_wire::header h;
  try {
    h = sparse_wire::decode_header(block, true);
  } catch (const wire_error&) {
    // Keep ranges that merge harmlessly: the failed flag alone tells every rank.
    m.cur.n_min = m.cur.n_max = m.n = 0;
    m.cur.k_min = m.cur.k_max = m.k = 0;
    malformed();
    return;
  }
  m.n = h.n_min, m.k = h.k_min;
  m.cur = h;
  m.cur.count = 0, m.cur.mask_bits = 0;
  if (h.n_min != h.n_max || h.k_min != h.k_max || h.mask_bits != 0) return malformed();
  if (h.flags & sparse_wire::flag_nonfinite) m.status |= status_nonfinite;
  if (h.flags & ~sparse_wire::step_bits) return;  // flagged: empty, like a rank whose local phase flagged its input
  const auto k = static_cast<std::size_t>(std::max<std::int64_t>(m.k, 0));
  sparse_wire::header got;
  try {
    got = sparse_wire::decode(block, {m.n, std::min(k, b.mine_idx.size()), 0}, b.mine_idx, b.cur_val, {}, true);
  } catch (const wire_error&) {
    return malformed();
  }
  std::copy_n(b.mine_idx.begin(), got.count, b.cur_idx.begin());
  std::fill_n(b.mine_alive.begin(), got.count, std::uint8_t{1});
  m.mine_count = m.cur_count = got.count;
}

//! status[0] |= the merge's outcome: status_wire for a malformed frame or block,
//! status_nonfinite when some rank saw a non-finite value (input or merged sum),
//! status_rejected when some rank rejected its input or the ranks disagree on n or k.
//! So status stays 0 exactly when host::tree::scatter writes the result.
inline void status(const sparse_tree_meta& m, std::span<std::uint32_t> st) {
  std::uint32_t s = m.status & status_wire;
  if (m.cur.flags & sparse_wire::flag_nonfinite) s |= status_nonfinite;
  if ((m.cur.flags & sparse_wire::flag_failed) || (!m.healthy() && !(s & status_nonfinite))) s |= status_rejected;
  st[0] |= s;
}

}  // namespace commpact::host::tree
