// commpact-mpi-ranks: 2 3 4 8
// CheckedComm over an UNCHECKED MpiComm (verify_collectives = false) inside compressors and
// the training driver: two buckets (10000 and 10 floats) have agreed their lengths, then
// rank 0 reduces the small bucket while the others reduce the large one. No compressor
// re-agrees, so without the decorator this reaches MPI as 10 against 10000 floats
// (undefined behaviour; OpenMPI corrupts its heap). With it every rank raises
// mismatch_error quickly (the check, not the deadline), both buckets' states are
// unchanged, and the next good steps equal those of twins that never saw the bad step.
// The ThreadComm twin is tests/test_compress_checked.cpp.
#include <commpact/comm/mpi_comm.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/majority.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <span>
#include <vector>

#include "common/checked_mpi.hpp"
#include "common/checked_runs.hpp"

using namespace commpact;
using namespace std::chrono_literals;
using commpact_test::checked_mpi_comm;

namespace {

//! DataParallel<Dense> on one parameter buffer, as a bucket (see test_compress_checked.cpp).
struct dp_bucket {
  DataParallel<Dense<checked_mpi_comm>, EveryStep> dp;
  std::vector<float> x;
  Sgd sgd;
  dp_bucket(checked_mpi_comm c, std::size_t n) : dp{Dense<checked_mpi_comm>{c}, EveryStep{}, 100}, x(n, 0.5f), sgd(n) {}
  void reduce(std::span<float> g) { dp.step(std::span<float>(x), g, 0.1, sgd); }
  void save_state(std::vector<std::byte>& out) const {
    dp.save_state(out);
    const auto at = out.size();
    out.resize(at + x.size() * sizeof(float));
    std::memcpy(out.data() + at, x.data(), x.size() * sizeof(float));
  }
};

PowerCompressor<2> power_bucket(any_communicator c, std::size_t n) {
  const auto len = static_cast<std::int64_t>(n);
  tensor_layout l = n % 100 == 0 && n > 100 ? tensor_layout{{100, len / 100}} : tensor_layout{{len}};
  return PowerCompressor<2>{c, l};
}

int count_everywhere(bool flag) {
  int n = flag ? 1 : 0, all = 0;
  MPI_Allreduce(&n, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return all;
}

template <class Make>
void expect_caught_everywhere(Make make) {
  auto comm = commpact_test::checked_mpi_world(20s);
  REQUIRE_FALSE(comm.inner().options().verify_collectives);  // the decorator is the only check
  const int P = comm.size();
  const auto t0 = std::chrono::steady_clock::now();
  const auto out = commpact_test::check_bucket_order(comm, make(comm));
  const auto took = std::chrono::steady_clock::now() - t0;
  CAPTURE(comm.rank(), out.what);
  const bool ok = out.raised_mismatch && out.what.find("commpact::CheckedComm") != std::string::npos &&
                  out.state_kept && out.next_step_ok && took < 10s;
  CHECK(out.raised_mismatch);
  CHECK(out.what.find("commpact::CheckedComm") != std::string::npos);
  CHECK(out.state_kept);
  CHECK(out.next_step_ok);
  CHECK(took < 10s);  // the check decided, not the 20 s deadline
  REQUIRE(count_everywhere(ok) == P);
  REQUIRE_FALSE(comm.inner().failed());
}

}  // namespace

TEST_CASE("MPI: CheckedComm over an unchecked MpiComm catches buckets reduced in another order, in every compressor",
          "[mpi][compress][checked][errors]") {
  using C = checked_mpi_comm;
  SECTION("Dense") {
    expect_caught_everywhere([](C& comm) { return [&comm](std::size_t) { return Dense<C>{comm}; }; });
  }
  SECTION("TopK") {
    expect_caught_everywhere([](C& comm) {
      return [&comm](std::size_t) { return TopK<C>{comm, {.density = 0.05}}; };
    });
  }
  SECTION("LinearCompressor<randomk_codec>") {
    expect_caught_everywhere([](C& comm) {
      return [&comm](std::size_t) { return LinearCompressor<randomk_codec, C>{comm, randomk_codec{0.2, 7}}; };
    });
  }
  SECTION("MajorityVote") {
    expect_caught_everywhere([](C& comm) {
      return [&comm](std::size_t) { return MajorityVote<C>{comm, {.momentum = 0.5f}}; };
    });
  }
  SECTION("PowerCompressor<2>") {
    expect_caught_everywhere([](C& comm) { return [&comm](std::size_t n) { return power_bucket(comm, n); }; });
  }
  SECTION("DataParallel<Dense, EveryStep>") {
    expect_caught_everywhere([](C& comm) { return [&comm](std::size_t n) { return dp_bucket{comm, n}; }; });
  }
}
