// SPDX-License-Identifier: Apache-2.0
// CHOCO-SGD's codec on the CUDA space (ops<cuda_space>'s choco_encode and choco_decode,
// kernels/cuda/rows_choco.cuh, over compress/device_codecs.cuh): GossipMixer with
// choco_gossip<Q> over CudaStagedComm<ThreadComm> against the same mixer over ThreadComm on
// the host, on a ring at P = 2, 3 and 5, for topk_codec, sign_codec, qsgd_codec (several
// buckets, stochastic rounding) and threshold_codec (framed: a 4-byte length in front; lambda
// 0.8 on N(0, 1) values passes 42% of the entries at the first round, above the cap of 20%):
// - 5 rounds with a local step between them: the models, the saved states (the public
//   copies, the round, the counters) and the bytes sent bit for bit after every round; no
//   device allocation after the first round (workspace_signature);
// - a NaN on the last rank: numeric_error on every rank on both, nothing changed;
// - a hostile model on rank 1 (every value FLT_MAX, then -FLT_MAX: its difference to the
//   public copy overflows to -Inf): each round's outcome alike on both sides on every rank
//   (mixed, or wire_error naming rank 1 on its ring neighbours, which the host raises for
//   topk, sign and threshold; QSGD's message stays valid), the models alike (NaN for NaN);
// - ops<cuda_space>'s choco rows against ops<host_space>'s directly (also fp16,
//   n = 1 ... 5000): encode's message, q, diff and words, a flagged model's zeroed message,
//   and the decode of three messages, one of them all 0xFF bytes (malformed: words[2]).
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.

#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "commpact/comm/cuda_staged_comm.hpp"
#include "commpact/comm/thread_comm.hpp"
#include "commpact/compress/codecs/quantizers.hpp"
#include "commpact/compress/codecs/sparsifiers.hpp"
#include "commpact/compress/codecs/topk_sign.hpp"
#include "commpact/gossip/gossip_mixer.hpp"
#include "commpact/compress/device_codecs.cuh"
#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/space/cuda.hpp"
#include "commpact/topology/ring.hpp"

#include "cuda_test_common.cuh"

namespace cp = commpact;
using D = cp::ops<cp::cuda_space>;
using SC = cp::CudaStagedComm<cp::ThreadComm>;
using commpact_test::download;
using commpact_test::same;
using commpact_test::upload;
using commpact_test::values;

namespace {

//! Bit for bit, except that any NaN equals any NaN (the device's NaN payloads may differ).
bool same_or_nan(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::isnan(a[i]) && std::isnan(b[i])) && std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  return true;
}
template <class M>
std::vector<std::byte> saved(const M& m) {
  std::vector<std::byte> s;
  m.save_state(s);
  return s;
}

//! One mix()'s outcome: 0 mixed, 1 skipped, 2 wire_error, 3 numeric_error, 4 another error.
struct outcome {
  int kind = 0;
  std::string what;
};
template <class F>
outcome attempt(F&& f) {
  try {
    return {f() ? 0 : 1, {}};
  } catch (const cp::wire_error& e) {
    return {2, e.what()};
  } catch (const cp::numeric_error& e) {
    return {3, e.what()};
  } catch (const std::exception& e) {
    return {4, e.what()};
  }
}

const cp::tensor_layout kLayout = {{12, 10}, {10}, {8, 16}, {5}, {20, 6}};
constexpr std::size_t kN = 120 + 10 + 128 + 5 + 120;

