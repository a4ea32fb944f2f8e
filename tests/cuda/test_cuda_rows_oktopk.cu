// SPDX-License-Identifier: Apache-2.0
// OkTopK's rows of ops<cuda_space> (kernels/cuda/rows_oktopk.cuh) against their host twins
// (kernels/host/oktopk.hpp) on fresh random inputs, outputs poisoned first, bits and status
// compared: oktopk_local (non-finite status gating), oktopk_frames (random regions, empty
// ones, flags: 2 stops the entries, 4 (an estimation step) does not), oktopk_region_sum
// (overlapping entries, sums to +-0, malformed frames: bad
// magic, an index out of the region, unsorted, NaN/Inf values, a count above the slot's
// capacity, two bad slots), oktopk_mags, oktopk_theta (P blocks with ties and zeros: T and
// the limit), oktopk_select (ties at theta, +-0, a limit below, at and above the cap,
// denormals, cap above and below the count), oktopk_output (the same malformed blocks) and
// oktopk_clear_selected (status set or clear, |G| below and above P); then that the
// executor's scratch stops growing after the first step. oktopk_begin (oktopk_begin_checks.cuh):
// valid sparse_wire frames of 0..k entries (n from 1 to 2^20, k from 1 to n), flagged ones
// and every malformed kind the host rejects (magic, version, unknown flags, ranges, a mask,
// counts above k or past the frame, indices out of range or not increasing, non-finite
// values, nonzero padding, a frame shorter than its header): the same status bits and
// idx/val as the host, untouched when it rejects; and SparseReduceScatter over
// CudaStagedComm<ThreadComm> fed through block() at P = 1, 2, 3 for five steps (one bad
// block at step 2) against SparseReduceScatter<ThreadComm> fed the same blocks, bit for bit.
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/kernels/host/ops.hpp"

#include "oktopk_begin_checks.cuh"
#include "oktopk_rows_test_common.cuh"

using namespace oktopk_rows_test;

namespace {

void check_local() {
  D::topk_workspace dws;
  cp::host::topk_workspace hws;
  for (std::size_t n : {std::size_t{1} << 20, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}})
    for (std::size_t k : {std::size_t{1}, n / 3, n})
      for (u32 st : {0u, 1u, 4u}) {
        if (k == 0 || n > commpact_test::max_n()) continue;
        auto acc = draws(n);
        std::vector<u32> hs{st, 0};
        std::vector<i32> hidx(k + 3, -7);
        std::vector<float> hval(k + 3, nan_poison());
        auto dacc = dev(acc);
        auto didx = dev(hidx);
        auto dval = dev(hval);
        auto dst = dev(hs);
        H::oktopk_local({}, std::span<const float>(acc), k, std::span<const u32>(hs), std::span<i32>(hidx),
                        std::span<float>(hval), hws);
        D::oktopk_local(E, dacc.cview(), k, dst.cview(), didx.view(), dval.view(), dws);
        SAME(didx, hidx, "oktopk_local n=%zu k=%zu status=%u", n, k, st);
        SAME(dval, hval, "oktopk_local n=%zu k=%zu status=%u", n, k, st);
      }
  EXPECT(dws.allocations() == 1, "oktopk_local grew its workspace %zu times (largest n first)", dws.allocations());
}

