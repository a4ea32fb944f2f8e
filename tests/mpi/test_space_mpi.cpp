// commpact-mpi-ranks: 1 2 3 4
// The v3 spaces under mpiexec: the compressors and the training driver over
// DeferredComm<MpiComm> (every kernel and collective queued until the fence) give, on
// every rank, the bits they give over MpiComm in host_space, and the same bits on every
// rank; a NaN on one rank raises numeric_error on every rank in both spaces.
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/codecs/per_tensor.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "common/random.hpp"
#include "common/space_copies.hpp"

using namespace commpact;
using namespace std::chrono_literals;
using commpact_test::normal;
using commpact_test::same_bits;

namespace {

constexpr std::size_t n = 1000;
using DM = DeferredComm<MpiComm>;

MpiComm world() { return MpiComm{MPI_COMM_WORLD, {.timeout = 60s}}; }

template <bool Deferred>
auto comm_in_space(const MpiComm& c, const deferred_space::exec& e) {
  if constexpr (Deferred) return DM{c, e};
  else return c;
}

// `steps` reductions of rank-dependent gradients through Make's compressor, in host_space
// or the deferred space; the outputs of every step, concatenated, on the host.
template <bool Deferred, class Make>
std::vector<float> reduce_steps(const MpiComm& c, Make make, int steps, int nan_rank = -1) {
  auto comp = make(comm_in_space<Deferred>(c, deferred_space::make_exec()));
  using S = space_of_t<decltype(comp)>;
  const auto e = comm_exec(comp.comm());
  typename S::template buffer<float> g;
  g.resize(n);
  std::vector<float> out;
  for (int t = 0; t < steps; ++t) {
    auto h = normal(100 + 31 * static_cast<std::uint64_t>(c.rank()) + static_cast<std::uint64_t>(t), n);
    if (c.rank() == nan_rank && t == 1) h[5] = std::numeric_limits<float>::quiet_NaN();
    ops<S>::from_host(e, std::span<const float>(h), g.view());
    S::fence(e, no_deadline());
    comp.reduce(g.view());
    std::vector<float> r(n);
    ops<S>::to_host(e, g.cview(), std::span<float>(r));
    S::fence(e, no_deadline());
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

// Every rank holds the same bits: rank 0's vector is broadcast and compared.
bool same_on_every_rank(MpiComm& c, const std::vector<float>& v) {
  std::vector<float> root = v;
  c.broadcast(std::span<float>(root), 0);
  std::int64_t ok = same_bits(root, v) ? 1 : 0;
  c.allreduce(std::span<std::int64_t>(&ok, 1), reduce_op::min);
  return ok == 1;
}

template <class Make>
void check_spaces(MpiComm& c, Make make, bool ranks_equal = true) {
  const auto h = reduce_steps<false>(c, make, 4);
  const auto d = reduce_steps<true>(c, make, 4);
  CHECK(same_bits(h, d));
  if (ranks_equal) CHECK(same_on_every_rank(c, h));
}

}  // namespace

TEST_CASE("MPI: compressors over DeferredComm<MpiComm> equal host_space bit for bit", "[mpi][space]") {
  auto c = world();
  REQUIRE_NOTHROW(mpi_guard(c, [&] {
    check_spaces(c, [](auto comm) { return Dense<decltype(comm)>{comm}; });
    check_spaces(c, [](auto comm) { return TopK<decltype(comm)>{comm, {.density = 0.02}}; });
    check_spaces(c, [](auto comm) {
      return TopK<decltype(comm)>{comm, {.density = 0.02, .momentum = 0.9f, .clip_norm = 5.0f}};
    });
    check_spaces(c, [](auto comm) { return gTopK<TreeComm<decltype(comm)>>{comm, {.density = 0.02}}; });
    check_spaces(c, [](auto comm) {
      return CodecCompressor<per_tensor<sign_codec>, Allgather<decltype(comm)>>{
          comm, per_tensor<sign_codec>{split_rows({{20, 40}, {40}, {4, 40}})}};
    });
    check_spaces(c, [](auto comm) { return CodecCompressor<qsgd_codec, Allgather<decltype(comm)>>{comm, qsgd_codec{16, 3}}; });
  }));
}

TEST_CASE("MPI: a NaN on one rank raises numeric_error on every rank in both spaces", "[mpi][space]") {
  auto c = world();
  const int last = c.size() - 1;
  auto topk = [](auto comm) { return TopK<decltype(comm)>{comm, {.density = 0.02}}; };
  auto gtopk = [](auto comm) { return gTopK<TreeComm<decltype(comm)>>{comm, {.density = 0.02}}; };
  CHECK_THROWS_AS(reduce_steps<false>(c, topk, 3, last), numeric_error);
  CHECK_THROWS_AS(reduce_steps<true>(c, topk, 3, last), numeric_error);
  CHECK_THROWS_AS(reduce_steps<false>(c, gtopk, 3, last), numeric_error);
  CHECK_THROWS_AS(reduce_steps<true>(c, gtopk, 3, last), numeric_error);
  c.barrier();  // the communicator is still usable
}

TEST_CASE("MPI: DataParallel with Local SGD over DeferredComm<MpiComm> equals host_space", "[mpi][space][train]") {
  auto c = world();
  auto run = [&]<bool Deferred>() {
    DataParallel dp{Dense{comm_in_space<Deferred>(c, deferred_space::make_exec())}, LocalSgd{3}, 9,
                    {.average_optimizer_state = true}};
    using S = typename decltype(dp)::space_type;
    const auto e = comm_exec(dp.comm());
    BasicSgd<S> sgd{n, {.momentum = 0.9}, e};
    typename S::template buffer<float> x, g;
    x.resize(n);
    g.resize(n);
    const auto x0 = normal(5, n);
    ops<S>::from_host(e, std::span<const float>(x0), x.view());
    for (int t = 0; t < 9; ++t) {
      const auto h = normal(700 + 13 * static_cast<std::uint64_t>(c.rank()) + static_cast<std::uint64_t>(t), n);
      ops<S>::from_host(e, std::span<const float>(h), g.view());
      S::fence(e, no_deadline());
      dp.step(x.view(), g.view(), 0.05, sgd);
    }
    std::vector<float> out(n);
    ops<S>::to_host(e, x.cview(), std::span<float>(out));
    S::fence(e, no_deadline());
    return out;
  };
  REQUIRE_NOTHROW(mpi_guard(c, [&] {
    const auto h = run.template operator()<false>();
    const auto d = run.template operator()<true>();
    CHECK(same_bits(h, d));
    CHECK(same_on_every_rank(c, h));  // the run ends on a period boundary: averaged parameters
  }));
}
