// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file bucketed.hpp
//! Bucketed<C>: a Compressor that reduces a flat gradient in buckets of consecutive
//! layers, one compressor C per bucket, and can start each bucket while backward is
//! still computing the earlier layers: the overlap of communication with computation
//! of PyTorch DDP's reducer (Li et al., VLDB 2020) and Horovod's tensor fusion.
//!
//! \code
//! // layers in forward order: their gradients lie in this order in one flat buffer
//! std::vector<std::size_t> layers = {784 * 256, 256, 256 * 10, 10};
//! commpact::Bucketed<commpact::Dense<commpact::ThreadComm>> b{
//!     layers, [&](const commpact::bucket_info&) { return commpact::Dense<commpact::ThreadComm>{comm}; },
//!     {.cap_bytes = 1 << 20}};
//! b.begin(grad);                         // before backward
//! // backward, last layer first: as each layer's gradient is final
//! b.ready(3); b.ready(2); b.ready(1); b.ready(0);
//! b.reduce(grad);                        // waits for the buckets in flight
//! \endcode
//!
//! - Buckets: from the last layer backwards, layers join the current bucket until it
//!   holds at least `cap_bytes` (DDP's rule; its default cap is 25 MB); bucket 0 holds the
//!   last layers. A bucket is a contiguous range of the flat buffer.
//! - Order: a bucket starts when all its layers are ready and every bucket before it has
//!   started, so every rank starts the same reductions in the same order whatever order
//!   its layers became ready in. A step at which some bucket's compressor begins with
//!   its agreement (`needs_agreement()`: the first step, one after a load_state that did
//!   not fit, after gTopK's reset() or PowerCompressor's set_layout, a TopK density
//!   warm-up boundary) starts its buckets at start() (or finish()), after backward, so
//!   that a bucket started during backward only ever meets the others' steps (see
//!   "Buckets checked"). A compressor without needs_agreement() is never held back.
//! - Where it runs: started buckets run on one background thread (detail::serial_worker),
//!   in order, through each bucket's own compressor, so this works for every Compressor
//!   (Dense, TopK, gTopK, PowerSGD, any CodecCompressor) on every communicator usable
//!   from a second thread: ThreadComm; MpiComm when MPI runs at MPI_THREAD_SERIALIZED or
//!   above (checked: initialise MPI with MPI_Init_thread). While buckets are in flight
//!   the caller must not use the communicator; reduce() (or cancel()) ends that.
//! - Same result with or without overlap: reduce() without begin() runs the same
//!   buckets through the same compressors in the same order on the calling thread, so
//!   results are bit-identical (tested).
//! - Transactional (compress/transaction.hpp): each bucket's step stays open until the
//!   whole step is kept. A two-phase compressor (Dense, gTopK, CodecCompressor) holds its
//!   step itself; any other is snapshotted before it runs (one copy of its state per
//!   step; `bucket_options::transactional = false` skips that). When a bucket raises,
//!   the buckets after it do not run, every bucket's step is cancelled, and the error is
//!   raised; when a bucket skips the step (nonfinite::skip_step) the same happens and
//!   finish() returns false, so no bucket's residual has consumed a gradient that was not
//!   applied. Bucketed is itself two-phase: `start(grad)` (or begin + ready) runs the
//!   buckets, `finish()` waits for them, `commit()` keeps every bucket's step, `cancel()`
//!   drops them all; `reduce` = start + finish + commit. DataParallel commits only after
//!   the user's update has returned.
//! - Lengths agreed (`agree_length`): a rank's gradient of another length, or its other
//!   cap, raises mismatch_error on every rank, no bucket's state changes, and the next
//!   step with the right length works. The first step (of this object) agrees on the
//!   gradient length, the cap and the number of buckets in one allreduce of 7 int64
//!   (comm/agree.hpp; 56 bytes per rank, once); a later step adds nothing: a rank whose
//!   gradient length differs from the layers' sum runs bucket 0 on a zeroed workspace of
//!   one float more than that bucket, so that bucket 0's compressor's own per-step check
//!   (its frame headers or step check, as for a length change of that compressor alone)
//!   raises mismatch_error on every rank, and no later bucket runs. That check is the
//!   buckets' compressors' (each sees a later length change over any communicator: the
//!   odd rank runs its step idle, tests/mpi/test_compress_length_mpi.cpp).
//! - Space (v3): grad is a span of the compressor's space (`space_type`, space_of_t<C>),
//!   each bucket a subspan of it, so Bucketed<TopK<DeferredComm<C>>> runs its buckets'
//!   queued work at each bucket's fence, on the worker (tests/test_space_bucketed.cpp).
//! - Buckets checked: bucket b's compressor carries b + 1 as its check tag (set_check_tag,
//!   detail/check_tag.hpp) in its per-step check, so that a rank whose bucket meets
//!   another bucket of the same size on the others (it cancelled a step after some
//!   buckets had started and retried it while the others went on) raises mismatch_error
//!   on every rank in that step, and no bucket's step is kept (buckets of other sizes:
//!   the communicator's call check, where it has one). Every compressor commpact ships
//!   has the tag (gTopK: bucket differences that are multiples of 16 may go unseen); a
//!   user's compressor without set_check_tag is not checked for it. No byte is added. At
//!   a step whose buckets agree first (the first step) no bucket starts before reduce(),
//!   so a rank that cancels during that backward has sent nothing and its retry is simply
//!   that step, like the others'.

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../comm/known_size.hpp"
#include "../../concepts.hpp"
#include "../../detail/serial_worker.hpp"
#include "../../error.hpp"
#include "../../kernels/ops.hpp"
#include "../../state.hpp"
#include "../transaction.hpp"