void check_frames() {
  cp::host::topk_workspace hws;
  for (std::size_t P : {1, 2, 3, 5, 16})
    for (std::size_t n : {10, 5000, 100003})
      for (int mode = 0; mode < 5; ++mode) {  // accepted; status non-finite; flags = 2; 4 (estimation); 6
        const std::size_t k = std::max<std::size_t>(1, n / 20);
        auto acc = draws(n);
        std::vector<i32> idx(k);
        std::vector<float> val(k);
        cp::host::topk_abs(std::span<const float>(acc), k, std::span<i32>(idx), std::span<float>(val), hws);
        const auto bounds = random_bounds(P, n);
        const u32 flags = mode == 2 ? 2u : mode == 3 ? 4u : mode == 4 ? 6u : 0u;
        const bool stop = (flags & hk::stop_flags) != 0;  // entries go unless bit 0 or 1
        std::vector<u32> st{mode == 1 ? 1u : 0u, 0};
        bytes hdr = garbage(P * hk::header_bytes), pay = stop ? bytes{} : garbage(P * 8 * k);
        auto di = dev(idx);
        auto dv = dev(val);
        auto db = dev(bounds);
        auto ds = dev(st);
        auto dh = dev(hdr), dp = dev(pay);
        auto hi = stop ? std::span<const i32>{} : std::span<const i32>(idx);
        auto hv = stop ? std::span<const float>{} : std::span<const float>(val);
        H::oktopk_frames({}, hi, hv, std::span<const i64>(bounds), std::span<const u32>(st), flags, i64(n), i64(k), 9,
                         std::span<std::byte>(hdr), std::span<std::byte>(pay));
        D::oktopk_frames(E, stop ? cp::cuda_span<const i32>{} : di.cview(),
                         stop ? cp::cuda_span<const float>{} : dv.cview(), db.cview(), ds.cview(), flags, i64(n),
                         i64(k), 9, dh.view(), dp.view());
        SAME(dh, hdr, "oktopk_frames P=%zu n=%zu mode=%d", P, n, mode);
        SAME(dp, pay, "oktopk_frames P=%zu n=%zu mode=%d", P, n, mode);
      }
}

//! One reduce-scatter as seen by rank me: own frame slot in hdr_out/pay_out, the peers'
//! in hdr_in/pay_in (other slots garbage), then `bad` corruptions of peer slots.
void check_region_sum(std::size_t P, std::size_t n, std::size_t k, int bad) {
  const auto bounds = random_bounds(P, n);
  const auto me = below(P);
  const i64 lo = bounds[me], hi = bounds[me + 1];
  const auto len = static_cast<std::size_t>(hi - lo);
  const std::size_t stride = 8 * k;
  bytes ho = garbage(P * hk::header_bytes), hi_ = garbage(P * hk::header_bytes), po = garbage(P * stride),
        pi = garbage(P * stride);
  std::vector<float> prev_val;
  std::vector<i32> prev_idx;
  for (std::size_t j = 0; j < P; ++j) {
    const std::size_t c = std::min(k, len) ? below(std::min(k, len) + 1) : 0;
    auto idx = ascending(lo, hi, c, 2 * c);
    auto val = draws(c);
    for (std::size_t e = 0; e < c; ++e) {  // some sums cancel to +-0
      const auto at = std::lower_bound(prev_idx.begin(), prev_idx.end(), idx[e]);
      if (at != prev_idx.end() && *at == idx[e] && (rng() & 1)) val[e] = -prev_val[std::size_t(at - prev_idx.begin())];
    }
    std::byte* h = (j == me ? ho : hi_).data() + j * hk::header_bytes;
    put(h, hk::magic), put(h + 4, u32{0}), put(h + 8, std::uint64_t{c});
    put_entries((j == me ? po : pi).data() + j * stride, idx, val);
    prev_idx = idx, prev_val = val;
  }
  std::vector<std::size_t> peers;  // the peers with at least two entries, else all peers
  for (int most = 2; most >= 0 && peers.empty(); most -= 2)
    for (std::size_t j = 0; j < P; ++j) {
      std::uint64_t c;
      std::memcpy(&c, hi_.data() + j * hk::header_bytes + 8, 8);
      if (j != me && c >= std::uint64_t(most)) peers.push_back(j);
    }
  for (int b = 0; b < 2 && !peers.empty(); ++b) {
    const int kind = bad == 7 ? (b == 0 ? 4 : 2) : (b == 0 ? bad : 0);  // 7: two bad slots
    if (kind == 0) continue;
    const auto j = peers[below(peers.size())];
    std::byte* h = hi_.data() + j * hk::header_bytes;
    std::byte* p = pi.data() + j * stride;
    std::uint64_t c;
    std::memcpy(&c, h + 8, 8);
    if (kind == 1) put(h, u32{0xdeadbeef});                                    // magic: not a row's check
    if (kind == 2 && c) put(p + 4 * below(c), i32(rng() & 1 ? hi : lo - 1));  // outside the region
    if (kind == 3 && c > 1) {                                                 // unsorted
      const auto e = below(c - 1);
      i32 a;
      std::memcpy(&a, p + 4 * e, 4);
      put(p + 4 * (e + 1), a);
    }
    if (kind == 4 && c) put(p + 4 * (c + below(c)), nan_poison());
    if (kind == 5 && c) put(p + 4 * (c + below(c)), -std::numeric_limits<float>::infinity());
    if (kind == 6 && j + 1 < P) put(h + 8, std::uint64_t{k + 1 + below(k)});  // into the next slot
  }
  std::vector<float> reg(len, nan_poison());
  std::vector<std::uint8_t> touched(len, 0xEE);
  std::vector<u32> st{4u, 12345u};
  auto dho = dev(ho), dhi = dev(hi_), dpo = dev(po), dpi = dev(pi);
  auto dreg = dev(reg);
  auto dt = dev(touched);
  auto ds = dev(st);
  H::oktopk_region_sum({}, std::span<const std::byte>(ho), std::span<const std::byte>(po),
                       std::span<const std::byte>(hi_), std::span<const std::byte>(pi), int(me), lo, hi,
                       std::span<float>(reg), std::span<std::uint8_t>(touched), std::span<u32>(st));
  D::oktopk_region_sum(E, dho.cview(), dpo.cview(), dhi.cview(), dpi.cview(), int(me), lo, hi, dreg.view(), dt.view(),
                       ds.view());
  SAME(dreg, reg, "oktopk_region_sum P=%zu n=%zu k=%zu bad=%d me=%zu", P, n, k, bad, me);
  SAME(dt, touched, "oktopk_region_sum P=%zu n=%zu k=%zu bad=%d", P, n, k, bad);
  SAME(ds, st, "oktopk_region_sum P=%zu n=%zu k=%zu bad=%d: status %u %u", P, n, k, bad, st[0], st[1]);
}

