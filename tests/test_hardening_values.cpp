// Value guarantees of every stateful type, checked over type lists (host and deferred
// spaces), so that a new compressor joins the list and meets them:
// - (a) a saved state whose counters are 0, INT64_MAX, -1 or INT64_MIN, or whose stored
//   floats are +-FLT_MAX or 3e38 (all of a section, or its first value), with a valid
//   checksum: load_state rejects it with a commpact::error and changes nothing, or the
//   object runs on without UB (the ASan/UBSan build runs this file) and every rank either
//   returns a finite result, skips the step, or raises numeric_error, alike;
// - (c) finite gradients whose mean overflows (FLT_MAX everywhere; 3e38 at one index on
//   every rank): numeric_error on every rank under nonfinite::raise, a skipped step (grad
//   zero) under skip_step, or a finite result; never Inf or NaN returned;
// - the reproductions of the value half of "Hardening v3": PowerCompressor's counter at
//   INT64_MAX, one rank's PowerCompressor buffer of another length, LinearCompressor over
//   random-k with FLT_MAX, OkTopK with 3e38 at one index (gradient or saved residual);
// - Dense under a non-finite mean leaves exactly the mean over the ranks in grad (its
//   allreduce runs in place), as docs/architecture.md says.
#include <catch2/catch.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/codecs/casts.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/randomk.hpp>
#include <commpact/compress/codecs/sparsifiers.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/compressors/cast_allreduce.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/compressors/majority.hpp>
#include <commpact/compress/compressors/oktopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/state.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/topology/ring.hpp>
#include <commpact/train/data_parallel.hpp>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "common/random.hpp"
#include "common/rank_checks.hpp"
#include "common/space_copies.hpp"
#include "common/state_blobs.hpp"

using namespace commpact;
using commpact_test::normal;
using bytes = std::vector<std::byte>;
using DC = DeferredComm<ThreadComm>;