namespace commpact {

struct bucket_options {
  //! A bucket closes once it holds at least this many bytes of gradient (DDP's
  //! bucket_cap_mb; 25 MB there). 0 puts every layer in a bucket of its own.
  std::size_t cap_bytes = std::size_t{25} << 20;
  //! Save each bucket's compressor state before it runs, so an error or a skipped step
  //! rolls every bucket back (see the file comment).
  bool transactional = true;
};

//! One bucket: layers [first_layer, end_layer) in forward order, elements
//! [offset, offset + size) of the flat gradient; index 0 is the last layers' bucket.
struct bucket_info {
  std::size_t index = 0;
  std::size_t first_layer = 0, end_layer = 0;
  std::size_t offset = 0, size = 0;
};

//! The buckets of layers of the given sizes (forward order) under a byte cap.
inline std::vector<bucket_info> plan_buckets(std::span<const std::size_t> layer_sizes, std::size_t cap_bytes) {
  require(!layer_sizes.empty(), "commpact::plan_buckets: no layers; pass the element count of every layer.");
  std::vector<std::size_t> offset(layer_sizes.size() + 1, 0);
  for (std::size_t l = 0; l < layer_sizes.size(); ++l) {
    require(layer_sizes[l] > 0, "commpact::plan_buckets: layer ", l, " has 0 elements; leave it out.");
    require(layer_sizes[l] <= (std::size_t(1) << 60) - offset[l], "commpact::plan_buckets: layer sizes overflow.");
    offset[l + 1] = offset[l] + layer_sizes[l];
  }
  std::vector<bucket_info> out;
  std::size_t end = layer_sizes.size();
  while (end > 0) {
    std::size_t first = end, bytes = 0;
    do {
      --first;
      bytes += layer_sizes[first] * sizeof(float);
    } while (first > 0 && bytes < cap_bytes);
    out.push_back({out.size(), first, end, offset[first], offset[end] - offset[first]});
    end = first;
  }
  return out;
}

namespace detail {
//! Where a Bucketed step stands. A base of Bucketed, so that a move checks it before any
//! member has moved: the worker's tasks and the buckets' open steps refer to the object,
//! so it moves only with no step in flight or open (else usage_error, nothing moved).
struct bucketed_step_flags {
  bool active_ = false;        // begin() started buckets that finish() has not waited for
  bool inline_ = false;        // start() ran every bucket inline; finish() not called yet
  bool open_ = false;          // finished, neither committed nor cancelled
  bool finished_ = false;      // finish() returned (open_, or a skipped step): commit() or cancel() next
  bool start_called_ = false;  // start() after begin(): finish() not called yet

  bucketed_step_flags() = default;
  bucketed_step_flags(const bucketed_step_flags& o) {
    require<usage_error>(!(o.active_ || o.inline_ || o.open_ || o.finished_ || o.start_called_),
                         "commpact::Bucketed: cannot move an object whose step is in flight or open (its buckets "
                         "refer to it); call reduce() (or finish() and commit(), or cancel()) first.");
  }
  bucketed_step_flags& operator=(const bucketed_step_flags&) = delete;
};
}  // namespace detail

template <class C>
class Bucketed : private detail::bucketed_step_flags {
  static_assert(diagnose_compressor<C>());

