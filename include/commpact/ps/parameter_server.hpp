// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file parameter_server.hpp
//! (Over 450 lines on purpose: one class whose worker, server and message loop share the
//! peers' channels, the failure state and the wait; the protocol's other pieces are
//! wire.hpp, roles.hpp, consistency.hpp and options.hpp.)
//! ParameterServer<Comm, Codec, Model>: a sharded parameter server with BSP, SSP(s) or
//! ASP consistency (ps/consistency.hpp), over any communicator with point-to-point
//! messages and receives of a known size (ThreadComm, MpiComm, CountingComm of either).
//!
//! <!-- snippet: grad=std::function<void(std::span<const float>, std::span<float>)> -->
//! \code
//! commpact::run_threads(5, [&](commpact::ThreadComm& comm) {
//!   using namespace commpact::ps;
//!   ParameterServer<commpact::ThreadComm, dense_codec, Ssp> server{comm, roles::separate(5, 1), init, Ssp{2},
//!                                                            {.momentum = 0.9}};
//!   std::vector<float> x(init.size()), g(init.size());
//!   if (server.is_worker()) {
//!     for (int c = 0; c < steps; ++c) {
//!       server.pull(x);                 // waits while this worker is more than s clocks ahead
//!       grad(x, g);
//!       server.push(g, 0.1);            // encoded per shard, error feedback kept here
//!     }
//!   }
//!   server.finish();                     // every rank: servers serve until every worker is done
//!   server.final_params(x);              // collective: the servers' shards on every rank
//! });
//! \endcode
//!
//! One object per rank plays the rank's roles (roles.hpp): a server owns shard s and an
//! Sgd (momentum, weight decay) for it; a worker keeps one codec per shard and one error
//! feedback for its whole gradient (what a lossy codec did not send is added to its next
//! push). Everything runs on the caller's thread: every wait (pull, finish, barrier)
//! serves the incoming messages of this rank's server while it waits, so colocated ranks
//! need no second thread and no MPI_THREAD_MULTIPLE.
//!
//! Protocol (wire.hpp): each rank keeps one receive of a 40-byte header posted per peer;
//! a header that announces a payload is followed by it. A push carries "and send me the
//! parameters of my next clock", so one push costs sum over remote servers of (40 +
//! encoded bytes) and its reply (40 + 4 n_s). A pull is answered once the server's
//! version reaches Model::required_version(clock). Bsp/Ssp apply one optimiser step per
//! clock when every active worker's push of that clock is in, decoding the pushes in
//! worker order into a zeroed sum and dividing by the number of contributors (mean_of):
//! with dense_codec this is exactly the sum and mean of ThreadComm's allreduce, so Bsp
//! gives the parameters of all-reduce S-SGD (Dense + Sgd) bit for bit, with any number
//! of servers. Asp applies each push at once as a step with gradient push / W.
//!
//! Failures: an error this object detects (a push of the wrong length, a malformed
//! message, ranks that disagree at construction) aborts the communicator and raises; a
//! failed or silent peer makes every wait raise peer_failure or timeout_error (the
//! communicator's receive deadline, and `timeout` for the whole wait). Nothing is
//! applied from a push before all of it was received and decoded. Destroying the object
//! before finish() aborts the communicator, so that the other ranks raise at once.
//!
//! Values: every value a server applies is checked first. A push's lr must be a finite
//! float > 0 (the worker raises invalid_argument before sending; a server that receives
//! another one raises wire_error); under Bsp and Ssp the pushes of one clock (one step)
//! must carry the same lr, or the server raises mismatch_error. A server checks the sum
//! of the pushes it decoded before its Sgd step: a push holding NaN or Inf (no honest
//! worker sends one: push() checks its gradient) raises wire_error naming the worker;
//! finite pushes whose sum overflowed raise numeric_error on every rank (the server
//! tells its peers with a `failed` message before it aborts the communicator, each rank
//! that reads one tells its own peers), and no parameter changes. Likewise after the
//! Sgd step: a finite sum and a finite lr whose step makes a parameter overflow raise
//! numeric_error on every rank, the shard and the optimiser's velocity as before the step.
//!
//! Construction is collective (one small allreduce checks that every rank holds the same
//! model length, roles, consistency model, codec sizes and optimiser options); so are final_params() and
//! barrier() (the one way to make a collective safe mid-run, see barrier()).

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/agree.hpp"
#include "../comm/known_size.hpp"
#include "../compress/error_feedback.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/mean.hpp"
#include "../train/sgd.hpp"
#include "consistency.hpp"
#include "dense_codec.hpp"
#include "options.hpp"
#include "roles.hpp"
#include "wire.hpp"

namespace commpact::ps {

template <ServerComm Comm, Codec K = dense_codec, Consistency Model = Bsp>
class ParameterServer {
  static_assert(diagnose_codec<K>());
  static_assert(diagnose_consistency<Model>());