namespace {
const tensor_layout kLayout = {{12, 10}, {10}, {6, 8}, {3}};
constexpr std::size_t kN = 120 + 10 + 48 + 3;
constexpr int kP = 3;
constexpr float kBig = 3e38f;

// ---- the type list: how to make each type, over a communicator of either space ----
struct dense_case {
  template <class C>
  static auto make(C c, nonfinite p) { return Dense<C>{c, {.on_nonfinite = p}}; }
};
struct topk_case {
  template <class C>
  static auto make(C c, nonfinite p) { return TopK<C>{c, {.density = 0.1, .on_nonfinite = p}}; }
};
struct topk_momentum_case {
  template <class C>
  static auto make(C c, nonfinite p) { return TopK<C>{c, {.density = 0.1, .momentum = 0.5f, .on_nonfinite = p}}; }
};
struct gtopk_case {
  template <class C>
  static auto make(C c, nonfinite p) { return gTopK<TreeComm<C>>{c, {.density = 0.1, .on_nonfinite = p}}; }
};
struct power_case {
  template <class C>
  static auto make(C c, nonfinite p) {
    power_options o;
    o.on_nonfinite = p;
    return PowerCompressor<2, comm_space_t<C>>{c, kLayout, o};
  }
};
struct power_dense_start_case {  // two dense steps first (the path of the staging buffer)
  template <class C>
  static auto make(C c, nonfinite p) {
    power_options o;
    o.on_nonfinite = p;
    o.start_step = 2;
    return PowerCompressor<2, comm_space_t<C>>{c, kLayout, o};
  }
};
struct linear_randomk_case {
  template <class C>
  static auto make(C c, nonfinite p) {
    return LinearCompressor<randomk_codec, C>{c, randomk_codec{0.1, 7}, p};
  }
};
struct linear_randomk_scaled_case {
  template <class C>
  static auto make(C c, nonfinite p) {
    return LinearCompressor<randomk_codec, C>{c, randomk_codec{0.1, 7, true}, p};
  }
};
struct majority_case {
  template <class C>
  static auto make(C c, nonfinite p) { return MajorityVote<C>{c, {.on_nonfinite = p}}; }
};
struct oktopk_case {
  template <class C>
  static auto make(C c, nonfinite p) { return OkTopK<C>{c, {.density = 0.1, .on_nonfinite = p}}; }
};
struct fp16_allreduce_case {
  template <class C>
  static auto make(C c, nonfinite p) { return Fp16Allreduce<C>{c, {.on_nonfinite = p}}; }
};
struct bf16_allreduce_case {
  template <class C>
  static auto make(C c, nonfinite p) { return Bf16Allreduce<C>{c, {.on_nonfinite = p}}; }
};
template <class K>
struct codec_case {  // K through CodecCompressor<K, Allgather<C>>
  template <class C>
  static auto make(C c, nonfinite p) {
    return CodecCompressor<K, Allgather<C>>{c, codec(), codec_options{.on_nonfinite = p}};
  }
  static K codec() {
    if constexpr (std::is_same_v<K, threshold_codec>) return threshold_codec{0.5f};
    else return K{};
  }
};
struct gossip_power_case {
  template <class C>
  static auto make(C c, nonfinite p) {
    return GossipMixer<Ring, power_gossip<2>, C>{c, Ring(kP), kLayout, power_gossip<2>{}, {.on_nonfinite = p}};
  }
  template <class T>
  static bool step(T& t, std::vector<float>&, std::vector<float>& x) { return t.mix(std::span<float>(x)); }
};
struct gossip_choco_case {
  template <class C>
  static auto make(C c, nonfinite p) {
    return GossipMixer<Ring, choco_gossip<topk_codec>, C>{c, Ring(kP), kLayout, {topk_codec{0.2}, 0.3},
                                                          {.on_nonfinite = p}};
  }
  template <class T>
  static bool step(T& t, std::vector<float>&, std::vector<float>& x) { return t.mix(std::span<float>(x)); }
};
struct gossip_dpsgd_case {
  template <class C>
  static auto make(C c, nonfinite p) {
    return GossipMixer<Ring, exact_mixing, C>{c, Ring(kP), kLayout, exact_mixing{}, {.on_nonfinite = p}};
  }
  template <class T>
  static bool step(T& t, std::vector<float>&, std::vector<float>& x) { return t.mix(std::span<float>(x)); }
};
struct data_parallel_case {  // Local SGD over Dense: the parameters are averaged every 2 steps
  //! DataParallel's parameter averages raise numeric_error under every policy (the
  //! compressor's policy covers gradients only).
  static constexpr bool always_raises = true;
  template <class C>
  static auto make(C c, nonfinite p) { return DataParallel{Dense<C>{c, {.on_nonfinite = p}}, LocalSgd{2}, 1000}; }
  //! g is the gradient; params (kept by the subject) are stepped, and g returns them:
  //! their finiteness is what the checks read.
  template <class T>
  static bool step(T& t, std::vector<float>& params, std::vector<float>& g) {
    if (params.size() != g.size()) params.assign(g.size(), 1.0f);
    auto sgd = [](std::span<float> x, std::span<const float> d, double lr) {
      for (std::size_t i = 0; i < x.size(); ++i) x[i] -= static_cast<float>(lr) * d[i];
    };
    const bool r = t.step(std::span<float>(params), std::span<float>(g), 0.5, sgd);
    g = params;
    return r;
  }
};

//! One object of Case over ThreadComm (Deferred = false) or DeferredComm<ThreadComm>;
//! step() runs one step on a host vector, whatever the space.
template <class Case, bool Deferred>
struct subject {
  using comm_type = std::conditional_t<Deferred, DC, ThreadComm>;
  comm_type comm;
  decltype(Case::make(std::declval<comm_type>(), nonfinite::raise)) obj;
  std::vector<float> aux;  // what a driver steps besides the gradient (DataParallel: the parameters)
  subject(ThreadComm& tc, nonfinite p) : comm(tc), obj(Case::make(comm, p)) {}
  bool step(std::vector<float>& g) {
    if constexpr (requires { Case::step(obj, aux, g); }) {
      return Case::step(obj, aux, g);
    } else if constexpr (Deferred) {
      const auto e = comm.exec();
      auto d = commpact_test::device_copy(e, g);
      const bool r = obj.reduce(d.view());
      g = commpact_test::host_copy(e, d.cview());
      return r;
    } else {
      return obj.reduce(std::span<float>(g));
    }
  }
  bytes save() const {
    bytes b;
    obj.save_state(b);
    return b;
  }
};

template <class Case>
struct in_host {
  using c = Case;
  static constexpr bool is_deferred = false;
};
template <class Case>
struct in_deferred {
  using c = Case;
  static constexpr bool is_deferred = true;
};

//! What a step did, as a word every rank must share: "ok" (a finite result), "skipped",
//! the error class, or "NONFINITE" (a non-finite result returned: always a failure).
template <class S>
std::string run_step(S& s, std::vector<float> g) {
  try {
    const bool delivered = s.step(g);
    for (const float v : g)
      if (!std::isfinite(v)) return "NONFINITE";
    return delivered ? "ok" : "skipped";
  } catch (const numeric_error&) {
    return "numeric_error";
  } catch (const mismatch_error&) {
    return "mismatch_error";
  } catch (const wire_error&) {
    return "wire_error";
  } catch (const peer_failure&) {
    return "peer_failure";
  } catch (const invalid_argument&) {
    return "invalid_argument";
  } catch (const commpact::error&) {
    return "commpact::error";
  } catch (const std::exception& e) {
    return std::string("std::exception: ") + e.what();
  }
}


//! The outcomes a guarantee allows.
bool acceptable(const std::string& o) { return o == "ok" || o == "skipped" || o == "numeric_error"; }

//! Every section of `blob` as (tag, type, count).
struct section_info {
  std::uint32_t tag, type;
  std::uint64_t count;
};
std::vector<section_info> sections_of(const bytes& blob) {
  std::vector<section_info> out;
  std::size_t at = state::header_bytes;
  std::uint32_t n;
  std::memcpy(&n, blob.data() + 16, 4);
  for (std::uint32_t s = 0; s < n; ++s) {
    section_info i;
    std::memcpy(&i.tag, blob.data() + at, 4);
    std::memcpy(&i.type, blob.data() + at + 4, 4);
    std::memcpy(&i.count, blob.data() + at + 8, 8);
    if (s > 0) out.push_back(i);
    const std::size_t esz = i.type == 3 ? 1 : i.type == 2 ? 4 : 8;
    at += 16 + ((i.count * esz + 7) & ~std::size_t{7});
  }
  return out;
}
std::string kind_of(const bytes& blob) {
  std::uint64_t count;
  std::memcpy(&count, blob.data() + state::header_bytes + 8, 8);
  return std::string(reinterpret_cast<const char*>(blob.data() + state::header_bytes + 16), count);
}

//! One crafted edit of a blob: int64 entry `index` of section `tag` set to `i`, or the
//! floats of section `tag` (all of them, or index 0) set to `f`.
struct edit {
  std::uint32_t tag;
  bool is_float;
  std::size_t index;  // npos: every float of the section
  std::int64_t i;
  float f;
  std::string name() const {
    std::string where = index == std::string::npos ? std::string("[all]") : commpact::detail::cat("[", index, "]");
    return is_float ? commpact::detail::cat("section ", tag, where, " = ", f)
                    : commpact::detail::cat("section ", tag, where, " = ", i);
  }
};

bytes apply(const bytes& good, const edit& e) {
  return commpact_test::craft(good, kind_of(good), [&](std::uint32_t t, std::uint32_t type, bytes& payload) {
    if (t != e.tag) return;
    if (e.is_float && type == 2) {
      for (std::size_t j = 0; j * 4 < payload.size(); ++j)
        if (e.index == std::string::npos || j == e.index) std::memcpy(payload.data() + 4 * j, &e.f, 4);
    } else if (!e.is_float && type == 1 && 8 * e.index < payload.size()) {
      std::memcpy(payload.data() + 8 * e.index, &e.i, 8);
    }
  });
}

//! The edits of (a) for a blob: each int64 entry at 0, INT64_MAX, -1, INT64_MIN; each
//! float section (all of it, and its first value) at FLT_MAX, -FLT_MAX and 3e38.
std::vector<edit> edits_of(const bytes& good) {
  std::vector<edit> out;
  for (const auto& s : sections_of(good)) {
    if (s.type == 1)
      for (std::size_t j = 0; j < s.count; ++j)
        for (std::int64_t v : {std::int64_t{0}, std::numeric_limits<std::int64_t>::max(), std::int64_t{-1},
                               std::numeric_limits<std::int64_t>::min()})
          out.push_back({s.tag, false, j, v, 0.0f});
    if (s.type == 2 && s.count > 0)
      for (float v : {FLT_MAX, -FLT_MAX, kBig})
        for (std::size_t j : {std::string::npos, std::size_t{0}}) out.push_back({s.tag, true, j, 0, v});
  }
  return out;
}

//! Runs (a) for one type on kP ranks; returns the failures, one line each.
template <class T>
std::vector<std::string> check_crafted_states() {
  using Case = typename T::c;
  std::vector<std::vector<std::string>> steps(kP);  // per rank: the outcome of each edit's two steps
  std::vector<std::string> names, local(kP);        // the edits; per rank: its load failures
  run_threads(kP, [&](ThreadComm& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    subject<Case, T::is_deferred> s{comm, nonfinite::raise};
    for (int t = 0; t < 3; ++t) run_step(s, normal(100 * t + r, kN));
    const bytes good = s.save();
    const auto aux = s.aux;
    const auto edits = edits_of(good);
    for (const auto& e : edits) {
      if (r == 0) names.push_back(e.name());
      try {
        s.obj.load_state(apply(good, e));
      } catch (const commpact::error&) {
        if (s.save() != good) local[r] += e.name() + ": rejected but changed the object\n";
      } catch (const std::exception& x) {
        local[r] += commpact::detail::cat(e.name(), ": rejected with a non-commpact error: ", x.what(), "\n");
      }
      std::string o;
      for (int t = 0; t < 2; ++t) o.append(" ").append(run_step(s, normal(1000 + 10 * t + r, kN)));
      steps[r].push_back(o);
      s.obj.load_state(good);  // back to the saved state for the next edit
      s.aux = aux;
    }
  });
  std::vector<std::string> fails;
  for (int r = 0; r < kP; ++r)
    if (!local[r].empty()) fails.push_back(commpact::detail::cat("rank ", r, ": ", local[r]));
  REQUIRE(!names.empty());
  for (std::size_t k = 0; k < names.size(); ++k) {
    for (int r = 1; r < kP; ++r)
      if (steps[r].at(k) != steps[0].at(k))
        fails.push_back(commpact::detail::cat(names[k], ": ranks differ:", steps[0][k], " | rank ", r, ":", steps[r][k]));
    std::istringstream words(steps[0][k]);
    for (std::string w; words >> w;)
      if (!acceptable(w)) {
        fails.push_back(commpact::detail::cat(names[k], ": not acceptable:", steps[0][k]));
        break;
      }
  }
  return fails;
}

//! Runs (c) for one type: every rank passes `g(rank)` (finite, its mean over the ranks
//! overflows); returns every rank's outcome.
template <class T, class G>
std::vector<std::string> overflow_outcomes(nonfinite p, G g) {
  std::vector<std::string> out(kP);
  run_threads(kP, [&](ThreadComm& comm) {
    subject<typename T::c, T::is_deferred> s{comm, p};
    const auto r = static_cast<std::size_t>(comm.rank());
    run_step(s, normal(7 + r, kN));  // a good step first (the agreement, a residual)
    out[r] = run_step(s, g(comm.rank()));
  });
  return out;
}

std::vector<float> all_max(int) { return std::vector<float>(kN, FLT_MAX); }
std::vector<float> big_at_one(int r) {
  auto g = normal(50 + static_cast<std::uint64_t>(r), kN);
  g[37] = kBig;
  return g;
}

}  // namespace

