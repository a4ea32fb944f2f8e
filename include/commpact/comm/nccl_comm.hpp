// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file nccl_comm.hpp
//! NcclComm: a communicator of the CUDA space (space/cuda.hpp) over an ncclComm_t. Only
//! nvcc compiles it (with nccl.h; CMake's `nccl` component links libnccl).
//!
//! NOT YET RUN ON A GPU: it compiles with nvcc 13 against NCCL 2.28 and
//! tests/cuda/test_gtopk_device.cu exercises it with one rank once a device is present
//! (NCCL does not put two ranks of one communicator on one GPU, so the multi-rank
//! device path is tested by test_cuda_ops.cu's simulated ranks, not over NCCL, until a
//! machine with several GPUs runs it).
//!
//! \code
//! ncclUniqueId id = commpact::NcclComm::unique_id();          // on rank 0; broadcast it
//! commpact::NcclComm comm = commpact::NcclComm::create(P, id, rank);   // nonblocking comm
//! commpact::gTopK<commpact::TreeComm<commpact::NcclComm>> g{comm, {.density = 0.001}};
//! g.reduce(grad);    // grad: a cuda_span<float>; one fence per step
//! \endcode
//!
//! Data plane (device spans, queued on the executor's stream, no host synchronisation):
//! allreduce, allgather, broadcast, and known-size point-to-point (`exchange`,
//! `send_known`, `recv_known`) as ncclSend/ncclRecv inside ncclGroupStart/End.
//! `group_begin()` / `group_end()` (ncclGroupStart/ncclGroupEnd, what comm/known_size.hpp's
//! `grouped` and `p2p_group` call) make several known-size sends and receives one group:
//! an all-to-all or a ring step, where separate ncclSend/ncclRecv calls on one stream can
//! deadlock (every rank's send waits for a receive queued behind the peer's own send).
//! Groups nest; they are per thread (NCCL's); inside one only the data plane may be called
//! (a control-plane call raises invalid_argument: its staged copy could not wait for a
//! receive that the group has not posted yet).
//! Control plane (host spans: the agreement's small allreduce, barrier, the
//! variable-length send/recv of the PointToPoint concept): staged through a device buffer
//! and fenced at once, as DeferredComm does; variable-length messages travel as an 8-byte
//! length followed by the bytes (NCCL has no probe).
//!
//! Errors. The communicator is created nonblocking (config.blocking = 0): every call that
//! returns ncclInProgress is polled with ncclCommGetAsyncError until it completes, never
//! past `timeout()`. The executor's fence polls the same asynchronous error, so a peer
//! that failed raises peer_failure at the next fence; a fence whose deadline passes calls
//! ncclCommAbort first (peers stop waiting too) and raises timeout_error. abort(why)
//! aborts the communicator; every later call raises peer_failure naming why.

#if !defined(__CUDACC__)
#error "commpact/comm/nccl_comm.hpp needs nvcc (and nccl.h): include it from a .cu file only."
#endif

#include <cuda_runtime.h>
#include <nccl.h>

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
}  // namespace detail

class NcclComm {
  struct state {
    ncclComm_t comm = nullptr;
    bool owns = true;
    bool aborted = false;
    int group_depth = 0;  //!< ncclGroupStart calls of group_begin not yet ended
    std::string why;
    int rank = 0, size = 1;
    cuda_space::exec exec;
    cuda_buffer<std::byte> stage;
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    ~state() {
      if (!owns || !comm) return;
      if (aborted) return;
      // A nonblocking communicator is finalised (flushed) before it is destroyed.
      if (ncclCommFinalize(comm) == ncclInProgress) {
        ncclResult_t r = ncclInProgress;
        const auto until = std::chrono::steady_clock::now() + timeout;
        while (r == ncclInProgress && std::chrono::steady_clock::now() < until) (void)ncclCommGetAsyncError(comm, &r);
        if (r != ncclSuccess) {
          (void)ncclCommAbort(comm);
          return;
        }
      }
      (void)ncclCommDestroy(comm);
    }
  };

 public:
  using space_type = cuda_space;