void check_mags_theta() {
  for (std::size_t len : {0, 1, 100, 50000, 300000}) {
    if (len > commpact_test::max_n()) continue;  // COMMPACT_TEST_MAX_N (racecheck)
    for (std::size_t cap : {std::size_t{1}, std::size_t{10}, len / 10 + 1, len + 5})
      for (double dens : {0.0, 0.01, 0.5, 1.0}) {
        auto reg = draws(len);
        std::vector<std::uint8_t> touched(len);
        for (auto& t : touched) t = std::bernoulli_distribution(dens)(rng);
        std::vector<float> mags(cap, nan_poison()), ws(len + 17, nan_poison());
        auto dr = dev(reg), dm = dev(mags), dw = dev(ws);
        auto dt = dev(touched);
        H::oktopk_mags({}, std::span<const float>(reg), std::span<const std::uint8_t>(touched), std::span<float>(mags),
                       std::span<float>(ws));
        D::oktopk_mags(E, dr.cview(), dt.cview(), dm.view(), dw.view());
        SAME(dm, mags, "oktopk_mags len=%zu cap=%zu density=%g", len, cap, dens);
      }
  }
  // P descending blocks of k magnitudes (draw(): ties, zeros, denormals, huge values),
  // as the allgather of every owner's oktopk_mags gives them.
  for (std::size_t P : {1, 2, 5, 9})
    for (std::size_t k : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{20000}})
      for (int pad : {0, 1}) {  // pad: blocks with few nonzero values (the rest zeros)
        std::vector<float> all(P * k);
        for (std::size_t j = 0; j < P; ++j) {
          const std::size_t m = pad ? below(k / 4 + 2) : k;
          for (std::size_t i = 0; i < k; ++i) all[j * k + i] = i < m ? std::fabs(draw()) : 0.0f;  // no -0
          std::sort(all.begin() + std::ptrdiff_t(j * k), all.begin() + std::ptrdiff_t((j + 1) * k), std::greater<>());
        }
        for (std::size_t me : {std::size_t{0}, below(P), P - 1}) {
          std::vector<float> theta{nan_poison()};
          std::vector<u32> limit{0xdeadbeefu};
          auto da = dev(all), dth = dev(theta);
          auto dl = dev(limit);
          H::oktopk_theta({}, std::span<const float>(all), k, int(me), std::span<float>(theta), std::span<u32>(limit));
          D::oktopk_theta(E, da.cview(), k, int(me), dth.view(), dl.view());
          SAME(dth, theta, "oktopk_theta P=%zu k=%zu pad=%d me=%zu", P, k, pad, me);
          SAME(dl, limit, "oktopk_theta P=%zu k=%zu pad=%d me=%zu: limit %u", P, k, pad, me, limit[0]);
          SAME(da, all, "oktopk_theta P=%zu k=%zu: all is read only", P, k);
        }
      }
}