 public:
  using options = bucket_options;
  //! The space of the buckets' compressor: grad is a span of it.
  using space_type = space_of_t<C>;
  template <class T>
  using span = typename space_type::template span<T>;

  //! `make(const bucket_info&)` builds the compressor of each bucket (each holds its own
  //! error-feedback residual and, for PowerSGD, the layout of its layers).
  template <class Make>
    requires std::invocable<Make&, const bucket_info&> &&
             std::convertible_to<std::invoke_result_t<Make&, const bucket_info&>, C>
  Bucketed(std::vector<std::size_t> layer_sizes, Make make, options opt = {})
      : layers_(std::move(layer_sizes)), opt_(opt), info_(plan_buckets(layers_, opt.cap_bytes)),
        worker_(std::make_unique<detail::serial_worker>()) {
    bucket_of_.resize(layers_.size());
    for (const auto& b : info_) {
      for (std::size_t l = b.first_layer; l < b.end_layer; ++l) bucket_of_[l] = b.index;
      total_ += b.size;
    }
    comps_.reserve(info_.size());
    for (const auto& b : info_) {
      comps_.push_back(make(b));
      // Each bucket's per-step check carries its bucket (detail/check_tag.hpp), so that a
      // rank whose buckets meet other buckets (a cancel and retry on one rank) raises.
      if constexpr (requires(C& c) { c.set_check_tag(std::uint32_t{}); })
        comps_.back().set_check_tag(static_cast<std::uint32_t>(b.index + 1));
    }
    txs_.resize(info_.size());
    pending_.resize(info_.size());
  }
  //! Movable while no step is in flight or open; else usage_error and nothing moves.
  Bucketed(Bucketed&&) = default;
  Bucketed& operator=(Bucketed&&) = delete;
  ~Bucketed() {
    if (active_ || open_ || inline_ || finished_) cancel();
  }

  //! Before backward: the buckets of `grad` (the flat gradient, total_size() floats) will
  //! start as their layers become ready (at a step whose buckets agree first, such as the
  //! first step: at reduce()). `grad` must outlive the step: started buckets
  //! write into it until reduce() or cancel() (or the destructor) has waited for them.
  void begin(span<float> grad) {
    require(!active_ && !open_ && !inline_ && !finished_,
            "commpact::Bucketed::begin: the previous step's buckets are still in flight or open; call reduce() (or "
            "finish() and commit(), or cancel()) once per begin().");
    if constexpr (requires { comps_[0].comm().allows_calls_from_other_threads(); }) {
      require(comps_[0].comm().allows_calls_from_other_threads(),
              "commpact::Bucketed: overlap runs the buckets on a second thread, and MPI was initialised below "
              "MPI_THREAD_SERIALIZED; initialise it with MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, "
              "&provided), or call reduce() without begin() (no overlap).");
    }
    agree_length(grad, "begin");
    new_step(grad);
    hold_ = false;
    if constexpr (requires(C& c) { { c.needs_agreement() } -> std::convertible_to<bool>; })
      for (auto& c : comps_) hold_ = hold_ || c.needs_agreement();
    active_ = true;
    started_ = 0;
    std::fill(pending_.begin(), pending_.end(), 0);
    layer_ready_.assign(layers_.size(), 0);
    for (std::size_t l = 0; l < layers_.size(); ++l) ++pending_[bucket_of_[l]];
  }

  //! Layer `layer`'s gradient (forward index) is final: starts every bucket that is
  //! complete and whose predecessors have started (at a step whose buckets agree first:
  //! none; reduce() starts them). A no-op outside begin()..reduce().
  void ready(std::size_t layer) {
    if (!active_) return;
    require(layer < layers_.size(), "commpact::Bucketed::ready: layer ", layer, " is outside [0, ", layers_.size(),
            ").");
    require(!layer_ready_[layer], "commpact::Bucketed::ready: layer ", layer,
            " was already reported in this step; report each layer once per step.");
    layer_ready_[layer] = 1;
    --pending_[bucket_of_[layer]];
    if (!hold_) launch_complete();  // a step whose buckets agree first starts them at start() (see hold_)
  }

