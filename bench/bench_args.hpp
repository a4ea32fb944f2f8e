// Strict command-line values for the benchmark programs (bench/*.cpp): a whole number in
// a range, a finite real number in a range, and a size: a number with an optional suffix
// K, M or G, powers of 1024 (4M = 4 * 2^20; "1.5K" = 1536, fractions of one dropped).
// Each function throws bench_args::error with a message that names the option, its
// value and what is allowed ("--rounds 0 must be at least 1"); usage_error() prints it
// as one line, "<program>: <message>; see --help.", and returns the exit status 2.
// Header-only, standard library only (the programs that take Google Benchmark's flags
// parse their own by hand; cli_failure() serves those that use CLI11).
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

namespace bench_args {

struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline constexpr int usage_status = 2;

// Prints "<program>: <message>; see --help." on stderr; returns usage_status.
inline int usage_error(const char* program, const std::string& message) {
  std::fprintf(stderr, "%s: %s; see --help.\n", program, message.c_str());
  std::fflush(stderr);
  return usage_status;
}

// A CLI11 parse error: --help prints the usage (status 0), anything else one line
// (usage_status). A template so that this header does not need CLI11.
template <class App, class ParseError>
int cli_failure(App& app, const ParseError& e, const char* program) {
  if (e.get_exit_code() == 0) return app.exit(e);
  return usage_error(program, e.what());
}

// --help of a program that also takes Google Benchmark's flags, after it printed its own
// options: hands "--help" to Google Benchmark, which prints its options and exits 0.
// `initialize` calls benchmark::Initialize (this header does not include Google Benchmark).
template <class Initialize>
int google_benchmark_help(char* argv0, Initialize&& initialize) {
  char flag[] = "--help";
  char* h[] = {argv0, flag, nullptr};
  int hc = 2;
  initialize(&hc, h);
  return 0;
}

namespace detail {
inline std::string shown(const std::string& option, const std::string& text) {
  return option + " " + (text.empty() ? std::string("''") : text);
}
inline std::string number(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.10g", v);
  return b;
}
// strtod over all of text but a suffix (returned in rest); nullopt when no number starts
// text (leading blanks are not skipped).
inline std::optional<double> leading_number(const std::string& text, std::string& rest) {
  if (text.empty() || text[0] == ' ' || text[0] == '\t') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str()) return std::nullopt;
  rest = end;
  return v;
}
}  // namespace detail

// A whole number (decimal digits, optionally a leading '-') from lo to hi.
inline long long integer(const std::string& option, const std::string& text, long long lo, long long hi) {
  const std::string what = detail::shown(option, text);
  std::size_t d = !text.empty() && text[0] == '-' ? 1 : 0;
  bool digits = d < text.size();
  for (std::size_t i = d; i < text.size(); ++i) digits = digits && text[i] >= '0' && text[i] <= '9';
  if (!digits)
    throw error(what + " is not a whole number; use " + std::to_string(lo) + " to " + std::to_string(hi));
  errno = 0;
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  const bool overflow = errno == ERANGE;
  if (v < lo || (overflow && d == 1)) throw error(what + " must be at least " + std::to_string(lo));
  if (v > hi || overflow) throw error(what + " must be at most " + std::to_string(hi));
  return v;
}

// A finite real number above lo (at least lo when lo_inclusive) and below hi (at most hi
// when hi_inclusive); hi = infinity for no upper bound.
inline double real(const std::string& option, const std::string& text, double lo, bool lo_inclusive, double hi,
                   bool hi_inclusive) {
  const std::string what = detail::shown(option, text);
  std::string rest;
  const auto v = detail::leading_number(text, rest);
  if (!v || !rest.empty()) throw error(what + " is not a number");
  if (!std::isfinite(*v)) throw error(what + " is not a finite number");
  if (lo_inclusive ? *v < lo : *v <= lo)
    throw error(what + " must be " + (lo_inclusive ? "at least " : "greater than ") + detail::number(lo));
  if (hi_inclusive ? *v > hi : *v >= hi)
    throw error(what + " must be " + (hi_inclusive ? "at most " : "less than ") + detail::number(hi));
  return *v;
}

// real() as a CLI11 check: `->check(bench_args::real_check(0, false, 1, true))`. CLI11's
// own ranges let NaN through (every comparison with NaN is false). Returns a callable that
// CLI::Validator is built from (an empty string: accepted), so this header needs no CLI11;
// CLI11 puts the option's name before the message ("--density: nan is not a finite number").
inline auto real_check(double lo, bool lo_inclusive, double hi, bool hi_inclusive) {
  return [=](const std::string& text) -> std::string {
    try {
      real("", text, lo, lo_inclusive, hi, hi_inclusive);
      return {};
    } catch (const error& e) {
      const std::string m = e.what();
      return m.substr(m.find_first_not_of(' '));  // real() wrote "<option> <text> ..."
    }
  };
}

// A size: a number with an optional suffix K, M or G (2^10, 2^20, 2^30), at least 1 and at
// most max once multiplied; a fraction of one is dropped ("2.5" is 2, "1.5K" is 1536).
inline std::uint64_t size(const std::string& option, const std::string& text,
                          std::uint64_t max = std::uint64_t{1} << 40) {
  const std::string what = detail::shown(option, text);
  const std::string allowed = "a positive number with an optional suffix K, M or G (2^10, 2^20, 2^30), e.g. 4M";
  std::string rest;
  const auto v = detail::leading_number(text, rest);
  if (!v) throw error(what + " is not a size; use " + allowed);
  double mul = 1;
  if (rest == "K") mul = 1024.0;
  else if (rest == "M") mul = 1024.0 * 1024.0;
  else if (rest == "G") mul = 1024.0 * 1024.0 * 1024.0;
  else if (!rest.empty()) throw error(what + " has an unknown suffix '" + rest + "'; use " + allowed);
  if (!std::isfinite(*v)) throw error(what + " is not a finite number; use " + allowed);
  const double x = *v * mul;
  if (x < 1) throw error(what + " must be at least 1");
  if (x > static_cast<double>(max)) throw error(what + " must be at most " + std::to_string(max));
  return static_cast<std::uint64_t>(x);
}

// Google Benchmark style flags, for the programs that pass the rest of argv on to it:
// argv[i] is `name=VALUE` or `name VALUE` (then i moves past VALUE). nullopt when argv[i]
// is some other argument; throws when name comes without a value.
inline std::optional<std::string> flag_value(int argc, char** argv, int& i, const std::string& name) {
  const std::string a = argv[i];
  if (a.size() > name.size() && a.compare(0, name.size() + 1, name + "=") == 0) return a.substr(name.size() + 1);
  if (a != name) return std::nullopt;
  if (i + 1 >= argc) throw error(name + " needs a value");
  return std::string(argv[++i]);
}

}  // namespace bench_args