TEMPLATE_TEST_CASE("(a) crafted states: rejected, or used alike with finite results (host and deferred)",
                   "[hardening][state]", in_host<dense_case>, in_deferred<dense_case>, in_host<topk_case>,
                   in_deferred<topk_case>, in_host<topk_momentum_case>, in_host<gtopk_case>, in_deferred<gtopk_case>,
                   in_host<power_case>, in_deferred<power_case>, in_host<power_dense_start_case>,
                   in_deferred<power_dense_start_case>, in_host<linear_randomk_case>, in_deferred<linear_randomk_case>,
                   in_host<linear_randomk_scaled_case>, in_host<majority_case>, in_deferred<majority_case>,
                   in_host<oktopk_case>, in_deferred<oktopk_case>, in_host<fp16_allreduce_case>, in_deferred<fp16_allreduce_case>,
                   in_host<bf16_allreduce_case>, in_host<codec_case<sign_codec>>, in_deferred<codec_case<sign_codec>>,
                   in_host<codec_case<qsgd_codec>>, in_deferred<codec_case<qsgd_codec>>, in_host<codec_case<terngrad_codec>>,
                   in_host<codec_case<onebit_codec>>, in_host<codec_case<natural_codec>>, in_host<codec_case<fp16_codec>>,
                   in_host<codec_case<bf16_codec>>, in_host<codec_case<threshold_codec>>, in_host<codec_case<dgc_codec>>,
                   in_host<codec_case<gaussiank_codec>>, in_host<gossip_power_case>, in_host<gossip_choco_case>,
                   in_host<gossip_dpsgd_case>, in_host<data_parallel_case>) {
  const auto fails = check_crafted_states<TestType>();
  for (const auto& f : fails) FAIL_CHECK(f);
  CHECK(fails.empty());
}