  //! Averages grad over the ranks: start + finish + commit. Returns false when some
  //! bucket skipped the step (then no bucket changed its state).
  bool reduce(span<float> grad) {
    start(grad);
    const bool ok = finish();
    commit();
    return ok;
  }

  //! Runs the buckets not started yet: after begin(), the rest of that step's buckets
  //! (on the worker); else every bucket, in order, on the calling thread.
  //! A second start() before finish() is refused (invalid_argument) and changes nothing:
  //! the step in flight can still be finished, committed or cancelled.
  void start(span<float> grad) {
    require(!open_ && !finished_, "commpact::Bucketed::start: the previous step is finished but neither committed "
                                  "nor cancelled; call commit() or cancel() first.");
    require(!inline_ && !start_called_, "commpact::Bucketed::start: a step was started and not finished; call "
                                        "finish() and commit() (or cancel()) before starting another.");
    if (active_) {
      require(address_of(grad) == address_of(grad_) && grad.size() == grad_.size(),
              "commpact::Bucketed::reduce: this is not the buffer passed to begin(); reduce the buffer whose buckets "
              "are in flight.");
      while (started_ < info_.size()) launch(started_++);
      start_called_ = true;
    } else {
      agree_length(grad, "start");
      new_step(grad);
      for (std::size_t b = 0; b < info_.size(); ++b) run(b);
      inline_ = true;
    }
  }

  //! Waits for every bucket. On an error: every bucket's step is cancelled and the error
  //! raised. On a skipped bucket: every bucket's step is cancelled and false returned.
  //! Otherwise the step stays open for commit() or cancel().
  //! A step that raises is over (nothing to commit; every bucket back as before it).
  bool finish() {
    require(active_ || inline_, "commpact::Bucketed::finish: no step was started; call start(grad) (or begin()).");
    if (active_) {
      // A held step (hold_) after begin() and ready() without start(): start what ready()
      // would have started.
      if (!start_called_) launch_complete();
      worker_->drain();
      pending_handles_.clear();
      active_ = false;
    }
    inline_ = false;
    start_called_ = false;
    if (error_ || skipped_) {
      rollback();
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
      finished_ = true;
      return false;
    }
    open_ = finished_ = true;
    return true;
  }

  //! Keeps every bucket's step of a finished step (a skipped one: nothing to keep).
  //! Without a finished step it is refused (invalid_argument) and changes nothing.
  void commit() {
    require(finished_, "commpact::Bucketed::commit: no finished step to commit; call start(grad) (or begin()) and "
                       "finish() first.");
    finished_ = false;
    if (!open_) return;
    open_ = false;
    for (std::size_t b = 0; b < txs_.size(); ++b) txs_[b].commit(comps_[b]);
  }

  //! Ends the current step without a result: waits for the buckets in flight and puts
  //! every bucket's compressor back. A no-op when no step is in flight or open. Every
  //! bucket already started runs to its end first, so every rank that started the same
  //! buckets (the same ready() calls) exchanges the same messages before rolling back:
  //! call cancel() at the same point on every rank.
  void cancel() noexcept {
    if (active_) {
      worker_->drain();
      pending_handles_.clear();
      active_ = false;
    }
    inline_ = start_called_ = open_ = finished_ = false;
    try {
      rollback();
    } catch (...) {
    }
    error_ = nullptr;
  }

  //! Appends the state (kind "commpact.Bucketed"): the bucket plan, then each bucket's
  //! compressor state as a nested blob.
  void save_state(std::vector<std::byte>& out) const {
    require(!active_, "commpact::Bucketed::save_state: buckets are in flight; call reduce() first.");
    state::writer w{out, "commpact.Bucketed"};
    const std::int64_t head[] = {static_cast<std::int64_t>(info_.size()), static_cast<std::int64_t>(total_)};
    w.i64s(1, head);
    for (std::size_t b = 0; b < comps_.size(); ++b)
      w.nested(static_cast<std::uint32_t>(2 + b), [&](std::vector<std::byte>& o) { comps_[b].save_state(o); });
    w.finish();
  }

