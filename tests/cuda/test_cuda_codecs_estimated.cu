// SPDX-License-Identifier: Apache-2.0
// device_codec<gaussiank_codec> and device_codec<dgc_codec>
// (compress/device_codecs_estimated.cuh) against the host codecs:
// - encode_frame's frame byte for byte (poisoned blocks; a clean status, status_nonfinite,
//   a rejected input) at n = 1, 2, 17, 1000, 65537, 2^20 + 7 on Gaussian, tied (+-0),
//   all-equal, denormal, +-0, all-negative (Gaussian-k's threshold below 0: every entry
//   passes), mostly-zero (DGC's sampled threshold 0) and Inf/NaN inputs (under
//   status_nonfinite), for several densities, rounds, caps, sample rates, lowerings,
//   seeds, steps and ranks (the sample's random stream), one kernels object reused across
//   inputs; then clear_delivered's residual and velocity bit for bit;
// - decode_sum: the host's sum bit for bit over P = 1, 3, 5 blocks, and each malformed
//   payload (truncated, above the cap, index out of range, negative, unsorted, duplicate,
//   NaN, Inf) setting status_wire and a NaN in sum[0] where the host raises wire_error;
// - CodecCompressor<Codec, Allgather<NcclComm>> over NcclComm::single() against the host
//   compressor over ThreadComm, 4 steps with and without momentum (output, residual,
//   velocity bit for bit; a NaN step raising or skipped alike; a corrupted payload raising
//   wire_error; no reallocation after step one), and over CudaStagedComm<ThreadComm> at
//   P = 2, 3 against ThreadComm's host compressor.
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.

#include <mutex>

#include "commpact/comm/cuda_staged_comm.hpp"
#include "commpact/comm/nccl_comm.hpp"
#include "commpact/comm/thread_comm.hpp"
#include "commpact/compress/codecs/sparsifiers.hpp"

#include "corrupting_nccl.cuh"

using commpact_test::failures;
using namespace codec_test;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

//! make_input's kinds 0-4, then 5: all negative (mean -3, sd 0.01), 6: 99% zeros, 7: a
//! Gaussian with an Inf and a NaN.
std::vector<float> input(int kind, std::size_t n, std::mt19937_64& rng) {
  if (kind < 5) return make_input(kind, n, rng);
  std::normal_distribution<float> d;
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> v(n);
  for (auto& x : v) x = kind == 5 ? -3.0f + 0.01f * d(rng) : (kind == 6 && pick(rng) != 0 ? 0.0f : d(rng));
  if (kind == 7) v[n / 2] = qnan, v[n - 1 - n / 3] = -inf;
  return v;
}

//! Frames of the device's encode_frame (one kernels object for every input) against the
//! host's, then clear_delivered. `prep` sets the codec's step and rank.
template <class Codec, class Prep>
void check_encode(const char* who, Codec proto, Prep prep, std::size_t n, std::mt19937_64& rng) {
  cp::ops<cp::cuda_space>::codec_workspace<Codec> dk;
  Codec hc = proto, dc = proto;
  int round = 0;
  for (int kind = 0; kind < 8; ++kind)
    for (int st : {0, 1, 2}) {             // 0: clean, 1: status_nonfinite, 2: rejected (h.flags)
      if (kind == 7 && st == 0) continue;  // the compressor never encodes a non-finite input
      prep(hc, round), prep(dc, round), ++round;
      const auto v = input(kind, n, rng);
      const std::size_t cap = (48 + hc.max_encoded_bytes(n) + 3) / 4 * 4;
      cp::frame::header h;
      h.n = static_cast<std::int64_t>(n), h.agreement = hc.agreement(n), h.step = round;
      h.capacity = static_cast<std::int64_t>(cap);
      if (st == 2) h.flags = cp::frame::rejected_input;
      const auto f = encode_both(dk, hc, dc, v, h, cap, st == 1 ? std::uint32_t{cp::status_nonfinite} : 0u, 0);
      EXPECT(diff(f.dev, f.host) == 0, "%s encode_frame n=%zu kind=%d st=%d: %zu words differ (host: %zu passed, t=%g)",
             who, n, kind, st, diff(f.dev, f.host), hc.last_passed(), static_cast<double>(hc.last_threshold()));
      if (st != 0) continue;
      EXPECT(clear_delivered_same(dk, hc, dc, n, rng), "%s clear_delivered n=%zu kind=%d: residual or velocity differs",
             who, n, kind);
    }
}

