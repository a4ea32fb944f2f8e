// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file error.hpp
//! Error types. Every error commpact raises derives from commpact::error, and its
//! message names the value, the rule it broke and the way out.

#include <chrono>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace commpact {

//! Base of every exception commpact throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! A caller passed a value that breaks a documented rule (size, k, density, rank...).
class invalid_argument : public error {
 public:
  using error::error;
};

//! Ranks disagree about something they must agree on (lengths, shapes, options).
class mismatch_error : public error {
 public:
  using error::error;
};

//! A gradient or parameter contains NaN or Inf.
class numeric_error : public error {
 public:
  using error::error;
};

//! A received message is malformed or hostile (bad count, index out of range, unsorted).
class wire_error : public error {
 public:
  using error::error;
};

//! The transport failed (an MPI error code, a closed world).
class comm_error : public error {
 public:
  using error::error;
};

//! A CUDA or cuBLAS call failed (kernels/cuda/check.cuh names the call and the status).
class device_error : public error {
 public:
  using error::error;
};

//! Another rank failed or left; this rank's operation was abandoned.
class peer_failure : public comm_error {
 public:
  using comm_error::comm_error;
};

//! The program broke a rule of the execution model that a GPU would punish silently: it
//! read a device result before the fence that covers it, consumed on one executor what
//! another produced without a join, or destroyed or regrew a buffer with work still
//! queued on it. The deferred space (space/deferred.hpp) raises it; fix the program.
class usage_error : public error {
 public:
  using error::error;
};

//! A wait passed its deadline.
class timeout_error : public comm_error {
 public:
  using comm_error::comm_error;
};

namespace detail {
template <class... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
//! s without its final full stop, for quoting a reason inside a sentence that adds its own.
inline std::string_view without_stop(std::string_view s) {
  return !s.empty() && s.back() == '.' ? s.substr(0, s.size() - 1) : s;
}
}  // namespace detail

//! Throws E with the concatenation of args when cond is false.
template <class E = invalid_argument, class... Args>
inline void require(bool cond, Args&&... args) {
  if (!cond) throw E(detail::cat(std::forward<Args>(args)...));
}

//! The longest timeout a communicator takes (ThreadComm, MpiComm, TorchComm): 10^12 ms,
//! about 31.7 years. Their deadlines are steady_clock time points (nanoseconds in 64
//! bits), as are the waits of PyTorch's process groups: a longer timeout would overflow
//! into a deadline in the past and time out at once.
inline constexpr std::chrono::milliseconds max_timeout{1'000'000'000'000};

namespace detail {
//! invalid_argument unless 0 < t <= max_timeout; `option` names it
//! ("commpact::MpiComm: mpi_options::timeout").
inline void require_timeout(std::chrono::milliseconds t, std::string_view option) {
  require(t.count() > 0 && t <= max_timeout, option, " is ", t.count(), " ms; it must be positive and at most ",
          max_timeout.count(), " ms (commpact::max_timeout, about 31 years).");
}
}  // namespace detail

}  // namespace commpact
