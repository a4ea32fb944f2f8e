// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file nccl_comm.hpp
//! NcclComm: a communicator of the CUDA space (space/cuda.hpp) over an ncclComm_t. Only
//! nvcc compiles it (with nccl.h; CMake's `nccl` component links libnccl).
//! One file on purpose: a third of it is this contract, the rest one class whose data
//! plane, creation and failure handling share its handle (the control plane is
//! cuda_host_plane.hpp's).
//!
//! Tests: tests/cuda/test_gtopk_device.cu (one rank: NCCL puts no two ranks of a communicator
//! on one GPU, so the multi-rank device path is checked by test_cuda_ops.cu's simulated ranks;
//! docs/cuda.md, "Status", says where each has run).
//!
//! <!-- snippet: grad=commpact::cuda_span<float> -->
//! \code
//! ncclUniqueId id = commpact::NcclComm::unique_id();          // on rank 0; broadcast it
//! commpact::NcclComm comm = commpact::NcclComm::create(P, id, rank);   // nonblocking comm
//! commpact::gTopK<commpact::TreeComm<commpact::NcclComm>> g{comm, {.density = 0.001}};
//! g.reduce(grad);    // grad: a cuda_span<float>; one fence per step
//! \endcode
//!
//! The communicator lives on its executor's device: create() initialises it there, and
//! every call makes that device current for its NCCL calls (cuda_device_guard).
//!
//! Data plane (device spans, queued on the executor's stream, no host synchronisation):
//! allreduce, allgather, broadcast, and known-size point-to-point (`exchange`,
//! `send_known`, `recv_known`) as ncclSend/ncclRecv inside ncclGroupStart/End.
//! allgather runs in place when `in` is the rank's block of `out` (in == out + rank *
//! count, NCCL's in-place form); any other overlap raises invalid_argument.
//! `group_begin()` / `group_end()` (ncclGroupStart/ncclGroupEnd, what comm/known_size.hpp's
//! `grouped` and `p2p_group` call) make several known-size sends and receives one group:
//! an all-to-all or a ring step, where separate ncclSend/ncclRecv calls on one stream can
//! deadlock (every rank's send waits for a receive queued behind the peer's own send).
//! Groups nest; they are per thread (NCCL's); inside one only the data plane may be called
//! (a control-plane call raises invalid_argument: its staged copy could not wait for a
//! receive that the group has not posted yet).
//! Control plane (host spans: the agreement's small allreduce, barrier, the
//! variable-length send/recv of the PointToPoint concept): staged through pinned host
//! memory and a device buffer, and fenced at once under the communicator's deadline;
//! variable-length messages travel as an 8-byte length followed by the bytes (NCCL has no
//! probe), so recv and sendrecv wait once for the length before the body. That control
//! plane is cuda_host_plane.hpp's (shared with TorchCudaComm); NcclComm gives it its data
//! plane, its fence and its checks.
//!
//! Errors. The communicator is created nonblocking (config.blocking = 0). Construction
//! waits for the initialisation to complete (ncclCommGetAsyncError until it is no longer
//! ncclInProgress) before it asks NCCL anything. Every NCCL call's result is checked:
//! inside a group ncclInProgress is fine (the group posts at its end); outside one it is
//! polled with ncclCommGetAsyncError until it completes; any error aborts the
//! communicator and raises (invalid_argument for an argument or usage error, peer_failure
//! for a remote or system error, a peer's failure, comm_error otherwise). Every host-side
//! wait ends at the communicator's deadline (now + timeout()): a deadline that passes
//! aborts the communicator (ncclCommAbort, so that peers stop waiting too) and raises
//! timeout_error. The communicator installs its hooks on the executor (keyed by itself,
//! so several communicators may share one executor): every fence on it polls this
//! communicator's asynchronous error (a peer that failed raises peer_failure at the next
//! fence) and a fence whose deadline passes aborts it (ncclCommAbort on a thread of its
//! own, joined when the communicator goes: it waits for the device's running kernels,
//! and the fence returns at its deadline). abort(why) aborts the communicator;
//! every later call raises peer_failure naming why.
//!
//! Destruction (the last copy of the handle) is bounded: ncclCommFinalize, then polling
//! with yields and short sleeps for at most min(timeout(), finalize_limit); on failure or
//! expiry the communicator is aborted instead of destroyed. (A blocking communicator's
//! finalisation blocks inside NCCL: it is attempted only once the stream has drained
//! within the same bound, and aborted otherwise.)

