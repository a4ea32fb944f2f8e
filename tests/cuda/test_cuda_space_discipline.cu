// SPDX-License-Identifier: Apache-2.0
// The CUDA space's device discipline (space/cuda.hpp), on one GPU. Every check holds the
// stream with a gate kernel that spins on a flag in mapped pinned memory until the host
// releases it (or about 10 s pass, so that a broken check cannot hang the run), so that
// "queued, not yet run" is a state the test controls instead of a race:
// - to_host into pinned memory stays queued: it returns while the gate holds, the copy's
//   event is not ready, and the values land after the fence;
// - record/wait orders two executors (the consumer on B reads what the producer on A
//   wrote after the gate), and record_stream/stream_wait join a caller's raw stream both
//   ways;
// - stream-ordered growth: resize(n, exec) returns while the gate holds, keeps the
//   contents written by queued work, poisons the new elements (0xFF bytes); the
//   executor's scratch grows the same way; a buffer never bound grows by the fallback;
// - a buffer destroyed with work queued on its stream: the work completes on the old
//   storage (its free is stream-ordered), while another executor allocates and writes;
// - fence(exec, deadline) raises timeout_error at the deadline while the gate holds, and
//   the executor works again once the gate is released;
// - inside a cuda_fence_point scope, fence waits for the point only (returns while the gate
//   holds the work queued after it), and for the whole stream again after the scope;
// - two NcclComm::single on one executor: both hooks installed, a fence past its
//   deadline aborts both, an aborted one raises peer_failure at the fence, and a
//   destroyed one's hook is gone.
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "commpact/comm/nccl_comm.hpp"
#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/space/cuda.hpp"

#include "cuda_test_common.cuh"

namespace cp = commpact;
using D = cp::ops<cp::cuda_space>;
using S = cp::cuda_space;
using commpact_test::download;

namespace {

using clk = std::chrono::steady_clock;

//! Spins until *flag != 0 or max_cycles pass (a safety net, not part of any check).
__global__ void gate_kernel(const volatile int* flag, long long max_cycles) {
  const long long t0 = clock64();
  while (*flag == 0 && clock64() - t0 < max_cycles) __nanosleep(1000);
}

//! p[i] = base + i.
__global__ void iota_kernel(float* p, std::size_t n, float base) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = base + static_cast<float>(i);
}

void ok(cudaError_t e, const char* what) { cp::cuda_kernels::detail::check(e, what, "test_cuda_space_discipline"); }

//! A flag in mapped pinned memory: the host releases gate kernels by setting it.
struct gate {
  int* host = nullptr;
  int* dev = nullptr;
  long long cycles = 0;
  gate() {
    ok(cudaHostAlloc(reinterpret_cast<void**>(&host), sizeof(int), cudaHostAllocMapped), "cudaHostAlloc (flag)");
    ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), host, 0), "cudaHostGetDevicePointer");
    int d = 0, khz = 0;
    ok(cudaGetDevice(&d), "cudaGetDevice");
    (void)cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, d);
    cycles = static_cast<long long>(khz > 0 ? khz : 2000000) * 1000LL * 10;  // about 10 s
    close();
  }
  gate(const gate&) = delete;
  gate& operator=(const gate&) = delete;
  ~gate() { (void)cudaFreeHost(host); }
  void close() { __atomic_store_n(host, 0, __ATOMIC_SEQ_CST); }
  void open() { __atomic_store_n(host, 1, __ATOMIC_SEQ_CST); }
  //! Queues a gate kernel on s (closed: it holds the stream until open()).
  void hold(cudaStream_t s) {
    close();
    gate_kernel<<<1, 1, 0, s>>>(dev, cycles);
    ok(cudaGetLastError(), "gate_kernel");
  }
};

void iota(const S::exec& e, cp::cuda_span<float> v, float base) {
  iota_kernel<<<64, 256, 0, e.stream()>>>(cp::cuda_access::ptr(v), v.size(), base);
  ok(cudaGetLastError(), "iota_kernel");
}

bool is_iota(std::span<const float> h, float base, std::size_t from = 0, std::size_t to = std::size_t(-1)) {
  if (to > h.size()) to = h.size();
  for (std::size_t i = from; i < to; ++i)
    if (h[i] != base + static_cast<float>(i)) return false;
  return true;
}
bool all_ff(std::span<const float> h, std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) {
    std::uint32_t b = 0;
    std::memcpy(&b, &h[i], 4);
    if (b != 0xFFFFFFFFu) return false;
  }
  return true;
}
double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