void check_all_encodes(std::mt19937_64& rng) {
  const auto no_prep = [](cp::gaussiank_codec&, int) {};
  const auto dgc_prep = [](cp::dgc_codec& c, int round) { c.begin_step(3 + round), c.bind_rank(round % 3); };
  // n on both sides of the levels of Gaussian-k's moments (kernels/fixed_sum.hpp: 1, 2, 3 levels).
  for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{17}, std::size_t{1000}, std::size_t{2049},
                        std::size_t{65537}, (std::size_t{1} << 20) + 7, (std::size_t{1} << 22) + 7}) {
    const bool big = n > 100000;
    for (double density : {0.001, 0.01, 0.3}) check_encode("gaussiank", cp::gaussiank_codec{density}, no_prep, n, rng);
    check_encode("gaussiank r=1", cp::gaussiank_codec{0.05, 1}, no_prep, n, rng);
    check_encode("gaussiank r=8 cap=1", cp::gaussiank_codec{0.02, 8, 1.0}, no_prep, n, rng);
    if (!big) check_encode("gaussiank d=1 cap=3", cp::gaussiank_codec{1.0, 5, 3.0}, no_prep, n, rng);
    check_encode("dgc", cp::dgc_codec{0.01, 0.01, 7}, dgc_prep, n, rng);
    check_encode("dgc 0.001", cp::dgc_codec{0.001, 0.001, 3}, dgc_prep, n, rng);
    check_encode("dgc lower=0.5", cp::dgc_codec{0.1, 0.05, 11, 0.5, 3}, dgc_prep, n, rng);
    check_encode("dgc iters=0", cp::dgc_codec{0.02, 0.02, 5, 0.8, 0}, dgc_prep, n, rng);
    if (!big) check_encode("dgc m=n", cp::dgc_codec{0.2, 1.0, 9, 0.9, 64}, dgc_prep, n, rng);
  }
}

//! A block for n holding entries (idx, val), room for `room` entries, length 8 c unless `len` is given.
std::vector<float> frame_block(std::size_t n, std::size_t room, const std::vector<std::int32_t>& idx,
                               const std::vector<float>& val, std::uint32_t len = 0xFFFFFFFFu) {
  std::vector<float> b((48 + 8 * room) / 4, 0.0f);
  auto bytes = std::as_writable_bytes(std::span<float>(b));
  cp::frame::header h;
  h.n = static_cast<std::int64_t>(n), h.capacity = static_cast<std::int64_t>(48 + 8 * room);
  h.payload = len != 0xFFFFFFFFu ? len : static_cast<std::uint32_t>(8 * idx.size());
  cp::frame::write(bytes, h);
  std::memcpy(bytes.data() + 48, idx.data(), 4 * idx.size());
  std::memcpy(bytes.data() + 48 + 4 * idx.size(), val.data(), 4 * val.size());
  return b;
}

