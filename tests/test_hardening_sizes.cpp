// Sizes past what a wire field or an index type holds are refused before anything is
// read or allocated, alike on every rank, with an error that names the limit: never a
// silent wrap of a 32-bit length or of an int32 index (an outside reviewer's findings:
// a codec frame announcing its length modulo 2^32, random-k's indices wrapping at 2^31,
// CHOCO's framed length, the parameter server's headers).
//
// The large gradients here are reserved, not committed: a PROT_NONE mapping of their
// length, so any read or write of one before the refusal crashes the test, and the test
// costs no memory.
#include <catch2/catch.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/randomk.hpp>
#include <commpact/compress/codecs/sparsifiers.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/compressors/majority.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/ps/parameter_server.hpp>
#include <commpact/topology/ring.hpp>

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include "common/rank_checks.hpp"

using namespace commpact;

namespace {

//! n floats of address space that may not be touched.
class sizes_reserved {
 public:
  explicit sizes_reserved(std::size_t n) : n_(n) {
    void* p = ::mmap(nullptr, n * sizeof(float), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of the reserved gradient failed");
    p_ = static_cast<float*>(p);
  }
  ~sizes_reserved() { ::munmap(p_, n_ * sizeof(float)); }
  sizes_reserved(const sizes_reserved&) = delete;
  sizes_reserved& operator=(const sizes_reserved&) = delete;
  std::span<float> span() const { return {p_, n_}; }

 private:
  float* p_ = nullptr;
  std::size_t n_;
};

//! The threshold codec, announcing a message one byte above the frame's 32-bit length
//! (a variable-length codec: CHOCO frames it): what a codec of a 2^32-byte message would
//! announce, without a gradient that large.
struct sizes_oversized_codec : threshold_codec {
  sizes_oversized_codec() : threshold_codec(0.5f) {}
  std::size_t max_encoded_bytes(std::size_t) const { return std::size_t{1} << 32; }
};
static_assert(variable_length_codec<sizes_oversized_codec>::value);

}  // namespace

TEST_CASE("random-k refuses a gradient of 2^31 entries or more: its indices are int32", "[hardening][sizes]") {
  const randomk_codec k{0.001, 7};
  CHECK(k.check((std::size_t{1} << 31) - 1).empty());
  CHECK_THAT(k.check(std::size_t{1} << 31), Catch::Matchers::Contains("n = 2147483648 entries") &&
                                                 Catch::Matchers::Contains("n must be below 2^31"));
  // Through LinearCompressor: every rank raises invalid_argument at the first step's
  // agreement, before the gradient is read or a residual allocated.
  const sizes_reserved g(std::size_t{1} << 31);
  REQUIRE_NOTHROW(run_threads(2, [&](ThreadComm& comm) {
    LinearCompressor<randomk_codec, ThreadComm> c{comm, randomk_codec{0.001, 7}};
    RANK_REQUIRE_THROWS_AS_WITH(c.reduce(g.span()), invalid_argument, "n must be below 2^31");
  }));
}

TEST_CASE("CodecCompressor refuses a codec whose message may pass the frame's 32-bit payload length",
          "[hardening][sizes]") {
  REQUIRE_NOTHROW(run_threads(2, [&](ThreadComm& comm) {
    CodecCompressor<sizes_oversized_codec, Allgather<ThreadComm>> c{comm};
    std::vector<float> g(64, 1.0f);
    const auto before = g;
    RANK_REQUIRE_THROWS_AS_WITH(c.reduce(std::span<float>(g)), invalid_argument, "may take 4294967296 bytes",
                                "32-bit payload length");
    RANK_REQUIRE(g == before);
    // The threshold codec's own size fits: the same gradient runs.
    CodecCompressor<threshold_codec, Allgather<ThreadComm>> ok{comm, threshold_codec{0.5f}};
    RANK_REQUIRE_NOTHROW(ok.reduce(std::span<float>(g)));
  }));
}

TEST_CASE("MajorityVote refuses a gradient whose vote passes the frame's 32-bit payload length",
          "[hardening][sizes]") {
  // 4 + ceil(n / 8) bytes: 2^35 entries take 2^32 + 4 (128 GiB of address space, reserved).
  const sizes_reserved g(std::size_t{1} << 35);
  REQUIRE_NOTHROW(run_threads(2, [&](ThreadComm& comm) {
    MajorityVote<ThreadComm> c{comm};
    RANK_REQUIRE_THROWS_AS_WITH(c.reduce(g.span()), invalid_argument, "whose vote may take 4294967300 bytes",
                                "32-bit payload length");
  }));
}

TEST_CASE("CHOCO-SGD refuses a variable-length codec whose message may pass its 32-bit length",
          "[hardening][sizes]") {
  const tensor_layout layout = {{8, 8}};
  REQUIRE_NOTHROW(run_threads(3, [&](ThreadComm& comm) {
    using M = GossipMixer<Ring, choco_gossip<sizes_oversized_codec>, ThreadComm>;
    RANK_REQUIRE_THROWS_AS_WITH((M{comm, Ring(3), layout, {sizes_oversized_codec{}, 0.5}}), invalid_argument,
                                "GossipMixer (CHOCO-SGD)", "above the 32-bit length");
  }));
}

TEST_CASE("The parameter server refuses a shard whose messages pass its wire header's 32-bit length",
          "[hardening][sizes]") {
  // One server holds all 2^30 values: its parameters take 2^32 bytes.
  const sizes_reserved init(std::size_t{1} << 30);
  REQUIRE_NOTHROW(run_threads(2, [&](ThreadComm& comm) {
    using S = ps::ParameterServer<ThreadComm, ps::dense_codec, ps::Bsp>;
    RANK_REQUIRE_THROWS_AS_WITH((S{comm, ps::roles::separate(2, 1), init.span()}), invalid_argument,
                                "shard 0 holds 1073741824 values", "use more servers");
  }));
}