 public:
  using codec_type = K;
  using model_type = Model;
  //! Builds the codec of shard s = [lo, hi): `make(s, lo, hi)` (per_tensor codecs take
  //! shard_layout(layout, lo, hi)).
  using codec_factory = std::function<K(std::size_t shard, std::size_t lo, std::size_t hi)>;

  //! Collective. `init` (the same length on every rank) gives the servers their shard's
  //! starting parameters. Every shard uses a copy of `prototype`.
  ParameterServer(Comm comm, roles r, std::span<const float> init, Model model = Model{}, ps_options opt = {},
                  K prototype = K{})
      : ParameterServer(std::move(comm), std::move(r), init, std::move(model), opt,
                        codec_factory([prototype](std::size_t, std::size_t, std::size_t) { return prototype; })) {}

  //! Collective; the codec of each shard from `make`.
  ParameterServer(Comm comm, roles r, std::span<const float> init, Model model, ps_options opt, codec_factory make)
      : comm_(std::move(comm)), roles_(std::move(r)), model_(std::move(model)), opt_(opt), n_(init.size()) {
    const int P = comm_.size();
    me_ = comm_.rank();
    std::string problem = roles_.problem(P);
    if (problem.empty() && n_ < roles_.servers.size())
      problem = detail::cat("commpact::ps::ParameterServer: the model has ", n_, " values, fewer than the ",
                            roles_.servers.size(), " servers; use fewer servers.");
    S_ = roles_.servers.size();
    W_ = roles_.workers.size();
    if (problem.empty()) {
      for (std::size_t s = 0; s <= S_; ++s) bounds_.push_back(shard_begin(n_, S_, s));
      server_of_.assign(static_cast<std::size_t>(P), -1);
      worker_of_.assign(static_cast<std::size_t>(P), -1);
      for (std::size_t s = 0; s < S_; ++s) server_of_[roles_.servers[s]] = static_cast<int>(s);
      for (std::size_t w = 0; w < W_; ++w) worker_of_[roles_.workers[w]] = static_cast<int>(w);
      sidx_ = server_of_[me_];
      widx_ = worker_of_[me_];
      try {
        for (std::size_t s = 0; s < S_; ++s) codecs_.push_back(make(s, bounds_[s], bounds_[s + 1]));
        for (std::size_t s = 0; s < S_ && problem.empty(); ++s) problem = check_codec(s);
        for (std::size_t s = 0; s < S_ && problem.empty(); ++s) problem = check_wire_length(s);
      } catch (const std::exception& e) {
        problem = e.what();
      }
    }
    if (problem.empty()) {
      try {  // the servers' optimiser options, checked on every rank before the agreement
        Sgd check(0, sgd_options{.momentum = opt_.momentum, .weight_decay = opt_.weight_decay});
      } catch (const std::exception& e) {
        problem = e.what();
      }
    }
    std::int64_t cap_sum = 0;
    for (std::size_t s = 0; s < codecs_.size(); ++s)
      cap_sum += static_cast<std::int64_t>(codecs_[s].max_encoded_bytes(bounds_[s + 1] - bounds_[s]));
    // One allreduce: every rank holds the same model length, roles, consistency model and
    // codec sizes ("shards that disagree"), and no rank rejected its input.
    commpact::agree(comm_, "ps::ParameterServer",
                    {{"the model length n", static_cast<std::int64_t>(n_)},
                     {"the roles (server and worker lists)", roles_.fingerprint()},
                     {"the consistency model (per push)", Model::per_push ? 1 : 0},
                     {"the staleness bound", model_.staleness()},
                     {"the codecs' message capacities", cap_sum},
                     {"the servers' momentum (its bits)", std::bit_cast<std::int64_t>(opt_.momentum)},
                     {"the servers' weight decay (its bits)", std::bit_cast<std::int64_t>(opt_.weight_decay)}},
                    problem, 0, "ParameterServer",
                    "every rank must build the ParameterServer with the same model length, roles, consistency "
                    "model, codecs and server options.");
    timeout_ = opt_.timeout;
    if (timeout_.count() <= 0) {
      if constexpr (requires { comm_.options().timeout; })
        timeout_ = std::chrono::duration_cast<std::chrono::milliseconds>(comm_.options().timeout);
      else
        timeout_ = std::chrono::seconds(60);
    }
    // Peers: a server talks to every worker, a worker to every server (itself excluded).
    for (int q = 0; q < P; ++q) {
      if (q == me_) continue;
      const bool talk = (sidx_ >= 0 && worker_of_[q] >= 0) || (widx_ >= 0 && server_of_[q] >= 0);
      if (talk) {
        peers_.emplace_back();
        peers_.back().rank = q;
      }
    }
    if (sidx_ >= 0) {
      const std::size_t lo = bounds_[sidx_], hi = bounds_[sidx_ + 1];
      shard_.assign(init.begin() + static_cast<std::ptrdiff_t>(lo), init.begin() + static_cast<std::ptrdiff_t>(hi));
      sgd_.emplace(hi - lo, sgd_options{.momentum = opt_.momentum, .weight_decay = opt_.weight_decay});
      pushes_.assign(W_, 0);
      done_at_.assign(W_, -1);
      want_.assign(W_, -1);
      queue_.resize(W_);
      acc_.assign(hi - lo, 0.0f);
    }
    if (widx_ >= 0) {
      view_.assign(init.begin(), init.end());
      approx_.assign(n_, 0.0f);
      shard_version_.assign(S_, 0);
      std::size_t most = 0;
      for (std::size_t s = 0; s < S_; ++s) most = std::max(most, codecs_[s].max_encoded_bytes(bounds_[s + 1] - bounds_[s]));
      msg_.assign(most, std::byte{0});
      if constexpr (commpact::req::codec_has_bind_rank<K>)
        for (std::size_t s = 0; s < S_; ++s) codecs_[s].bind_rank(static_cast<int>(widx_ * S_ + s));
    }
    for (auto& p : peers_) post(p);
  }

  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  //! Destroying a rank that has not finished is a failure: the communicator is aborted so
  //! that the other ranks raise at once instead of waiting for this one.
  ~ParameterServer() {
    bool pending = false;
    for (auto& p : peers_) pending = pending || p.h.has_value();
    if (pending && !failed_) {
      try {
        comm_.abort("a ps::ParameterServer was destroyed before finish() (its rank failed or left early)");
      } catch (...) {
      }
    }
    for (auto& p : peers_) {
      try {
        p.h.reset();
      } catch (...) {
      }
    }
  }