void check_select() {
  for (std::size_t len : {0, 1, 1000, 200003}) {
    if (len > commpact_test::max_n()) continue;  // COMMPACT_TEST_MAX_N (racecheck)
    for (std::size_t cap : {std::size_t{0}, std::size_t{1}, std::size_t{5}, len / 50 + 1, len + 3})
      for (int th = 0; th < 5; ++th) {  // theta: 0, a drawn |sum| (ties at it), +Inf, NaN, denormal
        auto reg = draws(len);
        std::vector<std::uint8_t> touched(len);
        for (auto& t : touched) t = std::bernoulli_distribution(0.7)(rng);
        float t = th == 0   ? 0.0f
                  : th == 2 ? std::numeric_limits<float>::infinity()
                  : th == 3 ? nan_poison()
                  : th == 4 ? std::numeric_limits<float>::denorm_min() * 3.0f
                            : (len ? std::fabs(reg[below(len)]) : 1.0f);
        std::vector<float> theta{t};
        // limit: none (above cap), a few, zero, or exactly cap
        std::vector<u32> limit{u32(th == 0 ? cap + 10 : th == 1 ? below(cap + 1) : th == 2 ? 0 : cap)};
        const i64 lo = static_cast<i64>(below(1000));
        const int me = static_cast<int>(below(9));
        bytes blk = garbage(8 + 8 * cap);
        std::vector<i32> ws(len + 5, -3);
        auto dr = dev(reg), dth = dev(theta);
        auto dt = dev(touched);
        auto db = dev(blk);
        auto dw = dev(ws);
        auto dl = dev(limit);
        H::oktopk_select({}, std::span<const float>(reg), std::span<const std::uint8_t>(touched),
                         std::span<const float>(theta), std::span<const u32>(limit), lo, me, std::span<std::byte>(blk),
                         std::span<i32>(ws));
        D::oktopk_select(E, dr.cview(), dt.cview(), dth.cview(), dl.cview(), lo, me, db.view(), dw.view());
        SAME(db, blk, "oktopk_select len=%zu cap=%zu theta=%a limit=%u", len, cap, t, limit[0]);
      }
  }
}

