// MpiComm's isolated allgather of large blocks moves each block as cache-sized pieces
// (comm/mpi/gather_pieces.hpp): a few slots of scratch per peer, each piece copied out
// as it arrives and the slot reposted. Checked here against a brute-force reference
// computed locally: block sizes on both sides of the piece threshold and of piece
// boundaries (a last piece of 1 byte), blocking and nonblocking forms mixed across
// ranks, several gathers and a ring in flight waited in different orders, a mismatched
// block size raising on every rank with the communicator usable after (also across the
// size a checked allgather holds), ranks that differ in isolate_buffers, and a failure
// mid-gather after which nothing writes into the caller's output. 9 ranks: the first
// size whose signature check is a recursive doubling, not a direct exchange.
// commpact-mpi-ranks: 2 3 4 8 9
#include <commpact/comm/mpi_comm.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "common/collective_checks.hpp"

using namespace commpact;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t piece = detail::mpi_gather_piece_bytes;

using commpact_test::block_of;  // rank q's block for a seed (tests/common/collective_checks.hpp)

}  // namespace

TEST_CASE("MpiComm: a large allgather by pieces equals the brute-force concatenation", "[comm][mpi][gather]") {
  const bool verify = GENERATE(true, false);
  const bool isolate = GENERATE(true, false);
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s, .verify_collectives = verify, .isolate_buffers = isolate, .shared_memory_max = 0}};
  const int P = comm.size(), r = comm.rank();
  // The threshold itself (whole blocks), one byte above it (a last piece of 1 byte), a
  // piece boundary plus a tail, and many pieces (more than the slots per peer); checked,
  // also one byte and the most that travels inside the signature message, and one more.
  constexpr std::size_t in_sig = detail::mpi_inline_gather_block_max;
  const std::size_t sizes[] = {1, in_sig, in_sig + 1, 2 * piece, 2 * piece + 1, 5 * piece + 17, 16 * piece + 3};
  mpi_guard(comm, [&] {
    std::uint64_t seed = 1;
    for (const std::size_t n : sizes) {
      for (int form = 0; form < 3; ++form, ++seed) {
        const auto in = block_of(seed, r, n);
        std::vector<std::byte> out(n * static_cast<std::size_t>(P), std::byte{0x5a});
        // form 0: blocking everywhere; 1: nonblocking on odd ranks (wait); 2: nonblocking
        // everywhere, polled with test().
        const bool nb = form == 2 || (form == 1 && r % 2 == 1);
        if (nb) {
          auto h = comm.iallgather(std::span<const std::byte>(in), std::span<std::byte>(out));
          if (form == 2)
            while (!h.test()) {
            }
          else
            h.wait();
        } else {
          comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out));
        }
        REQUIRE(out == commpact_test::gathered_blocks(seed, P, n));
      }
    }
  });
  REQUIRE_FALSE(comm.failed());
}

TEST_CASE("MpiComm: allgathers by pieces and a ring in flight complete in any wait order", "[comm][mpi][gather]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s, .shared_memory_max = 0}};
  const int P = comm.size(), r = comm.rank();
  mpi_guard(comm, [&] {
    const std::size_t n1 = 3 * piece + 5, n2 = 7 * piece;
    const auto in1 = block_of(11, r, n1), in2 = block_of(12, r, n2);
    std::vector<std::byte> out1(n1 * static_cast<std::size_t>(P)), out2(n2 * static_cast<std::size_t>(P));
    auto g = commpact_test::rank_floats(13, r, 70000, true), ref = g;
    comm.allreduce(std::span<float>(ref), reduce_op::sum);
    auto h1 = comm.iallgather(std::span<const std::byte>(in1), std::span<std::byte>(out1));
    auto h2 = comm.iallgather(std::span<const std::byte>(in2), std::span<std::byte>(out2));
    auto h3 = comm.iallreduce(std::span<float>(g), reduce_op::sum);
    if (r % 2 == 0) {
      h1.wait();
      h2.wait();
      h3.wait();
    } else {
      h3.wait();
      h2.wait();
      h1.wait();
    }
    REQUIRE(out1 == commpact_test::gathered_blocks(11, P, n1));
    REQUIRE(out2 == commpact_test::gathered_blocks(12, P, n2));
    REQUIRE(g == ref);
  });
  REQUIRE_FALSE(comm.failed());
}

TEST_CASE("MpiComm: a mismatched large allgather raises on every rank and moves nothing", "[comm][mpi][gather]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s, .shared_memory_max = 0}};
  const int P = comm.size(), r = comm.rank();
  const std::size_t n = 4 * piece + 1, wrong = 3 * piece + 1;  // rank 0 disagrees on the block size
  const auto in = block_of(21, r, r == 0 ? wrong : n);
  std::vector<std::byte> out(in.size() * static_cast<std::size_t>(P), std::byte{0x33});
  const auto before = out;
  REQUIRE_THROWS_AS(comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out)), mismatch_error);
  REQUIRE(out == before);
  REQUIRE_FALSE(comm.failed());
  // Nothing is left in flight: the next large allgather is exact.
  const auto in2 = block_of(22, r, n);
  std::vector<std::byte> out2(n * static_cast<std::size_t>(P));
  comm.allgather(std::span<const std::byte>(in2), std::span<std::byte>(out2));
  REQUIRE(out2 == commpact_test::gathered_blocks(22, P, n));
}