  bool is_server() const { return sidx_ >= 0; }
  bool is_worker() const { return widx_ >= 0; }
  std::size_t size() const { return n_; }
  std::size_t servers() const { return S_; }
  std::size_t workers() const { return W_; }
  //! Shard s is [shard_lo(s), shard_lo(s + 1)).
  std::size_t shard_lo(std::size_t s) const { return bounds_[s]; }
  const Model& model() const { return model_; }
  const ps_options& options() const { return opt_; }
  Comm& comm() { return comm_; }

  // ---- worker --------------------------------------------------------------------
  //! This worker's clock: the gradients it has pushed.
  std::int64_t clock() const { return clock_; }

  //! Encodes grad (plus this worker's residual) shard by shard with the codecs and sends
  //! each shard to its server, with the request for the parameters of the next clock
  //! (collected by the next pull()). Raises invalid_argument, and aborts the
  //! communicator, when grad has the wrong length or lr is not a finite float > 0:
  //! nothing is sent and no parameter changes.
  void push(std::span<const float> grad, double lr) {
    guarded([&] {
      require_worker("push");
      if (grad.size() != n_ || !lr_ok(lr))
        fail<invalid_argument>(grad.size() != n_
                                   ? detail::cat("commpact::ps::ParameterServer::push: worker rank ", me_, " pushed ",
                                                 grad.size(), " values; the model has n = ", n_,
                                                 ". Push the gradient of the whole flat parameter buffer.")
                                   : detail::cat("commpact::ps::ParameterServer::push: worker rank ", me_,
                                                 " passed lr = ", lr, "; use a learning rate > 0 that is finite "
                                                 "as a float (at most 3.4e38)."));
      if (outstanding_) wait_reply("push");  // the reply of a pull request not yet collected
      if (!ef_.accumulate(grad))
        fail<numeric_error>(detail::cat("commpact::ps::ParameterServer::push: worker rank ", me_, " at clock ", clock_,
                                        " pushed a gradient that is not finite (with its residual); nothing was "
                                        "sent. Lower the learning rate or clip the gradient."));
      outstanding_ = true;
      arrived_ = 0;
      auto acc = ef_.acc();
      for (std::size_t s = 0; s < S_; ++s) {
        const std::size_t lo = bounds_[s], len = bounds_[s + 1] - lo;
        if constexpr (commpact::req::codec_has_begin_step<K>) codecs_[s].begin_step(clock_);
        std::fill(approx_.begin() + static_cast<std::ptrdiff_t>(lo),
                  approx_.begin() + static_cast<std::ptrdiff_t>(lo + len), 0.0f);
        const std::size_t cap = codecs_[s].max_encoded_bytes(len);
        const std::size_t bytes =
            codecs_[s].encode(std::span<const float>(acc.data() + lo, len), std::span<std::byte>(msg_.data(), cap),
                              std::span<float>(approx_.data() + lo, len));
        require(bytes <= cap, "commpact::ps: the codec of shard ", s, " wrote ", bytes,
                " bytes, above its max_encoded_bytes(", len, ") = ", cap, "; fix the codec.");
        wire::header h{wire::kind::push, wire::pull_after, static_cast<std::uint32_t>(s),
                       static_cast<std::uint32_t>(bytes), clock_, static_cast<std::int64_t>(len), lr};
        const int srv = roles_.servers[s];
        if (srv == me_) {
          on_push(widx_, h, std::span<const std::byte>(msg_.data(), bytes));
        } else {
          send_header(srv, h, stats_.push_bytes, stats_.push_messages);
          if (bytes > 0) send_payload(srv, std::span<const std::byte>(msg_.data(), bytes), stats_.push_bytes,
                                      stats_.push_messages);
        }
      }
      ef_.subtract(approx_);
      ef_.commit();
      ++clock_;
    });
  }

