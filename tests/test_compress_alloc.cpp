// TopK and gTopK allocate nothing after the first step. The global operator new counts
// allocations per thread; a communicator decorator pauses the count while the
// communicator itself runs (ThreadComm's mailboxes are its own business), so what is
// counted is exactly what the compressors, TreeComm and the kernels allocate.
// commpact-standalone: it replaces the global operator new (COMMPACT_TESTS_UNITY)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/topk.hpp>

#include <cstdlib>
#include <new>

#include "common/sparse_checks.hpp"

namespace {
thread_local long t_allocs = 0;
thread_local bool t_paused = false;
}  // namespace
void* operator new(std::size_t n) {
  if (!t_paused) ++t_allocs;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (!t_paused) ++t_allocs;
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

using namespace commpact;
using namespace commpact_test;

namespace {
struct pause {
  bool was = t_paused;
  pause() { t_paused = true; }
  ~pause() { t_paused = was; }
};
template <class C>
struct Paused {
  C c;
  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  template <class T>
  void allreduce(std::span<T> d, reduce_op op = reduce_op::sum) {
    pause p;
    c.allreduce(d, op);
  }
  template <class T>
  void allgather(std::span<const T> in, std::span<T> out) {
    pause p;
    c.allgather(in, out);
  }
  template <class T>
  void broadcast(std::span<T> d, int root) {
    pause p;
    c.broadcast(d, root);
  }
  void barrier() {
    pause p;
    c.barrier();
  }
  void abort(std::string_view why) {
    pause p;
    c.abort(why);
  }
  void send(int peer, std::span<const std::byte> m) {
    pause p;
    c.send(peer, m);
  }
  void recv(int peer, std::vector<std::byte>& b) {
    pause p;
    c.recv(peer, b);
  }
  void sendrecv(int peer, std::span<const std::byte> m, std::vector<std::byte>& b) {
    pause p;
    c.sendrecv(peer, m, b);
  }
};
static_assert(PointToPoint<Paused<ThreadComm>>);

template <class Comp>
void run_counted(int P, sparse_options opt, int kinds) {
  std::vector<long> counted(P, -1), first(P, -1);
  run_threads(P, [&](ThreadComm& comm) {
    Comp c{Paused<ThreadComm>{comm}, opt};
    std::vector<std::vector<float>> xs;
    for (int s = 0; s < 8; ++s) xs.push_back(grad_of(3, s, comm.rank(), 20000, s % kinds));
    long before = t_allocs;
    for (int s = 0; s < 8; ++s) {
      if (s == 1) first[comm.rank()] = t_allocs - before;  // the first step sizes the workspaces
      if (s == 2) before = t_allocs;
      c.reduce(std::span<float>(xs[s]));
    }
    counted[comm.rank()] = t_allocs - before;
  });
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    REQUIRE(first[r] > 0);  // the counter sees the compressor's allocations
    REQUIRE(counted[r] == 0);
  }
}
}  // namespace

TEST_CASE("gTopK allocates nothing after the first step (counted)", "[compress][gtopk][alloc]") {
  const int P = GENERATE(1, 2, 3, 5, 8);
  const float momentum = GENERATE(0.0f, 0.9f);
  CAPTURE(P, momentum);
  run_counted<gTopK<TreeComm<Paused<ThreadComm>>>>(P, {.density = 0.01, .momentum = momentum}, 3);
}

TEST_CASE("TopK allocates nothing after the first step (counted)", "[compress][topk][alloc]") {
  const int P = GENERATE(1, 2, 3, 5);
  CAPTURE(P);
  run_counted<TopK<Paused<ThreadComm>>>(P, {.density = 0.01}, 3);
}
