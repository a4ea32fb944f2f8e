// CheckedComm doing its job inside compressors and the training driver: two
// buckets (10000 and 10 floats) have agreed their lengths; then one rank reduces the
// small bucket while the others reduce the large one. No compressor re-agrees on a length
// it already agreed, so only the communicator can see the disagreement: under
// CheckedComm<ThreadComm> every rank raises mismatch_error, none hangs, both buckets'
// states are unchanged, and the next good steps equal those of twins that never saw the
// bad step. Dense, TopK (allgather), LinearCompressor<randomk> (allreduce), MajorityVote,
// PowerCompressor and DataParallel<Dense>. Rank threads record their outcomes; the
// assertions run after run_threads. The MPI twin, over an unchecked MpiComm, is
// tests/mpi/test_compress_checked_mpi.cpp.
#include <catch2/catch.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/majority.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <chrono>
#include <cstring>
#include <span>
#include <vector>

#include "common/checked_runs.hpp"

using namespace commpact;
using commpact_test::checked_thread_comm;

namespace {

const thread_options quick{std::chrono::seconds(30)};

//! DataParallel<Dense> on one parameter buffer, as a bucket: reduce(g) is one EveryStep
//! optimizer step; its state is the driver's state followed by the parameters.
template <class Comm>
struct dp_bucket {
  DataParallel<Dense<Comm>, EveryStep> dp;
  std::vector<float> x;
  Sgd sgd;
  dp_bucket(Comm c, std::size_t n) : dp{Dense<Comm>{c}, EveryStep{}, 100}, x(n, 0.5f), sgd(n) {}
  void reduce(std::span<float> g) { dp.step(std::span<float>(x), g, 0.1, sgd); }
  void save_state(std::vector<std::byte>& out) const {
    dp.save_state(out);
    const auto at = out.size();
    out.resize(at + x.size() * sizeof(float));
    std::memcpy(out.data() + at, x.data(), x.size() * sizeof(float));
  }
};

//! PowerCompressor over a bucket of n floats: a 100 x (n / 100) matrix, or a vector.
PowerCompressor<2> power_bucket(any_communicator c, std::size_t n) {
  const auto len = static_cast<std::int64_t>(n);
  tensor_layout l = n % 100 == 0 && n > 100 ? tensor_layout{{100, len / 100}} : tensor_layout{{len}};
  return PowerCompressor<2>{c, l};
}

template <class Make>
void expect_caught_everywhere(int P, Make make) {
  std::vector<commpact_test::bucket_order_outcome> out(static_cast<std::size_t>(P));
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](checked_thread_comm& comm) { out[comm.rank()] = commpact_test::check_bucket_order(comm, make(comm)); },
      quick));
  for (int r = 0; r < P; ++r) {
    CAPTURE(P, r, out[r].what);
    CHECK(out[r].raised_mismatch);
    CHECK(out[r].what.find("commpact::CheckedComm") != std::string::npos);  // the decorator, not ThreadComm, caught it
    CHECK(out[r].state_kept);
    CHECK(out[r].next_step_ok);
  }
}

}  // namespace

TEST_CASE("CheckedComm catches buckets reduced in another order on one rank, inside every compressor",
          "[compress][checked][errors]") {
  const int P = GENERATE(2, 3, 5);
  using C = checked_thread_comm;
  SECTION("Dense") {
    expect_caught_everywhere(P, [](C& comm) { return [&comm](std::size_t) { return Dense<C>{comm}; }; });
  }
  SECTION("TopK (allgather of every rank's block)") {
    expect_caught_everywhere(P, [](C& comm) {
      return [&comm](std::size_t) { return TopK<C>{comm, {.density = 0.05}}; };
    });
  }
  SECTION("LinearCompressor<randomk_codec> (allreduce of a shared selection)") {
    expect_caught_everywhere(P, [](C& comm) {
      return [&comm](std::size_t) { return LinearCompressor<randomk_codec, C>{comm, randomk_codec{0.2, 7}}; };
    });
  }
  SECTION("MajorityVote") {
    expect_caught_everywhere(P, [](C& comm) {
      return [&comm](std::size_t) { return MajorityVote<C>{comm, {.momentum = 0.5f}}; };
    });
  }
  SECTION("PowerCompressor<2>") {
    expect_caught_everywhere(P, [](C& comm) { return [&comm](std::size_t n) { return power_bucket(comm, n); }; });
  }
  SECTION("DataParallel<Dense, EveryStep>") {
    expect_caught_everywhere(P, [](C& comm) { return [&comm](std::size_t n) { return dp_bucket<C>{comm, n}; }; });
  }
}
