// SPDX-License-Identifier: Apache-2.0
// codec_kernels<Codec, cuda_space> (compress/codec_kernels_cuda.cuh) against the host
// codecs, for topk_codec, sign_codec, fp16/bf16 and TernGrad: the leaf kernels directly (encode_frame's frame
// byte for byte on Gaussian, tied, all-equal, +-0 and denormal inputs, with the status
// flagging a NaN and a rejected input; decode_sum's sum bit for bit over several blocks,
// and every kind of malformed payload setting status_wire where the host raises
// wire_error; clear_delivered), and TopK and CodecCompressor<sign, fp16, bf16, TernGrad>
// over a one-rank NcclComm on device spans against the same compressor over a one-rank
// ThreadComm on the host for 4 steps with error feedback (output, residual and velocity
// bit for bit; a NaN gradient reported alike; a payload corrupted on the device before
// the decode raising wire_error with grad and state untouched; no allocation after step
// one).
//
// NOT YET RUN ON A GPU at the time of writing: without a device it exits 77 (skipped).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <tuple>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "commpact/comm/nccl_comm.hpp"
#include "commpact/comm/thread_comm.hpp"
#include "commpact/compress/codec_kernels_cuda.cuh"
#include "commpact/compress/codecs/casts.hpp"
#include "commpact/compress/compressors/topk.hpp"
#include "commpact/kernels/cuda/ops.cuh"

#include "cuda_test_common.cuh"

using commpact_test::failures;
namespace cp = commpact;
using D = cp::ops<cp::cuda_space>;
using DK = cp::codec_kernels<cp::topk_codec, cp::cuda_space>;
using HK = cp::codec_kernels<cp::topk_codec, cp::host_space>;

namespace {

cp::cuda_space::exec E;

template <class T>
void upload(cp::cuda_buffer<T>& b, const std::vector<T>& h) {
  b.resize(h.size());
  D::from_host(E, std::span<const T>(h), b.view());
}
template <class T>
std::vector<T> download(const cp::cuda_space::exec& e, cp::cuda_span<const T> s) {
  std::vector<T> h(s.size());
  D::to_host(e, s, std::span<T>(h));
  cp::cuda_space::fence(e, cp::no_deadline());
  return h;
}
template <class T>
std::size_t diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size()) + 1;
  std::size_t d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return d;
}

//! Inputs of every kind the kernels must order like the host.
std::vector<float> make_input(int kind, std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d;
  std::uniform_int_distribution<int> pick(0, 7);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (kind) {
      case 0: v[i] = d(rng); break;                                          // Gaussian
      case 1: v[i] = static_cast<float>(pick(rng) - 4) * 0.5f; break;        // many ties, +-0
      case 2: v[i] = 1.25f; break;                                           // all equal
      case 3: v[i] = (pick(rng) & 1 ? -1.0f : 1.0f) * 1e-40f * static_cast<float>(pick(rng)); break;  // denormals, +-0
      default: v[i] = pick(rng) == 0 ? -0.0f : (pick(rng) == 1 ? 0.0f : d(rng)); break;  // +-0 among Gaussians
    }
  }
  return v;
}

