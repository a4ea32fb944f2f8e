// NcclComm (one rank), Dense<NcclComm>, and gTopK<TreeComm<NcclComm>> on device spans against
// gTopK<TreeComm<ThreadComm>> on the host, step by step: the reduced gradient and the
// residual (and velocity) bit for bit over several steps, with momentum and clipping
// options (the clip factor's norm in kernels/fixed_sum.hpp's shape on both sides), a
// skipped non-finite step, no allocation after the first
// step, NcclComm's collectives, point-to-point to itself and abort, and a fence that
// stops at its deadline (timeout_error, the communicator aborted) while a kernel spins.
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.
// NCCL cannot place two ranks of one communicator on one GPU, so the multi-rank tree on
// the device is covered by test_cuda_ops.cu's simulated ranks.

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "commpact/comm/nccl_comm.hpp"
#include "commpact/comm/thread_comm.hpp"
#include "commpact/comm/tree_comm.hpp"
#include "commpact/compress/compressors/dense.hpp"
#include "commpact/compress/compressors/gtopk.hpp"
#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/space/cuda.hpp"

#include "cuda_test_common.cuh"

using commpact_test::failures;
namespace cp = commpact;
using D = cp::ops<cp::cuda_space>;
using commpact_test::diff;
using commpact_test::download;

