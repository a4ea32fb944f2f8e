// SPDX-License-Identifier: Apache-2.0
// CodecCompressor over the CUDA space for natural_codec, onebit_codec and per_tensor<K>
// (compress/device_codecs_natural.cuh, _onebit.cuh, _per_tensor.cuh):
// - over a one-rank NcclComm on device spans against the same compressor over a one-rank
//   ThreadComm on the host, 4 steps with error feedback (momentum too): the output,
//   residual and velocity bit for bit; a NaN gradient reported alike (numeric_error, or a
//   skipped step); a payload corrupted on the device before the decode raising wire_error
//   with grad and state untouched; no allocation after step one;
// - over CudaStagedComm<ThreadComm> at P = 2, 3 and 5 (a stream per rank) against the
//   same compressor over ThreadComm, 4 steps, output and residual bit for bit.
// The leaf kernels: test_cuda_codec_leaves_more.cu.
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.

#include <mutex>

#include "commpact/comm/cuda_staged_comm.hpp"
#include "commpact/comm/nccl_comm.hpp"
#include "commpact/comm/thread_comm.hpp"
#include "commpact/compress/codecs/per_tensor.hpp"
#include "commpact/compress/codecs/sparsifiers.hpp"

#include "corrupting_nccl.cuh"

using commpact_test::failures;
using namespace codec_test;

namespace {

template <class Codec, class C>
using Comp = cp::CodecCompressor<Codec, cp::Allgather<C>>;

//! 4 steps of CodecCompressor<Codec> over a one-rank NcclComm and over a one-rank
//! ThreadComm with the same gradients; `nan_step` >= 0 puts a NaN into that step's
//! gradient; `corrupt_step` >= 0 sets the first payload word of the device's received
//! block to 0xFFFFFFFF before decoding (natural: code 255; 1-bit: a NaN mean; per_tensor:
//! tensor 0's length), which must raise wire_error and change nothing.
template <class Codec>
void check_single(const char* what, const Codec& codec, const cp::codec_options& opt, std::size_t n, int nan_step,
                  int corrupt_step, std::mt19937_64& rng) {
  constexpr int steps = 4;
  const auto grads = random_steps(steps, n, nan_step, rng);
  const auto [hout, hres, hvel, hok] = run_host_steps(grads, corrupt_step, [&](cp::ThreadComm& tc) {
    return Comp<Codec, cp::ThreadComm>{tc, codec, opt, what};
  });
  corrupting_nccl dc{cp::NcclComm::single()};
  Comp<Codec, corrupting_nccl> dev{dc, codec, opt, what};
  const auto& e = dc.exec();
  cp::cuda_buffer<float> g;
  g.resize(n);
  std::vector<std::pair<const void*, std::size_t>> sig;
  for (int s = 0; s < steps; ++s) {
    D::from_host(e, std::span<const float>(grads[s]), g.view());
    const int ok = device_step(what, s, dev, g, s == corrupt_step);
    EXPECT(ok == hok[s], "%s step %d: outcome %d vs host %d", what, s, ok, hok[s]);
    const auto out = download(e, g.cview());
    EXPECT(diff(out, hout[s]) == 0, "%s step %d: the reduced gradient differs from the host in %zu places", what, s,
           diff(out, hout[s]));
    EXPECT(diff(download(e, dev.residual()), hres[s]) == 0, "%s step %d: the residual differs from the host", what, s);
    EXPECT(diff(download(e, dev.velocity()), hvel[s]) == 0, "%s step %d: the velocity differs from the host", what, s);
    if (s == 0) sig = dev.workspace_signature();
    else EXPECT(dev.workspace_signature() == sig, "%s step %d: the device buffers were reallocated", what, s);
  }
}

//! 4 steps at P ranks of CodecCompressor<Codec> over CudaStagedComm<ThreadComm> against
//! the same over ThreadComm: output and residual bit for bit on every rank.
template <class Codec>
void check_staged(const char* what, const Codec& codec, const cp::codec_options& opt, int P, std::size_t n,
                  std::uint64_t seed) {
  using SC = cp::CudaStagedComm<cp::ThreadComm>;
  cp::run_threads(P, [&](cp::ThreadComm& tc) {
    const int r = tc.rank();
    SC c{tc};
    const auto& e = c.exec();
    Comp<Codec, SC> dev{c, codec, opt, what};
    Comp<Codec, cp::ThreadComm> host{tc, codec, opt, what};
    cp::cuda_buffer<float> g;
    g.resize(n);
    std::mt19937_64 gen(seed + static_cast<std::uint64_t>(r));
    std::normal_distribution<float> d;
    for (int s = 0; s < 4; ++s) {
      std::vector<float> h(n);
      for (auto& x : h) x = d(gen);
      D::from_host(e, std::span<const float>(h), g.view());
      dev.reduce(g.view());
      host.reduce(std::span<float>(h));
      const auto out = download(e, g.cview());
      EXPECT_MT(diff(out, h) == 0, "%s P=%d rank %d step %d: output differs from the host in %zu places", what, P, r,
                s, diff(out, h));
      const std::span<const float> hr = host.residual();
      EXPECT_MT(diff(download(e, dev.residual()), std::vector<float>(hr.begin(), hr.end())) == 0,
                "%s P=%d rank %d step %d: residual differs from the host", what, P, r, s);
    }
  });
}

//! Every check for one codec: one rank (plain, momentum, a NaN under both policies, a
//! corrupted payload) and P = 2, 3, 5 staged.
template <class Codec>
void check_all(const char* what, const Codec& codec, std::size_t n, std::mt19937_64& rng) {
  check_single(what, codec, {}, n, -1, -1, rng);
  check_single(what, codec, {.momentum = 0.9f}, n, -1, 2, rng);
  check_single(what, codec, {.on_nonfinite = cp::nonfinite::skip_step}, n, 1, -1, rng);
  check_single(what, codec, {}, n, 2, -1, rng);  // nonfinite::raise: numeric_error, state kept
  for (int P : {2, 3, 5}) check_staged(what, codec, {.momentum = 0.5f}, P, n, rng());
}

}  // namespace

