// SPDX-License-Identifier: Apache-2.0
#pragma once
// The oktopk_begin checks of tests/cuda/test_cuda_rows_oktopk.cu: the row against
// ops<host_space>::oktopk_begin on fresh random sparse_wire frames (kinds below, outputs
// poisoned, status pre-set), and SparseReduceScatter<CudaStagedComm<ThreadComm>> fed
// through block() against SparseReduceScatter<ThreadComm> fed the same frames.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <span>
#include <vector>

#include "commpact/comm/cuda_staged_comm.hpp"
#include "commpact/comm/thread_comm.hpp"
#include "commpact/compress/aggregations/sparse_reduce_scatter.hpp"
#include "commpact/wire/sparse_frame.hpp"

#include "common/sparse_sets.hpp"
#include "oktopk_rows_test_common.cuh"

namespace oktopk_begin_test {

using namespace oktopk_rows_test;
namespace sw = commpact::sparse_wire;

static_assert(cp::detail::has_oktopk_begin<cp::cuda_space>, "ops<cuda_space> has the row oktopk_begin");

//! What a frame is made to be; the host answers the first three with status 0 or
//! status_nonfinite (flagged), every other with status_rejected.
enum kind : int {
  valid, flag_nonfinite, flag_both, flag_nonfinite_entries, flag_failed, bad_magic, bad_version, unknown_flag,
  count_above_k, count_past_frame, index_high, index_negative, not_increasing, nonfinite_value, padding,
  other_range, bad_range, mask, short_frame, flagged_padding, flagged_range, kinds
};
inline const char* kind_name(int k) {
  static const char* names[] = {"valid", "flag_nonfinite", "flag_both", "flag_nonfinite_entries", "flag_failed",
                                "bad_magic", "bad_version", "unknown_flag", "count_above_k", "count_past_frame",
                                "index_high", "index_negative", "not_increasing", "nonfinite_value", "padding",
                                "other_range", "bad_range", "mask", "short_frame", "flagged_padding", "flagged_range"};
  return names[k];
}
inline u32 want_status(int k) {
  return k == valid ? 0u : k <= flag_nonfinite_entries ? u32(cp::status_nonfinite) : u32(cp::status_rejected);
}

struct begin_case {
  bytes frame;
  std::size_t ni = 0, nv = 0;  // idx and val slots
};

//! A fresh frame of kind kd for n, k (room for k + 2 entries and up to 7 more bytes);
//! false when n and k leave the kind no room (not_increasing needs two entries).
inline bool make_case(int kd, i64 n, i64 k, begin_case& c) {
  const auto uk = static_cast<std::size_t>(k), un = static_cast<std::size_t>(n);
  const std::size_t most = std::min(uk, un);
  const std::size_t least = kd == not_increasing ? 2 : (kd >= index_high && kd <= nonfinite_value) ? 1 : 0;
  if (most < least) return false;
  std::size_t cnt = least + below(most - least + 1);
  if (kd == flag_nonfinite || kd == flag_both || kd == flag_failed || kd == flagged_padding || kd == flagged_range)
    cnt = 0;  // a flagged frame is empty (as codecs write it)
  if (kd == flag_nonfinite_entries) cnt = std::max<std::size_t>(cnt, most ? 1 : 0);
  if (kd == count_above_k) cnt = uk + 1 + below(2);
  std::vector<i32> idx = ascending(0, n, std::min(cnt, un), std::min(un, 4 * cnt + 8));
  while (idx.size() < cnt) idx.push_back(idx.empty() ? 0 : idx.back());  // count_above_k with k = n: repeats
  const auto val = draws(cnt);
  const std::size_t total = sw::header_bytes + sw::entry_bytes * (uk + 2) + below(8);
  c.frame.assign(total, std::byte{0});
  c.ni = c.nv = uk;
  if (kd == valid && (rng() & 1)) c.ni = uk + below(3), c.nv = uk + below(3);  // the unused slots to each end
  std::byte* p = c.frame.data();
  u32 count = static_cast<u32>(cnt), mask_bits = 0;
  std::uint16_t version = sw::version, flags = 0;
  i64 r[4] = {n, n, k, k};  // n_min, n_max, k_min, k_max
  put_entries(p + sw::header_bytes, idx, val);
  const std::size_t expect = sw::header_bytes + sw::entry_bytes * cnt;
  switch (kd) {
    case flag_nonfinite: case flag_nonfinite_entries: flags = sw::flag_nonfinite; break;
    case flag_both: flags = sw::flag_nonfinite | sw::flag_failed; break;
    case flag_failed: flags = sw::flag_failed; break;
    case bad_magic: put(p, u32(sw::magic ^ (1u << below(32)))); break;
    case bad_version: version = std::uint16_t(rng() & 1 ? 0 : sw::version + 1 + below(100)); break;
    // Bits 2 and 3 only (reserved): bits 4-15 are the sparse frame's step bits
    // (known_flags), which decode_header accepts, so with bit 0 set such a frame is
    // flagged non-finite rather than rejected.
    case unknown_flag: flags = std::uint16_t((rng() & 3) | (4u << below(2))); break;
    case count_past_frame: count = rng() & 1 ? 0xffffffffu : static_cast<u32>(uk + 3 + below(4)); break;
    case index_high: put(p + sw::header_bytes + 4 * (cnt - 1), i32(rng() & 1 ? n + i64(below(3)) : INT32_MAX)); break;
    case index_negative: put(p + sw::header_bytes, i32(rng() & 1 ? -1 - i64(below(3)) : INT32_MIN)); break;
    case not_increasing: {
      const std::size_t e = below(cnt - 1);
      put(p + sw::header_bytes + 4 * (e + 1), i32(idx[e] - i32(below(2))));  // a repeat, or one step down
      break;
    }
    case nonfinite_value: {
      const float bad[] = {nan_poison(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
      put(p + sw::header_bytes + 4 * (cnt + below(cnt)), bad[below(3)]);
      break;
    }
    case padding: case flagged_padding:
      if (kd == flagged_padding) flags = std::uint16_t(1 + below(3));
      p[expect + below(total - expect)] = std::byte(1 + below(255));
      break;
    case other_range: case flagged_range: {
      const std::size_t f = below(4);
      r[f] += (f % 2 == 0) ? -1 : 1;  // min - 1 or max + 1: ordered, but not this rank's n or k
      if (kd == flagged_range) flags = sw::flag_nonfinite;
      break;
    }
    case bad_range: {
      const std::size_t f = below(3);
      if (f == 0) r[0] = n + 1;                 // n_min > n_max
      if (f == 1) r[2] = -1;                    // negative
      if (f == 2) r[0] = r[1] = -1 - i64(below(5));
      break;
    }
    case mask: mask_bits = static_cast<u32>(1 + below(16)); break;  // zero mask bytes, in the padding
    default: break;
  }
  if (kd != bad_magic) put(p, sw::magic);
  put(p + 4, version), put(p + 6, flags), put(p + 8, count), put(p + 12, mask_bits);
  for (int f = 0; f < 4; ++f) put(p + 16 + 8 * f, r[f]);
  if (kd == short_frame) c.frame.resize(below(sw::header_bytes));
  return true;
}

//! One case: the device row against the host row, idx/val poisoned, status pre-set.
inline void check_begin_case(int kd, i64 n, i64 k) {
  begin_case c;
  if (!make_case(kd, n, k, c)) return;
  std::vector<i32> hidx(c.ni);
  for (auto& x : hidx) x = static_cast<i32>(rng());
  std::vector<float> hval(c.nv, nan_poison());
  const u32 pre = static_cast<u32>(rng() & 0x9u);  // other bits already set stay set
  std::vector<u32> hst{pre, 12345u};
  const auto idx0 = hidx;
  const auto val0 = hval;
  auto df = dev(c.frame);
  auto di = dev(hidx);
  auto dv = dev(hval);
  auto ds = dev(hst);
  H::oktopk_begin({}, std::span<const std::byte>(c.frame), n, k, std::span<i32>(hidx), std::span<float>(hval),
                  std::span<u32>(hst));
  D::oktopk_begin(E, df.cview(), n, k, di.view(), dv.view(), ds.view());
  // The host's answer is what the kind says (the test's own check), then the device's is the host's.
  const u32 want = want_status(kd);
  EXPECT(hst[0] == (pre | want) && hst[1] == 12345u, "oktopk_begin %s n=%lld k=%lld: the host's status is %u, not %u",
         kind_name(kd), (long long)n, (long long)k, hst[0], pre | want);
  if (want) EXPECT(diff(hidx, idx0) < 0 && diff(hval, val0) < 0, "oktopk_begin %s: the host wrote its outputs",
                   kind_name(kd));
  SAME(ds, hst, "oktopk_begin %s n=%lld k=%lld bytes=%zu: status %u", kind_name(kd), (long long)n, (long long)k,
       c.frame.size(), hst[0]);
  SAME(di, hidx, "oktopk_begin %s n=%lld k=%lld ni=%zu", kind_name(kd), (long long)n, (long long)k, c.ni);
  SAME(dv, hval, "oktopk_begin %s n=%lld k=%lld nv=%zu", kind_name(kd), (long long)n, (long long)k, c.nv);
}

inline void check_begin() {
  for (i64 n : {1, 2, 3, 8, 100, 4099, 1 << 20}) {
    std::vector<i64> ks{1, n};
    if (n > 2) ks.push_back(1 + static_cast<i64>(below(static_cast<std::size_t>(n))));
    if (n == 1 << 20) ks = {1, 70000};
    for (i64 k : ks)
      for (int kd = 0; kd < kinds; ++kd)
        for (int rep = 0; rep < (n < 5000 ? 3 : 1); ++rep) check_begin_case(kd, n, k);
  }
}

// ---- SparseReduceScatter fed by blocks, over CudaStagedComm<ThreadComm> and ThreadComm --------
using SC = cp::CudaStagedComm<cp::ThreadComm>;
inline std::mutex expect_mutex;  // EXPECT's counter is shared by the rank threads

struct agg_step {
  std::vector<float> out, acc;
  std::vector<u32> st;
  std::vector<i64> bounds;
  u32 flags = 0;
  float theta = 0;
};

//! One step on one rank from a block: begin, block, exchange; unless flagged, combine and
//! clear_selected of acc; then commit. out starts at 7.
template <class C>
agg_step run_step(cp::SparseReduceScatter<C>& agg, typename cp::comm_space_t<C>::template buffer<float>& acc,
                  const std::vector<float>& block, std::size_t n, std::size_t k, i64 step) {
  using S = cp::comm_space_t<C>;
  const auto e = cp::comm_exec(agg.comm());
  typename S::template buffer<float> out;
  typename S::template buffer<u32> st;
  out.resize(n), st.resize(2);
  cp::ops<S>::fill(e, out.view(), 7.0f);
  cp::ops<S>::fill(e, st.view(), u32{0});
  agg.begin(n, k, step, 0, st.view());
  cp::ops<S>::from_host(e, std::span<const float>(block), agg.block(block.size() * 4));
  agg.exchange();
  agg_step r;
  r.flags = agg.flags();
  if (r.flags == 0) agg.combine(0, out.view(), st.view()), agg.clear_selected(acc.view(), st.cview());
  r.out.resize(n), r.acc.resize(n), r.st.resize(2);
  cp::ops<S>::to_host(e, out.cview(), std::span<float>(r.out));
  cp::ops<S>::to_host(e, acc.cview(), std::span<float>(r.acc));
  cp::ops<S>::to_host(e, st.cview(), std::span<u32>(r.st));
  S::fence(e, cp::no_deadline());
  agg.commit(r.flags == 0);
  r.bounds.assign(agg.bounds().begin(), agg.bounds().end());
  r.theta = agg.theta();
  return r;
}

//! Five steps at P ranks (n, k), every rank's blocks drawn here; at step 2 the last rank's
//! block is made of kind `fault` (valid: none). Bits of out, acc, status, flags, regions
//! and theta equal on the device and the host, every step, every rank.
inline void check_aggregation(int P, std::size_t n, std::size_t k, int fault) {
  const int steps = 5;
  std::vector<std::vector<std::vector<float>>> blocks(static_cast<std::size_t>(steps));
  std::vector<std::vector<float>> acc0;
  for (int r = 0; r < P; ++r) acc0.push_back(draws(n));
  for (int s = 0; s < steps; ++s)
    for (int r = 0; r < P; ++r) {
      const auto set = commpact_test::random_set(rng(), static_cast<i64>(n), k);
      const std::size_t kcap = k + below(3);  // blocks may be larger than a frame of k
      auto b = commpact_test::sparse_block(set, static_cast<i64>(n), static_cast<i64>(k), kcap);
      if (s == 2 && r == P - 1 && fault != valid) {
        begin_case c;
        EXPECT(fault != short_frame && make_case(fault, static_cast<i64>(n), static_cast<i64>(k), c),
               "check_aggregation: no block of kind %s for n=%zu k=%zu", kind_name(fault), n, k);
        c.frame.resize(b.size() * 4 > c.frame.size() ? b.size() * 4 : (c.frame.size() + 3) / 4 * 4);
        b.assign(c.frame.size() / 4, 0.0f);
        std::memcpy(b.data(), c.frame.data(), c.frame.size());
      }
      blocks[static_cast<std::size_t>(s)].push_back(std::move(b));
    }
  cp::run_threads(P, [&](cp::ThreadComm& tc) {
    const int r = tc.rank();
    SC c{tc};
    const auto& e = c.exec();
    cp::SparseReduceScatter<SC> dagg{c, 2};
    cp::SparseReduceScatter<cp::ThreadComm> hagg{tc, 2};
    const auto& a0 = acc0[static_cast<std::size_t>(r)];
    cp::host_space::buffer<float> hacc;
    cp::cuda_buffer<float> dacc;
    hacc.resize(n), dacc.resize(n);
    H::from_host({}, std::span<const float>(a0), hacc.view());
    D::from_host(e, std::span<const float>(a0), dacc.view());
    for (int s = 0; s < steps; ++s) {
      const auto& b = blocks[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)];
      const auto h = run_step(hagg, hacc, b, n, k, s);
      const auto d = run_step(dagg, dacc, b, n, k, s);
      std::lock_guard<std::mutex> lock(expect_mutex);
      const bool same = diff(d.out, h.out) < 0 && diff(d.acc, h.acc) < 0 && d.st == h.st && d.flags == h.flags &&
                        d.bounds == h.bounds && std::memcmp(&d.theta, &h.theta, sizeof(float)) == 0;
      EXPECT(same, "SparseReduceScatter block P=%d n=%zu k=%zu fault=%s rank %d step %d: the device differs from the "
             "host (flags %u/%u, status %u/%u)", P, n, k, kind_name(fault), r, s, d.flags, h.flags, d.st[0], h.st[0]);
      const bool faulty = s == 2 && fault != valid;
      EXPECT(h.flags == (faulty ? (fault <= flag_nonfinite_entries ? 1u : 2u) : 0u),
             "SparseReduceScatter block P=%d fault=%s rank %d step %d: flags %u", P, kind_name(fault), r, s, h.flags);
    }
  });
}

}  // namespace oktopk_begin_test