#if !defined(__CUDACC__)
#error "commpact/comm/nccl_comm.hpp needs nvcc (and nccl.h): include it from a .cu file only."
#endif

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../space/cuda.hpp"
#include "cuda_host_plane.hpp"

namespace commpact {

namespace detail {
template <class T>
constexpr ncclDataType_t nccl_type() {
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<U, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<U, std::int64_t>) return ncclInt64;
  else if constexpr (std::is_same_v<U, std::int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<U, std::uint32_t>) return ncclUint32;
  else if constexpr (std::is_same_v<U, std::uint64_t>) return ncclUint64;
  else if constexpr (std::is_same_v<U, std::uint8_t> || std::is_same_v<U, std::byte> || std::is_same_v<U, char>)
    return ncclUint8;
  else static_assert(sizeof(T) == 0, "commpact::NcclComm: no NCCL data type for this element type.");
}
inline ncclRedOp_t nccl_op(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::min: return ncclMin;
    case reduce_op::max: return ncclMax;
  }
  return ncclSum;
}
//! A host poll's pause: spin briefly, then yield, then sleep a little (a long wait does
//! not hold a core).
inline void nccl_backoff(unsigned spin) {
  if (spin < 64) return;
  if (spin < 4096) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(100));
}
//! now + t, or no_deadline() when that would not fit.
inline deadline nccl_deadline_after(std::chrono::milliseconds t) {
  const auto now = std::chrono::steady_clock::now();
  if (t >= std::chrono::duration_cast<std::chrono::milliseconds>(deadline::max() - now)) return no_deadline();
  return now + t;
}
}  // namespace detail

