// SPDX-License-Identifier: Apache-2.0
// CHOCO-SGD's codec on the CUDA space (gossip/choco_kernels_cuda.cuh): GossipMixer with
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
//   topk, sign and threshold; QSGD's message stays valid), the models alike (NaN for NaN).
//
// NOT YET RUN ON A GPU at the time of writing: without a device it exits 77 (skipped).

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
#include "commpact/gossip/choco_kernels_cuda.cuh"
#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/space/cuda.hpp"
#include "commpact/topology/ring.hpp"

#include "cuda_test_common.cuh"

namespace cp = commpact;
using D = cp::ops<cp::cuda_space>;
using SC = cp::CudaStagedComm<cp::ThreadComm>;

namespace {

std::mutex expect_mutex;  // EXPECT's counter is shared by the rank threads
#define EXPECT_MT(cond, ...)                        \
  do {                                              \
    std::lock_guard<std::mutex> lock(expect_mutex); \
    EXPECT(cond, __VA_ARGS__);                      \
  } while (0)

std::vector<float> download(const cp::cuda_space::exec& e, cp::cuda_span<const float> s) {
  std::vector<float> h(s.size());
  D::to_host(e, s, std::span<float>(h));
  cp::cuda_space::fence(e, cp::no_deadline());
  return h;
}
void upload(const cp::cuda_space::exec& e, const std::vector<float>& h, cp::cuda_buffer<float>& b) {
  b.resize(h.size());
  D::from_host(e, std::span<const float>(h), b.view());
  cp::cuda_space::fence(e, cp::no_deadline());
}
bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}
//! Bit for bit, except that any NaN equals any NaN (the device's NaN payloads may differ).
bool same_or_nan(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::isnan(a[i]) && std::isnan(b[i])) && std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  return true;
}
std::vector<float> values(std::uint64_t seed, std::size_t n, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
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

}  // namespace

int main() {
  if (!commpact_test::have_cuda_device()) return commpact_test::exit_skipped;
  for (int P : {2, 3, 5}) {
    check_choco("CHOCO topk", P, cp::topk_codec{0.05}, true);
    check_choco("CHOCO sign", P, cp::sign_codec{}, true);
    check_choco("CHOCO qsgd", P, cp::qsgd_codec{16, 7, 64}, false);
    check_choco("CHOCO threshold", P, cp::threshold_codec{0.8f, 0.2}, true);
  }
  std::printf("%s: %d failures\n", commpact_test::failures ? "FAILED" : "ok", commpact_test::failures);
  return commpact_test::failures ? 1 : 0;
}