  //! Writes into x (length n) the parameters this worker may read at its clock: waits,
  //! serving this rank's shard meanwhile, until every server's version reaches
  //! Model::required_version(clock()).
  void pull(std::span<float> x) {
    guarded([&] {
      require_worker("pull");
      require(x.size() == n_, "commpact::ps::ParameterServer::pull: the output holds ", x.size(),
              " values; the model has n = ", n_, ".");
      if (!outstanding_) {
        outstanding_ = true;
        arrived_ = 0;
        for (std::size_t s = 0; s < S_; ++s) {
          wire::header h{wire::kind::pull, 0, static_cast<std::uint32_t>(s), 0, clock_,
                         static_cast<std::int64_t>(bounds_[s + 1] - bounds_[s]), 0.0};
          if (roles_.servers[s] == me_) on_pull(widx_, clock_);
          else send_header(roles_.servers[s], h, stats_.control_bytes, stats_.control_messages);
        }
      }
      const auto t0 = std::chrono::steady_clock::now();
      if (arrived_ < S_) ++stats_.pulls_waited;
      wait_reply("pull");
      stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::copy(view_.begin(), view_.end(), x.begin());
      if (opt_.record_reads) {
        auto [lo, hi] = std::minmax_element(shard_version_.begin(), shard_version_.end());
        reads_.push_back({clock_, *lo, *hi});
      }
    });
  }

  //! One record per pull (with ps_options::record_reads).
  const std::vector<read_record>& reads() const { return reads_; }
  //! This worker's residual (what its codecs have not delivered yet).
  std::span<const float> residual() const { return ef_.residual(); }

  // ---- every rank -------------------------------------------------------------------
  //! Every rank calls it once, at the end: a worker tells the servers it pushes no more
  //! (it leaves the clock count, so the others stop waiting for it); a server serves until
  //! every worker is done. Returns when no message to or from this rank is left.
  void finish() {
    guarded([&] {
      if (finished_) return;
      if (widx_ >= 0) {
        if (outstanding_) wait_reply("finish");
        for (std::size_t s = 0; s < S_; ++s) {
          wire::header h{wire::kind::done, 0, static_cast<std::uint32_t>(s), 0, clock_, 0, 0.0};
          if (roles_.servers[s] == me_) on_done(widx_);
          else send_header(roles_.servers[s], h, stats_.control_bytes, stats_.control_messages);
        }
        done_sent_ = true;
      } else {
        done_sent_ = true;
      }
      wait_for("finish", [&] {
        send_byes();
        for (auto& p : peers_)
          if (!p.bye_sent || !p.bye_received) return false;
        return true;
      });
      if constexpr (requires { comm_.flush(); }) comm_.flush();
      finished_ = true;
    });
  }

  //! Collective, after finish(): every server broadcasts its shard, so x (length n) holds
  //! the trained parameters on every rank.
  void final_params(std::span<float> x) {
    require(finished_, "commpact::ps::ParameterServer::final_params: call finish() on every rank first.");
    require(x.size() == n_, "commpact::ps::ParameterServer::final_params: the output holds ", x.size(),
            " values; the model has n = ", n_, ".");
    if (sidx_ >= 0) std::copy(shard_.begin(), shard_.end(), x.begin() + static_cast<std::ptrdiff_t>(bounds_[sidx_]));
    for (std::size_t s = 0; s < S_; ++s)
      comm_.broadcast(x.subspan(bounds_[s], bounds_[s + 1] - bounds_[s]), roles_.servers[s]);
  }

  //! Every rank calls it (workers between a pull and the next push): returns once every
  //! peer has reached it, serving meanwhile. Afterwards no rank waits for another's
  //! server, so a collective on the communicator (a loss allreduce) is safe.
  void barrier() {
    guarded([&] {
      if (outstanding_) wait_reply("barrier");
      ++fence_;
      for (auto& p : peers_) {
        wire::header h{wire::kind::fence, 0, 0, 0, fence_, 0, 0.0};
        send_header(p.rank, h, stats_.control_bytes, stats_.control_messages);
      }
      wait_for("barrier", [&] {
        for (auto& p : peers_)
          if (p.fences < fence_) return false;
        return true;
      });
    });
  }

  // ---- server -----------------------------------------------------------------------
  //! This server's shard (empty on a worker-only rank).
  std::span<const float> shard_params() const { return shard_; }
  //! Clocks (Bsp/Ssp) or pushes (Asp) this server has applied.
  std::int64_t version() const { return version_; }
  //! Gradients this server has received from worker w.
  std::int64_t pushes_from(std::size_t w) const { return pushes_.at(w); }

  const ps_stats& stats() const { return stats_; }

  //! Serves whatever has arrived without waiting (a worker may call it while computing).
  void poll() {
    guarded([&] { (void)progress(); });
  }

