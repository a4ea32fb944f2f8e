#pragma once
// The suites run their multi-rank cases under CheckedComm (issue 9): every collective a
// compressor, mixer or driver issues is first checked to be the same call on every rank.
// - Host suites: run_checked_threads(P, fn) gives each rank a CheckedComm<ThreadComm>.
// - MPI suites: checked_mpi_world() (tests/common/checked_mpi.hpp) wraps an MpiComm whose
//   own verification is off, so the decorator is the only check.
// check_late_mismatch shows the decorator at work inside a compressor: after a good step
// has cached the agreed length, one rank passes 10 floats where the others pass n. The
// compressor does not re-agree on the ranks whose length did not change, so its own
// agreement cannot catch this; the decorator raises mismatch_error on every rank (an
// unchecked MpiComm would corrupt its heap), and the compressor's state is unchanged.
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

//! What one rank saw in check_late_mismatch (asserted by the caller after the ranks
//! ended: Catch2 assertions inside rank threads race).
struct late_mismatch_outcome {
  bool raised_mismatch = false;  //!< the bad step raised commpact::mismatch_error
  bool state_kept = false;       //!< save_state bytes equal before and after the bad step
  bool grad_kept = false;        //!< the gradient passed to the bad step is untouched
  bool next_step_ok = false;     //!< a good step afterwards gives the state of a run without the bad step
  std::string what;              //!< the error message, or what went wrong
};

//! `make()` builds a fresh compressor (same on every rank) with reduce(span<float>) and
//! save_state. Runs `warm` good steps of length n; then rank `odd` passes 10 floats while
//! the others pass n; then one more good step, compared with a twin that never saw the
//! bad step. Every rank returns its outcome; nothing is asserted here.
template <class Comm, class Make>
late_mismatch_outcome check_late_mismatch(Comm& comm, Make make, std::size_t n = 10000, int odd = 0, int warm = 2) {
  late_mismatch_outcome out;
  auto grad = [&](int step, std::size_t len) {
    std::vector<float> g(len);
    for (std::size_t i = 0; i < len; ++i)
      g[i] = static_cast<float>(((i * 7919 + static_cast<std::size_t>(step) * 31 + comm.rank() * 131u) % 1999)) /
                 999.5f -
             1.0f;
    return g;
  };
  auto c = make(), twin = make();
  for (int s = 0; s < warm; ++s) {
    auto g = grad(s, n), h = g;
    c.reduce(std::span<float>(g));
    twin.reduce(std::span<float>(h));
  }
  std::vector<std::byte> before, after;
  c.save_state(before);
  auto bad = grad(warm, comm.rank() == odd ? 10 : n);
  const auto bad_copy = bad;
  try {
    c.reduce(std::span<float>(bad));
    out.what = "the bad step returned normally";
  } catch (const commpact::mismatch_error& e) {
    out.raised_mismatch = true;
    out.what = e.what();
  } catch (const std::exception& e) {
    out.what = std::string("another error: ") + e.what();
  }
  c.save_state(after);
  out.state_kept = before == after;
  out.grad_kept = bad == bad_copy;
  auto g = grad(warm + 1, n), h = g;
  try {
    c.reduce(std::span<float>(g));
    twin.reduce(std::span<float>(h));
    std::vector<std::byte> sc, st;
    c.save_state(sc);
    twin.save_state(st);
    out.next_step_ok = g == h && sc == st;
  } catch (const std::exception& e) {
    out.what += std::string("; the next good step raised: ") + e.what();
  }
  return out;
}

}  // namespace commpact_test
