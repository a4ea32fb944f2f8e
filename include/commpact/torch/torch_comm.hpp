// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file torch_comm.hpp
//! TorchComm: a commpact::AsyncPointToPoint communicator over a PyTorch
//! `c10d::ProcessGroup` (LibTorch), so every commpact algorithm runs over the process
//! group a PyTorch program already has. The host space goes over ProcessGroupGloo; any
//! process group that implements allreduce, allgather, broadcast, barrier, send and recv
//! on CPU tensors works.
//!
//! \code
//! auto store = c10::make_intrusive<c10d::FileStore>("/tmp/rendezvous", P);
//! auto pg = commpact::torch_gloo_group(store, rank, P);       // or the program's own group
//! commpact::TorchComm comm{pg, store, {.timeout = std::chrono::seconds(60)}};
//! commpact::gTopK<commpact::TreeComm<commpact::TorchComm>> gtopk{comm, {.density = 0.01}};
//! gtopk.reduce(std::span(grad));
//! \endcode
//!
//! - Semantics are ThreadComm's and MpiComm's (concepts/communicator.hpp): allreduce
//!   (float, double, int32, int64; sum, min, max), allgather and broadcast of any
//!   trivially copyable type (moved as bytes), barrier, variable-length send / recv /
//!   sendrecv, and known-size isend / irecv. Results are identical on every rank (Gloo's
//!   allreduce computes each element on one rank and copies it; the tests check it).
//! - Never hang: a collective's wait polls its c10d Work (Work::isCompleted) against
//!   `torch_options::timeout` and, every `poll` interval, the store for a failure notice;
//!   a point-to-point wait blocks in Work::wait(timeout) (Gloo's send and receive Works
//!   complete only there) while a watchdog thread looks for the notice and aborts it.
//!   Each call also looks for a notice when the last look is older than `poll`, so a
//!   rank that comes back late never joins collectives the others abandoned.
//!   A wait past the deadline raises timeout_error and tells the other ranks; a notice
//!   raises peer_failure with the remote reason; an error of the process group (Gloo:
//!   a peer's connection closed) raises comm_error and tells the others. After a failure
//!   every operation raises at once. `abort(why)` writes the notice.
//! - The notice travels through the c10d::Store the process group was built on, under
//!   the key `<name>/failed` (torch_options::name): two TorchComms over one store need
//!   two names. Without a store, failures still end at the deadline or with the
//!   process group's own error, but an abort reaches no other rank.
//! - Agreement: with `verify_collectives` (the default) each collective first runs one
//!   allreduce of 7 int64 with its signature (comm/signature.hpp, as MpiComm and
//!   CheckedComm do): ranks that disagree all raise mismatch_error, a bad argument on one
//!   rank raises invalid_argument on all, before data moves; the communicator stays
//!   usable.
//! - Memory safety after a failure: data moves through tensors owned by the c10d Work
//!   (staging copies), so an operation abandoned after a failure never writes into the
//!   caller's memory later.
//! - Wire of point to point: every message is an 8-byte length header (tag
//!   torch_header_tag) then, when not empty, the payload (tag torch_payload_tag), so
//!   every payload receive is posted with its message's length (Gloo aborts the process
//!   on a message longer than the receive). A send copies the message and does not wait
//!   for its receiver (a reaper thread waits for Gloo's send Work; flush() waits for all);
//!   isend's handle is therefore complete at once. irecv checks the header against the
//!   size it expects: a different size fails the communicator on every rank with
//!   mismatch_error. test() on an irecv handle waits (Gloo's receive cannot be polled).
//! - Threads: copies share one state; one thread at a time may use a TorchComm (Bucketed
//!   runs its buckets on a second thread while the caller makes no calls, which is
//!   allowed: allows_calls_from_other_threads() is true).
//!
//! Files: this one (TorchComm: its collectives and point-to-point calls, and
//! torch_request, the nonblocking handle) is the one to include, or commpact/torch.hpp;
//! it includes torch_failure.hpp (torch_options, the failure notice, the deadline-bounded
//! wait) and torch_p2p.hpp (the point-to-point wire: receive queues, the send reaper, the
//! watchdog).

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../comm/blocking.hpp"
#include "../comm/guard.hpp"
#include "../comm/signature.hpp"
#include "../space/host.hpp"
#include "torch_failure.hpp"
#include "torch_p2p.hpp"

