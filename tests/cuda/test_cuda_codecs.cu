// SPDX-License-Identifier: Apache-2.0
// CodecCompressor over the CUDA space (compress/device_codecs.cuh): TopK and
// CodecCompressor<threshold, sign, fp16, bf16, TernGrad, QSGD codec> over a one-rank
// NcclComm on device spans against the same compressor over a one-rank ThreadComm on the
// host, 4 steps with error feedback (momentum too): the output, residual and velocity bit
// for bit; a NaN gradient reported alike (numeric_error, or a skipped step); a payload
// corrupted on the device before the decode raising wire_error with grad and state
// untouched; no allocation after step one. The leaf kernels: test_cuda_codec_leaves.cu.
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.

#include "commpact/comm/nccl_comm.hpp"
#include "commpact/comm/thread_comm.hpp"

#include "corrupting_nccl.cuh"

using commpact_test::failures;
using namespace codec_test;

namespace {

//! `steps` steps of a compressor on the device (`dev`, over a one-rank NcclComm) and of
//! its host twin (make_host(ThreadComm&), one rank) with the same gradients; `nan_step`
//! >= 0 puts a NaN into that step's gradient; `corrupt_step` >= 0 corrupts the first
//! payload word of the device's received block before decoding (top-k: index -1; sign: a
//! NaN scale), which must raise wire_error and change nothing (the host skips that step).
template <class Dev, class MakeHost>
void compare_steps(const char* what, Dev& dev, const cp::cuda_space::exec& e, MakeHost make_host, std::size_t n,
                   int steps, int nan_step, int corrupt_step, bool skip_nonfinite, std::mt19937_64& rng) {
  const auto grads = random_steps(steps, n, nan_step, rng);
  const auto [hout, hres, hvel, hok] = run_host_steps(grads, corrupt_step, make_host);
  cp::cuda_buffer<float> g;
  g.resize(n);
  std::vector<std::pair<const void*, std::size_t>> sig;
  std::int64_t expect_steps = 0;
  for (int s = 0; s < steps; ++s) {
    D::from_host(e, std::span<const float>(grads[s]), g.view());
    const int ok = device_step(what, s, dev, g, s == corrupt_step);
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
  corrupting_nccl dc{cp::NcclComm::single()};
  cp::TopK<corrupting_nccl> dev{dc, opt};
  compare_steps("TopK", dev, dc.exec(), [&](cp::ThreadComm& tc) { return cp::TopK<cp::ThreadComm>{tc, opt}; }, n, 4,
                nan_step, corrupt_step, opt.on_nonfinite == cp::nonfinite::skip_step, rng);
}

template <class Codec>
void check_codec(const char* what, const Codec& codec, const cp::codec_options& opt, std::size_t n, int nan_step,
                 int corrupt_step, std::mt19937_64& rng) {
  using DevC = cp::CodecCompressor<Codec, cp::Allgather<corrupting_nccl>>;
  using HostC = cp::CodecCompressor<Codec, cp::Allgather<cp::ThreadComm>>;
  corrupting_nccl dc{cp::NcclComm::single()};
  DevC dev{dc, codec, opt, what};
  compare_steps(what, dev, dc.exec(), [&](cp::ThreadComm& tc) { return HostC{tc, codec, opt, what}; }, n, 4, nan_step,
                corrupt_step, opt.on_nonfinite == cp::nonfinite::skip_step, rng);
}

}  // namespace

int main() {
  return commpact_test::run_checks("all device codec checks passed\n", "%d device codec checks failed\n", [] {
    auto rng = commpact_test::seeded_rng();
    check_topk({.density = 0.01}, 100003, -1, -1, rng);
    check_topk({.density = 0.001, .momentum = 0.9f}, 1 << 20, -1, -1, rng);
    check_topk({.density = 0.05, .momentum = 0.9f, .on_nonfinite = cp::nonfinite::skip_step}, 50000, 2, -1, rng);
    check_topk({.density = 0.05}, 50000, 1, -1, rng);  // nonfinite::raise: numeric_error, state kept
    check_topk({.density = 0.02, .momentum = 0.5f}, 30011, -1, 2, rng);
    check_codec("threshold", cp::threshold_codec{1.0f}, {}, 100003, -1, -1, rng);
    check_codec("threshold", cp::threshold_codec{1.5f, 0.02}, {.momentum = 0.9f}, 65536, -1, -1, rng);
    check_codec("threshold", cp::threshold_codec{0.5f, 0.01}, {.on_nonfinite = cp::nonfinite::skip_step}, 50000, 2, -1,
                rng);
    check_codec("threshold", cp::threshold_codec{1.0f, 0.05}, {.momentum = 0.5f}, 30011, -1, 1, rng);
    check_codec("EF-SignSGD", cp::sign_codec{}, {}, 100003, -1, -1, rng);
    check_codec("EF-SignSGD", cp::sign_codec{}, {.momentum = 0.9f}, (1 << 20) + 5, -1, -1, rng);
    check_codec("EF-SignSGD", cp::sign_codec{}, {.on_nonfinite = cp::nonfinite::skip_step}, 50001, 1, -1, rng);
    check_codec("EF-SignSGD", cp::sign_codec{}, {}, 4096 * 3 + 1, 2, -1, rng);
    check_codec("EF-SignSGD", cp::sign_codec{}, {.momentum = 0.5f}, 30011, -1, 2, rng);
    check_codec("fp16", cp::fp16_codec{}, {}, 100003, -1, -1, rng);
    check_codec("bf16", cp::bf16_codec{}, {.momentum = 0.9f}, 65537, -1, 1, rng);
    check_codec("fp16", cp::fp16_codec{}, {.on_nonfinite = cp::nonfinite::skip_step}, 5001, 2, -1, rng);
    check_codec("TernGrad", cp::terngrad_codec{}, {}, 100003, -1, -1, rng);
    check_codec("TernGrad", cp::terngrad_codec{}, {.momentum = 0.9f}, 4099, -1, 2, rng);
    check_codec("TernGrad", cp::terngrad_codec{}, {.on_nonfinite = cp::nonfinite::skip_step}, 777, 1, -1, rng);
    check_codec("QSGD", cp::qsgd_codec{256, 7}, {}, 100003, -1, -1, rng);
    check_codec("QSGD", cp::qsgd_codec{16, 3, 0}, {.momentum = 0.9f}, 30011, -1, 2, rng);
    check_codec("QSGD", cp::qsgd_codec{3, 5, 64}, {.on_nonfinite = cp::nonfinite::skip_step}, 4097, 1, -1, rng);
  });
}