// A checked allgather sends a block of up to mpi_inline_gather_block_max bytes inside
// its signature message and a larger one after the check: ranks that disagree across
// that size send signature messages of different lengths, which must still raise alike
// and leave nothing in flight.
TEST_CASE("MpiComm: ranks that disagree across the held block size raise alike and move nothing",
          "[comm][mpi][gather]") {
  const bool isolate = GENERATE(true, false);
  const bool small_on_zero = GENERATE(true, false);
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s, .isolate_buffers = isolate, .shared_memory_max = 0}};
  const int P = comm.size(), r = comm.rank();
  constexpr std::size_t in_sig = detail::mpi_inline_gather_block_max;
  const std::size_t small = in_sig, large = 4 * piece + 1;
  const std::size_t n = (r == 0) == small_on_zero ? small : large;
  const auto in = block_of(41, r, n);
  std::vector<std::byte> out(n * static_cast<std::size_t>(P), std::byte{0x44});
  const auto before = out;
  REQUIRE_THROWS_AS(comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out)), mismatch_error);
  REQUIRE(out == before);
  REQUIRE_FALSE(comm.failed());
  for (const std::size_t m : {small, large}) {  // nothing left in flight: the next ones are exact
    const auto in2 = block_of(42 + m, r, m);
    std::vector<std::byte> out2(m * static_cast<std::size_t>(P));
    comm.allgather(std::span<const std::byte>(in2), std::span<std::byte>(out2));
    REQUIRE(out2 == commpact_test::gathered_blocks(42 + m, P, m));
  }
}

// isolate_buffers is each rank's own choice (where MPI may write on this rank): ranks
// that differ in it gather alike, held or not. The message pattern of a large block (by
// pieces when any rank isolates) must still be the same on every rank: the check tells
// every rank whether any rank isolates. Before it did, this failed at 9 ranks (a failed
// communicator: MPI_ERR_IN_STATUS in MPI_Testsome), and at every size on the 'check
// first' allgather of 306ab1f.
TEST_CASE("MpiComm: ranks that differ in isolate_buffers gather alike", "[comm][mpi][gather]") {
  const int rank = [] {
    int q = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &q);
    return q;
  }();
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s, .isolate_buffers = rank % 2 == 0, .shared_memory_max = 0}};
  const int P = comm.size(), r = comm.rank();
  constexpr std::size_t in_sig = detail::mpi_inline_gather_block_max;
  mpi_guard(comm, [&] {
    std::uint64_t seed = 51;
    for (const std::size_t n : {std::size_t{1}, in_sig, in_sig + 1, 2 * piece + 1, 5 * piece + 17}) {
      const auto in = block_of(seed, r, n);
      std::vector<std::byte> out(n * static_cast<std::size_t>(P));
      comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out));
      REQUIRE(out == commpact_test::gathered_blocks(seed, P, n));
      ++seed;
    }
  });
  REQUIRE_FALSE(comm.failed());
}

TEST_CASE("MpiComm: after a failure mid-allgather nothing writes into the output", "[comm][mpi][gather]") {
  const bool verify = GENERATE(true, false);
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s, .verify_collectives = verify, .shared_memory_max = 0}};
  const int P = comm.size(), r = comm.rank(), bad = P - 1;
  const std::size_t n = 16 * piece;  // many more pieces than slots: it cannot finish without rank `bad`
  const auto in = block_of(31, r, n);
  std::vector<std::byte> out(n * static_cast<std::size_t>(P), std::byte{0x77});
  // The aborting rank keeps its handle until the end: nothing moves its gather on after
  // the abort but MPI's own progress of the pieces already posted, so no peer can finish.
  std::optional<mpi_request> h;
  if (r == bad) {
    h.emplace(comm.iallgather(std::span<const std::byte>(in), std::span<std::byte>(out)));
    comm.abort("test: failure mid-allgather");
    CHECK(comm.failed());
  } else {
    // No REQUIRE before the barriers below, which every rank must reach.
    bool raised = false;
    try {
      comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out));
    } catch (const peer_failure&) {
      raised = true;
    } catch (const std::exception& e) {
      FAIL_CHECK("expected peer_failure, got: " << e.what());
    }
    CHECK(raised);
  }
  const auto seen = out;
  // Every rank drives MPI for a while (the aborted rank's pieces in flight progress and
  // complete its peers' abandoned receives): none of it may reach `out`.
  MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < 50; ++i) {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    std::this_thread::sleep_for(1ms);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(out == seen);
  h.reset();  // gives the aborted gather up (the communicator has failed)
}