//! encode_frame on the device against the host, frame byte for byte (k from 1 to n; a
//! status with status_nonfinite; a rejected input), then clear_delivered.
void check_encode(std::mt19937_64& rng) {
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}})
    for (int kind = 0; kind < 5; ++kind)
      for (double density : {1e-3, 0.05, 0.5, 1.0})
        for (int st : {0, 1, 2}) {  // 0: clean, 1: status_nonfinite, 2: rejected (h.flags)
          const auto v = make_input(kind, n, rng);
          cp::topk_codec hc{density}, dc{density};
          const std::size_t k = hc.k(n), cap = (48 + hc.max_encoded_bytes(n) + 3) / 4 * 4;
          cp::frame::header h;
          h.n = static_cast<std::int64_t>(n), h.agreement = static_cast<std::int64_t>(k), h.step = 3;
          h.capacity = static_cast<std::int64_t>(cap);
          if (st == 2) h.flags = cp::frame::rejected_input;
          std::vector<float> hb(cap / 4, std::numeric_limits<float>::quiet_NaN());
          std::vector<std::uint32_t> hs{st == 1 ? std::uint32_t{cp::status_nonfinite} : 0u};
          HK::encode_frame({}, hc, std::span<const float>(v), std::span<float>(hb), h, {},
                           std::span<const std::uint32_t>(hs));
          cp::cuda_buffer<float> dv, db;
          cp::cuda_buffer<std::uint32_t> ds;
          upload(dv, v), upload(ds, hs);
          db.resize(cap / 4);  // poisoned (0xFF)
          DK dk;
          dk.encode_frame(E, dc, dv.cview(), db.view(), h, {}, ds.cview());
          EXPECT(diff(download(E, db.cview()), hb) == 0, "encode_frame n=%zu kind=%d density=%g st=%d: %zu words differ",
                 n, kind, density, st, diff(download(E, db.cview()), hb));
          if (st != 0) continue;
          std::normal_distribution<float> d;
          std::vector<float> r(n), u(n);
          for (auto& x : r) x = d(rng);
          for (auto& x : u) x = d(rng);
          cp::cuda_buffer<float> dr, du;
          upload(dr, r), upload(du, u);
          HK::clear_delivered({}, hc, std::span<float>(r), std::span<float>(u));
          dk.clear_delivered(E, dc, dr.view(), du.view());
          EXPECT(diff(download(E, dr.cview()), r) == 0 && diff(download(E, du.cview()), u) == 0,
                 "clear_delivered n=%zu kind=%d density=%g: residual or velocity differs", n, kind, density);
        }
}

//! A block of the frame format for n, k holding entries (idx, val) as the host writes them.
std::vector<float> frame_block(std::size_t n, std::size_t k, const std::vector<std::int32_t>& idx,
                               const std::vector<float>& val, std::uint32_t len_override = 0xFFFFFFFFu) {
  const std::size_t cap = 48 + 8 * k;
  std::vector<float> b(cap / 4, 0.0f);
  auto bytes = std::as_writable_bytes(std::span<float>(b));
  cp::frame::header h;
  h.n = static_cast<std::int64_t>(n), h.agreement = static_cast<std::int64_t>(k);
  h.capacity = static_cast<std::int64_t>(cap);
  h.payload = len_override != 0xFFFFFFFFu ? len_override : static_cast<std::uint32_t>(8 * idx.size());
  cp::frame::write(bytes, h);
  const std::size_t c = idx.size();
  std::memcpy(bytes.data() + 48, idx.data(), 4 * c);
  std::memcpy(bytes.data() + 48 + 4 * c, val.data(), 4 * c);
  return b;
}