//! decode_sum over P blocks that the host codec encoded; kinds 1.. corrupt the middle one.
template <class Codec>
void check_decode(const char* who, Codec codec, std::mt19937_64& rng) {
  const std::size_t n = 5000, cap = codec.capacity(n), room = cap + 1;
  for (int kind = 0; kind < 9; ++kind)
    for (int P : {1, 3, 5}) {
      std::vector<float> all;
      const int bad = kind == 0 ? -1 : P / 2;
      for (int r = 0; r < P; ++r) {
        const auto v = input(r % 5, n, rng);
        std::vector<std::byte> msg(codec.max_encoded_bytes(n));
        const std::size_t c = codec.encode(std::span<const float>(v), std::span<std::byte>(msg), {}) / 8;
        std::vector<std::int32_t> idx(c);
        std::vector<float> val(c);
        std::memcpy(idx.data(), msg.data(), 4 * c), std::memcpy(val.data(), msg.data() + 4 * c, 4 * c);
        std::uint32_t len = 0xFFFFFFFFu;
        if (r == bad) {
          if (c < 3 || kind == 2) {  // cap + 1 entries, or enough entries to corrupt
            idx.resize(kind == 2 ? cap + 1 : 3), val.assign(idx.size(), 0.5f);
            for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int32_t>(3 * i);
          }
          switch (kind) {
            case 1: len = static_cast<std::uint32_t>(8 * idx.size() - 4); break;
            case 2: break;
            case 3: idx.back() = static_cast<std::int32_t>(n); break;
            case 4: idx.front() = -1; break;
            case 5: std::swap(idx[0], idx[1]); break;
            case 6: idx[1] = idx[0]; break;
            case 7: val[2] = qnan; break;
            default: val[0] = -inf; break;
          }
        }
        const auto b = frame_block(n, room, idx, val, len);
        all.insert(all.end(), b.begin(), b.end());
      }
      const auto [host_raised, stw, sum, hsum] = decode_both(codec, all, all.size() / static_cast<std::size_t>(P), n);
      EXPECT(host_raised == (kind != 0), "%s kind %d P=%d: the host %s", who, kind, P,
             host_raised ? "raised" : "did not raise");
      EXPECT(((stw & cp::status_wire) != 0) == host_raised, "%s kind %d P=%d: status %u", who, kind, P, stw);
      if (host_raised)
        EXPECT(std::isnan(sum[0]), "%s kind %d P=%d: sum[0] is not NaN", who, kind, P);
      else
        EXPECT(diff(sum, hsum) == 0, "%s P=%d: the sum differs in %zu places", who, P, diff(sum, hsum));
    }
}

std::vector<std::vector<float>> gradients(int steps, std::size_t n, int nan_step, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  return random_steps(steps, n, nan_step, g);
}

//! 4 steps of CodecCompressor<Codec, Allgather<NcclComm>> (one rank) against the host's
//! over ThreadComm; `nan_step` puts a NaN into that step, `corrupt_step` overwrites the
//! received block's first index with -1 before the decode (wire_error, nothing changed).
template <class Codec>
void check_nccl(const char* what, const Codec& codec, const cp::codec_options& opt, std::size_t n, int nan_step,
                int corrupt_step, std::mt19937_64& rng) {
  const int steps = 4;
  const auto grads = gradients(steps, n, nan_step, rng());
  const auto [hout, hres, hvel, hok] = run_host_steps(grads, corrupt_step, [&](cp::ThreadComm& tc) {
    return cp::CodecCompressor<Codec, cp::Allgather<cp::ThreadComm>>{tc, codec, opt, what};
  });
  corrupting_nccl dcomm{cp::NcclComm::single()};
  const auto& e = dcomm.exec();
  cp::CodecCompressor<Codec, cp::Allgather<corrupting_nccl>> dev{dcomm, codec, opt, what};
  cp::cuda_buffer<float> g;
  g.resize(n);
  std::vector<std::pair<const void*, std::size_t>> sig;
  for (int s = 0; s < steps; ++s) {
    D::from_host(e, std::span<const float>(grads[s]), g.view());
    const int ok = device_step(what, s, dev, g, s == corrupt_step);
    EXPECT(ok == hok[s], "%s step %d: outcome %d vs host %d", what, s, ok, hok[s]);
    EXPECT(diff(download(e, g.cview()), hout[s]) == 0, "%s step %d: the reduced gradient differs", what, s);
    EXPECT(diff(download(e, dev.residual()), hres[s]) == 0, "%s step %d: the residual differs", what, s);
    EXPECT(diff(download(e, dev.velocity()), hvel[s]) == 0, "%s step %d: the velocity differs", what, s);
    if (s == 0)
      sig = dev.workspace_signature();
    else
      EXPECT(dev.workspace_signature() == sig, "%s step %d: the device buffers were reallocated", what, s);
  }
}