 private:
  using handle_type = decltype(std::declval<Comm&>().irecv(0, std::span<std::byte>{}));
  struct peer {
    int rank = 0;
    std::optional<handle_type> h;
    std::array<std::byte, wire::header_bytes> hdr{};
    bool bye_sent = false, bye_received = false;
    std::int64_t fences = 0;
  };
  struct pending_push {
    std::vector<std::byte> bytes;
    double lr = 0;
  };

  //! A shard whose parameters or pushes would not fit the wire header's 32-bit payload
  //! length (shards of 2^30 floats or more), refused at construction on every rank.
  std::string check_wire_length(std::size_t s) const {
    const std::size_t len = bounds_[s + 1] - bounds_[s];
    const std::uint64_t bytes =
        std::max<std::uint64_t>(4 * static_cast<std::uint64_t>(len), codecs_[s].max_encoded_bytes(len));
    if (bytes <= 0xFFFFFFFFull) return {};
    return detail::cat("commpact::ps::ParameterServer: shard ", s, " holds ", len,
                       " values, whose messages take up to ",
                       bytes, " bytes, above the wire header's 32-bit payload length (4294967295 bytes); use more "
                       "servers (each shard below 2^30 values).");
  }

  std::string check_codec(std::size_t s) const {
    if constexpr (commpact::req::codec_has_check<K>) return std::string(codecs_[s].check(bounds_[s + 1] - bounds_[s]));
    else return {};
  }

  void require_worker(const char* what) const {
    require(widx_ >= 0, "commpact::ps::ParameterServer::", what, ": rank ", me_,
            " is not a worker (see its roles); only workers push and pull.");
    require(!done_sent_, "commpact::ps::ParameterServer::", what, ": worker rank ", me_,
            " already called finish().");
  }

  //! Runs f; an error of this rank's own (not a peer's failure) aborts the communicator
  //! so that the other ranks raise instead of waiting.
  template <class F>
  void guarded(F&& f) {
    require(!failed_, "commpact::ps::ParameterServer: an earlier call on rank ", me_,
            " raised; the parameter server cannot continue (build a new one on a new communicator).");
    try {
      f();
    } catch (const peer_failure&) {  // another rank failed: the communicator already knows
      failed_ = true;
      throw;
    } catch (const std::exception& e) {  // this rank's own error (a timeout included): tell the others
      failed_ = true;
      try {
        comm_.abort(detail::cat("ps::ParameterServer on rank ", me_, ": ", e.what()));
      } catch (...) {
      }
      throw;
    }
  }

  template <class E>
  [[noreturn]] void fail(const std::string& why) {
    throw E(why);
  }

  //! A learning rate a server may apply: finite as a float and > 0.
  static bool lr_ok(double lr) {
    return std::isfinite(lr) && lr > 0 && lr <= static_cast<double>(std::numeric_limits<float>::max());
  }

  //! Tells every peer still listening that the run failed for `why` (once), before this
  //! rank raises and aborts the communicator: a message sent before the abort is
  //! delivered, so each peer reads it (and raises the same error) instead of the abort.
  void tell_failed(std::int64_t why) {
    if (told_) return;
    told_ = true;
    for (auto& p : peers_) {
      if (p.bye_sent) continue;
      wire::header h{wire::kind::failed, 0, 0, 0, version_, why, 0.0};
      try {
        send_header(p.rank, h, stats_.control_bytes, stats_.control_messages);
      } catch (...) {
      }
    }
  }

  //! The sum acc_ of the pushes `from` (worker indices) is not finite: a push holding
  //! NaN or Inf raises wire_error naming its worker; finite pushes whose sum overflowed
  //! tell every peer and raise numeric_error. Nothing was applied.
  template <class Pushes>
  [[noreturn]] void reject_sum(const Pushes& from, std::int64_t clock) {
    std::vector<float> one(acc_.size());
    for (const auto& [w, bytes] : from) {
      std::fill(one.begin(), one.end(), 0.0f);
      codecs_[sidx_].decode_add(*bytes, one);
      for (const float v : one)
        if (!std::isfinite(v))
          fail<wire_error>(detail::cat("commpact::ps: server rank ", me_, " (shard ", sidx_, ") received a push "
                                       "of clock ", clock, " from worker ", w, " (rank ", roles_.workers[w],
                                       ") that decodes to the non-finite value ", v,
                                       "; a worker never pushes one (push() checks its gradient), so the message "
                                       "is corrupted or forged."));
    }
    tell_failed(wire::failure::overflow);
    fail<numeric_error>(detail::cat("commpact::ps: server rank ", me_, " (shard ", sidx_, "): the sum of the "
                                    "workers' finite pushes of clock ", clock, " overflowed float; no parameter "
                                    "changed and every rank raises numeric_error. Lower the learning rate, scale "
                                    "the loss or clip the gradients."));
  }
  //! One Sgd step of the shard by acc_, kept only when every parameter stays finite: else
  //! every rank raises numeric_error, and the shard and the optimiser are as before.
  void step_shard(double lr, std::int64_t clock) {
    next_shard_ = shard_;  // reuses its capacity after the first step
    next_sgd_ = sgd_;
    (*next_sgd_)(next_shard_, acc_, lr);
    if (!all_finite(next_shard_)) {
      tell_failed(wire::failure::overflow);
      fail<numeric_error>(detail::cat("commpact::ps: server rank ", me_, " (shard ", sidx_, "): the Sgd step of "
                                      "clock ", clock, " (finite pushes, lr = ", lr, ") made a parameter overflow "
                                      "float; no parameter changed and every rank raises numeric_error. Lower the "
                                      "learning rate, scale the loss or clip the gradients."));
    }
    shard_.swap(next_shard_);
    std::swap(*sgd_, *next_sgd_);
  }
  static bool all_finite(std::span<const float> v) {
    for (const float x : v)
      if (!std::isfinite(x)) return false;
    return true;
  }