//! decode_sum over P blocks: valid ones give the host's sum bit for bit; each malformed
//! kind sets status_wire and a NaN in sum[0] where the host raises wire_error.
void check_decode(std::mt19937_64& rng) {
  const std::size_t n = 5000, k = 64;
  cp::topk_codec codec{static_cast<double>(k) / n};
  EXPECT(codec.k(n) == k, "k(n) = %zu, expected %zu", codec.k(n), k);
  std::normal_distribution<float> d;
  auto random_block = [&](std::size_t c) {
    std::vector<std::int32_t> idx(n);
    for (std::size_t i = 0; i < n; ++i) idx[i] = static_cast<std::int32_t>(i);
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(c);
    std::sort(idx.begin(), idx.end());
    std::vector<float> val(c);
    for (auto& x : val) x = d(rng);
    if (c > 2) val[1] = -0.0f, val[2] = 1e-41f;
    return std::make_pair(idx, val);
  };
  // kind 0: valid; then a truncated entry, too many entries, an index out of range, a
  // negative index, unsorted, duplicate, NaN value, Inf value.
  for (int kind = 0; kind < 9; ++kind)
    for (int P : {1, 3, 5}) {
      std::vector<float> all;
      const int bad = kind == 0 ? -1 : P / 2;
      for (int r = 0; r < P; ++r) {
        auto [idx, val] = random_block(r == 1 ? 0 : k - static_cast<std::size_t>(r));
        std::uint32_t len = 0xFFFFFFFFu;
        if (r == bad) {
          if (idx.size() < 3) std::tie(idx, val) = random_block(k - 1);
          switch (kind) {
            case 1: len = static_cast<std::uint32_t>(8 * idx.size() - 4); break;
            case 2: std::tie(idx, val) = random_block(k + 1); break;
            case 3: idx.back() = static_cast<std::int32_t>(n); break;
            case 4: idx.front() = -1; break;
            case 5: std::swap(idx[0], idx[1]); break;
            case 6: idx[1] = idx[0]; break;
            case 7: val[2] = std::numeric_limits<float>::quiet_NaN(); break;
            default: val[0] = -std::numeric_limits<float>::infinity(); break;
          }
        }
        auto b = frame_block(n, kind == 2 ? k + 1 : k, idx, val, len);
        b.resize((48 + 8 * (k + 1)) / 4, 0.0f);  // every block the same capacity
        all.insert(all.end(), b.begin(), b.end());
      }
      const std::size_t bf = all.size() / static_cast<std::size_t>(P);
      std::vector<float> hsum(n);
      bool host_raised = false;
      try {
        HK::decode_sum({}, codec, std::span<const float>(all), bf, std::span<float>(hsum));
      } catch (const cp::wire_error&) {
        host_raised = true;
      }
      cp::cuda_buffer<float> dall, dsum;
      cp::cuda_buffer<std::uint32_t> ds;
      upload(dall, all), upload(ds, std::vector<std::uint32_t>{0});
      dsum.resize(n);
      DK::decode_sum(E, codec, dall.cview(), bf, dsum.view(), ds.view());
      const auto st = download(E, ds.cview())[0];
      const auto sum = download(E, dsum.cview());
      EXPECT(host_raised == (kind != 0), "kind %d P=%d: the host %s", kind, P, host_raised ? "raised" : "did not raise");
      EXPECT(((st & cp::status_wire) != 0) == host_raised, "kind %d P=%d: status %u, host raised %d", kind, P, st,
             int(host_raised));
      if (host_raised) EXPECT(std::isnan(sum[0]), "kind %d P=%d: sum[0] = %g is not NaN after a wire error", kind, P, sum[0]);
      else EXPECT(diff(sum, hsum) == 0, "kind %d P=%d: the sum differs in %zu places", kind, P, diff(sum, hsum));
    }
}

