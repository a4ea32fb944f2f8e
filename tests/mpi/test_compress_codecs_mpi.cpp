// commpact-mpi-ranks: 1 2 3 5 8
// The survey's compressors under mpiexec: CodecCompressor<codec, Allgather<commpact_test::checked_mpi_comm>> for
// the quantisers, EF-SignSGD and the threshold sparsifiers, LinearCompressor<randomk>
// MajorityVote, and CastAllreduce (fp16/bf16 summed in the 16-bit type by the ring over
// MpiComm's isend/irecv). Each rank replays every rank's codec serially (gradients seeded by
// rank; the codecs themselves were checked against brute-force references in
// tests/test_compress_quantizers.cpp and test_compress_sparsifiers.cpp) and must get the
// compressor's output bit for bit; every rank's output is also compared with rank 0's.
// The communicator is CheckedComm over an unchecked MpiComm (tests/common/checked_mpi.hpp).
#include <commpact/comm/mpi_comm.hpp>
#include <commpact/compress/compressors/cast_allreduce.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/compressors/majority.hpp>
#include <commpact/compress/compressors/oktopk.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/sparsifiers.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "common/checked_mpi.hpp"

using namespace commpact;
using namespace std::chrono_literals;

namespace {
using vec = std::vector<float>;
vec grad(int s, int r, std::size_t n) {
  std::mt19937_64 g(1000 * s + r);
  std::normal_distribution<float> d(0.f, 0.01f);
  vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

//! The same output bits on every rank (rank 0's, broadcast).
void same_everywhere(commpact_test::checked_mpi_comm& comm, const vec& v) {
  vec root = v;
  comm.broadcast(std::span<float>(root), 0);
  CHECK(root == v);
}

template <class K>
void check_codec(commpact_test::checked_mpi_comm& comm, const K& proto) {
  const int P = comm.size();
  const std::size_t n = 333;
  const int steps = 3;
  CodecCompressor<K, Allgather<commpact_test::checked_mpi_comm>> c{comm, proto};
  std::vector<vec> e(P, vec(n, 0.0f));
  for (int s = 0; s < steps; ++s) {
    vec g = grad(s, comm.rank(), n);
    REQUIRE(c.reduce(std::span<float>(g)));
    vec sum(n, 0.0f);
    for (int r = 0; r < P; ++r) {  // the serial replay of rank r's codec
      K k = proto;
      if constexpr (req::codec_has_begin_step<K>) k.begin_step(s);
      if constexpr (req::codec_has_bind_rank<K>) k.bind_rank(r);
      const vec gr = grad(s, r, n);
      vec acc(n), q(n);
      for (std::size_t i = 0; i < n; ++i) acc[i] = e[r][i] + gr[i];
      std::vector<std::byte> msg(k.max_encoded_bytes(n));
      k.encode(acc, msg, q);
      for (std::size_t i = 0; i < n; ++i) e[r][i] = acc[i] - q[i], sum[i] += q[i];
    }
    for (auto& x : sum) x = x / float(P);
    CHECK(g == sum);
    same_everywhere(comm, g);
  }
}
}  // namespace

TEST_CASE("MPI: CodecCompressor with each new codec equals the serial replay on every rank", "[mpi][codec]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] {
    check_codec(comm, qsgd_codec{16, 5});
    check_codec(comm, terngrad_codec{5});
    check_codec(comm, onebit_codec{});
    check_codec(comm, natural_codec{5});
    check_codec(comm, fp16_codec{});
    check_codec(comm, bf16_codec{});
    check_codec(comm, sign_codec{});
    check_codec(comm, threshold_codec{0.02f, 0.05});
    check_codec(comm, gaussiank_codec{0.02});
    check_codec(comm, dgc_codec{0.02, 0.1, 5});
  }));
}

TEST_CASE("MPI: random-k's allreduce and the majority vote give every rank the same bits", "[mpi][randomk][majority]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] {
    const std::size_t n = 500;
    LinearCompressor<randomk_codec, commpact_test::checked_mpi_comm> rk{comm, randomk_codec{0.05, 3}};
    MajorityVote<commpact_test::checked_mpi_comm> mv{comm, {.momentum = 0.9f}};
    for (int s = 0; s < 3; ++s) {
      vec g = grad(s, comm.rank(), n), h = g;
      REQUIRE(rk.reduce(std::span<float>(g)));
      REQUIRE(mv.reduce(std::span<float>(h)));
      same_everywhere(comm, g);
      same_everywhere(comm, h);
      CHECK(std::count_if(g.begin(), g.end(), [](float x) { return x != 0.0f; }) <= 25);
    }
  }));
}

TEST_CASE("MPI: OkTopK gives every rank the same bits and conserves", "[mpi][oktopk]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] {
    const std::size_t n = 3000;
    OkTopK<commpact_test::checked_mpi_comm> ok{comm, {.density = 0.02, .period = 2}};
    double in = 0, out = 0;
    for (int s = 0; s < 4; ++s) {
      vec g = grad(s, comm.rank(), n);
      for (float x : g) in += x;
      REQUIRE(ok.reduce(std::span<float>(g)));
      same_everywhere(comm, g);
      for (float x : g) out += x;
      CHECK(std::count_if(g.begin(), g.end(), [](float x) { return x != 0.0f; }) <= 2 * 60);
    }
    double res = 0;
    for (float x : ok.residual()) res += x;
    double t[2] = {in, res};
    comm.allreduce(std::span<double>(t, 2), reduce_op::sum);
    // sum over ranks and steps of g = P x (sum of the outputs) + sum of the residuals
    CHECK(std::abs(t[0] - comm.size() * out - t[1]) <= 1e-3 * (1 + std::abs(t[0])));
  }));
}

TEST_CASE("MPI: CastAllreduce sums in the 16-bit type in the ring's order, the same bits on every rank",
          "[mpi][cast_allreduce]") {
  auto comm = commpact_test::checked_mpi_world(60s);
  REQUIRE_NOTHROW(mpi_guard(comm, [&] {
    const int P = comm.size();
    const std::size_t n = 1001;
    Fp16Allreduce<commpact_test::checked_mpi_comm> c{comm};
    std::vector<vec> res(P, vec(n, 0.0f));
    for (int s = 0; s < 3; ++s) {
      vec g = grad(s, comm.rank(), n);
      REQUIRE(c.reduce(std::span<float>(g)));
      // the serial replay: every rank's codes, then chunk c summed over ranks c, c + 1, ...
      std::vector<std::vector<std::uint16_t>> codes(P, std::vector<std::uint16_t>(n));
      for (int r = 0; r < P; ++r) {
        const vec gr = grad(s, r, n);
        for (std::size_t i = 0; i < n; ++i) {
          const float a = gr[i] + res[r][i];
          codes[r][i] = fp16_codec::to_code(a);
          res[r][i] = a - fp16_codec::from_code(codes[r][i]);
        }
      }
      std::size_t at = 0;
      for (int ch = 0; ch < P; ++ch) {
        const std::size_t len = wire::ring_chunk(n, P, ch);
        for (std::size_t i = at; i < at + len; ++i) {
          std::uint16_t sum = codes[ch][i];
          for (int j = 1; j < P; ++j) sum = fp16_codec::add(sum, codes[(ch + j) % P][i]);
          REQUIRE(g[i] == mean_of(fp16_codec::from_code(sum), P));
        }
        at += len;
      }
      same_everywhere(comm, g);
    }
    CHECK(std::vector<float>(c.residual().begin(), c.residual().end()) == res[comm.rank()]);
  }));
}