//! The rounds above for GossipMixer<Ring, choco_gossip<Q>> at P ranks; `hostile_raises`: the
//! host raises wire_error on rank 1's neighbours at the hostile model's second round.
template <class Q>
void check_choco(const char* name, int P, Q codec, bool hostile_raises) {
  using Mode = cp::choco_gossip<Q>;
  const Mode mode{codec, 0.4};
  cp::run_threads(P, [&](cp::ThreadComm& tc) {
    const int r = tc.rank();
    SC c{tc};
    const auto& e = c.exec();
    cp::GossipMixer<cp::Ring, Mode, SC> dev{c, cp::Ring(P), kLayout, mode};
    cp::GossipMixer<cp::Ring, Mode, cp::ThreadComm> host{tc, cp::Ring(P), kLayout, mode};
    EXPECT_MT(dev.message_bytes() == host.message_bytes(), "%s P=%d: message bytes %zu, the host's %zu", name, P,
              dev.message_bytes(), host.message_bytes());
    auto x = values(700 + r, kN);
    cp::cuda_buffer<float> xd;
    upload(e, x, xd);
    std::vector<std::pair<const void*, std::size_t>> sig;
    for (int round = 0; round < 5; ++round) {
      const auto h = attempt([&] { return host.mix(std::span<float>(x)); });
      const auto d = attempt([&] { return dev.mix(xd.view()); });
      EXPECT_MT(h.kind == 0 && d.kind == 0, "%s P=%d rank %d round %d: host %d (%s), device %d (%s)", name, P, r, round,
                h.kind, h.what.c_str(), d.kind, d.what.c_str());
      EXPECT_MT(same(download(e, xd.cview()), x), "%s P=%d rank %d round %d: the model differs from the host", name, P,
                r, round);
      EXPECT_MT(saved(dev) == saved(host), "%s P=%d rank %d round %d: the saved state (public copies) differs", name,
                P, r, round);
      EXPECT_MT(dev.stats().bytes_sent == host.stats().bytes_sent && dev.stats().steps == host.stats().steps,
                "%s P=%d rank %d round %d: the counters differ", name, P, r, round);
      if (round == 0) sig = dev.workspace_signature();
      else EXPECT_MT(dev.workspace_signature() == sig, "%s P=%d rank %d round %d: reallocated", name, P, r, round);
      const auto step = values(9000 + 100 * round + r, kN, 0.1f);  // a local step, the same on both sides
      for (std::size_t i = 0; i < kN; ++i) x[i] += step[i];
      upload(e, x, xd);
    }
    // A NaN on the last rank: numeric_error on every rank, on both sides; nothing changes.
    {
      auto xn = x;
      if (r == P - 1) xn[kN / 3] = std::numeric_limits<float>::quiet_NaN();
      cp::cuda_buffer<float> xnd;
      upload(e, xn, xnd);
      const auto before = saved(dev);
      const auto h = attempt([&] { return host.mix(std::span<float>(xn)); });
      const auto d = attempt([&] { return dev.mix(xnd.view()); });
      EXPECT_MT(h.kind == 3 && d.kind == 3, "%s P=%d rank %d: a NaN on rank %d: host %d, device %d (%s)", name, P, r,
                P - 1, h.kind, d.kind, d.what.c_str());
      EXPECT_MT(same(download(e, xnd.cview()), xn) && saved(dev) == before && saved(host) == before,
                "%s P=%d rank %d: the NaN round changed something", name, P, r);
    }
    // The hostile model on rank 1: FLT_MAX everywhere, then -FLT_MAX.
    for (int round = 0; round < 2; ++round) {
      if (r == 1) {
        for (auto& v : x) v = round == 0 ? FLT_MAX : -FLT_MAX;
        upload(e, x, xd);
      }
      const auto h = attempt([&] { return host.mix(std::span<float>(x)); });
      const auto d = attempt([&] { return dev.mix(xd.view()); });
      EXPECT_MT(h.kind == d.kind, "%s P=%d rank %d hostile round %d: host %d (%s), device %d (%s)", name, P, r, round,
                h.kind, h.what.c_str(), d.kind, d.what.c_str());
      const bool neighbour = r == 0 || r == 2 % P;
      const bool want_wire = hostile_raises && round == 1 && neighbour;
      EXPECT_MT(h.kind == (want_wire ? 2 : 0), "%s P=%d rank %d hostile round %d: the host's outcome %d (%s)", name, P,
                r, round, h.kind, h.what.c_str());
      if (d.kind == 2)
        EXPECT_MT(d.what.find("malformed message from rank 1") != std::string::npos &&
                      h.what.find("malformed message from rank 1") != std::string::npos,
                  "%s P=%d rank %d: the wire_error names the sender: %s", name, P, r, d.what.c_str());
      EXPECT_MT(same_or_nan(download(e, xd.cview()), x), "%s P=%d rank %d hostile round %d: the model differs", name,
                P, r, round);
    }
  });
}