//! sign_codec's leaves: encode_frame (frame and approx byte for byte; n around the
//! 4096-value chunks of the scale's sum; every input kind; a status with
//! status_nonfinite; a rejected input) and decode_sum (valid blocks: the host's sum bit
//! for bit; a wrong length, a NaN, Inf or negative scale, sign bits past n: status_wire
//! where the host raises wire_error).
void check_sign_leaves(std::mt19937_64& rng) {
  using SD = cp::codec_kernels<cp::sign_codec, cp::cuda_space>;
  using SH = cp::codec_kernels<cp::sign_codec, cp::host_space>;
  cp::sign_codec codec;
  for (std::size_t n : {1, 7, 8, 9, 4095, 4096, 4097, 3 * 4096 + 17, 100003, (1 << 20) + 3})
    for (int kind = 0; kind < 5; ++kind)
      for (int st = 0; st < 3; ++st) {
        const auto v = make_input(kind, n, rng);
        const std::size_t cap = (48 + codec.max_encoded_bytes(n) + 3) / 4 * 4;
        cp::frame::header h;
        h.n = static_cast<std::int64_t>(n), h.step = 1, h.capacity = static_cast<std::int64_t>(cap);
        if (st == 2) h.flags = cp::frame::rejected_input;
        std::vector<float> hb(cap / 4, std::numeric_limits<float>::quiet_NaN()), ha(n, -7.0f);
        std::vector<std::uint32_t> hs{st == 1 ? std::uint32_t{cp::status_nonfinite} : 0u};
        SH::encode_frame({}, codec, std::span<const float>(v), std::span<float>(hb), h, std::span<float>(ha),
                         std::span<const std::uint32_t>(hs));
        cp::cuda_buffer<float> dv, db, da;
        cp::cuda_buffer<std::uint32_t> ds;
        upload(dv, v), upload(ds, hs), upload(da, std::vector<float>(n, -7.0f));
        db.resize(cap / 4);
        SD::encode_frame(E, codec, dv.cview(), db.view(), h, da.view(), ds.cview());
        EXPECT(diff(download(E, db.cview()), hb) == 0, "sign encode_frame n=%zu kind=%d st=%d: %zu words differ", n,
               kind, st, diff(download(E, db.cview()), hb));
        if (st == 0)
          EXPECT(diff(download(E, da.cview()), ha) == 0, "sign encode_frame n=%zu kind=%d: approx differs in %zu", n,
                 kind, diff(download(E, da.cview()), ha));
      }
  // decode_sum: P blocks from random inputs; kind 0 valid, then one malformed block.
  for (std::size_t n : {5, 8, 1000, 4099})
    for (int kind = 0; kind < 6; ++kind)
      for (int P : {1, 2, 5}) {
        const std::size_t cap = (48 + codec.max_encoded_bytes(n) + 3) / 4 * 4, bf = cap / 4;
        std::vector<float> all(bf * static_cast<std::size_t>(P));
        for (int r = 0; r < P; ++r) {
          const auto v = make_input(r % 5, n, rng);
          cp::frame::header h;
          h.n = static_cast<std::int64_t>(n), h.capacity = static_cast<std::int64_t>(cap);
          std::vector<std::uint32_t> hs{0};
          SH::encode_frame({}, codec, std::span<const float>(v), std::span<float>(all).subspan(r * bf, bf), h, {},
                           std::span<const std::uint32_t>(hs));
        }
        if (kind == 5 && n % 8 == 0) continue;
        if (kind != 0) {
          auto* w = reinterpret_cast<std::uint32_t*>(all.data()) + static_cast<std::size_t>(P / 2) * bf;
          auto* bytes = reinterpret_cast<unsigned char*>(w + 12);
          switch (kind) {
            case 1: w[2] -= 1; break;                                              // length
            case 2: w[12] = 0x7FC00000u; break;                                    // NaN scale
            case 3: w[12] = 0x7F800000u; break;                                    // Inf scale
            case 4: w[12] = 0xBF800000u; break;                                    // -1
            default: bytes[4 + n / 8] |= static_cast<unsigned char>(1u << 7); break;  // a bit past n
          }
        }
        std::vector<float> hsum(n);
        bool host_raised = false;
        try {
          SH::decode_sum({}, codec, std::span<const float>(all), bf, std::span<float>(hsum));
        } catch (const cp::wire_error&) {
          host_raised = true;
        }
        cp::cuda_buffer<float> dall, dsum;
        cp::cuda_buffer<std::uint32_t> ds;
        upload(dall, all), upload(ds, std::vector<std::uint32_t>{0});
        dsum.resize(n);
        SD::decode_sum(E, codec, dall.cview(), bf, dsum.view(), ds.view());
        const auto stw = download(E, ds.cview())[0];
        const auto sum = download(E, dsum.cview());
        EXPECT(host_raised == (kind != 0), "sign kind %d n=%zu P=%d: the host %s", kind, n, P,
               host_raised ? "raised" : "did not raise");
        EXPECT(((stw & cp::status_wire) != 0) == host_raised, "sign kind %d n=%zu P=%d: status %u", kind, n, P, stw);
        if (host_raised) EXPECT(std::isnan(sum[0]), "sign kind %d n=%zu P=%d: sum[0] is not NaN", kind, n, P);
        else EXPECT(diff(sum, hsum) == 0, "sign n=%zu P=%d: the sum differs in %zu places", n, P, diff(sum, hsum));
      }
}