//! to_host into pinned memory returns while the stream is held; the copy lands after the fence.
void check_pinned_to_host(gate& g) {
  const auto e = S::make_exec();
  S::activate(e);
  int cur = -1;
  ok(cudaGetDevice(&cur), "cudaGetDevice");
  EXPECT(cur == e.device(), "activate did not make the executor's device %d current (%d)", e.device(), cur);
  const std::size_t n = 1 << 20;
  cp::cuda_buffer<float> d;
  d.resize(n, e);
  EXPECT(d.bound_stream() == e.stream(), "resize(n, exec) did not bind the buffer to the executor's stream");
  S::pinned<float> h;
  h.resize(n);
  g.hold(e.stream());
  iota(e, d.view(), 3.0f);
  const auto t0 = clk::now();
  D::to_host(e, d.cview(), h.view());
  const auto ev = S::record(e);
  const double took = seconds_since(t0);
  EXPECT(!ev.ready(), "the copy to pinned memory had completed right after to_host returned (the gate holds)");
  EXPECT(took < 1.0, "to_host into pinned memory took %.3f s: it waited for the stream", took);
  g.open();
  S::fence(e, cp::no_deadline());
  EXPECT(ev.ready(), "the copy's event is not ready after the fence");
  EXPECT(is_iota(h.cview(), 3.0f), "the pinned copy does not hold the values written before it");
}

//! record/wait between two executors, and a caller's raw stream joined both ways.
void check_record_wait(gate& g) {
  const auto a = S::make_exec(), b = S::make_exec();
  const std::size_t n = 100003;
  cp::cuda_buffer<float> src, dst;
  src.resize(n, a);
  dst.resize(n, b);
  D::fill(a, src.view(), -1.0f);
  D::fill(b, dst.view(), -2.0f);
  S::fence(a, cp::no_deadline());
  S::fence(b, cp::no_deadline());
  g.hold(a.stream());
  iota(a, src.view(), 7.0f);  // the producer, behind the gate
  S::wait(b, S::record(a));
  D::copy(b, src.cview(), dst.view());  // the consumer, on b
  const auto done_b = S::record(b);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT(!done_b.ready(), "the consumer on b ran before the producer on a (wait(b, record(a)) did not order it)");
  g.open();
  S::fence(b, cp::no_deadline());
  EXPECT(is_iota(download(b, dst.cview()), 7.0f), "the consumer on b did not read what the producer on a wrote");

  // A caller's raw stream (a framework's): its work joined before b's, b's before its next.
  cudaStream_t raw = nullptr;
  ok(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), "cudaStreamCreate");
  const auto r = S::make_exec(raw);
  EXPECT(r.stream() == raw && r.device() == b.device(), "make_exec(stream) did not wrap the caller's stream");
  g.hold(raw);
  iota_kernel<<<64, 256, 0, raw>>>(cp::cuda_access::ptr(src.view()), n, 11.0f);
  ok(cudaGetLastError(), "iota_kernel (raw)");
  S::wait(b, S::record_stream(raw));
  D::copy(b, src.cview(), dst.view());
  const auto step = S::record(b);
  S::stream_wait(raw, step);
  iota_kernel<<<64, 256, 0, raw>>>(cp::cuda_access::ptr(src.view()), n, 23.0f);  // after b's copy
  ok(cudaGetLastError(), "iota_kernel (raw, after the step)");
  g.open();
  S::fence(b, cp::no_deadline());
  S::fence(r, cp::no_deadline());
  EXPECT(is_iota(download(b, dst.cview()), 11.0f), "b's copy did not see the raw stream's work (record_stream)");
  EXPECT(is_iota(download(r, src.cview()), 23.0f), "the raw stream's later work did not run after b's (stream_wait)");
  ok(cudaStreamDestroy(raw), "cudaStreamDestroy");
}

