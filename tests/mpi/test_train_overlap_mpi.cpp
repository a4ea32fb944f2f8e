// commpact-mpi-ranks: 1 2 3 4
// Overlap over MpiComm: DataParallel with a Bucketed compressor whose
// buckets start during a simulated backward (on the reducer's thread; MPI at
// MPI_THREAD_SERIALIZED) gives, bit for bit, the parameters of the plain step, for
// Dense, gTopK and PowerSGD, and every rank holds the same parameters. A NaN on one rank
// raises on every rank and the next steps still agree.
#include <commpact/comm/mpi_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/compressors/bucketed.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <catch2/catch.hpp>

#include "common/random.hpp"

#include <chrono>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>

using namespace commpact;
using namespace std::chrono_literals;

namespace {
const std::vector<tensor_shape> kShapes = {{40, 30}, {40, 1}, {30, 40}, {30, 1}, {10, 30}, {10, 1}};

std::vector<std::size_t> sizes() {
  std::vector<std::size_t> v;
  for (auto s : kShapes) v.push_back(static_cast<std::size_t>(s.numel()));
  return v;
}

std::vector<float> gradient(int rank, int step, std::size_t n) {
  return commpact_test::normal(static_cast<std::uint64_t>(rank * 7919 + step * 104729 + 3), n);
}

template <class C, class Make>
std::vector<float> train(MpiComm& comm, Make make, bool overlap, int steps) {
  const auto layers = sizes();
  const std::size_t n = std::accumulate(layers.begin(), layers.end(), std::size_t{0});
  DataParallel dp{Bucketed<C>{layers, make, {.cap_bytes = 4000}}, EveryStep{}, steps};
  Sgd opt{n, {.momentum = 0.9}};
  std::vector<float> params(n, 0.25f);
  for (int t = 0; t < steps; ++t) {
    auto g = gradient(comm.rank(), t, n);
    if (overlap) {
      dp.begin_backward(g, 0.05);
      for (std::size_t l = layers.size(); l-- > 0;) {
        std::this_thread::sleep_for(200us);  // the layer's backward
        dp.grad_ready(l);
      }
    }
    dp.step(params, g, 0.05, opt);
  }
  return params;
}

void require_same_everywhere(MpiComm& comm, const std::vector<float>& v) {
  std::vector<float> lo = v, hi = v;
  comm.allreduce(std::span<float>(lo), reduce_op::min);
  comm.allreduce(std::span<float>(hi), reduce_op::max);
  REQUIRE(lo == v);
  REQUIRE(hi == v);
}
}  // namespace

TEST_CASE("MPI: DataParallel with overlapped buckets equals the plain step bit for bit", "[mpi][overlap]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 60s}};
  REQUIRE(MpiComm::allows_calls_from_other_threads());
  mpi_guard(comm, [&] {
    {
      auto make = [&](const bucket_info&) { return Dense<MpiComm>{comm}; };
      const auto a = train<Dense<MpiComm>>(comm, make, true, 5), b = train<Dense<MpiComm>>(comm, make, false, 5);
      REQUIRE(a == b);
      require_same_everywhere(comm, a);
    }
    {
      using G = gTopK<TreeComm<MpiComm>>;
      auto make = [&](const bucket_info&) { return G{comm, {.density = 0.05}}; };
      const auto a = train<G>(comm, make, true, 5), b = train<G>(comm, make, false, 5);
      REQUIRE(a == b);
      require_same_everywhere(comm, a);
    }
    {
      auto make = [&](const bucket_info& i) {
        return PowerCompressor<2>{comm, tensor_layout(kShapes.begin() + static_cast<std::ptrdiff_t>(i.first_layer),
                                                      kShapes.begin() + static_cast<std::ptrdiff_t>(i.end_layer))};
      };
      const auto a = train<PowerCompressor<2>>(comm, make, true, 5),
                 b = train<PowerCompressor<2>>(comm, make, false, 5);
      REQUIRE(a == b);
      require_same_everywhere(comm, a);
    }
  });
}

TEST_CASE("MPI: a NaN in an overlapped bucket on one rank raises on every rank, and the next step agrees",
          "[mpi][overlap][errors]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 60s}};
  const auto layers = sizes();
  const std::size_t n = std::accumulate(layers.begin(), layers.end(), std::size_t{0});
  Bucketed<Dense<MpiComm>> b{layers, [&](const bucket_info&) { return Dense<MpiComm>{comm}; }, {.cap_bytes = 4000}};
  auto w = gradient(comm.rank(), 2, n);
  REQUIRE(b.reduce(w));  // a first step: buckets start during backward from the second step on
  auto g = gradient(comm.rank(), 0, n);
  if (comm.rank() == comm.size() - 1) g[0] = std::numeric_limits<float>::quiet_NaN();
  b.begin(g);
  for (std::size_t l = layers.size(); l-- > 0;) b.ready(l);
  REQUIRE_THROWS_AS(b.reduce(g), numeric_error);
  auto h = gradient(comm.rank(), 1, n);
  b.begin(h);
  for (std::size_t l = layers.size(); l-- > 0;) b.ready(l);
  REQUIRE(b.reduce(h));
  std::vector<float> ref = gradient(comm.rank(), 1, n);
  for (std::size_t i = 0; i < b.buckets(); ++i)
    Dense<MpiComm>{comm}.reduce(std::span<float>(ref).subspan(b.bucket(i).offset, b.bucket(i).size));
  REQUIRE(h == ref);
}
