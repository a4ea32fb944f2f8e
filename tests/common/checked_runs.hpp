#pragma once
// The suites run their multi-rank cases under CheckedComm: every collective a
// compressor, mixer or driver issues is first checked to be the same call on every rank.
// - Host suites: run_checked_threads(P, fn) gives each rank a CheckedComm<ThreadComm>.
// - MPI suites: checked_mpi_world() (tests/common/checked_mpi.hpp) wraps an MpiComm whose
//   own verification is off, so the decorator is the only check.
// check_bucket_order shows the decorator at work inside a compressor: two compressors
// (buckets of n and 10 floats) have agreed their lengths in good steps, then one rank
// reduces the small bucket while the others reduce the large one (the classic bug of
// buckets reduced in another order on one rank). Neither compressor re-agrees, so its own
// agreement cannot catch this; over an unchecked MpiComm it is undefined behaviour (10
// against 10000 floats corrupts OpenMPI's heap). The decorator raises mismatch_error on
// every rank before data moves, and both compressors' states are unchanged.
#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/error.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace commpact_test {

using checked_thread_comm = commpact::CheckedComm<commpact::ThreadComm>;

//! run_threads, each rank's function called with a CheckedComm<ThreadComm> of its rank.
template <class F>
void run_checked_threads(int P, F&& fn, commpact::thread_options opt = {}) {
  commpact::run_threads(
      P,
      [&](commpact::ThreadComm& t) {
        checked_thread_comm comm{t};
        fn(comm);
      },
      opt);
}

//! What one rank saw in check_bucket_order (asserted by the caller after the ranks
//! ended: Catch2 assertions inside rank threads race).
struct bucket_order_outcome {
  bool raised_mismatch = false;  //!< the bad step raised commpact::mismatch_error
  bool state_kept = false;       //!< save_state bytes of both buckets equal before and after it
  bool next_step_ok = false;     //!< good steps afterwards equal those of twins that never saw it
  std::string what;              //!< the error message, or what went wrong
};

//! `make(len)` builds a fresh compressor (the same on every rank) for gradients of len
//! floats, with reduce(span<float>) and save_state. Runs `warm` good steps of a bucket of
//! n floats and one of `small` floats; then rank `odd` reduces the small bucket while the
//! others reduce the large one; then one more good step of each, compared with twins that
//! never saw the bad step. Every rank returns its outcome; nothing is asserted here.
template <class Comm, class Make>
bucket_order_outcome check_bucket_order(Comm& comm, Make make, std::size_t n = 10000, std::size_t small = 10,
                                        int odd = 0, int warm = 2) {
  bucket_order_outcome out;
  auto grad = [&](int step, std::size_t len) {
    std::vector<float> g(len);
    for (std::size_t i = 0; i < len; ++i)
      g[i] = static_cast<float>((i * 7919 + static_cast<std::size_t>(step) * 31 + comm.rank() * 131u) % 1999) /
                 999.5f -
             1.0f;
    return g;
  };
  auto a = make(n), b = make(small), ta = make(n), tb = make(small);
  auto good_step = [&](int s) {
    auto ga = grad(s, n), gb = grad(s, small), ha = ga, hb = gb;
    a.reduce(std::span<float>(ga));
    b.reduce(std::span<float>(gb));
    ta.reduce(std::span<float>(ha));
    tb.reduce(std::span<float>(hb));
    return ga == ha && gb == hb;
  };
  auto states = [&] {
    std::vector<std::byte> sa, sb;
    a.save_state(sa);
    b.save_state(sb);
    sa.insert(sa.end(), sb.begin(), sb.end());
    return sa;
  };
  for (int s = 0; s < warm; ++s) good_step(s);
  const auto before = states();
  try {
    auto g = grad(warm, comm.rank() == odd ? small : n);
    if (comm.rank() == odd) b.reduce(std::span<float>(g));
    else a.reduce(std::span<float>(g));
    out.what = "the bad step returned normally";
  } catch (const commpact::mismatch_error& e) {
    out.raised_mismatch = true;
    out.what = e.what();
  } catch (const std::exception& e) {
    out.what = std::string("another error: ") + e.what();
  }
  out.state_kept = states() == before;
  try {
    const bool same = good_step(warm + 1);
    std::vector<std::byte> sa, sta, sb, stb;
    a.save_state(sa), ta.save_state(sta), b.save_state(sb), tb.save_state(stb);
    out.next_step_ok = same && sa == sta && sb == stb;
  } catch (const std::exception& e) {
    out.what += std::string("; the next good step raised: ") + e.what();
  }
  return out;
}

}  // namespace commpact_test
