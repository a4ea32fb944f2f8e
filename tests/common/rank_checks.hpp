// SPDX-License-Identifier: Apache-2.0
#pragma once
// Checks usable on any rank's thread. Catch2 v2's assertion macros are not thread-safe
// (they race on Catch's bookkeeping), so a check inside a run_threads /
// run_checked_threads lambda uses these instead: a failed check throws rank_check_failed
// naming the check and its file:line; the exception leaves run_threads on the calling
// thread and fails the TEST_CASE there (as PS_EXPECT in ps_checks.hpp does). On MPI
// ranks (processes) they behave the same.
//   RANK_REQUIRE(cond)                            cond holds
//   RANK_REQUIRE_FALSE(cond)                      cond does not hold
//   RANK_REQUIRE_EQ(a, b)                         a == b (the message prints both)
//   RANK_REQUIRE_NOTHROW(expr)                    expr throws nothing
//   RANK_REQUIRE_THROWS(expr)                     expr throws something
//   RANK_REQUIRE_THROWS_AS(expr, Type)            expr throws a Type (any other exception
//                                                 is reported as a failure, with its what())
//   RANK_REQUIRE_THROWS_AS_WITH(expr, Type, piece...)  expr throws a Type whose what()
//                                                 contains every piece
// A peer_failure (another rank failed first) and a failed RANK_ check inside expr pass
// through every one of them unchanged: run_threads then reports the rank that failed
// first, not this one.
#include <commpact/error.hpp>

#include <exception>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace commpact_test {

struct rank_check_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void rank_check_fail(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  os << file << ":" << line << ": " << what;
  throw rank_check_failed(os.str());
}

[[noreturn]] inline void rank_check_threw_other(const char* file, int line, const char* check) {
  try {
    throw;
  } catch (const commpact::peer_failure&) {
    throw;  // another rank failed first
  } catch (const rank_check_failed&) {
    throw;  // a check inside the expression
  } catch (const std::exception& e) {
    rank_check_fail(file, line, std::string(check) + " threw an unexpected exception: " + e.what());
  } catch (...) {
    rank_check_fail(file, line, std::string(check) + " threw an unexpected non-standard exception");
  }
}

[[noreturn]] inline void rank_check_lacks(const char* file, int line, const char* check, const char* what) {
  rank_check_fail(file, line, std::string(check) + " failed: the message \"" + what + "\" lacks a piece");
}

inline bool rank_message_contains(const char* what, std::initializer_list<std::string_view> pieces) {
  const std::string_view w = what ? what : "";
  for (auto p : pieces)
    if (w.find(p) == std::string_view::npos) return false;
  return true;
}

}  // namespace commpact_test

#define RANK_REQUIRE(...)                                                                            \
  do {                                                                                               \
    if (!static_cast<bool>(__VA_ARGS__))                                                             \
      ::commpact_test::rank_check_fail(__FILE__, __LINE__, "RANK_REQUIRE(" #__VA_ARGS__ ") failed"); \
  } while (0)

#define RANK_REQUIRE_FALSE(...)                                                                            \
  do {                                                                                                     \
    if (static_cast<bool>(__VA_ARGS__))                                                                    \
      ::commpact_test::rank_check_fail(__FILE__, __LINE__, "RANK_REQUIRE_FALSE(" #__VA_ARGS__ ") failed"); \
  } while (0)

#define RANK_REQUIRE_EQ(a, b)                                                                          \
  do {                                                                                                 \
    const auto& rank_check_a_ = (a);                                                                   \
    const auto& rank_check_b_ = (b);                                                                   \
    if (!(rank_check_a_ == rank_check_b_)) {                                                           \
      std::ostringstream rank_check_os_;                                                               \
      rank_check_os_ << "RANK_REQUIRE_EQ(" #a ", " #b ") failed: " << rank_check_a_ << " != " << rank_check_b_; \
      ::commpact_test::rank_check_fail(__FILE__, __LINE__, rank_check_os_.str());                      \
    }                                                                                                  \
  } while (0)

#define RANK_REQUIRE_NOTHROW(...)                                                                            \
  do {                                                                                                       \
    try {                                                                                                    \
      static_cast<void>(__VA_ARGS__);                                                                        \
    } catch (...) {                                                                                          \
      ::commpact_test::rank_check_threw_other(__FILE__, __LINE__, "RANK_REQUIRE_NOTHROW(" #__VA_ARGS__ ")"); \
    }                                                                                                        \
  } while (0)

#define RANK_REQUIRE_THROWS(...)                                                                                   \
  do {                                                                                                             \
    bool rank_check_threw_ = false;                                                                                \
    try {                                                                                                          \
      static_cast<void>(__VA_ARGS__);                                                                              \
    } catch (const ::commpact::peer_failure&) {                                                                    \
      throw;                                                                                                       \
    } catch (const ::commpact_test::rank_check_failed&) {                                                          \
      throw;                                                                                                       \
    } catch (...) {                                                                                                \
      rank_check_threw_ = true;                                                                                    \
    }                                                                                                              \
    if (!rank_check_threw_)                                                                                        \
      ::commpact_test::rank_check_fail(__FILE__, __LINE__, "RANK_REQUIRE_THROWS(" #__VA_ARGS__ ") did not throw"); \
  } while (0)

#define RANK_REQUIRE_THROWS_AS(expr, Type)                                                                         \
  do {                                                                                                             \
    bool rank_check_threw_ = false;                                                                                \
    try {                                                                                                          \
      static_cast<void>(expr);                                                                                     \
    } catch (const Type&) {                                                                                        \
      rank_check_threw_ = true;                                                                                    \
    } catch (...) {                                                                                                \
      ::commpact_test::rank_check_threw_other(__FILE__, __LINE__, "RANK_REQUIRE_THROWS_AS(" #expr ", " #Type ")"); \
    }                                                                                                              \
    if (!rank_check_threw_)                                                                                        \
      ::commpact_test::rank_check_fail(__FILE__, __LINE__,                                                         \
                                       "RANK_REQUIRE_THROWS_AS(" #expr ", " #Type ") did not throw");              \
  } while (0)

#define RANK_REQUIRE_THROWS_AS_WITH(expr, Type, ...)                                                            \
  do {                                                                                                          \
    bool rank_check_threw_ = false;                                                                             \
    const char* const rank_check_name_ = "RANK_REQUIRE_THROWS_AS_WITH(" #expr ", " #Type ", " #__VA_ARGS__ ")"; \
    try {                                                                                                       \
      static_cast<void>(expr);                                                                                  \
    } catch (const Type& rank_check_e_) {                                                                       \
      rank_check_threw_ = true;                                                                                 \
      if (!::commpact_test::rank_message_contains(rank_check_e_.what(), {__VA_ARGS__}))                         \
        ::commpact_test::rank_check_lacks(__FILE__, __LINE__, rank_check_name_, rank_check_e_.what());          \
    } catch (...) {                                                                                             \
      ::commpact_test::rank_check_threw_other(__FILE__, __LINE__, rank_check_name_);                            \
    }                                                                                                           \
    if (!rank_check_threw_)                                                                                     \
      ::commpact_test::rank_check_fail(__FILE__, __LINE__, std::string(rank_check_name_) + " did not throw");   \
  } while (0)
