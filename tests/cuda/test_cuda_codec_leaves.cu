// SPDX-License-Identifier: Apache-2.0
// The leaf kernels of device_codec<Codec> (compress/device_codecs.cuh)
// against the host codecs, for topk_codec, threshold_codec, sign_codec, fp16/bf16,
// TernGrad and QSGD:
// encode_frame's frame (and approx) byte for byte on Gaussian, tied, all-equal, +-0,
// denormal and edge inputs, with a status flagging a NaN and a rejected input;
// decode_sum's sum bit for bit over several blocks, and every kind of malformed payload
// setting status_wire (and a NaN in the sum) where the host raises wire_error;
// clear_delivered's residual and velocity.
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.

#include "codec_test_common.cuh"

using commpact_test::failures;
using namespace codec_test;

namespace {

//! A sparse codec's encode_frame on the device against the host, frame byte for byte (a
//! clean status, one with status_nonfinite, a rejected input), then clear_delivered.
template <class Codec>
void check_sparse_encode(const char* who, Codec proto, std::size_t n, int kind, std::mt19937_64& rng) {
  for (int st : {0, 1, 2}) {  // 0: clean, 1: status_nonfinite, 2: rejected (h.flags)
    const auto v = make_input(kind, n, rng);
    Codec hc = proto, dc = proto;
    const std::size_t cap = (48 + hc.max_encoded_bytes(n) + 3) / 4 * 4;
    cp::frame::header h;
    h.n = static_cast<std::int64_t>(n), h.agreement = hc.agreement(n), h.step = 3;
    h.capacity = static_cast<std::int64_t>(cap);
    if (st == 2) h.flags = cp::frame::rejected_input;
    cp::ops<cp::cuda_space>::codec_workspace<Codec> dk;
    const auto f = encode_both(dk, hc, dc, v, h, cap, st == 1 ? std::uint32_t{cp::status_nonfinite} : 0u, 0);
    EXPECT(diff(f.dev, f.host) == 0, "%s encode_frame n=%zu kind=%d st=%d: %zu words differ", who, n, kind, st,
           diff(f.dev, f.host));
    if (st != 0) continue;
    EXPECT(clear_delivered_same(dk, hc, dc, n, rng), "%s clear_delivered n=%zu kind=%d: residual or velocity differs",
           who, n, kind);
  }
}

//! top-k with k from 1 to n; the hard threshold below, at and above the inputs' ties, with
//! and without a cap (more candidates than the cap, fewer, none).
void check_encode(std::mt19937_64& rng) {
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}})
    for (int kind = 0; kind < 5; ++kind) {
      for (double density : {1e-3, 0.05, 0.5, 1.0}) check_sparse_encode("topk", cp::topk_codec{density}, n, kind, rng);
      for (float lambda : {1e-41f, 0.5f, 1.0f, 2.5f, 100.0f})
        for (double max_density : {0.01, 0.2, 1.0})
          check_sparse_encode("threshold", cp::threshold_codec{lambda, max_density}, n, kind, rng);
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
      const auto [host_raised, st, sum, hsum] = decode_both(codec, all, all.size() / static_cast<std::size_t>(P), n);
      EXPECT(host_raised == (kind != 0), "kind %d P=%d: the host %s", kind, P, host_raised ? "raised" : "did not raise");
      EXPECT(((st & cp::status_wire) != 0) == host_raised, "kind %d P=%d: status %u, host raised %d", kind, P, st,
             int(host_raised));
      if (host_raised) EXPECT(std::isnan(sum[0]), "kind %d P=%d: sum[0] = %g is not NaN after a wire error", kind, P, sum[0]);
      else EXPECT(diff(sum, hsum) == 0, "kind %d P=%d: the sum differs in %zu places", kind, P, diff(sum, hsum));
    }
}

//! sign_codec's leaves: encode_frame (frame and approx byte for byte; n around the
//! levels of the scale's sum, kernels/fixed_sum.hpp's nodes of 2048 values; every input kind; a status with
//! status_nonfinite; a rejected input) and decode_sum (valid blocks: the host's sum bit
//! for bit; a wrong length, a NaN, Inf or negative scale, sign bits past n: status_wire
//! where the host raises wire_error).
void check_sign_leaves(std::mt19937_64& rng) {
  cp::sign_codec codec;
  cp::ops<cp::cuda_space>::codec_workspace<cp::sign_codec> dk;
  for (std::size_t n : {1, 7, 8, 9, 2047, 2048, 2049, 3 * 2048 + 17, 100003, (1 << 22) + 3})
    for (int kind = 0; kind < 5 && n <= commpact_test::max_n(); ++kind)
      for (int st = 0; st < 3; ++st) {
        const auto v = make_input(kind, n, rng);
        const std::size_t cap = (48 + codec.max_encoded_bytes(n) + 3) / 4 * 4;
        cp::frame::header h;
        h.n = static_cast<std::int64_t>(n), h.step = 1, h.capacity = static_cast<std::int64_t>(cap);
        if (st == 2) h.flags = cp::frame::rejected_input;
        const auto f = encode_both(dk, codec, codec, v, h, cap, st == 1 ? std::uint32_t{cp::status_nonfinite} : 0u, n);
        EXPECT(diff(f.dev, f.host) == 0, "sign encode_frame n=%zu kind=%d st=%d: %zu words differ", n, kind, st,
               diff(f.dev, f.host));
        if (st == 0)
          EXPECT(diff(f.dev_approx, f.host_approx) == 0, "sign encode_frame n=%zu kind=%d: approx differs in %zu", n,
                 kind, diff(f.dev_approx, f.host_approx));
      }
  // decode_sum: P blocks from random inputs; kind 0 valid, then one malformed block.
  for (std::size_t n : {5, 8, 1000, 4099})
    for (int kind = 0; kind < 6; ++kind)
      for (int P : {1, 2, 5}) {
        const std::size_t cap = (48 + codec.max_encoded_bytes(n) + 3) / 4 * 4, bf = cap / 4;
        auto all = host_frames(codec, n, P, cap, [&](int r) { return make_input(r % 5, n, rng); }, no_prep);
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
        const auto [host_raised, stw, sum, hsum] = decode_both(codec, all, bf, n);
        EXPECT(host_raised == (kind != 0), "sign kind %d n=%zu P=%d: the host %s", kind, n, P,
               host_raised ? "raised" : "did not raise");
        EXPECT(((stw & cp::status_wire) != 0) == host_raised, "sign kind %d n=%zu P=%d: status %u", kind, n, P, stw);
        if (host_raised) EXPECT(std::isnan(sum[0]), "sign kind %d n=%zu P=%d: sum[0] is not NaN", kind, n, P);
        else EXPECT(diff(sum, hsum) == 0, "sign n=%zu P=%d: the sum differs in %zu places", n, P, diff(sum, hsum));
      }
}

