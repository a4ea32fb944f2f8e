// SPDX-License-Identifier: Apache-2.0
// ops<cuda_space>'s rows of CastAllreduce (cast_encode, cast_add, cast_decode_mean),
// LinearCompressor (linear_encode/decode/feedback over random-k), MajorityVote
// (signum_update, sign_vote), GossipMixer (gossip_check, gossip_agree_begin/end, gossip_pack, gossip_mix,
// choco_update) and TreeMerge (tree_begin) against ops<host_space>, row by row, on fresh
// random inputs with poisoned outputs: bits and status words. Adversarial inputs: +-0,
// float and half denormals, values that saturate or overflow to Inf in the 16-bit add,
// Inf/NaN codes, ties in the vote, malformed vote blocks and tree blocks. Then
// CastAllreduce<fp16/bf16>, LinearCompressor<randomk> (and MajorityVote when the codec
// kernels of compress/device_codecs.cuh exist) over NcclComm::single() against the
// same compressor over a one-rank ThreadComm for 3 steps, bit for bit.
//
// NaN: a NaN made by arithmetic is canonical on the GPU (x86 keeps the operand's payload
// and sign), so NaN codes and NaN floats compare as "some NaN" (rows_cast_vote.cuh).
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.

#include <cuda_runtime.h>

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
#include "commpact/compress/compressors/cast_allreduce.hpp"
#include "commpact/compress/compressors/linear.hpp"
#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/kernels/host/ops.hpp"
#if __has_include("commpact/compress/device_codecs.cuh")
#include "commpact/compress/device_codecs.cuh"
#include "commpact/compress/compressors/majority.hpp"
#define COMMPACT_TEST_MAJORITY 1
#endif

#include "cuda/rows_gossip_tree_checks.cuh"  // check_gossip_rows, check_tree_begin
#include "cuda/rows_test_util.cuh"

using namespace rows_test;

