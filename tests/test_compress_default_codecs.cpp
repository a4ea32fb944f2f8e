// Compressors and mixers built without a codec argument:
//  - CodecCompressor<K, Allgather<C>> c{comm}, LinearCompressor<randomk_codec, C> c{comm}
//    and GossipMixer<Ring, K, C> m{comm, topo, layout} compile for every library codec,
//    including those whose default constructor is explicit (qsgd, terngrad, natural,
//    top-k, Gaussian-k, DGC, random-k). A defaulted parameter written `K codec = {}` is
//    copy-list-initialisation, which may not call an explicit constructor: clang++
//    rejects it, g++ only warns. This file is compiled with -pedantic-errors
//    (tests/CMakeLists.txt), so g++ rejects it too and both builds catch a regression.
//  - The defaulted codec is K(): every rank's outputs and residual equal, bit for bit,
//    those of a twin given K() explicitly, over a few steps at P = 3.
// commpact-standalone: it compiles with -pedantic-errors of its own (tests/CMakeLists.txt)
#include <catch2/catch.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/codecs/casts.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/sparsifiers.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/topology/ring.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common/checked_runs.hpp"
#include "common/random.hpp"

using namespace commpact;
using C = commpact_test::checked_thread_comm;
using vec = std::vector<float>;

namespace {

constexpr int kRanks = 3;
constexpr int kSteps = 3;
constexpr std::size_t kN = 200;

vec gradient(int step, int rank) {
  return commpact_test::normal(1000u + static_cast<std::uint64_t>(step) * 17u + static_cast<std::uint64_t>(rank), kN);
}

//! What one rank's defaulted object and its explicit twin produced.
struct twin_outcome {
  std::vector<vec> defaulted, given;  //!< outputs per step
  vec defaulted_residual, given_residual;
};

//! Runs `make_defaulted(comm)` and `make_given(comm)` side by side for kSteps steps of
//! the same gradients on kRanks ranks; `step(obj, g)` does one step in place.
template <class MakeDefaulted, class MakeGiven, class Step>
std::vector<twin_outcome> run_twins(MakeDefaulted make_defaulted, MakeGiven make_given, Step step) {
  std::vector<twin_outcome> out(kRanks);
  commpact_test::run_checked_threads(kRanks, [&](C& comm) {
    auto a = make_defaulted(comm);
    auto b = make_given(comm);
    twin_outcome& o = out[static_cast<std::size_t>(comm.rank())];
    for (int s = 0; s < kSteps; ++s) {
      vec ga = gradient(s, comm.rank()), gb = ga;
      step(a, ga);
      step(b, gb);
      o.defaulted.push_back(ga);
      o.given.push_back(gb);
    }
    if constexpr (requires { a.residual(); }) {
      o.defaulted_residual.assign(a.residual().begin(), a.residual().end());
      o.given_residual.assign(b.residual().begin(), b.residual().end());
    }
  });
  return out;
}

void check_twins(const std::vector<twin_outcome>& out) {
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    const auto& o = out[static_cast<std::size_t>(r)];
    REQUIRE(o.defaulted.size() == static_cast<std::size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      INFO("step " << s);
      CHECK(o.defaulted[static_cast<std::size_t>(s)] == o.given[static_cast<std::size_t>(s)]);
    }
    CHECK(o.defaulted_residual == o.given_residual);
  }
}

template <class Obj>
void reduce_step(Obj& c, vec& g) {
  if (!c.reduce(std::span<float>(g))) throw std::logic_error("a step was skipped");  // no Catch2 in rank threads
}

}  // namespace

TEMPLATE_TEST_CASE("CodecCompressor<K, Allgather<C>>{comm} compiles and uses K()", "[codec][compressor][defaults]",
                   topk_codec, sign_codec, qsgd_codec, terngrad_codec, onebit_codec, natural_codec, fp16_codec,
                   bf16_codec, gaussiank_codec, dgc_codec) {
  using K = TestType;
  using Comp = CodecCompressor<K, Allgather<C>>;
  const auto out = run_twins([](C& comm) { return Comp{comm}; },  // the case clang++ 14 rejected
                             [](C& comm) { return Comp{comm, K()}; }, [](Comp& c, vec& g) { reduce_step(c, g); });
  check_twins(out);
}

TEST_CASE("LinearCompressor<randomk_codec, C>{comm} compiles and uses randomk_codec()", "[codec][compressor][defaults]") {
  using Comp = LinearCompressor<randomk_codec, C>;
  const auto out = run_twins([](C& comm) { return Comp{comm}; },
                             [](C& comm) { return Comp{comm, randomk_codec()}; },
                             [](Comp& c, vec& g) { reduce_step(c, g); });
  check_twins(out);
}

TEMPLATE_TEST_CASE("GossipMixer<Ring, K, C>{comm, topo, layout} compiles and uses K()", "[codec][gossip][defaults]",
                   topk_codec, sign_codec, qsgd_codec, terngrad_codec, natural_codec) {
  using K = TestType;
  using Mixer = GossipMixer<Ring, K, C>;
  const tensor_layout layout{{static_cast<std::int64_t>(kN)}};
  const auto out = run_twins([&](C& comm) { return Mixer{comm, Ring(kRanks), layout}; },
                             [&](C& comm) { return Mixer{comm, Ring(kRanks), layout, K()}; },
                             [](Mixer& m, vec& x) { m.mix(std::span<float>(x)); });
  check_twins(out);
}