TEMPLATE_TEST_CASE("(c) finite gradients whose mean overflows: numeric_error or a skipped step alike, never Inf",
                   "[hardening][overflow]", in_host<dense_case>, in_deferred<dense_case>, in_host<topk_case>,
                   in_deferred<topk_case>, in_host<topk_momentum_case>, in_host<gtopk_case>, in_deferred<gtopk_case>,
                   in_host<power_case>, in_deferred<power_case>, in_host<power_dense_start_case>,
                   in_deferred<power_dense_start_case>, in_host<linear_randomk_case>, in_deferred<linear_randomk_case>,
                   in_host<linear_randomk_scaled_case>, in_host<majority_case>, in_deferred<majority_case>,
                   in_host<oktopk_case>, in_deferred<oktopk_case>, in_host<fp16_allreduce_case>, in_deferred<fp16_allreduce_case>,
                   in_host<bf16_allreduce_case>, in_host<codec_case<sign_codec>>, in_deferred<codec_case<sign_codec>>,
                   in_host<codec_case<qsgd_codec>>, in_deferred<codec_case<qsgd_codec>>, in_host<codec_case<terngrad_codec>>,
                   in_host<codec_case<onebit_codec>>, in_host<codec_case<natural_codec>>, in_host<codec_case<fp16_codec>>,
                   in_host<codec_case<bf16_codec>>, in_host<codec_case<threshold_codec>>, in_host<codec_case<dgc_codec>>,
                   in_host<codec_case<gaussiank_codec>>, in_host<gossip_choco_case>,
                   in_host<gossip_dpsgd_case>, in_host<data_parallel_case>, in_host<gossip_power_case>) {
  for (const nonfinite p : {nonfinite::raise, nonfinite::skip_step})
    for (int input = 0; input < 2; ++input) {
      const auto out = overflow_outcomes<TestType>(p, input == 0 ? all_max : big_at_one);
      CAPTURE(p == nonfinite::raise ? "raise" : "skip_step", input == 0 ? "FLT_MAX everywhere" : "3e38 at one index",
              out[0], out[1], out[2]);
      for (int r = 0; r < kP; ++r) {
        CHECK(out[r] == out[0]);
        CHECK(acceptable(out[r]));
        if constexpr (!requires { TestType::c::always_raises; })
          if (p == nonfinite::skip_step) CHECK(out[r] != "numeric_error");
      }
    }
}