  //! Restores what save_state wrote, all or nothing.
  void load_state(std::span<const std::byte> in) {
    require(!active_, "commpact::Bucketed::load_state: buckets are in flight; call reduce() first.");
    state::reader r{in, "commpact.Bucketed", "Bucketed"};
    const auto h = r.i64s(1, 2);
    r.require_that<invalid_argument>(h[0] == static_cast<std::int64_t>(info_.size()) &&
                                         h[1] == static_cast<std::int64_t>(total_),
                                     "the state holds ", h[0], " buckets over ", h[1], " elements; this one has ",
                                     info_.size(), " over ", total_, ". Make it with the same layers and cap.");
    std::vector<std::span<const std::byte>> parts;
    for (std::size_t b = 0; b < comps_.size(); ++b) parts.push_back(r.bytes(static_cast<std::uint32_t>(2 + b)));
    r.done();
    std::vector<std::vector<std::byte>> backup(comps_.size());
    for (std::size_t b = 0; b < comps_.size(); ++b) comps_[b].save_state(backup[b]);
    std::size_t b = 0;
    try {
      for (; b < comps_.size(); ++b) comps_[b].load_state(parts[b]);
    } catch (...) {
      for (std::size_t q = 0; q < b; ++q) comps_[q].load_state(backup[q]);
      throw;
    }
  }

  std::size_t buckets() const { return info_.size(); }
  const bucket_info& bucket(std::size_t b) const { return info_.at(b); }
  std::size_t total_size() const { return total_; }
  //! The compressor of bucket b.
  C& compressor(std::size_t b) { return comps_.at(b); }
  const C& compressor(std::size_t b) const { return comps_.at(b); }
  //! Bucket 0's communicator (DataParallel averages parameters through it).
  decltype(auto) comm() { return comps_.front().comm(); }
  //! True between begin() and reduce()/cancel().
  bool in_flight() const { return active_; }
  const options& opts() const { return opt_; }

 private:
  //! Where a span starts (a host span's data(), a device span's address()), for the
  //! identity check of start() after begin().
  static const void* address_of(span<float> s) {
    if constexpr (requires { s.data(); }) return s.data();
    else return s.address();
  }
  std::string length_problem(std::size_t n, const char* who) const {
    if (n == total_) return {};
    return detail::cat("commpact::Bucketed::", who, ": the gradient has ", n, " elements; the layers sum to ", total_,
                       ". Pass the flat gradient of every layer, in forward order.");
  }

  // Before any bucket's collective. The first step agrees on the length, the cap and the
  // number of buckets (every rank raises alike: mismatch_error when they differ, else
  // invalid_argument on a rank whose length is not the layers' sum and peer_failure on
  // the others). A later step agrees on nothing here: a rank whose length is not the
  // layers' sum runs bucket 0 on a longer workspace (new_step, run), so that bucket 0's
  // compressor raises on every rank. Without a communicator to agree through, a length
  // that is not the layers' sum raises invalid_argument on this rank.
  void agree_length(span<float> grad, const char* who) {
    if constexpr (requires { comps_[0].comm(); }) {
      if (agreed_) return;
      agree(comps_[0].comm(), "Bucketed",
            {{"the gradient length", static_cast<std::int64_t>(grad.size())},
             {"the bucket cap in bytes", static_cast<std::int64_t>(opt_.cap_bytes)},
             {"the number of buckets", static_cast<std::int64_t>(info_.size())}},
            length_problem(grad.size(), who), 0);
      agreed_ = true;
    } else {
      const auto problem = length_problem(grad.size(), who);
      if (!problem.empty()) throw invalid_argument(problem);
    }
  }

  // The outcome of a new step: nothing run, no error, no skip. A gradient of another
  // length than the layers' sum (after the first step's agreement) gets bucket 0's
  // workspace: one float more than bucket 0, zeroed.
  void new_step(span<float> grad) {
    grad_ = grad;
    failed_.v.store(false);
    error_ = nullptr;
    skipped_ = false;
    if constexpr (requires { comps_[0].comm(); }) {
      if (odd()) {
        const auto e = comm_exec(comps_[0].comm());
        odd_buf_.resize(info_[0].size + 1, e);
        ops<space_type>::fill(e, odd_buf_.view(), 0.0f);
      }
    }
  }

  //! This step's gradient is not of the layers' length: bucket 0 runs on odd_buf_.
  bool odd() const { return grad_.size() != total_; }