//! The leaves of a dense codec (fp16, bf16, TernGrad): encode_frame (frame and approx byte
//! for byte, inputs of every kind plus saturating, rounding-tie, Inf and NaN values) and
//! decode_sum (the host's sum bit for bit; kinds 1.. of `corrupt(kind, block words, n)`,
//! which returns false where a kind does not apply: status_wire where the host raises
//! wire_error).
template <class Codec, class Corrupt>
void check_dense_leaves(const char* who, Codec codec, int kinds, Corrupt corrupt, std::mt19937_64& rng) {
  using CD = cp::codec_kernels<Codec, cp::cuda_space>;
  using CH = cp::codec_kernels<Codec, cp::host_space>;
  for (std::size_t n : {1, 2, 3, 1000, 100003})
    for (int kind = 0; kind < 6; ++kind) {
      auto v = make_input(kind % 5, n, rng);
      if (kind == 5) {
        const float edge[] = {65504.f, 65519.f, 65520.f, -1e6f, 0x1.0p-24f, 0x1.0p-25f, 0x1.8p-25f, 0x1.0p-14f,
                              1.0f + 0x1.0p-11f, 1.0f + 0x1.8p-11f, 3.0e38f, -3.4028235e38f, 0x1.0p-130f,
                              1.0f + 0x1.0p-8f, 1.0f + 0x1.8p-8f, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::quiet_NaN(), -0.0f};
        for (std::size_t i = 0; i < n; ++i) v[i] = edge[i % (sizeof(edge) / sizeof(float))];
      }
      const std::size_t cap = (48 + codec.max_encoded_bytes(n) + 3) / 4 * 4;
      cp::frame::header h;
      h.n = static_cast<std::int64_t>(n), h.capacity = static_cast<std::int64_t>(cap);
      std::vector<float> hb(cap / 4, std::numeric_limits<float>::quiet_NaN()), ha(n, -7.0f);
      std::vector<std::uint32_t> hs{0};
      CH::encode_frame({}, codec, std::span<const float>(v), std::span<float>(hb), h, std::span<float>(ha),
                       std::span<const std::uint32_t>(hs));
      cp::cuda_buffer<float> dv, db, da;
      cp::cuda_buffer<std::uint32_t> ds;
      upload(dv, v), upload(ds, hs), upload(da, std::vector<float>(n, -7.0f));
      db.resize(cap / 4);
      CD::encode_frame(E, codec, dv.cview(), db.view(), h, da.view(), ds.cview());
      EXPECT(diff(download(E, db.cview()), hb) == 0, "%s encode_frame n=%zu kind=%d: %zu words differ", who, n,
             kind, diff(download(E, db.cview()), hb));
      EXPECT(diff(download(E, da.cview()), ha) == 0, "%s encode_frame n=%zu kind=%d: approx differs", who, n, kind);
    }
  for (std::size_t n : {1, 3, 4, 1000, 1001})
    for (int kind = 0; kind < kinds; ++kind)
      for (int P : {1, 3}) {
        const std::size_t cap = (48 + codec.max_encoded_bytes(n) + 3) / 4 * 4, bf = cap / 4;
        std::vector<float> all(bf * static_cast<std::size_t>(P));
        for (int r = 0; r < P; ++r) {
          const auto v = make_input(r % 5, n, rng);
          cp::frame::header h;
          h.n = static_cast<std::int64_t>(n), h.capacity = static_cast<std::int64_t>(cap);
          std::vector<std::uint32_t> hs{0};
          CH::encode_frame({}, codec, std::span<const float>(v), std::span<float>(all).subspan(r * bf, bf), h, {},
                           std::span<const std::uint32_t>(hs));
        }
        auto* w = reinterpret_cast<std::uint32_t*>(all.data()) + static_cast<std::size_t>(P - 1) * bf;
        if (kind != 0 && !corrupt(kind, w, n)) continue;
        std::vector<float> hsum(n);
        bool host_raised = false;
        try {
          CH::decode_sum({}, codec, std::span<const float>(all), bf, std::span<float>(hsum));
        } catch (const cp::wire_error&) {
          host_raised = true;
        }
        cp::cuda_buffer<float> dall, dsum;
        cp::cuda_buffer<std::uint32_t> ds;
        upload(dall, all), upload(ds, std::vector<std::uint32_t>{0});
        dsum.resize(n);
        CD::decode_sum(E, codec, dall.cview(), bf, dsum.view(), ds.view());
        const auto stw = download(E, ds.cview())[0];
        const auto sum = download(E, dsum.cview());
        EXPECT(host_raised == (kind != 0), "%s kind %d n=%zu P=%d: the host %s", who, kind, n, P,
               host_raised ? "raised" : "did not raise");
        EXPECT(((stw & cp::status_wire) != 0) == host_raised, "%s kind %d n=%zu P=%d: status %u", who, kind, n,
               P, stw);
        if (host_raised) EXPECT(std::isnan(sum[0]), "%s kind %d: sum[0] is not NaN", who, kind);
        else EXPECT(diff(sum, hsum) == 0, "%s n=%zu P=%d: the sum differs in %zu places", who, n, P,
                    diff(sum, hsum));
      }
}