class NcclComm : public cuda_host_plane<NcclComm> {
  friend class cuda_host_plane<NcclComm>;
  struct state {
    ncclComm_t comm = nullptr;  // nullptr once aborted (ncclCommAbort frees it)
    bool owns = true;
    bool blocking = false;
    bool aborted = false;
    int group_depth = 0;  //!< ncclGroupStart calls (group_begin's and exchange's own) not yet ended
    std::string why;
    int rank = 0, size = 1, device = 0;
    cuda_space::exec exec;
    cuda_host_stage staging;  // the control plane's device and pinned host staging
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    //! The ncclCommAbort a fence's deadline started (see abort_later); joined here.
    std::thread aborter;
    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      exec.remove_hook(this);
      if (aborter.joinable()) aborter.join();
      if (!owns || !comm || aborted) return;
      cuda_device_guard g(device, std::nothrow);
      const auto until = detail::nccl_deadline_after(std::min(timeout, finalize_limit));
      if (blocking) {
        // ncclCommFinalize blocks inside NCCL here: only once the stream has drained.
        for (unsigned spin = 0;; ++spin) {
          const cudaError_t q = cudaStreamQuery(exec.s->stream);
          if (q == cudaSuccess) break;
          if (q != cudaErrorNotReady || std::chrono::steady_clock::now() >= until) {
            (void)ncclCommAbort(comm);
            return;
          }
          detail::nccl_backoff(spin);
        }
      }
      ncclResult_t r = ncclCommFinalize(comm);
      if (r == ncclSuccess || r == ncclInProgress) {
        for (unsigned spin = 0;; ++spin) {
          ncclResult_t a = ncclInProgress;
          if (ncclCommGetAsyncError(comm, &a) != ncclSuccess) {
            r = ncclInternalError;
            break;
          }
          r = a;
          if (a != ncclInProgress || std::chrono::steady_clock::now() >= until) break;
          detail::nccl_backoff(spin);
        }
      }
      if (r != ncclSuccess) {
        (void)ncclCommAbort(comm);
        return;
      }
      (void)ncclCommDestroy(comm);
    }
  };

 public:
  using space_type = cuda_space;
  static constexpr const char* comm_name = "NcclComm";
  // The control plane on host memory (cuda_host_plane.hpp): staged, fenced at once.
  using cuda_host_plane<NcclComm>::allreduce;
  using cuda_host_plane<NcclComm>::allgather;
  using cuda_host_plane<NcclComm>::broadcast;
  //! How long a host-side wait lasts unless set_timeout() says otherwise.
  static constexpr std::chrono::milliseconds default_timeout{std::chrono::minutes(5)};
  //! The most the destructor waits for ncclCommFinalize (then it aborts).
  static constexpr std::chrono::milliseconds finalize_limit{std::chrono::seconds(5)};

  //! A fresh id for create() (call on one rank and send it to the others).
  static ncclUniqueId unique_id() {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    require<comm_error>(r == ncclSuccess, "commpact::NcclComm::unique_id: ncclGetUniqueId failed: ",
                        ncclGetErrorString(r), ".");
    return id;
  }
  //! Rank `rank` of `nranks` on e's device, a nonblocking communicator (blocking: the
  //! classic one), its work on e's stream; waits for the initialisation at most `timeout`
  //! (then aborts it and raises timeout_error), which is also the communicator's timeout().
  static NcclComm create(int nranks, const ncclUniqueId& id, int rank, cuda_space::exec e = cuda_space::make_exec(),
                         bool blocking = false, std::chrono::milliseconds timeout = default_timeout) {
    require(e.s != nullptr, "commpact::NcclComm::create: the executor has no stream; make one with "
                            "cuda_space::make_exec().");
    cuda_device_guard g(e.device());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = blocking ? 1 : 0;
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&c, nranks, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string last = c ? ncclGetLastError(c) : "";
      if (c) (void)ncclCommAbort(c);
      throw comm_error(detail::cat("commpact::NcclComm::create: ncclCommInitRankConfig failed on rank ", rank, " of ",
                                   nranks, " with ", ncclGetErrorString(r), " (", last,
                                   "); check that every rank passes the same id and count."));
    }
    return NcclComm(c, std::move(e), true, timeout, blocking);
  }
  //! A one-rank communicator on e's device (tests, single-GPU runs).
  static NcclComm single(cuda_space::exec e = cuda_space::make_exec()) { return create(1, unique_id(), 0, std::move(e)); }

  //! Wraps an existing communicator (owns: destroy it with the last copy of this handle).
  //! A nonblocking communicator still initialising is waited for first (at most
  //! default_timeout). Its device must be e's.
  NcclComm(ncclComm_t comm, cuda_space::exec e, bool owns) : NcclComm(comm, std::move(e), owns, default_timeout, false) {}

  int rank() const { return s_->rank; }
  int size() const { return s_->size; }
  //! The CUDA device of the communicator and its executor.
  int device() const { return s_->device; }
  const cuda_space::exec& exec() const { return s_->exec; }
  //! The NCCL handle (nullptr once aborted: ncclCommAbort frees it).
  ncclComm_t handle() const { return s_->comm; }
  //! How long a host-side wait (nonblocking progress, control-plane fence) may last.
  std::chrono::milliseconds timeout() const { return s_->timeout; }
  void set_timeout(std::chrono::milliseconds t) { s_->timeout = t; }
  //! Waits for the work queued on the executor, until the communicator's deadline.
  void fence() { fence_now(); }
  //! Waits for the work queued on the executor, until `until`.
  void fence(deadline until) { cuda_space::fence(s_->exec, until); }

  // ---- data plane on device spans: queued on the stream --------------------------------
  template <class T>
  void allreduce(cuda_span<T> data, reduce_op op = reduce_op::sum) {
    live();
    cuda_device_guard g(s_->device);
    auto* p = cuda_access::ptr(data);
    done(ncclAllReduce(p, p, data.size(), detail::nccl_type<T>(), detail::nccl_op(op), s_->comm, stream()),
         "ncclAllReduce");
  }
  template <class T>
  void allgather(cuda_span<const T> in, cuda_span<T> out) {
    live();
    const std::size_t n = in.size();
    require(out.size() == n * static_cast<std::size_t>(size()), "commpact::NcclComm::allgather: the output holds ",
            out.size(), " values; it needs ", n, " x ", size(), " ranks.");
    const T* ip = cuda_access::ptr(in);
    const T* op = cuda_access::ptr(out);
    if (n != 0 && ip != op + static_cast<std::size_t>(rank()) * n) {
      const auto il = reinterpret_cast<std::uintptr_t>(ip), ol = reinterpret_cast<std::uintptr_t>(op);
      require(il + in.size_bytes() <= ol || ol + out.size_bytes() <= il, "commpact::NcclComm::allgather: the input "
              "overlaps the output but is not this rank's block of it (offset rank x count = ",
              static_cast<std::size_t>(rank()) * n, " values), the only in-place form NCCL accepts.");
    }
    cuda_device_guard g(s_->device);
    // in == out + rank * count is NCCL's in-place allgather: the same pointer is passed.
    done(ncclAllGather(ip, cuda_access::ptr(out), n, detail::nccl_type<T>(), s_->comm, stream()), "ncclAllGather");
  }
  template <class T>
  void broadcast(cuda_span<T> data, int root) {
    live();
    cuda_device_guard g(s_->device);
    auto* p = cuda_access::ptr(data);
    done(ncclBroadcast(p, p, data.size(), detail::nccl_type<T>(), root, s_->comm, stream()), "ncclBroadcast");
  }
  void exchange(int peer, cuda_span<const std::byte> out, cuda_span<std::byte> in) {
    live();
    cuda_device_guard g(s_->device);
    pair(peer, cuda_access::ptr(out), out.size(), true, cuda_access::ptr(in), in.size(), true, "exchange");
  }
  void send_known(int peer, cuda_span<const std::byte> out) {
    live();
    cuda_device_guard g(s_->device);
    done(ncclSend(cuda_access::ptr(out), out.size(), ncclUint8, peer, s_->comm, stream()), "ncclSend");
  }
  void recv_known(int peer, cuda_span<std::byte> in) {
    live();
    cuda_device_guard g(s_->device);
    done(ncclRecv(cuda_access::ptr(in), in.size(), ncclUint8, peer, s_->comm, stream()), "ncclRecv");
  }
  //! Opens a group (ncclGroupStart): the known-size calls up to group_end() are posted
  //! together, on the executor's stream.
  void group_begin() {
    live();
    const ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) fail(r, "ncclGroupStart");
    ++s_->group_depth;
  }
  //! Closes the group (ncclGroupEnd), polling a nonblocking communicator's progress until
  //! the group is posted, never past the deadline; an error raises as every call's does.
  void group_end() {
    if (s_->group_depth == 0) {
      live();  // an abort closed the group already
      throw invalid_argument(detail::cat("commpact::NcclComm::group_end: rank ", s_->rank,
                                         " has no open group; call group_begin() first (or use commpact::grouped)."));
    }
    cuda_device_guard g(s_->device);
    --s_->group_depth;
    done(ncclGroupEnd(), "ncclGroupEnd (grouped send/recv)");
  }
  //! Groups opened by group_begin() and not yet closed.
  int group_depth() const { return s_->group_depth; }

  //! Aborts the communicator (ncclCommAbort): peers stop waiting and raise; every later
  //! call on this rank raises peer_failure naming why.
  void abort(std::string_view why) { do_abort(*s_, std::string(why).c_str()); }
  bool aborted() const { return s_->aborted; }

 private:
  NcclComm(ncclComm_t comm, cuda_space::exec e, bool owns, std::chrono::milliseconds timeout, bool blocking)
      : s_(std::make_shared<state>()) {
    require(e.s != nullptr, "commpact::NcclComm: the executor has no stream; make one with cuda_space::make_exec().");
    s_->comm = comm;
    s_->owns = owns;
    s_->blocking = blocking;
    s_->timeout = timeout;
    s_->device = e.device();
    s_->exec = std::move(e);
    if (!comm) return;
    cuda_device_guard g(s_->device);
    // A nonblocking communicator answers queries only once its initialisation is done.
    const ncclResult_t r = settle("the communicator's initialisation (ncclCommInitRankConfig)");
    if (r != ncclSuccess) fail(r, "the communicator's initialisation (ncclCommInitRankConfig)");
    int rk = 0, n = 1, dev = 0;
    query(ncclCommUserRank(comm, &rk), "ncclCommUserRank");
    query(ncclCommCount(comm, &n), "ncclCommCount");
    query(ncclCommCuDevice(comm, &dev), "ncclCommCuDevice");
    s_->rank = rk;
    s_->size = n;
    if (dev != s_->device) {
      const std::string msg = detail::cat("commpact::NcclComm: the communicator lives on device ", dev,
                                          " but its executor's stream on device ", s_->device,
                                          "; make the executor on the communicator's device.");
      do_abort(*s_, msg.c_str());
      throw invalid_argument(msg);
    }
    std::weak_ptr<state> w = s_;
    s_->exec.add_hook({s_.get(),
                       [w] {
                         if (auto st = w.lock()) poll(*st);
                       },
                       [w](const char* what) {
                         if (auto st = w.lock()) abort_later(*st, what);
                       }});
  }

  cudaStream_t stream() const { return s_->exec.stream(); }
  deadline until() const { return detail::nccl_deadline_after(s_->timeout); }

  //! Marks the communicator aborted (every later call raises peer_failure naming why) and
  //! takes its handle for the caller to abort; nullptr when it was aborted already. Open
  //! groups are closed first, on the calling thread (NCCL's group state is per thread;
  //! what they hold is then aborted with the rest).
  static ncclComm_t detach(state& st, const char* why) {
    if (st.aborted) return nullptr;
    st.aborted = true;
    st.why = why ? why : "";
    cuda_device_guard g(st.device, std::nothrow);
    for (; st.group_depth > 0; --st.group_depth) (void)ncclGroupEnd();
    const ncclComm_t c = st.comm;
    st.comm = nullptr;
    return c;
  }
  static void do_abort(state& st, const char* why) {
    const ncclComm_t c = detach(st, why);
    if (!c) return;
    cuda_device_guard g(st.device, std::nothrow);
    (void)ncclCommAbort(c);
  }
  //! A fence's deadline passed: the communicator is marked aborted now (detach) and
  //! ncclCommAbort runs on a thread of its own, joined by the state's destructor.
  //! ncclCommAbort frees device memory and so waits for the kernels still running on the
  //! device (a 1 s kernel made a 20 ms fence wait 1 s); the fence must return at its
  //! deadline. Without a thread the abort runs here.
  static void abort_later(state& st, const char* why) {
    const ncclComm_t c = detach(st, why);
    if (!c) return;
    try {
      st.aborter = std::thread([c, dev = st.device] {
        (void)cudaSetDevice(dev);
        (void)ncclCommAbort(c);
      });
    } catch (...) {
      cuda_device_guard g(st.device, std::nothrow);
      (void)ncclCommAbort(c);
    }
  }
  //! The exception for an NCCL error r with message msg.
  [[noreturn]] static void raise(ncclResult_t r, const std::string& msg) {
    if (r == ncclInvalidArgument || r == ncclInvalidUsage) throw invalid_argument(msg);
    if (r == ncclRemoteError || r == ncclSystemError) throw peer_failure(msg);
    throw comm_error(msg);
  }
  //! The executor's hook: raises the communicator's asynchronous error (aborting it).
  static void poll(state& st) {
    if (st.aborted)
      throw peer_failure(detail::cat("commpact::NcclComm: rank ", st.rank, ": the communicator was aborted (", st.why,
                                     "); the step is abandoned."));
    ncclResult_t a = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(st.comm, &a);
    if (q != ncclSuccess) a = q;
    if (a == ncclSuccess || a == ncclInProgress) return;
    const std::string what = detail::cat("commpact::NcclComm: NCCL reported ", ncclGetErrorString(a), " (",
                                         ncclGetLastError(st.comm), ") on rank ", st.rank,
                                         "; the communicator is aborted and the step abandoned.");
    do_abort(st, what.c_str());
    // Asynchronous: a peer's or the network's failure, or NCCL's own.
    if (a == ncclRemoteError || a == ncclSystemError) throw peer_failure(what);
    throw comm_error(what);
  }
  void live() const {
    if (s_->aborted)
      throw peer_failure(detail::cat("commpact::NcclComm: rank ", s_->rank, ": the communicator was aborted (", s_->why,
                                     "); create a new one."));
  }
  //! Aborts the communicator and raises the error r of `what`.
  [[noreturn]] void fail(ncclResult_t r, const char* what) {
    const std::string msg = detail::cat("commpact::NcclComm: ", what, " failed on rank ", s_->rank, " with ",
                                        ncclGetErrorString(r), " (", s_->comm ? ncclGetLastError(s_->comm) : "",
                                        "); the communicator is aborted.");
    do_abort(*s_, msg.c_str());
    raise(r, msg);
  }
  //! Polls a nonblocking communicator until its pending call is no longer in progress;
  //! at the deadline it aborts the communicator and raises timeout_error.
  ncclResult_t settle(const char* what) {
    const deadline end = until();
    for (unsigned spin = 0;; ++spin) {
      ncclResult_t a = ncclInProgress;
      const ncclResult_t q = ncclCommGetAsyncError(s_->comm, &a);
      if (q != ncclSuccess) return q;
      if (a != ncclInProgress) return a;
      if (std::chrono::steady_clock::now() > end) {
        const std::string msg = detail::cat("commpact::NcclComm: ", what, " did not complete within ",
                                            s_->timeout.count(), " ms on rank ", s_->rank,
                                            "; the communicator is aborted.");
        do_abort(*s_, msg.c_str());
        throw timeout_error(msg);
      }
      detail::nccl_backoff(spin);
    }
  }
  //! Completes a call that returned r: inside a group ncclInProgress is fine (the group
  //! posts at its end); outside one it is polled until done. Errors abort and raise.
  void done(ncclResult_t r, const char* what) {
    if (r == ncclInProgress && s_->group_depth == 0) r = settle(what);
    if (r != ncclSuccess && r != ncclInProgress) fail(r, what);
  }
  //! A query on an initialised communicator.
  void query(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) fail(r, what);
  }
  //! A send of `sb` bytes (when `send`) and a receive of `rb` bytes (when `recv`) with
  //! peer, in one group. The caller made the device current.
  void pair(int peer, const std::byte* sp, std::size_t sb, bool send, std::byte* rp, std::size_t rb, bool recv,
            const char* what) {
    const ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) fail(r, "ncclGroupStart");
    ++s_->group_depth;  // do_abort closes it when a call fails
    if (send) done(ncclSend(sp, sb, ncclUint8, peer, s_->comm, stream()), what);
    if (recv) done(ncclRecv(rp, rb, ncclUint8, peer, s_->comm, stream()), what);
    --s_->group_depth;
    done(ncclGroupEnd(), what);
  }
  //! A control-plane call stages and fences at once: inside a group it would read a
  //! receive that is not posted yet.
  void no_group(const char* what) const {
    live();
    require(s_->group_depth == 0, "commpact::NcclComm::", what, ": rank ", s_->rank,
            " is inside a group (group_begin without group_end); a group holds known-size sends and receives on "
            "device spans only: end the group first.");
  }
  void fence_now() { cuda_space::fence(s_->exec, until()); }

  cuda_host_stage& host_stage() { return s_->staging; }
  //! sendrecv's bodies in one group; a body of 0 bytes is not sent (the peer, knowing the
  //! length, posts no receive).
  void exchange_bodies(int peer, cuda_span<const std::byte> out, cuda_span<std::byte> in) {
    live();
    cuda_device_guard g(s_->device);
    pair(peer, cuda_access::ptr(out), out.size(), !out.empty(), cuda_access::ptr(in), in.size(), !in.empty(),
         "sendrecv");
  }

  std::shared_ptr<state> s_;
};

static_assert(PointToPoint<NcclComm>);

}  // namespace commpact