  // On a rank whose gradient has another length: the error of the step. Bucket 0's
  // mismatch_error (every rank raises one) becomes this rank's own, naming its length;
  // anything else (bucket 0's compressor did not see the difference, or every rank's
  // length was off alike) is the local invalid_argument.
  std::exception_ptr odd_length_error(std::exception_ptr inner) {
    const auto n = grad_.size();
    std::string what = "no error";
    if (inner) {
      try {
        std::rethrow_exception(inner);
      } catch (const mismatch_error& e) {
        int r = -1;
        if constexpr (requires { comps_[0].comm().rank(); }) r = comps_[0].comm().rank();
        return std::make_exception_ptr(mismatch_error(detail::cat(
            "commpact::Bucketed::reduce: ranks disagree on the gradient length: rank ", r, " has ", n,
            " elements, the layers sum to ", total_, "; every rank must pass gradients of the same length. Bucket 0's "
            "compressor saw it (it ran on ", info_[0].size + 1, " zeros): ", e.what())));
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
        what = "an unknown exception";
      }
    }
    return std::make_exception_ptr(invalid_argument(detail::cat(length_problem(n, "reduce"), " (bucket 0: ", what,
                                                                ")")));
  }

  void launch(std::size_t b) { pending_handles_.push_back(worker_->submit([this, b] { run(b); })); }
  // Starts, in order, every bucket whose layers are all ready and whose predecessors have started.
  void launch_complete() {
    while (started_ < info_.size() && pending_[started_] == 0) launch(started_++);
  }

  // Runs bucket b (on the worker, or inline) and leaves its step open; records the first
  // error and stops later buckets.
  void run(std::size_t b) {
    if (failed_.v.load()) return;
    try {
      const auto& i = info_[b];
      // The worker thread runs on the bucket's device (the CUDA space: its exec's device).
      if constexpr (requires { comps_[b].comm(); }) activate<space_type>(comm_exec(comps_[b].comm()));
      auto part = odd() ? odd_buf_.view() : grad_.subspan(i.offset, i.size);
      const bool ok = txs_[b].run(comps_[b], part, opt_.transactional);
      if (!ok) skipped_ = true;
      if (odd()) {
        error_ = odd_length_error(nullptr);
        failed_.v.store(true);
      }
    } catch (const mismatch_error& e) {
      const auto& i = info_[b];
      error_ = odd() ? odd_length_error(std::current_exception())
                    : std::make_exception_ptr(mismatch_error(detail::cat(
                          "commpact::Bucketed: bucket ", b, " (elements [", i.offset, ", ", i.offset + i.size,
                          ") of the gradient): ", e.what())));
      failed_.v.store(true);
    } catch (...) {
      error_ = odd() ? odd_length_error(std::current_exception()) : std::current_exception();
      failed_.v.store(true);
    }
  }

  // Every bucket whose step is open (a no-op for the others).
  void rollback() {
    for (std::size_t b = 0; b < txs_.size(); ++b) txs_[b].cancel(comps_[b]);
  }

  std::vector<std::size_t> layers_;
  options opt_;
  std::vector<bucket_info> info_;
  std::vector<std::size_t> bucket_of_;
  std::size_t total_ = 0;
  std::vector<C> comps_;
  std::vector<pending_step<C>> txs_;
  std::vector<std::size_t> pending_;   // layers of each bucket not yet ready
  std::vector<char> layer_ready_;
  std::vector<detail::work_handle> pending_handles_;
  std::unique_ptr<detail::serial_worker> worker_;
  span<float> grad_{};
  std::size_t started_ = 0;
  struct flag {  // set by cancel() while the worker runs; movable for Bucketed's move
    std::atomic<bool> v{false};
    flag() = default;
    flag(flag&& o) noexcept : v(o.v.load()) {}
  } failed_;
  std::exception_ptr error_;
  bool skipped_ = false;
  bool agreed_ = false;  // the first step's agreement passed
  // This step (begin()) begins some bucket's step with its compressor's agreement
  // (needs_agreement(): the first step, one after a load_state whose residual did not
  // fit, gTopK's reset() or PowerCompressor's set_layout, CodecCompressor's warm-up
  // boundaries): ready() only counts, and start() starts every
  // bucket after backward. A rank that cancels during that backward has then sent
  // nothing, and its retry meets the others' same step, instead of its bucket 0's step
  // meeting another bucket's agreement (a call of another size, which a communicator that
  // checks nothing would not match). The compressors' agreements are the same on every
  // rank that made the same calls, so every rank holds the same steps back; and holding
  // back changes timing only, never the calls.
  bool hold_ = false;
  typename space_type::template buffer<float> odd_buf_;  // bucket 0's input when odd()
};

}  // namespace commpact