namespace {

template <class Cast>
bool nan_code(std::uint16_t c) {
  return !Cast::finite_code(c) && std::isnan(Cast::from_code(c));
}
//! Codes equal, or both NaN codes.
template <class Cast>
std::size_t diff_codes(const std::vector<std::uint16_t>& a, const std::vector<std::uint16_t>& b) {
  std::size_t d = a.size() != b.size();
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    d += !(a[i] == b[i] || (nan_code<Cast>(a[i]) && nan_code<Cast>(b[i])));
  return d;
}

//! Gaussian values of mixed magnitudes with the adversarial ones sprinkled in.
std::vector<float> values(std::size_t n, std::mt19937_64& rng, bool nonfinite) {
  std::normal_distribution<float> d;
  std::uniform_int_distribution<int> ex(-30, 20);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(d(rng), ex(rng));
  const float special[] = {0.0f, -0.0f, 1e-40f, -1e-42f, 6e-8f, -3e-5f, 65504.0f, 65519.0f, 65520.0f, -7e4f,
                           3e38f, 1.0f, -1.0f, 0.5f};
  for (std::size_t j = 0; j < sizeof(special) / sizeof(float) && j < n; ++j) v[(j * 7919) % n] = special[j];
  if (nonfinite && n > 3) v[n / 2] = std::numeric_limits<float>::infinity(), v[n / 3] = std::nanf("");
  return v;
}

template <class Cast>
void check_cast_rows(std::mt19937_64& rng) {
  for (std::size_t n : {1u, 7u, 1000u, 100003u})
    for (int mode = 0; mode < 4; ++mode) {  // bit 0: residual and candidate; bit 1: non-finite input
      const bool ef = mode & 1, bad = mode & 2;
      const auto g = values(n, rng, bad);
      auto r = values(n, rng, false);
      if (!ef) r.clear();
      std::vector<std::uint16_t> codes(n, 0xA5A5);
      std::vector<float> cand(ef ? n : 0, std::nanf(""));
      cp::cuda_buffer<float> dg, dr, dc;
      cp::cuda_buffer<std::uint16_t> dcodes;
      upload(dg, g), upload(dr, r), upload(dc, cand), upload(dcodes, codes);
      H::cast_encode<Cast>({}, std::span<const float>(g), std::span<const float>(r), std::span<std::uint16_t>(codes),
                           std::span<float>(cand));
      D::cast_encode<Cast>(E, dg.cview(), dr.cview(), dcodes.view(), dc.view());
      EXPECT(diff_codes<Cast>(download(dcodes), codes) == 0, "cast_encode n=%zu mode=%d: codes differ", n, mode);
      EXPECT(diff_bits(download(dc), cand) == 0, "cast_encode n=%zu mode=%d: candidates differ", n, mode);

      // cast_add: the codes just made (Inf/NaN codes included) plus codes near the top,
      // so that sums overflow to Inf.
      auto in = codes;
      std::uniform_int_distribution<int> u16(0, 0xFFFF);
      for (std::size_t i = 0; i < n; ++i)
        in[i] = (i % 5 == 0) ? static_cast<std::uint16_t>(u16(rng)) : codes[n - 1 - i];
      // The top codes: fp16 65504 + 65504 and bf16 3e38 + 3e38 overflow to Inf.
      if (n > 2) in[1] = Cast::to_code(3.0e38f), codes[1] = Cast::to_code(3.0e38f);
      cp::cuda_buffer<std::uint16_t> din;
      upload(din, in), upload(dcodes, codes);
      H::cast_add<Cast>({}, std::span<const std::uint16_t>(in), std::span<std::uint16_t>(codes));
      D::cast_add<Cast>(E, din.cview(), dcodes.view());
      EXPECT(diff_codes<Cast>(download(dcodes), codes) == 0, "cast_add n=%zu mode=%d: sums differ", n, mode);

      // cast_decode_mean for P = 3: finite sums (mode without NaN) or some non-finite.
      std::vector<std::uint16_t> sums(n);
      for (std::size_t i = 0; i < n; ++i) sums[i] = Cast::to_code(g[i] == g[i] && std::isfinite(g[i]) ? g[i] : 1.0f);
      if (bad) sums[n / 2] = Cast::add(Cast::to_code(3.0e38f), Cast::to_code(3.0e38f));  // an Inf code
      std::vector<float> out(n, std::nanf("")), dpoison = out;
      std::vector<std::uint32_t> hs{0};
      cp::cuda_buffer<std::uint16_t> dsums;
      cp::cuda_buffer<float> dout;
      cp::cuda_buffer<std::uint32_t> dst;
      upload(dsums, sums), upload(dout, out), upload(dst, hs);
      H::cast_decode_mean<Cast>({}, std::span<const std::uint16_t>(sums), std::span<float>(out), 3,
                                std::span<std::uint32_t>(hs));
      D::cast_decode_mean<Cast>(E, dsums.cview(), dout.view(), 3, dst.view());
      EXPECT(diff_bits(download(dout), out) == 0, "cast_decode_mean n=%zu mode=%d: out differs", n, mode);
      EXPECT(download(dst)[0] == hs[0], "cast_decode_mean n=%zu: status %u vs host %u", n, download(dst)[0], hs[0]);
    }
}

//! P vote blocks (frame header + scale + sign bits) of block_floats floats each.
std::vector<float> vote_blocks(std::size_t n, std::size_t P, std::size_t& block_floats, std::mt19937_64& rng) {
  block_floats = (48 + 4 + (n + 7) / 8 + 3) / 4;
  std::vector<float> b(P * block_floats, 0.0f);
  std::uniform_real_distribution<float> sc(0.0f, 2.0f);
  std::bernoulli_distribution coin(0.5);
  for (std::size_t r = 0; r < P; ++r) {
    auto* p = reinterpret_cast<unsigned char*>(b.data() + r * block_floats);
    const auto len = static_cast<std::uint32_t>(4 + (n + 7) / 8);
    std::memcpy(p + 8, &len, 4);
    const float s = r == 1 ? 0.0f : sc(rng);
    std::memcpy(p + 48, &s, 4);
    for (std::size_t i = 0; i < n; ++i)
      if (coin(rng)) p[52 + i / 8] |= static_cast<unsigned char>(1u << (i % 8));
  }
  return b;
}

void check_vote_rows(std::mt19937_64& rng) {
  for (std::size_t n : {1u, 9u, 64u, 100001u}) {
    // signum_update: signSGD (m empty) and beta in {0, 0.9, 1}; Inf and NaN set the status.
    for (float beta : {0.0f, 0.9f, 1.0f})
      for (int mode = 0; mode < 3; ++mode) {  // 0: m empty; 1: with m; 2: with m and a non-finite g
        auto g = values(n, rng, mode == 2);
        std::vector<float> m = mode ? values(n, rng, false) : std::vector<float>{}, next(n, 7.0f);
        std::vector<std::uint32_t> hs{0};
        cp::cuda_buffer<float> dg, dm, dn;
        cp::cuda_buffer<std::uint32_t> dst;
        upload(dg, g), upload(dm, m), upload(dn, next), upload(dst, hs);
        H::signum_update({}, std::span<float>(next), std::span<const float>(m), std::span<const float>(g), beta,
                         std::span<std::uint32_t>(hs));
        D::signum_update(E, dn.view(), dm.cview(), dg.cview(), beta, dst.view());
        EXPECT(diff_nan(download(dn), next) == 0, "signum_update n=%zu beta=%g mode=%d differs", n, beta, mode);
        EXPECT(download(dst)[0] == hs[0], "signum_update status %u vs host %u", download(dst)[0], hs[0]);
      }
    // sign_vote: P = 1..6 (even P ties), scaled or not; then malformed blocks.
    for (std::size_t P = 1; P <= 6; ++P)
      for (int bad = 0; bad < 5; ++bad) {
        std::size_t bf = 0;
        auto blocks = vote_blocks(n, P, bf, rng);
        auto* last = reinterpret_cast<unsigned char*>(blocks.data() + (P - 1) * bf);
        const float neg = -1.0f, nan = std::nanf("");
        const std::uint32_t wrong = 3;
        if (bad == 1) std::memcpy(last + 8, &wrong, 4);                          // payload length
        if (bad == 2) std::memcpy(last + 48, &neg, 4);                           // negative scale
        if (bad == 3) std::memcpy(last + 48, &nan, 4);                           // NaN scale
        if (bad == 4 && n % 8) last[52 + n / 8] |= static_cast<unsigned char>(0x80u);  // bit past n
        for (bool scaled : {true, false}) {
          std::vector<float> out(n, std::nanf("")), hout = out;
          std::vector<std::uint32_t> hs{0};
          cp::cuda_buffer<float> db, dout;
          cp::cuda_buffer<std::uint32_t> dst;
          upload(db, blocks), upload(dout, out), upload(dst, hs);
          H::sign_vote({}, std::span<const float>(blocks), bf, scaled, std::span<float>(hout),
                       std::span<std::uint32_t>(hs));
          D::sign_vote(E, db.cview(), bf, scaled, dout.view(), dst.view());
          EXPECT(diff_bits(download(dout), hout) == 0, "sign_vote n=%zu P=%zu bad=%d scaled=%d: out differs", n, P,
                 bad, int(scaled));
          EXPECT(download(dst)[0] == hs[0], "sign_vote n=%zu P=%zu bad=%d: status %u vs host %u", n, P, bad,
                 download(dst)[0], hs[0]);
          if (bad && (bad != 4 || n % 8)) EXPECT(hs[0] == cp::status_wire, "sign_vote bad=%d not reported", bad);
        }
      }
  }
}

void check_linear_rows(std::mt19937_64& rng) {
  for (std::size_t n : {1u, 10u, 50000u})
    for (bool scaled : {false, true})
      for (int variant = 0; variant < 3; ++variant) {  // 0 clean, 1 a flagged input, 2 a sum that overflowed
        const int flagged = variant == 1;
        cp::randomk_codec kh(0.1, 42, scaled), kd(0.1, 42, scaled);
        kh.begin_step(3), kd.begin_step(3);
        const std::size_t m = kh.size(n);
        auto acc = values(n, rng, false);
        std::vector<std::uint32_t> st{flagged ? cp::status_nonfinite : 0u};
        std::vector<float> block(m + 1, std::nanf(""));
        cp::cuda_buffer<float> dacc, dblock, dout, dapprox, ddense;
        cp::cuda_buffer<std::uint32_t> dst;
        upload(dacc, acc), upload(dblock, block), upload(dst, st);
        H::linear_encode({}, kh, std::span<const float>(acc), std::span<float>(block),
                         std::span<const std::uint32_t>(st));
        D::linear_encode(E, kd, dacc.cview(), dblock.view(), dst.cview());
        EXPECT(diff_bits(download(dblock), block) == 0, "linear_encode n=%zu scaled=%d flagged=%d", n, int(scaled),
               flagged);
        // decode as after an allreduce of P = 3 blocks: the flag summed (0 or 2).
        for (auto& v : block) v *= 3.0f;
        block[m] = flagged ? 2.0f : 0.0f;
        if (variant == 2 && m > 0) block[m / 2] = std::numeric_limits<float>::infinity();
        std::vector<float> out(n, std::nanf(""));
        std::vector<std::uint32_t> hs{0};
        upload(dblock, block), upload(dout, out), upload(dst, hs);
        H::linear_decode({}, kh, std::span<float>(block), std::span<float>(out), 3, std::span<std::uint32_t>(hs));
        D::linear_decode(E, kd, dblock.view(), dout.view(), 3, dst.view());
        EXPECT(diff_bits(download(dout), out) == 0, "linear_decode n=%zu variant=%d: out differs", n, variant);
        EXPECT(diff_bits(download(dblock), block) == 0, "linear_decode n=%zu: the block's mean differs", n);
        EXPECT(download(dst)[0] == hs[0], "linear_decode status %u vs host %u", download(dst)[0], hs[0]);
        if (variant != 0) continue;  // a flagged or overflowed step is never committed (and the host drew no indices)
        H::linear_feedback({}, kh, std::span<float>(acc), std::span<float>{}, std::span<float>{});
        D::linear_feedback(E, kd, dacc.view(), dapprox.view(), ddense.view());
        EXPECT(diff_bits(download(dacc), acc) == 0, "linear_feedback n=%zu: the residual differs", n);
      }
}

//! `steps` steps of compressor Dev over NcclComm::single() against Host over a one-rank
//! ThreadComm, with the same gradients: outputs and residuals bit for bit. `summing`: the
//! compressor's residual sums an entry's gradients until it is delivered, and values()
//! puts 3e38 at the same index every step (two steps overflow to Inf, and host and
//! device alike raise), so such entries are divided by 4 (exact): three steps stay finite.
template <class Dev, class Host, class Make>
void check_steps(const char* what, std::size_t n, int steps, Make make, std::mt19937_64& rng, bool nan_step,
                 bool summing = false) {
  std::vector<std::vector<float>> grads(steps);
  for (auto& g : grads) {
    g = values(n, rng, false);
    if (summing)
      for (auto& x : g)
        if (std::abs(x) > 1e37f) x *= 0.25f;
  }
  if (nan_step) grads[1][n / 2] = std::nanf("");
  std::vector<std::vector<float>> hout(steps), hres(steps);
  std::vector<int> hok(steps);
  cp::run_threads(1, [&](cp::ThreadComm& tc) {
    Host h = make(tc);
    for (int s = 0; s < steps; ++s) {
      hout[s] = grads[s];
      hok[s] = h.reduce(std::span<float>(hout[s]));
      if constexpr (requires { h.residual(); }) hres[s].assign(h.residual().begin(), h.residual().end());
    }
  });
  auto c = cp::NcclComm::single();
  Dev dev = make(c);
  cp::cuda_buffer<float> g;
  for (int s = 0; s < steps; ++s) {
    upload(g, grads[s]);
    const bool ok = dev.reduce(g.view());
    EXPECT(ok == bool(hok[s]), "%s step %d: delivered %d vs host %d", what, s, int(ok), hok[s]);
    EXPECT(diff_bits(download(g), hout[s]) == 0, "%s step %d: the gradient differs from the host", what, s);
    if constexpr (requires { dev.residual(); }) {
      // On the compressor's executor: commit() queued the residual's update there, after
      // finish()'s fence, so a copy on E could overtake it.
      const auto de = cp::comm_exec(dev.comm());
      std::vector<float> res(dev.residual().size());
      if (!res.empty()) D::to_host(de, dev.residual(), std::span<float>(res));
      cp::cuda_space::fence(de, cp::no_deadline());
      EXPECT(diff_bits(res, hres[s]) == 0, "%s step %d: the residual differs from the host", what, s);
    }
  }
}

void check_compressors(std::mt19937_64& rng) {
  const cp::cast_allreduce_options skip{.on_nonfinite = cp::nonfinite::skip_step};
  auto fp16 = [&](auto& c) { return cp::CastAllreduce<cp::fp16_codec, std::remove_cvref_t<decltype(c)>>(c, skip); };
  check_steps<cp::CastAllreduce<cp::fp16_codec, cp::NcclComm>, cp::CastAllreduce<cp::fp16_codec, cp::ThreadComm>>(
      "Fp16Allreduce", 30011, 3, fp16, rng, true);
  auto bf16 = [&](auto& c) { return cp::CastAllreduce<cp::bf16_codec, std::remove_cvref_t<decltype(c)>>(c); };
  check_steps<cp::CastAllreduce<cp::bf16_codec, cp::NcclComm>, cp::CastAllreduce<cp::bf16_codec, cp::ThreadComm>>(
      "Bf16Allreduce", 30011, 3, bf16, rng, false);
  auto lin = [&](auto& c) {
    return cp::LinearCompressor<cp::randomk_codec, std::remove_cvref_t<decltype(c)>>(c, cp::randomk_codec(0.05, 9));
  };
  check_steps<cp::LinearCompressor<cp::randomk_codec, cp::NcclComm>,
              cp::LinearCompressor<cp::randomk_codec, cp::ThreadComm>>("LinearCompressor<randomk>", 20011, 3, lin, rng,
                                                                       false, true);
#if defined(COMMPACT_TEST_MAJORITY)
  auto maj = [&](auto& c) { return cp::MajorityVote<std::remove_cvref_t<decltype(c)>>(c, {.momentum = 0.9f}); };
  check_steps<cp::MajorityVote<cp::NcclComm>, cp::MajorityVote<cp::ThreadComm>>("MajorityVote", 20011, 3, maj, rng,
                                                                                 false);
#else
  std::printf("MajorityVote<NcclComm> not checked: sign_codec has no CUDA codec kernels in this tree\n");
#endif
}

}  // namespace

int main() {
  return commpact_test::run_checks(
      "all cast/vote/gossip/linear/tree_begin row checks passed\n", "%d row checks failed\n", [] {
    E = cp::cuda_space::make_exec();
    auto rng = commpact_test::seeded_rng();
    check_cast_rows<cp::fp16_codec>(rng);
    check_cast_rows<cp::bf16_codec>(rng);
    check_vote_rows(rng);
    check_gossip_rows(rng);
    check_linear_rows(rng);
    check_tree_begin(rng);
    check_compressors(rng);
  });
}