  //! A fresh id for create() (call on one rank and send it to the others).
  static ncclUniqueId unique_id() {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    require<comm_error>(r == ncclSuccess, "commpact::NcclComm::unique_id: ncclGetUniqueId failed: ",
                        ncclGetErrorString(r), ".");
    return id;
  }
  //! Rank `rank` of `nranks` on the current device, a nonblocking communicator (blocking:
  //! the classic one), its work on e's stream.
  static NcclComm create(int nranks, const ncclUniqueId& id, int rank, cuda_space::exec e = cuda_space::make_exec(),
                         bool blocking = false) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = blocking ? 1 : 0;
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&c, nranks, id, rank, &config);
    NcclComm out(c, std::move(e), true);
    out.wait(r, "ncclCommInitRankConfig");
    out.query_rank_and_size();  // a nonblocking communicator answers once initialised
    return out;
  }
  //! A one-rank communicator on the current device (tests, single-GPU runs).
  static NcclComm single(cuda_space::exec e = cuda_space::make_exec()) { return create(1, unique_id(), 0, std::move(e)); }

  //! Wraps an existing communicator (owns: destroy it with the last copy of this handle).
  NcclComm(ncclComm_t comm, cuda_space::exec e, bool owns) : s_(std::make_shared<state>()) {
    s_->comm = comm;
    s_->owns = owns;
    s_->exec = std::move(e);
    if (comm) query_rank_and_size();
    std::weak_ptr<state> w = s_;
    s_->exec.s->poll_async_error = [w] {
      if (auto st = w.lock()) poll(*st);
    };
    s_->exec.s->on_timeout = [w](const char* what) {
      if (auto st = w.lock()) do_abort(*st, what);
    };
  }

  int rank() const { return s_->rank; }
  int size() const { return s_->size; }
  const cuda_space::exec& exec() const { return s_->exec; }
  ncclComm_t handle() const { return s_->comm; }
  //! How long a host-side wait (nonblocking progress, control-plane fence) may last.
  std::chrono::milliseconds timeout() const { return s_->timeout; }
  void set_timeout(std::chrono::milliseconds t) { s_->timeout = t; }
  void fence(deadline until = no_deadline()) { cuda_space::fence(s_->exec, until); }

  // ---- data plane on device spans: queued on the stream --------------------------------
  template <class T>
  void allreduce(cuda_span<T> data, reduce_op op = reduce_op::sum) {
    live();
    auto* p = cuda_access::ptr(data);
    wait(ncclAllReduce(p, p, data.size(), detail::nccl_type<T>(), detail::nccl_op(op), s_->comm, stream()),
         "ncclAllReduce");
  }
  template <class T>
  void allgather(cuda_span<const T> in, cuda_span<T> out) {
    live();
    require(out.size() == in.size() * static_cast<std::size_t>(size()), "commpact::NcclComm::allgather: the output holds ",
            out.size(), " values; it needs ", in.size(), " x ", size(), " ranks.");
    wait(ncclAllGather(cuda_access::ptr(in), cuda_access::ptr(out), in.size(), detail::nccl_type<T>(), s_->comm,
                       stream()),
         "ncclAllGather");
  }
  template <class T>
  void broadcast(cuda_span<T> data, int root) {
    live();
    auto* p = cuda_access::ptr(data);
    wait(ncclBroadcast(p, p, data.size(), detail::nccl_type<T>(), root, s_->comm, stream()), "ncclBroadcast");
  }
  void exchange(int peer, cuda_span<const std::byte> out, cuda_span<std::byte> in) {
    live();
    wait(ncclGroupStart(), "ncclGroupStart");
    (void)ncclSend(cuda_access::ptr(out), out.size(), ncclUint8, peer, s_->comm, stream());
    (void)ncclRecv(cuda_access::ptr(in), in.size(), ncclUint8, peer, s_->comm, stream());
    wait(ncclGroupEnd(), "ncclSend/ncclRecv (exchange)");
  }
  void send_known(int peer, cuda_span<const std::byte> out) {
    live();
    wait(ncclSend(cuda_access::ptr(out), out.size(), ncclUint8, peer, s_->comm, stream()), "ncclSend");
  }
  void recv_known(int peer, cuda_span<std::byte> in) {
    live();
    wait(ncclRecv(cuda_access::ptr(in), in.size(), ncclUint8, peer, s_->comm, stream()), "ncclRecv");
  }
  //! Opens a group (ncclGroupStart): the known-size calls up to group_end() are posted
  //! together, on the executor's stream.
  void group_begin() {
    live();
    wait(ncclGroupStart(), "ncclGroupStart");
    ++s_->group_depth;
  }
  //! Closes the group (ncclGroupEnd), polling a nonblocking communicator's progress until
  //! the group is posted, never past timeout(); an error raises as every call's does.
  void group_end() {
    if (s_->group_depth == 0) {
      live();  // an abort closed the group already
      throw invalid_argument(detail::cat("commpact::NcclComm::group_end: rank ", s_->rank,
                                         " has no open group; call group_begin() first (or use commpact::grouped)."));
    }
    --s_->group_depth;
    wait(ncclGroupEnd(), "ncclGroupEnd (grouped send/recv)");
  }
  //! Groups opened by group_begin() and not yet closed.
  int group_depth() const { return s_->group_depth; }

  // ---- control plane on host memory: staged, fenced at once ---------------------------
  template <class T>
  void allreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    no_group("allreduce (host memory)");
    auto d = staged<T>(data.size());
    to_device(std::span<const T>(data), d);
    allreduce(d, op);
    to_host(cuda_span<const T>(d), data);
  }
  template <class T>
  void allgather(std::span<const T> in, std::span<T> out) {
    require(out.size() == in.size() * static_cast<std::size_t>(size()), "commpact::NcclComm::allgather: the output holds ",
            out.size(), " values; it needs ", in.size(), " x ", size(), " ranks.");
    no_group("allgather (host memory)");
    auto d = staged<T>(out.size());
    auto din = d.first(in.size());
    to_device(in, din);
    // in sits at the front of the staging buffer; NCCL allows out-of-place only: copy it.
    auto dout = staged_second<T>(out.size());
    allgather(cuda_span<const T>(din), dout);
    to_host(cuda_span<const T>(dout), out);
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    no_group("broadcast (host memory)");
    auto d = staged<T>(data.size());
    to_device(std::span<const T>(data), d);
    broadcast(d, root);
    to_host(cuda_span<const T>(d), data);
  }
  void barrier() {
    std::int32_t one = 1;
    allreduce(std::span<std::int32_t>(&one, 1));
  }
  void send(int peer, std::span<const std::byte> msg) {
    no_group("send");
    const std::uint64_t len = msg.size();
    auto d = staged<std::byte>(8 + msg.size());
    to_device(std::span<const std::byte>(reinterpret_cast<const std::byte*>(&len), 8), d.first(8));
    if (!msg.empty()) to_device(msg, d.subspan(8));
    send_known(peer, cuda_span<const std::byte>(d.first(8)));
    if (!msg.empty()) send_known(peer, cuda_span<const std::byte>(d.subspan(8)));
    fence_now();
  }
  void recv(int peer, std::vector<std::byte>& buf) {
    no_group("recv");
    std::uint64_t len = 0;
    auto d = staged<std::byte>(8);
    recv_known(peer, d.first(8));
    to_host(cuda_span<const std::byte>(d.first(8)), std::span<std::byte>(reinterpret_cast<std::byte*>(&len), 8));
    buf.resize(len);
    if (len == 0) return;
    auto b = staged<std::byte>(len);
    recv_known(peer, b);
    to_host(cuda_span<const std::byte>(b), std::span<std::byte>(buf));
  }
  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) {
    // Lengths first (both directions in one group), then the bodies.
    no_group("sendrecv");
    const std::uint64_t len = msg.size();
    auto d = staged<std::byte>(16 + msg.size());
    to_device(std::span<const std::byte>(reinterpret_cast<const std::byte*>(&len), 8), d.first(8));
    exchange(peer, cuda_span<const std::byte>(d.first(8)), d.subspan(8, 8));
    std::uint64_t in_len = 0;
    to_host(cuda_span<const std::byte>(d.subspan(8, 8)), std::span<std::byte>(reinterpret_cast<std::byte*>(&in_len), 8));
    auto o = staged<std::byte>(msg.size() + in_len + 1);
    if (!msg.empty()) to_device(msg, o.first(msg.size()));
    live();
    wait(ncclGroupStart(), "ncclGroupStart");
    if (!msg.empty()) (void)ncclSend(cuda_access::ptr(o), msg.size(), ncclUint8, peer, s_->comm, stream());
    if (in_len) (void)ncclRecv(cuda_access::ptr(o) + msg.size(), in_len, ncclUint8, peer, s_->comm, stream());
    wait(ncclGroupEnd(), "ncclSend/ncclRecv (sendrecv)");
    buf.resize(in_len);
    if (in_len) to_host(cuda_span<const std::byte>(o.subspan(msg.size(), in_len)), std::span<std::byte>(buf));
    else fence_now();
  }
  //! Aborts the communicator (ncclCommAbort): peers stop waiting and raise; every later
  //! call on this rank raises peer_failure naming why.
  void abort(std::string_view why) { do_abort(*s_, std::string(why).c_str()); }
  bool aborted() const { return s_->aborted; }

 private:
  cudaStream_t stream() const { return s_->exec.stream(); }
  void query_rank_and_size() {
    if (!s_->comm) return;
    int r = 0, n = 1;
    if (ncclCommUserRank(s_->comm, &r) == ncclSuccess) s_->rank = r;
    if (ncclCommCount(s_->comm, &n) == ncclSuccess) s_->size = n;
  }

  static void do_abort(state& st, const char* why) {
    if (st.aborted) return;
    st.aborted = true;
    st.why = why ? why : "";
    // Open groups are closed first (what they hold is then aborted with the rest), so that
    // NCCL's per-thread group state does not outlive the communicator.
    for (; st.group_depth > 0; --st.group_depth) (void)ncclGroupEnd();
    if (st.comm) (void)ncclCommAbort(st.comm);
  }
  static void poll(state& st) {
    if (st.aborted)
      throw peer_failure(detail::cat("commpact::NcclComm: the communicator was aborted (", st.why,
                                     "); the step is abandoned."));
    ncclResult_t r = ncclSuccess;
    (void)ncclCommGetAsyncError(st.comm, &r);
    if (r == ncclSuccess || r == ncclInProgress) return;
    const std::string what = detail::cat("commpact::NcclComm: NCCL reported ", ncclGetErrorString(r), " (",
                                         ncclGetLastError(st.comm), ") on rank ", st.rank,
                                         "; the communicator is aborted and the step abandoned.");
    do_abort(st, what.c_str());
    throw peer_failure(what);
  }
  void live() const {
    if (s_->aborted)
      throw peer_failure(detail::cat("commpact::NcclComm: rank ", s_->rank, ": the communicator was aborted (", s_->why,
                                     "); create a new one."));
  }
  //! Completes a call that returned r (polling a nonblocking communicator's progress).
  void wait(ncclResult_t r, const char* what) {
    if (r == ncclInProgress) {
      const auto until = std::chrono::steady_clock::now() + s_->timeout;
      while (r == ncclInProgress) {
        (void)ncclCommGetAsyncError(s_->comm, &r);
        if (r == ncclInProgress && std::chrono::steady_clock::now() > until) {
          do_abort(*s_, what);
          throw timeout_error(detail::cat("commpact::NcclComm: ", what, " did not complete within ",
                                          s_->timeout.count(), " ms on rank ", s_->rank, "; the communicator is aborted."));
        }
        if (r == ncclInProgress) std::this_thread::yield();
      }
    }
    if (r == ncclSuccess) return;
    const std::string msg = detail::cat("commpact::NcclComm: ", what, " failed on rank ", s_->rank, " with ",
                                        ncclGetErrorString(r), " (", s_->comm ? ncclGetLastError(s_->comm) : "", ").");
    if (r == ncclInvalidArgument || r == ncclInvalidUsage) throw invalid_argument(msg);
    do_abort(*s_, msg.c_str());
    throw peer_failure(msg);
  }
  //! A control-plane call stages and fences at once: inside a group it would read a
  //! receive that is not posted yet.
  void no_group(const char* what) const {
    require(s_->group_depth == 0, "commpact::NcclComm::", what, ": rank ", s_->rank,
            " is inside a group (group_begin without group_end); a group holds known-size sends and receives on "
            "device spans only: end the group first.");
  }
  void fence_now() { cuda_space::fence(s_->exec, std::chrono::steady_clock::now() + s_->timeout); }

  //! The staging buffer as n values of T (grows; growing synchronises the device).
  template <class T>
  cuda_span<T> staged(std::size_t n) {
    const std::size_t bytes = (n * sizeof(T) + 255) / 256 * 256;
    if (s_->stage.size() < 2 * bytes) s_->stage.resize(2 * bytes);
    return cuda_access::wrap(reinterpret_cast<T*>(cuda_access::ptr(s_->stage.view())), n);
  }
  //! The second half of the staging buffer (after staged<T>(n)).
  template <class T>
  cuda_span<T> staged_second(std::size_t n) {
    const std::size_t bytes = (n * sizeof(T) + 255) / 256 * 256;
    return cuda_access::wrap(reinterpret_cast<T*>(cuda_access::ptr(s_->stage.view()) + bytes), n);
  }
  template <class T>
  void to_device(std::span<const T> h, cuda_span<T> d) {
    if (h.empty()) return;
    const cudaError_t e = cudaMemcpyAsync(cuda_access::ptr(d), h.data(), h.size_bytes(), cudaMemcpyHostToDevice, stream());
    require<device_error>(e == cudaSuccess, "commpact::NcclComm: staging to the device failed: ", cudaGetErrorString(e));
  }
  template <class T>
  void to_host(cuda_span<const T> d, std::span<T> h) {
    if (!h.empty()) {
      const cudaError_t e =
          cudaMemcpyAsync(h.data(), cuda_access::ptr(d), h.size_bytes(), cudaMemcpyDeviceToHost, stream());
      require<device_error>(e == cudaSuccess, "commpact::NcclComm: staging to the host failed: ", cudaGetErrorString(e));
    }
    fence_now();
  }

  std::shared_ptr<state> s_;
};

static_assert(PointToPoint<NcclComm>);

}  // namespace commpact