//! Allgather blocks of P origins (block o: entries in region o), then `bad` corruptions of
//! another origin's block; output and clear_selected against the host.
void check_output_clear(std::size_t P, std::size_t n, std::size_t cap, int bad, u32 status0) {
  const auto bounds = random_bounds(P, n);
  const auto me = below(P);
  const std::size_t stride = 8 + 8 * cap;
  bytes blocks = garbage(P * stride);
  std::vector<i32> G;
  for (std::size_t o = 0; o < P; ++o) {
    const auto len = static_cast<std::size_t>(bounds[o + 1] - bounds[o]);
    const std::size_t c = below(std::min(cap, len) + 1);
    const auto idx = ascending(bounds[o], bounds[o + 1], c, len);
    const auto val = draws(c);
    put(blocks.data() + o * stride, u32(o)), put(blocks.data() + o * stride + 4, u32(c));
    put_entries(blocks.data() + o * stride + 8, idx, val);
    G.insert(G.end(), idx.begin(), idx.end());
  }
  std::vector<std::size_t> others;
  for (std::size_t o = 0; o < P; ++o)
    if (o != me) others.push_back(o);
  if (bad && !others.empty()) {
    const auto o = others[below(others.size())];
    std::byte* p = blocks.data() + o * stride;
    u32 c;
    std::memcpy(&c, p + 4, 4);
    if (bad == 2 && c) put(p + 8 + 4 * below(c), i32(bounds[o + 1]));
    if (bad == 3 && c > 1) put(p + 8 + 4 * (c - 1), i32(bounds[o]));
    if (bad == 4 && c) put(p + 8 + 4 * (c + below(c)), nan_poison());
    if (bad == 6 && o + 1 < P) put(p + 4, u32(cap + 1 + below(cap + 1)));
  }
  if (bad == 8) {  // a sum that overflowed, in this rank's own block: status nonfinite alike
    std::byte* p = blocks.data() + me * stride;
    u32 c;
    std::memcpy(&c, p + 4, 4);
    if (c) put(p + 8 + 4 * (c + below(c)), std::numeric_limits<float>::infinity());
  }
  std::vector<float> grad(n, nan_poison());
  std::vector<u32> st{status0, 77u};
  auto dblk = dev(blocks);
  auto dbd = dev(bounds);
  auto dg = dev(grad);
  auto ds = dev(st);
  H::oktopk_output({}, std::span<const std::byte>(blocks), std::span<const i64>(bounds), int(me),
                   std::span<float>(grad), std::span<u32>(st));
  D::oktopk_output(E, dblk.cview(), dbd.cview(), int(me), dg.view(), ds.view());
  SAME(dg, grad, "oktopk_output P=%zu n=%zu cap=%zu bad=%d", P, n, cap, bad);
  SAME(ds, st, "oktopk_output P=%zu n=%zu cap=%zu bad=%d: status %u %u", P, n, cap, bad, st[0], st[1]);
  if (bad) return;  // clear_selected runs after an output that found nothing wrong
  // Local entries: half of them selected somewhere (G), the rest random.
  std::vector<i32> idx;
  for (auto g : G)
    if (rng() & 1) idx.push_back(g);
  for (std::size_t e = 0; e < cap; ++e) idx.push_back(static_cast<i32>(below(n)));
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  auto acc = draws(n);
  std::vector<i64> next(P + 1, -5);
  auto da = dev(acc);
  auto di = dev(idx);
  auto dn = dev(next);
  H::oktopk_clear_selected({}, std::span<float>(acc), std::span<const i32>(idx), std::span<const std::byte>(blocks),
                           std::span<const i64>(bounds), std::span<const u32>(st), std::span<i64>(next));
  D::oktopk_clear_selected(E, da.view(), di.cview(), dblk.cview(), dbd.cview(), ds.cview(), dn.view());
  SAME(da, acc, "oktopk_clear_selected P=%zu n=%zu cap=%zu status=%u |G|=%zu", P, n, cap, status0, G.size());
  SAME(dn, next, "oktopk_clear_selected P=%zu n=%zu cap=%zu status=%u |G|=%zu", P, n, cap, status0, G.size());
}