//! `steps` steps of a compressor on the device (`dev`, over a one-rank NcclComm) and of
//! its host twin (make_host(ThreadComm&), one rank) with the same gradients; `nan_step`
//! >= 0 puts a NaN into that step's gradient; `corrupt_step` >= 0 corrupts the first
//! payload word of the device's received block before decoding (top-k: index -1; sign: a
//! NaN scale), which must raise wire_error and change nothing (the host skips that step).
template <class Dev, class MakeHost>
void compare_steps(const char* what, Dev& dev, const cp::cuda_space::exec& e, MakeHost make_host, std::size_t n,
                   int steps, int nan_step, int corrupt_step, bool skip_nonfinite, std::mt19937_64& rng) {
  std::normal_distribution<float> d;
  std::vector<std::vector<float>> grads(steps, std::vector<float>(n));
  for (auto& g : grads)
    for (auto& v : g) v = d(rng);
  if (nan_step >= 0) grads[nan_step][n / 3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> hout(steps), hres(steps), hvel(steps);
  std::vector<int> hok(steps);  // 1 delivered, 0 skipped, -1 numeric_error, -2 corrupted (device only)
  cp::run_threads(1, [&](cp::ThreadComm& tc) {
    auto h = make_host(tc);
    for (int s = 0; s < steps; ++s) {
      hout[s] = grads[s];
      if (s == corrupt_step) {
        hok[s] = -2;
      } else {
        try {
          hok[s] = h.reduce(std::span<float>(hout[s])) ? 1 : 0;
        } catch (const cp::numeric_error&) {
          hok[s] = -1;
        }
      }
      hres[s].assign(h.residual().begin(), h.residual().end());
      hvel[s].assign(h.velocity().begin(), h.velocity().end());
    }
  });
  cp::cuda_buffer<float> g;
  g.resize(n);
  std::vector<std::pair<const void*, std::size_t>> sig;
  std::int64_t expect_steps = 0;
  for (int s = 0; s < steps; ++s) {
    D::from_host(e, std::span<const float>(grads[s]), g.view());
    int ok = 0;
    if (s == corrupt_step) {
      dev.start(g.view());
      auto* blk = const_cast<float*>(cp::cuda_access::ptr(dev.aggregation().received()));
      cudaMemsetAsync(blk + 12, 0xFF, 4, e.stream());
      bool raised = false;
      try {
        dev.finish();
      } catch (const cp::wire_error&) {
        raised = true;
      }
      EXPECT(raised, "%s step %d: a corrupted payload did not raise wire_error", what, s);
      ok = -2;
    } else {
      try {
        ok = dev.reduce(g.view()) ? 1 : 0;
      } catch (const cp::numeric_error&) {
        ok = -1;
      }
    }
    expect_steps += ok == 1 || (ok == 0 && skip_nonfinite);
    EXPECT(ok == hok[s], "%s step %d: outcome %d vs host %d", what, s, ok, hok[s]);
    const auto out = download(e, g.cview());
    const auto res = download(e, dev.residual());
    const auto vel = download(e, dev.velocity());
    EXPECT(diff(out, hout[s]) == 0, "%s step %d: the reduced gradient differs from the host in %zu places", what, s,
           diff(out, hout[s]));
    EXPECT(diff(res, hres[s]) == 0, "%s step %d: the residual differs from the host in %zu places", what, s,
           diff(res, hres[s]));
    EXPECT(diff(vel, hvel[s]) == 0, "%s step %d: the velocity differs from the host", what, s);
    EXPECT(dev.steps() == expect_steps, "%s step %d: the device counts %lld steps, expected %lld", what, s,
           static_cast<long long>(dev.steps()), static_cast<long long>(expect_steps));
    if (s == 0) sig = dev.workspace_signature();
    else EXPECT(dev.workspace_signature() == sig, "%s step %d: the device buffers were reallocated", what, s);
  }
}

void check_topk(const cp::sparse_options& opt, std::size_t n, int nan_step, int corrupt_step, std::mt19937_64& rng) {
  auto dc = cp::NcclComm::single();
  cp::TopK<cp::NcclComm> dev{dc, opt};
  compare_steps("TopK", dev, dc.exec(), [&](cp::ThreadComm& tc) { return cp::TopK<cp::ThreadComm>{tc, opt}; }, n, 4,
                nan_step, corrupt_step, opt.on_nonfinite == cp::nonfinite::skip_step, rng);
}

template <class Codec>
void check_dense_codec(const char* what, const cp::codec_options& opt, std::size_t n, int nan_step, int corrupt_step,
                       std::mt19937_64& rng) {
  using DevC = cp::CodecCompressor<Codec, cp::Allgather<cp::NcclComm>>;
  using HostC = cp::CodecCompressor<Codec, cp::Allgather<cp::ThreadComm>>;
  auto dc = cp::NcclComm::single();
  DevC dev{dc, Codec{}, opt, what};
  compare_steps(what, dev, dc.exec(), [&](cp::ThreadComm& tc) { return HostC{tc, Codec{}, opt, what}; }, n, 4,
                nan_step, corrupt_step, opt.on_nonfinite == cp::nonfinite::skip_step, rng);
}

void check_sign(const cp::codec_options& opt, std::size_t n, int nan_step, int corrupt_step, std::mt19937_64& rng) {
  using DevC = cp::CodecCompressor<cp::sign_codec, cp::Allgather<cp::NcclComm>>;
  using HostC = cp::CodecCompressor<cp::sign_codec, cp::Allgather<cp::ThreadComm>>;
  auto dc = cp::NcclComm::single();
  DevC dev{dc, {}, opt, "EF-SignSGD"};
  compare_steps("EF-SignSGD", dev, dc.exec(), [&](cp::ThreadComm& tc) { return HostC{tc, {}, opt, "EF-SignSGD"}; }, n,
                4, nan_step, corrupt_step, opt.on_nonfinite == cp::nonfinite::skip_step, rng);
}

}  // namespace