//! ops<cuda_space>'s choco rows against ops<host_space>'s directly, one rank, n
//! values (a -0 in x and in hat): encode with words[0] = 0 (msg, q, words bits) and 1 (msg
//! zeroed), then decode of 3 messages, the middle one valid or all 0xFF bytes (malformed
//! for every codec here: an index -1, a NaN scale or norm, a length above the capacity).
template <class Q>
void check_direct(const char* name, Q codec, std::size_t n) {
  using HK = cp::ops<cp::host_space>;
  HK::choco_workspace<Q> hk;
  D::choco_workspace<Q> dk;
  const bool framed = cp::variable_length_codec<Q>::value;
  const auto e = cp::cuda_space::make_exec();
  Q hc = codec, dc = codec;
  if constexpr (requires { hc.begin_step(3); }) hc.begin_step(3), dc.begin_step(3);
  if constexpr (requires { hc.bind_rank(1); }) hc.bind_rank(1), dc.bind_rank(1);
  const std::size_t mb = codec.max_encoded_bytes(n) + (framed ? 4 : 0);
  auto x = values(31, n), hat = values(32, n, 0.5f);
  x[n / 2] = -0.0f, hat[n / 2] = 0.0f, x[n / 3] = hat[n / 3];
  std::vector<std::vector<std::byte>> sent;
  for (std::int64_t w0 : {0, 1, 0, 0}) {  // the three clean ones: the neighbours' messages decoded below
    std::vector<float> diff(n, 7.0f), q(n, 7.0f);
    std::vector<std::byte> msg(mb, std::byte{0xA5});
    std::vector<std::int64_t> words = {w0, static_cast<std::int64_t>(n), 0};
    cp::cuda_buffer<float> xd, hd, dd, qd;
    upload(e, x, xd), upload(e, hat, hd), upload(e, diff, dd), upload(e, q, qd);
    cp::cuda_buffer<std::byte> md;
    md.resize(mb);
    D::from_host(e, std::span<const std::byte>(msg), md.view());
    cp::cuda_buffer<std::int64_t> wd;
    wd.resize(3);
    D::from_host(e, std::span<const std::int64_t>(words), wd.view());
    HK::choco_encode<Q>({}, hk, hc, std::span<const float>(x), std::span<const float>(hat), std::span<float>(diff),
                        std::span<std::byte>(msg), std::span<float>(q), std::span<std::int64_t>(words), framed);
    D::choco_encode<Q>(e, dk, dc, xd.cview(), hd.cview(), dd.view(), md.view(), qd.view(), wd.view(), framed);
    std::vector<std::byte> mh(mb);
    std::vector<std::int64_t> wh(3);
    D::to_host(e, md.cview(), std::span<std::byte>(mh));
    D::to_host(e, wd.cview(), std::span<std::int64_t>(wh));
    cp::cuda_space::fence(e, cp::no_deadline());
    EXPECT(mh == msg && wh == words, "%s n=%zu words[0]=%lld: the message or the words differ from the host", name, n,
           static_cast<long long>(w0));
    if (w0 == 0)
      EXPECT(same(download(e, qd.cview()), q) && same(download(e, dd.cview()), diff),
             "%s n=%zu: q or diff differs from the host", name, n);
    if (w0 == 0) sent.push_back(msg);
    x = values(33 + sent.size(), n);
  }
  for (bool bad : {false, true}) {
    std::vector<std::byte> recv;
    for (int k = 0; k < 3; ++k) {
      const auto& m = sent[static_cast<std::size_t>(k)];
      if (k == 1 && bad) recv.insert(recv.end(), mb, std::byte{0xFF});
      else recv.insert(recv.end(), m.begin(), m.end());
    }
    std::vector<float> qn(3 * n, 7.0f);
    std::vector<std::int64_t> words = {0, static_cast<std::int64_t>(n), 0};
    std::string hwhy, dwhy;
    cp::cuda_buffer<std::byte> rd;
    rd.resize(recv.size());
    D::from_host(e, std::span<const std::byte>(recv), rd.view());
    cp::cuda_buffer<float> qd;
    upload(e, qn, qd);
    cp::cuda_buffer<std::int64_t> wd;
    wd.resize(3);
    D::from_host(e, std::span<const std::int64_t>(words), wd.view());
    HK::choco_decode<Q>({}, hk, hc, std::span<const std::byte>(recv), mb, framed, std::span<float>(qn),
                        std::span<std::int64_t>(words), hwhy);
    D::choco_decode<Q>(e, dk, dc, rd.cview(), mb, framed, qd.view(), wd.view(), dwhy);
    std::vector<std::int64_t> wh(3);
    D::to_host(e, wd.cview(), std::span<std::int64_t>(wh));
    const auto qh = download(e, qd.cview());
    EXPECT(wh == words && words[2] == (bad ? 2 : 0), "%s n=%zu bad=%d: words[2] = %lld, the host's %lld", name, n,
           int(bad), static_cast<long long>(wh[2]), static_cast<long long>(words[2]));
    const std::size_t cmp = bad ? n : 3 * n;  // the host stops at the malformed message
    EXPECT(std::memcmp(qh.data(), qn.data(), cmp * sizeof(float)) == 0, "%s n=%zu bad=%d: q_nb differs", name, n,
           int(bad));
    EXPECT(!bad || (!hwhy.empty() && dwhy.find(name) != std::string::npos), "%s: why = '%s'", name, dwhy.c_str());
  }
}

}  // namespace

int main() {
  if (!commpact_test::have_cuda_device()) return commpact_test::exit_skipped;
  for (std::size_t n : {1u, 9u, 383u, 5000u}) {
    check_direct("topk_codec", cp::topk_codec{0.05}, n);
    check_direct("sign_codec", cp::sign_codec{}, n);
    check_direct("qsgd_codec", cp::qsgd_codec{16, 7, 64}, n);
    check_direct("threshold_codec", cp::threshold_codec{0.8f, 0.2}, n);
    check_direct("fp16_codec", cp::fp16_codec{}, n);
  }
  for (int P : {2, 3, 5}) {
    check_choco("CHOCO topk", P, cp::topk_codec{0.05}, true);
    check_choco("CHOCO sign", P, cp::sign_codec{}, true);
    check_choco("CHOCO qsgd", P, cp::qsgd_codec{16, 7, 64}, false);
    check_choco("CHOCO threshold", P, cp::threshold_codec{0.8f, 0.2}, true);
  }
  std::printf("%s: %d failures\n", commpact_test::failures ? "FAILED" : "ok", commpact_test::failures);
  return commpact_test::failures ? 1 : 0;
}
