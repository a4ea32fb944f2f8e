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

//! A ReLU network's gradient: exact zeros with probability `zeros`, else N(0, scale^2) (a
//! DDP bucket: most entries behind a ReLU are exactly 0, so the k-th largest |value| may be
//! 0 and a top-k selection runs among ties).
inline std::vector<float> relu_values(std::uint64_t seed, std::size_t n, double zeros, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::bernoulli_distribution z(zeros);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = z(g) ? 0.0f : d(g);
  return v;
}

}  // namespace commpact_test