  void post(peer& p) {
    p.h.emplace(comm_.irecv(p.rank, std::span<std::byte>(p.hdr)));
  }

  void send_header(int to, const wire::header& h, std::uint64_t& bytes, std::uint64_t& messages) {
    std::array<std::byte, wire::header_bytes> b;
    wire::write(b, h);
    comm_.send(to, std::span<const std::byte>(b));
    bytes += wire::header_bytes;
    ++messages;
  }
  void send_payload(int to, std::span<const std::byte> payload, std::uint64_t& bytes, std::uint64_t& messages) {
    comm_.send(to, payload);
    bytes += payload.size();
    ++messages;
  }

  //! Takes every header that has arrived; true when something happened.
  bool progress() {
    bool any = false;
    for (auto& p : peers_) {
      if (!p.h) continue;
      if (!p.h->test()) continue;
      p.h.reset();
      any = true;
      handle(p);
    }
    return any;
  }

  template <class Pred>
  void wait_for(const char* what, Pred done) {
    // The deadline counts from the last message: a server-only rank waits in finish() for
    // the whole run, legitimately, as long as messages keep coming.
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    int idle = 0;
    while (!done()) {
      if (progress()) {
        idle = 0;
        deadline = std::chrono::steady_clock::now() + timeout_;
        continue;
      }
      if (++idle < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(idle < 256 ? 20 : 100));
        if (std::chrono::steady_clock::now() > deadline)
          throw timeout_error(detail::cat("commpact::ps::ParameterServer::", what, ": rank ", me_, " waited more than ",
                                          timeout_.count(), " ms without a message; a peer is missing or much "
                                          "slower. Raise ps_options::timeout if the work is legitimately slow."));
        bool listening = false;
        for (auto& p : peers_) listening = listening || p.h.has_value();
        if (!listening)
          throw comm_error(detail::cat("commpact::ps::ParameterServer::", what, ": rank ", me_,
                                       " waits for a message but every peer has said goodbye; this is a bug."));
      }
    }
  }

  void wait_reply(const char* what) {
    wait_for(what, [&] { return arrived_ == S_; });
    outstanding_ = false;
  }

  void receive_payload(peer& p, std::span<std::byte> into) {
    if (!into.empty()) recv_known(comm_, p.rank, into);
  }

