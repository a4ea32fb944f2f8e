// SPDX-License-Identifier: Apache-2.0
// The leaves of device_codec<Codec> for natural_codec, onebit_codec and
// per_tensor<K> (compress/device_codecs_natural.cuh, _onebit.cuh, _per_tensor.cuh)
// against the host codecs, on fresh random inputs (the seed is printed):
// - encode_frame into a poisoned block: the frame byte for byte and approx bit for bit,
//   n from 1 to about 4e6 (around the levels of 1-bit's sums, nodes of 2048), every input kind of
//   codec_test::make_input (Gaussian, ties with +-0, all equal, denormals) and an edge
//   kind (Inf, NaN, values at and past 2^127, the smallest normal and denormals), a
//   status with status_nonfinite (flagged frame) and a rejected input;
// - decode_sum over P = 1, 2, 5 blocks: the host's sum bit for bit, and every kind of
//   malformed payload setting status_wire and a NaN in sum[0] exactly where the host
//   raises wire_error;
// - per_tensor<K> for K = topk, threshold, sign, 1-bit, natural, TernGrad, QSGD and fp16
//   over one-tensor, mixed and split_rows layouts (300 tensors; 1e6 values): the same,
//   with framing corruptions (lengths, trailing bytes) and K's own, and clear_delivered.
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.

#include "commpact/compress/codecs/per_tensor.hpp"
#include "commpact/compress/codecs/sparsifiers.hpp"

#include "codec_test_common.cuh"

using commpact_test::failures;
using namespace codec_test;

namespace {

//! Kind 5 of the inputs: values at the edges of the codecs' ranges.
std::vector<float> make_any(int kind, std::size_t n, std::mt19937_64& rng) {
  auto v = make_input(kind % 5, n, rng);
  if (kind == 5) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const float edge[] = {inf, -inf, nan, -nan, 0x1.0p127f, -0x1.fffffep127f, 0x1.0p-126f, -0x1.0p-149f, 0x1.8p-127f,
                          -0.0f, 0.0f, 3.0f, -3.0f, 0x1.7p-100f, 1.0f + 0x1.0p-23f};
    for (std::size_t i = 0; i < n; ++i) v[i] = edge[(i + rng() % 3) % (sizeof(edge) / sizeof(float))];
  }
  return v;
}

//! Prepares codec copies the way CodecCompressor does (bind_rank, begin_step).
template <class Codec>
void prepare(Codec& c, int rank, std::int64_t step) {
  if constexpr (cp::req::codec_has_bind_rank<Codec>) c.bind_rank(rank);
  if constexpr (cp::req::codec_has_begin_step<Codec>) c.begin_step(step);
}

//! encode_frame on the device against the host (st 0: clean, 1: status_nonfinite, 2: a
//! rejected input), then (st 0) clear_delivered on random residual and velocity.
template <class Codec>
void check_encode(const char* who, const Codec& proto, std::size_t n, int kind, std::mt19937_64& rng) {
  for (int st = 0; st < 3; ++st) {
    const auto v = make_any(kind, n, rng);
    Codec hc = proto, dc = proto;
    prepare(hc, 2, 7), prepare(dc, 2, 7);
    const std::size_t cap = (48 + hc.max_encoded_bytes(n) + 3) / 4 * 4;
    cp::frame::header h;
    h.n = static_cast<std::int64_t>(n), h.step = 7, h.capacity = static_cast<std::int64_t>(cap);
    if (st == 2) h.flags = cp::frame::rejected_input;
    const bool dense = !cp::req::codec_has_delivered<Codec>;
    cp::ops<cp::cuda_space>::codec_workspace<Codec> dk;
    const auto f =
        encode_both(dk, hc, dc, v, h, cap, st == 1 ? std::uint32_t{cp::status_nonfinite} : 0u, dense ? n : 0);
    EXPECT(diff(f.dev, f.host) == 0, "%s encode_frame n=%zu kind=%d st=%d: %zu words differ", who, n, kind, st,
           diff(f.dev, f.host));
    if (st != 0) continue;
    EXPECT(diff(f.dev_approx, f.host_approx) == 0, "%s encode_frame n=%zu kind=%d: approx differs", who, n, kind);
    EXPECT(clear_delivered_same(dk, hc, dc, n, rng), "%s clear_delivered n=%zu kind=%d: residual or velocity differs",
           who, n, kind);
  }
}

