// SPDX-License-Identifier: Apache-2.0
#pragma once
// For tests/cuda/test_cuda_rows_cast_vote.cu (namespace rows_test): GossipMixer's
// rows (gossip_check, gossip_agree_begin/end, gossip_pack, gossip_mix, choco_update) and TreeMerge's tree_begin
// against ops<host_space>, on fresh random inputs with poisoned outputs.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "commpact/wire/sparse_frame.hpp"
#include "rows_test_util.cuh"

namespace rows_test {

inline void check_gossip_rows(std::mt19937_64& rng) {
  // gossip_agree_begin / gossip_agree_end: the agreement's words, on the flag and round
  // cases (the allreduce between them is stood in for by the words as written).
  for (std::int64_t flag : {0, 1, 3})
    for (std::int64_t round : {std::int64_t{0}, std::int64_t{5}, (std::int64_t{1} << 62)}) {
      std::vector<std::int64_t> hw{flag, 17, 0, -9, -9, -9};
      cp::cuda_buffer<std::int64_t> dw;
      upload(dw, hw);
      H::gossip_agree_begin({}, round, std::span<std::int64_t>(hw));
      D::gossip_agree_begin(E, round, dw.view());
      EXPECT(download(dw) == hw, "gossip_agree_begin flag=%d: words differ", int(flag));
      for (std::int64_t other : {round, round - 1}) {  // max(-round) from a rank at `other`
        auto h2 = hw;
        h2[5] = -other;
        upload(dw, h2);
        H::gossip_agree_end({}, std::span<std::int64_t>(h2));
        D::gossip_agree_end(E, dw.view());
        EXPECT(download(dw) == h2 && (h2[0] == 4) == (other != round), "gossip_agree_end flag=%d: words differ",
               int(flag));
      }
    }
  std::normal_distribution<float> d;
  std::uniform_real_distribution<double> wd(0.05, 0.5);
  for (std::size_t n : {1u, 33u, 70001u})
    for (std::size_t deg = 0; deg <= 3; ++deg)
      for (int words_case = 0; words_case < 3; ++words_case) {  // clear; flagged (words[0] = 1); malformed (words[2])
        std::vector<float> x(n), recv(deg * n);
        for (auto& v : x) v = d(rng);
        for (auto& v : recv) v = d(rng);
        if (n > 2) x[n / 2] = 1e-42f, x[1] = -0.0f;
        std::vector<double> w(deg), acc(n, std::nan("")), hacc = acc;
        for (auto& v : w) v = wd(rng);
        const double self_w = wd(rng);
        // gossip_check: a NaN and an Inf (the first is reported), on and off.
        auto xc = x;
        if (n > 10) xc[n - 2] = std::numeric_limits<float>::infinity(), xc[n / 3] = std::nanf("");
        for (bool on : {true, false}) {
          std::vector<std::int64_t> hw(3, -7);
          cp::cuda_buffer<float> dx;
          cp::cuda_buffer<std::int64_t> dw;
          upload(dx, xc), upload(dw, hw);
          H::gossip_check({}, std::span<const float>(xc), on, std::span<std::int64_t>(hw));
          D::gossip_check(E, dx.cview(), on, dw.view());
          EXPECT(download(dw) == hw, "gossip_check n=%zu on=%d: words differ", n, int(on));
        }
        // gossip_pack
        {
          std::vector<std::byte> hm(4 * n + 8, std::byte{0xA5});
          cp::cuda_buffer<float> dx;
          cp::cuda_buffer<std::byte> dm;
          upload(dx, x), upload(dm, hm);
          H::gossip_pack({}, std::span<const float>(x), std::span<std::byte>(hm));
          D::gossip_pack(E, dx.cview(), dm.view());
          EXPECT(diff_bits(download(dm), hm) == 0, "gossip_pack n=%zu differs", n);
        }
        std::vector<std::int64_t> words{words_case == 1 ? 1 : 0, static_cast<std::int64_t>(n),
                                        words_case == 2 ? 2 : 0};
        // gossip_mix
        {
          auto hx = x;
          cp::cuda_buffer<float> dx;
          cp::cuda_buffer<std::byte> dr;
          cp::cuda_buffer<double> dwt, dacc;
          cp::cuda_buffer<std::int64_t> dwords;
          std::vector<std::byte> rb(recv.size() * 4);
          if (!rb.empty()) std::memcpy(rb.data(), recv.data(), rb.size());
          upload(dx, x), upload(dr, rb), upload(dwt, w), upload(dacc, acc), upload(dwords, words);
          H::gossip_mix({}, std::span<float>(hx), std::span<const std::byte>(rb), std::span<const double>(w), self_w,
                        std::span<double>(hacc), std::span<const std::int64_t>(words));
          D::gossip_mix(E, dx.view(), dr.cview(), dwt.cview(), self_w, dacc.view(), dwords.cview());
          EXPECT(diff_bits(download(dx), hx) == 0, "gossip_mix n=%zu deg=%zu words=%d: x differs", n, deg, words_case);
          EXPECT(diff_nan(download(dacc), hacc) == 0, "gossip_mix n=%zu deg=%zu: acc differs", n, deg);
        }
        // choco_update
        {
          std::vector<float> hs(n), qs(n), hn(deg * n), qn(deg * n);
          for (auto* v : {&hs, &qs, &hn, &qn})
            for (auto& e : *v) e = d(rng);
          auto hx = x;
          std::vector<double> cacc(n, std::nan(""));
          cp::cuda_buffer<float> dx, dhs, dqs, dhn, dqn;
          cp::cuda_buffer<double> dwt, dacc;
          cp::cuda_buffer<std::int64_t> dwords;
          upload(dx, x), upload(dhs, hs), upload(dqs, qs), upload(dhn, hn), upload(dqn, qn);
          upload(dwt, w), upload(dacc, cacc), upload(dwords, words);
          const double gamma = 0.37;
          H::choco_update({}, std::span<float>(hx), std::span<float>(hs), std::span<const float>(qs),
                          std::span<float>(hn), std::span<const float>(qn), std::span<const double>(w), gamma,
                          std::span<double>(cacc), std::span<const std::int64_t>(words));
          D::choco_update(E, dx.view(), dhs.view(), dqs.cview(), dhn.view(), dqn.cview(), dwt.cview(), gamma,
                          dacc.view(), dwords.cview());
          EXPECT(diff_bits(download(dx), hx) == 0, "choco_update n=%zu deg=%zu words=%d: x differs", n, deg,
                 words_case);
          EXPECT(diff_bits(download(dhs), hs) == 0 && diff_bits(download(dhn), hn) == 0,
                 "choco_update n=%zu deg=%zu: the public copies differ", n, deg);
          EXPECT(diff_nan(download(dacc), cacc) == 0, "choco_update n=%zu deg=%zu: acc differs", n, deg);
        }
      }
}

namespace {

//! The tree's buffers on both sides (kcap entries each), poisoned.
struct tree_bufs {
  std::vector<std::int32_t> mi, ci, oi, ui, ei;
  std::vector<float> cv, ov, uv;
  std::vector<std::uint8_t> ma, ea, mk;
  cp::cuda_buffer<std::int32_t> dmi, dci, doi, dui, dei;
  cp::cuda_buffer<float> dcv, dov, duv;
  cp::cuda_buffer<std::uint8_t> dma, dea, dmk;
  explicit tree_bufs(std::size_t kcap)
      : mi(kcap, -5), ci(kcap, -5), oi(kcap, -5), ui(kcap, -5), ei(kcap, -5), cv(kcap, std::nanf("")),
        ov(cv), uv(cv), ma(kcap, 0xA5), ea(ma), mk(ma) {
    upload(dmi, mi), upload(dci, ci), upload(doi, oi), upload(dui, ui), upload(dei, ei);
    upload(dcv, cv), upload(dov, ov), upload(duv, uv), upload(dma, ma), upload(dea, ea), upload(dmk, mk);
  }
  cp::host_tree_views host() {
    return {mi, ci, oi, ui, ei, cv, ov, uv, ma, ea, mk};
  }
  D::tree_views dev() {
    return {dmi.view(), dci.view(), doi.view(), dui.view(), dei.view(), dcv.view(),
            dov.view(), duv.view(), dma.view(), dea.view(), dmk.view()};
  }
};

bool same_meta(const cp::sparse_tree_meta& a, const cp::sparse_tree_meta& b) {
  const auto &x = a.cur, &y = b.cur;
  return x.flags == y.flags && x.count == y.count && x.mask_bits == y.mask_bits && x.n_min == y.n_min &&
         x.n_max == y.n_max && x.k_min == y.k_min && x.k_max == y.k_max && a.cur_count == b.cur_count &&
         a.mine_count == b.mine_count && a.extra_count == b.extra_count && a.status == b.status &&
         a.wire_peer == b.wire_peer && a.n == b.n && a.k == b.k;
}

}  // namespace

//! tree_begin on well-formed, flagged and malformed blocks (a codec's sparse_wire frame
//! padded to the block): meta, sets and alive flags against host::tree::begin.
inline void check_tree_begin(std::mt19937_64& rng) {
  namespace sw = cp::sparse_wire;
  std::normal_distribution<float> d;
  for (std::size_t n : {1u, 100u, 100003u})
    for (int kase = 0; kase < 14; ++kase) {
      const std::size_t k = std::max<std::size_t>(1, n / 50), kcap = k;
      std::vector<std::int32_t> idx;
      std::vector<float> val;
      for (std::size_t i = 0; i < n && idx.size() < k; i += 1 + rng() % 7) idx.push_back(static_cast<std::int32_t>(i));
      for (std::size_t j = 0; j < idx.size(); ++j) val.push_back(j % 5 == 0 ? -0.0f : d(rng));
      sw::header h;
      h.n_min = h.n_max = static_cast<std::int64_t>(n);
      h.k_min = h.k_max = static_cast<std::int64_t>(k);
      if (kase == 1) h.flags = sw::flag_nonfinite;
      if (kase == 2) h.flags = sw::flag_failed;
      if (kase == 3) h.n_max += 1;                               // not a single n
      if (kase == 4) h.k_min = static_cast<std::int64_t>(k) - 1;  // not a single k (k >= 1)
      if (kase == 5 && !val.empty()) val.back() = std::numeric_limits<float>::infinity();
      if (kase == 6 && idx.size() > 1) std::swap(idx[0], idx[1]);  // unsorted
      if (kase == 7 && !idx.empty()) idx.back() = static_cast<std::int32_t>(n);  // index out of range
      if (kase == 8) h.k_min = h.k_max = static_cast<std::int64_t>(idx.size()) - 1;  // more than k entries
      if (kase == 13) h.flags = 4;  // unknown flag bit
      const std::size_t bytes = (sw::encoded_size(k) + 3) / 4 * 4 + 8;  // the block, float storage
      std::vector<std::byte> block(bytes);
      sw::encode_frame(std::span<std::byte>(block), h, std::span<const std::int32_t>(idx),
                       std::span<const float>(val));
      if (kase == 9) block[0] = std::byte{0};                 // bad magic
      if (kase == 10) block[bytes - 1] = std::byte{1};        // stray padding
      if (kase == 11) block.resize(40);                      // shorter than a header
      if (kase == 12) std::memset(block.data() + 8, 0xFF, 4);  // count far past the block
      tree_bufs tb(kcap);
      cp::sparse_tree_meta hm{};
      hm.wire_peer = 99;
      H::tree_begin({}, std::span<cp::sparse_tree_meta>(&hm, 1), std::span<const std::byte>(block), 3, tb.host());
      cp::cuda_buffer<std::byte> dblock;
      cp::cuda_buffer<cp::sparse_tree_meta> dm;
      upload(dblock, block), upload(dm, std::vector<cp::sparse_tree_meta>(1));
      D::tree_begin(E, dm.view(), dblock.cview(), 3, tb.dev());
      const auto got = download(dm);
      EXPECT(same_meta(got[0], hm), "tree_begin n=%zu case %d: the meta differs (status %u vs %u, count %u vs %u)",
             n, kase, got[0].status, hm.status, got[0].cur_count, hm.cur_count);
      EXPECT(diff_bits(download(tb.dmi), tb.mi) == 0 && diff_bits(download(tb.dci), tb.ci) == 0 &&
                 diff_bits(download(tb.dcv), tb.cv) == 0 && diff_bits(download(tb.dma), tb.ma) == 0,
             "tree_begin n=%zu case %d: the sets differ", n, kase);
      const bool expect_wire = kase >= 3 && !(kase == 6 && idx.size() < 2);
      EXPECT(((hm.status & cp::status_wire) != 0) == expect_wire,
             "tree_begin n=%zu case %d: the host's own status %u is not what the case expects", n, kase, hm.status);
    }
}

}  // namespace rows_test