  void handle(peer& p) {
    const wire::header h = wire::read(std::span<const std::byte, wire::header_bytes>(p.hdr), p.rank);
    const int w = worker_of_[p.rank], s = server_of_[p.rank];
    switch (h.what) {
      case wire::kind::push: {
        require<wire_error>(sidx_ >= 0 && w >= 0 && h.shard == static_cast<std::uint32_t>(sidx_),
                            "commpact::ps: rank ", me_, " received a push for shard ", h.shard, " from rank ",
                            p.rank, " but ", sidx_ >= 0 ? "serves another shard" : "is no server",
                            "; the ranks disagree on the roles.");
        const std::size_t len = bounds_[sidx_ + 1] - bounds_[sidx_];
        const std::size_t cap = codecs_[sidx_].max_encoded_bytes(len);
        require<wire_error>(h.payload <= cap && h.n == static_cast<std::int64_t>(len), "commpact::ps: server rank ",
                            me_, " (shard ", sidx_, ", ", len, " values, messages up to ", cap,
                            " bytes) received a push from rank ", p.rank, " for ", h.n, " values with ", h.payload,
                            " bytes; the ranks disagree on the shards or the codec.");
        require<wire_error>(lr_ok(h.lr), "commpact::ps: server rank ", me_, " received a push from rank ", p.rank,
                            " with lr = ", h.lr, ", not a finite float > 0 (push() never sends one); the message "
                            "is corrupted or forged.");
        pending_push pp = take_spare();
        pp.bytes.resize(h.payload);
        pp.lr = h.lr;
        receive_payload(p, pp.bytes);
        post(p);
        on_push_owned(w, h, std::move(pp));
        return;
      }
      case wire::kind::pull:
        require<wire_error>(sidx_ >= 0 && w >= 0, "commpact::ps: rank ", me_, " received a pull from rank ", p.rank,
                            " but does not serve it; the ranks disagree on the roles.");
        post(p);
        on_pull(w, h.clock);
        return;
      case wire::kind::params: {
        require<wire_error>(widx_ >= 0 && s >= 0 && h.shard == static_cast<std::uint32_t>(s) && outstanding_ &&
                                h.n == static_cast<std::int64_t>(bounds_[s + 1] - bounds_[s]) &&
                                h.payload == 4 * static_cast<std::uint64_t>(h.n),
                            "commpact::ps: worker rank ", me_, " received parameters it did not ask for or of the "
                            "wrong size from rank ", p.rank, " (shard ", h.shard, ", ", h.n, " values, ", h.payload,
                            " bytes); the ranks disagree on the roles or the shards.");
        receive_payload(p, std::as_writable_bytes(std::span<float>(view_.data() + bounds_[s], bounds_[s + 1] - bounds_[s])));
        post(p);
        shard_version_[s] = h.clock;
        ++arrived_;
        return;
      }
      case wire::kind::done:
        require<wire_error>(sidx_ >= 0 && w >= 0, "commpact::ps: rank ", me_, " received 'done' from rank ", p.rank,
                            " but does not serve it; the ranks disagree on the roles.");
        post(p);
        on_done(w);
        return;
      case wire::kind::fence:
        post(p);
        p.fences = h.clock;
        return;
      case wire::kind::bye:
        p.bye_received = true;  // nothing more comes on this channel: no receive posted
        return;
      case wire::kind::failed:
        require<wire_error>(h.n == wire::failure::overflow, "commpact::ps: rank ", me_, " received a 'failed' "
                            "message of unknown reason ", h.n, " from rank ", p.rank, ".");
        tell_failed(h.n);
        fail<numeric_error>(detail::cat("commpact::ps: rank ", me_, ": a server's sum of the workers' finite "
                                        "pushes, or its parameters after the Sgd step, overflowed float (rank ",
                                        p.rank, " passed the word on); no "
                                        "parameter changed and every rank raises numeric_error. Lower the learning "
                                        "rate, scale the loss or clip the gradients."));
    }
  }

  // ---- the server's rules ------------------------------------------------------------
  pending_push take_spare() {
    pending_push pp;
    if (!spare_.empty()) {
      pp.bytes = std::move(spare_.back());
      spare_.pop_back();
    }
    return pp;
  }

  void on_push(int w, const wire::header& h, std::span<const std::byte> payload) {
    pending_push pp = take_spare();
    pp.bytes.assign(payload.begin(), payload.end());
    pp.lr = h.lr;
    on_push_owned(w, h, std::move(pp));
  }

  void on_push_owned(int w, const wire::header& h, pending_push pp) {
    require<wire_error>(done_at_[w] < 0 && h.clock == pushes_[w], "commpact::ps: server rank ", me_,
                        " received the push of clock ", h.clock, " from worker ", w, " (rank ", roles_.workers[w],
                        ") but expected clock ", pushes_[w], done_at_[w] >= 0 ? " (the worker had finished)" : "",
                        "; messages were lost or reordered.");
    ++pushes_[w];
    if constexpr (Model::per_push) {
      std::fill(acc_.begin(), acc_.end(), 0.0f);
      codecs_[sidx_].decode_add(pp.bytes, acc_);  // raises before any parameter changes
      if (!all_finite(acc_)) {
        const std::pair<int, const std::vector<std::byte>*> from[] = {{w, &pp.bytes}};
        reject_sum(from, h.clock);
      }
      for (auto& a : acc_) a = mean_of(a, static_cast<int>(W_));
      step_shard(pp.lr, h.clock);
      ++version_;
      spare_.push_back(std::move(pp.bytes));
    } else {
      queue_[w].push_back(std::move(pp));
      apply_clocks();
    }
    if (h.flags & wire::pull_after) want_[w] = h.clock + 1;
    serve();
  }

  void on_pull(int w, std::int64_t clock) {
    want_[w] = clock;
    serve();
  }

  void on_done(int w) {
    done_at_[w] = pushes_[w];
    if constexpr (!Model::per_push) apply_clocks();
    serve();
  }