//! decode_sum over P blocks the host encoded (rank r from input kind r % 6), block P - 1
//! corrupted by `corrupt(kind, words, payload bytes, capacity bytes, n)` (false: the kind does
//! not apply). status_wire and sum[0] NaN exactly where the host raises; else the sum's bits.
//! Returns whether the host raised.
template <class Codec, class Corrupt>
bool check_decode(const char* who, const Codec& proto, std::size_t n, int kind, int P, Corrupt corrupt,
                  std::mt19937_64& rng) {
  Codec hc = proto;
  const std::size_t cap = (48 + hc.max_encoded_bytes(n) + 3) / 4 * 4, bf = cap / 4;
  const auto input = [&](int r) {
    auto v = make_any(r % 6, n, rng);
    for (auto& x : v) x = std::isfinite(x) ? x : 1.5f;  // the compressor sends no Inf or NaN
    return v;
  };
  auto all = host_frames(hc, n, P, cap, input, [](Codec& c, int r) { prepare(c, r, 1); });
  auto* w = reinterpret_cast<std::uint32_t*>(all.data()) + static_cast<std::size_t>(P - 1) * bf;
  if (kind != 0 && !corrupt(kind, w, w[2], cap, n)) return false;
  const auto [host_raised, stw, sum, hsum] = decode_both(hc, all, bf, n);
  EXPECT(((stw & cp::status_wire) != 0) == host_raised, "%s kind %d n=%zu P=%d: status %u, host raised %d", who, kind,
         n, P, stw, int(host_raised));
  if (host_raised) EXPECT(std::isnan(sum[0]), "%s kind %d n=%zu P=%d: sum[0] is not NaN", who, kind, n, P);
  else EXPECT(diff(sum, hsum) == 0, "%s kind %d n=%zu P=%d: the sum differs in %zu places", who, kind, n, P,
              diff(sum, hsum));
  return host_raised;
}

// natural: 1 length; 2 code 255 in the last field; 3 a sign on code 0; 4 a padding bit.
bool natural_corrupt(int kind, std::uint32_t* w, std::size_t, std::size_t, std::size_t n) {
  auto* p = reinterpret_cast<unsigned char*>(w + 12);
  auto set_field = [&](std::size_t i, std::uint32_t f) {
    for (unsigned k = 0; k < 9; ++k) {
      const std::size_t bit = 9 * i + k;
      p[bit / 8] = static_cast<unsigned char>((p[bit / 8] & ~(1u << (bit % 8))) | (((f >> k) & 1u) << (bit % 8)));
    }
  };
  switch (kind) {
    case 1: w[2] -= 1; return true;
    case 2: set_field(n - 1, 0xFFu); return true;
    case 3: set_field(0, 0x100u); return true;
    default:
      if ((9 * n) % 8 == 0) return false;
      p[(9 * n) / 8] |= 0x80u;
      return true;
  }
}

// 1-bit: 1 length (one byte short); 2 NaN first mean; 3 first mean -1; 4 second mean +1; 5 second mean -Inf; 6 a padding bit.
bool onebit_corrupt(int kind, std::uint32_t* w, std::size_t, std::size_t, std::size_t n) {
  switch (kind) {
    case 1: w[2] -= 1; return true;
    case 2: w[12] = 0x7FC00000u; return true;
    case 3: w[12] = 0xBF800000u; return true;
    case 4: w[13] = 0x3F800000u; return true;
    case 5: w[13] = 0xFF800000u; return true;
    default:
      if (n % 8 == 0) return false;
      reinterpret_cast<unsigned char*>(w + 14)[n / 8] |= 0x80u;
      return true;
  }
}

