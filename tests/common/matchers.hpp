#pragma once
// Catch2 matchers shared by the unit tests.
#include <catch2/catch.hpp>

#include <exception>
#include <initializer_list>
#include <string>
#include <vector>

namespace commpact_test {

// Matches an exception whose what() contains every given piece.
class MessageContains : public Catch::MatcherBase<std::exception> {
 public:
  MessageContains(std::initializer_list<const char*> pieces) : pieces_(pieces.begin(), pieces.end()) {}
  bool match(const std::exception& e) const override {
    const std::string what = e.what();
    for (const auto& p : pieces_)
      if (what.find(p) == std::string::npos) return false;
    return true;
  }
  std::string describe() const override {
    std::string d = "message contains";
    for (const auto& p : pieces_) d += " \"" + p + "\"";
    return d;
  }

 private:
  std::vector<std::string> pieces_;
};

}  // namespace commpact_test
