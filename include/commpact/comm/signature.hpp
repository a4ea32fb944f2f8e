// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file signature.hpp
//! The signature of a collective call (operation, element type, byte size, reduce_op or
//! root, and whether this rank's arguments were valid) and the rule that turns the
//! ranks' signatures, combined by one small MAX-allreduce, into the same error on every
//! rank. Used by CheckedComm<C> (checked_comm.hpp) and by MpiComm's built-in check.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "../error.hpp"

namespace commpact::detail {

enum class coll_kind_sig : int { barrier = 1, allreduce = 2, allgather = 3, broadcast = 4 };

inline const char* coll_sig_name(std::int64_t k) {
  switch (k) {
    case 1: return "barrier";
    case 2: return "allreduce";
    case 3: return "allgather";
    case 4: return "broadcast";
    default: return "an unknown operation";
  }
}

//! A small code for the element types collectives reduce (0: moved as bytes).
template <class T>
constexpr int sig_type_code() {
  if constexpr (std::is_same_v<T, float>) return 1;
  else if constexpr (std::is_same_v<T, double>) return 2;
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 4) return std::is_signed_v<T> ? 3 : 5;
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 8) return std::is_signed_v<T> ? 4 : 6;
  else return 0;
}

inline const char* sig_type_name(std::int64_t code) {
  switch (code) {
    case 1: return "float";
    case 2: return "double";
    case 3: return "int32";
    case 4: return "int64";
    case 5: return "uint32";
    case 6: return "uint64";
    default: return "bytes";
  }
}

//! One rank's view of a collective call.
struct collective_signature {
  coll_kind_sig kind = coll_kind_sig::barrier;
  int type_code = 0;        //!< sig_type_code<T>() for allreduce, 0 for byte-moving collectives
  std::int64_t bytes = 0;   //!< the size every rank must agree on
  std::int64_t extra = 0;   //!< reduce_op (allreduce) or root (broadcast)
  bool shared_memory = false;  //!< the rank takes MpiComm's shared-memory path for this call
};

//! The bit of a signature's code that says the call takes the shared-memory path, so
//! that ranks that choose differently (another mpi_options::shared_memory_max) fail the
//! check alike instead of waiting for each other on two paths.
inline constexpr std::int64_t sig_shared_memory_bit = std::int64_t{1} << 16;

//! The code of a signature: kind, element type and path in one word.
inline std::int64_t signature_code(const collective_signature& s) {
  return static_cast<std::int64_t>(s.kind) * 256 + s.type_code + (s.shared_memory ? sig_shared_memory_bit : 0);
}

//! Words exchanged per check: each value v travels as (v, -v) under MAX, so one
//! allreduce yields both the largest and the smallest value.
inline constexpr int signature_words = 7;

//! Fills `w` with this rank's signature; `bad` says whether its arguments were invalid.
//! Word 6 is the rank that passed an invalid argument (>= 0 after MAX: some rank did),
//! else -1 when this rank isolates its buffers and -2 when it does not, so that a check
//! that passed also tells every rank alike whether any rank isolates
//! (signature_any_isolates; MpiComm's allgather follows it, mpi/gather_pieces.hpp).
//! Communicators without such an option leave `isolate` at its default.
inline void encode_signature(const collective_signature& s, int rank, bool bad, std::int64_t* w,
                             bool isolate = true) {
  const std::int64_t code = signature_code(s);
  w[0] = s.bytes;
  w[1] = -s.bytes;
  w[2] = code;
  w[3] = -code;
  w[4] = s.extra;
  w[5] = -s.extra;
  w[6] = bad ? rank : isolate ? -1 : -2;
}

//! Given the MAX-reduced words of a check that passed: true when some rank isolates its
//! buffers (encode_signature).
inline bool signature_any_isolates(const std::int64_t* w) { return w[6] == -1; }

//! Given the MAX-reduced words, throws the same error class on every rank when the ranks
//! disagree or one passed an invalid argument (that rank gets its own message).
//! `who` names the communicator in messages ("commpact::MpiComm").
inline void judge_signature(const collective_signature& s, int rank, const std::int64_t* w,
                            const std::string& local_error, std::string_view who) {
  const char* what = coll_sig_name(static_cast<std::int64_t>(s.kind));
  if (w[6] >= 0) {
    if (!local_error.empty()) throw invalid_argument(local_error);
    throw invalid_argument(cat(who, "::", what, ": rank ", w[6],
                               " passed an invalid argument (its error says which); no rank moved data, "
                               "and the communicator stays usable."));
  }
  const std::int64_t code = signature_code(s) & (sig_shared_memory_bit - 1);
  const std::int64_t path_mask = ~sig_shared_memory_bit;
  const bool path_differs = w[2] != -w[3] && (w[2] & path_mask) == (-w[3] & path_mask);
  if (w[2] != -w[3] && !path_differs) {
    const auto hi = w[2] & (sig_shared_memory_bit - 1), lo = -w[3] & (sig_shared_memory_bit - 1);
    throw mismatch_error(cat(who, ": ranks disagree on the collective: rank ", rank, " called ", what, "<",
                             sig_type_name(code % 256), ">, while the calls range over ", coll_sig_name(lo / 256), "<",
                             sig_type_name(lo % 256), "> .. ", coll_sig_name(hi / 256), "<", sig_type_name(hi % 256),
                             ">; every rank must call the same collectives, with the same element type, in the same "
                             "order."));
  }
  if (w[0] != -w[1])
    throw mismatch_error(cat(who, "::", what, ": ranks disagree on the size: rank ", rank, " passed ", s.bytes,
                             " bytes, the ranks' sizes range over [", -w[1], ", ", w[0],
                             "] bytes; every rank must pass the same number of elements."));
  if (w[4] != -w[5])
    throw mismatch_error(cat(who, "::", what, ": ranks disagree on the ",
                             s.kind == coll_kind_sig::broadcast ? "root" : "reduce_op", ": rank ", rank, " passed ",
                             s.extra, ", the values range over [", -w[5], ", ", w[4],
                             "]; every rank must pass the same one."));
  if (path_differs)
    throw mismatch_error(cat(who, "::", what, ": ranks disagree on the path for ", s.bytes, " bytes: rank ", rank,
                             s.shared_memory ? " takes" : " does not take",
                             " the shared-memory path and another rank ", s.shared_memory ? "does not" : "does",
                             "; give every rank the same mpi_options::shared_memory_max."));
}

}  // namespace commpact::detail
