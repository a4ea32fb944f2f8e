// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file power_step.hpp
//! PowerCompressor's data plane (compressors/power.hpp holds its control: agreement,
//! the two phases, the status, the state): the factors P and Q (Q's candidate beside
//! it), the packed uncompressed part, the stage of a dense step, and the queued sequence
//! of one step, every pass a row of ops<Space>. The error-compensated matrix M = g + e
//! and the candidate residual M - A live in the error feedback's candidate
//! (compress/error_feedback.hpp).

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "../../comm/known_size.hpp"
#include "../../kernels/host/ops.hpp"
#include "../error_feedback.hpp"
#include "power_plan.hpp"

namespace commpact::detail {

//! The factors of a PowerCompressor in space Space and the step that computes them.
template <class Space>
class power_factors {
 public:
  using exec_type = typename Space::exec;
  template <class T>
  using span = typename Space::template span<T>;
  template <class T>
  using buffer = typename Space::template buffer<T>;

  //! Sizes every buffer for a layout: p and q factor floats (Q's candidate as Q), d
  //! uncompressed floats and a stage of `stage` floats (a dense step's sum).
  void resize(const exec_type& e, std::size_t p, std::size_t q, std::size_t d, std::size_t stage) {
    p_.resize(p, e);
    q_.resize(q, e);
    q_next_.resize(q, e);
    dense_.resize(d, e);
    stage_.resize(stage, e);
  }
  //! Installs the step's Q (a swap).
  void commit_q() { q_.swap(q_next_); }

  span<float> q() { return q_.view(); }
  span<const float> q() const { return q_.cview(); }
  std::size_t p_floats() const { return p_.size(); }
  std::size_t q_floats() const { return q_.size(); }
  std::size_t dense_floats() const { return dense_.size(); }

  template <class Out>
  void add_signature(Out& s) const {
    for (const auto* b : {&p_, &q_, &q_next_, &dense_, &stage_}) s.emplace_back(b->data(), b->capacity());
  }

  //! Before start_step: the mean of the whole buffer, summed in the stage (grad is
  //! written only when every sum is finite).
  //! A step on a buffer that does not fit the layout: the step's collectives, in order,
  //! on zeroed workspaces (the state and grad untouched), so that every rank reaches
  //! finish() and raises there alike.
  template <class Comm>
  void queue_idle(const exec_type& e, Comm& comm, bool dense_step) {
    buffer<float>* const bufs[2][3] = {{&p_, &dense_, &q_next_}, {&stage_, nullptr, nullptr}};
    for (auto* b : bufs[dense_step ? 1 : 0]) {
      if (b == nullptr || b->empty()) continue;
      ops<Space>::fill(e, b->view(), 0.0f);
      comm.allreduce(b->view(), reduce_op::sum);
    }
  }

  template <class Comm>
  void queue_dense(const exec_type& e, Comm& comm, std::size_t total, span<float> grad, span<std::uint32_t> status) {
    const auto st = stage_.view().first(total);
    ops<Space>::copy(e, span<const float>(grad), st);
    comm.allreduce(st, reduce_op::sum);
    ops<Space>::mean_into(e, span<const float>(st), grad, comm.size(), status.subspan(1, 1));
  }

  //! q_next_ = the Q this step starts from: the warm start, or drawn from the seed.
  void queue_start_q(const exec_type& e, const std::vector<power_entry>& entries, const power_options& opt,
                     std::int64_t steps, bool q_ready) {
    const std::uint64_t step = static_cast<std::uint64_t>(steps);
    for (std::size_t t = 0; t < entries.size(); ++t) {
      const auto& en = entries[t];
      if (!en.compressed) continue;
      const auto q = q_next_.view().subspan(en.q_off, en.cols * en.r);
      if (!q_ready || !opt.warm_start) {
        const std::uint64_t salt = opt.warm_start ? ~0ull : step;
        ops<Space>::gaussian(e, q, host::mix_seed(opt.seed, t, salt));
        continue;
      }
      ops<Space>::copy(e, q_.cview().subspan(en.q_off, en.cols * en.r), q);
      ops<Space>::redraw_zero_columns(e, q, en.cols, en.r, opt.seed, static_cast<std::uint64_t>(t), step);
    }
  }

  template <class Comm>
  void queue_compressed(const exec_type& e, Comm& comm, const std::vector<power_entry>& entries,
                        const power_options& opt, std::int64_t steps, bool q_ready, span<float> grad,
                        basic_error_feedback<Space>& ef, span<std::uint32_t> status) {
    const int P = comm.size();
    queue_start_q(e, entries, opt, steps, q_ready);
    // 1. M = g + e (in the error feedback's candidate; grad is only read); P = M Q (one pass per matrix); pack the dense tensors.
    for (const auto& en : entries) {
      const std::size_t nm = en.rows * en.cols;
      const auto g = span<const float>(grad.subspan(en.offset, nm));
      if (!en.compressed) {
        ops<Space>::copy(e, g, dense_.view().subspan(en.d_off, nm));
        continue;
      }
      const auto res = ef.size() > 0 ? ef.residual().subspan(en.e_off, nm) : span<const float>{};
      ops<Space>::lowrank_project(e, g, res, ef.candidate().subspan(en.e_off, nm), en.rows, en.cols,
                                  q_next_cview(en), en.r, p_view(en), opt.products);
    }
    // 2. allreduce P (sum) and the dense part (sum, then the mean); check both.
    if (!p_.empty()) comm.allreduce(p_.view(), reduce_op::sum);
    if (!dense_.empty()) comm.allreduce(dense_.view(), reduce_op::sum);
    ops<Space>::check_finite(e, p_.cview(), status.subspan(0, 1));
    ops<Space>::mean(e, dense_.view(), P, status.subspan(1, 1));
    // 3. orthonormalise P; Q = M^T P.
    for (const auto& en : entries) {
      if (!en.compressed) continue;
      ops<Space>::orthonormalize(e, p_view(en), en.rows, en.r);
      ops<Space>::lowrank_back_project(e, std::as_const(ef).candidate().subspan(en.e_off, en.rows * en.cols),
                                       en.rows, en.cols, span<const float>(p_view(en)), en.r,
                                       q_next_.view().subspan(en.q_off, en.cols * en.r), opt.products);
    }
    // 4. allreduce Q (sum, then the mean; a non-finite Q is reported in word 2).
    if (!q_next_.empty()) comm.allreduce(q_next_.view(), reduce_op::sum);
    ops<Space>::mean(e, q_next_.view(), P, status.subspan(2, 1));
    // 5. Only when every check passed: g = A = P Q^T and the candidate residual M - A
    //    (in the candidate, one pass); the dense tensors get their mean.
    for (const auto& en : entries) {
      const std::size_t nm = en.rows * en.cols;
      const auto g = grad.subspan(en.offset, nm);
      if (!en.compressed) {
        ops<Space>::copy_if_clear(e, dense_.cview().subspan(en.d_off, nm), g, span<const std::uint32_t>(status));
        continue;
      }
      ops<Space>::lowrank_approx_residual(e, g, ef.candidate().subspan(en.e_off, nm), en.rows, en.cols,
                                          span<const float>(p_view(en)), q_next_cview(en), en.r,
                                          span<const std::uint32_t>(status), opt.products);
    }
  }

 private:
  span<float> p_view(const power_entry& en) { return p_.view().subspan(en.p_off, en.rows * en.r); }
  span<const float> q_next_cview(const power_entry& en) const {
    return q_next_.cview().subspan(en.q_off, en.cols * en.r);
  }

  buffer<float> p_, q_, q_next_, dense_, stage_;
};

}  // namespace commpact::detail
