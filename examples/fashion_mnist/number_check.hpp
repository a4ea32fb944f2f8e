#pragma once
// A CLI11 check for the examples' real-valued options. CLI11's own ranges let NaN through
// (every comparison with NaN is false) and print their bounds in full ("not in range 0 to"
// and 309 digits for PositiveNumber); this one refuses NaN, infinities and trailing text,
// and names the range as a reader would write it.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>

namespace demo {

// A finite number v with lo <= v <= hi (lo < v where open_low). hi may be infinity: then
// the range reads "> lo" or ">= lo".
inline CLI::Validator number_in(double lo, double hi = std::numeric_limits<double>::infinity(),
                                bool open_low = false) {
  std::ostringstream d;
  if (std::isinf(hi)) d << "a number " << (open_low ? "> " : ">= ") << lo;
  else d << "a number in " << (open_low ? "(" : "[") << lo << ", " << hi << "]";
  const std::string desc = d.str();
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size()) return "'" + s + "' is not a number; it must be " + desc;
        if (!std::isfinite(v) || (open_low ? !(v > lo) : !(v >= lo)) || !(v <= hi))
          return s + " is out of range; it must be " + desc;
        return {};
      },
      desc);
}

// A positive finite number (CLI::PositiveNumber without NaN and infinity).
inline CLI::Validator positive_number() { return number_in(0, std::numeric_limits<double>::infinity(), true); }

}  // namespace demo
