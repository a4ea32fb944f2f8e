// SPDX-License-Identifier: Apache-2.0
// CudaStagedComm<ThreadComm> (comm/cuda_staged_comm.hpp): ThreadComm ranks, each with a
// CUDA stream of its own, run the CUDA space's algorithms at P > 1 on one GPU.
// - its collectives and point-to-point on device spans against ThreadComm's on the host
//   (P = 3: allreduce sum and max, allgather, broadcast, exchange round a ring,
//   send/recv_known);
// - gTopK and TopK on ReLU-like gradients (97% exact zeros), and in the CUDA DDP hooks'
//   flow (a compressor per bucket, steps left in flight and finished when their bucket
//   index comes again), against the host step by step;
// - Dense, gTopK<TreeComm<...>>, OkTopK, Fp16Allreduce, LinearCompressor<randomk_codec> and
//   PowerCompressor<2, cuda_space> over it at P = 2, 3 and 5 against the same compressors
//   over ThreadComm on the host, 4 steps, bit for bit (outputs and residuals), a NaN on one
//   rank raising numeric_error on every rank, no device allocation after the first step;
// - GossipMixer D-PSGD and PowerGossip<1> on a ring, 4 rounds, bit for bit (PowerGossip's
//   Gaussian factors may differ in a float's last bit, about once in 2^28 values: ops.cuh).
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <vector>

#include "commpact/comm/cuda_staged_comm.hpp"
#include "commpact/comm/thread_comm.hpp"
#include "commpact/comm/tree_comm.hpp"
#include "commpact/compress/compressors/cast_allreduce.hpp"
#include "commpact/compress/compressors/dense.hpp"
#include "commpact/compress/compressors/gtopk.hpp"
#include "commpact/compress/compressors/linear.hpp"
#include "commpact/compress/compressors/oktopk.hpp"
#include "commpact/compress/compressors/power.hpp"
#include "commpact/compress/compressors/topk.hpp"
#include "commpact/compress/device_codecs.cuh"
#include "commpact/gossip/gossip_mixer.hpp"
#include "commpact/gossip/power_gossip.hpp"
#include "commpact/topology/ring.hpp"
#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/space/cuda.hpp"

#include "cuda_test_common.cuh"

namespace cp = commpact;
using D = cp::ops<cp::cuda_space>;
using SC = cp::CudaStagedComm<cp::ThreadComm>;
using commpact_test::download;
using commpact_test::same;
using commpact_test::upload;
using commpact_test::values;