// An on_nonfinite outside the enum (an integer cast to it) would be read as skip_step by
// the steps: every type refuses it at construction with invalid_argument naming the option,
// on every rank (no communication, so a rank's refusal leaves no other waiting).
TEMPLATE_TEST_CASE("an on_nonfinite outside the enum raises invalid_argument at construction, naming the option",
                   "[hardening][options]", in_host<dense_case>, in_deferred<dense_case>, in_host<topk_case>,
                   in_deferred<topk_case>, in_host<gtopk_case>, in_deferred<gtopk_case>, in_host<power_case>,
                   in_deferred<power_case>, in_host<linear_randomk_case>, in_deferred<linear_randomk_case>,
                   in_host<majority_case>, in_deferred<majority_case>, in_host<oktopk_case>, in_deferred<oktopk_case>,
                   in_host<fp16_allreduce_case>, in_deferred<fp16_allreduce_case>, in_host<bf16_allreduce_case>,
                   in_host<codec_case<sign_codec>>, in_deferred<codec_case<qsgd_codec>>, in_host<gossip_power_case>,
                   in_host<gossip_choco_case>, in_host<gossip_dpsgd_case>, in_host<data_parallel_case>) {
  for (const int bad : {2, 7, -1}) {
    std::vector<std::string> what(kP);
    run_threads(kP, [&](ThreadComm& comm) {
      auto& w = what[static_cast<std::size_t>(comm.rank())];
      try {
        subject<typename TestType::c, TestType::is_deferred> s{comm, static_cast<nonfinite>(bad)};
        w = "constructed";
      } catch (const invalid_argument& e) {
        w = e.what();
      } catch (const std::exception& e) {
        w = std::string("another error: ") + e.what();
      }
    });
    for (int r = 0; r < kP; ++r) {
      CAPTURE(bad, r);
      CHECK_THAT(what[static_cast<std::size_t>(r)],
                 Catch::Matchers::StartsWith("commpact::") &&
                     Catch::Matchers::Contains(commpact::detail::cat(": on_nonfinite = ", bad,
                                                                     " is not a nonfinite value; pass nonfinite::raise "
                                                                     "or nonfinite::skip_step.")));
    }
  }
}

