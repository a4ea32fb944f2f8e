// commpact-mpi-ranks: 2 3
// The compressors that agreed on a length once and check it per step (Dense, the casts,
// LinearCompressor, PowerCompressor, MajorityVote, TopK, and Bucketed of one), over an UNCHECKED
// MpiComm (verify_collectives = false: nothing compares the ranks' collectives, as in plain
// MPI and NCCL). After a good step rank 1's gradient changes length, longer or shorter.
// That rank runs the step idle, on zeroed workspaces of the agreed length (MajorityVote: a
// rejected header in a block of the agreed capacity), so every rank makes the same calls;
// the step check (or the headers) raise mismatch_error on every rank, quickly (not at the
// deadline), no state changes, and the next step at the agreed length gives every rank the
// same result. (Before, those compressors re-agreed on rank 1 alone and the gradient's
// collective reached MPI with two sizes: undefined behaviour, here MPI_ERR_TRUNCATE and a
// communicator failed for good.) When every rank changes to one new length, the step runs
// and equals that of a twin that starts at the new length. The ThreadComm twin is in
// tests/test_hardening_mismatch.cpp.
#include <commpact/comm/any_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>
#include <commpact/compress/codecs/randomk.hpp>
#include <commpact/compress/compressors/bucketed.hpp>
#include <commpact/compress/compressors/cast_allreduce.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/compressors/majority.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>

#include <catch2/catch.hpp>
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "common/random.hpp"

using namespace commpact;
using namespace std::chrono_literals;
using commpact_test::normal;

namespace {

constexpr std::size_t kN = 1000;

MpiComm unchecked_world() { return MpiComm{MPI_COMM_WORLD, {.timeout = 20s, .verify_collectives = false}}; }

template <class Make>
void check_one_rank_odd(Make make, int delta) {
  CAPTURE(delta);
  MpiComm comm = unchecked_world();
  REQUIRE_FALSE(comm.checks_collectives());
  const int r = comm.rank();
  auto c = make(comm);
  std::vector<float> g = normal(10 + r, kN);
  CHECK(c.reduce(std::span<float>(g)));  // CHECK, not REQUIRE: no rank leaves the others in a collective
  std::vector<std::byte> before, after;
  c.save_state(before);

  std::vector<float> odd = normal(20 + r, r == 1 ? static_cast<std::size_t>(static_cast<int>(kN) + delta) : kN);
  const auto odd_in = odd;
  std::string what = "nothing raised";
  bool mismatch = false;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    c.reduce(std::span<float>(odd));
  } catch (const mismatch_error& e) {
    mismatch = true, what = e.what();
  } catch (const std::exception& e) {
    what = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  c.save_state(after);

  std::vector<float> next = normal(30 + r, kN);
  bool next_ok = false;
  try {
    next_ok = c.reduce(std::span<float>(next));
  } catch (const std::exception& e) {
    what += std::string(" / next step: ") + e.what();
  }
  std::vector<float> next0 = next;
  MPI_Bcast(next0.data(), static_cast<int>(kN), MPI_FLOAT, 0, MPI_COMM_WORLD);

  CAPTURE(r, what);
  CHECK(mismatch);
  CHECK(what.find("ranks disagree on the gradient length") != std::string::npos);  // not a failed communicator
  CHECK(before == after);
  if (r == 1) CHECK(odd == odd_in);  // the odd rank's gradient untouched
  CHECK(next_ok);
  CHECK(next == next0);  // the same result on every rank
  CHECK(took < 10s);     // the step check decided, not the 20 s deadline
  CHECK_FALSE(comm.failed());
}

//! Every rank's gradient changes to one new length after a good step: the step runs, as
//! in a twin loaded with the state saved before it, and so does the step after.
template <class Make>
void check_every_rank_changes(Make make) {
  MpiComm comm = unchecked_world();
  const int r = comm.rank();
  auto c = make(comm);
  std::vector<float> g = normal(10 + r, kN);
  CHECK(c.reduce(std::span<float>(g)));  // CHECK, not REQUIRE: no rank leaves the others in a collective
  if constexpr (requires { c.reset(); }) c.reset();  // a residual of the old length
  std::vector<std::byte> before;
  c.save_state(before);
  auto twin = make(comm);
  twin.load_state(before);
  constexpr std::size_t n2 = kN + 40;
  for (int i = 0; i < 2; ++i) {  // the step at the new length, then one more
    std::vector<float> a = normal(20 + 10 * i + r, n2), b = a;
    CHECK_NOTHROW(c.reduce(std::span<float>(a)));
    CHECK_NOTHROW(twin.reduce(std::span<float>(b)));
    CHECK(a == b);
    std::vector<float> a0 = a;
    MPI_Bcast(a0.data(), static_cast<int>(n2), MPI_FLOAT, 0, MPI_COMM_WORLD);
    CHECK(a == a0);
  }
  CHECK(c.steps() == 3);
  CHECK_FALSE(comm.failed());
}

}  // namespace

