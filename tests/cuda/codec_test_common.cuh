// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the codec tests (tests/cuda/test_cuda_codec*.cu): the executor, copies to and
// from the device, a bitwise comparison, the input kinds every codec kernel must treat like
// the host (Gaussian, ties with +-0, all equal, denormals, +-0), encode_frame,
// clear_delivered and decode_sum run on both sides, and a compressor's steps on the host
// twin (a device step, with a payload corrupted on the wire: corrupting_nccl.cuh).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include "commpact/comm/thread_comm.hpp"
#include "commpact/compress/device_codecs.cuh"
#include "commpact/compress/codecs/casts.hpp"
#include "commpact/compress/codecs/quantizers.hpp"
#include "commpact/compress/compressors/topk.hpp"
#include "commpact/kernels/cuda/ops.cuh"

#include "cuda_test_common.cuh"

namespace codec_test {

namespace cp = commpact;
using D = cp::ops<cp::cuda_space>;

inline cp::cuda_space::exec E;

template <class T>
inline void upload(cp::cuda_buffer<T>& b, const std::vector<T>& h) {
  b.resize(h.size());
  D::from_host(E, std::span<const T>(h), b.view());
}
using commpact_test::diff;
using commpact_test::download;

//! Inputs of every kind the kernels must order like the host.
inline std::vector<float> make_input(int kind, std::size_t n, std::mt19937_64& rng) {
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

//! encode_frame's outputs on the host and on the device.
struct frames {
  std::vector<float> host, dev;                // the blocks
  std::vector<float> host_approx, dev_approx;  // approx (empty when approx_n is 0)
  // The device block the kernels encoded into. A sparse codec's clear_delivered reads its
  // indices there (compress/device_codecs*.cuh: the block of the last encode_frame, untouched
  // until then), so the block lives as long as the frames, not just for encode_both.
  cp::cuda_buffer<float> dev_block;
};

//! encode_frame of v with header h and status word `status` by the host (hc) and by the device (dk, dc; dk: ops<cuda_space>::codec_workspace<Codec>): the host's
//! block starts as NaNs, the device's poisoned (0xFF); approx, of approx_n values (0: none), starts as -7 on both.
template <class Codec, class DK>
frames encode_both(DK& dk, Codec& hc, Codec& dc, const std::vector<float>& v, const cp::frame::header& h,
                   std::size_t cap, std::uint32_t status, std::size_t approx_n) {
  using SH = cp::ops<cp::host_space>;
  typename SH::template codec_workspace<Codec> hws;
  frames f;
  f.host.assign(cap / 4, std::numeric_limits<float>::quiet_NaN());
  f.host_approx.assign(approx_n, -7.0f);
  std::vector<std::uint32_t> hs{status};
  SH::codec_encode_frame<Codec>({}, hws, hc, std::span<const float>(v), std::span<float>(f.host), h,
                                approx_n ? std::span<float>(f.host_approx) : std::span<float>{},
                                std::span<const std::uint32_t>(hs));
  cp::cuda_buffer<float> dv, da;
  cp::cuda_buffer<float>& db = f.dev_block;  // kept: clear_delivered_same reads its indices
  cp::cuda_buffer<std::uint32_t> ds;
  upload(dv, v), upload(ds, hs), upload(da, std::vector<float>(approx_n, -7.0f));
  db.resize(cap / 4);  // poisoned (0xFF)
  cp::ops<cp::cuda_space>::codec_encode_frame<Codec>(E, dk, dc, dv.cview(), db.view(), h,
                                                     approx_n ? da.view() : cp::cuda_span<float>{}, ds.cview());
  f.dev = download(E, db.cview());
  if (approx_n) f.dev_approx = download(E, da.cview());
  return f;
}

//! clear_delivered on a random residual and velocity (N(0, 1) from rng) by the host (hc) and by the device (dk, dc; dk: ops<cuda_space>::codec_workspace<Codec>):
//! true when both sides leave the same bits. The frames of the encode_both before it must still live (the device's
//! indices are in its dev_block).
template <class Codec, class DK>
bool clear_delivered_same(DK& dk, Codec& hc, Codec& dc, std::size_t n, std::mt19937_64& rng) {
  using SH = cp::ops<cp::host_space>;
  const typename SH::template codec_workspace<Codec> hws;
  std::normal_distribution<float> d;
  std::vector<float> r(n), u(n);
  for (auto& x : r) x = d(rng);
  for (auto& x : u) x = d(rng);
  cp::cuda_buffer<float> dr, du;
  upload(dr, r), upload(du, u);
  SH::codec_clear_delivered<Codec>({}, hws, hc, std::span<float>(r), std::span<float>(u));
  cp::ops<cp::cuda_space>::codec_clear_delivered<Codec>(E, dk, dc, dr.view(), du.view());
  return diff(download(E, dr.cview()), r) == 0 && diff(download(E, du.cview()), u) == 0;
}

//! host_frames' prep for a codec that needs none.
inline constexpr auto no_prep = [](auto&, int) {};

//! P frames of cap bytes, rank r's the host's encoding of input(r) by codec after prep(codec, r).
template <class Codec, class Input, class Prep>
std::vector<float> host_frames(Codec& codec, std::size_t n, int P, std::size_t cap, Input input, Prep prep) {
  using SH = cp::ops<cp::host_space>;
  typename SH::template codec_workspace<Codec> hws;
  const std::size_t bf = cap / 4;
  std::vector<float> all(bf * static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    const auto v = input(r);
    prep(codec, r);
    cp::frame::header h;
    h.n = static_cast<std::int64_t>(n), h.capacity = static_cast<std::int64_t>(cap);
    std::vector<std::uint32_t> hs{0};
    SH::codec_encode_frame<Codec>({}, hws, codec, std::span<const float>(v), std::span<float>(all).subspan(r * bf, bf),
                                  h, {}, std::span<const std::uint32_t>(hs));
  }
  return all;
}

//! decode_sum's outcome on the host and on the device.
struct decoded {
  bool host_raised = false;  // the host raised wire_error
  std::uint32_t status = 0;  // the device's status word
  std::vector<float> sum, host_sum;
};

//! decode_sum of the blocks `all` (bf floats each) into n values, by the host and by the device.
template <class Codec>
decoded decode_both(const Codec& codec, const std::vector<float>& all, std::size_t bf, std::size_t n) {
  using SD = cp::ops<cp::cuda_space>;
  using SH = cp::ops<cp::host_space>;
  decoded o;
  o.host_sum.resize(n);
  try {
    SH::codec_decode_sum<Codec>({}, codec, std::span<const float>(all), bf, std::span<float>(o.host_sum));
  } catch (const cp::wire_error&) {
    o.host_raised = true;
  }
  cp::cuda_buffer<float> dall, dsum;
  cp::cuda_buffer<std::uint32_t> ds;
  upload(dall, all), upload(ds, std::vector<std::uint32_t>{0});
  dsum.resize(n);
  SD::codec_decode_sum<Codec>(E, codec, dall.cview(), bf, dsum.view(), ds.view());
  o.status = download(E, ds.cview())[0];
  o.sum = download(E, dsum.cview());
  return o;
}

//! `steps` gradients of n values, N(0, 1) from rng; a NaN at n / 3 in step nan_step (if >= 0).
inline std::vector<std::vector<float>> random_steps(int steps, std::size_t n, int nan_step, std::mt19937_64& rng) {
  std::normal_distribution<float> d;
  std::vector<std::vector<float>> grads(steps, std::vector<float>(n));
  for (auto& g : grads)
    for (auto& v : g) v = d(rng);
  if (nan_step >= 0) grads[nan_step][n / 3] = std::numeric_limits<float>::quiet_NaN();
  return grads;
}

//! What the host twin did each step: output, residual, velocity, and the outcome (1 delivered, 0 skipped,
//! -1 numeric_error, -2 the corrupted step, which the host skips).
struct host_steps {
  std::vector<std::vector<float>> out, res, vel;
  std::vector<int> ok;
};

//! The host twin (make_host(ThreadComm&), one rank) over the gradients grads, skipping step corrupt_step.
template <class MakeHost>
host_steps run_host_steps(const std::vector<std::vector<float>>& grads, int corrupt_step, MakeHost make_host) {
  const std::size_t steps = grads.size();
  host_steps hs{std::vector<std::vector<float>>(steps), std::vector<std::vector<float>>(steps),
                std::vector<std::vector<float>>(steps), std::vector<int>(steps)};
  cp::run_threads(1, [&](cp::ThreadComm& tc) {
    auto h = make_host(tc);
    for (int s = 0; s < static_cast<int>(steps); ++s) {
      hs.out[s] = grads[s];
      if (s == corrupt_step) hs.ok[s] = -2;
      else try {
          hs.ok[s] = h.reduce(std::span<float>(hs.out[s])) ? 1 : 0;
        } catch (const cp::numeric_error&) {
          hs.ok[s] = -1;
        }
      hs.res[s].assign(h.residual().begin(), h.residual().end());
      hs.vel[s].assign(h.velocity().begin(), h.velocity().end());
    }
  });
  return hs;
}

}  // namespace codec_test