//! Growth on the executor's stream: queued, contents kept, new elements poisoned.
void check_growth(gate& g) {
  const auto e = S::make_exec();
  cp::cuda_buffer<float> b;
  b.resize(1000, e);
  g.hold(e.stream());
  iota(e, b.view(), 5.0f);  // behind the gate: the growth's copy must see it
  const auto t0 = clk::now();
  b.resize(300000, e);  // past the capacity: new storage, copy, poison, free (all queued)
  const double took = seconds_since(t0);
  void* s0 = e.scratch("test_row", 64);
  void* s1 = e.scratch("test_row", std::size_t(1) << 24);  // a scratch slot grows the same way
  // Another row's slot: its own bytes, disjoint from every slot live now. s0 is not live
  // any more: the growth freed it on the stream (cudaFreeAsync), and the stream-ordered
  // allocator may legally hand its address to the next allocation on that stream, so o may
  // equal s0; what must not happen is o overlapping the live test_row slot s1.
  void* o = e.scratch("other_row", 64);
  const auto ev = S::record(e);
  EXPECT(!ev.ready() && took < 1.0, "growing a buffer waited for the stream (%.3f s, ready %d)", took, int(ev.ready()));
  EXPECT(s1 != nullptr && e.scratch("test_row", 16) == s1, "the grown scratch is not the one returned later (%p, %p)",
         s0, s1);
  const auto lo = [](void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const bool disjoint = lo(o) + 64 <= lo(s1) || lo(s1) + (std::size_t(1) << 24) <= lo(o);
  EXPECT(o != nullptr && disjoint && e.scratch("other_row", 16) == o && e.scratch("test_row", 16) == s1,
         "two live rows' scratch slots share bytes (other_row %p + 64, test_row %p + 16 MiB)", o, s1);
  g.open();
  const auto h = download(e, b.cview());
  EXPECT(h.size() == 300000 && is_iota(h, 5.0f, 0, 1000), "growth lost the contents written by queued work");
  EXPECT(all_ff(h, 1000, h.size()), "growth did not poison the new elements with 0xFF bytes");
  b.resize(10, e);
  b.resize(20, e);  // within the capacity: the 10 new ones poisoned again
  const auto h2 = download(e, b.cview());
  EXPECT(is_iota(h2, 5.0f, 0, 10) && all_ff(h2, 10, 20), "a resize within the capacity did not poison the new elements");

  // Never bound: the set-up fallback (the per-thread default stream, then a wait).
  cp::cuda_buffer<float> u;
  u.resize(4096);
  EXPECT(u.bound_stream() == nullptr && u.size() == 4096, "an unbound resize bound the buffer");
  const auto hu = download(e, u.cview());
  EXPECT(all_ff(hu, 0, hu.size()), "an unbound resize did not poison the new elements");
  u.resize(5000, e);
  EXPECT(u.bound_stream() == e.stream(), "resize(n, exec) did not bind a buffer grown unbound");
}

//! A buffer destroyed while work on it is queued: the work completes on its storage.
void check_destroy_queued(gate& g) {
  const auto e = S::make_exec(), other = S::make_exec();
  const std::size_t n = 1 << 22;
  cp::cuda_buffer<float> out;
  out.resize(n, e);
  {
    cp::cuda_buffer<float> doomed;
    doomed.resize(n, e);
    g.hold(e.stream());
    iota(e, doomed.view(), 1.0f);
    D::copy(e, doomed.cview(), out.view());
  }  // destroyed here: its free is queued behind the gate, the copy and the write
  // Another executor allocates and writes meanwhile (the pool must not hand it the storage
  // still in use on e).
  cp::cuda_buffer<float> fresh;
  fresh.resize(n, other);
  iota(other, fresh.view(), 1000.0f);
  S::fence(other, cp::no_deadline());
  g.open();
  S::fence(e, cp::no_deadline());
  EXPECT(is_iota(download(e, out.cview()), 1.0f), "work queued on a destroyed buffer did not complete intact");
  EXPECT(is_iota(download(other, fresh.cview()), 1000.0f), "a buffer allocated meanwhile was overwritten");
}

//! fence raises timeout_error at its deadline while the gate holds the stream.
void check_fence_deadline(gate& g) {
  const auto e = S::make_exec();
  g.hold(e.stream());
  const auto t0 = clk::now();
  bool timed_out = false;
  try {
    S::fence(e, t0 + std::chrono::milliseconds(30));
  } catch (const cp::timeout_error&) {
    timed_out = true;
  }
  const double waited = seconds_since(t0);
  EXPECT(timed_out, "a fence past its deadline did not raise timeout_error");
  EXPECT(waited < 0.5, "the fence waited %.3f s with a 30 ms deadline", waited);
  g.open();
  S::fence(e, clk::now() + std::chrono::seconds(20));  // works again once the gate opens
}

//! cuda_fence_point: inside its scope a fence waits for the marked work only (a deferred
//! step's finish), not for the work queued after it (a gate that holds the stream); once
//! the scope ends, fence waits for everything again.
void check_fence_point(gate& g) {
  const auto e = S::make_exec();
  const std::size_t n = 1 << 16;
  cp::cuda_buffer<float> d;
  d.resize(n, e);
  S::pinned<float> h;
  h.resize(n);
  iota(e, d.view(), 5.0f);
  D::to_host(e, d.cview(), h.view());
  const auto step = S::record(e);  // the step's end
  g.hold(e.stream());              // the framework's later work, held
  const auto t0 = clk::now();
  {
    cp::cuda_fence_point at(e, step);
    S::fence(e, clk::now() + std::chrono::seconds(5));
  }
  const double took = seconds_since(t0);
  EXPECT(took < 1.0, "the fence at the point waited %.3f s: it waited for the work queued after the point", took);
  EXPECT(is_iota(h.cview(), 5.0f), "after the fence at the point, the step's copy to pinned memory is not there");
  bool timed_out = false;
  try {
    S::fence(e, clk::now() + std::chrono::milliseconds(30));  // no point: the whole stream, still held
  } catch (const cp::timeout_error&) {
    timed_out = true;
  }
  EXPECT(timed_out, "a fence after the point's scope did not wait for the held stream");
  g.open();
  S::fence(e, clk::now() + std::chrono::seconds(20));
}

//! Two communicators on one executor: both hooks installed, both polled, both aborted.
void check_two_comms(gate& g) {
  const auto e = S::make_exec();
  {
    auto c1 = cp::NcclComm::single(e), c2 = cp::NcclComm::single(e);
    EXPECT(e.hook_count() == 2, "two NcclComms on one executor installed %zu hooks", e.hook_count());
    g.hold(e.stream());
    bool timed_out = false;
    try {
      S::fence(e, clk::now() + std::chrono::milliseconds(30));
    } catch (const cp::timeout_error&) {
      timed_out = true;
    }
    g.open();
    EXPECT(timed_out, "the fence did not time out");
    EXPECT(c1.aborted() && c2.aborted(), "a fence past its deadline aborted c1 %d, c2 %d (both expected)",
           int(c1.aborted()), int(c2.aborted()));
  }
  EXPECT(e.hook_count() == 0, "destroyed communicators left %zu hooks on the executor", e.hook_count());
  S::fence(e, clk::now() + std::chrono::seconds(20));

  auto c1 = cp::NcclComm::single(e);
  {
    auto c2 = cp::NcclComm::single(e);
    c2.abort("the test aborts c2");
    bool raised = false;
    try {
      S::fence(e, cp::no_deadline());
    } catch (const cp::peer_failure&) {
      raised = true;
    }
    EXPECT(raised, "the fence did not poll the second communicator's error (c2 aborted)");
    EXPECT(!c1.aborted(), "c2's failure aborted c1");
  }
  EXPECT(e.hook_count() == 1, "%zu hooks after c2 went (1 expected)", e.hook_count());
  S::fence(e, cp::no_deadline());  // c2's hook is gone: c1 alone is polled, and healthy
  c1.barrier();
  c1.abort("the test aborts c1");
  bool raised = false;
  try {
    S::fence(e, cp::no_deadline());
  } catch (const cp::peer_failure&) {
    raised = true;
  }
  EXPECT(raised, "the fence did not poll the first communicator's error (c1 aborted)");
}

}  // namespace

int main() {
  return commpact_test::run_checks("all CUDA space discipline checks passed\n",
                                   "%d CUDA space discipline checks failed\n", [] {
                                     gate g;
                                     check_pinned_to_host(g);
                                     check_record_wait(g);
                                     check_growth(g);
                                     check_destroy_queued(g);
                                     check_fence_deadline(g);
                                     check_fence_point(g);
                                     check_two_comms(g);
                                   });
}