// per_tensor: 1 the outer length one short; 2 tensor 0's length 0xFFFFFFFF; 3 tensor 0's
// length + 1; 4 the first word of tensor 0's message a NaN (K's own check, where it has
// one); 5 a trailing zero byte; 6 the last byte of the message flipped (K's padding or
// values: the host decides).
bool per_tensor_corrupt(int kind, std::uint32_t* w, std::size_t payload, std::size_t cap, std::size_t) {
  auto* p = reinterpret_cast<unsigned char*>(w + 12);
  std::uint32_t l0;
  std::memcpy(&l0, p, 4);
  switch (kind) {
    case 1: w[2] -= 1; return true;
    case 2: std::memset(p, 0xFF, 4); return true;
    case 3: l0 += 1, std::memcpy(p, &l0, 4); return true;
    case 4:
      if (l0 < 4) return false;
      p[4] = 0x00, p[5] = 0x00, p[6] = 0xC0, p[7] = 0x7F;
      return true;
    case 5:
      if (48 + payload + 1 > cap) return false;
      p[payload] = 0, w[2] += 1;
      return true;
    default:
      if (payload == 0) return false;
      p[payload - 1] ^= 0x80u;
      return true;
  }
}

template <class K>
void check_per_tensor(const char* who, const K& k, std::mt19937_64& rng) {
  const std::vector<cp::tensor_layout> layouts = {
      {{1, 1}}, {{2}}, {{17}}, {{3, 4}, {5}, {1, 1000}, {7, 1}}, cp::split_rows({{300, 7}, {300}}), {{1000, 1000}}};
  for (const auto& l : layouts) {
    const cp::per_tensor<K> pc{l, k};
    const std::size_t n = pc.size();
    // Sparse K: no Inf or NaN (the compressor flags them before K sees them; top-k's order of NaN is its own).
    for (int kind = 0; kind < (cp::req::codec_has_delivered<K> ? 5 : 6); ++kind) check_encode(who, pc, n, kind, rng);
    if (n > 100000) continue;
    int raised = 0;
    for (int kind = 0; kind < 7; ++kind)
      for (int P : {1, 2, 5}) raised += check_decode(who, pc, n, kind, P, per_tensor_corrupt, rng);
    EXPECT(raised >= 6, "%s n=%zu: only %d corrupted messages were rejected", who, n, raised);
  }
}

}  // namespace

int main() {
  return commpact_test::run_checks("all device codec leaf checks passed\n", "%d device codec leaf checks failed\n", [] {
    E = cp::cuda_space::make_exec();
    auto rng = commpact_test::seeded_rng();
    for (std::size_t n : {1, 2, 8, 17, 1000, 2047, 2048, 2049, 65537, (1 << 22) + 3})
      for (int kind = 0; kind < 6; ++kind) {
        check_encode("natural", cp::natural_codec{11}, n, kind, rng);
        check_encode("1-bit", cp::onebit_codec{}, n, kind, rng);
      }
    for (std::size_t n : {1, 2, 8, 17, 1000, 4099})
      for (int P : {1, 2, 5}) {
        for (int kind = 0; kind < 5; ++kind) {
          const bool r = check_decode("natural", cp::natural_codec{11}, n, kind, P, natural_corrupt, rng);
          EXPECT(r == (kind != 0) || (kind == 4 && (9 * n) % 8 == 0), "natural kind %d n=%zu: host raised %d", kind,
                 n, int(r));
        }
        for (int kind = 0; kind < 7; ++kind) {
          const bool r = check_decode("1-bit", cp::onebit_codec{}, n, kind, P, onebit_corrupt, rng);
          EXPECT(r == (kind != 0) || (kind == 6 && n % 8 == 0), "1-bit kind %d n=%zu: host raised %d", kind, n, int(r));
        }
      }
    check_per_tensor("per_tensor<topk>", cp::topk_codec{0.05}, rng);
    check_per_tensor("per_tensor<threshold>", cp::threshold_codec{1.0f, 0.2}, rng);
    check_per_tensor("per_tensor<sign>", cp::sign_codec{}, rng);
    check_per_tensor("per_tensor<1-bit>", cp::onebit_codec{}, rng);
    check_per_tensor("per_tensor<natural>", cp::natural_codec{5}, rng);
    check_per_tensor("per_tensor<TernGrad>", cp::terngrad_codec{3}, rng);
    check_per_tensor("per_tensor<QSGD>", cp::qsgd_codec{16, 3, 64}, rng);
    check_per_tensor("per_tensor<fp16>", cp::fp16_codec{}, rng);
  });
}