namespace {


void check_collectives() {
  const int P = 3;
  cp::run_threads(P, [&](cp::ThreadComm& tc) {
    SC c{tc};
    const auto& e = c.exec();
    const int r = c.rank();
    const auto h = values(10 + r, 1001);
    auto want = h;
    tc.allreduce(std::span<float>(want));
    auto d = upload(e, h);
    c.allreduce(d.view());
    EXPECT_MT(same(download(e, d.cview()), want), "rank %d: allreduce(sum) differs from ThreadComm's", r);
    auto wmax = h;
    tc.allreduce(std::span<float>(wmax), cp::reduce_op::max);
    d = upload(e, h);
    c.allreduce(d.view(), cp::reduce_op::max);
    EXPECT_MT(same(download(e, d.cview()), wmax), "rank %d: allreduce(max) differs", r);
    std::vector<float> all(h.size() * P);
    tc.allgather(std::span<const float>(h), std::span<float>(all));
    cp::cuda_buffer<float> g;
    g.resize(all.size());
    d = upload(e, h);
    c.allgather(d.cview(), g.view());
    EXPECT_MT(same(download(e, g.cview()), all), "rank %d: allgather differs", r);
    auto b = h;
    tc.broadcast(std::span<float>(b), 1);
    d = upload(e, h);
    c.broadcast(d.view(), 1);
    EXPECT_MT(same(download(e, d.cview()), b), "rank %d: broadcast differs", r);
    // A ring: send to the next rank, receive from the previous one.
    std::vector<std::byte> msg(77);
    for (std::size_t i = 0; i < msg.size(); ++i) msg[i] = std::byte(i * 3 + static_cast<std::size_t>(r));
    std::vector<std::byte> from_prev(77);
    for (std::size_t i = 0; i < msg.size(); ++i) from_prev[i] = std::byte(i * 3 + static_cast<std::size_t>((r + P - 1) % P));
    auto out = upload(e, msg);
    cp::cuda_buffer<std::byte> in;
    in.resize(msg.size());
    if (r % 2 == 0) {
      c.send_known((r + 1) % P, out.cview());
      c.recv_known((r + P - 1) % P, in.view());
    } else {
      c.recv_known((r + P - 1) % P, in.view());
      c.send_known((r + 1) % P, out.cview());
    }
    EXPECT_MT(same(download(e, in.cview()), from_prev), "rank %d: send/recv_known round the ring", r);
    cp::cuda_buffer<std::byte> in2;
    in2.resize(msg.size());
    const int peer = r ^ 1;
    if (peer < P) {
      c.exchange(peer, out.cview(), in2.view());
      std::vector<std::byte> want_x(77);
      for (std::size_t i = 0; i < want_x.size(); ++i) want_x[i] = std::byte(i * 3 + static_cast<std::size_t>(peer));
      EXPECT_MT(same(download(e, in2.cview()), want_x), "rank %d: exchange with %d", r, peer);
    }
    c.barrier();
  });
}

//! Four steps of the compressor made by `make` over CudaStagedComm and over ThreadComm;
//! `zeros` > 0: ReLU-like gradients (that share of exact zeros, the rest N(0, 1e-3 squared)).
template <class MakeDev, class MakeHost>
void check_compressor(const char* name, int P, std::size_t n, MakeDev make_dev, MakeHost make_host,
                      double zeros = 0.0) {
  cp::run_threads(P, [&](cp::ThreadComm& tc) {
    const int r = tc.rank();
    SC c{tc};
    const auto& e = c.exec();
    auto dev = make_dev(c);
    auto host = make_host(tc);
    cp::cuda_buffer<float> g;
    g.resize(n);
    std::vector<std::pair<const void*, std::size_t>> sig;
    for (int s = 0; s < 4; ++s) {
      auto h = zeros > 0.0 ? commpact_test::relu_values(1000 * s + r, n, zeros, 1e-3f) : values(1000 * s + r, n);
      D::from_host(e, std::span<const float>(h), g.view());
      dev.reduce(g.view());
      host.reduce(std::span<float>(h));
      EXPECT_MT(same(download(e, g.cview()), h), "%s P=%d zeros=%g rank %d step %d: output differs from the host", name,
                P, zeros, r, s);
      if constexpr (requires { dev.residual(); std::span<const float>(host.residual()); }) {
        const std::span<const float> hr = host.residual();
        EXPECT_MT(same(download(e, dev.residual()), std::vector<float>(hr.begin(), hr.end())),
                  "%s P=%d zeros=%g rank %d step %d: residual differs from the host", name, P, zeros, r, s);
      }
      if constexpr (requires { dev.workspace_signature(); }) {
        if (s == 1) sig = dev.workspace_signature();
        if (s > 1) EXPECT_MT(dev.workspace_signature() == sig, "%s rank %d step %d: reallocated", name, r, s);
      }
    }
    // A NaN on the last rank: numeric_error on every rank.
    auto h = values(99 + r, n);
    if (r == P - 1) h[n / 3] = std::numeric_limits<float>::quiet_NaN();
    D::from_host(e, std::span<const float>(h), g.view());
    bool raised = false;
    try {
      dev.reduce(g.view());
    } catch (const cp::numeric_error&) {
      raised = true;
    }
    EXPECT_MT(raised, "%s P=%d rank %d: a NaN on rank %d did not raise numeric_error here", name, P, r, P - 1);
  });
}

//! The CUDA DDP hooks' flow (python/commpact_hooks_cuda.cu) on the device: a compressor per
//! bucket (ReLU-like gradients, density 0.05), each bucket's step started and left in
//! flight, its result copied out by work queued after it (as DDP does), the next step's
//! gradient written into the same bucket, and every step in flight finished and committed,
//! in start order, when a bucket index comes again. Results and residuals against reduce()
//! on the host, step by step. (tests/test_space_deferred.cpp runs the same flow on the
//! deferred space in CI.)
template <class MakeDev, class MakeHost>
void check_hook_flow(const char* name, int P, MakeDev make_dev, MakeHost make_host) {
  const std::vector<std::size_t> sizes = {26000, 5000, 37};
  const std::vector<double> zeros = {0.6, 0.97, 0.999};
  const std::size_t B = sizes.size();
  cp::run_threads(P, [&](cp::ThreadComm& tc) {
    const int r = tc.rank();
    SC c{tc};
    const auto& e = c.exec();
    using DevC = decltype(make_dev(c));
    using HostC = decltype(make_host(tc));
    std::vector<std::unique_ptr<DevC>> dev;
    std::vector<std::unique_ptr<HostC>> host;
    std::vector<cp::cuda_buffer<float>> bucket(B), copied(B);
    std::vector<std::vector<float>> want(B);
    for (std::size_t b = 0; b < B; ++b) {
      dev.push_back(std::make_unique<DevC>(make_dev(c)));
      host.push_back(std::make_unique<HostC>(make_host(tc)));
      bucket[b].resize(sizes[b]);
      copied[b].resize(sizes[b]);
    }
    std::vector<bool> pending(B, false);
    int step = 0;
    auto settle = [&] {
      for (std::size_t b = 0; b < B; ++b) {
        if (!pending[b]) continue;
        const bool delivered = dev[b]->finish();
        dev[b]->commit();
        pending[b] = false;
        EXPECT_MT(delivered, "%s hook flow P=%d rank %d bucket %zu step %d: skipped", name, P, r, b, step - 1);
        EXPECT_MT(same(download(e, copied[b].cview()), want[b]),
                  "%s hook flow P=%d rank %d bucket %zu step %d: result differs from the host", name, P, r, b, step - 1);
        const std::span<const float> hr = host[b]->residual();
        EXPECT_MT(same(download(e, dev[b]->residual()), std::vector<float>(hr.begin(), hr.end())),
                  "%s hook flow P=%d rank %d bucket %zu step %d: residual differs from the host", name, P, r, b,
                  step - 1);
      }
    };
    for (; step < 6; ++step) {
      for (std::size_t b = 0; b < B; ++b) {
        const auto g = commpact_test::relu_values(1000 * step + 10 * b + r, sizes[b], zeros[b], 1e-3f);
        D::from_host(e, std::span<const float>(g), bucket[b].view());  // backward writes the bucket
        if (pending[b]) settle();
        want[b] = g;
        host[b]->reduce(std::span<float>(want[b]));
        dev[b]->start(bucket[b].view());
        pending[b] = true;
        D::copy(e, bucket[b].cview(), copied[b].view());  // DDP copies the result out
      }
    }
    ++step;
    settle();
  });
}

//! Four gossip rounds of GossipMixer<Ring, Mode> over CudaStagedComm and over ThreadComm
//! from the same models: the same bits after every round.
template <class Mode>
void check_gossip(const char* name, int P, Mode mode) {
  const cp::tensor_layout layout = {{12, 10}, {10}, {8, 16}, {5}, {20, 6}};
  const std::size_t n = 120 + 10 + 128 + 5 + 120;
  cp::run_threads(P, [&](cp::ThreadComm& tc) {
    const int r = tc.rank();
    SC c{tc};
    const auto& e = c.exec();
    cp::GossipMixer<cp::Ring, Mode, SC> dev{c, cp::Ring(P), layout, mode};
    cp::GossipMixer<cp::Ring, Mode, cp::ThreadComm> host{tc, cp::Ring(P), layout, mode};
    auto x = values(500 + r, n);
    auto xd = upload(e, x);
    for (int round = 0; round < 4; ++round) {
      host.mix(std::span<float>(x));
      dev.mix(xd.view());
      EXPECT_MT(same(download(e, xd.cview()), x), "%s P=%d rank %d round %d: the model differs from the host", name, P,
                r, round);
    }
  });
}

}  // namespace