int main() {
  if (!commpact_test::have_cuda_device()) return commpact_test::exit_skipped;
  try {
    E = cp::cuda_space::make_exec();
    std::mt19937_64 rng(std::random_device{}());
    const auto seed = rng();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
    rng.seed(seed);
    check_encode(rng);
    check_decode(rng);
    check_sign_leaves(rng);
    check_topk({.density = 0.01}, 100003, -1, -1, rng);
    check_topk({.density = 0.001, .momentum = 0.9f}, 1 << 20, -1, -1, rng);
    check_topk({.density = 0.05, .momentum = 0.9f, .on_nonfinite = cp::nonfinite::skip_step}, 50000, 2, -1, rng);
    check_topk({.density = 0.05}, 50000, 1, -1, rng);  // nonfinite::raise: numeric_error, state kept
    check_topk({.density = 0.02, .momentum = 0.5f}, 30011, -1, 2, rng);
    check_sign({}, 100003, -1, -1, rng);
    check_sign({.momentum = 0.9f}, (1 << 20) + 5, -1, -1, rng);
    check_sign({.on_nonfinite = cp::nonfinite::skip_step}, 50001, 1, -1, rng);
    check_sign({}, 4096 * 3 + 1, 2, -1, rng);
    check_sign({.momentum = 0.5f}, 30011, -1, 2, rng);
    // kind 1: a length 2 bytes short; 2: the last value's code Inf/NaN
    const auto cast_corrupt = [](int kind, std::uint32_t* w, std::size_t n) {
      if (kind == 1) w[2] -= 2;
      else reinterpret_cast<std::uint16_t*>(w + 12)[n - 1] = 0xFFFF;
      return true;
    };
    check_dense_leaves("fp16", cp::fp16_codec{}, 3, cast_corrupt, rng);
    check_dense_leaves("bf16", cp::bf16_codec{}, 3, cast_corrupt, rng);
    // kind 1: length; 2: NaN scale; 3: -1 scale; 4: field 3; 5: a padding bit
    const auto tern_corrupt = [](int kind, std::uint32_t* w, std::size_t n) {
      auto* fields = reinterpret_cast<unsigned char*>(w + 13);
      switch (kind) {
        case 1: w[2] -= 1; return true;
        case 2: w[12] = 0x7FC00000u; return true;
        case 3: w[12] = 0xBF800000u; return true;
        case 4: fields[(n - 1) / 4] |= static_cast<unsigned char>(3u << (2 * ((n - 1) % 4))); return true;
        default:
          if (n % 4 == 0) return false;
          fields[n / 4] |= 0x80u;
          return true;
      }
    };
    cp::terngrad_codec tern{42};
    tern.begin_step(3), tern.bind_rank(0);
    check_dense_leaves("TernGrad", tern, 6, tern_corrupt, rng);
    check_dense_codec<cp::fp16_codec>("fp16", {}, 100003, -1, -1, rng);
    check_dense_codec<cp::bf16_codec>("bf16", {.momentum = 0.9f}, 65537, -1, 1, rng);
    check_dense_codec<cp::fp16_codec>("fp16", {.on_nonfinite = cp::nonfinite::skip_step}, 5001, 2, -1, rng);
    check_dense_codec<cp::terngrad_codec>("TernGrad", {}, 100003, -1, -1, rng);
    check_dense_codec<cp::terngrad_codec>("TernGrad", {.momentum = 0.9f}, 4099, -1, 2, rng);
    check_dense_codec<cp::terngrad_codec>("TernGrad", {.on_nonfinite = cp::nonfinite::skip_step}, 777, 1, -1, rng);
  } catch (const std::exception& ex) {
    std::printf("FAILED with exception: %s\n", ex.what());
    return 1;
  }
  std::printf(failures == 0 ? "all device codec checks passed\n" : "%d device codec checks failed\n", failures);
  return failures == 0 ? 0 : 1;
}