//! The leaves of a dense codec (fp16, bf16, TernGrad, QSGD): encode_frame (frame and approx byte
//! for byte, inputs of every kind plus saturating, rounding-tie, Inf and NaN values) and
//! decode_sum (the host's sum bit for bit; kinds 1.. of `corrupt(kind, block words, n)`,
//! which returns false where a kind does not apply: status_wire where the host raises
//! wire_error).
template <class Codec, class Corrupt>
void check_dense_leaves(const char* who, Codec codec, int kinds, Corrupt corrupt, std::mt19937_64& rng) {
  cp::ops<cp::cuda_space>::codec_workspace<Codec> dk;
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
      const auto f = encode_both(dk, codec, codec, v, h, cap, 0, n);
      EXPECT(diff(f.dev, f.host) == 0, "%s encode_frame n=%zu kind=%d: %zu words differ", who, n, kind,
             diff(f.dev, f.host));
      EXPECT(diff(f.dev_approx, f.host_approx) == 0, "%s encode_frame n=%zu kind=%d: approx differs", who, n, kind);
    }
  for (std::size_t n : {1, 3, 4, 1000, 1001})
    for (int kind = 0; kind < kinds; ++kind)
      for (int P : {1, 3}) {
        const std::size_t cap = (48 + codec.max_encoded_bytes(n) + 3) / 4 * 4, bf = cap / 4;
        auto all = host_frames(codec, n, P, cap, [&](int r) { return make_input(r % 5, n, rng); }, no_prep);
        auto* w = reinterpret_cast<std::uint32_t*>(all.data()) + static_cast<std::size_t>(P - 1) * bf;
        if (kind != 0 && !corrupt(kind, w, n)) continue;
        const auto [host_raised, stw, sum, hsum] = decode_both(codec, all, bf, n);
        EXPECT(host_raised == (kind != 0), "%s kind %d n=%zu P=%d: the host %s", who, kind, n, P,
               host_raised ? "raised" : "did not raise");
        EXPECT(((stw & cp::status_wire) != 0) == host_raised, "%s kind %d n=%zu P=%d: status %u", who, kind, n,
               P, stw);
        if (host_raised) EXPECT(std::isnan(sum[0]), "%s kind %d: sum[0] is not NaN", who, kind);
        else EXPECT(diff(sum, hsum) == 0, "%s n=%zu P=%d: the sum differs in %zu places", who, n, P,
                    diff(sum, hsum));
      }
}


}  // namespace

int main() {
  return commpact_test::run_checks("all device codec leaf checks passed\n", "%d device codec leaf checks failed\n", [] {
    E = cp::cuda_space::make_exec();
    auto rng = commpact_test::seeded_rng();
    check_encode(rng);
    check_decode(rng);
    check_sign_leaves(rng);
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
    // QSGD: kind 1: length; 2: NaN norm; 3: -1 norm; 4: field 0 a sign on level 0; 5: a padding bit
    // Buckets of 512, 7, n (d = 0), 100 and 3000 values (two levels of kernels/fixed_sum.hpp's
    // shape per bucket, the last bucket shorter).
    for (auto q : {cp::qsgd_codec{1, 9}, cp::qsgd_codec{5, 1, 7}, cp::qsgd_codec{256, 3, 0},
                   cp::qsgd_codec{65535, 3, 100}, cp::qsgd_codec{16, 5, 3000}}) {
      q.begin_step(2), q.bind_rank(1);
      const auto qsgd_corrupt = [q](int kind, std::uint32_t* w, std::size_t n) {
        const std::size_t nb = q.buckets(n);
        const unsigned fw = q.field_bits();
        auto* fields = reinterpret_cast<unsigned char*>(w + 12 + nb);
        switch (kind) {
          case 1: w[2] -= 1; return true;
          case 2: w[12] = 0x7FC00000u; return true;
          case 3: w[12] = 0xBF800000u; return true;
          case 4:
            for (unsigned bit = 0; bit < fw; ++bit) fields[bit / 8] &= static_cast<unsigned char>(~(1u << (bit % 8)));
            fields[(fw - 1) / 8] |= static_cast<unsigned char>(1u << ((fw - 1) % 8));
            return true;
          default:
            if ((n * fw) % 8 == 0) return false;
            fields[(n * fw) / 8] |= 0x80u;
            return true;
        }
      };
      check_dense_leaves("QSGD", q, 6, qsgd_corrupt, rng);
    }
  });
}
