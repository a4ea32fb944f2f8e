#pragma once
// Shared by the CUDA tests (tests/cuda/*.cu): the failure count with its EXPECT macro (and
// EXPECT_MT for rank threads), the device-presence check, main()'s frame (run_checks, with
// seeded_rng for a printed seed), and fenced copies between host vectors and the device
// with bitwise comparisons. Without a GPU a test exits 77, which CTest reports as skipped
// (SKIP_RETURN_CODE in cmake/commpactTesting.cmake).

#include <cuda_runtime.h>

#include "../common/random.hpp"  // relu_values

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <random>
#include <span>
#include <vector>

#include "commpact/kernels/cuda/ops.cuh"

namespace commpact_test {

//! The exit code CTest counts as "skipped" for the CUDA tests.
inline constexpr int exit_skipped = 77;

//! True when a CUDA device is present; otherwise prints "no CUDA device: skipped".
inline bool have_cuda_device() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipped\n");
    return false;
  }
  return true;
}

//! How many EXPECTs have failed so far.
inline int failures = 0;

//! EXPECT_MT's lock: the failure count is shared by the rank threads.
inline std::mutex expect_mutex;

//! A generator seeded from std::random_device, the seed printed ("seed N") so that a failure can be replayed.
inline std::mt19937_64 seeded_rng() {
  std::mt19937_64 rng(std::random_device{}());
  const auto seed = rng();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  rng.seed(seed);
  return rng;
}

//! main()'s frame: exit_skipped without a device; else body(), then `passed`, or `failed` (printf-style, given the
//! failure count), and 0 when no EXPECT failed; an exception prints "FAILED with exception: ..." and returns 1.
template <class Body>
int run_checks(const char* passed, const char* failed, Body&& body) {
  if (!have_cuda_device()) return exit_skipped;
  try {
    body();
  } catch (const std::exception& e) {
    std::printf("FAILED with exception: %s\n", e.what());
    return 1;
  }
  if (failures == 0) std::fputs(passed, stdout);
  else std::printf(failed, failures);
  return failures == 0 ? 0 : 1;
}

//! A host copy of a device span (queued on e, then fenced).
template <class T>
std::vector<T> download(const commpact::cuda_space::exec& e, commpact::cuda_span<const T> s) {
  std::vector<T> h(s.size());
  commpact::ops<commpact::cuda_space>::to_host(e, s, std::span<T>(h));
  commpact::cuda_space::fence(e, commpact::no_deadline());
  return h;
}
//! b = h (resized; queued on e, then fenced).
template <class T>
void upload(const commpact::cuda_space::exec& e, const std::vector<T>& h, commpact::cuda_buffer<T>& b) {
  b.resize(h.size());
  commpact::ops<commpact::cuda_space>::from_host(e, std::span<const T>(h), b.view());
  commpact::cuda_space::fence(e, commpact::no_deadline());
}
//! A device buffer holding h (fenced).
template <class T>
commpact::cuda_buffer<T> upload(const commpact::cuda_space::exec& e, const std::vector<T>& h) {
  commpact::cuda_buffer<T> b;
  upload(e, h, b);
  return b;
}

//! True when a and b have the same length and the same bytes.
template <class T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
//! How many elements of a and b differ in their bytes (the larger length + 1 when the lengths differ).
template <class T>
std::size_t diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size()) + 1;
  std::size_t d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return d;
}

//! The largest input size a kernel test should try: COMMPACT_TEST_MAX_N when set (scripts/
//! device-check sets it for the racecheck pass, whose instrumentation makes a 1e6-entry
//! case take minutes; its shared-memory hazards show at 1e5 as well), else no limit.
inline std::size_t max_n() {
  const char* v = std::getenv("COMMPACT_TEST_MAX_N");
  if (v == nullptr || *v == '\0') return static_cast<std::size_t>(-1);
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  return (end != nullptr && *end == '\0' && n > 0) ? static_cast<std::size_t>(n) : static_cast<std::size_t>(-1);
}

//! n values of N(0, scale^2) from a generator seeded with seed.
inline std::vector<float> values(std::uint64_t seed, std::size_t n, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
//! Adversarial values sprinkled into v (every 7th element): +-0, denormals, ties.
inline void sprinkle(std::vector<float>& v) {
  const float special[] = {0.0f, -0.0f, 1e-40f, -3e-41f, 1.0f, 1.0f};
  for (std::size_t i = 0; i < v.size(); i += 7) v[i] = special[(i / 7) % 6];
}

}  // namespace commpact_test

//! Counts and prints a failure (printf-style message) when cond is false; carries on.
#define EXPECT(cond, ...)                                           \
  do {                                                              \
    if (!(cond)) {                                                  \
      ++commpact_test::failures;                                    \
      std::printf("FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                                     \
      std::printf("\n");                                            \
    }                                                               \
  } while (0)

//! EXPECT from a rank thread: under commpact_test::expect_mutex.
#define EXPECT_MT(cond, ...)                                       \
  do {                                                             \
    std::lock_guard<std::mutex> lock(commpact_test::expect_mutex); \
    EXPECT(cond, __VA_ARGS__);                                     \
  } while (0)