  //! Bsp/Ssp: applies every clock whose pushes are all in: the active workers' pushes
  //! decoded in worker order into a zeroed sum, divided by their number, one Sgd step.
  void apply_clocks() {
    for (;;) {
      const std::int64_t t = version_;
      int contributors = 0;
      bool complete = true;
      for (std::size_t w = 0; w < W_; ++w) {
        if (done_at_[w] >= 0 && done_at_[w] <= t) continue;  // finished before clock t
        ++contributors;
        if (queue_[w].empty()) complete = false;
      }
      if (contributors == 0 || !complete) return;
      std::fill(acc_.begin(), acc_.end(), 0.0f);
      double lr = 0;
      bool have_lr = false;
      for (std::size_t w = 0; w < W_; ++w) {
        if (done_at_[w] >= 0 && done_at_[w] <= t) continue;
        const auto& pp = queue_[w].front();
        codecs_[sidx_].decode_add(pp.bytes, acc_);  // raises before any parameter changes
        if (!have_lr) {
          lr = pp.lr, have_lr = true;
        } else if (pp.lr != lr) {  // one step per clock: its pushes must agree on the rate
          fail<mismatch_error>(detail::cat("commpact::ps: server rank ", me_, " (shard ", sidx_, "): the pushes of clock ",
                                           t, " carry different learning rates (", lr, " and ", pp.lr, " from worker ",
                                           w, ", rank ", roles_.workers[w], "); under Bsp and Ssp a clock is one "
                                           "step, so every worker must pass the same lr to push(). No parameter "
                                           "changed."));
        }
      }
      if (!all_finite(acc_)) {
        std::vector<std::pair<int, const std::vector<std::byte>*>> from;
        for (std::size_t w = 0; w < W_; ++w)
          if (!(done_at_[w] >= 0 && done_at_[w] <= t)) from.emplace_back(static_cast<int>(w), &queue_[w].front().bytes);
        reject_sum(from, t);
      }
      for (auto& a : acc_) a = mean_of(a, contributors);
      step_shard(lr, t);
      for (std::size_t w = 0; w < W_; ++w) {
        if (done_at_[w] >= 0 && done_at_[w] <= t) continue;
        spare_.push_back(std::move(queue_[w].front().bytes));
        queue_[w].pop_front();
      }
      ++version_;
    }
  }

  //! The clocks whose updates from every worker this shard holds: the version under
  //! Bsp/Ssp; under Asp the fewest pushes applied from a worker still running.
  std::int64_t included_clock() const {
    if constexpr (!Model::per_push) {
      return version_;
    } else {
      std::int64_t lo = -1, hi = 0;
      for (std::size_t w = 0; w < W_; ++w) {
        hi = std::max(hi, pushes_[w]);
        if (done_at_[w] < 0) lo = lo < 0 ? pushes_[w] : std::min(lo, pushes_[w]);
      }
      return lo < 0 ? hi : lo;
    }
  }

  //! Answers every waiting pull whose clock the server's version now allows.
  void serve() {
    for (std::size_t w = 0; w < W_; ++w) {
      if (want_[w] < 0 || version_ < model_.required_version(want_[w])) continue;
      want_[w] = -1;
      const int to = roles_.workers[w];
      if (to == me_) {
        std::copy(shard_.begin(), shard_.end(), view_.begin() + static_cast<std::ptrdiff_t>(bounds_[sidx_]));
        shard_version_[sidx_] = included_clock();
        ++arrived_;
      } else {
        wire::header h{wire::kind::params, 0, static_cast<std::uint32_t>(sidx_),
                       static_cast<std::uint32_t>(4 * shard_.size()), included_clock(),
                       static_cast<std::int64_t>(shard_.size()), 0.0};
        send_header(to, h, stats_.reply_bytes, stats_.reply_messages);
        send_payload(to, std::as_bytes(std::span<const float>(shard_)), stats_.reply_bytes, stats_.reply_messages);
      }
    }
  }

  //! Says goodbye to each peer once this rank will send it nothing more: its worker is
  //! done (if the peer serves) and the peer's worker is done (if this rank serves it).
  void send_byes() {
    for (auto& p : peers_) {
      if (p.bye_sent) continue;
      if (widx_ >= 0 && server_of_[p.rank] >= 0 && !done_sent_) continue;
      const int w = worker_of_[p.rank];
      if (sidx_ >= 0 && w >= 0 && (done_at_[w] < 0 || want_[w] >= 0)) continue;
      wire::header h{wire::kind::bye, 0, 0, 0, 0, 0, 0.0};
      send_header(p.rank, h, stats_.control_bytes, stats_.control_messages);
      p.bye_sent = true;
    }
  }

  Comm comm_;
  roles roles_;
  Model model_;
  ps_options opt_;
  std::size_t n_ = 0, S_ = 0, W_ = 0;
  int me_ = 0, sidx_ = -1, widx_ = -1;
  std::vector<std::size_t> bounds_;
  std::vector<int> server_of_, worker_of_;
  std::vector<K> codecs_;
  std::vector<peer> peers_;
  std::chrono::milliseconds timeout_{0};
  bool failed_ = false, finished_ = false, done_sent_ = false;
  bool told_ = false;  // this rank sent its peers a `failed` message
  std::int64_t fence_ = 0;
  ps_stats stats_;
  // server
  std::vector<float> shard_, acc_, next_shard_;
  std::optional<Sgd> sgd_, next_sgd_;  // next_: a step's candidate (step_shard)
  std::int64_t version_ = 0;
  std::vector<std::int64_t> pushes_, done_at_, want_;
  std::vector<std::deque<pending_push>> queue_;
  std::vector<std::vector<std::byte>> spare_;
  // worker
  error_feedback ef_;
  std::vector<float> view_, approx_;
  std::vector<std::byte> msg_;
  std::vector<std::int64_t> shard_version_;
  std::vector<read_record> reads_;
  std::int64_t clock_ = 0;
  bool outstanding_ = false;
  std::size_t arrived_ = 0;
};

}  // namespace commpact::ps