// PowerGossip mixes with low-rank factors kept per edge: a model of FLT_MAX values (or
// 3e38 at one index) would make its products overflow into NaN after the round's flag
// was agreed. The flag covers headroom (a value at or above FLT_MAX / 2^k fails the
// round), so every rank raises numeric_error or skips the round, alike; never NaN.
TEST_CASE("(c) PowerGossip: a model whose mix would overflow raises numeric_error or skips the round alike, never NaN",
          "[hardening][overflow]") {
  for (const nonfinite p : {nonfinite::raise, nonfinite::skip_step})
    for (int input = 0; input < 2; ++input) {
      const auto out = overflow_outcomes<in_host<gossip_power_case>>(p, input == 0 ? all_max : big_at_one);
      CAPTURE(p == nonfinite::raise ? "raise" : "skip_step", input, out[0], out[1], out[2]);
      for (int r = 0; r < kP; ++r) {
        CHECK(out[r] == out[0]);
        CHECK(acceptable(out[r]));
        CHECK(out[r] == (p == nonfinite::raise ? "numeric_error" : "skipped"));
      }
    }
}

namespace {
//! After one rank's buffer of another length: every rank raised mismatch_error naming
//! itself with its length, its state unchanged; rank 1's message holds `rank1_has` (its
//! length, such as "has 182").
void check_length_mismatch(const std::vector<std::string>& cls, const std::vector<std::string>& what,
                           const std::vector<int>& same, const std::string& rank1_has) {
  for (int r = 0; r < kP; ++r) {
    CAPTURE(r, what[r]);
    CHECK(cls[r] == "mismatch_error");
    CHECK(what[r].find(commpact::detail::cat("ranks disagree on the gradient length: rank ", r, " has ")) !=
          std::string::npos);
    CHECK(same[r] == 1);
  }
  CHECK(what[1].find(rank1_has) != std::string::npos);
}
}  // namespace