int main() {
  if (!commpact_test::have_cuda_device()) return commpact_test::exit_skipped;
  check_collectives();
  for (int P : {2, 3, 5}) {
    check_compressor(
        "Dense", P, 4099, [](SC c) { return cp::Dense<SC>{c}; },
        [](cp::ThreadComm c) { return cp::Dense<cp::ThreadComm>{c}; });
    check_compressor(
        "gTopK", P, 20011, [](SC c) { return cp::gTopK<cp::TreeComm<SC>>{c, {.density = 0.01}}; },
        [](cp::ThreadComm c) { return cp::gTopK<cp::TreeComm<cp::ThreadComm>>{c, {.density = 0.01}}; });
    check_compressor(
        "gTopK", P, 20011, [](SC c) { return cp::gTopK<cp::TreeComm<SC>>{c, {.density = 0.05}}; },
        [](cp::ThreadComm c) { return cp::gTopK<cp::TreeComm<cp::ThreadComm>>{c, {.density = 0.05}}; }, 0.97);
    check_compressor(
        "TopK", P, 20011, [](SC c) { return cp::TopK<SC>{c, {.density = 0.05}}; },
        [](cp::ThreadComm c) { return cp::TopK<cp::ThreadComm>{c, {.density = 0.05}}; }, 0.97);
    if (P < 5) {
      check_hook_flow(
          "gTopK", P, [](SC c) { return cp::gTopK<cp::TreeComm<SC>>{c, {.density = 0.05}}; },
          [](cp::ThreadComm c) { return cp::gTopK<cp::TreeComm<cp::ThreadComm>>{c, {.density = 0.05}}; });
      check_hook_flow(
          "TopK", P, [](SC c) { return cp::TopK<SC>{c, {.density = 0.05}}; },
          [](cp::ThreadComm c) { return cp::TopK<cp::ThreadComm>{c, {.density = 0.05}}; });
    }
    check_compressor(
        "OkTopK", P, 20011, [](SC c) { return cp::OkTopK<SC>{c, {.density = 0.01, .period = 2}}; },
        [](cp::ThreadComm c) { return cp::OkTopK<cp::ThreadComm>{c, {.density = 0.01, .period = 2}}; });
    check_compressor(
        "Fp16Allreduce", P, 4099, [](SC c) { return cp::Fp16Allreduce<SC>{c}; },
        [](cp::ThreadComm c) { return cp::Fp16Allreduce<cp::ThreadComm>{c}; });
    check_compressor(
        "LinearCompressor<randomk>", P, 4099,
        [](SC c) { return cp::LinearCompressor<cp::randomk_codec, SC>{c, cp::randomk_codec{0.05, 9}}; },
        [](cp::ThreadComm c) { return cp::LinearCompressor<cp::randomk_codec, cp::ThreadComm>{c, cp::randomk_codec{0.05, 9}}; });
    const cp::tensor_layout layout = {{64, 40}, {40}, {30, 20}};
    check_compressor(
        "PowerCompressor<2>", P, 64 * 40 + 40 + 600,
        [&](SC c) { return cp::PowerCompressor<2, cp::cuda_space>{c, layout, {.min_compression_rate = 1.0}}; },
        [&](cp::ThreadComm c) { return cp::PowerCompressor<2>{c, layout, {.min_compression_rate = 1.0}}; });
    check_gossip("D-PSGD", P, cp::exact_mixing{});
    check_gossip("PowerGossip<1>", P, cp::power_gossip<1>{});
  }
  std::printf("%s: %d failures\n", commpact_test::failures ? "FAILED" : "ok", commpact_test::failures);
  return commpact_test::failures ? 1 : 0;
}