namespace {

__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

//! A fence never waits past its deadline: with a kernel spinning for about a second, a
//! fence with a 20 ms deadline raises timeout_error well before the kernel ends, and
//! calls the communicator's timeout hook (NcclComm aborts).
void check_deadline() {
  auto c = cp::NcclComm::single();
  int dev = 0, khz = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev);
  spin<<<1, 1, 0, c.exec().stream()>>>(static_cast<long long>(khz > 0 ? khz : 1500000) * 1000LL);
  const auto t0 = std::chrono::steady_clock::now();
  bool timed_out = false;
  try {
    c.fence(t0 + std::chrono::milliseconds(20));
  } catch (const cp::timeout_error&) {
    timed_out = true;
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT(timed_out, "a fence past its deadline did not raise timeout_error");
  EXPECT(waited < 0.5, "the fence waited %.3f s with a 20 ms deadline", waited);
  EXPECT(c.aborted(), "the fence's timeout did not abort the NCCL communicator");
  cudaStreamSynchronize(c.exec().stream());  // let the spinning kernel end
  bool raised = false;
  try {
    c.fence(cp::no_deadline());
  } catch (const cp::peer_failure&) {
    raised = true;
  }
  EXPECT(raised, "a fence after the abort did not raise peer_failure (the poll of the communicator's error)");
}


void check_collectives(cp::NcclComm& c) {
  const auto& e = c.exec();
  std::vector<float> h = {1.5f, -2.0f, 3.25f};
  cp::cuda_buffer<float> d, g;
  d.resize(3);
  D::from_host(e, std::span<const float>(h), d.view());
  c.allreduce(d.view());
  EXPECT(diff(download(e, d.cview()), h) == 0, "allreduce over one rank changed the data");
  g.resize(3);
  c.allgather(d.cview(), g.view());
  EXPECT(diff(download(e, g.cview()), h) == 0, "allgather over one rank");
  c.broadcast(d.view(), 0);
  EXPECT(diff(download(e, d.cview()), h) == 0, "broadcast over one rank");
  std::vector<std::int64_t> hi = {7, -3};
  c.allreduce(std::span<std::int64_t>(hi), cp::reduce_op::max);
  EXPECT(hi[0] == 7 && hi[1] == -3, "host-span allreduce over one rank");
  cp::cuda_buffer<std::byte> out, in;
  std::vector<std::byte> msg(100);
  for (std::size_t i = 0; i < msg.size(); ++i) msg[i] = std::byte(i * 7);
  out.resize(100), in.resize(100);
  D::from_host(e, std::span<const std::byte>(msg), out.view());
  c.exchange(0, out.cview(), in.view());
  EXPECT(diff(download(e, in.cview()), msg) == 0, "exchange with itself");
  std::vector<std::byte> back;
  c.sendrecv(0, std::span<const std::byte>(msg), back);
  EXPECT(diff(back, msg) == 0, "sendrecv (length-prefixed) with itself");
  c.barrier();
}

//! `steps` steps of gTopK on the device and on the host with the same gradients.
void check_gtopk(const cp::sparse_options& opt, std::size_t n, int steps, bool bits_exact, std::mt19937_64& rng) {
  auto dc = cp::NcclComm::single();
  const auto e = dc.exec();
  cp::gTopK<cp::TreeComm<cp::NcclComm>> dev{dc, opt};
  std::normal_distribution<float> d;
  std::vector<std::vector<float>> grads(steps, std::vector<float>(n));
  for (auto& g : grads)
    for (auto& v : g) v = d(rng);
  if (opt.on_nonfinite == cp::nonfinite::skip_step) grads[1][n / 2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> host_out(steps), host_res(steps), host_vel(steps);
  std::vector<bool> host_ok(steps);
  cp::run_threads(1, [&](cp::ThreadComm& tc) {
    cp::gTopK<cp::TreeComm<cp::ThreadComm>> h{tc, opt};
    for (int s = 0; s < steps; ++s) {
      host_out[s] = grads[s];
      host_ok[s] = h.reduce(std::span<float>(host_out[s]));
      host_res[s].assign(h.residual().begin(), h.residual().end());
      host_vel[s].assign(h.velocity().begin(), h.velocity().end());
    }
  });
  cp::cuda_buffer<float> g;
  g.resize(n);
  std::vector<std::pair<const void*, std::size_t>> sig;
  for (int s = 0; s < steps; ++s) {
    D::from_host(e, std::span<const float>(grads[s]), g.view());
    const bool ok = dev.reduce(g.view());
    EXPECT(ok == host_ok[s], "step %d: delivered %d vs host %d", s, ok, int(host_ok[s]));
    const auto out = download(e, g.cview());
    const auto res = download(e, dev.residual());
    const auto vel = download(e, dev.velocity());
    if (bits_exact) {
      EXPECT(diff(out, host_out[s]) == 0, "step %d: the reduced gradient differs from the host in %zu places", s,
             diff(out, host_out[s]));
      EXPECT(diff(res, host_res[s]) == 0, "step %d: the residual differs from the host in %zu places", s,
             diff(res, host_res[s]));
      EXPECT(diff(vel, host_vel[s]) == 0, "step %d: the velocity differs from the host", s);
    } else {
      double num = 0, den = 0;
      for (std::size_t i = 0; i < n; ++i) {
        num += (double(out[i]) - host_out[s][i]) * (double(out[i]) - host_out[s][i]);
        den += double(host_out[s][i]) * host_out[s][i];
      }
      EXPECT(num <= 1e-10 * den, "step %d: the reduced gradient is off by %g (relative)", s, std::sqrt(num / den));
    }
    if (s == 1) sig = dev.workspace_signature();
    if (s > 1) EXPECT(dev.workspace_signature() == sig, "step %d: the device buffers were reallocated", s);
  }
}

//! Dense<NcclComm> with one rank: the mean over one rank is the gradient itself (bits);
//! a NaN raises numeric_error, or under skip_step zeroes the gradient.
void check_dense(std::mt19937_64& rng) {
  auto c = cp::NcclComm::single();
  const auto e = c.exec();
  std::normal_distribution<float> d;
  std::vector<float> h(30011);
  for (auto& v : h) v = d(rng);
  cp::cuda_buffer<float> g;
  g.resize(h.size());
  D::from_host(e, std::span<const float>(h), g.view());
  cp::Dense<cp::NcclComm> dense{c};
  EXPECT(dense.reduce(g.view()), "Dense: a finite step was skipped");
  EXPECT(diff(download(e, g.cview()), h) == 0, "Dense over one rank changed the gradient");
  h[5] = std::numeric_limits<float>::quiet_NaN();
  D::from_host(e, std::span<const float>(h), g.view());
  bool raised = false;
  try {
    dense.reduce(g.view());
  } catch (const cp::numeric_error&) {
    raised = true;
  }
  EXPECT(raised, "Dense: a NaN did not raise numeric_error");
  cp::Dense<cp::NcclComm> skipping{c, {.on_nonfinite = cp::nonfinite::skip_step}};
  D::from_host(e, std::span<const float>(h), g.view());
  EXPECT(!skipping.reduce(g.view()), "Dense(skip_step): a NaN step was not skipped");
  const auto z = download(e, g.cview());
  EXPECT(std::all_of(z.begin(), z.end(), [](float v) { return v == 0.0f; }), "Dense(skip_step): grad not zeroed");
}

}  // namespace

int main() {
  return commpact_test::run_checks("all device gTop-k checks passed\n", "%d device gTop-k checks failed\n", [] {
    auto rng = commpact_test::seeded_rng();
    {
      auto c = cp::NcclComm::single();
      check_collectives(c);
      c.abort("test abort");
      bool raised = false;
      try {
        c.barrier();
      } catch (const cp::peer_failure&) {
        raised = true;
      }
      EXPECT(raised, "a call after abort() did not raise peer_failure");
    }
    check_deadline();
    check_dense(rng);
    check_gtopk({.density = 0.01}, 100003, 5, true, rng);
    check_gtopk({.density = 0.001, .momentum = 0.9f}, 1 << 20, 4, true, rng);
    check_gtopk({.density = 0.01, .on_nonfinite = cp::nonfinite::skip_step}, 50000, 4, true, rng);
    check_gtopk({.density = 0.01, .clip_norm = 1.0f}, 50000, 4, true, rng);
  });
}