TEST_CASE("MPI, unchecked: one rank's gradient of another length after a step raises mismatch_error on every rank "
          "in the compressors without headers",
          "[mpi][compress][mismatch]") {
  const int delta = GENERATE(3, -5, 200);
  SECTION("Dense") {
    check_one_rank_odd([](MpiComm& comm) { return Dense<MpiComm>{comm}; }, delta);
  }
  SECTION("Fp16Allreduce") {
    check_one_rank_odd([](MpiComm& comm) { return Fp16Allreduce<MpiComm>{comm}; }, delta);
  }
  SECTION("Bf16Allreduce without error feedback") {
    check_one_rank_odd([](MpiComm& comm) { return Bf16Allreduce<MpiComm>{comm, {.error_feedback = false}}; }, delta);
  }
  SECTION("LinearCompressor<randomk_codec>") {
    check_one_rank_odd([](MpiComm& comm) { return LinearCompressor<randomk_codec, MpiComm>{comm, randomk_codec{0.1, 7}}; },
                       delta);
  }
  SECTION("PowerCompressor<2>") {
    check_one_rank_odd([](MpiComm& comm) { return PowerCompressor<2>{any_communicator{comm}, tensor_layout{{100, 10}}}; },
                       delta);
  }
  SECTION("TopK (CodecCompressor)") {
    check_one_rank_odd([](MpiComm& comm) { return TopK<MpiComm>{comm, {.density = 0.05}}; }, delta);
  }
  SECTION("MajorityVote (Signum)") {
    check_one_rank_odd([](MpiComm& comm) { return MajorityVote<MpiComm>{comm, {.momentum = 0.9f}}; }, delta);
  }
  SECTION("Bucketed<Dense>, two buckets (bucket 0's compressor sees the odd length)") {
    check_one_rank_odd(
        [](MpiComm& comm) {
          return Bucketed<Dense<MpiComm>>{{600, 400}, [&](const bucket_info&) { return Dense<MpiComm>{comm}; },
                                          {.cap_bytes = 1600}};
        },
        delta);
  }
}

TEST_CASE("MPI, unchecked: every rank's gradient changing to one new length after a step runs the step",
          "[mpi][compress][mismatch]") {
  SECTION("Dense") {
    check_every_rank_changes([](MpiComm& comm) { return Dense<MpiComm>{comm}; });
  }
  SECTION("Fp16Allreduce (reset first)") {
    check_every_rank_changes([](MpiComm& comm) { return Fp16Allreduce<MpiComm>{comm}; });
  }
  SECTION("LinearCompressor<randomk_codec> (reset first)") {
    check_every_rank_changes(
        [](MpiComm& comm) { return LinearCompressor<randomk_codec, MpiComm>{comm, randomk_codec{0.1, 7}}; });
  }
  SECTION("MajorityVote (signSGD)") {
    check_every_rank_changes([](MpiComm& comm) { return MajorityVote<MpiComm>{comm}; });
  }
  SECTION("TopK (CodecCompressor; reset first)") {
    check_every_rank_changes([](MpiComm& comm) { return TopK<MpiComm>{comm, {.density = 0.05}}; });
  }
}