namespace commpact {

//! A nonblocking TorchComm operation. Default-constructed: already complete. wait()
//! blocks within the deadline (and raises like the blocking forms); test() completes it
//! when the process group has. Cheap to move; not copyable.
class torch_request {
 public:
  torch_request() = default;
  torch_request(torch_request&&) noexcept = default;
  torch_request& operator=(torch_request&&) noexcept = default;

  void wait() {
    while (!done()) {
      step(true);
    }
  }
  //! A receive cannot be polled (Gloo's point-to-point Work completes inside wait()):
  //! test() on an irecv handle waits for it.
  bool test() {
    if (done()) return true;
    if (kind_ == kind::recv) {
      wait();
      return true;
    }
    if (work_ && !work_->isCompleted()) return false;
    step(false);
    return done();
  }

 private:
  friend class TorchComm;
  enum class kind { none, collective, allgather, recv };

  bool done() const { return kind_ == kind::none; }

  // Completes the operation (blocking, or the Work already completed).
  void step(bool block) {
    if (kind_ == kind::recv) {
      state_->finish_recv(recv_, what_);
      if (out_bytes_) std::memcpy(out_, recv_->payload.data_ptr(), out_bytes_);
    } else {
      if (block || work_) state_->wait(work_, what_, false);
      if (kind_ == kind::collective && out_bytes_) std::memcpy(out_, stage_.data_ptr(), out_bytes_);
      if (kind_ == kind::allgather) {
        const std::size_t blk = out_bytes_ / gathered_.size();
        for (std::size_t r = 0; r < gathered_.size(); ++r)
          if (blk) std::memcpy(static_cast<std::byte*>(out_) + r * blk, gathered_[r].data_ptr(), blk);
      }
    }
    kind_ = kind::none;
    work_.reset();
    stage_ = at::Tensor();
    gathered_.clear();
    recv_.reset();
  }

  std::shared_ptr<detail::torch_state> state_;
  kind kind_ = kind::none;
  const char* what_ = "";
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor stage_;
  std::vector<at::Tensor> gathered_;
  std::shared_ptr<detail::torch_state::pending_recv> recv_;
  void* out_ = nullptr;
  std::size_t out_bytes_ = 0;
};

//! One rank's handle on a c10d::ProcessGroup; see the file comment.
class TorchComm : public detail::blocking_collectives<TorchComm> {
 public:
  using request = torch_request;
  using space_type = host_space;

  //! `store`: the store the group was built on (for failure notices; may be null).
  explicit TorchComm(c10::intrusive_ptr<c10d::ProcessGroup> pg, c10::intrusive_ptr<c10d::Store> store = {},
                     torch_options opt = {})
      : state_(std::make_shared<detail::torch_state>(std::move(pg), std::move(store), std::move(opt))) {}

  int rank() const { return state_->rank(); }
  int size() const { return state_->size(); }
  const torch_options& options() const { return state_->options(); }
  bool checks_collectives() const { return state_->options().verify_collectives; }
  static constexpr bool allows_calls_from_other_threads() { return true; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return state_->group(); }
  bool failed() const { return state_->failed(); }
  std::string failure() const { return state_->failure(); }

  // ---- collectives (the blocking forms: blocking_collectives, comm/blocking.hpp) ----
  template <class T>
    requires std::is_arithmetic_v<T>
  torch_request iallreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    static_assert(detail::torch_reducible<T>,
                  "commpact::TorchComm::allreduce supports float, double, int32 and int64 (the element types c10d "
                  "reduces); convert other element types first.");
    state_->enter("allreduce");
    std::string bad;
    if (op != reduce_op::sum && op != reduce_op::min && op != reduce_op::max)
      bad = detail::cat("commpact::TorchComm::allreduce: rank ", rank(), " passed reduce_op ", static_cast<int>(op),
                        "; use reduce_op::sum, min or max.");
    if (!verified({detail::coll_kind_sig::allreduce, detail::sig_type_code<T>(),
                   static_cast<std::int64_t>(data.size_bytes()), static_cast<std::int64_t>(op)},
                  bad))
      return {};
    torch_request r = make("allreduce", torch_request::kind::collective);
    r.stage_ = at::empty({static_cast<std::int64_t>(data.size())}, at::TensorOptions().dtype(detail::torch_dtype<T>()));
    std::memcpy(r.stage_.data_ptr(), data.data(), data.size_bytes());
    r.out_ = data.data();
    r.out_bytes_ = data.size_bytes();
    c10d::AllreduceOptions o;
    o.reduceOp = op == reduce_op::sum ? c10d::ReduceOp::SUM : op == reduce_op::min ? c10d::ReduceOp::MIN
                                                                                   : c10d::ReduceOp::MAX;
    std::vector<at::Tensor> t{r.stage_};
    r.work_ = state_->start("allreduce", [&] { return state_->pg().allreduce(t, o); });
    return r;
  }