// At the first step (the agreement of the layout and the length comes before any factor).
TEST_CASE("PowerCompressor: one rank's buffer of another length raises mismatch_error on every rank, naming it",
          "[hardening][power][mismatch]") {
  const bool deferred_space_too = GENERATE(false, true);
  std::vector<std::string> what(kP), cls(kP);
  std::vector<int> same(kP);
  run_threads(kP, [&](ThreadComm& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    auto body = [&](auto& s) {
      const bytes before = s.save();
      std::vector<float> g = normal(5 + r, comm.rank() == 1 ? kN + 1 : kN);
      try {
        s.step(g);
        cls[r] = "none";
      } catch (const mismatch_error& e) {
        cls[r] = "mismatch_error", what[r] = e.what();
      } catch (const std::exception& e) {
        cls[r] = "other", what[r] = e.what();
      }
      same[r] = s.save() == before;
      // The ranks are in step afterwards: the next step works on every rank.
      RANK_REQUIRE_EQ(run_step(s, normal(9 + r, kN)), std::string("ok"));
    };
    if (deferred_space_too) {
      subject<power_case, true> s{comm, nonfinite::raise};
      body(s);
    } else {
      subject<power_case, false> s{comm, nonfinite::raise};
      body(s);
    }
  });
  check_length_mismatch(cls, what, same, commpact::detail::cat("has ", kN + 1));
}

// After the first step (the length rides in the step check, compress/step_check.hpp): a
// rank whose buffer does not fit runs the step's collectives on its own workspaces.
TEST_CASE("PowerCompressor: one rank's buffer of another length after the first step raises mismatch_error on every "
          "rank, naming it", "[hardening][power][mismatch]") {
  const bool deferred_space_too = GENERATE(false, true);
  const int start_step = GENERATE(0, 3);  // a compressed step, or a dense one (the staging buffer)
  const std::size_t odd = GENERATE(kN + 1, kN - 1, 2 * kN);
  CAPTURE(deferred_space_too, start_step, odd);
  std::vector<std::string> what(kP), cls(kP), next(kP);
  std::vector<int> same(kP);
  run_threads(kP, [&](ThreadComm& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    auto body = [&](auto& s) {
      RANK_REQUIRE_EQ(run_step(s, normal(3 + r, kN)), std::string("ok"));
      const bytes before = s.save();
      std::vector<float> g = normal(5 + r, comm.rank() == 1 ? odd : kN);
      const std::vector<float> g_in = g;
      try {
        s.step(g);
        cls[r] = "none";
      } catch (const mismatch_error& e) {
        cls[r] = "mismatch_error", what[r] = e.what();
      } catch (const std::exception& e) {
        cls[r] = "other", what[r] = e.what();
      }
      same[r] = s.save() == before && (comm.rank() != 1 || g == g_in);
      next[r] = run_step(s, normal(9 + r, kN));  // the ranks are in step afterwards
    };
    power_options o;
    o.start_step = start_step;
    if (deferred_space_too) {
      DC dc{comm};
      PowerCompressor<2, deferred_space> p{dc, kLayout, o};
      struct {
        DC& comm;
        PowerCompressor<2, deferred_space>& obj;
        bool step(std::vector<float>& g) {
          const auto e = comm.exec();
          auto d = commpact_test::device_copy(e, g);
          const bool ok = obj.reduce(d.view());
          g = commpact_test::host_copy(e, d.cview());
          return ok;
        }
        bytes save() const {
          bytes b;
          obj.save_state(b);
          return b;
        }
      } s{dc, p};
      body(s);
    } else {
      PowerCompressor<2> p{comm, kLayout, o};
      struct {
        PowerCompressor<2>& obj;
        bool step(std::vector<float>& g) { return obj.reduce(std::span<float>(g)); }
        bytes save() const {
          bytes b;
          obj.save_state(b);
          return b;
        }
      } s{p};
      body(s);
    }
  });
  check_length_mismatch(cls, what, same, commpact::detail::cat("has ", odd, " floats"));
  for (int r = 0; r < kP; ++r) CHECK(next[r] == "ok");
}