//! 4 steps over CudaStagedComm<ThreadComm> at P ranks against ThreadComm's host compressor.
template <class Codec>
void check_staged(const char* what, const Codec& codec, const cp::codec_options& opt, int P, std::size_t n) {
  using SC = cp::CudaStagedComm<cp::ThreadComm>;
  cp::run_threads(P, [&](cp::ThreadComm& tc) {
    const int r = tc.rank();
    SC c{tc};
    const auto& e = c.exec();
    cp::CodecCompressor<Codec, cp::Allgather<SC>> dev{c, codec, opt, what};
    cp::CodecCompressor<Codec, cp::Allgather<cp::ThreadComm>> host{tc, codec, opt, what};
    cp::cuda_buffer<float> g;
    g.resize(n);
    for (int s = 0; s < 4; ++s) {
      auto h = gradients(1, n, -1, 1000 * s + r)[0];
      D::from_host(e, std::span<const float>(h), g.view());
      dev.reduce(g.view());
      host.reduce(std::span<float>(h));
      const std::vector<float> hr(host.residual().begin(), host.residual().end());
      const std::vector<float> hv(host.velocity().begin(), host.velocity().end());
      const bool same = diff(download(e, g.cview()), h) == 0 && diff(download(e, dev.residual()), hr) == 0 &&
                        diff(download(e, dev.velocity()), hv) == 0;
      EXPECT_MT(same, "%s P=%d rank %d step %d: output, residual or velocity differs from the host", what, P, r, s);
    }
  });
}

}  // namespace

int main() {
  return commpact_test::run_checks("all device Gaussian-k and DGC checks passed\n", "%d device checks failed\n", [] {
    E = cp::cuda_space::make_exec();
    auto rng = commpact_test::seeded_rng();
    check_all_encodes(rng);
    check_decode("gaussiank", cp::gaussiank_codec{0.05}, rng);
    check_decode("dgc", cp::dgc_codec{0.05, 0.05, 4}, rng);
    const cp::gaussiank_codec gk{0.01};
    const cp::dgc_codec dgc{0.01, 0.01, 17};
    check_nccl("Gaussian-k", gk, {}, 100003, -1, -1, rng);
    check_nccl("Gaussian-k", cp::gaussiank_codec{0.002, 5, 2.0}, {.momentum = 0.9f}, (1 << 20) + 3, -1, -1, rng);
    check_nccl("Gaussian-k", gk, {.on_nonfinite = cp::nonfinite::skip_step}, 50000, 2, -1, rng);
    check_nccl("Gaussian-k", gk, {.momentum = 0.5f}, 30011, 1, 2, rng);  // numeric_error, then a corrupted payload
    check_nccl("DGC", dgc, {}, 100003, -1, -1, rng);
    check_nccl("DGC", cp::dgc_codec{0.001, 0.001, 2}, {.momentum = 0.9f}, (1 << 20) + 3, -1, -1, rng);
    check_nccl("DGC", dgc, {.momentum = 0.9f, .on_nonfinite = cp::nonfinite::skip_step}, 50000, 2, -1, rng);
    check_nccl("DGC", dgc, {}, 30011, 1, 2, rng);
    for (int P : {2, 3}) {
      check_staged("Gaussian-k", gk, {}, P, 20011);
      check_staged("Gaussian-k", gk, {.momentum = 0.9f}, P, 20011);
      check_staged("DGC", dgc, {}, P, 20011);
      check_staged("DGC", dgc, {.momentum = 0.9f}, P, 20011);
    }
  });
}