  template <class T>
    requires std::is_trivially_copyable_v<T>
  torch_request iallgather(std::span<const T> in, std::span<T> out) {
    state_->enter("allgather");
    std::string bad;
    if (out.size() != in.size() * static_cast<std::size_t>(size()))
      bad = detail::cat("commpact::TorchComm::allgather: rank ", rank(), " passed an output of ", out.size(),
                        " elements; it must hold size() * in.size() = ", size(), " * ", in.size(), ".");
    if (!verified({detail::coll_kind_sig::allgather, 0, static_cast<std::int64_t>(in.size_bytes()), 0}, bad))
      return {};
    torch_request r = make("allgather", torch_request::kind::allgather);
    at::Tensor mine = detail::torch_bytes(in.size_bytes());
    std::memcpy(mine.data_ptr(), in.data(), in.size_bytes());
    for (int q = 0; q < size(); ++q) r.gathered_.push_back(detail::torch_bytes(in.size_bytes()));
    r.out_ = out.data();
    r.out_bytes_ = out.size_bytes();
    std::vector<std::vector<at::Tensor>> outs{r.gathered_};
    std::vector<at::Tensor> ins{mine};
    r.work_ = state_->start("allgather", [&] { return state_->pg().allgather(outs, ins); });
    return r;
  }

  template <class T>
    requires std::is_trivially_copyable_v<T>
  torch_request ibroadcast(std::span<T> data, int root) {
    state_->enter("broadcast");
    std::string bad;
    if (root < 0 || root >= size())
      bad = detail::cat("commpact::TorchComm::broadcast: rank ", rank(), " passed root ", root, ", outside [0, ",
                        size(), "); pass the rank that holds the data.");
    if (!verified({detail::coll_kind_sig::broadcast, 0, static_cast<std::int64_t>(data.size_bytes()), root}, bad))
      return {};
    torch_request r = make("broadcast", torch_request::kind::collective);
    r.stage_ = detail::torch_bytes(data.size_bytes());
    std::memcpy(r.stage_.data_ptr(), data.data(), data.size_bytes());
    r.out_ = data.data();
    r.out_bytes_ = data.size_bytes();
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.rootTensor = 0;
    std::vector<at::Tensor> t{r.stage_};
    r.work_ = state_->start("broadcast", [&] { return state_->pg().broadcast(t, o); });
    return r;
  }

  //! Returns when every rank entered barrier(). Sends in flight are not awaited (flush()).
  void barrier() {
    state_->enter("barrier");
    if (state_->options().verify_collectives) {
      check({detail::coll_kind_sig::barrier, 0, 0, 0}, {});  // the signature allreduce is the barrier
      return;
    }
    auto w = state_->start("barrier", [&] { return state_->pg().barrier(); });
    state_->wait(w, "barrier", false);
  }

  // ---- point to point ----------------------------------------------------------------
  //! Sends a copy of msg to peer; does not wait for the receiver.
  void send(int peer, std::span<const std::byte> msg) { post_send(peer, msg, "send"); }

  //! Receives the next message from peer into buf (resized to its length).
  void recv(int peer, std::vector<std::byte>& buf) {
    check_peer(peer, "recv");
    state_->enter("recv");
    auto pr = state_->post_recv(peer, -1, "recv");
    state_->finish_recv(pr, "recv");
    buf.resize(static_cast<std::size_t>(pr->got));
    if (pr->got > 0) std::memcpy(buf.data(), pr->payload.data_ptr(), buf.size());
  }

