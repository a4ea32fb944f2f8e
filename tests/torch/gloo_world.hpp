#pragma once
// run_gloo(P, fn): P ranks as threads of this process, each with its own FileStore on
// one temporary file, its own ProcessGroupGloo over TCP on loopback and a TorchComm over
// it; fn(TorchComm&) runs on every rank. Like run_threads (comm/thread_comm.hpp): an
// exception on one rank aborts its communicator (the others raise peer_failure), every
// rank is joined, and the lowest rank's root cause is rethrown (else the lowest
// peer_failure). Ranks keep their group alive until every rank has finished (a count in
// the store), so a send in flight is never cut off by a rank that left early.
#include <commpact/torch/gloo.hpp>
#include <commpact/torch/torch_comm.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace commpact_test {

inline std::string fresh_store_path() {
  static std::atomic<int> counter{0};
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/commpact-torch-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter++);
}

template <class F>
void run_gloo(int P, F&& fn, commpact::torch_options opt = {},
              std::chrono::milliseconds gloo_timeout = std::chrono::seconds(60)) {
  const std::string path = fresh_store_path();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(P));
  std::vector<char> root(static_cast<std::size_t>(P), 0);
  auto body = [&](int r) {
    c10::intrusive_ptr<c10d::Store> store;
    std::optional<commpact::TorchComm> comm;
    try {
      store = c10::make_intrusive<c10d::FileStore>(path, P);
      auto pg = commpact::torch_gloo_group(store, r, P, gloo_timeout);
      comm.emplace(pg, store, opt);
      fn(*comm);
    } catch (const commpact::peer_failure&) {
      errors[r] = std::current_exception();
    } catch (const std::exception& e) {
      errors[r] = std::current_exception();
      root[r] = 1;
      if (comm) comm->abort(std::string("threw: ") + e.what());
    } catch (...) {  // a failed Catch2 assertion
      errors[r] = std::current_exception();
      root[r] = 1;
      if (comm) comm->abort("threw a non-standard exception (a failed assertion)");
    }
    if (!store) return;
    try {  // leave together: count in the store, wait (bounded) for every rank
      store->add("run_gloo/done", 1);
      const auto t0 = std::chrono::steady_clock::now();
      while (store->add("run_gloo/done", 0) < P && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    } catch (...) {
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < P; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  std::error_code ec;
  std::filesystem::remove(path, ec);
  for (int r = 0; r < P; ++r)
    if (errors[r] && root[r]) std::rethrow_exception(errors[r]);
  for (int r = 0; r < P; ++r)
    if (errors[r]) std::rethrow_exception(errors[r]);
}

}  // namespace commpact_test