//! Three steps of the rows that use the executor's scratch, regions changing: the scratch
//! reaches its size at the first step.
void check_growth() {
  // 200000 entries, or COMMPACT_TEST_MAX_N's (racecheck) down to 20000.
  const std::size_t n = std::clamp<std::size_t>(commpact_test::max_n(), 20000, 200000), P = 4, k = 2000,
                    cap = (2 * k + P - 1) / P;
  cp::cuda_buffer<float> reg, ws, mags, all, theta, grad;
  cp::cuda_buffer<std::uint8_t> touched;
  cp::cuda_buffer<i32> sws;
  cp::cuda_buffer<std::byte> blocks;
  cp::cuda_buffer<u32> st, limit;
  cp::cuda_buffer<i64> bounds;
  reg = dev(draws(n)), ws.resize(n), mags.resize(k), all = dev(std::vector<float>(k * P, 1.0f)), theta.resize(1);
  limit.resize(1);
  grad.resize(n), touched = dev(std::vector<std::uint8_t>(n, 1)), sws.resize(n), blocks.resize(P * (8 + 8 * cap));
  st = dev(std::vector<u32>{0, 0});
  std::size_t first = 0, first_bytes = 0;
  for (int step = 0; step < 3; ++step) {
    const auto b = random_bounds(P, n);
    bounds = dev(b);
    const auto len = static_cast<std::size_t>(b[1] - b[0]);
    D::oktopk_mags(E, reg.cview().first(len), touched.cview().first(len), mags.view(), ws.view());
    D::oktopk_theta(E, all.cview(), k, 0, theta.view(), limit.view());
    D::oktopk_select(E, reg.cview().first(len), touched.cview().first(len), theta.cview(), limit.cview(), 0, 0,
                     blocks.view().subspan(0, 8 + 8 * cap), sws.view());
    cp::cuda_space::fence(E, cp::no_deadline());
    if (step == 0) first = E.scratch_allocations(), first_bytes = E.scratch_bytes();
    else
      EXPECT(E.scratch_allocations() == first && E.scratch_bytes() == first_bytes,
             "step %d: the executor's scratch grew (%zu bytes, %zu at the first step)", step, E.scratch_bytes(),
             first_bytes);
  }
}

}  // namespace

int main() {
  return commpact_test::run_checks("all OkTopK row checks passed\n", "%d OkTopK row checks failed\n", [] {
    E = cp::cuda_space::make_exec();
    const auto seed = std::random_device{}();
    std::printf("seed %u\n", seed);
    rng.seed(seed);
    check_growth();
    check_local();
    check_frames();
    for (std::size_t P : {1, 2, 3, 4, 8})
      for (int bad = 0; bad < 8; ++bad) {
        check_region_sum(P, 5003, 300, bad);
        check_region_sum(P, 50, 7, bad);
      }
    const std::size_t big = std::size_t{1} << 20;  // skipped above COMMPACT_TEST_MAX_N (racecheck)
    const bool run_big = big <= commpact_test::max_n();
    if (run_big) {
      check_region_sum(4, big, 10000, 0);
      check_region_sum(3, big, 10000, 4);
    }
    check_mags_theta();
    check_select();
    for (std::size_t P : {1, 2, 3, 5, 8})
      for (int bad : {0, 2, 3, 4, 6, 8})
        for (u32 s0 : {0u, 1u}) {
          check_output_clear(P, 20011, 400, bad, s0);
          check_output_clear(P, 40, 2, bad, s0);  // |G| often below P
        }
    if (run_big) check_output_clear(4, big, 5000, 0, 0);
    namespace ob = oktopk_begin_test;
    ob::check_begin();
    for (int P : {1, 2, 3}) {
      ob::check_aggregation(P, 4099, 40, ob::valid);
      ob::check_aggregation(P, 97, 5, ob::valid);
      for (int f : {ob::flag_nonfinite, ob::flag_failed, ob::bad_magic, ob::count_above_k, ob::not_increasing,
                    ob::nonfinite_value, ob::padding, ob::other_range, ob::mask})
        ob::check_aggregation(P, 500, 8, f);
    }
  });
}