  //! Sends msg to peer and receives peer's message into buf (send does not wait, so
  //! either side may receive first).
  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) {
    send(peer, msg);
    recv(peer, buf);
  }

  //! Nonblocking send of msg to peer. msg is copied, so the handle is complete at once
  //! (msg may be reused); delivery is awaited by flush().
  torch_request isend(int peer, std::span<const std::byte> msg) {
    post_send(peer, msg, "isend");
    return {};
  }

  //! Nonblocking receive of exactly buf.size() bytes from peer (a message of another size
  //! fails the communicator on every rank with mismatch_error).
  torch_request irecv(int peer, std::span<std::byte> buf) {
    check_peer(peer, "irecv");
    state_->enter("irecv");
    torch_request r = make("irecv", torch_request::kind::recv);
    r.out_ = buf.data();
    r.out_bytes_ = buf.size();
    r.recv_ = state_->post_recv(peer, static_cast<std::int64_t>(buf.size()), "irecv");
    return r;
  }

  //! Waits until every message queued by send() has been received.
  void flush() {
    state_->enter("flush");
    state_->flush();
  }
  //! Sends not yet known to be received.
  std::size_t pending_sends() const { return state_->pending_sends(); }

  //! Marks the communicator failed here and leaves a notice in the store, so every other
  //! rank's current or next wait raises peer_failure. Never throws.
  void abort(std::string_view why) noexcept {
    try {
      state_->fail_and_tell(detail::cat("rank ", rank(), " aborted: ", why));
    } catch (...) {
    }
  }

 private:
  torch_request make(const char* what, torch_request::kind k) const {
    torch_request r;
    r.state_ = state_;
    r.what_ = what;
    r.kind_ = k;
    return r;
  }

  void check_peer(int peer, const char* what) const {
    require(peer >= 0 && peer < size() && peer != rank(), "commpact::TorchComm::", what, ": rank ", rank(),
            " named peer ", peer, "; a peer must be another rank in [0, ", size(), ").");
  }

  // Posts the header and the payload (both kept in flight).
  void post_send(int peer, std::span<const std::byte> msg, const char* what) {
    check_peer(peer, what);
    state_->enter(what);
    at::Tensor h = at::empty({1}, at::TensorOptions().dtype(at::kLong));
    h.data_ptr<std::int64_t>()[0] = static_cast<std::int64_t>(msg.size());
    std::vector<at::Tensor> ht{h};
    auto wh = state_->start(what, [&] { return state_->pg().send(ht, peer, torch_header_tag); });
    state_->keep_send(wh);
    if (msg.empty()) return;
    at::Tensor p = detail::torch_bytes(msg.size());
    std::memcpy(p.data_ptr(), msg.data(), msg.size());
    std::vector<at::Tensor> pt{p};
    auto wp = state_->start(what, [&] { return state_->pg().send(pt, peer, torch_payload_tag); });
    state_->keep_send(wp);
  }

  // The signature check (verify_collectives); false when all ranks agreed on 0 bytes.
  bool verified(const detail::collective_signature& sig, const std::string& bad) {
    if (state_->options().verify_collectives) return check(sig, bad);
    if (!bad.empty()) throw invalid_argument(bad);
    return sig.bytes != 0;
  }
  bool check(const detail::collective_signature& sig, const std::string& bad) {
    at::Tensor w = at::empty({detail::signature_words}, at::TensorOptions().dtype(at::kLong));
    detail::encode_signature(sig, rank(), !bad.empty(), w.data_ptr<std::int64_t>());
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    std::vector<at::Tensor> t{w};
    auto work = state_->start("signature check", [&] { return state_->pg().allreduce(t, o); });
    state_->wait(work, detail::coll_sig_name(static_cast<std::int64_t>(sig.kind)), false);
    detail::judge_signature(sig, rank(), w.data_ptr<std::int64_t>(), bad, "commpact::TorchComm");
    return sig.bytes != 0;
  }

  std::shared_ptr<detail::torch_state> state_;
};

static_assert(AsyncPointToPoint<TorchComm>);

//! Runs fn (as fn(comm) if that compiles, else fn()); an exception that escapes aborts
//! comm (every other rank raises peer_failure) and is rethrown.
template <class C, class F>
decltype(auto) torch_guard(C& comm, F&& fn) {
  return comm_guard(comm, std::forward<F>(fn));
}

}  // namespace commpact