TEST_CASE("PowerCompressor: every rank's buffer of another length after the first step raises invalid_argument on "
          "every rank", "[hardening][power]") {
  std::vector<std::string> cls(kP), next(kP);
  run_threads(kP, [&](ThreadComm& comm) {
    PowerCompressor<2> p{comm, kLayout};
    std::vector<float> g0 = normal(3, kN);
    p.reduce(std::span<float>(g0));
    std::vector<float> g = normal(5, kN - 1);
    try {
      p.reduce(std::span<float>(g));
      cls[comm.rank()] = "none";
    } catch (const invalid_argument& e) {
      cls[comm.rank()] = std::string(e.what()).find("registered shapes hold") != std::string::npos ? "ok" : e.what();
    } catch (const std::exception& e) {
      cls[comm.rank()] = e.what();
    }
    std::vector<float> g1 = normal(9, kN);
    try {
      p.reduce(std::span<float>(g1));
      next[comm.rank()] = "ok";
    } catch (const std::exception& e) {
      next[comm.rank()] = e.what();
    }
  });
  for (int r = 0; r < kP; ++r) {
    CHECK(cls[r] == "ok");
    CHECK(next[r] == "ok");
  }
}

TEST_CASE("PowerCompressor: every rank's buffer of another length than its layout raises invalid_argument on every rank",
          "[hardening][power]") {
  std::vector<std::string> cls(kP);
  run_threads(kP, [&](ThreadComm& comm) {
    subject<power_case, false> s{comm, nonfinite::raise};
    std::vector<float> g = normal(5, kN - 1);
    try {
      s.step(g);
      cls[comm.rank()] = "none";
    } catch (const invalid_argument& e) {
      cls[comm.rank()] = std::string(e.what()).find("registered shapes hold") != std::string::npos ? "ok" : e.what();
    }
    RANK_REQUIRE_EQ(run_step(s, normal(9, kN)), std::string("ok"));
  });
  for (int r = 0; r < kP; ++r) CHECK(cls[r] == "ok");
}

TEST_CASE("Dense: a non-finite mean raises on every rank and leaves exactly that mean in grad", "[hardening][dense]") {
  // The allreduce runs in place (no copy of the gradient), so a raised step leaves the
  // mean over the ranks in grad: mean_of(sum in rank order, P) at every index.
  const bool on_deferred = GENERATE(false, true);
  std::vector<std::vector<float>> inputs(kP), outputs(kP);
  std::vector<std::string> cls(kP);
  for (int r = 0; r < kP; ++r) {
    inputs[r] = normal(40 + static_cast<std::uint64_t>(r), kN);
    inputs[r][11] = kBig;  // 3 x 3e38 overflows
  }
  run_threads(kP, [&](ThreadComm& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    std::vector<float> g = inputs[r];
    try {
      if (on_deferred) {
        DC dc{comm};
        Dense<DC> d{dc};
        const auto e = dc.exec();
        auto dg = commpact_test::device_copy(e, g);
        try {
          d.reduce(dg.view());
        } catch (...) {
          g = commpact_test::host_copy(e, dg.cview());
          throw;
        }
      } else {
        Dense<ThreadComm> d{comm};
        d.reduce(std::span<float>(g));
      }
      cls[r] = "none";
    } catch (const numeric_error&) {
      cls[r] = "numeric_error";
    }
    outputs[r] = g;
  });
  std::vector<float> mean(kN);
  for (std::size_t i = 0; i < kN; ++i) {
    float sum = inputs[0][i];
    for (int r = 1; r < kP; ++r) sum += inputs[r][i];
    mean[i] = mean_of(sum, kP);
  }
  REQUIRE(std::isinf(mean[11]));
  for (int r = 0; r < kP; ++r) {
    CHECK(cls[r] == "numeric_error");
    CHECK(std::memcmp(outputs[r].data(), mean.data(), 4 * kN) == 0);
  }
}