int main() {
  return commpact_test::run_checks("all device codec checks passed\n", "%d device codec checks failed\n", [] {
    auto rng = commpact_test::seeded_rng();
    check_all("natural", cp::natural_codec{7}, 100003, rng);
    check_all("natural", cp::natural_codec{8}, 17, rng);
    check_all("1-bit", cp::onebit_codec{}, 100003, rng);
    check_all("1-bit", cp::onebit_codec{}, 4097, rng);
    check_single("1-bit", cp::onebit_codec{}, {}, (1 << 20) + 5, -1, -1, rng);
    const cp::tensor_layout layout = {{64, 100}, {64}, {10, 64}, {10}, {1, 4096 * 3 + 7}};
    const std::size_t n = 6400 + 64 + 640 + 10 + 4096 * 3 + 7;
    check_all("per_tensor<sign>", cp::per_tensor{cp::split_rows(layout), cp::sign_codec{}}, n, rng);
    check_all("per_tensor<1-bit>", cp::per_tensor{cp::split_rows(layout), cp::onebit_codec{}}, n, rng);
    check_all("per_tensor<natural>", cp::per_tensor{layout, cp::natural_codec{3}}, n, rng);
    check_all("per_tensor<TernGrad>", cp::per_tensor{cp::split_rows(layout), cp::terngrad_codec{4}}, n, rng);
    check_all("per_tensor<topk>", cp::per_tensor{layout, cp::topk_codec{0.02}}, n, rng);
    check_all("per_tensor<threshold>", cp::per_tensor{layout, cp::threshold_codec{1.5f, 0.05}}, n, rng);
    check_all("per_tensor<QSGD>", cp::per_tensor{layout, cp::qsgd_codec{16, 2, 128}}, n, rng);
    check_single("per_tensor<bf16>", cp::per_tensor{layout, cp::bf16_codec{}}, {}, n, -1, 1, rng);
  });
}
