#pragma once
// Random inputs shared by the tests: N(0, 1) floats from a seed.
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace commpact_test {

inline std::vector<float> normal(std::uint64_t seed, std::size_t n) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace commpact_test
